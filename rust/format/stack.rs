//! The `data` of a NonTensorStack's meta.json: the values of the stack as nested JSON arrays
//! (tensordict's `tolist()`), read into a shape and cells, and written back. No I/O here.
//!
//! The shape is read as tensordict reads it (`NonTensorStack._from_list`): a level of arrays
//! is a dim when every array at that level has the same length; the cells are what lies below
//! the last dim, row-major. A file may give the shape (`"shape"`, written for the one case the
//! nesting cannot tell: cells that are equal-length arrays); the data must then nest to it.
//!
//! Cells that are all strings (the common case: a string per row) are read in one typed pass
//! into a packed column, their UTF-8 bytes back to back and `n + 1` offsets, with no
//! `serde_json::Value` per cell; anything else goes through `Value`.
//!
//! The stack's meta.json itself (`meta_bytes`, `parse_stack`): one compact JSON object, the
//! reference's keys in its order (`_type`, `_format_version`, `_class`, `stack_dim`, `device`,
//! `data`), byte for byte what tensordict 0.15.3 writes for ASCII data.

use std::fmt;
use std::path::Path;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::meta::{valid_device, FORMAT_VERSION};
use crate::error::{Error, Result};

type DeResult<T, E> = std::result::Result<T, E>;

/// `_type` of a NonTensorStack directory, as tensordict writes it.
pub const STACK_TYPE: &str = "<class 'tensordict.tensorclass.NonTensorStack'>";
/// `_class` of a NonTensorStack directory (format version 1).
pub const STACK_CLASS: &str = "tensordict:NonTensorStack";

/// A validated NonTensorStack meta.json.
#[derive(Debug, PartialEq)]
pub struct StackMeta {
    /// `None`: `null` (no device).
    pub device: Option<String>,
    pub stack_dim: i64,
    pub data: StackData,
}

/// The meta.json of a stack: compact, the reference's keys in its order; `data` is the JSON
/// text of the values (`write`). `shape` is written (last, a key the reference does not read)
/// only where the nesting cannot tell the stack's dims (see the module documentation).
pub fn meta_bytes(stack_dim: i64, device: Option<&str>, data: &[u8], shape: Option<&[u64]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 160);
    out.extend_from_slice(b"{\"_type\":");
    let _ = serde_json::to_writer(&mut out, STACK_TYPE);
    out.extend_from_slice(format!(",\"_format_version\":{FORMAT_VERSION},\"_class\":").as_bytes());
    let _ = serde_json::to_writer(&mut out, STACK_CLASS);
    out.extend_from_slice(format!(",\"stack_dim\":{stack_dim},\"device\":").as_bytes());
    let _ = serde_json::to_writer(&mut out, &device);
    out.extend_from_slice(b",\"data\":");
    out.extend_from_slice(data);
    if let Some(shape) = shape {
        out.extend_from_slice(b",\"shape\":");
        let _ = serde_json::to_writer(&mut out, shape);
    }
    out.push(b'}');
    out
}

/// Whether the nesting of `data` alone would give the stack other dims than `shape`: cells
/// that are arrays of one length (read as more dims), or an empty dim before the last (the
/// nesting stops there: `[0, 3]` reads as `[0]`). Then `meta_bytes` must write the shape.
pub fn needs_shape(shape: &[u64], cells: &Cells) -> bool {
    if shape
        .iter()
        .position(|&d| d == 0)
        .is_some_and(|at| at + 1 < shape.len())
    {
        return true;
    }
    let Cells::Json(values) = cells else { return false };
    let mut lens = values.iter().map(|v| v.as_array().map(Vec::len));
    match lens.next() {
        Some(Some(first)) => lens.all(|l| l == Some(first)),
        _ => false,
    }
}

