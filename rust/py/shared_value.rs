//! Non-tensor values shared between processes (`_core/shared_value.py`): the JSON of a
//! `NonTensorData` or of a whole `NonTensorStack` in a cell of anonymous shared memory
//! (`sys::seqcell`), read and written by every process that holds the tree, the GIL released
//! for the copies.

use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::buffer::Buffer;
use crate::sys::seqcell::{CellError, SeqCell, HEADER};

fn cell(buffer: &Buffer) -> PyResult<SeqCell> {
    if !buffer.region().writable() {
        return Err(PyValueError::new_err("a shared value needs writable memory"));
    }
    // SAFETY: the buffer's bytes stay mapped while `buffer` (borrowed by the caller for the
    // whole call) holds its region; the Python layer touches a cell's bytes only through
    // these functions.
    unsafe { SeqCell::new(buffer.as_ptr(), buffer.len()) }.map_err(to_py)
}

/// Runs `f` on the cell of `buffer` with the GIL released.
fn detached<T: Send>(
    py: Python<'_>,
    buffer: &Buffer,
    f: impl FnOnce(&SeqCell) -> Result<T, CellError> + Send,
) -> PyResult<T> {
    cell(buffer)?;
    let (base, len) = (buffer.as_ptr() as usize, buffer.len());
    py.detach(move || {
        // SAFETY: as in `cell`: the caller borrows `buffer` (so its region stays mapped) for
        // the whole call, and the layout was checked just above.
        unsafe { SeqCell::new(base as *mut u8, len) }.and_then(|c| f(&c))
    })
    .map_err(to_py)
}

fn to_py(err: CellError) -> PyErr {
    match err {
        CellError::TooLarge { .. } => PyValueError::new_err(err.to_string()),
        CellError::Stuck => PyTimeoutError::new_err(err.to_string()),
        _ => PyRuntimeError::new_err(err.to_string()),
    }
}

/// Bytes a cell takes before its value (the cell's buffer is this plus the capacity).
#[pyfunction]
pub fn shared_value_header() -> usize {
    HEADER
}

/// The version of the value in the cell `buffer` (even; a new version means a new value).
#[pyfunction]
pub fn shared_value_version(buffer: PyRef<'_, Buffer>) -> PyResult<u64> {
    Ok(cell(&buffer)?.version())
}

/// The value's bytes and version. RuntimeError when the cell's length field is out of range,
/// TimeoutError when a write has been in progress for seconds (a writer was killed).
#[pyfunction]
pub fn shared_value_read<'py>(
    py: Python<'py>,
    buffer: PyRef<'py, Buffer>,
) -> PyResult<(u64, Bound<'py, PyBytes>)> {
    let (version, bytes) = detached(py, &buffer, |c| c.read())?;
    Ok((version, PyBytes::new(py, &bytes)))
}

/// Takes the cell's write lock (other writers and readers wait) and returns the value's
/// bytes: the first half of a read-modify-write; `shared_value_unlock` must follow.
#[pyfunction]
pub fn shared_value_lock<'py>(
    py: Python<'py>,
    buffer: PyRef<'py, Buffer>,
) -> PyResult<(u64, Bound<'py, PyBytes>)> {
    let before = detached(py, &buffer, |c| c.lock())?;
    let c = cell(&buffer)?;
    match c.locked_value() {
        Ok(bytes) => Ok((before, PyBytes::new(py, &bytes))),
        Err(err) => {
            c.unlock(before);
            Err(to_py(err))
        }
    }
}

/// Stores `data` (when given) and releases the lock taken by `shared_value_lock` at version
/// `before`; returns the new version. The lock is released even when `data` does not fit
/// (ValueError, the value unchanged).
#[pyfunction]
#[pyo3(signature = (buffer, before, data=None))]
pub fn shared_value_unlock(buffer: PyRef<'_, Buffer>, before: u64, data: Option<Vec<u8>>) -> PyResult<u64> {
    let c = cell(&buffer)?;
    let stored = data.map_or(Ok(()), |bytes| c.locked_store(&bytes));
    let version = c.unlock(before);
    stored.map_err(to_py).map(|()| version)
}

/// Replaces the value by `data` only if its version is still `expected` (from
/// `shared_value_read`): the second half of an optimistic read-modify-write, the lock held only
/// inside this call. Returns the new version, or None when another write came in between.
/// ValueError when `data` exceeds the cell's capacity (the value is then unchanged).
#[pyfunction]
pub fn shared_value_write_if(
    py: Python<'_>,
    buffer: PyRef<'_, Buffer>,
    expected: u64,
    data: Vec<u8>,
) -> PyResult<Option<u64>> {
    detached(py, &buffer, move |c| c.write_if(expected, &data))
}

/// Replaces the value by `data`; returns the new version. ValueError when `data` exceeds the
/// cell's capacity (the value is then unchanged).
#[pyfunction]
pub fn shared_value_write(py: Python<'_>, buffer: PyRef<'_, Buffer>, data: Vec<u8>) -> PyResult<u64> {
    detached(py, &buffer, move |c| c.write(&data))
}
