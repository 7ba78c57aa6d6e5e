//! The replay's proof (reading only): whether each directory's meta.json is still the
//! commit's, and whether each step is done or pending (see `apply.rs`'s module doc). No pyo3
//! here.

use std::io;
use std::path::{Path, PathBuf};

use super::{cannot_finish, gone, identity, StageDir, State};
use crate::error::{Error, Result};
use crate::format;
use crate::sys::dir::{Dir, EntryKind, EntryStat};
use crate::tree::commit::{join, DirState, FileState, Identity, Journal, Op, JOURNAL, JOURNAL_VERSION};

/// `lstat` of the entry at `path` below `root`; None when it or a directory on the way is
/// missing; any other error refuses the replay.
fn stat_at(root: &Dir, path: &[String]) -> Result<Option<EntryStat>> {
    let (last, parent) = path.split_last().expect("journal paths are never empty");
    match root.stat_rel(parent, last) {
        Ok(st) => Ok(st),
        Err(e) if gone(&e) => Ok(None),
        Err(e) => Err(cannot_finish(
            &join(root.path(), path),
            "it cannot be examined",
            &e,
        )),
    }
}

/// The directory a step changes (where its target's name is).
fn step_dir(op: &Op) -> &[String] {
    match op {
        Op::Aside { .. } => &[],
        Op::Mkdir { path } | Op::Unlink { path, .. } | Op::Rmdir { path } => &path[..path.len() - 1],
        Op::Rename { to, .. } | Op::Merge { to, .. } => &to[..to.len() - 1],
    }
}

/// Where each directory's meta.json stands.
enum Fresh {
    /// As the commit left it (before or after its step).
    Yes,
    /// Another save wrote it since the commit point.
    Foreign,
}

