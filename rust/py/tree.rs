//! Saved directories (`_tree.py`, `_persistence.py`, `verify.py`): a whole tree written or
//! loaded in one call, the GIL released; the tree crosses as nested tuples whose entries start
//! with a tag (`LEAF`, `NODE`, `NON_TENSOR`).

use std::path::PathBuf;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use serde_json::Value;

use super::buffer::Buffer;
use super::source_slice;
use crate::format;
use crate::format::stack::{self as stack_format, Cells};
use crate::format::Layout;
use crate::sys::storage::Region;
use crate::tree::load::{self, LoadedEntry, LoadedNode};
use crate::tree::save::{self, ClassSpec, EntrySpec, LeafSpec, NestedSpec, NodeSpec, SaveOptions};

/// The tag of a tensor entry in the tuples of a tree (saved, loaded, summarized, described).
pub const LEAF: u8 = 0;
/// The tag of a nested TensorDict entry.
pub const NODE: u8 = 1;
/// The tag of a non-tensor (JSON) entry.
pub const NON_TENSOR: u8 = 2;
/// The tag of a NonTensorStack entry (a value per element).
pub const STACK: u8 = 3;

fn parse_json(text: &str, key: &str) -> PyResult<Value> {
    serde_json::from_str(text).map_err(|e| PyValueError::new_err(format!("key {key:?}: not valid JSON: {e}")))
}

/// A tensor entry of a save spec: tag, key, dtype, shape, device, data_ptr, nbytes, same_file.
type LeafTuple = (
    u8,
    String,
    String,
    Vec<u64>,
    String,
    usize,
    usize,
    Option<(u64, u64)>,
);

