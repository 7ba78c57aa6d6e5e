//! The generic meta.json parser: the whole file into a `serde_json::Value`, then checked. It
//! defines what a meta.json means (the fast path, `fast.rs`, must agree with it) and words
//! every error with the file's path.

use std::path::Path;

use serde_json::{Map, Value};

use super::meta::{
    dtype, is_user_class, nbytes, valid_device, Entry, Layout, LeafMeta, NestedMeta, NodeMeta,
    TensorDictMeta, FORMAT_VERSION, JAGGED, RESERVED_KEYS, STRIDED,
};
use crate::error::{Error, Result};

/// The generic parser: the whole file into a `serde_json::Value`, then checked. It defines
/// what a meta.json means (`fast` must agree with it) and words the errors.
pub fn parse_meta_generic(bytes: &[u8], path: &Path) -> Result<NodeMeta> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| Error::invalid(path, format!("meta.json is not valid JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(Error::invalid(path, "meta.json is not a JSON object"));
    };
    match map.get("_format_version") {
        None => {}
        Some(Value::Number(n)) if n.as_u64().is_some_and(|v| v <= FORMAT_VERSION) => {}
        Some(v) => {
            return Err(Error::unsupported(
                path,
                format!("meta.json has _format_version {v}; this library reads up to {FORMAT_VERSION}"),
            ))
        }
    }
    if map
        .get("_type")
        .and_then(Value::as_str)
        .is_some_and(is_user_class)
    {
        return Ok(NodeMeta::TensorClass(map));
    }
    let class = map.get("_class").and_then(Value::as_str);
    let type_ = map.get("_type").and_then(Value::as_str);
    let kind = class
        .map(|c| c.rsplit(':').next().unwrap_or(c))
        .or_else(|| type_.map(|t| t.trim_end_matches("'>").rsplit('.').next().unwrap_or(t)));
    match kind {
        Some("TensorDict") => {
            let version = map.get("_format_version").and_then(Value::as_u64);
            parse_tensordict(&map, version, path).map(NodeMeta::TensorDict)
        }
        Some("NonTensorData") => match map.get("data") {
            Some(data) => Ok(NodeMeta::NonTensor(data.clone())),
            None => Err(Error::unsupported(
                path,
                "non-tensor data stored with pickle is never loaded (only JSON values are)",
            )),
        },
        Some("NonTensorStack") => super::stack::from_map(map, path).map(NodeMeta::Stack),
        Some(other) => Err(Error::unsupported(
            path,
            format!("directories of type {other:?} are not supported"),
        )),
        None => Err(Error::invalid(path, "meta.json has no _type or _class")),
    }
}

fn parse_shape(value: Option<&Value>, what: &str, path: &Path) -> Result<Vec<u64>> {
    let Some(Value::Array(items)) = value else {
        return Err(Error::invalid(
            path,
            format!("{what}: shape is missing or not a list"),
        ));
    };
    items
        .iter()
        .map(|v| {
            // torch sizes are int64: a larger dimension cannot exist, even with no elements
            v.as_u64().filter(|&d| d <= i64::MAX as u64).ok_or_else(|| {
                Error::invalid(
                    path,
                    format!(
                        "{what}: shape {value} has a dimension that is not a non-negative integer",
                        value = Value::Array(items.clone())
                    ),
                )
            })
        })
        .collect()
}

fn parse_tensordict(
    map: &Map<String, Value>,
    format_version: Option<u64>,
    path: &Path,
) -> Result<TensorDictMeta> {
    let batch = match map.get("shape") {
        None => Vec::new(),
        some => parse_shape(some, "batch size", path)?,
    };
    let device = match map.get("device") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "None" => None,
        Some(Value::String(s)) if valid_device(s) => Some(s.clone()),
        Some(Value::String(s)) => return Err(Error::invalid(path, format!("device {s:?} is not a device"))),
        Some(other) => return Err(Error::invalid(path, format!("device {other} is not a string"))),
    };
    let mut entries = Vec::new();
    for (key, value) in map {
        if RESERVED_KEYS.contains(&key.as_str()) {
            continue;
        }
        if let Some(entry) = parse_entry(key, value, &batch, path)? {
            entries.push((key.clone(), entry));
        }
    }
    Ok(TensorDictMeta {
        batch,
        device,
        format_version,
        entries,
    })
}

