//! The `#[pyfunction]`s: convert plain Python values at the boundary, release the GIL for the
//! work, convert back. One call per tree each way.

use std::collections::HashMap;
use std::path::PathBuf;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use serde_json::Value;

use crate::archive;
use crate::error::Error;
use crate::format;
use crate::py::buffer::Buffer;
use crate::report::render;
use crate::report::summary;
use crate::safetensors::{self, TensorBytes};
use crate::sys::parallel;
use crate::sys::storage::{self, Region};
use crate::tree::load::{self, LoadedEntry, LoadedNode};
use crate::tree::save::{self, EntrySpec, LeafSpec, NodeSpec, SaveOptions};

const LEAF: u8 = 0;
const NODE: u8 = 1;
const NON_TENSOR: u8 = 2;

/// Builds a byte slice from a source pointer handed over by the Python layer.
///
/// # Safety
/// `ptr` must be 0 (no data) or point to `nbytes` readable bytes that stay alive and are not
/// freed until the call that uses the slice returns. The Python layer passes `data_ptr()` of a
/// contiguous CPU tensor that it keeps referenced for the whole call.
unsafe fn source_slice<'a>(ptr: usize, nbytes: usize) -> Option<&'a [u8]> {
    if nbytes == 0 {
        return Some(&[]);
    }
    if ptr == 0 {
        return None;
    }
    // SAFETY: guaranteed by the caller, see above.
    Some(unsafe { std::slice::from_raw_parts(ptr as *const u8, nbytes) })
}

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

fn node_spec<'a>(node: &Bound<'_, PyAny>, leaves: &mut Vec<LeafSpec<'a>>) -> PyResult<NodeSpec> {
    let (batch, entries): (Vec<u64>, Bound<'_, PyList>) = node.extract()?;
    let mut out = Vec::with_capacity(entries.len());
    for item in entries.iter() {
        let item = item.cast_into::<PyTuple>()?;
        let tag: u8 = item.get_item(0)?.extract()?;
        if tag == LEAF {
            // the whole tuple at once (the key is not extracted twice)
            let (_, key, dtype, shape, device, ptr, nbytes, same_file): LeafTuple = item.extract()?;
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
            });
            out.push((key, EntrySpec::Leaf(leaves.len() - 1)));
            continue;
        }
        let key: String = item.get_item(1)?.extract()?;
        let entry = match tag {
            NODE => EntrySpec::Node(node_spec(&item.get_item(2)?, leaves)?),
            NON_TENSOR => EntrySpec::NonTensor(parse_json(&item.get_item(2)?.extract::<String>()?, &key)?),
            other => return Err(PyTypeError::new_err(format!("unknown entry tag {other}"))),
        };
        out.push((key, entry));
    }
    Ok(NodeSpec { batch, entries: out })
}

fn buffers(regions: Vec<Option<Region>>) -> Vec<Option<Buffer>> {
    regions.into_iter().map(|r| r.map(Buffer::new)).collect()
}

/// Saves a whole tree under `prefix` atomically, in one call, with the GIL released.
///
/// `tree` is `(batch_size, entries)`; each entry is `(0, key, dtype, shape, device, data_ptr,
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

/// Creates one anonymous shared-memory Buffer per `(data_ptr, nbytes)` source (data_ptr 0:
/// zero-filled), with the GIL released. They live in shared arenas (memfds, or unlinked
/// files) whose descriptors stay open so that the memory can be handed to other processes:
/// small sources packed back to back in one arena, large ones on their own pages, spread over
/// one arena per writer thread (see `sys::anon::create`; on Windows one pagefile-backed arena).
#[pyfunction]
#[pyo3(signature = (sources, *, num_threads = 0))]
pub fn anonymous_buffers(
    py: Python<'_>,
    sources: Vec<(usize, usize)>,
    num_threads: usize,
) -> PyResult<Vec<Buffer>> {
    if let Some((_, n)) = sources.iter().find(|(_, n)| *n == 0) {
        return Err(PyValueError::new_err(format!(
            "cannot map {n} bytes: empty tensors have no memory map"
        )));
    }
    if sources.is_empty() {
        return Ok(Vec::new());
    }
    // SAFETY: the Python layer keeps every source tensor alive during this call.
    let slices: Vec<(Option<&[u8]>, usize)> = sources
        .iter()
        .map(|&(p, n)| (unsafe { source_slice(p, n) }, n))
        .collect();
    let (regions, places) = py.detach(|| crate::sys::anon::create(&slices, num_threads))?;
    Ok(slices
        .iter()
        .zip(places)
        .map(|(&(_, n), (arena, off))| Buffer::slice(&regions[arena], off, n))
        .collect())
}

