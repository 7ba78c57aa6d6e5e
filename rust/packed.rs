//! A whole tree as one message: the packed layout of its leaves and the JSON description that
//! lets a rank that knows nothing build the receiving tree. No pyo3 here.
//!
//! The packed layout lists the tensor leaves depth-first in sorted-key order, each at an
//! offset rounded up to [`ALIGN`] bytes (the alignment of an anonymous arena's parts, so that
//! a tree of small leaves memory-mapped without a prefix already lies in packed layout). [`PackedLayout`] is the copy plan of one tree (leaf
//! address, packed offset, size per leaf), checked once when it is made; its copies can be
//! restricted to a byte range of the packed buffer, so that a message travels in pieces while
//! the next piece is packed or the previous one scattered.
//!
//! The description is the JSON of `meta.json` (the same per-leaf entries and reserved keys),
//! with each nested TensorDict's own `meta.json` object inlined under its key and non-tensor
//! values inlined as NonTensorData's `meta.json`. [`describe`] writes it, [`parse`] validates it
//! like a directory's `meta.json` (bounded size and depth, the dtype table, checked sizes).

use std::borrow::Cow;
use std::cell::RefCell;
use std::io::Write;

use serde::de::{self, DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::format;
use crate::format::fast::{OptStr, Str};
use crate::format::meta::{NTD_TYPE, TD_CLASS, TD_TYPE};
use crate::format::stack::STACK_TYPE;
use crate::sys::gather::{self, Copy, Overlap, Range};

/// Every leaf starts at a multiple of this many bytes (every dtype can be viewed in place): the
/// alignment of the parts of an anonymous arena, whose small parts `memmap_()` lays out in
/// packed order, so that such a tree's arena is its message as it is (no copy either way).
pub const ALIGN: usize = crate::sys::anon::ARENA_ALIGN;
/// The longest description accepted (the meta.json limit of the loader).
pub const DESCRIPTION_LIMIT: usize = format::META_LIMIT as usize;

/// The nesting of JSON objects and lists a description may have, the root object being one
/// level (serde_json's recursion limit, 128, refuses the 128th). A node `k` levels below the
/// root is at level `k + 1`, its leaves' objects at `k + 2` and their shapes at `k + 3`.
pub const JSON_DEPTH: usize = 127;

// The protocol of `torch.distributed` trees sent as one message (`_dist_wire.py`): a header
// of three int64 (`MAGIC`, the description's length or `REFUSED`, the data's bytes), the
// description, then the packed data in pieces of `PIECE_BYTES`, piece `i` with tag
// `init_tag + i`. Defined here once; Python reads them from `_native`.

/// The first int64 of a header: "tdrs02", a description of this library (64-byte leaves).
pub const MAGIC: u64 = 0x7464_7273_3032;
/// The description length of a header whose sender refused its own tree (its error says why).
pub const REFUSED: i64 = -1;
/// The bytes of each piece a packed tree travels in (a function of nothing but the tree's
/// size, so that both sides agree).
pub const PIECE_BYTES: usize = 2 << 20;

/// `n` rounded up to [`ALIGN`], or `None` on overflow.
pub fn aligned(n: usize) -> Option<usize> {
    n.checked_add(ALIGN - 1).map(|m| m & !(ALIGN - 1))
}

// ---------------------------------------------------------------------------------------------
// Description

/// One entry of a node to describe, in the order it is written (sorted keys).
pub enum Described<'a> {
    Leaf {
        key: &'a str,
        dtype: &'a str,
        shape: &'a [u64],
        device: &'a str,
    },
    Node {
        key: &'a str,
        node: DescribedNode<'a>,
    },
    /// A non-tensor value, as JSON.
    Value {
        key: &'a str,
        data: Value,
    },
    /// A NonTensorStack: its meta.json (`format::stack::meta_bytes`), inlined.
    Stack {
        key: &'a str,
        meta: &'a [u8],
    },
}

/// A TensorDict to describe: batch size, device and entries.
pub struct DescribedNode<'a> {
    pub batch: Vec<u64>,
    pub device: Option<&'a str>,
    pub entries: Vec<Described<'a>>,
}

