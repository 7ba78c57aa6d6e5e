//! Writing meta.json: streamed like Python's `json.dumps` writes it, byte for byte the
//! reference's.

use serde_json::{Map, Value};

use super::meta::{FORMAT_VERSION, NTD_TYPE, TD_CLASS, TD_TYPE};

/// One entry of a TensorDict directory's meta.json, as the saver describes it.
pub enum EntryMeta<'a> {
    Leaf {
        dtype: &'a str,
        shape: &'a [u64],
        device: &'a str,
    },
    /// A nested leaf: `shape` is the shape of its table of component shapes; a jagged one
    /// records its layout (a key the reference ignores: it reads the strided layout).
    Nested {
        dtype: &'a str,
        shape: &'a [u64],
        device: &'a str,
        jagged: bool,
    },
    TensorDict,
    NonTensorData,
    NonTensorStack,
    /// A tensorclass directory: `{"type": <class name>}`.
    TensorClass(&'a str),
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

pub(crate) fn to_json_bytes(value: &Value) -> Vec<u8> {
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
                EntryMeta::Leaf { dtype, shape, device } => map.serialize_entry(
                    key,
                    &LeafJson {
                        dtype,
                        shape,
                        device,
                        nested: None,
                    },
                )?,
                EntryMeta::Nested {
                    dtype,
                    shape,
                    device,
                    jagged,
                } => map.serialize_entry(
                    key,
                    &LeafJson {
                        dtype,
                        shape,
                        device,
                        nested: Some(jagged),
                    },
                )?,
                EntryMeta::TensorDict => map.serialize_entry(key, &TypeJson("TensorDict"))?,
                EntryMeta::NonTensorData => map.serialize_entry(key, &TypeJson("NonTensorData"))?,
                EntryMeta::NonTensorStack => map.serialize_entry(key, &TypeJson("NonTensorStack"))?,
                EntryMeta::TensorClass(name) => map.serialize_entry(key, &TypeJson(name))?,
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
    /// `Some(jagged)` for a nested leaf.
    nested: Option<bool>,
}

impl serde::Serialize for LeafJson<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = ser.serialize_map(None)?;
        map.serialize_entry("device", self.device)?;
        map.serialize_entry("shape", self.shape)?;
        map.serialize_entry("dtype", self.dtype)?;
        map.serialize_entry("is_nested", &self.nested.is_some())?;
        if self.nested == Some(true) {
            map.serialize_entry("layout", super::meta::JAGGED)?;
        }
        map.end()
    }
}

/// `{"type": ...}`: the entry of a sub-directory in a TensorDict meta.json.
struct TypeJson<'a>(&'a str);

impl serde::Serialize for TypeJson<'_> {
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

#[cfg(test)]
mod tests;
