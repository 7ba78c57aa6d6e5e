//! How a save changes a directory it does not own: staging, the journal, recovery, locks.
//! No pyo3 here.
//!
//! A save keeps the target directory (its inode, mode, owner, mount and the processes whose
//! cwd it is). New files are written first into a hidden staging directory inside the tree,
//! `.tdrs%staging-<random>` (one per mount the tree spans, created with `mkdir`, so never
//! someone else's, mode 0700, `flock`ed while its save lives). The `%s` in the name is not a
//! `%XX` escape, so no encoded key can ever be named like it. The commit writes a journal,
//! `.tdrs%journal`, listing every rename, directory creation and removal still to do, and
//! moves it into the target with one exclusive rename: that is the commit point. The renames
//! then put each changed file in place, meta.json files last, the root one at the very end,
//! and the journal goes. A save or load that finds a journal (whose save no longer holds the
//! lock) replays it: every step is idempotent, so a process killed at any instant, even during
//! a replay, leaves the old tree (before the commit point) or the new one (after it).
//!
//! Saves hold an exclusive `flock` on the target directory from start to end; loads take no
//! lock: they check that no journal appeared and that the root meta.json they read is still
//! the one in place when they finish, and start again if not.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format;
use crate::sys::dir::{self, Dir, EntryKind};
use crate::sys::reclaim::Later;
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
const JOURNAL_DRAFT: &str = "journal";
/// Largest journal we read.
const JOURNAL_LIMIT: u64 = 1 << 30;
/// How long a load waits for a commit in progress to finish before giving up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// One step of a commit, replayable: each checks whether it is already done.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Op {
    /// Create a directory (done when it exists as a directory).
    Mkdir { path: Vec<String> },
    /// Move staged file `name` of staging directory `stage` to `to` (done when it is gone
    /// from the staging directory).
    ///
    /// `replaces`: the (device, inode) of the staged file, recorded when it replaces a big
    /// file of the old tree (`reclaim::HOLD_BYTES`). The two are then exchanged
    /// (`RENAME_EXCHANGE`) and the old file, now at the staged name, is unlinked with its
    /// space freed in the background (`sys::reclaim`): a rename over an existing file makes
    /// ext4 write the whole new file back inside the rename (`auto_da_alloc`) and free the
    /// old one there (with `discard`, a TRIM of every block), which doubled the time of a
    /// 1 GiB re-save. The name never stops pointing at one whole version. The identity tells a
    /// replay that the exchange already happened (the target is the new file: only the
    /// unlink is left).
    Rename {
        stage: usize,
        name: String,
        to: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replaces: Option<(u64, u64)>,
    },
    /// Remove a file of the old tree, only if it is still that file (device, inode).
    Unlink { path: Vec<String>, dev: u64, ino: u64 },
    /// Remove a directory of the old tree if it is empty (anything foreign keeps it).
    Rmdir { path: Vec<String> },
}

/// The record of a commit: its staging directories and the steps to take, in order.
#[derive(Serialize, Deserialize, Debug, Default)]
pub struct Journal {
    pub token: String,
    /// Where each staging directory is (the directory holding it, relative to the target).
    pub stagings: Vec<Vec<String>>,
    pub ops: Vec<Op>,
}

fn staging_name(token: &str) -> String {
    format!("{STAGING_PREFIX}{token}")
}

fn valid_component(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

fn valid_path(path: &[String]) -> bool {
    path.len() <= format::MAX_DEPTH + 2 && path.iter().all(|c| valid_component(c))
}

/// A staged entry's name: `f<n>` (data), `m<n>` (meta.json) or `d<n>` (a whole new
/// sub-directory, built inside the staging directory and moved with one rename).
fn valid_staged(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('f' | 'm' | 'd')) && {
        let rest = chars.as_str();
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())
    }
}