fn json_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("a str always serializes");
}

fn json_list(out: &mut Vec<u8>, items: &[u64]) {
    out.push(b'[');
    for (i, d) in items.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        write!(out, "{d}").expect("writing to a Vec never fails");
    }
    out.push(b']');
}

/// Writes the description of `node` (Python's `json.dumps` separators, UTF-8 as it is).
pub fn describe(node: &DescribedNode<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 96 * node.entries.len());
    write_node(&mut out, node);
    out
}

fn write_node(out: &mut Vec<u8>, node: &DescribedNode<'_>) {
    out.push(b'{');
    for entry in &node.entries {
        match entry {
            Described::Leaf {
                key,
                dtype,
                shape,
                device,
            } => {
                json_str(out, key);
                out.extend_from_slice(b": {\"device\": ");
                json_str(out, device);
                out.extend_from_slice(b", \"shape\": ");
                json_list(out, shape);
                out.extend_from_slice(b", \"dtype\": ");
                json_str(out, dtype);
                out.extend_from_slice(b", \"is_nested\": false}, ");
            }
            Described::Node { key, node } => {
                json_str(out, key);
                out.extend_from_slice(b": ");
                write_node(out, node);
                out.extend_from_slice(b", ");
            }
            Described::Value { key, data } => {
                json_str(out, key);
                out.extend_from_slice(b": {\"_type\": ");
                json_str(out, NTD_TYPE);
                out.extend_from_slice(b", \"data\": ");
                serde_json::to_writer(&mut *out, data).expect("a Value always serializes");
                out.extend_from_slice(b", \"_metadata\": null, \"_is_non_tensor\": true}, ");
            }
            Described::Stack { key, meta } => {
                json_str(out, key);
                out.extend_from_slice(b": ");
                out.extend_from_slice(meta);
                out.extend_from_slice(b", ");
            }
        }
    }
    out.extend_from_slice(b"\"shape\": ");
    json_list(out, &node.batch);
    out.extend_from_slice(b", \"device\": ");
    match node.device {
        Some(d) => json_str(out, d),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b", \"_type\": ");
    json_str(out, TD_TYPE);
    write!(
        out,
        ", \"_format_version\": {}, \"_class\": ",
        format::FORMAT_VERSION
    )
    .expect("writing to a Vec never fails");
    json_str(out, TD_CLASS);
    out.push(b'}');
}

/// A parsed description's leaf: dtype, shape, and where it lies in the packed buffer.
#[derive(Debug, PartialEq)]
pub struct ParsedLeaf {
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    pub offset: usize,
    pub nbytes: usize,
}

