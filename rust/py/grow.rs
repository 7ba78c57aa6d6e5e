//! Growth in place and incremental checkpoints (`io/growth.py`): reserving file space, the
//! rows written and committed under the directory's lock, range copies, chunk hashes and the directory
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

/// One growth of the flat tree at `prefix` under its lock: when its meta.json holds `expect`
/// rows and exactly the `leaves` (`(key, dtype, dims after the first)`), and each data file
/// written is still the file `identity` (None: any), writes each
/// `(file name, offset, data_ptr, nbytes, identity)` item into that data file of the directory
/// (`pwrite`; a `data_ptr` of 0 writes `nbytes` zero bytes) and commits `rows` rows (meta.json replaced in one step); returns None, or the
/// rows the directory holds when it is not that tree (nothing written: reload it).
#[pyfunction]
#[pyo3(signature = (prefix, expect, rows, leaves, writes, *, durable = false))]
#[allow(clippy::type_complexity)] // the tuples are the Python call's shape
pub fn grow_rows(
    py: Python<'_>,
    prefix: PathBuf,
    expect: u64,
    rows: u64,
    leaves: Vec<(String, String, Vec<u64>)>,
    writes: Vec<(String, u64, usize, usize, Option<(u64, u64)>)>,
    durable: bool,
) -> PyResult<Option<u64>> {
    let leaves: Vec<grow::GrowLeaf<'_>> = leaves
        .iter()
        .map(|(key, dtype, tail)| grow::GrowLeaf { key, dtype, tail })
        .collect();
    let writes: Vec<grow::GrowWrite<'_>> = writes
        .iter()
        .map(|(name, offset, ptr, n, identity)| {
            // SAFETY: the Python layer keeps every source tensor alive during this call.
            // A null pointer with a length: that many zero bytes (see `GrowWrite::zeros`).
            let data = unsafe { source_slice(*ptr, *n) };
            grow::GrowWrite {
                name,
                offset: *offset,
                data: data.unwrap_or(&[]),
                zeros: if data.is_none() { *n as u64 } else { 0 },
                identity: *identity,
            }
        })
        .collect();
    Ok(py.detach(|| grow::grow_rows(&prefix, expect, rows, &leaves, &writes, durable))?)
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
