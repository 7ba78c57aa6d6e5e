//! Carrying out a commit's journal: by the save that wrote it, or by a replay after that save
//! died. No pyo3 here.
//!
//! **A replay proves before it changes anything** (`prove`, reading only):
//! - every staging directory is opened; one that cannot be (another user's 0700 directory, no
//!   descriptor left) refuses the replay; one that is not there (a file system of the tree not
//!   mounted) leaves its steps to be proven by their targets;
//! - every directory's meta.json is compared with the journal's `DirState`: the one before the
//!   commit or the one it writes, by identity, size, time and CRC. Anything else means another
//!   save wrote that directory since the commit point: its steps (and those below it) are
//!   skipped, never rolled back over it; at the root, the whole commit is superseded and only
//!   its journal and staging directories go;
//! - every `Rename` is *done* (its target holds the staged entry's identity) or *pending* (the
//!   staging directory holds it); a step that is neither refuses the replay.
//!
//! A refusal changes nothing (journal, staging, tree) and says what could not be seen.
//!
//! **A step that meets something the commit does not own** at a name it creates (a user's
//! directory, file, symlink, FIFO, another save's tree; only possible after the plan checked
//! the name, so after or just before the commit point) keeps it, and the commit ends around it:
//! another save's tree at a new sub-tree's name is kept and loads as that key (the later save
//! wins); a directory without meta.json receives the sub-tree's entries one by one (`Merge`);
//! anything else keeps the key out of the new tree: the parent's staged meta.json is rewritten
//! without it and the journal amended (both in the staging directory, the journal renamed over
//! the old one), so a kill at any point leaves either journal, each replayable.
//!
//! `apply/prove.rs` holds the replay's proof, `apply/obstacles.rs` what a step that meets an
//! obstacle does about it (keep the taker, merge into it, or leave the key out); the steps
//! themselves, and the end of a commit, are here.

use std::io;
use std::path::{Path, PathBuf};

use super::{
    clean_staging, is_einval, join, kill_point, staging_name, Identity, Journal, Op, Staging, JOURNAL,
    JOURNAL_VERSION,
};
use crate::error::{Error, Result};
use crate::format;
use crate::sys::dir::{Dir, EntryKind, EntryStat};
use crate::sys::reclaim::{self, Later};

mod obstacles;
mod prove;

use obstacles::resolve;
use prove::{prove, unprovable};

/// How a commit ended.
#[derive(Debug)]
pub enum Finished {
    /// Every step is done, or skipped where another save wrote since. `dropped`: names whose
    /// keys the new tree leaves out, because something the commit does not own took them
    /// after the commit point (it was kept).
    Done { dropped: Vec<PathBuf> },
    /// The root was written by another program after the commit point: its tree is kept as
    /// that program wrote it, and this commit's journal and staging directories are gone.
    Superseded,
}

/// A staging directory of the commit, as the replay found it.
enum StageDir<'a> {
    /// The saver's own open directory.
    Borrowed(&'a Dir),
    Owned(Dir),
    /// Not there (its mount absent, or removed): its steps are proven by their targets.
    Absent(PathBuf),
}