/// A parsed description's entry, in sorted-key order.
#[derive(Debug, PartialEq)]
pub enum Parsed<'a> {
    Leaf(Cow<'a, str>, ParsedLeaf),
    Node(Cow<'a, str>, ParsedNode<'a>),
    /// A non-tensor value, as JSON text.
    Value(Cow<'a, str>, String),
    /// A NonTensorStack (its values checked against the node's batch size).
    Stack(Cow<'a, str>, format::StackMeta),
}

/// A parsed TensorDict node.
#[derive(Debug, PartialEq)]
pub struct ParsedNode<'a> {
    pub batch: Vec<u64>,
    pub device: Option<String>,
    pub entries: Vec<Parsed<'a>>,
}

fn bad<S: AsRef<str>>(path: &[S], why: impl std::fmt::Display) -> String {
    let at = if path.is_empty() {
        "<root>".to_string()
    } else {
        path.iter().map(AsRef::as_ref).collect::<Vec<&str>>().join(".")
    };
    format!("received tree description, at {at:?}: {why}")
}

/// Parses and validates a description; returns the tree and the packed size of its leaves.
///
/// One pass of serde over the text classifies every object as it closes (a leaf, a node or a
/// non-tensor value: [`Raw`]), with keys and strings borrowed from the text and only the fields
/// of the meta.json format read as typed values; a second pass over that compact tree sorts the
/// keys, checks that batch sizes nest and gives every leaf its packed offset.
pub fn parse(text: &[u8]) -> Result<(ParsedNode<'_>, usize), String> {
    if text.len() > DESCRIPTION_LIMIT {
        return Err(bad::<&str>(
            &[],
            format!("{} bytes is over the limit", text.len()),
        ));
    }
    let state = State {
        path: RefCell::new(Vec::new()),
        error: RefCell::new(None),
    };
    let mut de = serde_json::Deserializer::from_slice(text);
    let field = EntrySeed { state: &state }
        .deserialize(&mut de)
        .and_then(|field| de.end().map(|()| field))
        .map_err(|e| match state.error.take() {
            Some(why) => why,
            None => bad(&state.path.borrow(), format!("not valid JSON: {e}")),
        })?;
    let Field::Entry(Raw::Node(root)) = field else {
        return Err(bad::<&str>(&[], "not a TensorDict entry"));
    };
    let mut path = Vec::new();
    let mut end = 0usize;
    let node = check_node(*root, &[], &mut path, &mut end)?;
    Ok((node, end))
}

/// One object of a description, classified when it closes.
enum Raw<'de> {
    Leaf(&'static format::DType, Vec<u64>),
    Node(Box<RawNode<'de>>),
    /// A non-tensor value, as JSON text.
    Value(String),
    Stack(format::StackMeta),
}

/// A TensorDict object before its entries are checked (`None`: an entry that is no object).
struct RawNode<'de> {
    tensordict: bool,
    batch: Option<Vec<i64>>,
    device: Option<Cow<'de, str>>,
    entries: Vec<(Cow<'de, str>, Option<Raw<'de>>)>,
}

/// Any JSON value of a description, as far as the parser needs to know it.
enum Field<'de> {
    Entry(Raw<'de>),
    Str(Cow<'de, str>),
    Bool(bool),
    Other,
}

/// The parse's path (for errors) and the first error found while classifying an object.
struct State<'de> {
    path: RefCell<Vec<Cow<'de, str>>>,
    error: RefCell<Option<String>>,
}

impl State<'_> {
    /// Records `why` at the current path and returns the error that stops serde.
    fn fail<E: de::Error>(&self, why: String) -> E {
        let at = bad(&self.path.borrow(), &why);
        self.error.borrow_mut().get_or_insert(at);
        E::custom(why)
    }
}

/// How serde_json (with `arbitrary_precision`) presents a number to `deserialize_any`: a key
/// no description may hold (its parser would take the object for a number).
pub const NUMBER_TOKEN: &str = "$serde_json::private::Number";

struct EntrySeed<'p, 'de> {
    state: &'p State<'de>,
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_, 'de> {
    type Value = Field<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Field<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> EntrySeed<'_, 'de> {
    /// The value under `key`, parsed with `key` on the path; returns the key back.
    fn child<A: MapAccess<'de>>(
        &self,
        map: &mut A,
        key: Cow<'de, str>,
    ) -> Result<(Cow<'de, str>, Field<'de>), A::Error> {
        self.state.path.borrow_mut().push(key);
        let field = map.next_value_seed(EntrySeed { state: self.state })?;
        let key = self.state.path.borrow_mut().pop().expect("pushed above");
        Ok((key, field))
    }

