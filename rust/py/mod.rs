//! Owns: the pyo3 boundary: Python arguments in, Python objects out, the GIL released around the work; nothing outside `py/` uses pyo3.
//! Uses: every module below it.

pub mod api;
pub mod buffer;
pub mod errors;
pub mod gather;
pub mod sharing;
