//! A tree as one message (`_packed.py`, `_stream.py`): the checked copy plan of its packed
//! layout, its JSON description, the receiving tree built from one, the arena it lands in. The
//! copies run by `sys::gather` with the GIL released; addresses arrive as ints (see the SAFETY
//! contract of each function).

use std::sync::Arc;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use serde_json::Value;

use super::buffer::Buffer;
use super::errors::InvalidTreeError;
use super::gather::refuse_overlap;
use super::tree::{LEAF, NODE, STACK};
use crate::packed::{self, Described, DescribedNode, PackedLayout, Parsed, ParsedNode};
use crate::sys::anon;
use crate::sys::gather::{self, Copy, Overlap};
use crate::sys::pool;
use crate::sys::storage;

/// Distinct shapes whose tuple [`TreeBuilder`] reuses.
const SHAPE_CACHE: usize = 16;

fn table_copies(
    py: Python<'_>,
    table: &Bound<'_, PyAny>,
    buffer: (usize, usize),
    pack: bool,
) -> PyResult<Vec<Copy>> {
    let table: PyBuffer<u64> = PyBuffer::get(table)?;
    let flat = table.to_vec(py)?;
    if flat.len() % 3 != 0 {
        return Err(PyValueError::new_err(
            "the copy table holds (address, offset, nbytes) triples",
        ));
    }
    let (base, len) = buffer;
    flat.chunks_exact(3)
        .map(|t| {
            let (leaf, off, n) = (t[0] as usize, t[1] as usize, t[2] as usize);
            if off.checked_add(n).is_none_or(|e| e > len) {
                return Err(PyValueError::new_err(format!(
                    "a leaf of {n} bytes at offset {off} does not fit the {len}-byte buffer"
                )));
            }
            let at = base + off;
            Ok(if pack {
                Copy {
                    src: leaf,
                    dst: at,
                    len: n,
                }
            } else {
                Copy {
                    src: at,
                    dst: leaf,
                    len: n,
                }
            })
        })
        .collect()
}

/// Copies many leaves into one buffer (`pack=True`) or one buffer into many leaves
/// (`pack=False`), with the GIL released and in parallel.
///
/// `table` is a buffer of uint64 triples `(leaf_address, offset, nbytes)` (an
/// `array.array("Q")`); `buffer_address`/`buffer_len` is the one buffer. Raises ValueError
/// when an offset runs past the buffer or a destination overlaps a source. Destinations that
/// overlap each other (one tensor twice in a tree) are written in table order on one thread.
///
/// SAFETY contract: every address is the `data_ptr()` of a contiguous CPU tensor (or a
/// Buffer's address) spanning at least those bytes, kept referenced until the call returns.
#[pyfunction]
pub fn copy_packed(
    py: Python<'_>,
    table: &Bound<'_, PyAny>,
    buffer_address: usize,
    buffer_len: usize,
    pack: bool,
) -> PyResult<()> {
    let copies = table_copies(py, table, (buffer_address, buffer_len), pack)?;
    pool::init();
    py.detach(|| {
        let dsts: Vec<_> = copies.iter().map(|c| (c.dst, c.len)).collect();
        let srcs: Vec<_> = copies.iter().map(|c| (c.src, c.len)).collect();
        let overlap = gather::check(&dsts, &srcs);
        if overlap == Overlap::SourceAndDestination {
            return Err(refuse_overlap("copy_packed"));
        }
        // SAFETY: offsets were checked against the buffer, the leaf ranges are alive by the
        // contract above, and `check` found no destination overlapping a source.
        unsafe { gather::run(&copies, overlap == Overlap::None) };
        Ok(())
    })
}

/// The copy plan of one tree's packed layout (`packed.rs`), checked once when made: leaves
/// into one buffer (`pack`) or one buffer into the leaves (`unpack`), whole or a byte range
/// of it, with the GIL released and in parallel.
///
/// `table` is a uint64 buffer of `(leaf_address, offset, nbytes)` triples (an
/// `array.array("Q")`) for a packed buffer of `total` bytes.
///
/// SAFETY contract: every leaf address is the `data_ptr()` of a contiguous CPU tensor (or a
/// Buffer's address) spanning at least those bytes, kept referenced while this object is
/// used; every buffer passed to `pack`/`unpack` is a live allocation of at least `total`
/// bytes (checked against `buffer_len`).
#[pyclass(frozen, module = "tensordict_rs._native")]
pub struct PackedTable {
    layout: PackedLayout,
}