    /// Classifies a closed object from its fields.
    fn classify<E: de::Error>(&self, fields: Fields<'de>) -> Result<Field<'de>, E> {
        if let Some(name) = fields.dtype {
            let Some(dtype) = format::dtype(&name) else {
                return Err(self.state.fail(format!("unknown dtype {name:?}")));
            };
            if fields.is_nested == Some(true) {
                return Err(self.state.fail("nested tensors are not supported".into()));
            }
            let shape = dims(fields.shape, &self.state.path.borrow(), "shape")
                .map_err(|why| self.state.fail::<E>(why))?;
            return Ok(Field::Entry(Raw::Leaf(dtype, shape)));
        }
        if fields.type_.as_deref() == Some(NTD_TYPE) {
            let Some(data) = fields.data else {
                return Err(self.state.fail("non-tensor entry without data".into()));
            };
            return Ok(Field::Entry(Raw::Value(data.to_string())));
        }
        if fields.type_.as_deref() == Some(STACK_TYPE) {
            let mut map = serde_json::Map::new();
            if let Some(data) = fields.data {
                map.insert("data".into(), data);
            }
            if let Some(dim) = fields.stack_dim {
                map.insert("stack_dim".into(), dim);
            }
            if let Some(device) = fields.device {
                map.insert("device".into(), Value::String(device.into_owned()));
            }
            if let Some(shape) = fields.shape {
                map.insert("shape".into(), shape.into());
            }
            let at: Vec<String> = self.state.path.borrow().iter().map(|k| k.to_string()).collect();
            let meta = format::stack::from_map(map, std::path::Path::new(&at.join("/")))
                .map_err(|e| self.state.fail::<E>(e.to_string()))?;
            return Ok(Field::Entry(Raw::Stack(meta)));
        }
        Ok(Field::Entry(Raw::Node(Box::new(RawNode {
            tensordict: fields.type_.as_deref() == Some(TD_TYPE),
            batch: fields.shape,
            device: fields.device,
            entries: fields.entries,
        }))))
    }
}

/// The fields of one object as they are read.
#[derive(Default)]
struct Fields<'de> {
    shape: Option<Vec<i64>>,
    device: Option<Cow<'de, str>>,
    dtype: Option<Cow<'de, str>>,
    is_nested: Option<bool>,
    type_: Option<Cow<'de, str>>,
    data: Option<Value>,
    stack_dim: Option<Value>,
    entries: Vec<(Cow<'de, str>, Option<Raw<'de>>)>,
}

impl<'de> Visitor<'de> for EntrySeed<'_, 'de> {
    type Value = Field<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a meta.json entry")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Field<'de>, A::Error> {
        if self.state.path.borrow().len() > format::MAX_DEPTH {
            return Err(A::Error::custom(format!(
                "nested deeper than {}",
                format::MAX_DEPTH
            )));
        }
        let mut out = Fields::default();
        while let Some(key) = map.next_key_seed(Str)? {
            // The reserved keys of the format are never keys of the tree: typed values.
            match key.as_ref() {
                NUMBER_TOKEN => {
                    // a number, as serde_json's arbitrary_precision hands it to deserialize_any
                    map.next_value::<IgnoredAny>()?;
                    return Ok(Field::Other);
                }
                "shape" => out.shape = Some(map.next_value()?),
                "device" => out.device = map.next_value_seed(OptStr)?,
                "_type" => out.type_ = Some(map.next_value_seed(Str)?),
                "_format_version" | "_class" | "_names" => {
                    map.next_value::<IgnoredAny>()?;
                }
                // fields of a non-tensor entry (its `_type` comes first), keys of a node
                // otherwise: a tree may have leaves named so (meta.json saves them)
                "_metadata" | "_is_non_tensor" if out.type_.as_deref() == Some(NTD_TYPE) => {
                    map.next_value::<IgnoredAny>()?;
                }
                "data" if out.type_.as_deref() == Some(NTD_TYPE) => out.data = Some(map.next_value()?),
                "data" if out.type_.as_deref() == Some(STACK_TYPE) => out.data = Some(map.next_value()?),
                "stack_dim" if out.type_.as_deref() == Some(STACK_TYPE) => {
                    out.stack_dim = Some(map.next_value()?)
                }
                _ => match self.child(&mut map, key)? {
                    (key, Field::Str(d)) if key == "dtype" => out.dtype = Some(d),
                    (key, Field::Bool(b)) if key == "is_nested" => out.is_nested = Some(b),
                    (key, Field::Entry(entry)) => out.entries.push((key, Some(entry))),
                    (key, _) => out.entries.push((key, None)),
                },
            }
        }
        self.classify(out)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Field<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Field::Other)
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Field<'de>, E> {
        Ok(Field::Bool(b))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Field<'de>, E> {
        Ok(Field::Str(Cow::Owned(s.to_string())))
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Field<'de>, E> {
        Ok(Field::Str(Cow::Borrowed(s)))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Field<'de>, E> {
        Ok(Field::Str(Cow::Owned(s)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Field<'de>, E> {
        Ok(Field::Other)
    }
}