/// Parses a NonTensorStack meta.json read from `path` (the caller knows it is one: the parent
/// entry says so, or its `_type` does).
pub fn parse_stack(bytes: &[u8], path: &Path) -> Result<StackMeta> {
    if let Some(meta) = std::str::from_utf8(bytes).ok().and_then(typed_stack) {
        return Ok(meta);
    }
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| Error::invalid(path, format!("meta.json is not valid JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(Error::invalid(path, "meta.json is not a JSON object"));
    };
    from_map(map, path)
}

/// The generic reading of a stack's meta.json (already a JSON object).
pub fn from_map(mut map: serde_json::Map<String, Value>, path: &Path) -> Result<StackMeta> {
    let invalid = |what: String| Error::invalid(path, what);
    let stack_dim = match map.get("stack_dim") {
        None => 0,
        Some(v) => v
            .as_i64()
            .ok_or_else(|| invalid(format!("the stack's stack_dim {v} is not an integer")))?,
    };
    let device = match map.get("device") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "None" => None,
        Some(Value::String(s)) if valid_device(s) => Some(s.clone()),
        Some(other) => return Err(invalid(format!("the stack's device {other} is not a device"))),
    };
    let shape = match map.get("shape") {
        None => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|v| v.as_u64().filter(|&d| d <= i64::MAX as u64))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| {
                    invalid(format!(
                        "the stack's shape {} is not a shape",
                        Value::Array(items.clone())
                    ))
                })?,
        ),
        Some(other) => return Err(invalid(format!("the stack's shape {other} is not a list"))),
    };
    let data = match map.remove("data") {
        Some(Value::String(name)) if name == "pickle.pkl" => {
            return Err(Error::unsupported(
                path,
                "the stack's values were stored with pickle (pickle.pkl), which is never loaded (only JSON values are)",
            ))
        }
        Some(Value::String(name)) => {
            return Err(invalid(format!("the stack's data names a file {name:?}, which is not a stack's")))
        }
        Some(data) => from_value(data, shape.as_deref()).map_err(|e| invalid(e.to_string()))?,
        None => {
            return Err(invalid(
                "the stack has no data (the older layout of one directory per element is not read)".into(),
            ))
        }
    };
    let Some(stack_dim) = normal_stack_dim(stack_dim, data.shape.len()) else {
        return Err(invalid(format!(
            "the stack's stack_dim {stack_dim} is out of range for its {} dims",
            data.shape.len()
        )));
    };
    Ok(StackMeta {
        device,
        stack_dim,
        data,
    })
}

/// `stack_dim` made non-negative, if it names one of the stack's `ndim` dims (a stack has at
/// least one); `None` otherwise.
fn normal_stack_dim(stack_dim: i64, ndim: usize) -> Option<i64> {
    let ndim = i64::try_from(ndim.max(1)).ok()?;
    let dim = if stack_dim < 0 {
        stack_dim.checked_add(ndim)?
    } else {
        stack_dim
    };
    (0..ndim).contains(&dim).then_some(dim)
}

/// The typed pass over a whole stack meta.json: strings in `data`, the other keys of the
/// expected types. `None`: the generic path reads it (and words any error).
fn typed_stack(text: &str) -> Option<StackMeta> {
    let mut de = serde_json::Deserializer::from_str(text);
    let top = de.deserialize_map(TopVisitor).ok()?;
    de.end().ok()?;
    if top.format_version.is_some_and(|v| v > FORMAT_VERSION) {
        return None;
    }
    let device = match top.device {
        None | Some(None) => None,
        Some(Some(s)) if s == "None" => None,
        Some(Some(s)) if valid_device(&s) => Some(s),
        Some(Some(_)) => return None,
    };
    let (dims, bytes, offsets) = top.data?;
    if top.shape.as_ref().is_some_and(|s| *s != dims) {
        return None;
    }
    let stack_dim = normal_stack_dim(top.stack_dim.unwrap_or(0), dims.len())?;
    Some(StackMeta {
        device,
        stack_dim,
        data: StackData {
            shape: dims,
            cells: Cells::Strings { bytes, offsets },
        },
    })
}

#[derive(Default)]
struct Top {
    format_version: Option<u64>,
    stack_dim: Option<i64>,
    device: Option<Option<String>>,
    shape: Option<Vec<u64>>,
    data: Option<(Vec<u64>, Vec<u8>, Vec<i64>)>,
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Top;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a stack's meta.json")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Top, A::Error> {
        let mut top = Top::default();
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom("a key given twice"));
            }
            match key.as_str() {
                "_format_version" => top.format_version = Some(map.next_value()?),
                "stack_dim" => top.stack_dim = Some(map.next_value()?),
                "device" => top.device = Some(map.next_value()?),
                "shape" => top.shape = Some(map.next_value()?),
                "data" => {
                    let mut state = Strings {
                        lens: Vec::new(),
                        depth: None,
                        bytes: Vec::new(),
                        offsets: vec![0],
                    };
                    map.next_value_seed(Level {
                        state: &mut state,
                        at: 0,
                    })?;
                    let depth = state.depth.ok_or_else(|| de::Error::custom("no strings"))?;
                    let dims = state.lens.iter().take(depth).map(|&n| n as u64).collect();
                    top.data = Some((dims, state.bytes, state.offsets));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(top)
    }
}

