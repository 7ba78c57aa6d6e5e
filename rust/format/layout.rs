//! The on-disk format, in one place: key <-> file name, the dtype table, meta.json writing and
//! validating parsing. It matches what tensordict 0.15 writes (see the reference document §1),
//! so that directories move both ways. No pyo3 and no file I/O here.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Name of the metadata file of every directory.
pub const META_FILE: &str = "meta.json";
/// Suffix of a leaf's data file.
pub const LEAF_SUFFIX: &str = ".memmap";
/// Largest meta.json we read: far above any real tree, small enough to refuse garbage.
pub const META_LIMIT: u64 = 64 << 20;
/// Deepest nesting we follow when loading.
pub const MAX_DEPTH: usize = 256;
/// Highest `_format_version` this library reads.
pub const FORMAT_VERSION: u64 = 1;

/// Keys that meta.json uses for itself: a leaf with one of these names would be lost.
pub const RESERVED_KEYS: &[&str] = &["shape", "device", "_type", "_format_version", "_class", "_names"];

const TD_TYPE: &str = "<class 'tensordict._td.TensorDict'>";
const TD_CLASS: &str = "tensordict:TensorDict";
const NTD_TYPE: &str = "<class 'tensordict.tensorclass.NonTensorData'>";

/// A tensor element type as written in meta.json (`str(torch.dtype)`).
#[derive(Debug, PartialEq, Eq)]
pub struct DType {
    pub name: &'static str,
    pub itemsize: usize,
}

/// Every dtype the format stores (the reference's `_STR_DTYPE_TO_DTYPE`, quantized excepted).
pub const DTYPES: &[DType] = &[
    DType {
        name: "torch.bool",
        itemsize: 1,
    },
    DType {
        name: "torch.uint8",
        itemsize: 1,
    },
    DType {
        name: "torch.int8",
        itemsize: 1,
    },
    DType {
        name: "torch.int16",
        itemsize: 2,
    },
    DType {
        name: "torch.int32",
        itemsize: 4,
    },
    DType {
        name: "torch.int64",
        itemsize: 8,
    },
    DType {
        name: "torch.uint16",
        itemsize: 2,
    },
    DType {
        name: "torch.uint32",
        itemsize: 4,
    },
    DType {
        name: "torch.uint64",
        itemsize: 8,
    },
    DType {
        name: "torch.float16",
        itemsize: 2,
    },
    DType {
        name: "torch.bfloat16",
        itemsize: 2,
    },
    DType {
        name: "torch.float32",
        itemsize: 4,
    },
    DType {
        name: "torch.float64",
        itemsize: 8,
    },
    DType {
        name: "torch.complex32",
        itemsize: 4,
    },
    DType {
        name: "torch.complex64",
        itemsize: 8,
    },
    DType {
        name: "torch.complex128",
        itemsize: 16,
    },
];

/// Looks a dtype string up in the table.
pub fn dtype(name: &str) -> Option<&'static DType> {
    DTYPES.iter().find(|d| d.name == name)
}

/// Byte size of a tensor of `shape` and `itemsize`, or `None` on overflow.
pub fn nbytes(shape: &[u64], itemsize: usize) -> Option<usize> {
    // torch computes contiguous strides in int64 as products of the later dimensions (a zero
    // counted as one): a shape whose strides overflow cannot be made, even with no elements.
    let mut stride: i64 = 1;
    for &d in shape.iter().skip(1).rev() {
        stride = stride.checked_mul(i64::try_from(d.max(1)).ok()?)?;
    }
    if shape.iter().any(|&d| i64::try_from(d).is_err()) {
        return None;
    }
    let mut n: u64 = itemsize as u64;
    for &d in shape {
        n = n.checked_mul(d)?;
    }
    // Keep every size a valid isize offset for the buffer protocol.
    usize::try_from(n).ok().filter(|&n| n <= isize::MAX as usize)
}

/// Encodes a key into one safe file-name component, a sub-directory's name: tensordict's
/// robust keys (`portable_key`), exactly, except on Windows, where the names Windows refuses
/// are escaped too (see `windows_safe_name`).
pub fn encode_key(key: &str) -> String {
    on_this_system(portable_key(key))
}

fn on_this_system(name: String) -> String {
    if cfg!(windows) {
        windows_safe_name(name)
    } else {
        name
    }
}

/// A file name as the file system compares it: as is, except on Windows, whose file names are
/// case-insensitive (there `A.memmap` and `a.memmap` are one file).
pub fn fold_case(name: &str) -> String {
    if cfg!(windows) {
        name.to_lowercase()
    } else {
        name.to_string()
    }
}