fn dims<S: AsRef<str>>(value: Option<Vec<i64>>, path: &[S], what: &str) -> Result<Vec<u64>, String> {
    let Some(items) = value else {
        return Err(bad(path, format!("{what} is missing or not a list")));
    };
    if items.iter().any(|&d| d < 0) {
        return Err(bad(
            path,
            format!("{what} {items:?} is not a list of non-negative ints"),
        ));
    }
    // the same allocation, reinterpreted: every item is non-negative
    Ok(items.into_iter().map(|d| d as u64).collect())
}

fn check_node<'a>(
    raw: RawNode<'a>,
    parent: &[u64],
    path: &mut Vec<Cow<'a, str>>,
    end: &mut usize,
) -> Result<ParsedNode<'a>, String> {
    if !raw.tensordict {
        return Err(bad(path, "not a TensorDict entry"));
    }
    let batch = dims(raw.batch, path, "batch size")?;
    if batch.len() < parent.len() || batch[..parent.len()] != *parent {
        return Err(bad(
            path,
            format!("batch size {batch:?} does not start with {parent:?}"),
        ));
    }
    let mut children = raw.entries;
    children.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    if children.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(bad(path, "a key appears twice"));
    }
    let mut entries = Vec::with_capacity(children.len());
    for (key, entry) in children {
        path.push(key);
        let parsed = match entry {
            None => return Err(bad(path, "entry is not an object")),
            Some(Raw::Leaf(dtype, shape)) => Checked::Leaf(check_leaf(dtype, shape, &batch, path, end)?),
            Some(Raw::Node(node)) => Checked::Node(check_node(*node, &batch, path, end)?),
            Some(Raw::Value(text)) => Checked::Value(text),
            Some(Raw::Stack(meta)) => {
                if !meta.data.shape.starts_with(&batch) {
                    return Err(bad(
                        path,
                        format!(
                            "the stack's values have shape {:?}, which does not start with the batch size {batch:?}",
                            meta.data.shape
                        ),
                    ));
                }
                Checked::Stack(meta)
            }
        };
        let key = path.pop().expect("pushed above");
        entries.push(match parsed {
            Checked::Leaf(l) => Parsed::Leaf(key, l),
            Checked::Node(n) => Parsed::Node(key, n),
            Checked::Value(v) => Parsed::Value(key, v),
            Checked::Stack(s) => Parsed::Stack(key, s),
        });
    }
    Ok(ParsedNode {
        batch,
        device: raw.device.map(Cow::into_owned),
        entries,
    })
}

enum Checked<'a> {
    Leaf(ParsedLeaf),
    Node(ParsedNode<'a>),
    Value(String),
    Stack(format::StackMeta),
}