impl StageDir<'_> {
    fn get(&self) -> Option<&Dir> {
        match self {
            StageDir::Borrowed(d) => Some(d),
            StageDir::Owned(d) => Some(d),
            StageDir::Absent(_) => None,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Pending,
    Done,
    /// In a directory another save wrote since the commit point.
    Skipped,
}

enum Outcome {
    Finished(Finished),
    /// The journal was amended around an obstacle: prove and run it again.
    Amended,
}

/// What a step met.
enum Stepped {
    Ok,
    /// Something the commit does not own took the name the step creates.
    Taken,
    /// Another program's meta.json is at the root: it replaced the one the plan read before
    /// it was moved aside, or appeared after.
    Superseded,
}

/// Carries out `journal`. `saver`: the staging of the save that wrote it (its steps are all
/// pending, nothing to prove); None for a replay, which proves first (see the module doc).
/// `durable` fsyncs the directories it changed before the journal goes.
pub fn apply(root: &Dir, journal: Journal, durable: bool, saver: Option<&Staging>) -> Result<Finished> {
    let mut journal = journal;
    let mut saver = saver;
    loop {
        let stagings = open_stagings(root, &journal, saver)?;
        let states = match saver {
            Some(_) => vec![State::Pending; journal.ops.len()],
            None => match prove(root, &journal, &stagings)? {
                Some(states) => states,
                None => {
                    abandon(root, &journal, &stagings);
                    return Ok(Finished::Superseded);
                }
            },
        };
        match run(root, &mut journal, &stagings, &states, durable)? {
            Outcome::Finished(finished) => return Ok(finished),
            // the amended journal is proven afresh, as a replay would
            Outcome::Amended => saver = None,
        }
    }
}

/// The errors that mean "not there": the entry or a directory on its path is missing.
fn gone(e: &io::Error) -> bool {
    #[cfg(unix)]
    if e.raw_os_error() == Some(libc::ENOTDIR) {
        return true;
    }
    e.kind() == io::ErrorKind::NotFound
}

/// A refusal: the replay cannot see what it must prove; nothing was changed.
fn cannot_finish(path: &Path, what: &str, e: &io::Error) -> Error {
    let message = format!(
        "an interrupted save here cannot be finished by this process: {what} ({e}); nothing was changed: a save or load that can see it (its owner, with descriptors to spare, with every file system of the tree mounted) finishes it"
    );
    if e.kind() == io::ErrorKind::PermissionDenied {
        Error::io(path, io::Error::new(io::ErrorKind::PermissionDenied, message))
    } else {
        Error::invalid(path, message)
    }
}

fn open_stagings<'a>(root: &Dir, journal: &Journal, saver: Option<&'a Staging>) -> Result<Vec<StageDir<'a>>> {
    if let Some(staging) = saver {
        return Ok((0..staging.len())
            .map(|i| StageDir::Borrowed(staging.dir(i)))
            .collect());
    }
    let name = staging_name(&journal.token);
    journal
        .stagings
        .iter()
        .map(|rel| {
            let path = join(root.path(), rel).join(&name);
            match root.open_rel(rel).and_then(|d| d.open_dir(&name)) {
                Ok(dir) => Ok(StageDir::Owned(dir)),
                Err(e) if gone(&e) => Ok(StageDir::Absent(path)),
                Err(e) => Err(cannot_finish(&path, "its staging directory cannot be opened", &e)),
            }
        })
        .collect()
}

fn identity(st: &EntryStat) -> Identity {
    (st.dev, st.ino)
}

/// True for the root meta.json's own step (the last rename of a commit).
fn is_root_meta(to: &[String]) -> bool {
    to.len() == 1 && to[0] == format::META_FILE
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
            self.open = None; // one directory open at a time
            let dir = self.root.open_rel(parent)?;
            self.open = Some((parent.to_vec(), dir));
        }
        Ok(&self.open.as_ref().expect("just opened").1)
    }
}

/// True for the errors of a rename or mkdir whose name is taken by something in the way (or
/// that cannot receive it).
fn taken(e: &io::Error) -> bool {
    #[cfg(unix)]
    if matches!(
        e.raw_os_error(),
        Some(libc::EEXIST | libc::ENOTEMPTY | libc::EISDIR | libc::ENOTDIR | libc::EXDEV)
    ) {
        return true;
    }
    e.kind() == io::ErrorKind::AlreadyExists
}

/// Moves `name` to `to_name` without replacing anything: `RENAME_NOREPLACE`, or where the
/// file system lacks it, a hard link (as exclusive) for a file, a plain rename for a
/// directory (which replaces only an empty directory).
fn rename_exclusive(from: &Dir, name: &str, to: &Dir, to_name: &str, is_dir: bool) -> io::Result<()> {
    match from.rename(name, to, to_name, true) {
        Err(e) if is_einval(&e) => {
            if is_dir {
                from.rename(name, to, to_name, false)
            } else {
                from.link(name, to, to_name)?;
                // (a kill here leaves both names on one file: the target holds the staged
                // identity, so the step is proven done)
                from.remove_file(name)
            }
        }
        other => other,
    }
}