/// True for a name whose part before the first dot is a Windows device name (`CON`, `PRN`,
/// `AUX`, `NUL`, `COM0`-`COM9`, `LPT0`-`LPT9`, superscript digits too, any case).
fn is_device_name(name: &str) -> bool {
    let stem = name.split('.').next().unwrap_or("").to_ascii_uppercase();
    matches!(stem.as_str(), "CON" | "PRN" | "AUX" | "NUL")
        || (stem.len() >= 4
            && (stem.starts_with("COM") || stem.starts_with("LPT"))
            && stem[3..].chars().count() == 1
            && stem[3..]
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '¹' | '²' | '³')))
}

/// Windows' reserved names kept out of a file name (applied to the whole name, a leaf's suffix
/// included), decoding to the same key: a device name (`is_device_name`, with any extension)
/// gets its first letter as `%XX`, and a trailing dot becomes `%2E` (Windows drops it; a
/// trailing space is already `%20`, a `:` already `%3A`). Linux keeps tensordict's names, so
/// directories with such keys written on one system are not found on the other.
pub fn windows_safe_name(mut name: String) -> String {
    if is_device_name(&name) {
        name = format!("%{:02X}{}", name.as_bytes()[0], &name[1..]);
    }
    if name.ends_with('.') {
        name.pop();
        name.push_str("%2E");
    }
    name
}

/// Encodes a key exactly like tensordict's robust keys: `/ < > : " | ? * \ space NUL %`,
/// control characters and DEL become `%XX`; `""`, `.` and `..` become `%`, `%2E` and `%2E%2E`.
/// The names inside archives, on every system.
pub fn portable_key(key: &str) -> String {
    match key {
        "" => return "%".to_string(),
        "." => return "%2E".to_string(),
        ".." => return "%2E%2E".to_string(),
        _ => {}
    }
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        let escape = matches!(
            c,
            '/' | '<' | '>' | ':' | '"' | '|' | '?' | '*' | '\\' | ' ' | '%'
        ) || (c as u32) < 32
            || c as u32 == 127;
        if escape {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// The raw key as a legacy (unencoded) file-name component, if that is safe to open.
pub fn legacy_name(key: &str) -> Option<&str> {
    let unsafe_name = key.is_empty()
        || key == "."
        || key == ".."
        || key.contains(['/', '\\', '\0'])
        || key.as_bytes().get(1) == Some(&b':')
        // Windows: a device (`CON.memmap` opens the console) or an alternate data stream.
        || (cfg!(windows) && (is_device_name(key) || key.contains(':')));
    (!unsafe_name).then_some(key)
}

/// File name of a leaf (on Windows, `windows_safe_name` of the whole name).
pub fn leaf_file(key: &str) -> String {
    on_this_system(portable_leaf_file(key))
}

/// Name of a leaf's file inside an archive (tensordict's, on every system).
pub fn portable_leaf_file(key: &str) -> String {
    let mut name = portable_key(key);
    name.push_str(LEAF_SUFFIX);
    name
}

// ---------------------------------------------------------------------------------------------
// Writing

/// One entry of a TensorDict directory's meta.json, as the saver describes it.
pub enum EntryMeta<'a> {
    Leaf {
        dtype: &'a str,
        shape: &'a [u64],
        device: &'a str,
    },
    TensorDict,
    NonTensorData,
}

/// Formats JSON like Python's `json.dumps` does by default (`", "` and `": "`), so that files
/// look like the reference's; non-ASCII is written as UTF-8, as orjson does.
pub(crate) struct PyJsonFormatter;

impl serde_json::ser::Formatter for PyJsonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

fn to_json_bytes(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PyJsonFormatter);
    serde::Serialize::serialize(value, &mut ser).expect("a Value always serializes");
    out
}

/// meta.json of a TensorDict directory: the entries in order, then the reserved keys.
///
/// Streamed through the serializer (no `Value` tree: a flat directory of 10,000 leaves made
/// 10,000 maps first); the bytes are those `to_json_bytes` writes for the same object.
pub fn tensordict_meta<'a>(
    entries: impl IntoIterator<Item = (&'a str, EntryMeta<'a>)>,
    batch: &[u64],
) -> Vec<u8> {
    use serde::ser::{SerializeMap, Serializer};
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PyJsonFormatter);
    let written = (|| -> serde_json::Result<()> {
        let mut map = (&mut ser).serialize_map(None)?;
        for (key, entry) in entries {
            match entry {
                EntryMeta::Leaf { dtype, shape, device } => {
                    map.serialize_entry(key, &LeafJson { dtype, shape, device })?
                }
                EntryMeta::TensorDict => map.serialize_entry(key, &TypeJson("TensorDict"))?,
                EntryMeta::NonTensorData => map.serialize_entry(key, &TypeJson("NonTensorData"))?,
            }
        }
        map.serialize_entry("shape", batch)?;
        map.serialize_entry("device", "cpu")?;
        map.serialize_entry("_type", TD_TYPE)?;
        map.serialize_entry("_format_version", &FORMAT_VERSION)?;
        map.serialize_entry("_class", TD_CLASS)?;
        map.end()
    })();
    written.expect("writing JSON into a Vec cannot fail");
    out
}