fn join(root: &Path, path: &[String]) -> PathBuf {
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
fn clean_staging(dir: &Dir) {
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
fn is_einval(e: &io::Error) -> bool {
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
fn kill_point(step: usize) {
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

/// The parent directory of the last path a step used, kept open for the next step (the steps
/// of one directory come one after another).
struct Parents<'a> {
    root: &'a Dir,
    open: Option<(Vec<String>, Dir)>,
}

impl Parents<'_> {
    fn get(&mut self, path: &[String]) -> io::Result<&Dir> {
        let parent = &path[..path.len() - 1];
        let hit = matches!(&self.open, Some((rel, _)) if rel.as_slice() == parent);
        if !hit {
            let dir = self.root.open_rel(parent)?;
            self.open = Some((parent.to_vec(), dir));
        }
        Ok(&self.open.as_ref().expect("just opened").1)
    }
}

/// Carries out every step of `journal` (idempotently), then removes the journal and the
/// staging directories. `durable` fsyncs the directories it changed first.
pub fn apply(root: &Dir, journal: &Journal, durable: bool) -> Result<()> {
    let name = staging_name(&journal.token);
    let stagings: Vec<Option<Dir>> = journal
        .stagings
        .iter()
        .map(|rel| root.open_rel(rel).and_then(|d| d.open_dir(&name)).ok())
        .collect();
    let mut parents = Parents { root, open: None };
    let mut touched: Vec<Vec<String>> = Vec::new();
    // The big files this commit replaces or drops: unlinked here, freed in the background.
    let mut later = Later::new();
    for (step, op) in journal.ops.iter().enumerate() {
        kill_point(step);
        match op {
            Op::Mkdir { path } => {
                let parent = parents
                    .get(path)
                    .map_err(|e| Error::io(join(root.path(), path), e))?;
                let last = &path[path.len() - 1];
                match parent.create_dir(last) {
                    Ok(_) => touched.push(path[..path.len() - 1].to_vec()),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        if parent.kind(last).ok() != Some(EntryKind::Dir) {
                            return Err(Error::invalid(
                                join(root.path(), path),
                                "a save needs a directory here, and something else is in the way",
                            ));
                        }
                    }
                    Err(e) => return Err(Error::io(join(root.path(), path), e)),
                }
            }
            Op::Rename {
                stage,
                name,
                to,
                replaces,
            } => {
                let Some(Some(staged)) = stagings.get(*stage) else {
                    continue;
                };
                let target = parents.get(to).map_err(|e| Error::io(join(root.path(), to), e))?;
                if let Some(new) = replaces {
                    let last = &to[to.len() - 1];
                    if exchange_in(staged, name, target, last, *new, &mut later)
                        .map_err(|e| Error::io(join(root.path(), to), e))?
                    {
                        touched.push(to[..to.len() - 1].to_vec());
                        continue;
                    }
                }
                // One syscall in the common case: the rename itself. It fails with ENOENT
                // when the staged file is gone, i.e. an earlier run already moved it.
                // A staged directory never replaces anything (rename(2) would replace an empty
                // directory); files replace the old tree's files, as planned.
                let dir = name.starts_with('d');
                let last = &to[to.len() - 1];
                let moved = match staged.rename(name, target, last, dir) {
                    Err(e) if dir && is_einval(&e) => staged.rename(name, target, last, false),
                    other => other,
                };
                // Windows refuses to replace a file that is still mapped, but lets it be
                // renamed: the old file goes aside into the staging directory first.
                #[cfg(windows)]
                let moved = moved.or_else(|e| {
                    if !dir::in_use(&e) || target.kind(last).ok() != Some(EntryKind::File) {
                        return Err(e);
                    }
                    move_aside(&stagings, target, last)?;
                    staged.rename(name, target, last, false)
                });
                match moved {
                    Ok(()) => touched.push(to[..to.len() - 1].to_vec()),
                    Err(_) if staged.kind(name).ok() == Some(EntryKind::Missing) => {}
                    Err(e) => return Err(Error::io(join(root.path(), to), e)),
                }
            }
            Op::Unlink { path, dev, ino } => {
                let Ok(parent) = parents.get(path) else { continue };
                let last = &path[path.len() - 1];
                if let Ok(Some(st)) = parent.stat(last) {
                    if st.kind == EntryKind::File && st.dev == *dev && st.ino == *ino {
                        let removed = later.remove_file(parent, last, st.size);
                        #[cfg(windows)]
                        let removed = removed.or_else(|e| match dir::in_use(&e) {
                            true => move_aside(&stagings, parent, last),
                            false => Err(e),
                        });
                        removed.map_err(|e| Error::io(join(root.path(), path), e))?;
                        touched.push(path[..path.len() - 1].to_vec());
                    }
                }
            }
            Op::Rmdir { path } => {
                let Ok(parent) = parents.get(path) else { continue };
                let last = &path[path.len() - 1];
                if parent.kind(last).ok() == Some(EntryKind::Dir) && parent.remove_dir(last).is_ok() {
                    touched.push(path[..path.len() - 1].to_vec());
                }
            }
        }
    }
    kill_point(journal.ops.len());
    drop(parents);
    if durable {
        touched.sort();
        touched.dedup();
        for rel in &touched {
            if let Ok(dir) = root.open_rel(rel) {
                dir.sync().map_err(|e| Error::io(dir.path(), e))?;
            }
        }
    }
    root.remove_file(JOURNAL)
        .map_err(|e| Error::io(root.child_path(JOURNAL), e))?;
    if durable {
        root.sync().map_err(|e| Error::io(root.path(), e))?;
    }
    for (rel, staged) in journal.stagings.iter().zip(stagings).rev() {
        if let Some(staged) = staged {
            // Windows: a dead save's lock file is in it; taken, it goes with the lock (a live
            // save, ours, keeps its own and removes the directory when it drops it).
            #[cfg(windows)]
            let _ = staged.lock(true, false);
            clean_staging(&staged);
        }
        if let Ok(holder) = root.open_rel(rel) {
            let _ = holder.remove_dir(&name);
        }
    }
    later.release();
    Ok(())
}

/// Puts staged file `name` (whose identity is `new`) in place of the file `last` of `target`
/// by exchanging the two, then unlinks the old file (now at the staged name), to be freed by
/// `later`. Idempotent: a target that already is the new file means an earlier run
/// exchanged them. Returns false when this way does not apply (no exchange on this file
/// system, or no file at the target): the caller then renames.
fn exchange_in(
    staged: &Dir,
    name: &str,
    target: &Dir,
    last: &str,
    new: (u64, u64),
    later: &mut Later,
) -> io::Result<bool> {
    let Some(now) = target.stat(last)? else {
        return Ok(false);
    };
    if now.kind != EntryKind::File {
        return Ok(false);
    }
    if now.id() != new {
        match staged.exchange(name, target, last) {
            Ok(()) => {}
            // The staged file is gone: an earlier run finished this step.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
            Err(e) if is_einval(&e) || e.kind() == io::ErrorKind::Unsupported => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    match later.remove_file(staged, name, now.size) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(true),
    }
}

/// Windows refuses to delete or replace a file that is mapped (a leaf that some process still
/// holds), but lets it be renamed: the old file goes into a staging directory of the commit
/// (as `o<random>`; the first on its volume), where it is deleted now or, once unmapped, by
/// the sweep of a later save. Its holders keep the old bytes, as on Linux.
#[cfg(windows)]
fn move_aside(stagings: &[Option<Dir>], parent: &Dir, name: &str) -> io::Result<()> {
    let mut last = io::Error::from(io::ErrorKind::NotFound);
    for staged in stagings.iter().flatten() {
        let aside = format!("o{}", storage::random_suffix());
        match parent.rename(name, staged, &aside, true) {
            Ok(()) => {
                // Still mapped: it stays in the staging directory for a later sweep.
                let _ = staged.remove_file(&aside);
                return Ok(());
            }
            Err(e) => last = e,
        }
    }
    Err(last)
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
    let ok = valid_component(&staging_name(&journal.token))
        && !journal.stagings.is_empty()
        && journal.stagings.iter().all(|p| valid_path(p))
        && journal.ops.iter().all(|op| match op {
            Op::Mkdir { path } | Op::Rmdir { path } | Op::Unlink { path, .. } => {
                !path.is_empty() && valid_path(path)
            }
            Op::Rename { stage, name, to, .. } => {
                *stage < journal.stagings.len() && valid_staged(name) && !to.is_empty() && valid_path(to)
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
            apply(root, &journal, true).map_err(|e| match e {
                Error::Io { path, source } => Error::invalid(
                    path,
                    format!("an interrupted save here could not be finished ({source}); it will be finished by the next save or load that can write here"),
                ),
                other => other,
            })?;
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

/// Removes the staging directories of saves that died before their commit point (their lock
/// is free). Each is positively ours: our name, a real directory (not a symlink), its lock
/// free; only the file names a save stages are removed from it.
pub fn sweep(root: &Dir) {
    let Ok(names) = root.entry_names() else { return };
    for name in names {
        if !name.starts_with(STAGING_PREFIX) || !valid_component(&name) {
            continue;
        }
        let Ok(stale) = root.open_dir(&name) else { continue };
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
                    if let Ok(other) = holder.open_dir(&name) {
                        if matches!(other.lock(true, false), Ok(true)) {
                            clean_staging(&other);
                            let _ = holder.remove_dir(&name);
                        }
                    }
                }
            }
        }
        clean_staging(&stale);
        let _ = root.remove_dir(&name);
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

#[cfg(test)]
mod tests;