impl PackedTable {
    fn copy(
        &self,
        py: Python<'_>,
        buffer: (usize, usize),
        range: (usize, Option<usize>),
        pack: bool,
        more: bool,
    ) -> PyResult<()> {
        let (address, len) = buffer;
        let total = self.layout.total;
        if len < total || address == 0 && total > 0 {
            return Err(PyValueError::new_err(format!(
                "a {len}-byte buffer cannot hold a packed tree of {total} bytes"
            )));
        }
        let end = range.1.unwrap_or(total);
        if range.0 > end || end > total {
            return Err(PyValueError::new_err(format!(
                "bytes {}..{end} are not in a packed tree of {total} bytes",
                range.0
            )));
        }
        if self.layout.touches_leaves(address + range.0, end - range.0) {
            return Err(refuse_overlap(if pack { "pack" } else { "unpack" }));
        }
        let parallel = pack || !self.layout.leaves_shared();
        pool::init();
        py.detach(|| {
            let copies = self.layout.copies(address, range.0, end, pack);
            // SAFETY: the buffer holds `total` bytes (checked above) and does not overlap a
            // leaf; the leaves are alive by the contract above. Packed ranges are disjoint
            // (checked in PackedLayout::new), so pack destinations never overlap; leaves that
            // share bytes are scattered in order on one thread.
            unsafe {
                if more {
                    gather::run(&copies, parallel)
                } else {
                    gather::run_quiet(&copies, parallel)
                }
            };
        });
        Ok(())
    }
}

#[pymethods]
impl PackedTable {
    #[new]
    fn new(py: Python<'_>, table: &Bound<'_, PyAny>, total: usize) -> PyResult<Self> {
        let table: PyBuffer<u64> = PyBuffer::get(table)?;
        let flat = table.to_vec(py)?;
        let layout = py
            .detach(|| PackedLayout::new(&flat, total))
            .map_err(PyValueError::new_err)?;
        Ok(PackedTable { layout })
    }

    /// Copies the leaves into bytes `start..end` (default: all) of the buffer at `address`.
    /// `more`: another copy of this tree follows at once (the copy threads wait for it
    /// awake; otherwise they sleep as soon as this one is done).
    #[pyo3(signature = (address, nbytes, start = 0, end = None, more = false))]
    fn pack(
        &self,
        py: Python<'_>,
        address: usize,
        nbytes: usize,
        start: usize,
        end: Option<usize>,
        more: bool,
    ) -> PyResult<()> {
        self.copy(py, (address, nbytes), (start, end), true, more)
    }

    /// Copies bytes `start..end` (default: all) of the buffer at `address` into the leaves.
    #[pyo3(signature = (address, nbytes, start = 0, end = None))]
    fn unpack(
        &self,
        py: Python<'_>,
        address: usize,
        nbytes: usize,
        start: usize,
        end: Option<usize>,
    ) -> PyResult<()> {
        self.copy(py, (address, nbytes), (start, end), false, false)
    }

    /// Bytes of the packed tree.
    #[getter]
    fn total(&self) -> usize {
        self.layout.total
    }
}

/// An owned [`DescribedNode`] extracted from Python: `(batch, device, entries)` with entries
/// `(0, key, dtype, shape, device)`, `(1, key, node)` or `(2, key, json_text)`.
struct DescribedNodeOwned {
    batch: Vec<u64>,
    device: Option<String>,
    entries: Vec<EntryOwned>,
}

enum EntryOwned {
    Leaf(String, String, Vec<u64>, String),
    Node(String, DescribedNodeOwned),
    Value(String, Value),
    Stack(String, Vec<u8>),
}

