//! Growth in place and incremental checkpoints (`io/growth.py`): reserving file space, the
//! meta.json commit of a new number of rows, range copies, chunk hashes and the directory
//! exchange, the GIL released.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::source_slice;
use crate::tree::grow;

/// Makes the data file at `path` at least `nbytes` long (real blocks, never shorter); returns
/// its length.
#[pyfunction]
pub fn reserve_file(py: Python<'_>, path: PathBuf, nbytes: u64) -> PyResult<u64> {
    Ok(py.detach(|| grow::reserve_file(&path, nbytes))?)
}

/// Writes `(path, offset, data_ptr, nbytes)` items: each source's bytes at `offset` of its
/// existing file (`pwrite`); with `durable` each file's data is fsynced.
#[pyfunction]
#[pyo3(signature = (items, *, durable = false))]
pub fn write_rows(py: Python<'_>, items: Vec<(PathBuf, u64, usize, usize)>, durable: bool) -> PyResult<()> {
    let slices: Vec<(&std::path::Path, u64, &[u8])> = items
        .iter()
        .map(|(p, off, ptr, n)| {
            // SAFETY: the Python layer keeps every source tensor alive during this call.
            let data = unsafe { source_slice(*ptr, *n) };
            (p.as_path(), *off, data.unwrap_or(&[]))
        })
        .collect();
    Ok(py.detach(|| grow::write_rows(&slices, durable))?)
}

/// Commits `rows` rows in the flat tree at `prefix`: its meta.json replaced in one step.
#[pyfunction]
#[pyo3(signature = (prefix, rows, *, durable = false))]
pub fn set_rows(py: Python<'_>, prefix: PathBuf, rows: u64, durable: bool) -> PyResult<()> {
    Ok(py.detach(|| grow::set_rows(&prefix, rows, durable))?)
}

/// Copies the byte `ranges` of `src` into `dst` (None: all), then sizes `dst` to `nbytes`;
/// returns the bytes written.
#[pyfunction]
#[pyo3(signature = (src, dst, ranges, nbytes, *, durable = false))]
pub fn sync_file(
    py: Python<'_>,
    src: PathBuf,
    dst: PathBuf,
    ranges: Option<Vec<(u64, u64)>>,
    nbytes: u64,
    durable: bool,
) -> PyResult<u64> {
    Ok(py.detach(|| grow::sync_file(&src, &dst, ranges.as_deref(), nbytes, durable))?)
}

/// The 64-bit hashes of the `chunk`-byte chunks of the first `nbytes` of `path`, as the bytes
/// of a little-endian u64 array.
#[pyfunction]
pub fn chunk_hashes<'py>(
    py: Python<'py>,
    path: PathBuf,
    nbytes: u64,
    chunk: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let hashes = py.detach(|| grow::chunk_hashes(&path, nbytes, chunk))?;
    let bytes: Vec<u8> = hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
    Ok(PyBytes::new(py, &bytes))
}

/// Exchanges the directories `a` and `b` of `parent` in one step.
#[pyfunction]
#[pyo3(signature = (parent, a, b, *, durable = false))]
pub fn exchange_dirs(py: Python<'_>, parent: PathBuf, a: String, b: String, durable: bool) -> PyResult<()> {
    Ok(py.detach(|| grow::exchange_dirs(&parent, &a, &b, durable))?)
}

/// Renames directory `a` of `parent` to the free name `b`.
#[pyfunction]
#[pyo3(signature = (parent, a, b, *, durable = false))]
pub fn rename_new(py: Python<'_>, parent: PathBuf, a: String, b: String, durable: bool) -> PyResult<()> {
    Ok(py.detach(|| grow::rename_new(&parent, &a, &b, durable))?)
}
