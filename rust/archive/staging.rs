//! The staging files of archive saves: created beside the target, `flock`ed from creation to
//! the rename, and removed by later saves only when their writer is gone. No pyo3 here.
//!
//! The lock dies with its process, so a later save removes a killed save's staging file when
//! it can take its lock, and never a live one's, whatever machine or pid namespace the writer
//! runs in (pids are reused, and shared file systems span machines: the pid in the name is
//! only for people reading the directory). Only regular files with exactly a staging name
//! are opened; nothing else beside the archive is touched.

use std::fs::File;
use std::io;

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
            // archive itself is only ever replaced by a rename).
            let _ = parent.remove_file(&name);
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::archive::tests::{opts, sample, tmp};
    use crate::archive::{write_archive, Compression};

    #[test]
    fn staging_names_are_exact() {
        let own = staging_name("t.tdz");
        assert_eq!(staging_pid(&own, "t.tdz"), Some(std::process::id()));
        for name in [
            ".t.tdz.tdrs-12-0123456789abcdef0",
            ".t.tdz.tdrs-12-0123456789abcdeg",
            ".t.tdz.tdrs--0123456789abcdef",
            ".t.tdz.tdrs-x1-0123456789abcdef",
            "t.tdz.tdrs-12-0123456789abcdef",
            ".u.tdz.tdrs-12-0123456789abcdef",
        ] {
            assert_eq!(staging_pid(name, "t.tdz"), None, "{name}");
        }
    }

    /// A live writer's staging file is kept whatever its pid says (here a pid no process has,
    /// as a writer on another machine would show); a dead one's is removed even when its pid
    /// is a live process's (pid 1, as a reused pid would be); nothing else is touched.
    #[test]
    fn only_unlocked_staging_files_are_swept() {
        let target = tmp("t.tdz");
        let dir = target.parent().unwrap().to_path_buf();
        let name = |pid: u32, suffix: &str| format!(".t.tdz.tdrs-{pid}-{suffix}");
        let live = name(2_147_483_000, "00000000000000aa"); // no such process
        let dead = name(1, "00000000000000bb");
        let own = name(std::process::id(), "00000000000000cc");
        std::fs::write(dir.join(&live), b"live").unwrap();
        std::fs::write(dir.join(&dead), b"dead").unwrap();
        std::fs::write(dir.join(&own), b"own").unwrap();
        let holder = File::open(dir.join(&live)).unwrap();
        assert!(lock_file(&holder, false).unwrap());
        // The user's files: near-miss names, a symlink and a directory with staging names.
        let user = [
            ".t.tdz.tdrs-12-0123456789abcdef0",
            ".t.tdz.tdrs-x-0123456789abcdef",
            ".u.tdz.tdrs-12-0123456789abcdef",
            "notes.txt",
        ];
        for n in user {
            std::fs::write(dir.join(n), n).unwrap();
        }
        let link = name(2, "00000000000000dd");
        std::os::unix::fs::symlink(dir.join("notes.txt"), dir.join(&link)).unwrap();
        let sub = name(3, "00000000000000ee");
        std::fs::create_dir(dir.join(&sub)).unwrap();

        let data = vec![vec![1u8; 12], vec![2u8; 6]];
        let (root, leaves) = sample(&data);
        write_archive(&target, &root, &leaves, opts(Compression::Stored)).unwrap();
        assert!(
            dir.join(&live).exists(),
            "a live writer's staging file was removed"
        );
        assert!(!dir.join(&dead).exists(), "a dead writer's staging file was kept");
        assert!(dir.join(&own).exists(), "this process's own pid is never swept");
        for n in user {
            assert_eq!(std::fs::read(dir.join(n)).unwrap(), n.as_bytes(), "{n}");
        }
        assert!(std::fs::symlink_metadata(dir.join(&link)).unwrap().is_symlink());
        assert!(dir.join(&sub).is_dir());

        drop(holder); // the writer dies: its lock goes with it
        write_archive(&target, &root, &leaves, opts(Compression::Stored)).unwrap();
        assert!(!dir.join(&live).exists());
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| staging_pid(n, "t.tdz").is_some_and(|p| p != std::process::id()))
            .collect();
        left.sort();
        assert_eq!(left, [link, sub]);
    }

    /// While a save runs, its staging file is locked: another open cannot take the lock.
    #[test]
    fn the_staging_file_is_locked_while_written() {
        let target = tmp("w.tdz");
        let parent = Dir::open(target.parent().unwrap()).unwrap();
        let (name, file) = create_staging(&parent, "w.tdz").unwrap();
        let other = File::open(parent.child_path(&name)).unwrap();
        assert!(!lock_file(&other, false).unwrap());
        drop(file);
        assert!(lock_file(&other, false).unwrap());
    }
}
