//! Owns: the pyo3 boundary: Python arguments in, Python objects out, the GIL released around the work; nothing outside `py/` uses pyo3.
//! Uses: every module below it.
//!
//! One file per Python-facing concern, each converting plain Python values (ints, strs,
//! tuples, lists, buffers) at the boundary with one call per tree: `tree` (directories:
//! `_tree.py`, `_persistence.py`, `verify.py`), `memmap` (`memmap.py`), `sharing`
//! (`_sharing.py`), `archive` (`_archive.py`), `safetensors` (`_safetensors.py`), `info` (the
//! command line), `progress` (`_progress.py`), `gather` (`_gather.py`), `packed` (`_packed.py`,
//! `_stream.py`), `ring` (`share/ring.py`), `nontensor` (the packed string columns of
//! `_core/nontensor.py`), `shared_value` (the shared non-tensor values of `_core/shared_value.py`);
//! `buffer` is
//! the object every one of them returns, `errors` the exceptions.
//! `lib.rs` registers them all in the `_native` module.

pub mod archive;
pub mod buffer;
pub mod errors;
pub mod gather;
pub mod grow;
pub mod info;
pub mod memmap;
pub mod nontensor;
pub mod packed;
pub mod progress;
pub mod ring;
pub mod safetensors;
pub mod shared_value;
pub mod sharing;
pub mod tree;

/// Builds a byte slice from a source pointer handed over by the Python layer.
///
/// # Safety
/// `ptr` must be 0 (no data) or point to `nbytes` readable bytes that stay alive and are not
/// freed until the call that uses the slice returns. The Python layer passes `data_ptr()` of a
/// contiguous CPU tensor that it keeps referenced for the whole call.
pub(crate) unsafe fn source_slice<'a>(ptr: usize, nbytes: usize) -> Option<&'a [u8]> {
    if nbytes == 0 {
        return Some(&[]);
    }
    if ptr == 0 {
        return None;
    }
    // SAFETY: guaranteed by the caller, see above.
    Some(unsafe { std::slice::from_raw_parts(ptr as *const u8, nbytes) })
}
