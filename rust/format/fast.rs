//! The fast path of meta.json parsing: one typed pass over the bytes that builds exactly what
//! the loader needs (keys in file order, borrowed from the bytes while parsing; dtypes looked
//! up in the table as they are read; shapes straight into `Vec<u64>`), with no
//! `serde_json::Value` tree and no map of the whole file. No pyo3 and no file I/O here.
//!
//! It accepts only the files it understands completely: anything unusual (a duplicated key, a
//! value of an unexpected type, an unknown dtype, a shape that does not fit, a format version
//! from the future, broken JSON) makes it give up (`None`), and `format::parse_meta` parses
//! the file again with the generic code, which is the reference behaviour and words the
//! error. So a file this path accepts yields what the generic parser yields (the unit tests
//! check that on valid, odd and damaged files), and a damaged file still gets the generic
//! parser's error naming the file.
//!
//! `Value` is built only where arbitrary JSON may stand: the `data` of a NonTensorData
//! directory (in a TensorDict, a key named `data` is an ordinary entry, checked by the
//! generic per-entry code) and keys starting with `_` (metadata of newer writers, which may
//! not be objects).

use std::borrow::Cow;
use std::fmt;
use std::path::Path;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::meta::{self, DType, Entry, LeafMeta, NodeMeta, TensorDictMeta};
use super::parse::parse_entry;

/// One top-level value, as far as the fast path reads it.
enum Slot {
    Leaf {
        dtype: &'static DType,
        shape: Vec<u64>,
    },
    /// An object with a `type` key: a sub-directory.
    Collection,
    /// `{"type": "NonTensorStack"}`: a stack's sub-directory.
    Stack,
    /// A value checked by the generic per-entry code (see the module documentation).
    Generic(Value),
}

/// What the top-level object holds, before it is checked.
#[derive(Default)]
struct Top<'de> {
    format_version: Option<u64>,
    class: Option<Cow<'de, str>>,
    type_: Option<Cow<'de, str>>,
    batch: Option<Vec<u64>>,
    device: Option<Option<Cow<'de, str>>>,
    names: bool,
    entries: Vec<(Cow<'de, str>, Slot)>,
}

/// Parses a meta.json that holds nothing unusual; `None` sends it to the generic parser.
pub fn parse(bytes: &[u8]) -> Option<NodeMeta> {
    // One UTF-8 check of the whole file is cheaper than serde_json's check of every string.
    let text = std::str::from_utf8(bytes).ok()?;
    let mut de = serde_json::Deserializer::from_str(text);
    let top = de.deserialize_map(TopVisitor).ok()?;
    de.end().ok()?;
    finish(top)
}

fn finish(top: Top<'_>) -> Option<NodeMeta> {
    if top.format_version.is_some_and(|v| v > meta::FORMAT_VERSION) {
        return None;
    }
    // A key given twice: the generic parser decides what that means (the last one wins).
    let mut keys: Vec<&str> = top.entries.iter().map(|(k, _)| k.as_ref()).collect();
    keys.sort_unstable();
    if keys.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    if top.type_.as_deref().is_some_and(meta::is_user_class) {
        return None; // a tensorclass directory: the generic parser keeps its whole meta.json
    }
    let kind = top
        .class
        .as_deref()
        .map(|c| c.rsplit(':').next().unwrap_or(c))
        .or_else(|| {
            top.type_
                .as_deref()
                .map(|t| t.trim_end_matches("'>").rsplit('.').next().unwrap_or(t))
        });
    match kind {
        Some("TensorDict") => tensordict(top).map(NodeMeta::TensorDict),
        Some("NonTensorData") => top.entries.into_iter().find_map(|(key, slot)| match slot {
            Slot::Generic(data) if key == "data" => Some(NodeMeta::NonTensor(data)),
            _ => None,
        }),
        _ => None,
    }
}

fn tensordict(top: Top<'_>) -> Option<TensorDictMeta> {
    let batch = top.batch.unwrap_or_default();
    if batch.iter().any(|&d| d > i64::MAX as u64) {
        return None;
    }
    let device = match top.device {
        None | Some(None) => None,
        Some(Some(s)) if s == "None" => None,
        Some(Some(s)) if meta::valid_device(&s) => Some(s.into_owned()),
        Some(Some(_)) => return None,
    };
    let mut entries = Vec::with_capacity(top.entries.len());
    for (key, slot) in top.entries {
        let entry = match slot {
            Slot::Collection => Entry::Collection,
            Slot::Stack => Entry::Stack,
            Slot::Leaf { dtype, shape } => {
                // (`batch` is most often empty: no slice comparison then)
                let prefix = batch.is_empty() || shape.starts_with(&batch);
                if !prefix || shape.iter().any(|&d| d > i64::MAX as u64) {
                    return None;
                }
                let nbytes = meta::nbytes(&shape, dtype.itemsize)?;
                Entry::Leaf(LeafMeta {
                    dtype,
                    shape,
                    nbytes,
                    nested: None,
                })
            }
            Slot::Generic(value) => match parse_entry(&key, &value, &batch, Path::new("")) {
                Ok(Some(entry)) => entry,
                Ok(None) => continue,
                Err(_) => return None,
            },
        };
        entries.push((key.into_owned(), entry));
    }
    Some(TensorDictMeta {
        batch,
        device,
        format_version: top.format_version,
        entries,
    })
}