pub(super) fn node_spec<'a>(node: &Bound<'_, PyAny>, leaves: &mut Vec<LeafSpec<'a>>) -> PyResult<NodeSpec> {
    let node = node.cast::<PyTuple>()?;
    // (batch, entries) or, for a tensorclass, (batch, entries, class name, meta.json text)
    let (batch, entries, class) = if node.len() == 4 {
        let (batch, entries, name, meta): (Vec<u64>, Bound<'_, PyList>, String, String) = node.extract()?;
        let meta = meta.into_bytes();
        (batch, entries, Some(ClassSpec { name, meta }))
    } else {
        let (batch, entries): (Vec<u64>, Bound<'_, PyList>) = node.extract()?;
        (batch, entries, None)
    };
    let mut out = Vec::with_capacity(entries.len());
    for item in entries.iter() {
        let item = item.cast_into::<PyTuple>()?;
        let tag: u8 = item.get_item(0)?.extract()?;
        if tag == LEAF {
            // the whole tuple at once (the key is not extracted twice); a nested leaf adds
            // `(table, jagged)`: its component shapes (int64 bytes) and layout
            let nested = if item.len() > 8 {
                let extra = item.get_item(8)?;
                if extra.is_none() {
                    None
                } else {
                    let (table, jagged): (Vec<u8>, bool) = extra.extract()?;
                    Some(NestedSpec { table, jagged })
                }
            } else {
                None
            };
            let head = if item.len() > 8 {
                item.get_slice(0, 8)
            } else {
                item
            };
            let (_, key, dtype, shape, device, ptr, nbytes, same_file): LeafTuple = head.extract()?;
            // SAFETY: the Python layer keeps every source tensor and its storage alive
            // during write_tree.
            let data = unsafe { source_slice(ptr, nbytes) };
            leaves.push(LeafSpec {
                dtype,
                shape,
                device,
                data,
                nbytes,
                same_file,
                nested,
            });
            out.push((key, EntrySpec::Leaf(leaves.len() - 1)));
            continue;
        }
        let key: String = item.get_item(1)?.extract()?;
        let entry = match tag {
            NODE => EntrySpec::Node(node_spec(&item.get_item(2)?, leaves)?),
            NON_TENSOR => EntrySpec::NonTensor(parse_json(&item.get_item(2)?.extract::<String>()?, &key)?),
            STACK => {
                // (3, key, stack_dim, device, data_json, shape_or_None)
                let stack_dim: i64 = item.get_item(2)?.extract()?;
                let device: Option<String> = item.get_item(3)?.extract()?;
                let data: Vec<u8> = item.get_item(4)?.extract()?;
                let shape: Option<Vec<u64>> = item.get_item(5)?.extract()?;
                EntrySpec::Stack(stack_format::meta_bytes(
                    stack_dim,
                    device.as_deref(),
                    &data,
                    shape.as_deref(),
                ))
            }
            other => return Err(PyTypeError::new_err(format!("unknown entry tag {other}"))),
        };
        out.push((key, entry));
    }
    Ok(NodeSpec {
        batch,
        entries: out,
        class,
    })
}

pub(super) fn buffers(regions: Vec<Option<Region>>) -> Vec<Option<Buffer>> {
    regions.into_iter().map(|r| r.map(Buffer::new)).collect()
}

/// Saves a whole tree under `prefix` atomically, in one call, with the GIL released.
///
/// `tree` is `(batch_size, entries)`, or `(batch_size, entries, class_name, meta_json)` for a
/// tensorclass (saved in tensordict's layout: `meta_json` as the directory's meta.json, the
/// entries in its `_tensordict/`, `class_name` as the parent's `{"type": ...}`); each entry is `(0, key, dtype, shape, device, data_ptr,
/// nbytes, same_file)` for a tensor (data_ptr 0: memmap_like, an existing file kept as it
/// is, a new one zero-filled; same_file: the (device, inode) the source maps, kept when it
/// is the file at the leaf's name), `(1, key, subtree)` for a nested TensorDict, or
/// `(2, key, json_text)` for a non-tensor value. `sparse` makes new zero-filled files sparse.
/// Returns one Buffer per tensor leaf in depth-first order (None for empty tensors).
#[pyfunction]
#[pyo3(signature = (prefix, tree, *, existsok = true, durable = false, num_threads = 0, sparse = false))]
pub fn write_tree(
    py: Python<'_>,
    prefix: PathBuf,
    tree: &Bound<'_, PyAny>,
    existsok: bool,
    durable: bool,
    num_threads: usize,
    sparse: bool,
) -> PyResult<Vec<Option<Buffer>>> {
    let mut leaves = Vec::new();
    let root = node_spec(tree, &mut leaves)?;
    let opts = SaveOptions {
        existsok,
        durable,
        num_threads,
        sparse,
    };
    let regions = py.detach(|| save::write_tree(&prefix, &root, &leaves, opts))?;
    Ok(buffers(regions))
}

pub(super) fn node_to_py<'py>(py: Python<'py>, node: LoadedNode) -> PyResult<Bound<'py, PyTuple>> {
    node_to_py_with(py, node, false)
}

/// `node_to_py`; with `tokens`, every value entry (NonTensorStack, NonTensorData) ends with
/// the token of its meta.json (an int, or None where there is none), which a write in place
/// passes back as `expected` (`rewrite_stack`, `rewrite_non_tensor`).
fn node_to_py_with<'py>(py: Python<'py>, node: LoadedNode, tokens: bool) -> PyResult<Bound<'py, PyTuple>> {
    let entries = PyList::empty(py);
    for (key, entry) in node.entries {
        let item = match entry {
            LoadedEntry::Leaf {
                dtype,
                shape,
                index,
                nested: None,
            } => (LEAF, key, dtype, PyTuple::new(py, shape)?, index).into_pyobject(py)?,
            LoadedEntry::Leaf {
                dtype,
                shape,
                index,
                nested: Some(nested),
            } => {
                let table: Vec<u8> = nested.sizes.iter().flat_map(|d| d.to_le_bytes()).collect();
                let extra = (
                    PyBytes::new(py, &table),
                    nested.dims,
                    nested.layout == Layout::Jagged,
                );
                (LEAF, key, dtype, PyTuple::new(py, shape)?, index, extra).into_pyobject(py)?
            }
            LoadedEntry::Stack(stack, token) => {
                let cells = cells_to_py(py, &stack.data.cells)?;
                let shape = PyTuple::new(py, &stack.data.shape)?;
                if tokens {
                    (STACK, key, shape, stack.device, stack.stack_dim, cells, token).into_pyobject(py)?
                } else {
                    (STACK, key, shape, stack.device, stack.stack_dim, cells).into_pyobject(py)?
                }
            }
            LoadedEntry::Node(child) => (NODE, key, node_to_py_with(py, child, tokens)?).into_pyobject(py)?,
            LoadedEntry::NonTensor(value, token) if tokens => {
                (NON_TENSOR, key, value.to_string(), token).into_pyobject(py)?
            }
            LoadedEntry::NonTensor(value, _) => (NON_TENSOR, key, value.to_string()).into_pyobject(py)?,
        };
        entries.append(item)?;
    }
    (node.batch, node.device, entries, node.class).into_pyobject(py)
}

