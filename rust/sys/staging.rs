//! The staging files of one-file saves (`.tdz` archives, `.safetensors` files): created beside
//! the target, `flock`ed from creation to the rename, and removed by later saves only when
//! their writer is gone. No pyo3 here.
//!
//! The lock dies with its process, so a later save removes a killed save's staging file when
//! it can take its lock, and never a live one's, whatever machine or pid namespace the writer
//! runs in (pids are reused, and shared file systems span machines: the pid in the name is
//! only for people reading the directory). Only regular files with exactly a staging name
//! are opened; nothing else beside the target is touched.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::sys::dir::{self, Dir, EntryKind};
use crate::sys::identity;
use crate::sys::storage;

/// The name of a staging file of a save to `base`: `.{base}.tdrs-{pid}-{16 hex digits}`.
fn staging_name(base: &str) -> String {
    format!(".{base}.tdrs-{}-{}", std::process::id(), storage::random_suffix())
}

/// The writer's pid when `name` is exactly a staging name of a save to `base`.
fn staging_pid(name: &str, base: &str) -> Option<u32> {
    let rest = name.strip_prefix(&format!(".{base}.tdrs-"))?;
    let (pid, suffix) = rest.split_once('-')?;
    let hex = suffix.len() == 16 && suffix.bytes().all(|c| c.is_ascii_hexdigit());
    let digits = !pid.is_empty() && pid.bytes().all(|c| c.is_ascii_digit());
    (hex && digits).then(|| pid.parse().ok()).flatten()
}

/// `flock` on a file: exclusive, waiting or not. Ok(false): another open of it holds the
/// lock; an error where the file system has no such locks (then nobody can tell a live save
/// from a dead one, and staging files are never removed by others).
#[cfg(unix)]
fn lock_file(file: &File, wait: bool) -> io::Result<bool> {
    use rustix::fs::{flock, FlockOperation};
    let op = if wait {
        FlockOperation::LockExclusive
    } else {
        FlockOperation::NonBlockingLockExclusive
    };
    loop {
        match flock(file, op) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(false),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(not(unix))]
fn lock_file(_file: &File, _wait: bool) -> io::Result<bool> {
    Err(io::ErrorKind::Unsupported.into())
}

/// Whether `name` in `parent` is still the very file `file` is open on.
fn still_named(parent: &Dir, name: &str, file: &File) -> bool {
    let Ok(Some(st)) = parent.stat(name) else {
        return false;
    };
    identity::of_file(file).is_ok_and(|id| id == st.id()) && st.kind == EntryKind::File
}

/// Creates the staging file of a save beside the target and locks it for the whole save (the
/// lock goes with the process: a killed save's file is free to remove, a live one's never).
/// A sweeper of another save may remove the name between the create and the lock: then the
/// name no longer leads to our file, and a fresh one is made.
pub(crate) fn create_staging(parent: &Dir, base: &str) -> Result<(String, File)> {
    let mut tries = 0;
    loop {
        let name = staging_name(base);
        let file = parent
            .create_file(&name)
            .map_err(|e| Error::io(parent.child_path(&name), e))?;
        match lock_file(&file, true) {
            Ok(_) => {}
            Err(e) if dir::locks_unsupported(&e) || e.kind() == io::ErrorKind::Unsupported => {
                return Ok((name, file));
            }
            Err(e) => {
                // The file we just created under our own unique staging name, still empty:
                // if it cannot go, the next save's sweep removes it; nothing of the user's.
                let _ = parent.remove_file(&name);
                return Err(Error::io(parent.child_path(&name), e));
            }
        }
        tries += 1;
        if still_named(parent, &name, &file) || tries >= 8 {
            return Ok((name, file));
        }
    }
}

/// Removes staging files of earlier saves to `base` whose writer is gone (killed mid-save):
/// only regular files with exactly our staging name whose lock this process can take, and
/// that the name still leads to once locked. Files with this process's pid are left alone:
/// where `flock` is emulated by POSIX record locks (NFS), locks do not conflict within one
/// process, so a concurrent save of our own could look dead. Everything else in the
/// directory is never opened.
pub(crate) fn sweep_stale(parent: &Dir, base: &str) {
    let Ok(names) = parent.entry_names() else { return };
    for name in names {
        let Some(pid) = staging_pid(&name, base) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        // Regular files only (no symlink is followed); never blocks on a FIFO.
        let Ok((file, _)) = parent.open_file(&name) else {
            continue;
        };
        if !matches!(lock_file(&file, false), Ok(true)) {
            continue; // a live save holds it, or there is no way to tell
        }
        if still_named(parent, &name, &file) {
            // A dead save's own staging file (locked by us and still at that name): if the
            // removal fails it stays for a later sweep; it never held the user's data (the
            // target itself is only ever replaced by a rename).
            let _ = parent.remove_file(&name);
        }
    }
}

/// The real file a target names: a symlink given as the target is resolved once.
pub(crate) fn resolve_target(path: &Path) -> Result<PathBuf> {
    let absolute = std::path::absolute(path).map_err(|e| Error::io(path, e))?;
    match std::fs::symlink_metadata(&absolute) {
        Ok(md) if md.file_type().is_symlink() => {
            std::fs::canonicalize(&absolute).map_err(|e| Error::io(&absolute, e))
        }
        _ => Ok(absolute),
    }
}

#[cfg(all(test, unix))]
mod tests;
