//! The locks of a commit: the exclusive lock a save holds on its directory, the shared locks
//! on the trees that hold it, and settling (waiting for or finishing) the commits pending in a
//! directory and in its ancestors before a load or a save. No pyo3.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{journal_present, recover, JOURNAL, SETTLE_TIMEOUT};
use crate::error::{Error, Result};
use crate::format;
use crate::sys::dir::{self, Dir};

/// Before a load: waits for a commit in progress to end, or finishes one whose save died.
pub fn settle(root: &Dir) -> Result<()> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(200);
    loop {
        if !journal_present(root) {
            return Ok(());
        }
        let handle = root.reopen().map_err(|e| Error::io(root.path(), e))?;
        let unlocked_for_long = match handle.lock(true, false) {
            Ok(true) => {
                let result = recover(&handle);
                handle.unlock();
                return result.map(|_| ());
            }
            Ok(false) => false,
            // Without flock we cannot tell a live save from a dead one: give it time.
            Err(e) if dir::locks_unsupported(&e) => start.elapsed() > Duration::from_secs(5),
            Err(e) => return Err(Error::io(root.path(), e)),
        };
        if unlocked_for_long {
            return recover(&handle).map(|_| ());
        }
        if start.elapsed() > SETTLE_TIMEOUT {
            return Err(Error::invalid(
                root.child_path(JOURNAL),
                "a save into this directory has been committing for a minute; try again later",
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Finishes the interrupted or running commits of the trees that hold `target` (its parent
/// directories up the path): a save to `P/sub` or a load of it must not meet `P`'s commit
/// half done in it. One `stat` per level; best effort (a tree this process may not write is
/// left to its owner: its own loads and saves finish it).
pub fn settle_ancestors(target: &Path) {
    for ancestor in target.ancestors().skip(1).take(format::MAX_DEPTH) {
        if std::fs::symlink_metadata(ancestor.join(JOURNAL)).is_ok() {
            if let Ok(dir) = Dir::open(ancestor) {
                // Refused or failed: this save or load goes on as before (see above).
                let _ = settle(&dir);
            }
        }
    }
}

/// Shared locks on the trees that hold a save's prefix (its parent directories that hold a
/// meta.json or a journal), taken top-down before the save's own exclusive lock and held to
/// its end: a save to `P` (exclusive on `P`) and a save to `P/sub` (shared on `P`) run one
/// after the other, saves to `P/a` and `P/b` together. Released on drop. Unix only (Windows
/// locks are files, which would appear in the trees); where a directory cannot be opened or
/// has no `flock`, it is skipped.
pub struct AncestorLocks {
    #[cfg(unix)]
    held: Vec<Dir>,
}

/// True when `dir` holds a tree: a journal or a meta.json. The journal is looked at first and
/// the meta.json last: a commit in the directory moves its meta.json aside only while its
/// journal is there, so (meta.json first) a check that ran across the end of a commit could
/// see neither; this order misses a tree only if another commit got as far as moving the
/// meta.json aside between the two looks (and `AncestorLocks` looks again once it holds its
/// locks).
#[cfg(unix)]
fn holds_tree(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(JOURNAL)).is_ok()
        || std::fs::symlink_metadata(dir.join(format::META_FILE)).is_ok()
}

impl AncestorLocks {
    /// Finishes the ancestors' pending commits (`settle_ancestors`), then takes the locks; if
    /// one of them still has a journal once locked (a save died in its commit meanwhile), or
    /// an ancestor left out turns out to hold a tree once the others are locked, lets go and
    /// starts again (a few times, then goes on with what it holds).
    pub fn acquire(target: &Path) -> AncestorLocks {
        #[cfg(unix)]
        {
            let ancestors: Vec<&Path> = target.ancestors().skip(1).take(format::MAX_DEPTH).collect();
            let mut held = Vec::new();
            for _ in 0..5 {
                let trees: Vec<&Path> = ancestors.iter().copied().filter(|a| holds_tree(a)).collect();
                settle_ancestors(target);
                held.clear();
                let mut pending = false;
                for ancestor in trees.iter().rev() {
                    let Ok(dir) = Dir::open(ancestor) else { continue };
                    if !matches!(dir.lock(false, true), Ok(true)) {
                        continue;
                    }
                    pending = journal_present(&dir);
                    held.push(dir);
                    if pending {
                        break;
                    }
                }
                let missed = || ancestors.iter().any(|a| !trees.contains(a) && holds_tree(a));
                if !pending && !missed() {
                    break;
                }
            }
            AncestorLocks { held }
        }
        #[cfg(not(unix))]
        {
            settle_ancestors(target);
            AncestorLocks {}
        }
    }
}

#[cfg(unix)]
impl Drop for AncestorLocks {
    fn drop(&mut self) {
        for dir in self.held.iter().rev() {
            dir.unlock();
        }
    }
}

/// The exclusive lock a save holds on its target directory for its whole run; released on
/// drop. Where the file system has no `flock` the save runs without it.
pub struct SaveLock {
    dir: Option<Dir>,
}

impl SaveLock {
    /// Waits for other saves to the same directory to finish, then holds it.
    pub fn acquire(root: &Dir) -> Result<SaveLock> {
        let handle = root.reopen().map_err(|e| Error::io(root.path(), e))?;
        match handle.lock(true, true) {
            Ok(_) => Ok(SaveLock { dir: Some(handle) }),
            Err(e) if dir::locks_unsupported(&e) => Ok(SaveLock { dir: None }),
            Err(e) => Err(Error::io(root.path(), e)),
        }
    }
}

impl Drop for SaveLock {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            dir.unlock();
        }
    }
}
