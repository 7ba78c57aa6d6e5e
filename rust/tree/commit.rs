//! How a save changes a directory it does not own: staging, the journal, recovery, locks.
//! No pyo3 here.
//!
//! A save keeps the target directory (its inode, mode, owner, mount and the processes whose
//! cwd it is). New files are written first into a hidden staging directory inside the tree,
//! `.tdrs%staging-<random>` (one per mount the tree spans, created with `mkdir`, so never
//! someone else's, mode 0700, `flock`ed while its save lives). The `%s` in the name is not a
//! `%XX` escape, so no encoded key can ever be named like it. The commit writes a journal,
//! `.tdrs%journal`, listing every step still to do, and moves it into the target with one
//! exclusive rename: that is the commit point. The steps (`commit/apply.rs`) then move the
//! root meta.json aside, put each changed file in place, meta.json files last, the root one at
//! the very end, remove what the new tree drops, and the journal goes.
//!
//! The journal is bound to the tree it commits: every staged entry is recorded with its
//! identity (so a step is *proven* done or pending, never assumed), and every directory's
//! meta.json with its identity, size, time and CRC before and after (so a directory that
//! another save wrote since the commit point is never rolled back). A save or load that finds
//! a journal (whose save no longer holds the lock) replays it once it has proven every step;
//! when it cannot (a staging directory it may not open, too few descriptors, a file system of
//! the tree not mounted) it refuses and changes nothing.
//!
//! Saves hold an exclusive `flock` on the target directory from start to end; loads take no
//! lock: they check that no journal appeared and that the meta.json files they read are still
//! the ones in place when they finish, and start again if not.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format;
use crate::sys::dir::{self, Dir, EntryKind, EntryStat};
use crate::sys::identity::Stamp;
use crate::sys::storage;

/// Prefix of a staging directory's name; the random token follows.
pub const STAGING_PREFIX: &str = ".tdrs%staging-";
/// Prefix of the temporary name a single file (`from_tensor(filename=)`) is linked under
/// before it is renamed over an existing file.
pub const TEMP_PREFIX: &str = ".tdrs%tmp-";
/// Name of the journal of a commit in progress, in the target directory.
pub const JOURNAL: &str = ".tdrs%journal";
/// In the root staging directory: the directories (relative paths, one JSON list a line) that
/// hold the save's other staging directories (one per other mount).
const OTHER_STAGINGS: &str = "mounts";
/// The journal while it is written, inside the root staging directory.
pub(crate) const JOURNAL_DRAFT: &str = "journal";
/// Largest journal we read.
const JOURNAL_LIMIT: u64 = 1 << 30;
/// How long a load waits for a commit in progress to finish before giving up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The journal format this version writes: staged entries carry their identity and the
/// directories their meta.json states. Journals without a version (older saves) are replayed
/// on the weaker proof they allow (see `commit/apply.rs`).
pub const JOURNAL_VERSION: u32 = 2;

/// An identity (device, inode).
pub type Identity = (u64, u64);

/// One step of a commit, replayable: each checks whether it is already done.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Op {
    /// Create a directory (done when it exists as a directory).
    Mkdir { path: Vec<String> },
    /// Move the root meta.json into staging directory 0 as `name`, when it still is the one
    /// the plan read: from then on a meta.json at the root can only be another program's.
    Aside { name: String },
    /// Move staged entry `name` of staging directory `stage` to `to`. `id`: the staged
    /// entry's identity (done when `to` holds it, pending while the staging directory does);
    /// `replaces`: the old tree's file at `to` (None: a new name, which is never replaced);
    /// a big one is exchanged with the staged file and freed in the background
    /// (`apply::replace_file`). Journals of issue 29's saves (no version) used `replaces` for
    /// the staged identity; a replay reads them so (`apply::prove`).
    Rename {
        stage: usize,
        name: String,
        to: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<Identity>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replaces: Option<Identity>,
    },
    /// Move the entries of staged directory `name` one by one into the directory at `to`
    /// (a user's directory without a meta.json took the name of a new sub-tree), meta.json
    /// last; each entry with its identity.
    Merge {
        stage: usize,
        name: String,
        to: Vec<String>,
        children: Vec<(String, u64, u64)>,
    },
    /// Remove a file of the old tree, only if it is still that file (device, inode).
    Unlink { path: Vec<String>, dev: u64, ino: u64 },
    /// Remove a directory of the old tree if it is empty (anything foreign keeps it).
    Rmdir { path: Vec<String> },
}

