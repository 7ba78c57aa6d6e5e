//! tensordict-rs native core: memory maps, the memmap directory format, bulk copies.
//!
//! The modules are layered, each using only those below it (`tools/layers/rust.toml`):
//! `error`; `sys` and `format`; `tree`, `packed` and `safetensors`; `archive`; `report`; and
//! `py`, the pyo3 boundary. Everything but `py` is plain Rust (tested by `cargo test`); this
//! file only exports.

pub mod archive;
pub mod error;
pub mod format;
pub mod packed;
// The pyo3 boundary is the `python` feature (on by default; off for the Windows tests).
#[cfg(feature = "python")]
pub mod py;
pub mod report;
pub mod safetensors;
pub mod sys;
pub mod tree;

#[cfg(feature = "python")]
use pyo3::prelude::*;

#[cfg(feature = "python")]
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<py::buffer::Buffer>()?;
    m.add_class::<py::api::ProgressCounter>()?;
    m.add_function(wrap_pyfunction!(py::api::write_tree, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::anonymous_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::load_tree, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::verify_tree, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::write_file, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::open_file, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::flush_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::encode_key, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::tree_summary, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::tree_report, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::read_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::write_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(py::gather::gather_rows, m)?)?;
    m.add_function(wrap_pyfunction!(py::gather::gather_prepare, m)?)?;
    m.add_function(wrap_pyfunction!(py::gather::copy_packed, m)?)?;
    m.add_class::<py::gather::PackedTable>()?;
    m.add_function(wrap_pyfunction!(py::gather::same_entries, m)?)?;
    m.add_function(wrap_pyfunction!(py::gather::describe_tree, m)?)?;
    m.add_function(wrap_pyfunction!(py::gather::build_packed_tree, m)?)?;
    m.add_function(wrap_pyfunction!(py::gather::packed_arena, m)?)?;
    #[cfg(unix)]
    m.add_function(wrap_pyfunction!(py::sharing::receive_shared, m)?)?;
    #[cfg(unix)]
    m.add_function(wrap_pyfunction!(py::sharing::shared_regions, m)?)?;
    #[cfg(unix)]
    m.add_function(wrap_pyfunction!(py::sharing::group_shared, m)?)?;
    m.add_function(wrap_pyfunction!(py::sharing::open_files, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::write_archive, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::load_archive, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::is_archive, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::refresh_archive_checksums, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::verify_archive, m)?)?;
    m.add_function(wrap_pyfunction!(py::api::reopen_archive, m)?)?;
    m.add("TensorDictError", py.get_type::<py::errors::TensorDictError>())?;
    m.add(
        "InvalidDirectoryError",
        py.get_type::<py::errors::InvalidDirectoryError>(),
    )?;
    m.add(
        "UnsupportedFormatError",
        py.get_type::<py::errors::UnsupportedFormatError>(),
    )?;
    m.add("InvalidTreeError", py.get_type::<py::errors::InvalidTreeError>())?;
    m.add(
        "FileExistsRuntimeError",
        py::errors::file_exists_runtime_error(py)?,
    )?;
    m.add("SymlinkError", py::errors::symlink_error(py)?)?;
    m.add("LockedError", py::errors::locked_error(py)?)?;
    m.add("FORMAT_VERSION", format::FORMAT_VERSION)?;
    Ok(())
}
