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
//! On tmpfs that holds while the file fits easily in free memory, and turns when it does not:
//! a write that takes most of the free memory allocates its pages one at a time against the
//! reclaim of other pages, while `fallocate` takes them in one pass first. Measured here (a
//! plain `pwrite` of N GiB into /dev/shm, with and without `fallocate`, alternated, 3 rounds,
//! medians, with a resident source of B GiB taking memory first; thread CPU seconds): 4 GiB
//! with 9.3 GiB free (43%) 1.64 against 1.46 s; 4 GiB with 7 GiB free (57%) 3.97 against
//! 1.62 s; 2 GiB with 3 GiB free (66%) 1.51 against 0.71 s; 8 GiB with 10 GiB free (80%)
//! 8.31 against 3.18 s; 1-4 GiB with 10-18 GiB free (5-40%) within 5-15% either way. So a
//! tmpfs file is preallocated when it is more than half of the free memory
//! ([`TMPFS_FREE_SHARE`]).
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

/// On tmpfs a file is preallocated when it is larger than this share of the free memory
/// (see the module's measurements).
pub const TMPFS_FREE_SHARE: f64 = 0.5;

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

/// Whether preallocating a file of `len` bytes helps on `file`'s file system. Files in
/// memory (tmpfs, ramfs, hugetlbfs): a page allocated ahead is zeroed, then written again, so
/// only tmpfs, and only for a file larger than [`TMPFS_FREE_SHARE`] of the free memory, where
/// allocating the pages in one pass beats allocating them against reclaim. Copy-on-write file
/// systems (btrfs) are left as they are: a preallocated extent there is written in place,
/// without compression, and nothing was measured on them. Others (ext4, xfs, ...): yes.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn helps_on(file: &File, len: usize) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    const BTRFS_MAGIC: i64 = 0x9123_683e;
    match rustix::fs::fstatfs(file) {
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
        Ok(st) => match st.f_type as i64 {
            TMPFS_MAGIC => free_memory().is_some_and(|free| len as f64 > free as f64 * TMPFS_FREE_SHARE),
            RAMFS_MAGIC | HUGETLBFS_MAGIC | BTRFS_MAGIC => false,
            _ => true,
        },
        Err(_) => false,
    }
}

/// The free memory in bytes (`MemFree`: not counting caches the kernel can reclaim).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn free_memory() -> Option<u64> {
    let mut info = std::mem::MaybeUninit::<libc::sysinfo>::uninit();
    // SAFETY: sysinfo writes the whole struct it is given, and reads nothing from it.
    if unsafe { libc::sysinfo(info.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: the call succeeded, so the struct is written.
    let info = unsafe { info.assume_init() };
    #[allow(clippy::useless_conversion)] // c_ulong is u32 on 32-bit targets
    Some(u64::from(info.freeram).saturating_mul(u64::from(info.mem_unit)))
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
        Policy::Auto => len >= PREALLOCATE_BYTES && helps_on(file, len),
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
