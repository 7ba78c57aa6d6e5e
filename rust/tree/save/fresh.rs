//! Saves to a prefix that does not exist yet. No pyo3 here.
//!
//! The whole tree (data files, sub-directories, every meta.json) is built in a sibling of the
//! prefix, `.tdrs%new-<hash of the prefix's name>`, made with `mkdir` and `flock`ed while its
//! save lives, and moved to the prefix with one `renameat2(RENAME_NOREPLACE)`: the commit
//! point, atomic on its own, so no journal is needed and a flat tree of 10,000 leaves costs
//! one rename instead of 10,000. `RENAME_NOREPLACE` never replaces or hides anything: when the
//! prefix appeared meanwhile (a user's `mkdir`, another save) the sibling is removed and the
//! save runs again as a save into an existing directory, which keeps that directory.
//!
//! A save killed before its rename leaves the sibling behind, unlocked; the next save to the
//! same prefix finds it at its fixed name (whether the prefix exists by then or not), makes
//! sure it is dead (its lock free, still at that name) and removes what a save puts there
//! (`*.memmap`, `meta.json`, directories), nothing else; so does the next save of a tree for
//! the dead siblings inside it (of killed saves to its sub-directories). Loads never look at
//! it: to them the prefix is absent until the rename.

use std::io;
use std::path::Path;

use super::plan::Plan;
use super::{LeafSpec, NodeSpec, SaveOptions};
use crate::error::{Error, Result};
use crate::format;
use crate::sys::dir::{Dir, EntryKind};
use crate::sys::storage::Region;
use crate::tree::commit::Staging;

/// Prefix of the sibling a new prefix is built in. `%n` is not a `%XX` escape: no key is
/// ever stored under such a name.
pub const SIBLING_PREFIX: &str = ".tdrs%new-";

/// What a save to an absent prefix came to.
pub enum Outcome {
    /// The tree is in place; the maps of its leaves.
    Done(Vec<Option<Region>>),
    /// This way does not apply (the prefix appeared, another save builds the same prefix,
    /// the file system cannot rename exclusively): nothing is left of the attempt, and the
    /// save is to run as a save into an existing directory.
    Fallback,
}

/// The sibling's name for a prefix named `name`: fixed, so that a killed save's leftovers are
/// found by the next save to the same prefix (FNV-1a, stable across builds).
pub fn sibling_name(name: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{SIBLING_PREFIX}{hash:016x}")
}

/// Builds the tree in the sibling of `target` and renames it into place. `before_publish`
/// runs just before the rename (tests make the prefix appear there).
pub fn write(
    target: &Path,
    root: &NodeSpec,
    leaves: &[LeafSpec<'_>],
    opts: SaveOptions,
    before_publish: &dyn Fn(),
) -> Result<Outcome> {
    let (Some(parent_path), Some(name)) = (target.parent(), target.file_name().and_then(|n| n.to_str()))
    else {
        return Ok(Outcome::Fallback);
    };
    std::fs::create_dir_all(parent_path).map_err(|e| Error::io(parent_path, e))?;
    let Ok(parent) = Dir::open(parent_path) else {
        return Ok(Outcome::Fallback);
    };
    let sibling_name = sibling_name(name);
    // Held (locked) until the tree is in place: then it is the lock of the prefix itself.
    let Some(sibling) = claim(&parent, &sibling_name) else {
        return Ok(Outcome::Fallback);
    };
    let built = build(&sibling, target, root, leaves, opts);
    let regions = match built {
        Ok(regions) => regions,
        Err(e) => {
            remove_built(&parent, &sibling_name, &sibling);
            return Err(e);
        }
    };
    before_publish();
    match parent.rename(&sibling_name, &parent, name, true) {
        Ok(()) => {}
        Err(e) if refused(&e) => {
            drop(regions);
            remove_built(&parent, &sibling_name, &sibling);
            return Ok(Outcome::Fallback);
        }
        Err(e) => {
            drop(regions);
            remove_built(&parent, &sibling_name, &sibling);
            return Err(Error::io(target, e));
        }
    }
    if opts.durable {
        parent.sync().map_err(|e| Error::io(parent_path, e))?;
    }
    Ok(Outcome::Done(regions))
}

/// The prefix appeared (`EEXIST`, `ENOTEMPTY`: a directory; `ENOTDIR`: something else) or
/// no exclusive rename here (`EINVAL`).
fn refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EEXIST | libc::ENOTEMPTY | libc::ENOTDIR | libc::EINVAL)
    )
}