impl DescribedNodeOwned {
    fn extract(node: &Bound<'_, PyTuple>) -> PyResult<Self> {
        let batch: Vec<u64> = node.get_item(0)?.extract()?;
        let device: Option<String> = node.get_item(1)?.extract()?;
        let list = node.get_item(2)?.cast_into::<PyList>()?;
        let mut entries = Vec::with_capacity(list.len());
        for entry in list.iter() {
            let entry = entry.cast_into::<PyTuple>()?;
            let tag: u8 = entry.get_item(0)?.extract()?;
            let key: String = entry.get_item(1)?.extract()?;
            entries.push(match tag {
                LEAF => EntryOwned::Leaf(
                    key,
                    entry.get_item(2)?.extract()?,
                    entry.get_item(3)?.extract()?,
                    entry.get_item(4)?.extract()?,
                ),
                NODE => EntryOwned::Node(key, Self::extract(&entry.get_item(2)?.cast_into()?)?),
                STACK => {
                    // (3, key, stack_dim, device, data_json, shape_or_None), as write_tree takes it
                    let stack_dim: i64 = entry.get_item(2)?.extract()?;
                    let device: Option<String> = entry.get_item(3)?.extract()?;
                    let data: Vec<u8> = entry.get_item(4)?.extract()?;
                    let shape: Option<Vec<u64>> = entry.get_item(5)?.extract()?;
                    let meta = crate::format::stack::meta_bytes(
                        stack_dim,
                        device.as_deref(),
                        &data,
                        shape.as_deref(),
                    );
                    EntryOwned::Stack(key, meta)
                }
                _ => {
                    let text: String = entry.get_item(2)?.extract()?;
                    let data = serde_json::from_str(&text)
                        .map_err(|e| PyValueError::new_err(format!("key {key:?}: not JSON ({e})")))?;
                    EntryOwned::Value(key, data)
                }
            });
        }
        Ok(DescribedNodeOwned {
            batch,
            device,
            entries,
        })
    }

    fn view(&self) -> DescribedNode<'_> {
        DescribedNode {
            batch: self.batch.clone(),
            device: self.device.as_deref(),
            entries: self
                .entries
                .iter()
                .map(|e| match e {
                    EntryOwned::Leaf(key, dtype, shape, device) => Described::Leaf {
                        key,
                        dtype,
                        shape,
                        device,
                    },
                    EntryOwned::Node(key, node) => Described::Node {
                        key,
                        node: node.view(),
                    },
                    EntryOwned::Value(key, data) => Described::Value {
                        key,
                        data: data.clone(),
                    },
                    EntryOwned::Stack(key, meta) => Described::Stack { key, meta },
                })
                .collect(),
        }
    }
}

/// The JSON description of a tree (meta.json entries, nested nodes inlined) as bytes.
///
/// `node` is `(batch, device, entries)`, entries in the order to write (sorted keys):
/// `(0, key, dtype_name, shape, device)` for a leaf, `(1, key, node)` for a nested TensorDict,
/// `(2, key, json_text)` for a non-tensor value.
#[pyfunction]
pub fn describe_tree<'py>(py: Python<'py>, node: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyBytes>> {
    let owned = DescribedNodeOwned::extract(node)?;
    let text = py.detach(|| packed::describe(&owned.view()));
    Ok(PyBytes::new(py, &text))
}

/// Builds the Python tree of a parsed description (see [`build_packed_tree`]).
struct TreeBuilder<'py, 'a> {
    py: Python<'py>,
    make_node: &'a Bound<'py, PyAny>,
    make_leaf: &'a Bound<'py, PyAny>,
    make_empty: &'a Bound<'py, PyAny>,
    make_value: &'a Bound<'py, PyAny>,
    dtypes: &'a Bound<'py, PyDict>,
    cache: Vec<(&'static str, Bound<'py, PyAny>)>,
    /// The shape tuples made so far (a tree has few distinct shapes: one tuple each).
    shapes: Vec<(Vec<u64>, Bound<'py, PyTuple>)>,
    /// The arena the leaves are slices of, and where the packed tree starts in it.
    region: Option<(Arc<storage::Region>, usize)>,
    /// Whether the arena leaves `make_leaf` returns leave the cyclic GC's lists.
    untrack: bool,
    nodes: Bound<'py, PyList>,
}

impl<'py> TreeBuilder<'py, '_> {
    fn dtype(&mut self, name: &'static str) -> PyResult<Bound<'py, PyAny>> {
        if let Some((_, d)) = self.cache.iter().find(|(n, _)| std::ptr::eq(*n, name)) {
            return Ok(d.clone());
        }
        let d = self.dtypes.get_item(name)?.ok_or_else(|| {
            InvalidTreeError::new_err(format!(
                "received tree description: dtype {name:?} does not exist in this torch"
            ))
        })?;
        self.cache.push((name, d.clone()));
        Ok(d)
    }

    fn shape(&mut self, shape: &[u64]) -> PyResult<Bound<'py, PyTuple>> {
        if let Some((_, t)) = self.shapes.iter().rev().find(|(s, _)| s == shape) {
            return Ok(t.clone());
        }
        let t = PyTuple::new(self.py, shape)?;
        if self.shapes.len() < SHAPE_CACHE {
            self.shapes.push((shape.to_vec(), t.clone()));
        }
        Ok(t)
    }

