//! `.tdz` archives (`_archive.py`, pickled archive leaves in `memmap.py`): written, loaded,
//! checked and reopened in one call each, the GIL released.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::buffer::Buffer;
use super::tree::{node_spec, node_to_py};
use crate::archive;
use crate::sys::identity::FileId;
use crate::sys::storage;

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
    identity: FileId,
    offset: usize,
    nbytes: usize,
    shared: bool,
) -> PyResult<Buffer> {
    let region = py.detach(|| archive::reopen(&path, identity, offset, nbytes, shared))?;
    Ok(Buffer::slice(&region, offset, nbytes))
}
