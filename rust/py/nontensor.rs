//! Packed columns of strings (`_core/nontensor.py`): a NonTensorStack of strings loaded from a
//! directory keeps its values as one UTF-8 buffer and `n + 1` int64 offsets; these functions
//! decode rows of it, and write a column or a list of strings as the JSON of a stack's
//! meta.json, in one call each (the GIL released for the byte work).

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use super::source_slice;
use crate::format::stack::{self, Cells};

/// A column's bytes and offsets as slices, its offsets checked: they start at 0, never go
/// down, and end within the values (a column can come from another process or a message).
///
/// SAFETY contract: the caller passes addresses of contiguous CPU buffers (`data_ptr()` or a
/// bytes object's address) of those sizes that it keeps alive for the call.
fn column<'a>(values: usize, nbytes: usize, offsets: usize, count: usize) -> PyResult<(&'a [u8], &'a [i64])> {
    // SAFETY: see the contract above.
    let bytes = unsafe { source_slice(values, nbytes) }.unwrap_or(&[]);
    if offsets == 0 || count == 0 {
        return Err(PyValueError::new_err("a string column needs at least one offset"));
    }
    if offsets % std::mem::align_of::<i64>() != 0 {
        return Err(PyValueError::new_err(
            "the offsets of a string column are not aligned",
        ));
    }
    // SAFETY: see the contract above; the address is aligned for i64 (checked).
    let offsets = unsafe { std::slice::from_raw_parts(offsets as *const i64, count) };
    if offsets[0] != 0 || offsets.windows(2).any(|w| w[1] < w[0]) || offsets[count - 1] as u64 > nbytes as u64
    {
        return Err(PyValueError::new_err(format!(
            "the offsets of a string column are not increasing from 0 to at most {nbytes}"
        )));
    }
    Ok((bytes, offsets))
}

/// The strings `ids` (row-major cells) of a packed column, as a list.
///
/// `values`/`nbytes` are the UTF-8 bytes, `offsets`/`count` the `n + 1` int64 offsets,
/// `ids`/`n_ids` int64 cell numbers (each in `[0, n)`). Raises IndexError for an id out of
/// range, ValueError for offsets that do not describe the bytes or bytes that are not UTF-8.
/// SAFETY contract: as for every address here, the caller keeps the buffers alive.
#[pyfunction]
pub fn decode_strings<'py>(
    py: Python<'py>,
    values: usize,
    nbytes: usize,
    offsets: usize,
    count: usize,
    ids: usize,
    n_ids: usize,
) -> PyResult<Bound<'py, PyList>> {
    let (bytes, offsets) = column(values, nbytes, offsets, count)?;
    let ids: &[i64] = if n_ids == 0 {
        &[]
    } else {
        if ids == 0 || ids % std::mem::align_of::<i64>() != 0 {
            return Err(PyValueError::new_err("decode_strings: bad ids address"));
        }
        // SAFETY: the caller passes the data_ptr of a contiguous int64 tensor of `n_ids`
        // elements that it keeps alive for the call (contract above).
        unsafe { std::slice::from_raw_parts(ids as *const i64, n_ids) }
    };
    let n = offsets.len() - 1;
    let out = PyList::empty(py);
    for &id in ids {
        let i = usize::try_from(id)
            .ok()
            .filter(|&i| i < n)
            .ok_or_else(|| PyIndexError::new_err(format!("cell {id} is out of range for a column of {n}")))?;
        let cell = &bytes[offsets[i] as usize..offsets[i + 1] as usize];
        let text = std::str::from_utf8(cell).map_err(|e| PyValueError::new_err(format!("cell {i}: {e}")))?;
        out.append(PyString::new(py, text))?;
    }
    Ok(out)
}

/// The JSON text of a packed column of strings laid out as `shape` (nested arrays, as a
/// stack's meta.json holds them); the GIL released while it is written.
/// SAFETY contract: as for `decode_strings`.
#[pyfunction]
pub fn strings_json<'py>(
    py: Python<'py>,
    values: usize,
    nbytes: usize,
    offsets: usize,
    count: usize,
    shape: Vec<u64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let (bytes, offsets) = column(values, nbytes, offsets, count)?;
    let cells = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    if cells != Some(offsets.len() as u64 - 1) {
        return Err(PyValueError::new_err(format!(
            "a column of {} strings does not fill the shape {shape:?}",
            offsets.len() - 1
        )));
    }
    if std::str::from_utf8(bytes).is_err() {
        return Err(PyValueError::new_err(
            "a string column holds bytes that are not UTF-8",
        ));
    }
    let cells = Cells::Strings {
        bytes: bytes.to_vec(),
        offsets: offsets.to_vec(),
    };
    let out = py.detach(|| {
        let mut out = Vec::with_capacity(bytes.len() + 3 * offsets.len());
        stack::write(&shape, &cells, &mut out);
        out
    });
    Ok(PyBytes::new(py, &out))
}