    fn node(&mut self, node: &ParsedNode<'_>) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        let made = self.make_node.call1((node.batch.clone(), node.device.clone()))?;
        let td = made.get_item(0)?;
        let items = made.get_item(1)?.cast_into::<PyDict>()?;
        for entry in &node.entries {
            let (key, value) = match entry {
                Parsed::Leaf(key, leaf) => {
                    let dtype = self.dtype(leaf.dtype)?;
                    let shape = self.shape(&leaf.shape)?;
                    let value = match (&self.region, leaf.nbytes) {
                        (_, 0) => self.make_empty.call1((shape, dtype))?,
                        (Some((region, base)), n) => {
                            let buffer = Bound::new(py, Buffer::slice(region, base + leaf.offset, n))?;
                            let value = self.make_leaf.call1((buffer, dtype, shape))?;
                            if self.untrack {
                                untrack(&value);
                            }
                            value
                        }
                        (None, n) => self.make_leaf.call1((leaf.offset, n, dtype, shape))?,
                    };
                    (key, value)
                }
                Parsed::Node(key, sub) => (key, self.node(sub)?),
                Parsed::Value(key, text) => (key, self.make_value.call1((text,))?),
                Parsed::Stack(key, stack) => {
                    let cells = super::tree::cells_to_py(py, &stack.data.cells)?;
                    let shape = PyTuple::new(py, &stack.data.shape)?;
                    let made =
                        self.make_value
                            .call1((cells, shape, stack.device.clone(), stack.stack_dim))?;
                    (key, made)
                }
            };
            items.set_item(key.as_ref(), value)?;
        }
        let keys = PyTuple::new(py, items.keys())?;
        let values = PyTuple::new(py, items.values())?;
        self.nodes.append((items, keys, values))?;
        Ok(td)
    }
}