fn node_to_py<'py>(py: Python<'py>, node: LoadedNode) -> PyResult<Bound<'py, PyTuple>> {
    let entries = PyList::empty(py);
    for (key, entry) in node.entries {
        let item = match entry {
            LoadedEntry::Leaf { dtype, shape, index } => {
                (LEAF, key, dtype, PyTuple::new(py, shape)?, index).into_pyobject(py)?
            }
            LoadedEntry::Node(child) => (NODE, key, node_to_py(py, child)?).into_pyobject(py)?,
            LoadedEntry::NonTensor(value) => (NON_TENSOR, key, value.to_string()).into_pyobject(py)?,
        };
        entries.append(item)?;
    }
    (node.batch, node.device, entries).into_pyobject(py)
}

/// Loads and validates the tree at `prefix` in one call, mapping every leaf with the GIL
/// released. Returns `(tree, buffers)`: tree is `(batch_size, device, entries)` with entries
/// `(0, key, dtype, shape, leaf_index)`, `(1, key, subtree)` or `(2, key, json_text)`.
#[pyfunction]
pub fn load_tree<'py>(
    py: Python<'py>,
    prefix: PathBuf,
) -> PyResult<(Bound<'py, PyTuple>, Vec<Option<Buffer>>)> {
    let (node, regions) = py.detach(|| load::load_tree(&prefix))?;
    Ok((node_to_py(py, node)?, buffers(regions)))
}

/// Checks the tree at `prefix` without mapping data; returns the problems found (empty: OK).
#[pyfunction]
pub fn verify_tree(py: Python<'_>, prefix: PathBuf) -> Vec<String> {
    py.detach(|| load::verify_tree(&prefix))
}

/// Writes one data file atomically from `(data_ptr, nbytes)` (data_ptr 0: zero-filled) and
/// maps it; an existing file is replaced only with `existsok`.
#[pyfunction]
#[pyo3(signature = (path, data_ptr, nbytes, *, existsok = false))]
pub fn write_file(
    py: Python<'_>,
    path: PathBuf,
    data_ptr: usize,
    nbytes: usize,
    existsok: bool,
) -> PyResult<Buffer> {
    if nbytes == 0 {
        return Err(Error::tree(&path, "empty tensors have no data file").into());
    }
    // SAFETY: the Python layer keeps the source tensor alive during this call.
    let data = unsafe { source_slice(data_ptr, nbytes) };
    let region = py.detach(|| save::write_file(&path, data, nbytes, existsok))?;
    Ok(Buffer::new(region))
}

/// Maps the first `nbytes` of an existing file (which must be at least that long).
#[pyfunction]
pub fn open_file(py: Python<'_>, path: PathBuf, nbytes: usize) -> PyResult<Buffer> {
    if nbytes == 0 {
        return Err(Error::tree(&path, "empty tensors have no data file").into());
    }
    Ok(Buffer::new(py.detach(|| load::open_file(&path, nbytes))?))
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

/// The file-name component a key is stored under (tensordict's robust key encoding).
#[pyfunction]
pub fn encode_key(key: &str) -> String {
    format::encode_key(key)
}

fn summary_to_py<'py>(py: Python<'py>, node: summary::SummaryNode) -> PyResult<Bound<'py, PyTuple>> {
    let entries = PyList::empty(py);
    for (key, entry) in node.entries {
        let item = match entry {
            summary::SummaryEntry::Leaf { dtype, shape, nbytes } => {
                (LEAF, key, dtype, PyTuple::new(py, shape)?, nbytes).into_pyobject(py)?
            }
            summary::SummaryEntry::Node(child) => (NODE, key, summary_to_py(py, child)?).into_pyobject(py)?,
            summary::SummaryEntry::NonTensor(value) => {
                (NON_TENSOR, key, value.to_string()).into_pyobject(py)?
            }
        };
        entries.append(item)?;
    }
    (node.batch, node.device, node.format_version, entries).into_pyobject(py)
}

/// Summarizes the tree at `prefix` from its meta.json files alone (no data file is opened),
/// with the GIL released. Returns `(batch_size, device, format_version, entries)` with entries
/// `(0, key, dtype, shape, nbytes)`, `(1, key, subtree)` or `(2, key, json_text)`.
#[pyfunction]
pub fn tree_summary<'py>(py: Python<'py>, prefix: PathBuf) -> PyResult<Bound<'py, PyTuple>> {
    // A file is read as a `.tdz` archive (its meta.json entries; no data entry is read).
    let node = py.detach(|| match prefix.is_file() {
        true => summary::summarize_archive(&prefix),
        false => summary::summarize(&prefix),
    })?;
    summary_to_py(py, node)
}

