//! Memory-mapped tensors (`memmap.py`): single data files written or opened, anonymous
//! shared memory for many tensors at once, the GIL released.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::buffer::Buffer;
use super::source_slice;
use crate::error::Error;
use crate::tree::{load, save};

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

/// Maps the first `nbytes` of an existing file (which must be at least that long); `private`:
/// copy-on-write (writes stay in this process).
#[pyfunction]
#[pyo3(signature = (path, nbytes, *, private = false))]
pub fn open_file(py: Python<'_>, path: PathBuf, nbytes: usize, private: bool) -> PyResult<Buffer> {
    if nbytes == 0 {
        return Err(Error::tree(&path, "empty tensors have no data file").into());
    }
    Ok(Buffer::new(
        py.detach(|| load::open_file(&path, nbytes, private))?,
    ))
}
