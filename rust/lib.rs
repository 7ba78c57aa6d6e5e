//! tensordict-rs native core: memory maps, the memmap directory format, bulk copies.
//!
//! `storage`, `shared`, `dir`, `layout`, `parallel`, `save`, `commit`, `load`, `summary`,
//! `safetensors_io`, `archive`, `archive_zip`, `archive_tree`, `archive_staging`,
//! `archive_write` and `packed` are plain Rust (tested by `cargo test`);
//! `buffer`, `api` and `api_shared` are the pyo3 boundary; this file only exports.

// The pyo3 boundary is the `python` feature (on by default; off for the Windows tests).
#[cfg(feature = "python")]
pub mod api;
#[cfg(feature = "python")]
pub mod api_gather;
#[cfg(feature = "python")]
pub mod api_shared;
pub mod archive;
pub mod archive_staging;
pub mod archive_tree;
pub mod archive_write;
pub mod archive_zip;
#[cfg(feature = "python")]
pub mod buffer;
pub mod commit;
pub mod dir;
pub mod error;
pub mod gather;
pub mod layout;
pub mod load;
pub mod meta_parse;
pub mod packed;
pub mod parallel;
pub mod safetensors_io;
pub mod save;
#[cfg(unix)]
pub mod shared;
pub mod storage;
pub mod summary;
pub mod summary_render;
#[cfg(all(test, windows))]
mod windows_tests;

#[cfg(feature = "python")]
use pyo3::prelude::*;

#[cfg(feature = "python")]
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<buffer::Buffer>()?;
    m.add_class::<api::ProgressCounter>()?;
    m.add_function(wrap_pyfunction!(api::write_tree, m)?)?;
    m.add_function(wrap_pyfunction!(api::anonymous_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(api::load_tree, m)?)?;
    m.add_function(wrap_pyfunction!(api::verify_tree, m)?)?;
    m.add_function(wrap_pyfunction!(api::write_file, m)?)?;
    m.add_function(wrap_pyfunction!(api::open_file, m)?)?;
    m.add_function(wrap_pyfunction!(api::flush_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(api::encode_key, m)?)?;
    m.add_function(wrap_pyfunction!(api::tree_summary, m)?)?;
    m.add_function(wrap_pyfunction!(api::tree_report, m)?)?;
    m.add_function(wrap_pyfunction!(api::read_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(api::write_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(api_gather::gather_rows, m)?)?;
    m.add_function(wrap_pyfunction!(api_gather::gather_prepare, m)?)?;
    m.add_function(wrap_pyfunction!(api_gather::copy_packed, m)?)?;
    m.add_class::<api_gather::PackedTable>()?;
    m.add_function(wrap_pyfunction!(api_gather::same_entries, m)?)?;
    m.add_function(wrap_pyfunction!(api_gather::describe_tree, m)?)?;
    m.add_function(wrap_pyfunction!(api_gather::build_packed_tree, m)?)?;
    m.add_function(wrap_pyfunction!(api_gather::packed_arena, m)?)?;
    #[cfg(unix)]
    m.add_function(wrap_pyfunction!(api_shared::receive_shared, m)?)?;
    #[cfg(unix)]
    m.add_function(wrap_pyfunction!(api_shared::shared_regions, m)?)?;
    #[cfg(unix)]
    m.add_function(wrap_pyfunction!(api_shared::group_shared, m)?)?;
    m.add_function(wrap_pyfunction!(api_shared::open_files, m)?)?;
    m.add_function(wrap_pyfunction!(api::write_archive, m)?)?;
    m.add_function(wrap_pyfunction!(api::load_archive, m)?)?;
    m.add_function(wrap_pyfunction!(api::is_archive, m)?)?;
    m.add_function(wrap_pyfunction!(api::refresh_archive_checksums, m)?)?;
    m.add_function(wrap_pyfunction!(api::verify_archive, m)?)?;
    m.add_function(wrap_pyfunction!(api::reopen_archive, m)?)?;
    m.add("TensorDictError", py.get_type::<error::TensorDictError>())?;
    m.add(
        "InvalidDirectoryError",
        py.get_type::<error::InvalidDirectoryError>(),
    )?;
    m.add(
        "UnsupportedFormatError",
        py.get_type::<error::UnsupportedFormatError>(),
    )?;
    m.add("InvalidTreeError", py.get_type::<error::InvalidTreeError>())?;
    m.add("FileExistsRuntimeError", error::file_exists_runtime_error(py)?)?;
    m.add("SymlinkError", error::symlink_error(py)?)?;
    m.add("LockedError", error::locked_error(py)?)?;
    m.add("FORMAT_VERSION", layout::FORMAT_VERSION)?;
    Ok(())
}
