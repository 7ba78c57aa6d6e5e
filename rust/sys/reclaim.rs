//! Freeing the space of the files a save replaces or drops, off the save's path. No pyo3.
//!
//! Removing the last name of a big file frees its blocks inside that `unlink` (or inside the
//! `rename` that replaces it): the kernel truncates the file there and, on ext4 mounted with
//! `discard`, TRIMs every freed extent and waits for the device. Measured on the project's
//! machine (ext4 with `discard` on a virtual disk): 1.3-2.0 s inside `unlink(2)` for a
//! written-back 1 GiB file (1 GiB of discard requests in `/sys/block/vda/stat`), 0.4-0.9 s
//! for one still in the page cache (its pages are dropped there). A save that replaced such a
//! file paid it before returning.
//!
//! Here the name goes at once, as before, but a handle on the file ([`Dir::hold`]) keeps it
//! alive; the handles are closed on a background thread, where the freeing happens. Nothing
//! can be left behind: a process that exits or is killed first has its handles closed by the
//! kernel (the space is freed then), and ext4 keeps unlinked open files on its orphan list
//! across a crash. Files below [`HOLD_BYTES`] are removed at once (freeing them is cheap, and
//! thousands of held handles would eat the process's descriptors). A save that needs more
//! space than the file system has left waits for the pending frees first ([`make_room`]).

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use crate::sys::dir::Dir;
#[cfg(any(target_os = "linux", target_os = "android"))]
use crate::sys::pool;

/// Files at least this large are freed in the background.
pub const HOLD_BYTES: u64 = 4 << 20;
/// At most this many files are held by one batch; the rest are removed at once.
#[cfg(any(target_os = "linux", target_os = "android"))]
const MAX_HELD: usize = 64;

/// Bytes held by batches not yet freed, the process that holds them (a forked child holds
/// copies of the parent's handles and has no thread to close them: it does not wait), and a
/// lock and condition to wait on for them.
static PENDING: AtomicU64 = AtomicU64::new(0);
static OWNER: AtomicU32 = AtomicU32::new(0);
static FREED: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

/// Files whose names are gone and whose space is still to be freed.
#[derive(Default)]
pub struct Later {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    held: Vec<std::os::fd::OwnedFd>,
    #[cfg(any(target_os = "linux", target_os = "android"))]
    bytes: u64,
}

impl Later {
    pub fn new() -> Later {
        Later::default()
    }

    /// Keeps the file `name` of `dir` (of `size` bytes) alive for the background, when it is
    /// big enough to be worth it: its name is about to go (a rename over it, or an unlink).
    /// Holds nothing where there is no `O_PATH` or the open fails (the name then frees it).
    pub fn keep(&mut self, dir: &Dir, name: &str, size: u64) {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if size >= HOLD_BYTES && self.held.len() < MAX_HELD {
            if let Ok(fd) = dir.hold(name) {
                self.held.push(fd);
                self.bytes += size;
            }
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let _ = (dir, name, size);
    }

    /// Removes the file `name` of `dir` (of `size` bytes); a big one is freed later.
    pub fn remove_file(&mut self, dir: &Dir, name: &str, size: u64) -> io::Result<()> {
        self.keep(dir, name, size);
        dir.remove_file(name)
    }

    /// Hands the held files to a background thread that closes them (frees their space).
    /// Dropping a `Later` does the same.
    pub fn release(mut self) {
        self.hand_over();
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn hand_over(&mut self) {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return;
        }
        let bytes = std::mem::take(&mut self.bytes);
        let pid = std::process::id();
        if OWNER.swap(pid, Ordering::AcqRel) != pid {
            PENDING.store(0, Ordering::Release); // a forked child's count is not its own
        }
        PENDING.fetch_add(bytes, Ordering::AcqRel);
        let freed = move || {
            drop(held); // the last close of each file: the kernel frees its space here
            let _guard = FREED.0.lock().unwrap_or_else(|e| e.into_inner());
            PENDING.fetch_sub(bytes, Ordering::AcqRel);
            FREED.1.notify_all();
        };
        if let Err(freed) = pool::background("tdrs-reclaim", freed) {
            freed(); // no thread: free here, as a plain unlink would have
        }
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    fn hand_over(&mut self) {}
}

impl Drop for Later {
    fn drop(&mut self) {
        self.hand_over();
    }
}

/// Bytes of replaced files this process still has to free (0 in a forked child).
pub fn pending() -> u64 {
    if OWNER.load(Ordering::Acquire) != std::process::id() {
        return 0;
    }
    PENDING.load(Ordering::Acquire)
}

/// Waits until every file handed over so far is freed.
pub fn wait() {
    let mut guard = FREED.0.lock().unwrap_or_else(|e| e.into_inner());
    while pending() > 0 {
        guard = FREED.1.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}

/// Before writing `need` bytes under `dir`: waits for the pending frees when the file
/// system has less than that left (they may be what makes the room).
pub fn make_room(dir: &Dir, need: u64) {
    if pending() == 0 {
        return;
    }
    match dir.free_space() {
        Ok(free) if free >= need.saturating_add(need / 16) => {}
        _ => wait(),
    }
}

#[cfg(test)]
mod tests;