/// A meta.json as the commit saw it: identity, size, modification time and the CRC-32 of its
/// bytes. A replacement changes the identity; an in-place rewrite (the reference writes so)
/// changes the time (and, unless byte-identical, the size or CRC).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileState {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub crc: u32,
}

impl FileState {
    /// The state of a file whose stamp and bytes were read together.
    pub fn of(stamp: Stamp, bytes: &[u8]) -> FileState {
        let mut h = crc32fast::Hasher::new();
        h.update(bytes);
        FileState {
            dev: stamp.dev,
            ino: stamp.ino,
            size: stamp.size,
            mtime_ns: stamp.mtime_ns,
            crc: h.finalize(),
        }
    }

    /// Same identity, size and time as `st` (the CRC is checked apart, it needs the bytes).
    pub fn same_stamp(&self, st: &EntryStat) -> bool {
        st.kind == EntryKind::File
            && (st.dev, st.ino, st.size, st.mtime_ns) == (self.dev, self.ino, self.size, self.mtime_ns)
    }

    pub fn identity(&self) -> Identity {
        (self.dev, self.ino)
    }
}

/// The meta.json of one directory of the tree before the commit (`old`; None: it had none)
/// and after it (`new`; None: the commit removes it). A step in a directory whose meta.json is
/// neither (another save wrote it since) is skipped: that sub-tree is the later save's.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct DirState {
    pub path: Vec<String>,
    pub old: Option<FileState>,
    pub new: Option<FileState>,
}

/// The record of a commit: its staging directories and the steps to take, in order.
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
pub struct Journal {
    /// `JOURNAL_VERSION`; 0 (absent) in journals of older saves.
    #[serde(default)]
    pub version: u32,
    pub token: String,
    /// Where each staging directory is (the directory holding it, relative to the target).
    pub stagings: Vec<Vec<String>>,
    pub ops: Vec<Op>,
    #[serde(default)]
    pub dirs: Vec<DirState>,
    /// Names whose keys the commit left out: something it does not own took them after the
    /// commit point (kept as it is).
    #[serde(default)]
    pub dropped: Vec<Vec<String>>,
}

pub(crate) fn staging_name(token: &str) -> String {
    format!("{STAGING_PREFIX}{token}")
}

fn valid_component(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

fn valid_path(path: &[String]) -> bool {
    path.len() <= format::MAX_DEPTH + 2 && path.iter().all(|c| valid_component(c))
}

/// A staged entry's name: `f<n>` (data), `m<n>` (meta.json), `d<n>` (a whole new
/// sub-directory, built inside the staging directory and moved with one rename), `a<n>` (a
/// meta.json amended after the commit point) or `p<n>` (the old root meta.json, moved aside).
fn valid_staged(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('f' | 'm' | 'd' | 'a' | 'p')) && {
        let rest = chars.as_str();
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())
    }
}

pub(crate) fn join(root: &Path, path: &[String]) -> PathBuf {
    path.iter().fold(root.to_path_buf(), |p, c| p.join(c))
}

/// The staging directories of one save, one per mount, each locked by this process.
pub struct Staging {
    pub token: String,
    /// (directory holding it, relative to the target; its mount; the open staging directory)
    dirs: Vec<(Vec<String>, u64, Dir)>,
}