/// Checks one (non-reserved) entry of a TensorDict meta.json; `None` for metadata to skip.
pub(crate) fn parse_entry(key: &str, value: &Value, batch: &[u64], path: &Path) -> Result<Option<Entry>> {
    let Value::Object(entry) = value else {
        if key.starts_with('_') {
            return Ok(None); // metadata of a newer writer (e.g. `_names`), not a leaf
        }
        return Err(Error::invalid(
            path,
            format!("entry for key {key:?} is not an object"),
        ));
    };
    if let Some(kind) = entry.get("type") {
        return Ok(Some(if kind.as_str() == Some("NonTensorStack") {
            Entry::Stack
        } else {
            Entry::Collection
        }));
    }
    let what = format!("key {key:?}");
    let nested = match entry.get("is_nested") {
        None | Some(Value::Null | Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(other) => {
            return Err(Error::invalid(
                path,
                format!("{what}: is_nested {other} is not a bool"),
            ))
        }
    };
    let layout = match entry.get("layout") {
        None => None,
        Some(Value::String(s)) if s == STRIDED => None,
        Some(Value::String(s)) if s == JAGGED && nested => Some(Layout::Jagged),
        Some(Value::String(s)) if s == JAGGED => {
            return Err(Error::invalid(
                path,
                format!("{what}: layout {s:?} on an entry that is not nested"),
            ))
        }
        Some(other) => {
            return Err(Error::unsupported(
                path,
                format!("{what}: layout {other} is not one this library reads (torch.strided, torch.jagged)"),
            ))
        }
    };
    let dtype_name = entry
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid(path, format!("{what}: dtype is missing or not a string")))?;
    let dt = dtype(dtype_name)
        .ok_or_else(|| Error::invalid(path, format!("{what}: unknown dtype {dtype_name:?}")))?;
    let shape = parse_shape(entry.get("shape"), &what, path)?;
    if nested {
        // the entry's shape is the shape of the table of component shapes: [components, dims]
        let &[components, dims] = shape.as_slice() else {
            return Err(Error::invalid(
                path,
                format!("{what}: a nested leaf's shape {shape:?} is not [components, dims]"),
            ));
        };
        let meta = NestedMeta {
            components,
            dims,
            layout: layout.unwrap_or(Layout::Strided),
        };
        if meta.table_bytes().is_none() {
            return Err(Error::invalid(path, format!("{what}: shape {shape:?} overflows")));
        }
        if batch.first().is_some_and(|&b| b != components) || (batch.len() as u64) > dims + 1 {
            return Err(Error::invalid(
                path,
                format!("{what}: a nested leaf of {components} components of {dims} dims cannot have the batch size {batch:?}"),
            ));
        }
        if meta.layout == Layout::Jagged && dims == 0 {
            return Err(Error::invalid(
                path,
                format!("{what}: a jagged leaf needs components of at least one dim"),
            ));
        }
        return Ok(Some(Entry::Leaf(LeafMeta {
            dtype: dt,
            shape,
            nbytes: 0,
            nested: Some(meta),
        })));
    }
    let nb = nbytes(&shape, dt.itemsize)
        .ok_or_else(|| Error::invalid(path, format!("{what}: shape {shape:?} overflows")))?;
    if shape.len() < batch.len() || shape[..batch.len()] != batch[..] {
        return Err(Error::invalid(
            path,
            format!("{what}: shape {shape:?} does not start with the batch size {batch:?}"),
        ));
    }
    Ok(Some(Entry::Leaf(LeafMeta {
        dtype: dt,
        shape,
        nbytes: nb,
        nested: None,
    })))
}
