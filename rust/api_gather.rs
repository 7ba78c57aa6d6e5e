//! The `#[pyfunction]`s of the bulk copies (`gather.rs`): batch gathers and the one-message
//! form of a tree. Addresses arrive as ints (`tensor.data_ptr()`); see the SAFETY contract of
//! each function. The copies run with the GIL released.

use std::sync::Arc;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;

use crate::buffer::Buffer;
use crate::gather::{self, Copy, Overlap};
use crate::storage;

fn refuse_overlap(what: &str) -> PyErr {
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
/// SAFETY contract: the caller passes addresses of contiguous CPU tensors (`data_ptr()`) of
/// at least those sizes and keeps them referenced until the call returns.
#[pyfunction]
pub fn gather_rows(
    py: Python<'_>,
    index_address: usize,
    index_len: usize,
    leaves: Vec<(usize, usize, usize, usize)>,
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
        for &(src, rows, dst, row_bytes) in &leaves {
            gather::row_copies(index, rows, row_bytes, src, dst, &mut copies).map_err(|i| {
                PyIndexError::new_err(format!(
                    "index {i} is out of bounds for dimension 0 with size {rows}"
                ))
            })?;
        }
        // SAFETY: every range lies in a tensor the caller keeps alive (contract above), the
        // rows were bounds-checked by row_copies, and `check` found no destination that
        // overlaps a source; overlapping destinations are copied in order on one thread.
        unsafe { gather::run(&copies, overlap == Overlap::None) };
        Ok(())
    })
}

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

/// One anonymous shared-memory map of `nbytes` (zero-filled) and a Buffer for each
/// `(offset, nbytes)` slice of it (a uint64 buffer of pairs), made with the GIL released.
/// Returns `(whole, slices)`: a tree received as one message lives in `whole`, and each leaf
/// is one slice.
#[pyfunction]
pub fn packed_arena(
    py: Python<'_>,
    nbytes: usize,
    slices: &Bound<'_, PyAny>,
) -> PyResult<(Buffer, Vec<Buffer>)> {
    let table: PyBuffer<u64> = PyBuffer::get(slices)?;
    let flat = table.to_vec(py)?;
    if flat.len() % 2 != 0 {
        return Err(PyValueError::new_err("slices holds (offset, nbytes) pairs"));
    }
    for pair in flat.chunks_exact(2) {
        if pair[0].checked_add(pair[1]).is_none_or(|e| e > nbytes as u64) || pair[1] == 0 {
            return Err(PyValueError::new_err(format!(
                "slice of {} bytes at offset {} does not fit {nbytes} bytes",
                pair[1], pair[0]
            )));
        }
    }
    if nbytes == 0 {
        return Err(PyValueError::new_err("an empty arena has no memory map"));
    }
    let region = Arc::new(py.detach(|| storage::anonymous(None, nbytes))?);
    let whole = Buffer::slice(&region, 0, nbytes);
    let parts = flat
        .chunks_exact(2)
        .map(|p| Buffer::slice(&region, p[0] as usize, p[1] as usize))
        .collect();
    Ok((whole, parts))
}