/// Creates and locks the sibling, after removing a killed save's one. None: it is another
/// live save's (or cannot be made or locked here).
fn claim(parent: &Dir, name: &str) -> Option<Dir> {
    for attempt in 0..2 {
        match parent.create_dir(name) {
            Ok(dir) => {
                return match dir.lock(true, false) {
                    Ok(true) => still_at(parent, name, &dir).then_some(dir),
                    // A sweep opened it between the mkdir and the lock: it removes it.
                    Ok(false) => None,
                    // No flock here: without it a live save cannot be told from a dead one.
                    Err(_) => {
                        // Only our empty directory goes (anything in it keeps it).
                        let _ = parent.remove_dir(name);
                        None
                    }
                };
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt == 0 => {
                if !remove_dead(parent, name) {
                    return None;
                }
            }
            Err(_) => return None,
        }
    }
    None
}

/// True while `dir` is the directory at `name` in `parent` (not renamed into place yet).
fn still_at(parent: &Dir, name: &str, dir: &Dir) -> bool {
    match (parent.stat(name), dir.identity()) {
        (Ok(Some(st)), Ok(id)) => st.kind == EntryKind::Dir && st.id() == id,
        _ => false,
    }
}

/// Removes the sibling of a killed save: a real directory at `name` whose lock is free (its
/// save is gone) and that is still there once locked (not renamed into place). Only what a
/// save builds there goes; anything else keeps it. Returns whether it is gone.
fn remove_dead(parent: &Dir, name: &str) -> bool {
    let Ok(stale) = parent.open_dir(name) else {
        return false;
    };
    if !matches!(stale.lock(true, false), Ok(true)) || !still_at(parent, name, &stale) {
        return false;
    }
    remove_layout(&stale, 0);
    parent.remove_dir(name).is_ok()
}

/// Removes the dead siblings among `names` (the entries of `dir`): those of saves to prefixes
/// inside `dir` killed before their rename. A live save's (its lock held) stays.
pub fn sweep(dir: &Dir, names: &[String]) {
    for name in names.iter().filter(|n| n.starts_with(SIBLING_PREFIX)) {
        if dir.kind(name).ok() == Some(EntryKind::Dir) {
            // One that cannot go stays for a later save: nothing is lost.
            let _ = remove_dead(dir, name);
        }
    }
}

/// Removes the dead sibling of the prefix `target`, which exists now (a user's `mkdir`, or a
/// save to a prefix inside it, made it after the killed save that left the sibling). Skipped
/// when the parent cannot be read: a save into an existing prefix needs no access to it.
pub fn remove_own_dead(target: &Path) {
    let (Some(parent), Some(name)) = (target.parent(), target.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let Ok(parent) = Dir::open(parent) else { return };
    let sibling = sibling_name(name);
    if parent.kind(&sibling).ok() == Some(EntryKind::Dir) {
        let _ = remove_dead(&parent, &sibling);
    }
}

/// Removes this save's sibling after a failure (it holds the lock, so no one else does this).
fn remove_built(parent: &Dir, name: &str, sibling: &Dir) {
    if still_at(parent, name, sibling) {
        remove_layout(sibling, 0);
        // Only an empty directory goes; one that still holds anything stays (nothing lost).
        let _ = parent.remove_dir(name);
    }
}

/// Removes the names a save writes (data files, meta.json files, the directories of
/// sub-trees once empty), never following a link; anything else stays where it is.
fn remove_layout(dir: &Dir, depth: usize) {
    let Ok(names) = dir.entry_names() else { return };
    for name in names {
        match dir.kind(&name) {
            Ok(EntryKind::Dir) if depth <= format::MAX_DEPTH => {
                if let Ok(sub) = dir.open_dir(&name) {
                    remove_layout(&sub, depth + 1);
                }
                // A directory still holding something foreign stays: nothing is lost.
                let _ = dir.remove_dir(&name);
            }
            Ok(EntryKind::File) if name == format::META_FILE || name.ends_with(".memmap") => {
                // One that cannot go stays for the next attempt: nothing is lost.
                let _ = dir.remove_file(&name);
            }
            _ => {}
        }
    }
}

/// Writes the whole tree into the sibling (files at their final names) and maps the leaves.
fn build(
    sibling: &Dir,
    target: &Path,
    root: &NodeSpec,
    leaves: &[LeafSpec<'_>],
    opts: SaveOptions,
) -> Result<Vec<Option<Region>>> {
    let mut staging = Staging::around(sibling.reopen().map_err(|e| Error::io(target, e))?);
    let mut plan = Plan::new(leaves.len(), target);
    plan.node(
        sibling,
        &mut staging,
        &mut Vec::new(),
        root,
        leaves,
        opts,
        false,
        0,
        None,
        false,
    )?;
    crate::sys::reclaim::make_room(sibling, plan.data_bytes(leaves));
    plan.write_data(&staging, leaves, opts)?;
    if opts.durable {
        plan.sync_staged_dirs(&staging)?;
        staging.sync()?;
    }
    Ok(plan.into_regions())
}

#[cfg(test)]
mod tests;