impl Staging {
    /// Creates the root staging directory inside `root`.
    pub fn new(root: &Dir) -> Result<Staging> {
        let token = storage::random_suffix();
        let name = staging_name(&token);
        let dir = root
            .create_dir_mode(&name, 0o700)
            .map_err(|e| Error::io(root.child_path(&name), e))?;
        lock_own(&dir)?;
        let mount = root.mount().map_err(|e| Error::io(root.path(), e))?;
        Ok(Staging {
            token,
            dirs: vec![(Vec::new(), mount, dir)],
        })
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    /// A staging directory made elsewhere (`save::fresh`: the sibling a new prefix is built
    /// in), for a save that needs no journal: only `dir(0)` and `sync` are used on it.
    pub fn around(dir: Dir) -> Staging {
        Staging {
            token: String::new(),
            dirs: vec![(Vec::new(), 0, dir)],
        }
    }

    /// The staging directory for files that go into `target` (at `rel`, on `mount`): the one
    /// of that mount, created in `target` when it is the first directory seen on it.
    pub fn for_mount(&mut self, target: &Dir, rel: &[String], mount: u64) -> Result<usize> {
        if let Some(i) = self.dirs.iter().position(|(_, m, _)| *m == mount) {
            return Ok(i);
        }
        // Recorded before it exists, so that a sweep after a kill finds it.
        let line = serde_json::to_string(rel).unwrap_or_default() + "\n";
        append(&self.dirs[0].2, OTHER_STAGINGS, line.as_bytes())?;
        let name = staging_name(&self.token);
        let dir = target
            .create_dir_mode(&name, 0o700)
            .map_err(|e| Error::io(target.child_path(&name), e))?;
        lock_own(&dir)?;
        self.dirs.push((rel.to_vec(), mount, dir));
        Ok(self.dirs.len() - 1)
    }

    /// The open staging directory `i`.
    pub fn dir(&self, i: usize) -> &Dir {
        &self.dirs[i].2
    }

    /// How many staging directories there are.
    pub fn len(&self) -> usize {
        self.dirs.len()
    }

    /// True when there is none (never: the root one is made with the staging).
    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    /// Where the staging directories are, for the journal.
    pub fn locations(&self) -> Vec<Vec<String>> {
        self.dirs.iter().map(|(rel, _, _)| rel.clone()).collect()
    }

    /// Fsyncs every staging directory (the staged files' names).
    pub fn sync(&self) -> Result<()> {
        for (_, _, dir) in &self.dirs {
            dir.sync().map_err(|e| Error::io(dir.path(), e))?;
        }
        Ok(())
    }

    /// Removes the staging directories and whatever this save staged in them.
    pub fn remove(self, root: &Dir) {
        for (rel, _, dir) in self.dirs.iter().rev() {
            clean_staging(dir);
            if let Ok(holder) = root.open_rel(rel) {
                // Only an empty staging dir of our own goes; one that still holds anything
                // stays for the next save's sweep, so ignoring the error loses nothing.
                let _ = holder.remove_dir(&staging_name(&self.token));
            }
        }
    }
}

/// Windows: a staging directory's lock is a file inside it, so the directory can only be
/// removed once its lock is released, here (and only if it is empty: nothing else goes).
#[cfg(windows)]
impl Drop for Staging {
    fn drop(&mut self) {
        for (_, _, dir) in self.dirs.iter().rev() {
            dir.unlock();
            // remove_dir only removes an empty directory: one still holding anything stays
            // for the next save's sweep, so ignoring the error loses nothing.
            let _ = std::fs::remove_dir(dir.path());
        }
    }
}

fn lock_own(dir: &Dir) -> Result<()> {
    match dir.lock(true, false) {
        Ok(_) => Ok(()),
        Err(e) if dir::locks_unsupported(&e) => Ok(()),
        Err(e) => Err(Error::io(dir.path(), e)),
    }
}

fn append(dir: &Dir, name: &str, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let path = dir.child_path(name);
    let mut old = match dir.kind(name).map_err(|e| Error::io(&path, e))? {
        EntryKind::Missing => Vec::new(),
        _ => dir
            .read_limited(name, JOURNAL_LIMIT)
            .map_err(|e| Error::io(&path, e))?,
    };
    old.extend_from_slice(bytes);
    let tmp = format!("{name}.new");
    // `{name}.new` is our own scratch name inside a staging dir; if it is not there, fine.
    let _ = dir.remove_file(&tmp);
    let mut file = dir.create_file(&tmp).map_err(|e| Error::io(&path, e))?;
    file.write_all(&old).map_err(|e| Error::io(&path, e))?;
    dir.rename(&tmp, dir, name, false)
        .map_err(|e| Error::io(&path, e))
}

/// Removes what a staged sub-directory holds (made by this save inside its own 0700 staging
/// directory, so all of it is the save's), then the directory. Links are removed, not followed.
fn remove_staged_tree(parent: &Dir, name: &str, depth: usize) {
    if depth <= format::MAX_DEPTH + 1 {
        if let Ok(sub) = parent.open_dir(name) {
            for entry in sub.entry_names().unwrap_or_default() {
                match sub.kind(&entry) {
                    Ok(EntryKind::Dir) => remove_staged_tree(&sub, &entry, depth + 1),
                    // A file that cannot go stays for the next sweep: nothing is lost.
                    Ok(_) => {
                        let _ = sub.remove_file(&entry);
                    }
                    Err(_) => {}
                }
            }
        }
    }
    let _ = parent.remove_dir(name);
}

/// Removes the files a save puts in its staging directory (and nothing else).
pub(crate) fn clean_staging(dir: &Dir) {
    let Ok(names) = dir.entry_names() else { return };
    for name in names {
        if name.starts_with('d') && valid_staged(&name) {
            if dir.kind(&name).is_ok_and(|k| k == EntryKind::Dir) {
                remove_staged_tree(dir, &name, 0);
            }
            continue;
        }
        // Windows: also the old files moved aside because they were mapped (`move_aside`).
        let aside = cfg!(windows)
            && name
                .strip_prefix('o')
                .is_some_and(|r| r.len() == 16 && r.bytes().all(|b| b.is_ascii_hexdigit()));
        let ours = valid_staged(&name)
            || aside
            || name == JOURNAL_DRAFT
            || name == OTHER_STAGINGS
            || name == format!("{OTHER_STAGINGS}.new");
        if ours && dir.kind(&name).is_ok_and(|k| k == EntryKind::File) {
            // A staged file of ours that cannot go stays for the next sweep: nothing is lost.
            let _ = dir.remove_file(&name);
        }
    }
    // Windows: the lock is a file inside the directory, which can only go without it.
    #[cfg(windows)]
    dir.unlock();
}

/// Refuses a commit that could not finish: every directory of the tree that its steps change
/// (creating, renaming or removing entries in it) must be writable by this process. A
/// read-only sub-directory otherwise stops the commit after its commit point, leaving a tree
/// that neither library loads until its permissions are fixed. Directories the commit makes
/// are its own; a directory gone since the plan is the steps' concern.
pub fn check_writable(root: &Dir, journal: &Journal) -> Result<()> {
    let mut dirs: Vec<&[String]> = vec![&[]];
    for op in &journal.ops {
        let (path, inside): (&[String], bool) = match op {
            Op::Mkdir { path } | Op::Unlink { path, .. } | Op::Rmdir { path } => (path, false),
            Op::Rename { to, .. } => (to, false),
            Op::Merge { to, .. } => (to, true),
            Op::Aside { .. } => (&[], true),
        };
        let dir = if inside {
            path
        } else {
            &path[..path.len().saturating_sub(1)]
        };
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    for rel in dirs {
        let dir = match root.open_rel(rel) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // made by the commit
            Err(e) => return Err(Error::io(join(root.path(), rel), e)),
        };
        dir.check_writable()
            .map_err(|e| Error::io(join(root.path(), rel), e))?;
    }
    Ok(())
}

/// Writes the journal and moves it into place: the commit point. Fails (changing nothing)
/// if another journal is there.
pub fn write_journal(root: &Dir, staging: &Staging, journal: &Journal, durable: bool) -> Result<()> {
    let bytes = serde_json::to_vec(journal).map_err(|e| Error::tree(root.path(), e.to_string()))?;
    let draft_dir = staging.dir(0);
    let path = root.child_path(JOURNAL);
    draft_dir
        .write_new(JOURNAL_DRAFT, &bytes, durable)
        .map_err(|e| Error::io(&path, e))?;
    match draft_dir.rename(JOURNAL_DRAFT, root, JOURNAL, true) {
        Ok(()) => {}
        // No RENAME_NOREPLACE here: a hard link is just as exclusive.
        Err(e) if is_einval(&e) => {
            draft_dir
                .link(JOURNAL_DRAFT, root, JOURNAL)
                .map_err(|e| Error::io(&path, e))?;
            let _ = draft_dir.remove_file(JOURNAL_DRAFT);
        }
        Err(e) => return Err(Error::io(&path, e)),
    }
    if durable {
        root.sync().map_err(|e| Error::io(root.path(), e))?;
    }
    Ok(())
}

/// `EINVAL`: renameat2 flags the file system does not support.
pub(crate) fn is_einval(e: &io::Error) -> bool {
    #[cfg(unix)]
    {
        e.raw_os_error() == Some(libc::EINVAL)
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

/// Takes back a journal written by this save before any step ran (the existence check
/// failed after the commit point was reached).
pub fn withdraw_journal(root: &Dir) {
    let _ = root.remove_file(JOURNAL);
}

/// A crash-test hook: `TENSORDICT_RS_KILL_AT_STEP=K` kills this process (SIGKILL, no
/// cleanup) once `K` steps of a commit have run (0: right after the commit point), so tests
/// can land kills inside the short commit window and inside recovery. Unset: never.
pub(crate) fn kill_point(step: usize) {
    let Some(at) = std::env::var_os("TENSORDICT_RS_KILL_AT_STEP") else {
        return;
    };
    if at.to_str().and_then(|v| v.parse::<usize>().ok()) == Some(step) {
        #[cfg(unix)]
        {
            let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        }
        std::process::abort();
    }
}

/// Reads and checks the journal of an interrupted commit.
fn read_journal(root: &Dir) -> Result<Journal> {
    let path = root.child_path(JOURNAL);
    let bytes = root
        .read_limited(JOURNAL, JOURNAL_LIMIT)
        .map_err(|e| invalid_or_io(&path, e))?;
    let journal: Journal = serde_json::from_slice(&bytes).map_err(|e| {
        Error::invalid(
            &path,
            format!("the journal of an interrupted save is damaged: {e}"),
        )
    })?;
    let stage_ok = |stage: &usize, name: &str| *stage < journal.stagings.len() && valid_staged(name);
    let ok = valid_component(&staging_name(&journal.token))
        && !journal.stagings.is_empty()
        && journal.stagings.iter().all(|p| valid_path(p))
        && journal.dirs.iter().all(|d| valid_path(&d.path))
        && journal.dropped.iter().all(|p| !p.is_empty() && valid_path(p))
        && journal.ops.iter().all(|op| match op {
            Op::Mkdir { path } | Op::Rmdir { path } | Op::Unlink { path, .. } => {
                !path.is_empty() && valid_path(path)
            }
            Op::Aside { name } => name.starts_with('p') && valid_staged(name),
            Op::Rename { stage, name, to, .. } => stage_ok(stage, name) && !to.is_empty() && valid_path(to),
            Op::Merge {
                stage,
                name,
                to,
                children,
            } => {
                stage_ok(stage, name)
                    && !to.is_empty()
                    && valid_path(to)
                    && children.iter().all(|(c, _, _)| valid_component(c))
            }
        });
    if !ok {
        return Err(Error::invalid(
            &path,
            "the journal of an interrupted save names paths outside the tree; refusing it",
        ));
    }
    Ok(journal)
}

fn invalid_or_io(path: &Path, e: io::Error) -> Error {
    if dir::is_not_regular(&e) || e.kind() == io::ErrorKind::InvalidData {
        Error::invalid(path, e.to_string())
    } else {
        Error::io(path, e)
    }
}

/// Finishes an interrupted commit, if there is one (the caller holds the exclusive lock).
/// Returns whether there was one.
pub fn recover(root: &Dir) -> Result<bool> {
    match root
        .kind(JOURNAL)
        .map_err(|e| Error::io(root.child_path(JOURNAL), e))?
    {
        EntryKind::Missing => Ok(false),
        EntryKind::File => {
            let journal = read_journal(root)?;
            apply(root, journal, true, None)?;
            Ok(true)
        }
        _ => Err(Error::invalid(
            root.child_path(JOURNAL),
            "the journal of an interrupted save is not a regular file",
        )),
    }
}

/// True while a commit is in progress (or was interrupted) at `root`.
pub fn journal_present(root: &Dir) -> bool {
    root.kind(JOURNAL).map_or(true, |k| k != EntryKind::Missing)
}

/// Removes the staging directories of saves that died before their commit point (their lock
/// is free). Each is positively ours: our name, a real directory (not a symlink), its lock
/// free; only the file names a save stages are removed from it. Returns the entries of `root`
/// it listed (for the other sweeps of a save).
pub fn sweep(root: &Dir) -> Vec<String> {
    let Ok(names) = root.entry_names() else {
        return Vec::new();
    };
    for name in &names {
        if !name.starts_with(STAGING_PREFIX) || !valid_component(name) {
            continue;
        }
        let Ok(stale) = root.open_dir(name) else { continue };
        if !matches!(stale.lock(true, false), Ok(true)) {
            continue; // alive, or no way to tell
        }
        if let Ok(bytes) = stale.read_limited(OTHER_STAGINGS, JOURNAL_LIMIT) {
            for line in String::from_utf8_lossy(&bytes).lines() {
                let Ok(rel) = serde_json::from_str::<Vec<String>>(line) else {
                    continue;
                };
                if rel.is_empty() || !valid_path(&rel) {
                    continue;
                }
                if let Ok(holder) = root.open_rel(&rel) {
                    if let Ok(other) = holder.open_dir(name) {
                        if matches!(other.lock(true, false), Ok(true)) {
                            clean_staging(&other);
                            let _ = holder.remove_dir(name);
                        }
                    }
                }
            }
        }
        clean_staging(&stale);
        let _ = root.remove_dir(name);
    }
    names
}

mod apply;
mod locks;
pub use apply::{apply, Finished};
pub use locks::{settle, settle_ancestors, AncestorLocks, SaveLock};

#[cfg(test)]
mod tests;
