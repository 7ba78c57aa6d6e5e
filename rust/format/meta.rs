//! The format's constants, its dtype table, and the validated form of a meta.json that both
//! parsers produce. It matches what tensordict 0.15 writes (see the reference document §1), so
//! that directories move both ways.

use serde_json::{Map, Value};

/// Name of the metadata file of every directory.
pub const META_FILE: &str = "meta.json";
/// Suffix of a leaf's data file.
pub const LEAF_SUFFIX: &str = ".memmap";
/// Suffix of a nested leaf's table of component shapes (`key.shape.memmap`, int64 `[n, k]`).
pub const SHAPE_SUFFIX: &str = ".shape.memmap";
/// `layout` of a jagged nested leaf's entry (a key the reference's loader does not read: it
/// loads the leaf as a strided nested tensor of the same components).
pub const JAGGED: &str = "torch.jagged";
/// `layout` of a strided tensor, accepted on any entry.
pub const STRIDED: &str = "torch.strided";
/// Largest meta.json we read: far above any real tree, small enough to refuse garbage.
pub const META_LIMIT: u64 = 64 << 20;
/// Largest meta.json of a value directory (a NonTensorData's or a NonTensorStack's) we read
/// or write: the values live in it (a million short strings is ~16 MB). Such a file is known
/// by its first bytes (`is_value_header`) before it is read past `META_LIMIT`.
pub const VALUE_META_LIMIT: u64 = 1 << 30;
/// Deepest nesting we follow when loading.
pub const MAX_DEPTH: usize = 256;
/// Highest `_format_version` this library reads.
pub const FORMAT_VERSION: u64 = 1;
/// The sub-directory of a tensorclass directory that holds its TensorDict.
pub const TENSORCLASS_DIR: &str = "_tensordict";

/// Keys that meta.json uses for itself: a leaf with one of these names would be lost.
pub const RESERVED_KEYS: &[&str] = &["shape", "device", "_type", "_format_version", "_class", "_names"];

/// `_type` of a TensorDict directory, as tensordict writes it.
pub(crate) const TD_TYPE: &str = "<class 'tensordict._td.TensorDict'>";
/// `_class` of a TensorDict directory (format version 1).
pub(crate) const TD_CLASS: &str = "tensordict:TensorDict";
/// `_type` of a NonTensorData directory.
pub(crate) const NTD_TYPE: &str = "<class 'tensordict.tensorclass.NonTensorData'>";

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

/// The layout of a nested leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Strided,
    Jagged,
}

/// What a nested leaf's entry says: `components` tensors of `dims` dims each (the entry's
/// `shape` is `[components, dims]`, the shape of its table of component shapes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NestedMeta {
    pub components: u64,
    pub dims: u64,
    pub layout: Layout,
}

impl NestedMeta {
    /// Bytes of the table of component shapes (`key.shape.memmap`), or `None` on overflow.
    pub fn table_bytes(&self) -> Option<usize> {
        nbytes(&[self.components, self.dims], 8)
    }
}

/// A validated leaf entry. For a nested leaf, `shape` is the shape of its table of component
/// shapes and `nbytes` 0: the data's size comes from the table (`nested_nbytes`).
#[derive(Debug)]
pub struct LeafMeta {
    pub dtype: &'static DType,
    pub shape: Vec<u64>,
    pub nbytes: usize,
    pub nested: Option<NestedMeta>,
}

/// Bytes of a nested leaf's data: its component shapes (`dims` per component, row-major in
/// `table`) checked (no negative size) and summed with checked arithmetic. `Err` says why.
pub fn nested_nbytes(
    table: &[i64],
    dims: usize,
    itemsize: usize,
    batch_tail: &[u64],
) -> std::result::Result<usize, String> {
    let mut total: usize = 0;
    let rows = if dims == 0 {
        Vec::new()
    } else {
        table.chunks_exact(dims).collect::<Vec<_>>()
    };
    for (i, row) in rows.iter().enumerate() {
        let mut n: usize = 1;
        for &d in row.iter() {
            let d = usize::try_from(d).map_err(|_| format!("component {i} has a negative size {d}"))?;
            n = n
                .checked_mul(d)
                .ok_or_else(|| format!("component {i}'s size overflows"))?;
        }
        if row.len() < batch_tail.len()
            || row
                .iter()
                .zip(batch_tail)
                .any(|(&d, &b)| u64::try_from(d).ok() != Some(b))
        {
            return Err(format!(
                "component {i} has shape {row:?}, which does not start with the batch dims {batch_tail:?}"
            ));
        }
        total = total.checked_add(n).ok_or("the components' sizes overflow")?;
    }
    total
        .checked_mul(itemsize)
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| "the components' sizes overflow".to_string())
}

/// A validated entry of a TensorDict meta.json.
#[derive(Debug)]
pub enum Entry {
    Leaf(LeafMeta),
    /// A sub-directory; what it holds is decided by its own meta.json.
    Collection,
    /// The sub-directory of a NonTensorStack (`{"type": "NonTensorStack"}`): its meta.json
    /// holds the values, and may be larger than others (`VALUE_META_LIMIT`).
    Stack,
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
    Stack(super::stack::StackMeta),
    /// A tensorclass directory (tensordict's layout: this meta.json names the class, the
    /// fields are a TensorDict in `_tensordict/`). The whole meta.json object, for the Python
    /// layer, which finds the class it names.
    TensorClass(Map<String, Value>),
}

/// The token of a meta.json's bytes: its length and CRC-32 (`len << 32 | crc`; a value
/// directory's meta.json is at most `VALUE_META_LIMIT`, 1 GiB, so the length fits). Not a file
/// identity: what tells a writer of a value directory that the meta.json there is still the
/// one its tree read or last wrote (the same bytes written again have the same token).
pub fn meta_token(bytes: &[u8]) -> u64 {
    ((bytes.len() as u64) << 32) | u64::from(crc32fast::hash(bytes))
}

/// How many first bytes of a meta.json `is_value_header` needs at most.
pub const VALUE_HEADER_LEN: usize = 256;

/// True when `head`, the first bytes of a meta.json, starts a value directory's: a JSON object
/// whose first key `_type` names NonTensorData or NonTensorStack, as this library and
/// tensordict write them (with or without spaces). How a meta.json larger than `META_LIMIT`
/// is known to be one that may be read up to `VALUE_META_LIMIT`, before it is read.
pub fn is_value_header(head: &[u8]) -> bool {
    fn token<'a>(s: &'a [u8], want: &[u8]) -> Option<&'a [u8]> {
        let start = s.iter().take_while(|b| b.is_ascii_whitespace()).count();
        s[start..].strip_prefix(want)
    }
    let Some(rest) = token(head, b"{")
        .and_then(|r| token(r, b"\"_type\""))
        .and_then(|r| token(r, b":"))
        .and_then(|r| token(r, b"\""))
    else {
        return false;
    };
    [NTD_TYPE, super::stack::STACK_TYPE].iter().any(|t| {
        rest.strip_prefix(t.as_bytes())
            .is_some_and(|r| r.starts_with(b"\""))
    })
}

/// True when a meta.json's `_type` names a user class (`<class 'module.Name'>` outside the
/// tensordict package): a tensorclass directory.
pub(crate) fn is_user_class(type_: &str) -> bool {
    type_.starts_with("<class '") && type_.ends_with("'>") && !type_.starts_with("<class 'tensordict.")
}

/// `type` or `type:index`, with a device type torch knows.
pub fn valid_device(s: &str) -> bool {
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

#[cfg(test)]
mod tests;
