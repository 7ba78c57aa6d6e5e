//! The format's constants, its dtype table, and the validated form of a meta.json that both
//! parsers produce. It matches what tensordict 0.15 writes (see the reference document §1), so
//! that directories move both ways.

use serde_json::{Map, Value};

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
    /// A tensorclass directory (tensordict's layout: this meta.json names the class, the
    /// fields are a TensorDict in `_tensordict/`). The whole meta.json object, for the Python
    /// layer, which finds the class it names.
    TensorClass(Map<String, Value>),
}

/// True when a meta.json's `_type` names a user class (`<class 'module.Name'>` outside the
/// tensordict package): a tensorclass directory.
pub(crate) fn is_user_class(type_: &str) -> bool {
    type_.starts_with("<class '") && type_.ends_with("'>") && !type_.starts_with("<class 'tensordict.")
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

#[cfg(test)]
mod tests;