/// The cells of a stack, row-major.
#[derive(Debug, PartialEq)]
pub enum Cells {
    /// Strings: cell `i` is `bytes[offsets[i]..offsets[i + 1]]` (UTF-8).
    Strings { bytes: Vec<u8>, offsets: Vec<i64> },
    /// Any JSON values.
    Json(Vec<Value>),
}

impl Cells {
    pub fn len(&self) -> usize {
        match self {
            Cells::Strings { offsets, .. } => offsets.len() - 1,
            Cells::Json(values) => values.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A stack's values: its shape and cells.
#[derive(Debug, PartialEq)]
pub struct StackData {
    pub shape: Vec<u64>,
    pub cells: Cells,
}

impl StackData {
    /// A stack without cells nests as far as its first empty dim (`[]` is `[0]`, `[[], []]`
    /// is `[2, 0]`), so a file without `"shape"` (tensordict's, or ours before it wrote one
    /// for such stacks) cannot tell the dims after it. Where the batch size of the stack's
    /// tree starts with the dims read and has more, the stack takes them: `[]` in a tree of
    /// batch size `[0, 3]` is a stack of shape `[0, 3]`.
    pub fn fit_batch(&mut self, batch: &[u64]) {
        if self.cells.is_empty()
            && self.shape.last() == Some(&0)
            && batch.len() > self.shape.len()
            && batch.starts_with(&self.shape)
        {
            self.shape = batch.to_vec();
        }
    }
}

/// Why `data` was refused (the caller words it with the key and path).
#[derive(Debug, PartialEq)]
pub enum DataError {
    NotAList,
    /// The data does not nest to the shape the file gives.
    ShapeMismatch {
        shape: Vec<u64>,
    },
    Json(String),
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataError::NotAList => f.write_str("the stack's data is not a list"),
            DataError::ShapeMismatch { shape } => {
                write!(f, "the stack's data does not nest to its shape {shape:?}")
            }
            DataError::Json(e) => write!(f, "the stack's data is not valid JSON: {e}"),
        }
    }
}

/// Reads the raw JSON text of `data` (`shape`: the file's `"shape"`, if any).
pub fn read(text: &str, shape: Option<&[u64]>) -> DeResult<StackData, DataError> {
    if let Some(found) = read_strings(text, shape) {
        return Ok(found);
    }
    let value: Value = serde_json::from_str(text).map_err(|e| DataError::Json(e.to_string()))?;
    from_value(value, shape)
}

/// Reads a parsed `data` value.
pub fn from_value(value: Value, shape: Option<&[u64]>) -> DeResult<StackData, DataError> {
    if !value.is_array() {
        return Err(DataError::NotAList);
    }
    let dims = match shape {
        Some(s) => {
            check_nesting(&value, s).map_err(|()| DataError::ShapeMismatch { shape: s.to_vec() })?;
            s.to_vec()
        }
        None => nested_shape(&value),
    };
    let mut cells = Vec::new();
    flatten(value, dims.len(), &mut cells);
    let strings = !cells.is_empty() && cells.iter().all(Value::is_string);
    let cells = if strings {
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(cells.len() + 1);
        offsets.push(0);
        for cell in &cells {
            bytes.extend_from_slice(cell.as_str().unwrap_or_default().as_bytes());
            offsets.push(bytes.len() as i64);
        }
        Cells::Strings { bytes, offsets }
    } else {
        Cells::Json(cells)
    };
    Ok(StackData { shape: dims, cells })
}

/// The dims of nested arrays, as tensordict reads them.
fn nested_shape(value: &Value) -> Vec<u64> {
    let mut shape = Vec::new();
    let mut level: Vec<&Value> = vec![value];
    loop {
        let mut len = None;
        for v in &level {
            match v.as_array() {
                Some(items) if len.is_none_or(|n| n == items.len()) => len = Some(items.len()),
                _ => return shape,
            }
        }
        let Some(n) = len else { return shape };
        shape.push(n as u64);
        if n == 0 {
            return shape;
        }
        level = level
            .iter()
            .flat_map(|v| v.as_array().into_iter().flatten())
            .collect();
    }
}

fn check_nesting(value: &Value, shape: &[u64]) -> DeResult<(), ()> {
    let Some((&n, rest)) = shape.split_first() else {
        return Ok(());
    };
    let items = value.as_array().ok_or(())?;
    if items.len() as u64 != n {
        return Err(());
    }
    items.iter().try_for_each(|item| check_nesting(item, rest))
}

fn flatten(value: Value, depth: usize, out: &mut Vec<Value>) {
    if depth == 0 {
        out.push(value);
        return;
    }
    if let Value::Array(items) = value {
        for item in items {
            flatten(item, depth - 1, out);
        }
    }
}

/// The typed pass: arrays of equal lengths per level down to strings at one depth (and that
/// depth is the file's shape, when it gives one). `None`: the generic path decides.
fn read_strings(text: &str, shape: Option<&[u64]>) -> Option<StackData> {
    let mut de = serde_json::Deserializer::from_str(text);
    let mut state = Strings {
        lens: Vec::new(),
        depth: None,
        bytes: Vec::new(),
        offsets: vec![0],
    };
    (Level {
        state: &mut state,
        at: 0,
    })
    .deserialize(&mut de)
    .ok()?;
    de.end().ok()?;
    let depth = state.depth?;
    let dims: Vec<u64> = state.lens.iter().take(depth).map(|&n| n as u64).collect();
    if shape.is_some_and(|s| s != dims.as_slice()) {
        return None;
    }
    Some(StackData {
        shape: dims,
        cells: Cells::Strings {
            bytes: state.bytes,
            offsets: state.offsets,
        },
    })
}

struct Strings {
    /// The length of the arrays at each level (all equal, or the pass gives up).
    lens: Vec<usize>,
    /// The level of the strings.
    depth: Option<usize>,
    bytes: Vec<u8>,
    offsets: Vec<i64>,
}

struct Level<'s> {
    state: &'s mut Strings,
    at: usize,
}