/// A leaf's entry in a TensorDict meta.json, in the reference's key order.
struct LeafJson<'a> {
    dtype: &'a str,
    shape: &'a [u64],
    device: &'a str,
}

impl serde::Serialize for LeafJson<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = ser.serialize_map(Some(4))?;
        map.serialize_entry("device", self.device)?;
        map.serialize_entry("shape", self.shape)?;
        map.serialize_entry("dtype", self.dtype)?;
        map.serialize_entry("is_nested", &false)?;
        map.end()
    }
}

/// `{"type": ...}`: the entry of a sub-directory in a TensorDict meta.json.
struct TypeJson(&'static str);

impl serde::Serialize for TypeJson {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = ser.serialize_map(Some(1))?;
        map.serialize_entry("type", self.0)?;
        map.end()
    }
}

/// meta.json of a NonTensorData directory holding a JSON value.
pub fn non_tensor_meta(data: &Value) -> Vec<u8> {
    let mut map = Map::new();
    map.insert("_type".into(), NTD_TYPE.into());
    map.insert("data".into(), data.clone());
    map.insert("_metadata".into(), Value::Null);
    map.insert("_is_non_tensor".into(), true.into());
    to_json_bytes(&Value::Object(map))
}

// ---------------------------------------------------------------------------------------------
// Reading

/// A validated leaf entry.
#[derive(Debug)]
pub struct LeafMeta {
    pub dtype: &'static DType,
    pub shape: Vec<u64>,
    pub nbytes: usize,
}

/// A validated entry of a TensorDict meta.json.
#[derive(Debug)]
pub enum Entry {
    Leaf(LeafMeta),
    /// A sub-directory; what it holds is decided by its own meta.json.
    Collection,
}

/// A validated TensorDict meta.json.
#[derive(Debug)]
pub struct TensorDictMeta {
    pub batch: Vec<u64>,
    pub device: Option<String>,
    /// `_format_version` as the file records it (absent in old trees).
    pub format_version: Option<u64>,
    pub entries: Vec<(String, Entry)>,
}

/// What a directory's meta.json says the directory is.
#[derive(Debug)]
pub enum NodeMeta {
    TensorDict(TensorDictMeta),
    NonTensor(Value),
}

/// Parses and validates a meta.json read from `path`: the typed fast path (`meta_parse`) for
/// the files it fully understands, else the generic parser below, which words every error.
pub fn parse_meta(bytes: &[u8], path: &Path) -> Result<NodeMeta> {
    match crate::format::meta_parse::parse(bytes) {
        Some(meta) => Ok(meta),
        None => parse_meta_generic(bytes, path),
    }
}

/// The generic parser: the whole file into a `serde_json::Value`, then checked. It defines
/// what a meta.json means (`meta_parse` must agree with it) and words the errors.
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

/// `type` or `type:index`, with a device type torch knows.
pub(crate) fn valid_device(s: &str) -> bool {
    const TYPES: &[&str] = &[
        "cpu",
        "cuda",
        "ipu",
        "xpu",
        "mkldnn",
        "opengl",
        "opencl",
        "ideep",
        "hip",
        "ve",
        "fpga",
        "maia",
        "xla",
        "lazy",
        "vulkan",
        "mps",
        "meta",
        "hpu",
        "mtia",
        "privateuseone",
    ];
    let (kind, index) = match s.split_once(':') {
        Some((k, i)) => (k, Some(i)),
        None => (s, None),
    };
    TYPES.contains(&kind)
        && index.is_none_or(|i| !i.is_empty() && i.len() < 10 && i.bytes().all(|b| b.is_ascii_digit()))
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
    if entry.contains_key("type") {
        return Ok(Some(Entry::Collection));
    }
    let what = format!("key {key:?}");
    if entry.get("is_nested").and_then(Value::as_bool).unwrap_or(false) {
        return Err(Error::unsupported(
            path,
            format!("{what}: nested (jagged) tensors are not supported"),
        ));
    }
    let dtype_name = entry
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid(path, format!("{what}: dtype is missing or not a string")))?;
    let dt = dtype(dtype_name)
        .ok_or_else(|| Error::invalid(path, format!("{what}: unknown dtype {dtype_name:?}")))?;
    let shape = parse_shape(entry.get("shape"), &what, path)?;
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
    })))
}

#[cfg(test)]
mod tests;
