//! Whether a new big file gets its blocks (`fallocate`) before its bytes are written, decided
//! by the file system it is on. No pyo3.
//!
//! Measured on the project's machine (issue 29: 1 GiB written into a new file by one thread,
//! alternated rounds, medians; quiet, 7 rounds): on ext4 `fallocate` then `write(2)` took
//! 0.42 s against 0.49 s for `write(2)` alone, and 0.40 s against 1.12 s in the rounds of a
//! re-save (which free a 1 GiB file each); on tmpfs `fallocate` first made it slower (0.78 s
//! against 0.69 s: a tmpfs page allocated ahead is zeroed, then written again). Two writers
//! at two offsets of one file were never faster than one (ext4 0.45 s, tmpfs 0.74 s), so a
//! big leaf keeps one writer. Under load the CPU time tells the same: our 1 GiB save took
//! 0.66 s of CPU with `fallocate`, 0.79 s without.
//!
//! Why it helps on ext4: 89-93% of such a write is the copy into new page-cache pages, the
//! same either way; without `fallocate` each page also goes through delayed allocation (a
//! block reservation and a delayed extent per page: ~4% of the write's CPU time, and the
//! allocation later at writeback), with it the pages fall in one unwritten extent (~1%).
//!
//! The guarantees stay: a full disk fails the `fallocate` with `ENOSPC` (before anything is
//! written, so the caller's error names the file and its staged copy goes), and the write
//! that follows cannot fail for space. File systems without `fallocate` write as before.
//!
//! `TDRS_PREALLOCATE` (`auto`, the default; `always`; `never`) overrides the choice, for
//! benchmarks that compare both ways in one process, and for file systems not measured here.

use std::fs::File;
use std::io;

/// Files at least this large are preallocated (on the file systems where it helps): below
/// it the extra system call costs more than the per-page allocation work it saves.
pub const PREALLOCATE_BYTES: usize = 64 << 20;

/// What `TDRS_PREALLOCATE` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// By file system and size (the default).
    Auto,
    /// Every file with bytes, on every file system that has `fallocate`.
    Always,
    /// Never: the pages are allocated by the writes.
    Never,
}

/// The policy in `TDRS_PREALLOCATE` (`auto` when unset or not understood).
pub fn policy() -> Policy {
    match std::env::var("TDRS_PREALLOCATE").as_deref() {
        Ok("always") | Ok("1") => Policy::Always,
        Ok("never") | Ok("0") => Policy::Never,
        _ => Policy::Auto,
    }
}

/// File systems whose files live in memory (tmpfs, ramfs, hugetlbfs): preallocating there
/// only zeroes pages the write then fills. Copy-on-write file systems (btrfs) are left as
/// they are too: a preallocated extent there is written in place, without compression, and
/// nothing was measured on them.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn helps_on(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    const BTRFS_MAGIC: i64 = 0x9123_683e;
    match rustix::fs::fstatfs(file) {
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
        Ok(st) => !matches!(
            st.f_type as i64,
            TMPFS_MAGIC | RAMFS_MAGIC | HUGETLBFS_MAGIC | BTRFS_MAGIC
        ),
        Err(_) => false,
    }
}

/// Whether a new file of `len` bytes on `file`'s file system should be preallocated.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn wanted(file: &File, len: usize) -> bool {
    decide(policy(), file, len)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn decide(policy: Policy, file: &File, len: usize) -> bool {
    if len == 0 {
        return false;
    }
    match policy {
        Policy::Never => false,
        Policy::Always => true,
        Policy::Auto => len >= PREALLOCATE_BYTES && helps_on(file),
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn wanted(_file: &File, _len: usize) -> bool {
    false
}

/// Gives the first `len` bytes of the new, empty `file` their blocks when [`wanted`]
/// (`fallocate`, which also sets the size to `len`). Returns whether it did; a file system
/// without `fallocate` is no error (the writes allocate). `ENOSPC` is returned as it is.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn preallocate(file: &File, len: usize) -> io::Result<bool> {
    preallocate_range(file, 0, len as u64, len)
}

/// As [`preallocate`] for the range `offset..offset + len` of a file whose whole size is
/// `total` (the size decides, as for one file): an archive's body, whose small parts are
/// written by other jobs.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn preallocate_range(file: &File, offset: u64, len: u64, total: usize) -> io::Result<bool> {
    use rustix::fs::{fallocate, FallocateFlags};
    if len == 0 || !wanted(file, total) {
        return Ok(false);
    }
    match fallocate(file, FallocateFlags::empty(), offset, len) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn preallocate(_file: &File, _len: usize) -> io::Result<bool> {
    Ok(false)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn preallocate_range(_file: &File, _offset: u64, _len: u64, _total: usize) -> io::Result<bool> {
    Ok(false)
}

// Every test here exercises fallocate and the file-system check, which Linux has.
#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests;