/// The error of the fast path: its text is never shown (the generic parser words errors).
fn give_up<E: de::Error>() -> E {
    E::custom("not on the fast path")
}

fn set_once<T, E: de::Error>(slot: &mut Option<T>, value: T) -> Result<(), E> {
    match slot.replace(value) {
        None => Ok(()),
        Some(_) => Err(give_up()),
    }
}

/// A string, borrowed from the bytes unless it had escapes (keys and string values); the
/// one-message description's parser (`packed.rs`) reads its strings with it too.
pub(crate) struct Str;

impl<'de> DeserializeSeed<'de> for Str {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Str {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(s))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(s.to_string()))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(s))
    }
}

/// `null` or a string (a directory's `device`).
pub(crate) struct OptStr;

impl<'de> DeserializeSeed<'de> for OptStr {
    type Value = Option<Cow<'de, str>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for OptStr {
    type Value = Option<Cow<'de, str>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("null or a string")
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        Str.deserialize(d).map(Some)
    }
}

/// A dtype string, looked up in the table as it is read (an unknown one gives up).
struct DtypeSeed;

impl<'de> DeserializeSeed<'de> for DtypeSeed {
    type Value = &'static DType;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<&'static DType, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for DtypeSeed {
    type Value = &'static DType;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a dtype")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<&'static DType, E> {
        meta::dtype(s).ok_or_else(give_up)
    }
}

/// A non-negative integer written without a sign: serde_json hands those to `visit_u64`
/// (`-0` comes as a float, and a negative number as an i64: the generic parser refuses both,
/// so this path gives up on anything but `visit_u64`).
struct Dim;

impl<'de> DeserializeSeed<'de> for Dim {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_u64(self)
    }
}

impl<'de> Visitor<'de> for Dim {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a non-negative integer")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }
}

/// A list of `Dim`s (a shape).
struct Dims;

impl<'de> DeserializeSeed<'de> for Dims {
    type Value = Vec<u64>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<u64>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Dims {
    type Value = Vec<u64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a shape")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
        let mut dims = Vec::with_capacity(seq.size_hint().unwrap_or(4));
        while let Some(d) = seq.next_element_seed(Dim)? {
            dims.push(d);
        }
        Ok(dims)
    }
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Top<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a meta.json object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top<'de>, A::Error> {
        let mut top = Top::default();
        while let Some(key) = map.next_key_seed(Str)? {
            match key.as_ref() {
                "_format_version" => set_once(&mut top.format_version, map.next_value_seed(Dim)?)?,
                "_class" => set_once(&mut top.class, map.next_value_seed(Str)?)?,
                "_type" => set_once(&mut top.type_, map.next_value_seed(Str)?)?,
                "shape" => set_once(&mut top.batch, map.next_value_seed(Dims)?)?,
                "device" => set_once(&mut top.device, map.next_value_seed(OptStr)?)?,
                "_names" => {
                    map.next_value::<IgnoredAny>()?;
                    if std::mem::replace(&mut top.names, true) {
                        return Err(give_up());
                    }
                }
                k if k == "data" || k.starts_with('_') => {
                    let value = map.next_value::<Value>()?;
                    top.entries.push((key, Slot::Generic(value)));
                }
                _ => {
                    let slot = map.next_value_seed(EntrySeed)?;
                    top.entries.push((key, slot));
                }
            }
        }
        Ok(top)
    }
}

/// One entry object: a leaf (`dtype`, `shape`, `is_nested`; `device` and unknown fields are
/// skipped, as the generic parser ignores them) or a sub-directory (`type`).
struct EntrySeed;

impl<'de> DeserializeSeed<'de> for EntrySeed {
    type Value = Slot;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Slot, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EntrySeed {
    type Value = Slot;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an entry object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Slot, A::Error> {
        let mut collection = false;
        let mut stack = false;
        let mut dtype = None;
        let mut shape = None;
        let mut nested = None;
        while let Some(key) = map.next_key_seed(Str)? {
            match key.as_ref() {
                "type" => {
                    let kind: Value = map.next_value()?;
                    stack = kind.as_str() == Some("NonTensorStack");
                    collection = true;
                }
                // nested leaves and layouts: the generic parser reads them
                "layout" => return Err(give_up()),
                "dtype" => set_once(&mut dtype, map.next_value_seed(DtypeSeed)?)?,
                "shape" => set_once(&mut shape, map.next_value_seed(Dims)?)?,
                "is_nested" => set_once(&mut nested, map.next_value::<bool>()?)?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if collection {
            return Ok(if stack { Slot::Stack } else { Slot::Collection });
        }
        match (dtype, shape, nested) {
            (Some(dtype), Some(shape), None | Some(false)) => Ok(Slot::Leaf { dtype, shape }),
            _ => Err(give_up()),
        }
    }
}

#[cfg(test)]
mod tests;