/// The JSON text of a list of cells laid out as `shape`, when every cell is a `str` (the
/// common case, written here at once); `None` otherwise (the caller writes other JSON).
#[pyfunction]
pub fn str_list_json<'py>(
    py: Python<'py>,
    cells: &Bound<'py, PyList>,
    shape: Vec<u64>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let total = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    if total != Some(cells.len() as u64) {
        return Err(PyValueError::new_err(format!(
            "{} cells do not fill the shape {shape:?}",
            cells.len()
        )));
    }
    let mut bytes = Vec::new();
    let mut offsets = Vec::with_capacity(cells.len() + 1);
    offsets.push(0i64);
    for cell in cells.iter() {
        let Ok(text) = cell.cast::<PyString>() else {
            return Ok(None);
        };
        bytes.extend_from_slice(text.to_str()?.as_bytes());
        offsets.push(bytes.len() as i64);
    }
    let cells = Cells::Strings { bytes, offsets };
    let out = py.detach(|| {
        let mut out = Vec::new();
        stack::write(&shape, &cells, &mut out);
        out
    });
    Ok(Some(PyBytes::new(py, &out)))
}

/// Rewrites the meta.json of the saved NonTensorStack `key` in the directory `parent`
/// (`(stack_dim, device, data_json, shape_or_None)` as `write_tree` takes them), atomically,
/// with the GIL released: how a row written into a saved stack reaches its file.
///
/// `expected`: the token of the meta.json the stack was loaded from (`load_tree(...,
/// tokens=True)`) or last wrote (this function's result, or `value_meta_token` after a
/// save); a meta.json with another token, a newer save's, is refused (`InvalidTreeError`
/// naming it) and kept. None: not checked. Returns the token of the meta.json written.
#[pyfunction]
#[pyo3(signature = (parent, key, stack_dim, device, data, shape, *, durable = false, expected = None))]
#[allow(clippy::too_many_arguments)]
pub fn rewrite_stack(
    py: Python<'_>,
    parent: std::path::PathBuf,
    key: &str,
    stack_dim: i64,
    device: Option<String>,
    data: Vec<u8>,
    shape: Option<Vec<u64>>,
    durable: bool,
    expected: Option<u64>,
) -> PyResult<u64> {
    let meta = stack::meta_bytes(stack_dim, device.as_deref(), &data, shape.as_deref());
    Ok(py.detach(|| crate::tree::save::rewrite_value_dir(&parent, key, &meta, durable, expected))?)
}

/// Rewrites the meta.json of the saved NonTensorData `key` in the directory `parent` with the
/// value `data` (its JSON text), atomically, with the GIL released: how a value written in
/// place into a memory-mapped TensorDict reaches its file, as in tensordict. ValueError when
/// `data` is not JSON; the directory's meta.json must be a NonTensorData's. `expected` and
/// the result: the tokens of the meta.json, as for `rewrite_stack`.
#[pyfunction]
#[pyo3(signature = (parent, key, data, *, durable = false, expected = None))]
pub fn rewrite_non_tensor(
    py: Python<'_>,
    parent: std::path::PathBuf,
    key: &str,
    data: &[u8],
    durable: bool,
    expected: Option<u64>,
) -> PyResult<u64> {
    let value: serde_json::Value =
        serde_json::from_slice(data).map_err(|e| PyValueError::new_err(format!("key {key:?}: {e}")))?;
    let meta = crate::format::write::non_tensor_meta(&value);
    Ok(py.detach(|| crate::tree::save::rewrite_value_meta(&parent, key, &meta, durable, true, expected))?)
}

/// The token of the meta.json of the saved NonTensorStack or NonTensorData `key` in the
/// directory `parent`, as it is now: what a tree that has just saved it passes to its next
/// `rewrite_stack` / `rewrite_non_tensor` as `expected`.
#[pyfunction]
pub fn value_meta_token(py: Python<'_>, parent: std::path::PathBuf, key: &str) -> PyResult<u64> {
    Ok(py.detach(|| crate::tree::save::value_meta_token(&parent, key))?)
}

/// Saves a NonTensorStack on its own in the directory `prefix` (its meta.json only, from
/// `(stack_dim, device, data_json, shape_or_None)` as `rewrite_stack` takes them), atomically,
/// with the GIL released. A directory that holds something else is refused, never replaced.
#[pyfunction]
#[pyo3(signature = (prefix, stack_dim, device, data, shape, *, durable = false))]
pub fn write_stack_dir(
    py: Python<'_>,
    prefix: std::path::PathBuf,
    stack_dim: i64,
    device: Option<String>,
    data: Vec<u8>,
    shape: Option<Vec<u64>>,
    durable: bool,
) -> PyResult<()> {
    let meta = stack::meta_bytes(stack_dim, device.as_deref(), &data, shape.as_deref());
    py.detach(|| crate::tree::stack_dir::write_stack_dir(&prefix, &meta, durable))?;
    Ok(())
}

/// A stack read by `load_stack_dir`: `(shape, device, stack_dim, cells)`.
type LoadedStack<'py> = (Vec<u64>, Option<String>, i64, Bound<'py, PyAny>);

/// Reads the NonTensorStack saved on its own at `prefix`: `(shape, device, stack_dim, cells)`,
/// the cells as a tree load returns a stack's (a packed column of strings, or JSON text).
#[pyfunction]
pub fn load_stack_dir<'py>(py: Python<'py>, prefix: std::path::PathBuf) -> PyResult<LoadedStack<'py>> {
    let stack = py.detach(|| crate::tree::stack_dir::read_stack_dir(&prefix))?;
    let cells = super::tree::cells_to_py(py, &stack.data.cells)?;
    Ok((stack.data.shape, stack.device, stack.stack_dim, cells))
}
