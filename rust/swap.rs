//! Putting a staged tree in place of a directory, atomically. No pyo3 here.
//!
//! `renameat2(RENAME_EXCHANGE)` on Linux swaps the staged tree and the old one in one step; where
//! the file system lacks it the old directory is renamed aside first. Entries of the old
//! directory that its tree does not own (a user's files) are moved into the new one, and
//! staging directories left behind by killed saves are cleaned up by the next save.

use std::collections::HashSet;
use std::io;
use std::path::Path;

use serde_json::Value;

use crate::dir::{Dir, EntryKind};
use crate::error::{Error, Result};
use crate::layout;
use crate::save::SaveOptions;
use crate::storage;

/// Name of the marker file of an unfinished staging directory.
pub const STAGING_MARKER: &str = ".tdrs-staging";

/// Cleans up after earlier saves to the same target whose process is gone (killed mid-save);
/// those of live processes are left alone. A directory still marked as unfinished staging is
/// deleted; any other (a finished tree, or the old tree swapped out but not yet cleaned up,
/// which may hold a user's files) first has its foreign entries moved into the target.
pub fn sweep_stale_staging(parent: &Dir, base: &str, target: &Path) {
    let prefix = format!(".{base}.tdrs-");
    let Ok(names) = parent.entry_names() else { return };
    for name in names {
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let rest = rest.strip_prefix("old-").unwrap_or(rest);
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !process_alive(pid) {
            let stale = parent.child_path(&name);
            let unfinished = Dir::open(&stale)
                .and_then(|d| d.kind(STAGING_MARKER))
                .is_ok_and(|k| k == EntryKind::File);
            if !unfinished {
                carry_over(&stale, target);
            }
            let _ = std::fs::remove_dir_all(&stale);
        }
    }
}

#[cfg(unix)]
pub(crate) fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: kill with signal 0 only checks that the process exists; nothing is sent.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(not(unix))]
pub(crate) fn process_alive(_pid: u32) -> bool {
    true
}

/// Puts the staged tree at `target`, carries foreign entries over, removes the old tree.
pub fn swap_in(
    parent: &Dir,
    staging: &str,
    base: &str,
    target: &Path,
    mut exists: bool,
    opts: SaveOptions,
) -> Result<()> {
    let staged_path = parent.child_path(staging);
    loop {
        if !exists {
            match std::fs::rename(&staged_path, target) {
                Ok(()) => break,
                // Someone created the target meanwhile: replace it like an existing one.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::DirectoryNotEmpty | io::ErrorKind::AlreadyExists
                    ) =>
                {
                    exists = true;
                    continue;
                }
                Err(e) => return Err(Error::io(target, e)),
            }
        }
        match exchange(&staged_path, target) {
            Ok(()) => {
                // `staged_path` now holds the old tree.
                carry_over(&staged_path, target);
                let _ = std::fs::remove_dir_all(&staged_path);
                break;
            }
            Err(e) if exchange_unsupported(&e) => {
                let aside = parent.child_path(&format!(
                    ".{base}.tdrs-old-{}-{}",
                    std::process::id(),
                    storage::random_suffix()
                ));
                std::fs::rename(target, &aside).map_err(|e| Error::io(target, e))?;
                if let Err(e) = std::fs::rename(&staged_path, target) {
                    let _ = std::fs::rename(&aside, target);
                    return Err(Error::io(target, e));
                }
                carry_over(&aside, target);
                let _ = std::fs::remove_dir_all(&aside);
                break;
            }
            Err(e) => return Err(Error::io(target, e)),
        }
    }
    if opts.durable {
        parent.sync().map_err(|e| Error::io(parent.path(), e))?;
    }
    Ok(())
}

/// Moves entries that the old tree does not own into the new one (best effort: a name the new
/// tree also uses stays with the old tree and is removed with it).
fn carry_over(old: &Path, new: &Path) {
    let owned = owned_names(old);
    let Ok(entries) = std::fs::read_dir(old) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        if owned.contains(name_str.as_ref()) {
            continue;
        }
        let dest = new.join(&name);
        if std::fs::symlink_metadata(&dest).is_err() {
            let _ = std::fs::rename(entry.path(), dest);
        }
    }
}

/// File names a tree directory owns according to its meta.json.
fn owned_names(dir: &Path) -> HashSet<String> {
    let mut owned: HashSet<String> = [layout::META_FILE.to_string()].into();
    let Ok(handle) = Dir::open(dir) else {
        return owned;
    };
    let Ok(bytes) = handle.read_limited(layout::META_FILE, layout::META_LIMIT) else {
        return owned;
    };
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(&bytes) else {
        return owned;
    };
    for (key, value) in map {
        if let Value::Object(entry) = value {
            if entry.contains_key("type") {
                owned.insert(layout::encode_key(&key));
            } else {
                owned.insert(layout::leaf_file(&key));
            }
        }
    }
    owned
}

#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let ca = std::ffi::CString::new(a.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let cb = std::ffi::CString::new(b.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: two valid C strings; renameat2 reads them and touches no other memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(_a: &Path, _b: &Path) -> io::Result<()> {
    Err(io::ErrorKind::Unsupported.into())
}

fn exchange_unsupported(e: &io::Error) -> bool {
    #[cfg(unix)]
    if matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
    ) {
        return true;
    }
    e.kind() == io::ErrorKind::Unsupported
}