fn check_leaf(
    dtype: &'static format::DType,
    shape: Vec<u64>,
    batch: &[u64],
    path: &[Cow<'_, str>],
    end: &mut usize,
) -> Result<ParsedLeaf, String> {
    if shape.len() < batch.len() || shape[..batch.len()] != *batch {
        return Err(bad(
            path,
            format!("shape {shape:?} does not start with the batch size {batch:?}"),
        ));
    }
    let overflow = || bad(path, format!("shape {shape:?} overflows"));
    let nbytes = format::nbytes(&shape, dtype.itemsize).ok_or_else(overflow)?;
    let offset = aligned(*end).ok_or_else(overflow)?;
    *end = offset.checked_add(nbytes).ok_or_else(overflow)?;
    Ok(ParsedLeaf {
        dtype: dtype.name,
        shape,
        offset,
        nbytes,
    })
}

// ---------------------------------------------------------------------------------------------
// Copies

/// How a tree's leaves map onto one packed buffer of `total` bytes, checked once.
#[derive(Debug)]
pub struct PackedLayout {
    /// `(leaf address, packed offset, nbytes)`, sorted by offset, none empty.
    leaves: Vec<(usize, usize, usize)>,
    /// The leaves' memory, merged into disjoint sorted spans.
    spans: Vec<Range>,
    /// Whether two leaves share bytes (the same tensor twice): scatters then run in order.
    shared: bool,
    pub total: usize,
}

impl PackedLayout {
    /// Checks a table of `(leaf address, packed offset, nbytes)`: every leaf within `total`,
    /// the packed ranges disjoint.
    pub fn new(table: &[u64], total: usize) -> Result<Self, String> {
        if table.len() % 3 != 0 {
            return Err("the copy table holds (address, offset, nbytes) triples".into());
        }
        let mut leaves = Vec::with_capacity(table.len() / 3);
        for t in table.chunks_exact(3) {
            let (addr, off, n) = (t[0] as usize, t[1] as usize, t[2] as usize);
            if off.checked_add(n).is_none_or(|e| e > total) || addr.checked_add(n).is_none() {
                return Err(format!(
                    "a leaf of {n} bytes at offset {off} does not fit the {total}-byte buffer"
                ));
            }
            if n > 0 {
                leaves.push((addr, off, n));
            }
        }
        leaves.sort_unstable_by_key(|l| l.1);
        if leaves.windows(2).any(|w| w[0].1 + w[0].2 > w[1].1) {
            return Err("two leaves overlap in the packed buffer".into());
        }
        let ranges: Vec<Range> = leaves.iter().map(|l| (l.0, l.2)).collect();
        let shared = gather::check(&ranges, &[]) == Overlap::Destinations;
        let mut sorted = ranges;
        sorted.sort_unstable();
        let mut spans: Vec<Range> = Vec::with_capacity(sorted.len());
        for r in sorted {
            match spans.last_mut() {
                Some(last) if last.0 + last.1 >= r.0 => last.1 = (last.0 + last.1).max(r.0 + r.1) - last.0,
                _ => spans.push(r),
            }
        }
        Ok(PackedLayout {
            leaves,
            spans,
            shared,
            total,
        })
    }

    /// Whether `[start, start + len)` shares a byte with some leaf.
    pub fn touches_leaves(&self, start: usize, len: usize) -> bool {
        if len == 0 {
            return false;
        }
        let i = self.spans.partition_point(|s| s.0 + s.1 <= start);
        i < self.spans.len() && self.spans[i].0 < start.saturating_add(len)
    }

    /// Whether a scatter must run in table order on one thread.
    pub fn leaves_shared(&self) -> bool {
        self.shared
    }

    /// The copies between the leaves and bytes `[start, end)` of the packed buffer at `base`:
    /// leaves into the buffer with `pack`, else the buffer into the leaves.
    ///
    /// Packing also zeroes the bytes of `[start, end)` between the leaves (their alignment
    /// padding): a buffer made with `torch.empty` would otherwise send whatever this process
    /// last kept there to the peer.
    pub fn copies(&self, base: usize, start: usize, end: usize, pack: bool) -> Vec<Copy> {
        let first = self.leaves.partition_point(|l| l.1 + l.2 <= start);
        let mut out = Vec::new();
        let mut cursor = start; // packing: the first byte not yet written
        for &(addr, off, n) in &self.leaves[first..] {
            if off >= end {
                break;
            }
            let lo = off.max(start);
            let hi = (off + n).min(end);
            if pack && lo > cursor {
                zero_fill(&mut out, base, cursor, lo);
            }
            cursor = cursor.max(hi);
            let (leaf, at) = (addr + (lo - off), base + lo);
            out.push(if pack {
                Copy {
                    src: leaf,
                    dst: at,
                    len: hi - lo,
                }
            } else {
                Copy {
                    src: at,
                    dst: leaf,
                    len: hi - lo,
                }
            });
        }
        if pack && end > cursor {
            zero_fill(&mut out, base, cursor, end);
        }
        out
    }
}

/// The source of the zeroes `copies` writes between packed leaves.
static ZEROS: [u8; 4096] = [0; 4096];

/// Copies of zeroes into bytes `[from, to)` of the buffer at `base`.
fn zero_fill(out: &mut Vec<Copy>, base: usize, from: usize, to: usize) {
    let mut at = from;
    while at < to {
        let len = (to - at).min(ZEROS.len());
        out.push(Copy {
            src: ZEROS.as_ptr() as usize,
            dst: base + at,
            len,
        });
        at += len;
    }
}

#[cfg(test)]
mod tests;