/// The replay's proof (reading only). None: the root was written since (superseded).
pub(super) fn prove(root: &Dir, journal: &Journal, stagings: &[StageDir<'_>]) -> Result<Option<Vec<State>>> {
    let mut foreign: Vec<&[String]> = Vec::new();
    for ds in &journal.dirs {
        if let Fresh::Foreign = dir_fresh(root, journal, stagings, ds)? {
            if ds.path.is_empty() {
                return Ok(None);
            }
            foreign.push(&ds.path);
        }
    }
    let mut states = Vec::with_capacity(journal.ops.len());
    for op in &journal.ops {
        let dir = step_dir(op);
        if foreign.iter().any(|f| dir.starts_with(f)) {
            states.push(State::Skipped);
            continue;
        }
        states.push(match op {
            Op::Rename {
                stage,
                name,
                to,
                id,
                replaces,
            } => {
                // A journal without a version that records `replaces` was written by the saves
                // of issue 29 (before journal v2), where it is the staged file's own identity
                // (the file exchanged with the old one): the identity this proof needs.
                let id = if journal.version >= JOURNAL_VERSION {
                    *id
                } else {
                    id.or(*replaces)
                };
                rename_state(root, stagings, *stage, name, to, id)?
            }
            Op::Merge {
                stage,
                name,
                to,
                children,
            } => merge_state(root, stagings, *stage, name, to, children)?,
            // idempotent: each checks what it finds when it runs
            _ => State::Pending,
        });
    }
    Ok(Some(states))
}

/// Whether the meta.json of `ds` is still the commit's (its old one, its new one).
fn dir_fresh(root: &Dir, journal: &Journal, stagings: &[StageDir<'_>], ds: &DirState) -> Result<Fresh> {
    let meta = join(root.path(), &ds.path).join(format::META_FILE);
    let now = match root.stat_rel(&ds.path, format::META_FILE) {
        Ok(st) => st,
        Err(e) if gone(&e) => None,
        Err(e) => return Err(cannot_finish(&meta, "its meta.json cannot be examined", &e)),
    };
    let fresh = match now {
        // none before, or removed by the commit, or (the root) moved aside by its first step
        None if ds.old.is_none()
            || ds.new.is_none()
            || (ds.path.is_empty() && aside_holds(journal, stagings, ds)?) =>
        {
            true
        }
        None => return missing_meta(root, ds, &meta),
        Some(st) => same(root, ds, ds.old, &st)? || same(root, ds, ds.new, &st)?,
    };
    Ok(if fresh { Fresh::Yes } else { Fresh::Foreign })
}

/// A directory of the commit whose meta.json is not there: another save is committing into
/// it as its own prefix (it moved that meta.json aside: its journal is there), or the whole
/// directory is gone (removed since: nothing of this commit goes there); anything else (a
/// file system of the tree not mounted, a meta.json removed by hand) cannot be told apart from
/// a step not seen, and refuses the replay.
fn missing_meta(root: &Dir, ds: &DirState, meta: &Path) -> Result<Fresh> {
    let examine = |e: io::Error| cannot_finish(meta, "its directory cannot be examined", &e);
    let Some((last, parent)) = ds.path.split_last() else {
        return Err(Error::invalid(
            meta,
            "an interrupted save here cannot be finished: the root meta.json is neither in place nor moved aside by the commit; nothing was changed",
        ));
    };
    match root.stat_rel(parent, last) {
        Ok(Some(st)) if st.kind == EntryKind::Dir => {}
        Ok(_) => return Ok(Fresh::Foreign),
        Err(e) if gone(&e) => return Ok(Fresh::Foreign),
        Err(e) => return Err(examine(e)),
    }
    match root.stat_rel(&ds.path, JOURNAL) {
        Ok(Some(_)) => Ok(Fresh::Foreign),
        Ok(None) => Err(Error::invalid(
            meta,
            "an interrupted save here cannot be finished: this directory's meta.json is missing (is a file system of the tree not mounted, or was it removed by hand?); nothing was changed: a save or load that finds it finishes the save",
        )),
        Err(e) => Err(examine(e)),
    }
}

/// True when the old root meta.json is in staging directory 0, moved there by `Aside`.
fn aside_holds(journal: &Journal, stagings: &[StageDir<'_>], ds: &DirState) -> Result<bool> {
    let (Some(old), Some(stage)) = (ds.old, stagings.first().and_then(StageDir::get)) else {
        return Ok(false);
    };
    for op in &journal.ops {
        if let Op::Aside { name } = op {
            let st = stage
                .stat(name)
                .map_err(|e| cannot_finish(&stage.child_path(name), "it cannot be examined", &e))?;
            return Ok(st.is_some_and(|st| st.kind == EntryKind::File && identity(&st) == old.identity()));
        }
    }
    Ok(false)
}

/// True when `st` (the meta.json of `ds` now) is `state`: same stamp, and same bytes (an
/// in-place rewrite within one tick of a coarse clock keeps the time).
fn same(root: &Dir, ds: &DirState, state: Option<FileState>, st: &EntryStat) -> Result<bool> {
    let Some(state) = state else { return Ok(false) };
    if !state.same_stamp(st) {
        return Ok(false);
    }
    let meta = join(root.path(), &ds.path).join(format::META_FILE);
    let read = root
        .open_rel(&ds.path)
        // (its size is the state's: a NonTensorStack's meta.json may pass `META_LIMIT`)
        .and_then(|d| d.read_limited_stamped(format::META_FILE, format::VALUE_META_LIMIT));
    match read {
        Ok((bytes, stamp)) => Ok(FileState::of(stamp, &bytes) == state),
        Err(e) if gone(&e) => Ok(false),
        Err(e) => Err(cannot_finish(&meta, "its meta.json cannot be read", &e)),
    }
}

pub(super) fn unprovable(
    root: &Dir,
    stagings: &[StageDir<'_>],
    stage: usize,
    name: &str,
    to: &[String],
) -> Error {
    let (where_, why) = match stagings.get(stage) {
        Some(StageDir::Absent(path)) => (path.join(name), "its staging directory is not there"),
        Some(s) => (
            s.get().map_or_else(PathBuf::new, |d| d.child_path(name)),
            "the staged entry is not there",
        ),
        None => (PathBuf::new(), "its staging directory is unknown"),
    };
    Error::invalid(
        join(root.path(), to),
        format!(
            "an interrupted save here cannot be finished: its step that puts {} at this name is neither done nor still staged ({why}; is a file system of the tree not mounted, or was a file removed by hand?); nothing was changed: a save or load that can see both finishes it",
            where_.display()
        ),
    )
}

fn rename_state(
    root: &Dir,
    stagings: &[StageDir<'_>],
    stage: usize,
    name: &str,
    to: &[String],
    id: Option<Identity>,
) -> Result<State> {
    let staged_dir = stagings.get(stage).and_then(StageDir::get);
    let staged = |d: &Dir| {
        d.stat(name)
            .map_err(|e| cannot_finish(&d.child_path(name), "it cannot be examined", &e))
    };
    // A staged entry is a directory (`d<n>`) or a regular file: an entry of another kind
    // holding its identity (an inode number reused after the staged one was removed) is not it.
    let kind = if name.starts_with('d') {
        EntryKind::Dir
    } else {
        EntryKind::File
    };
    let holds = |st: &EntryStat, id: Identity| st.kind == kind && identity(st) == id;
    match id {
        Some(id) => {
            if stat_at(root, to)?.is_some_and(|t| holds(&t, id)) {
                return Ok(State::Done);
            }
            if let Some(d) = staged_dir {
                if staged(d)?.is_some_and(|s| holds(&s, id)) {
                    return Ok(State::Pending);
                }
            }
            Err(unprovable(root, stagings, stage, name, to))
        }
        // a journal of an older save: pending while the staged name is there
        None => match staged_dir {
            Some(d) => match staged(d)? {
                None => Ok(State::Done),
                Some(st) if st.kind == kind => Ok(State::Pending),
                Some(_) => Err(unprovable(root, stagings, stage, name, to)),
            },
            None => Err(unprovable(root, stagings, stage, name, to)),
        },
    }
}

fn merge_state(
    root: &Dir,
    stagings: &[StageDir<'_>],
    stage: usize,
    name: &str,
    to: &[String],
    children: &[(String, u64, u64)],
) -> Result<State> {
    let mut all_done = true;
    for (child, dev, ino) in children {
        let mut path = to.to_vec();
        path.push(child.clone());
        if stat_at(root, &path)?.is_some_and(|t| t.kind != EntryKind::Symlink && identity(&t) == (*dev, *ino))
        {
            continue;
        }
        all_done = false;
        let staged = stagings
            .get(stage)
            .and_then(StageDir::get)
            .and_then(|d| d.open_dir(name).ok())
            .and_then(|d| d.stat(child).ok().flatten());
        if staged.is_none_or(|s| s.kind == EntryKind::Symlink || identity(&s) != (*dev, *ino)) {
            return Err(unprovable(
                root,
                stagings,
                stage,
                &format!("{name}/{child}"),
                &path,
            ));
        }
    }
    Ok(if all_done { State::Done } else { State::Pending })
}
