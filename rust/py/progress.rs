//! Progress bars (`_progress.py`): a byte counter that native calls advance from their worker
//! threads while another Python thread reads it.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::sys::progress;

/// A byte counter for progress bars. Used as a context manager around native calls on one
/// thread (`with counter: _native.write_tree(...)`): the calls made inside it advance it from
/// their worker threads with the GIL released (see `sys::progress::counting`), and another Python
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
        progress::set_progress(Some(slf.value.clone()));
        slf
    }

    /// Stops counting this thread's calls.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        progress::set_progress(None);
        false
    }
}