/// Puts the staged file `name` in place of the old tree's file `last` of `target`.
///
/// A big one (`reclaim::HOLD_BYTES` or more, issue 29) is exchanged with it
/// (`RENAME_EXCHANGE`) and the old file, now at the staged name, unlinked while a handle keeps
/// it, its space freed in the background (`later`): a rename over an existing file makes ext4
/// write the whole new file back inside the rename (`auto_da_alloc`) and free the old one
/// there (with `discard`, a TRIM of every block), which doubled the time of a 1 GiB re-save.
/// The name never stops naming one whole version. A kill between the exchange and the unlink
/// leaves the target holding the staged identity (the step is proven done) and the old file
/// in the staging directory, which goes with it (`remove_stagings`). Where the file system
/// (or Windows) has no exchange, or the target is no big regular file: a rename over it.
fn replace_file(staged: &Dir, name: &str, target: &Dir, last: &str, later: &mut Later) -> io::Result<()> {
    let old = target
        .stat(last)?
        .filter(|st| st.kind == EntryKind::File && st.size >= reclaim::HOLD_BYTES);
    if let Some(old) = old {
        match staged.exchange(name, target, last) {
            Ok(()) => {
                // The step is done; an old file that cannot go now goes with the staging.
                let _ = later.remove_file(staged, name, old.size);
                return Ok(());
            }
            // no exchange here, or the target went meanwhile: the rename decides
            Err(e) if is_einval(&e) || e.kind() == io::ErrorKind::Unsupported || gone(&e) => {}
            Err(e) => return Err(e),
        }
    }
    staged.rename(name, target, last, false)
}