impl<'de> DeserializeSeed<'de> for Level<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> DeResult<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Level<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("nested arrays of strings")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> DeResult<(), E> {
        let state = self.state;
        if *state.depth.get_or_insert(self.at) != self.at || self.at == 0 {
            return Err(E::custom("strings at two depths"));
        }
        state.bytes.extend_from_slice(v.as_bytes());
        state.offsets.push(state.bytes.len() as i64);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> DeResult<(), A::Error> {
        let state = self.state;
        if state.depth.is_some_and(|d| self.at >= d) {
            return Err(de::Error::custom("an array where a string is"));
        }
        let mut n = 0usize;
        while seq
            .next_element_seed(Level {
                state: &mut *state,
                at: self.at + 1,
            })?
            .is_some()
        {
            n += 1;
        }
        if n == 0 {
            return Err(de::Error::custom("an empty array: the generic path reads it"));
        }
        match state.lens.get(self.at) {
            Some(&len) if len != n => Err(de::Error::custom("ragged")),
            Some(_) => Ok(()),
            None if state.lens.len() == self.at => {
                state.lens.push(n);
                Ok(())
            }
            None => Err(de::Error::custom("ragged")),
        }
    }

    // Anything else (numbers, objects, null, bools) leaves the typed pass.
    fn visit_bool<E: de::Error>(self, _: bool) -> DeResult<(), E> {
        Err(E::custom("not a string"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> DeResult<(), E> {
        Err(E::custom("not a string"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> DeResult<(), E> {
        Err(E::custom("not a string"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> DeResult<(), E> {
        Err(E::custom("not a string"))
    }
    fn visit_unit<E: de::Error>(self) -> DeResult<(), E> {
        Err(E::custom("not a string"))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> DeResult<(), A::Error> {
        Err(de::Error::custom("not a string"))
    }
}

/// Writes cells as nested JSON arrays of `shape` (compact, as tensordict's stack files).
pub fn write(shape: &[u64], cells: &Cells, out: &mut Vec<u8>) {
    let n = cells.len();
    let mut next = 0usize;
    write_level(shape, cells, &mut next, out);
    debug_assert_eq!(next, n);
}

fn write_level(shape: &[u64], cells: &Cells, next: &mut usize, out: &mut Vec<u8>) {
    let Some((&n, rest)) = shape.split_first() else {
        write_cell(cells, *next, out);
        *next += 1;
        return;
    };
    out.push(b'[');
    for i in 0..n {
        if i > 0 {
            out.push(b',');
        }
        write_level(rest, cells, next, out);
    }
    out.push(b']');
}

fn write_cell(cells: &Cells, i: usize, out: &mut Vec<u8>) {
    match cells {
        Cells::Strings { bytes, offsets } => {
            let (a, b) = (offsets[i] as usize, offsets[i + 1] as usize);
            let s = std::str::from_utf8(&bytes[a..b]).unwrap_or_default();
            // serde_json escapes what JSON requires and writes the rest as UTF-8
            let _ = serde_json::to_writer(&mut *out, s);
        }
        Cells::Json(values) => {
            let _ = serde_json::to_writer(&mut *out, &values[i]);
        }
    }
}

#[cfg(test)]
mod tests;
