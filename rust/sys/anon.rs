//! Anonymous shared memory on every platform: arenas that hold many leaves, their layout, and
//! (Unix) their passing between processes. Built on `storage` (maps) and `pool` (one writer
//! thread per arena).
//!
//! An arena is one kernel object holding the parts (leaves) of a call back to back, each at a
//! multiple of [`ARENA_ALIGN`], large ones on their own pages. On Unix it is a memfd or an
//! unlinked file whose descriptor stays open beside the map, so that the memory can be handed
//! to another process (`unix.rs`); on Windows a pagefile-backed map (`windows.rs`). Either way
//! [`create`] makes the arenas of a call and [`anonymous`] one map of one part.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::sys::storage::Region;

#[cfg(unix)]
mod unix;
#[cfg(windows)]
mod windows;

#[cfg(unix)]
pub use unix::{anonymous, create, live_regions, receive, SPLIT_MIN};
#[cfg(windows)]
pub use windows::{anonymous, create};

/// The arenas of a call and where each part went in them: `(arena, offset)`.
pub type Arenas = (Vec<Arc<Region>>, Vec<(usize, usize)>);

/// Alignment of each part inside an arena (a cache line; enough for every dtype).
pub const ARENA_ALIGN: usize = 64;

/// Parts of an arena from this size on get their own pages (and are written in parallel).
pub const LARGE_PART: usize = 1 << 20;

/// Offsets of the parts of an arena and its total length (at least 1 byte): each part at a
/// multiple of `ARENA_ALIGN`, parts of `LARGE_PART` bytes or more on their own pages.
pub(crate) fn arena_layout(parts: &[(Option<&[u8]>, usize)]) -> Result<(Vec<usize>, usize)> {
    const PAGE: usize = 4096;
    let mut offsets = Vec::with_capacity(parts.len());
    let mut end = 0usize;
    for &(_, len) in parts {
        let align = if len >= LARGE_PART { PAGE } else { ARENA_ALIGN };
        let offset = end
            .checked_next_multiple_of(align)
            .ok_or_else(|| Error::tree("<anonymous>", "the tensors are too large to map"))?;
        offsets.push(offset);
        end = offset
            .checked_add(len)
            .ok_or_else(|| Error::tree("<anonymous>", "the tensors are too large to map"))?;
    }
    Ok((offsets, end.max(1)))
}
