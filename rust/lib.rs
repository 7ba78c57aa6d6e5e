//! tensordict-rs native core: memory maps, the memmap directory format, bulk copies.
//!
//! The modules are layered, each using only those below it (`tools/layers/rust.toml`):
//! `error`; `sys` and `format`; `tree`, `packed` and `safetensors`; `archive`; `report`; and
//! `py`, the pyo3 boundary. Everything but `py` is plain Rust (tested by `cargo test`); this
//! file only exports. Each folder's `mod.rs` says in its first two lines what it owns and
//! what it may use.
//!
//! Tests: the unit tests of a module `m` are its child module `tests`, in the file
//! `m/tests.rs` (the layout of Rust's standard library), never inline; the tests that only
//! Windows runs (under Wine, `.ci/windows`) are `tree/windows_tests.rs`.

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
use pyo3::types::PyTuple;

#[cfg(feature = "python")]
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    use py::{
        archive, errors, gather, info, memmap, nontensor, packed, progress, ring, safetensors, shared_value,
        sharing, tree,
    };
    let py = m.py();
    m.add_class::<py::buffer::Buffer>()?;
    m.add_function(wrap_pyfunction!(py::buffer::borrow_buffer, m)?)?;
    // directories
    m.add_function(wrap_pyfunction!(tree::write_tree, m)?)?;
    m.add_function(wrap_pyfunction!(tree::load_tree, m)?)?;
    m.add_function(wrap_pyfunction!(tree::verify_tree, m)?)?;
    m.add_function(wrap_pyfunction!(tree::flush_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(tree::wait_freed, m)?)?;
    m.add_function(wrap_pyfunction!(tree::encode_key, m)?)?;
    // memory-mapped tensors
    m.add_function(wrap_pyfunction!(memmap::anonymous_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(memmap::write_file, m)?)?;
    m.add_function(wrap_pyfunction!(memmap::open_file, m)?)?;
    // growth in place, incremental checkpoints
    m.add_function(wrap_pyfunction!(py::grow::reserve_file, m)?)?;
    m.add_function(wrap_pyfunction!(py::grow::grow_rows, m)?)?;
    m.add_function(wrap_pyfunction!(py::grow::sync_file, m)?)?;
    m.add_function(wrap_pyfunction!(py::grow::chunk_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(py::grow::exchange_dirs, m)?)?;
    m.add_function(wrap_pyfunction!(py::grow::rename_new, m)?)?;
    // sharing across processes
    #[cfg(unix)]
    m.add_function(wrap_pyfunction!(sharing::receive_shared, m)?)?;
    #[cfg(unix)]
    m.add_function(wrap_pyfunction!(sharing::shared_regions, m)?)?;
    #[cfg(unix)]
    m.add_function(wrap_pyfunction!(sharing::group_shared, m)?)?;
    m.add_function(wrap_pyfunction!(sharing::open_files, m)?)?;
    // .tdz archives
    m.add_function(wrap_pyfunction!(archive::write_archive, m)?)?;
    m.add_function(wrap_pyfunction!(archive::load_archive, m)?)?;
    m.add_function(wrap_pyfunction!(archive::is_archive, m)?)?;
    m.add_function(wrap_pyfunction!(archive::refresh_archive_checksums, m)?)?;
    m.add_function(wrap_pyfunction!(archive::verify_archive, m)?)?;
    m.add_function(wrap_pyfunction!(archive::reopen_archive, m)?)?;
    // .safetensors files
    m.add_function(wrap_pyfunction!(safetensors::read_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::write_safetensors, m)?)?;
    // the command line's info
    m.add_function(wrap_pyfunction!(info::tree_summary, m)?)?;
    m.add_function(wrap_pyfunction!(info::tree_report, m)?)?;
    // progress bars
    m.add_class::<progress::ProgressCounter>()?;
    // batches of rows
    m.add_function(wrap_pyfunction!(gather::gather_rows, m)?)?;
    m.add_function(wrap_pyfunction!(gather::gather_prepare, m)?)?;
    m.add_function(wrap_pyfunction!(gather::same_entries, m)?)?;
    // packed columns of strings (NonTensorStack)
    m.add_function(wrap_pyfunction!(nontensor::decode_strings, m)?)?;
    m.add_function(wrap_pyfunction!(nontensor::strings_json, m)?)?;
    m.add_function(wrap_pyfunction!(nontensor::str_list_json, m)?)?;
    m.add_function(wrap_pyfunction!(nontensor::rewrite_stack, m)?)?;
    m.add_function(wrap_pyfunction!(nontensor::rewrite_non_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(nontensor::value_meta_token, m)?)?;
    m.add_function(wrap_pyfunction!(nontensor::write_stack_dir, m)?)?;
    m.add_function(wrap_pyfunction!(nontensor::load_stack_dir, m)?)?;
    // non-tensor values shared between processes
    m.add_function(wrap_pyfunction!(shared_value::shared_value_header, m)?)?;
    m.add_function(wrap_pyfunction!(shared_value::shared_value_version, m)?)?;
    m.add_function(wrap_pyfunction!(shared_value::shared_value_read, m)?)?;
    m.add_function(wrap_pyfunction!(shared_value::shared_value_write, m)?)?;
    m.add_function(wrap_pyfunction!(shared_value::shared_value_lock, m)?)?;
    m.add_function(wrap_pyfunction!(shared_value::shared_value_unlock, m)?)?;
    m.add_function(wrap_pyfunction!(shared_value::shared_value_write_if, m)?)?;
    // a tree as one message
    m.add_class::<packed::PackedTable>()?;
    m.add_function(wrap_pyfunction!(packed::copy_packed, m)?)?;
    m.add_function(wrap_pyfunction!(packed::describe_tree, m)?)?;
    m.add_function(wrap_pyfunction!(packed::build_packed_tree, m)?)?;
    m.add_function(wrap_pyfunction!(packed::packed_arena, m)?)?;
    // the DataLoader ring
    m.add_function(wrap_pyfunction!(ring::ring_acquire, m)?)?;
    m.add_function(wrap_pyfunction!(ring::ring_transition, m)?)?;
    m.add_function(wrap_pyfunction!(ring::ring_state, m)?)?;
    // exceptions
    m.add("TensorDictError", py.get_type::<errors::TensorDictError>())?;
    m.add(
        "InvalidDirectoryError",
        py.get_type::<errors::InvalidDirectoryError>(),
    )?;
    m.add(
        "UnsupportedFormatError",
        py.get_type::<errors::UnsupportedFormatError>(),
    )?;
    m.add("InvalidTreeError", py.get_type::<errors::InvalidTreeError>())?;
    m.add("FileExistsRuntimeError", errors::file_exists_runtime_error(py)?)?;
    m.add("SymlinkError", errors::symlink_error(py)?)?;
    m.add("LockedError", errors::locked_error(py)?)?;
    // constants that Python shares with this crate, defined here once
    m.add("FORMAT_VERSION", format::FORMAT_VERSION)?;
    m.add("RESERVED_KEYS", PyTuple::new(py, format::RESERVED_KEYS)?)?;
    m.add("MAX_DEPTH", format::MAX_DEPTH)?;
    m.add("TENSORCLASS_DIR", format::TENSORCLASS_DIR)?;
    m.add("DTYPES", PyTuple::new(py, format::DTYPES.iter().map(|d| d.name))?)?;
    m.add("LEAF", tree::LEAF)?;
    m.add("NODE", tree::NODE)?;
    m.add("NON_TENSOR", tree::NON_TENSOR)?;
    m.add("STACK", tree::STACK)?;
    m.add("ALIGN", crate::packed::ALIGN)?;
    m.add("DESCRIPTION_LIMIT", crate::packed::DESCRIPTION_LIMIT)?;
    m.add("JSON_DEPTH", crate::packed::JSON_DEPTH)?;
    m.add("NUMBER_KEY", crate::packed::NUMBER_TOKEN)?;
    m.add("MAGIC", crate::packed::MAGIC)?;
    m.add("REFUSED", crate::packed::REFUSED)?;
    m.add("PIECE_BYTES", crate::packed::PIECE_BYTES)?;
    m.add("PARALLEL_BYTES", sys::gather::PARALLEL_MIN)?;
    m.add("BULK_ROW", sys::gather::BULK_MIN)?;
    Ok(())
}
