//! The `#[pyfunction]`s of the DataLoader ring (`share/ring.py`): taking and handing back the
//! slots of a ring whose header words live in a shared Buffer (`sys::ring`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::py::buffer::Buffer;
use crate::sys::ring;

/// Takes the first free slot among the first `count` of the ring whose header is `header`:
/// `(slot, generation)`, or None when every slot is taken.
#[pyfunction]
pub fn ring_acquire(header: &Buffer, count: usize) -> PyResult<Option<(usize, u64)>> {
    // SAFETY: the pointer and length are the Buffer's own, whose map lives while `header` is
    // borrowed; ring headers are only ever touched through these atomics.
    unsafe { ring::acquire(header.as_ptr(), header.len(), count) }.map_err(PyValueError::new_err)
}

/// Moves slot `slot` of generation `generation` from state `from_state` to `to_state` (0 free,
/// 1 held by the worker, 2 sent); False when the slot is in any other generation or state.
#[pyfunction]
pub fn ring_transition(
    header: &Buffer,
    slot: usize,
    generation: u64,
    from_state: u64,
    to_state: u64,
) -> PyResult<bool> {
    // SAFETY: as in `ring_acquire`.
    unsafe {
        ring::transition(
            header.as_ptr(),
            header.len(),
            slot,
            generation,
            from_state,
            to_state,
        )
    }
    .map_err(PyValueError::new_err)
}

/// `(generation, state)` of slot `slot`.
#[pyfunction]
pub fn ring_state(header: &Buffer, slot: usize) -> PyResult<(u64, u64)> {
    // SAFETY: as in `ring_acquire`.
    unsafe { ring::state(header.as_ptr(), header.len(), slot) }.map_err(PyValueError::new_err)
}