/// A stack's cells for Python: `(values_bytes, offsets_bytes)` (int64) for strings, else the
/// JSON text of the list of cells.
pub(crate) fn cells_to_py<'py>(py: Python<'py>, cells: &Cells) -> PyResult<Bound<'py, PyAny>> {
    match cells {
        Cells::Strings { bytes, offsets } => {
            let offsets: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
            Ok((PyBytes::new(py, bytes), PyBytes::new(py, &offsets))
                .into_pyobject(py)?
                .into_any())
        }
        Cells::Json(values) => {
            let text = serde_json::to_string(values).map_err(|e| PyValueError::new_err(e.to_string()))?;
            Ok(text.into_pyobject(py)?.into_any())
        }
    }
}

/// Loads and validates the tree at `prefix` in one call, mapping every leaf with the GIL
/// released. Returns `(tree, buffers)`: tree is `(batch_size, device, entries, class_meta)`
/// (`class_meta`: the meta.json text of a tensorclass directory, else None) with entries
/// `(0, key, dtype, shape, leaf_index)`, `(1, key, subtree)` or `(2, key, json_text)`.
/// With `tokens`, value entries end with the token of their meta.json (see `node_to_py_with`):
/// `(2, key, json_text, token)`, `(3, key, shape, device, stack_dim, cells, token)`.
#[pyfunction]
#[pyo3(signature = (prefix, *, tokens = false))]
pub fn load_tree<'py>(
    py: Python<'py>,
    prefix: PathBuf,
    tokens: bool,
) -> PyResult<(Bound<'py, PyTuple>, Vec<Option<Buffer>>)> {
    let (node, regions) = py.detach(|| load::load_tree(&prefix))?;
    Ok((node_to_py_with(py, node, tokens)?, buffers(regions)))
}

/// Checks the tree at `prefix` without mapping data; returns the problems found (empty: OK).
#[pyfunction]
pub fn verify_tree(py: Python<'_>, prefix: PathBuf) -> Vec<String> {
    py.detach(|| load::verify_tree(&prefix))
}

/// Flushes every buffer's dirty pages to its file (msync), with the GIL released.
#[pyfunction]
pub fn flush_buffers(py: Python<'_>, buffers: Vec<Bound<'_, Buffer>>) -> PyResult<()> {
    let regions: Vec<_> = buffers
        .iter()
        .map(|b| std::sync::Arc::clone(b.get().region()))
        .collect();
    py.detach(|| regions.iter().try_for_each(|r| r.flush()))?;
    Ok(())
}

/// Waits until the space of every file that saves of this process replaced or dropped is
/// freed (that happens in the background, after the save returned); returns the bytes that
/// were still pending.
#[pyfunction]
pub fn wait_freed(py: Python<'_>) -> u64 {
    py.detach(|| {
        let pending = crate::sys::reclaim::pending();
        crate::sys::reclaim::wait();
        pending
    })
}

/// The file-name component a key is stored under (tensordict's robust key encoding).
#[pyfunction]
pub fn encode_key(key: &str) -> String {
    format::encode_key(key)
}