fn run(
    root: &Dir,
    journal: &mut Journal,
    stagings: &[StageDir<'_>],
    states: &[State],
    durable: bool,
) -> Result<Outcome> {
    let mut parents = Parents { root, open: None };
    let mut touched: Vec<Vec<String>> = Vec::new();
    // The big files this commit replaces or drops: unlinked here, freed in the background
    // (when `later` is released or dropped).
    let mut later = Later::new();
    for (i, state) in states.iter().enumerate() {
        kill_point(i);
        if *state != State::Pending {
            continue;
        }
        match step(root, journal, i, stagings, &mut parents, &mut touched, &mut later)? {
            Stepped::Ok => {}
            Stepped::Taken => {
                drop(parents);
                match resolve(root, journal, stagings, i, durable)? {
                    Some(outcome) => return Ok(outcome),
                    // kept as the key's tree: go on with the other steps
                    None => parents = Parents { root, open: None },
                }
            }
            Stepped::Superseded => {
                drop(parents);
                abandon(root, journal, stagings);
                return Ok(Outcome::Finished(Finished::Superseded));
            }
        }
    }
    kill_point(journal.ops.len());
    drop(parents);
    let finished = finish(root, journal, stagings, touched, durable).map(Outcome::Finished);
    later.release();
    finished
}

fn step(
    root: &Dir,
    journal: &Journal,
    i: usize,
    stagings: &[StageDir<'_>],
    parents: &mut Parents<'_>,
    touched: &mut Vec<Vec<String>>,
    later: &mut Later,
) -> Result<Stepped> {
    let io_at = |path: &[String], e: io::Error| Error::io(join(root.path(), path), e);
    match &journal.ops[i] {
        Op::Aside { name } => {
            let root_state = journal.dirs.iter().find(|d| d.path.is_empty());
            let old = root_state.and_then(|d| d.old);
            let new = root_state.and_then(|d| d.new);
            let here = root
                .stat(format::META_FILE)
                .map_err(|e| Error::io(root.child_path(format::META_FILE), e))?;
            match (old, here) {
                (Some(old), Some(here)) if identity(&here) == old.identity() => {
                    let stage = stagings[0].get().ok_or_else(|| {
                        Error::invalid(root.child_path(JOURNAL), "the root staging directory is gone")
                    })?;
                    root.rename(format::META_FILE, stage, name, true)
                        .map_err(|e| Error::io(root.child_path(format::META_FILE), e))?;
                    touched.push(Vec::new());
                }
                // the commit's own new one: a replay of a commit that got that far
                (_, Some(here)) if new.is_some_and(|n| n.identity() == identity(&here)) => {}
                // Neither (in the saver's own run the step is the first after the commit
                // point, so nothing is moved yet): another program wrote the tree since. Its
                // version is kept whole: going on would put this commit's files under that
                // program's meta.json, then fail at the last step.
                (_, Some(_)) => return Ok(Stepped::Superseded),
                // none at the root (a new tree, or one removed since): nothing to move aside
                (_, None) => {}
            }
        }
        Op::Mkdir { path } => {
            let parent = match parents.get(path) {
                Ok(p) => p,
                Err(e) if gone(&e) => return Ok(Stepped::Taken),
                Err(e) => return Err(io_at(path, e)),
            };
            let last = &path[path.len() - 1];
            match parent.create_dir(last) {
                Ok(_) => touched.push(path[..path.len() - 1].to_vec()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if parent.kind(last).ok() != Some(EntryKind::Dir) {
                        return Ok(Stepped::Taken);
                    }
                }
                Err(e) => return Err(io_at(path, e)),
            }
        }
        Op::Rename {
            stage,
            name,
            to,
            replaces,
            ..
        } => {
            let staged = stagings[*stage]
                .get()
                .ok_or_else(|| unprovable(root, stagings, *stage, name, to))?;
            let target = match parents.get(to) {
                Ok(t) => t,
                Err(e) if gone(&e) => return Ok(Stepped::Taken),
                Err(e) => return Err(io_at(to, e)),
            };
            let last = &to[to.len() - 1];
            let is_dir = name.starts_with('d');
            // New names (a new leaf, a new sub-tree, a new NonTensorData's meta.json, the root
            // meta.json once moved aside) never replace anything; names the old tree owns do.
            let root_aside = is_root_meta(to) && journal.version >= JOURNAL_VERSION;
            // (journals of older saves record no `replaces`: only their directories are new)
            let exclusive =
                is_dir || root_aside || (journal.version >= JOURNAL_VERSION && replaces.is_none());
            let moved = if exclusive {
                rename_exclusive(staged, name, target, last, is_dir)
            } else {
                replace_file(staged, name, target, last, later)
            };
            // Windows refuses to replace a file that is still mapped, but lets it be
            // renamed: the old file goes aside into the staging directory first.
            #[cfg(windows)]
            let moved = moved.or_else(|e| {
                if exclusive
                    || !crate::sys::dir::in_use(&e)
                    || target.kind(last).ok() != Some(EntryKind::File)
                {
                    return Err(e);
                }
                move_aside(stagings, target, last)?;
                staged.rename(name, target, last, false)
            });
            match moved {
                Ok(()) => touched.push(to[..to.len() - 1].to_vec()),
                Err(e) if root_aside && taken(&e) => return Ok(Stepped::Superseded),
                Err(e) if taken(&e) => return Ok(Stepped::Taken),
                Err(e) => return Err(io_at(to, e)),
            }
        }
        Op::Merge {
            stage,
            name,
            to,
            children,
        } => {
            let staged_path = |c: &str| format!("{name}/{c}");
            let holder = stagings[*stage]
                .get()
                .ok_or_else(|| unprovable(root, stagings, *stage, name, to))?;
            let from = holder
                .open_dir(name)
                .map_err(|e| Error::io(holder.child_path(name), e))?;
            let target = match root.open_rel(to) {
                Ok(t) => t,
                Err(e) if gone(&e) => return Ok(Stepped::Taken),
                Err(e) => return Err(io_at(to, e)),
            };
            for (child, dev, ino) in children {
                let here = target
                    .stat(child)
                    .map_err(|e| Error::io(target.child_path(child), e))?;
                if here.is_some_and(|st| identity(&st) == (*dev, *ino)) {
                    continue;
                }
                let is_dir = from.kind(child).ok() == Some(EntryKind::Dir);
                match rename_exclusive(&from, child, &target, child, is_dir) {
                    Ok(()) => {}
                    Err(e) if taken(&e) => return Ok(Stepped::Taken),
                    Err(e) => return Err(Error::io(holder.child_path(&staged_path(child)), e)),
                }
            }
            touched.push(to.clone());
        }
        Op::Unlink { path, dev, ino } => {
            let parent = match parents.get(path) {
                Ok(p) => p,
                Err(e) if gone(&e) => return Ok(Stepped::Ok),
                Err(e) => return Err(io_at(path, e)),
            };
            let last = &path[path.len() - 1];
            let st = parent.stat(last).map_err(|e| io_at(path, e))?;
            if let Some(st) = st.filter(|st| st.kind == EntryKind::File && (st.dev, st.ino) == (*dev, *ino)) {
                let removed = later.remove_file(parent, last, st.size);
                #[cfg(windows)]
                let removed = removed.or_else(|e| match crate::sys::dir::in_use(&e) {
                    true => move_aside(stagings, parent, last),
                    false => Err(e),
                });
                match removed {
                    Ok(()) => touched.push(path[..path.len() - 1].to_vec()),
                    Err(e) if gone(&e) => {}
                    Err(e) => return Err(io_at(path, e)),
                }
            }
        }
        Op::Rmdir { path } => {
            let parent = match parents.get(path) {
                Ok(p) => p,
                Err(e) if gone(&e) => return Ok(Stepped::Ok),
                Err(e) => return Err(io_at(path, e)),
            };
            let last = &path[path.len() - 1];
            // Only an empty directory goes: one holding anything foreign stays, as it should.
            if parent.kind(last).ok() == Some(EntryKind::Dir) && parent.remove_dir(last).is_ok() {
                touched.push(path[..path.len() - 1].to_vec());
            }
        }
    }
    Ok(Stepped::Ok)
}

/// Every step done: the directories synced (durable), the journal removed, then the staging.
fn finish(
    root: &Dir,
    journal: &Journal,
    stagings: &[StageDir<'_>],
    mut touched: Vec<Vec<String>>,
    durable: bool,
) -> Result<Finished> {
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
    remove_stagings(root, journal, stagings);
    Ok(Finished::Done {
        dropped: journal.dropped.iter().map(|p| join(root.path(), p)).collect(),
    })
}

/// The commit is superseded: its journal and staging directories (ours) go, nothing else.
fn abandon(root: &Dir, journal: &Journal, stagings: &[StageDir<'_>]) {
    // Gone or not, the tree is the other program's now; a journal that cannot go is met again
    // by the next replay, which finds the same.
    let _ = root.remove_file(JOURNAL);
    remove_stagings(root, journal, stagings);
}

fn remove_stagings(root: &Dir, journal: &Journal, stagings: &[StageDir<'_>]) {
    let name = staging_name(&journal.token);
    for (rel, staged) in journal.stagings.iter().zip(stagings).rev() {
        if let Some(staged) = staged.get() {
            // Windows: a dead save's lock file is in it; taken, it goes with the lock (a live
            // save, ours, keeps its own and removes the directory when it drops it).
            #[cfg(windows)]
            let _ = staged.lock(true, false);
            free_big_files(staged);
            clean_staging(staged);
        }
        if let Ok(holder) = root.open_rel(rel) {
            // Only an empty staging directory goes; anything left is for a later sweep.
            let _ = holder.remove_dir(&name);
        }
    }
}

/// Removes the big files left at the top of a staging directory (an old file exchanged out
/// just before a kill; the staged data of a commit that is abandoned), their space freed in
/// the background (`sys::reclaim`); `clean_staging` removes the rest.
fn free_big_files(staged: &Dir) {
    let mut later = Later::new();
    let Ok(names) = staged.entry_names() else { return };
    for name in names
        .iter()
        .filter(|n| !n.starts_with('d') && super::valid_staged(n))
    {
        if let Ok(Some(st)) = staged.stat(name) {
            if st.kind == EntryKind::File && st.size >= reclaim::HOLD_BYTES {
                let _ = later.remove_file(staged, name, st.size);
            }
        }
    }
    later.release();
}

/// Windows refuses to delete or replace a file that is mapped (a leaf that some process still
/// holds), but lets it be renamed: the old file goes into a staging directory of the commit
/// (as `o<random>`; the first on its volume), where it is deleted now or, once unmapped, by
/// the sweep of a later save. Its holders keep the old bytes, as on Linux.
#[cfg(windows)]
fn move_aside(stagings: &[StageDir<'_>], parent: &Dir, name: &str) -> io::Result<()> {
    let mut last = io::Error::from(io::ErrorKind::NotFound);
    for staged in stagings.iter().filter_map(StageDir::get) {
        let aside = format!("o{}", crate::sys::storage::random_suffix());
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