/// Builds the tree a received description describes, in one call; returns `(tree, total,
/// whole, nodes)`.
///
/// The description is validated like a directory's meta.json (InvalidTreeError naming the
/// key otherwise). `total` is the packed size of its leaves. `hooks` are Python callables:
/// `make_node(batch, device_name) -> (td, td._tensordict)` (the root first); `make_leaf(buffer, dtype, shape)` for each
/// non-empty leaf when `arena` (then `whole` is one anonymous shared map of `capacity` bytes,
/// at least `total`, populated up front, and each buffer a slice of it), else
/// `make_leaf(offset, nbytes, dtype, shape)` (and `whole` is None); `make_empty(shape, dtype)`
/// for leaves without bytes; `make_value(json_text)` for non-tensor values and
/// `make_value(cells, shape, device, stack_dim)` for stacks (`cells` as `load_tree` gives them). `dtypes` maps
/// dtype names to torch dtypes. `on_buffer(whole, total)`, if given, is called as soon as
/// `whole` exists, before the tree is built (so that the data can be arriving meanwhile).
/// `nodes` lists `(dict, keys, values)` of every node, for the tree's copy plan. With `into`
/// (a buffer from [`packed_arena`], at least `total` bytes) the leaves are slices of it instead
/// of a new map (the data may already be arriving into it), and `whole` is `into`. With
/// `untrack_leaves` the arena leaves are taken out of the cyclic garbage collector's lists
/// (the caller's promise: they can never be part of a reference cycle, as a `_LazyLeaf` that
/// holds a buffer, a dtype and a tuple of ints); refcounting still frees them. A 10,000-leaf
/// tree would otherwise bring a full collection (~0.1-0.2 s with torch loaded) every few trees.
#[pyfunction]
#[pyo3(signature = (text, capacity, arena, dtypes, make_node, make_leaf, make_empty, make_value, on_buffer = None, into = None, untrack_leaves = false))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn build_packed_tree<'py>(
    py: Python<'py>,
    text: &[u8],
    capacity: Option<usize>,
    arena: bool,
    dtypes: &Bound<'py, PyDict>,
    make_node: &Bound<'py, PyAny>,
    make_leaf: &Bound<'py, PyAny>,
    make_empty: &Bound<'py, PyAny>,
    make_value: &Bound<'py, PyAny>,
    on_buffer: Option<&Bound<'py, PyAny>>,
    into: Option<Bound<'py, Buffer>>,
    untrack_leaves: bool,
) -> PyResult<(
    Bound<'py, PyAny>,
    usize,
    Option<Bound<'py, Buffer>>,
    Bound<'py, PyList>,
)> {
    let (node, total) = py
        .detach(|| packed::parse(text))
        .map_err(InvalidTreeError::new_err)?;
    let capacity = capacity.unwrap_or(total);
    if capacity < total {
        return Err(InvalidTreeError::new_err(format!(
            "received tree description: its leaves hold {total} bytes, more than {capacity}"
        )));
    }
    let (region, whole) = match into {
        Some(into) => {
            if into.get().len() < total {
                return Err(InvalidTreeError::new_err(format!(
                    "received tree description: its leaves hold {total} bytes, more than the \
                     {} of the buffer they were received into",
                    into.get().len()
                )));
            }
            let region = (Arc::clone(into.get().region()), into.get().offset());
            (Some(region), Some(into))
        }
        None if arena && capacity > 0 => {
            let region = py.detach(|| {
                let region = anon::anonymous(None, capacity)?;
                region.populate();
                Ok::<_, crate::error::Error>(region)
            })?;
            let region = Arc::new(region);
            let whole = Bound::new(py, Buffer::slice(&region, 0, capacity))?;
            (Some((region, 0)), Some(whole))
        }
        None => (None, None),
    };
    if let (Some(hook), Some(whole)) = (on_buffer, &whole) {
        hook.call1((whole, total))?; // a receive can start while the tree is built
    }
    let mut builder = TreeBuilder {
        py,
        make_node,
        make_leaf,
        make_empty,
        make_value,
        dtypes,
        cache: Vec::new(),
        shapes: Vec::new(),
        region,
        untrack: untrack_leaves,
        nodes: PyList::empty(py),
    };
    let root = builder.node(&node)?;
    Ok((root, total, whole, builder.nodes))
}

/// A new anonymous shared map of `nbytes` bytes (memory reserved up front) to receive a packed
/// tree into before its description is parsed (see `build_packed_tree`'s `into`). With
/// `populate`, its pages are faulted in first, with one call.
#[pyfunction]
#[pyo3(signature = (nbytes, populate = true))]
pub fn packed_arena<'py>(py: Python<'py>, nbytes: usize, populate: bool) -> PyResult<Bound<'py, Buffer>> {
    let region = py.detach(|| {
        let region = anon::anonymous(None, nbytes.max(1))?;
        if populate {
            region.populate();
        }
        Ok::<_, crate::error::Error>(region)
    })?;
    let region = Arc::new(region);
    Bound::new(py, Buffer::slice(&region, 0, nbytes))
}

/// Takes `value` out of the cyclic garbage collector's lists, if its type is collected at all.
fn untrack(value: &Bound<'_, PyAny>) {
    let op = value.as_ptr();
    // SAFETY: `op` is a live object (borrowed from `value`); PyObject_GC_UnTrack is only called
    // on an object whose type has Py_TPFLAGS_HAVE_GC, where it is a no-op if already untracked.
    unsafe {
        if pyo3::ffi::PyType_IS_GC(pyo3::ffi::Py_TYPE(op)) != 0 {
            pyo3::ffi::PyObject_GC_UnTrack(op.cast());
        }
    }
}
