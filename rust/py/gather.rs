//! Batches of rows (`_gather.py`): `td[idx]` gathered from every leaf in one call, the copies
//! run by `sys::gather` with the GIL released. Addresses arrive as ints (`tensor.data_ptr()`);
//! see the SAFETY contract of each function.

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::sys::gather::{self, Overlap};
use crate::sys::pool;

pub(super) fn refuse_overlap(what: &str) -> PyErr {
    PyValueError::new_err(format!(
        "{what}: a destination tensor shares memory with a source tensor"
    ))
}

/// Gathers rows `index` (int64, negative from the end) of every leaf into its output, with
/// the GIL released and the rows copied in parallel; runs of consecutive rows are one copy.
///
/// `leaves` holds `(src_address, rows, dst_address, row_bytes)` per leaf: a contiguous source
/// of `rows` rows and a contiguous destination of `index_len` rows. Raises IndexError for a
/// row out of range (nothing is written then), ValueError when an output overlaps a source.
///
/// With `parallel=False` the rows are copied on the calling thread only (the Python side
/// passes it where torch itself runs on one thread: `torch.set_num_threads(1)`, as in
/// DataLoader workers).
///
/// SAFETY contract: the caller passes addresses of contiguous CPU tensors (`data_ptr()`) of
/// at least those sizes and keeps them referenced until the call returns.
#[pyfunction]
#[pyo3(signature = (index_address, index_len, leaves, parallel = true))]
pub fn gather_rows(
    py: Python<'_>,
    index_address: usize,
    index_len: usize,
    leaves: Vec<(usize, usize, usize, usize)>,
    parallel: bool,
) -> PyResult<()> {
    if index_len > 0 && index_address == 0 {
        return Err(PyValueError::new_err("gather_rows: null index address"));
    }
    let index: &[i64] = if index_len == 0 {
        &[]
    } else {
        // SAFETY: the caller passes the data_ptr of a contiguous int64 tensor of `index_len`
        // elements that it keeps alive for the call (contract above); nothing writes to it
        // (checked below: no destination overlaps it).
        unsafe { std::slice::from_raw_parts(index_address as *const i64, index_len) }
    };
    let size = |n: usize, b: usize| {
        n.checked_mul(b)
            .ok_or_else(|| PyValueError::new_err("gather_rows: size overflows"))
    };
    pool::init();
    let mut dsts = Vec::with_capacity(leaves.len());
    let mut srcs = Vec::with_capacity(leaves.len() + 1);
    srcs.push((index_address, index_len * 8));
    for &(src, rows, dst, row_bytes) in &leaves {
        srcs.push((src, size(rows, row_bytes)?));
        dsts.push((dst, size(index_len, row_bytes)?));
    }
    py.detach(|| {
        let overlap = gather::check(&dsts, &srcs);
        if overlap == Overlap::SourceAndDestination {
            return Err(refuse_overlap("gather_rows"));
        }
        let mut copies = Vec::new();
        // The runs depend on the index and the leaf's row count only: leaves of one tree
        // mostly share it, so the runs are computed once and reused.
        let mut runs: Option<(usize, Vec<gather::Run>)> = None;
        for &(src, rows, dst, row_bytes) in &leaves {
            if runs.as_ref().is_none_or(|(r, _)| *r != rows) {
                let found = gather::row_runs(index, rows).map_err(|i| {
                    PyIndexError::new_err(format!(
                        "index {i} is out of bounds for dimension 0 with size {rows}"
                    ))
                })?;
                runs = Some((rows, found));
            }
            if let Some((_, found)) = &runs {
                gather::run_copies(found, row_bytes, src, dst, &mut copies);
            }
        }
        // SAFETY: every range lies in a tensor the caller keeps alive (contract above), the
        // rows were bounds-checked by row_copies, and `check` found no destination that
        // overlaps a source; overlapping destinations are copied in order on one thread.
        unsafe { gather::run(&copies, parallel && overlap == Overlap::None) };
        Ok(())
    })
}

/// Wakes the copy helper threads ahead of a big `gather_rows` (called while Python allocates
/// the batch, so that their wake-up overlaps that work). Cheap when they are awake already.
#[pyfunction]
pub fn gather_prepare() {
    pool::prepare();
}

/// True when every `(dict, keys, values)` of `nodes` still holds exactly those key and value
/// objects, in that order (a cached plan of the tree is still valid).
///
/// Runs before every message of a tree (10,000 leaves: 10,000 comparisons), so the dicts are
/// walked with borrowed references (`PyDict_Next`): pyo3's iterator takes and drops two
/// references per entry, which was 2/3 of the time.
#[pyfunction]
pub fn same_entries(nodes: &Bound<'_, PyList>) -> PyResult<bool> {
    for node in nodes.iter() {
        let node = node.cast_into::<PyTuple>()?;
        let items = node.get_item(0)?.cast_into::<PyDict>()?;
        let keys = node.get_item(1)?.cast_into::<PyTuple>()?;
        let values = node.get_item(2)?.cast_into::<PyTuple>()?;
        let n = items.len();
        if n != keys.len() || n != values.len() {
            return Ok(false);
        }
        let (mut pos, mut i) = (0, 0);
        let (mut key, mut value) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: the GIL is held and no Python code runs in this loop, so the dict cannot
        // change while it is walked; PyDict_Next hands out borrowed references that live as
        // long as the dict.
        while unsafe { pyo3::ffi::PyDict_Next(items.as_ptr(), &mut pos, &mut key, &mut value) } != 0 {
            // SAFETY: both tuples hold n items (checked above) and i < n, as the dict has n
            // entries; PyTuple_GetItem returns a borrowed reference (or NULL, which no entry is).
            let same = unsafe {
                key == pyo3::ffi::PyTuple_GetItem(keys.as_ptr(), i)
                    && value == pyo3::ffi::PyTuple_GetItem(values.as_ptr(), i)
            };
            if !same {
                return Ok(false);
            }
            i += 1;
        }
    }
    Ok(true)
}