/// The command line's `info` report of the tree at `prefix` (a directory, or a `.tdz` archive
/// when `prefix` is a file), read from its meta.json files alone, as text or JSON, with `shown`
/// as the path it names. Walk and rendering run with the GIL released.
#[pyfunction]
#[pyo3(signature = (prefix, shown, *, json = false))]
pub fn tree_report(py: Python<'_>, prefix: PathBuf, shown: &str, json: bool) -> PyResult<String> {
    let report = py.detach(|| {
        let node = match prefix.is_file() {
            true => summary::summarize_archive(&prefix),
            false => summary::summarize(&prefix),
        }?;
        Ok::<_, crate::error::Error>(match json {
            true => render::json_report(shown, &node),
            false => render::text_report(shown, &node),
        })
    })?;
    Ok(report)
}

/// One tensor of a read `.safetensors` file: name, torch dtype, shape, bytes (None: empty).
type SafetensorsEntry = (String, &'static str, Vec<u64>, Option<Buffer>);

/// Maps and validates a `.safetensors` file (copy-on-write: writes never reach the file), with
/// the GIL released. Returns `(tensors, metadata)`: the tensors in file order as `(name,
/// dtype, shape, buffer)`, and the file's `__metadata__` (empty when it has none).
#[pyfunction]
pub fn read_safetensors(
    py: Python<'_>,
    path: PathBuf,
) -> PyResult<(Vec<SafetensorsEntry>, HashMap<String, String>)> {
    let file = py.detach(|| safetensors::read(&path))?;
    let map = std::sync::Arc::new(file.map);
    let tensors = file
        .tensors
        .into_iter()
        .map(|t| {
            let buffer = t.data.map(|d| match d {
                TensorBytes::InFile { offset, len } => Buffer::slice(&map, offset, len),
                TensorBytes::Copied(region) => Buffer::new(region),
            });
            (t.name, t.dtype, t.shape, buffer)
        })
        .collect();
    Ok((tensors, file.metadata))
}

/// Writes tensors given as `(name, dtype, shape, data_ptr, nbytes)` and `metadata` to a
/// `.safetensors` file at `path` (written beside it, then renamed over it), with the GIL
/// released.
#[pyfunction]
pub fn write_safetensors(
    py: Python<'_>,
    path: PathBuf,
    tensors: Vec<(String, String, Vec<usize>, usize, usize)>,
    metadata: HashMap<String, String>,
) -> PyResult<()> {
    let mut rows = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, ptr, nbytes) in tensors {
        // SAFETY: the Python layer keeps every source tensor alive during this call.
        let data = unsafe { source_slice(ptr, nbytes) }
            .ok_or_else(|| Error::tree(&path, format!("key {name:?}: no data pointer")))?;
        rows.push(safetensors::WriteTensor {
            name,
            dtype,
            shape,
            data,
        });
    }
    py.detach(|| safetensors::write(&path, &rows, metadata))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// .tdz archives (rust/archive.rs)

fn archive_buffers(loaded: archive::Loaded) -> Vec<Option<Buffer>> {
    let region = loaded.region;
    loaded
        .leaves
        .into_iter()
        .map(|leaf| {
            leaf.map(|data| match data {
                archive::LeafData::View { offset, len } => Buffer::slice(&region, offset, len),
                archive::LeafData::Copy(copy) => Buffer::new(copy),
            })
        })
        .collect()
}

fn archive_mode(shared: bool) -> storage::MapMode {
    if shared {
        storage::MapMode::Shared
    } else {
        storage::MapMode::CopyOnWrite
    }
}

/// Saves a whole tree (same spec as `write_tree`) as one `.tdz` archive at `path`, written
/// beside it and renamed into place, with the GIL released. `compression` is a zip method
/// (0 stored, 8 deflate at `level`); `shared` maps the result so that writes reach the file
/// (else copy-on-write); `dos_time` is the (time, date) of the entries. Returns one Buffer per
/// tensor leaf in depth-first order (None for empty tensors).
#[pyfunction]
#[pyo3(signature = (path, tree, *, existsok = true, durable = false, num_threads = 0, shared = false,
                    compression = 0, level = 6, dos_time = None))]
