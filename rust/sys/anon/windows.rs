//! Anonymous shared memory on Windows: pagefile-backed maps (memmap2 uses `CreateFileMappingW`
//! with `INVALID_HANDLE_VALUE`), tested under Wine (`tree/windows_tests.rs`). They hold no
//! handle once mapped, and nothing passes them to another process.

use std::sync::Arc;

use super::{arena_layout, Arenas};
use crate::error::{Error, Result};
use crate::sys::storage::{self, Region};

/// Anonymous shared memory of `len` bytes, filled from `src` or zeroed.
pub fn anonymous(src: Option<&[u8]>, len: usize) -> Result<Region> {
    let name = std::env::temp_dir().join(format!(
        "tdrs-{}-{}",
        std::process::id(),
        storage::random_suffix()
    ));
    let region = storage::map_anonymous(len).map_err(|e| Error::io(&name, e))?;
    if let Some(data) = src {
        // SAFETY: the fresh map spans `len` writable bytes and `data.len() == len`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), region.as_ptr(), data.len()) };
    }
    Ok(region)
}

/// One pagefile-backed arena holding `parts` (`(data, len)`, data `None`: zeros), and where
/// each part went: `(0, offset)`. `num_threads` is unused: the parts are copied in on this
/// thread (there is no shmem inode to write, as on Unix).
pub fn create(parts: &[(Option<&[u8]>, usize)], num_threads: usize) -> Result<Arenas> {
    let _ = num_threads;
    let (offsets, total) = arena_layout(parts)?;
    let region = anonymous(None, total)?;
    for (&(data, _), &off) in parts.iter().zip(&offsets) {
        if let Some(data) = data {
            // SAFETY: `off + data.len() <= total`, the map's length, and the map is fresh.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), region.as_ptr().add(off), data.len()) };
        }
    }
    Ok((
        vec![Arc::new(region)],
        offsets.into_iter().map(|off| (0, off)).collect(),
    ))
}