#[allow(clippy::too_many_arguments)]
pub fn write_archive(
    py: Python<'_>,
    path: PathBuf,
    tree: &Bound<'_, PyAny>,
    existsok: bool,
    durable: bool,
    num_threads: usize,
    shared: bool,
    compression: u16,
    level: u8,
    dos_time: Option<(u16, u16)>,
) -> PyResult<Vec<Option<Buffer>>> {
    // (time, date) of 1980-01-01 00:00, zip's epoch, when the caller gives none
    let dos_time = dos_time.unwrap_or((0, 33));
    let compression = match compression {
        0 => archive::Compression::Stored,
        8 if level <= 10 => archive::Compression::Deflate(level),
        8 => {
            return Err(PyValueError::new_err(format!(
                "deflate level {level} is not in 0..=9"
            )))
        }
        other => {
            return Err(PyValueError::new_err(format!(
                "zip method {other} is not written here: use stored (0) or deflate (8)"
            )))
        }
    };
    let mut leaves = Vec::new();
    let root = node_spec(tree, &mut leaves)?;
    let opts = archive::ArchiveOptions {
        existsok,
        durable,
        num_threads,
        compression,
        mode: archive_mode(shared),
        dos_time: dos_time.0,
        dos_date: dos_time.1,
    };
    let loaded = py.detach(|| archive::write_archive(&path, &root, &leaves, opts))?;
    Ok(archive_buffers(loaded))
}

/// What `load_archive` returns: the tree, one buffer per leaf, the entries that were copied.
type LoadedArchive<'py> = (Bound<'py, PyTuple>, Vec<Option<Buffer>>, Vec<String>);

/// Loads and validates the `.tdz` archive at `path` with one map, the GIL released. Returns
/// `(tree, buffers, copied)` like `load_tree`, plus the names of the entries that had to be
/// copied (compressed or unaligned). `shared`: writes reach the file (else copy-on-write).
#[pyfunction]
#[pyo3(signature = (path, *, shared = false))]
pub fn load_archive<'py>(py: Python<'py>, path: PathBuf, shared: bool) -> PyResult<LoadedArchive<'py>> {
    let (node, loaded) = py.detach(|| archive::load_archive_tree(&path, archive_mode(shared)))?;
    let copied = loaded.copied.clone();
    Ok((node_to_py(py, node)?, archive_buffers(loaded), copied))
}

/// True when `path` is a file holding a valid zip archive with a top-level `meta.json`.
#[pyfunction]
pub fn is_archive(py: Python<'_>, path: PathBuf) -> bool {
    py.detach(|| archive::is_archive(&path))
}

/// Recomputes the CRC-32 of the stored entries of the archive at `path` after in-place
/// writes; returns the names of the entries whose checksum changed.
#[pyfunction]
#[pyo3(signature = (path, *, num_threads = 0))]
pub fn refresh_archive_checksums(py: Python<'_>, path: PathBuf, num_threads: usize) -> PyResult<Vec<String>> {
    Ok(py.detach(|| archive::refresh_checksums(&path, num_threads))?)
}

/// Checks the archive at `path` (structure, tree, every CRC); returns the problems found.
#[pyfunction]
pub fn verify_archive(py: Python<'_>, path: PathBuf) -> Vec<String> {
    py.detach(|| archive::verify_archive(&path))
}

/// Maps `nbytes` at `offset` of the archive at `path` again (a pickled leaf), if the file is
/// still the one with `identity`; all leaves of one archive share one map per process.
#[pyfunction]
pub fn reopen_archive(
    py: Python<'_>,
    path: PathBuf,
    identity: (u64, u64),
    offset: usize,
    nbytes: usize,
    shared: bool,
) -> PyResult<Buffer> {
    let region = py.detach(|| archive::reopen(&path, identity, offset, nbytes, shared))?;
    Ok(Buffer::slice(&region, offset, nbytes))
}

/// A byte counter for progress bars. Used as a context manager around native calls on one
/// thread (`with counter: _native.write_tree(...)`): the calls made inside it advance it from
/// their worker threads with the GIL released (see `parallel::counting`), and another Python
/// thread reads `value` to draw a bar. No call takes a parameter for it.
#[pyclass(frozen, module = "tensordict_rs._native")]
pub struct ProgressCounter {
    value: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

#[pymethods]
impl ProgressCounter {
    #[new]
    fn new() -> Self {
        ProgressCounter {
            value: Default::default(),
        }
    }

    /// Bytes counted so far.
    #[getter]
    fn value(&self) -> u64 {
        self.value.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Adds `n` bytes (for work done on the Python side).
    fn add(&self, n: u64) {
        self.value.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts the native calls this thread makes until `__exit__`.
    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        parallel::set_progress(Some(slf.value.clone()));
        slf
    }

    /// Stops counting this thread's calls.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        parallel::set_progress(None);
        false
    }
}
