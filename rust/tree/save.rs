//! Saves of a whole tree into a directory that stays the user's.
//!
//! The target directory is kept (see `commit.rs` for the staging, the journal and the
//! recovery): new data files and meta.json files are staged inside it, then renamed over the
//! old names after the commit point. A leaf whose source already is the file at its target
//! name (same device and inode, mapped shared) keeps that file, so handles on it and other
//! processes' maps stay shared with the directory; every other leaf gets a new file, so
//! readers of the old version keep theirs. Files of the old tree that the new one drops are
//! removed; anything the old tree does not own (a user's files, sub-directories, mounts,
//! symlinks) is never replaced, moved or followed: a save that would have to replace one
//! refuses before it changes anything.
//!
//! `save/validate.rs` checks a tree before anything is written, `save/plan.rs` walks it against
//! the old one and stages its files, `save/fresh.rs` builds a new prefix beside it and moves it
//! into place, `save/file.rs` writes single files (`from_tensor`).

use std::io;
use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::format;
use crate::sys::dir::{Dir, EntryKind};
use crate::sys::identity::FileId;
use crate::sys::reclaim;
use crate::sys::storage::Region;
use crate::tree::commit::{self, SaveLock, Staging};

mod file;
#[cfg(any(target_os = "linux", target_os = "android"))]
pub mod fresh;
mod plan;
mod validate;

pub use file::write_file;
use plan::Plan;
pub use validate::validate;

/// One tensor leaf to save. `data` is `None` for `memmap_like` (an existing file is kept
/// as it is; a new one is zero-filled).
pub struct LeafSpec<'a> {
    pub dtype: String,
    pub shape: Vec<u64>,
    pub device: String,
    pub data: Option<&'a [u8]>,
    pub nbytes: usize,
    /// (device, inode) of the file the source maps (shared), when that file may be the
    /// one at the leaf's target name: then it is kept instead of rewritten.
    pub same_file: Option<FileId>,
    /// A nested leaf: `shape` is `[components, dims]` and `data` its components back to back.
    pub nested: Option<NestedSpec>,
}

/// What a nested leaf saves besides its data: the table of its component shapes (int64,
/// little-endian, `components x dims`), written as `key.shape.memmap`, and its layout.
pub struct NestedSpec {
    pub table: Vec<u8>,
    pub jagged: bool,
}

impl LeafSpec<'_> {
    /// The leaf's entry in its directory's meta.json.
    pub fn entry_meta(&self) -> crate::format::EntryMeta<'_> {
        match &self.nested {
            None => crate::format::EntryMeta::Leaf {
                dtype: &self.dtype,
                shape: &self.shape,
                device: &self.device,
            },
            Some(nested) => crate::format::EntryMeta::Nested {
                dtype: &self.dtype,
                shape: &self.shape,
                device: &self.device,
                jagged: nested.jagged,
            },
        }
    }
}

/// One entry of a node: a leaf (index into the flat leaf list), a sub-tree or a JSON value.
pub enum EntrySpec {
    Leaf(usize),
    Node(NodeSpec),
    NonTensor(Value),
    /// A NonTensorStack: its meta.json (`format::stack::meta_bytes`).
    Stack(Vec<u8>),
}

impl EntrySpec {
    /// The meta.json of a directory that holds only values (NonTensorData, NonTensorStack).
    pub fn value_dir(&self) -> Option<(std::borrow::Cow<'_, [u8]>, crate::format::EntryMeta<'static>)> {
        match self {
            EntrySpec::NonTensor(value) => Some((
                crate::format::non_tensor_meta(value).into(),
                crate::format::EntryMeta::NonTensorData,
            )),
            EntrySpec::Stack(bytes) => {
                Some((bytes.as_slice().into(), crate::format::EntryMeta::NonTensorStack))
            }
            _ => None,
        }
    }
}

/// A TensorDict to save.
pub struct NodeSpec {
    pub batch: Vec<u64>,
    pub entries: Vec<(String, EntrySpec)>,
    /// Set when the TensorDict is a tensorclass's: the node is then saved in tensordict's
    /// tensorclass layout (`meta.json` naming the class, the TensorDict in `_tensordict/`).
    pub class: Option<ClassSpec>,
}

/// The class of a tensorclass node.
pub struct ClassSpec {
    /// The class's `__name__`, recorded in the parent's meta.json entry (`{"type": name}`).
    pub name: String,
    /// The bytes of the tensorclass directory's own meta.json.
    pub meta: Vec<u8>,
}

/// How to save.
#[derive(Clone, Copy, Debug, Default)]
pub struct SaveOptions {
    /// Replace an existing tree at the prefix (otherwise `FileExistsError`).
    pub existsok: bool,
    /// fsync data files, meta.json files and directories before returning.
    pub durable: bool,
    /// Writer threads; 0 picks one per CPU.
    pub num_threads: usize,
    /// New zero-filled files (`memmap_like`) are sparse instead of reserved: faster, but a
    /// full disk then shows as SIGBUS on first write instead of ENOSPC here.
    pub sparse: bool,
}

/// Writes the tree to `prefix` (created if missing) and maps every leaf file.
/// Returns one region per leaf (None for empty leaves, which have no file).
pub fn write_tree(
    prefix: &Path,
    root: &NodeSpec,
    leaves: &[LeafSpec<'_>],
    opts: SaveOptions,
) -> Result<Vec<Option<Region>>> {
    write_tree_hooked(prefix, root, leaves, opts, &|| {})
}

/// `write_tree`; `before_publish` runs just before a new prefix is renamed into place
/// (`fresh::write`), for tests that make the prefix appear there.
pub(crate) fn write_tree_hooked(
    prefix: &Path,
    root: &NodeSpec,
    leaves: &[LeafSpec<'_>],
    opts: SaveOptions,
    before_publish: &dyn Fn(),
) -> Result<Vec<Option<Region>>> {
    validate(root, leaves, prefix)?;
    let target = std::path::absolute(prefix).map_err(|e| Error::io(prefix, e))?;
    let existing = match Dir::open(&target) {
        Ok(dir) => Some(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(&target, e)),
    };
    let (dir, created) = match existing {
        Some(dir) => (dir, false),
        None => {
            // A new prefix is built whole beside it and moved in with one rename.
            #[cfg(any(target_os = "linux", target_os = "android"))]
            if let fresh::Outcome::Done(regions) = fresh::write(&target, root, leaves, opts, before_publish)?
            {
                return Ok(regions);
            }
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            before_publish();
            open_or_create(&target)?
        }
    };
    // The trees holding the prefix first (shared), then the prefix (exclusive): top-down.
    let ancestors = commit::AncestorLocks::acquire(&target);
    let lock = SaveLock::acquire(&dir)?;
    let result = (|| {
        commit::recover(&dir)?;
        let _names = commit::sweep(&dir);
        // Hidden siblings of killed saves to a new prefix: this prefix's own (it exists now)
        // and those of prefixes inside this tree.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            fresh::sweep(&dir, &_names);
            fresh::remove_own_dead(&target);
        }
        if !opts.existsok {
            refuse_existing(&dir, root)?;
        }
        save_locked(&dir, root, leaves, opts)
    })();
    // Released first: on Windows the lock is a file inside the directory.
    drop(lock);
    #[cfg(unix)]
    drop(ancestors);
    #[cfg(not(unix))]
    let _ = ancestors; // holds nothing there (Windows locks are files)
    if result.is_err() && created {
        // We made the directory for this save: leave no empty one behind.
        let _ = std::fs::remove_dir(&target);
    }
    result
}

/// Opens the prefix (following a symlink the user gave as the prefix), creating it when
/// missing. Returns whether this call created it.
fn open_or_create(target: &Path) -> Result<(Dir, bool)> {
    match Dir::open(target) {
        Ok(dir) => return Ok((dir, false)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(target, e)),
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    let created = match std::fs::create_dir(target) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(Error::io(target, e)),
    };
    let dir = Dir::open(target).map_err(|e| Error::io(target, e))?;
    Ok((dir, created))
}

pub(crate) fn already_exists() -> io::Error {
    #[cfg(unix)]
    {
        io::Error::from_raw_os_error(libc::EEXIST)
    }
    #[cfg(not(unix))]
    {
        io::ErrorKind::AlreadyExists.into()
    }
}

/// With `existsok=False`, an existing tree (or any entry this tree would write) is an error.
/// Decided under the save lock, and checked again after the commit point.
fn refuse_existing(dir: &Dir, root: &NodeSpec) -> Result<()> {
    let mut names = vec![format::META_FILE.to_string()];
    for (key, entry) in &root.entries {
        names.push(match entry {
            EntrySpec::Leaf(_) => format::leaf_file(key),
            _ => format::encode_key(key),
        });
    }
    for name in names {
        if dir.kind(&name).map_err(|e| Error::io(dir.child_path(&name), e))? != EntryKind::Missing {
            return Err(Error::io(dir.child_path(&name), already_exists()));
        }
    }
    Ok(())
}

/// The save itself, under the lock: plan and stage, commit, apply.
fn save_locked(
    root: &Dir,
    spec: &NodeSpec,
    leaves: &[LeafSpec<'_>],
    opts: SaveOptions,
) -> Result<Vec<Option<Region>>> {
    let mut staging = Staging::new(root)?;
    let mut plan = Plan::new(leaves.len(), root.path());
    let staged = (|| {
        plan.node(
            root,
            &mut staging,
            &mut Vec::new(),
            spec,
            leaves,
            opts,
            true,
            0,
            None,
            false,
        )?;
        // The files earlier saves replaced may still be being freed: wait for them only
        // when this save needs their room.
        reclaim::make_room(root, plan.data_bytes(leaves));
        plan.write_data(&staging, leaves, opts)?;
        if opts.durable {
            plan.sync_staged_dirs(&staging)?;
            staging.sync()?;
        }
        let (journal, regions) = plan.journal(&staging)?;
        commit::check_writable(root, &journal)?;
        commit::write_journal(root, &staging, &journal, opts.durable)?;
        Ok((journal, regions))
    })();
    let (journal, regions) = match staged {
        Ok(done) => done,
        Err(e) => {
            staging.remove(root);
            return Err(e);
        }
    };
    // Past the commit point. Without flock another save may have got in first: look again.
    if !opts.existsok && journal_would_replace(root) {
        commit::withdraw_journal(root);
        staging.remove(root);
        return Err(Error::io(root.child_path(format::META_FILE), already_exists()));
    }
    let finished = commit::apply(root, journal, opts.durable, Some(&staging))?;
    drop(staging);
    match finished {
        commit::Finished::Done { dropped } => match dropped.first() {
            None => Ok(regions),
            // The rest of the tree is saved; the caller must know this key is not.
            Some(path) => Err(Error::io(
                path,
                io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "the save finished without {} key(s) ({}): something this tree does not own took the name during the save and was kept (move it away and save again)",
                        dropped.len(),
                        dropped
                            .iter()
                            .filter_map(|p| p.file_name())
                            .map(|n| n.to_string_lossy().into_owned())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ),
            )),
        },
        commit::Finished::Superseded => Err(Error::io(
            root.child_path(format::META_FILE),
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                "another program wrote this tree while it was being saved; its version was kept, and this save's is not in place",
            ),
        )),
    }
}

fn journal_would_replace(root: &Dir) -> bool {
    root.kind(format::META_FILE)
        .map_or(true, |k| k != EntryKind::Missing)
}

/// Rewrites the meta.json of the value directory of `key` in the saved directory `parent`
/// (a NonTensorStack written again after one of its rows changed), atomically: the new file
/// is written beside it and renamed over it, so a reader sees the old values or the new ones.
/// The directory is opened without following a symlink; its meta.json must be a stack's (or,
/// with `non_tensor`, a NonTensorData's: one value written again in place).
///
/// `expected`: the token (`format::meta::meta_token`) of the meta.json the caller's tree was
/// loaded from or last wrote there. A meta.json with another token is a newer save's (this
/// library's or tensordict's, which the caller's tree does not hold): it is refused, naming
/// the file, and left as it is. None: no check (what the file holds is replaced). Returns the
/// token of the meta.json written, for the next rewrite.
pub fn rewrite_value_dir(
    parent: &Path,
    key: &str,
    meta: &[u8],
    durable: bool,
    expected: Option<u64>,
) -> Result<u64> {
    rewrite_value_meta(parent, key, meta, durable, false, expected)
}

/// `rewrite_value_dir`, for a stack's directory or (`non_tensor`) a NonTensorData's.
pub fn rewrite_value_meta(
    parent: &Path,
    key: &str,
    meta: &[u8],
    durable: bool,
    non_tensor: bool,
    expected: Option<u64>,
) -> Result<u64> {
    let root = Dir::open(parent).map_err(|e| Error::io(parent, e))?;
    let dir = crate::tree::read::open_child_dir(&root, key)?;
    // A save of a tree that holds this directory (exclusive on its root) and this rewrite
    // (shared on it) run one after the other, as do two rewrites of this directory: what is
    // checked below is still in place when the new file replaces it. (Unix only: Windows
    // locks are files, which would appear in the value directory.)
    #[cfg(unix)]
    let _locks = {
        let absolute = std::path::absolute(dir.path()).map_err(|e| Error::io(dir.path(), e))?;
        let ancestors = commit::AncestorLocks::acquire(&absolute);
        (ancestors, SaveLock::acquire(&dir)?)
    };
    rewrite_locked(&dir, key, meta, durable, non_tensor, expected)
}

fn rewrite_locked(
    dir: &Dir,
    key: &str,
    meta: &[u8],
    durable: bool,
    non_tensor: bool,
    expected: Option<u64>,
) -> Result<u64> {
    let path = dir.child_path(format::META_FILE);
    let (current, _, token) = crate::tree::read::read_meta_limited_stamped(dir, format::VALUE_META_LIMIT)?;
    match (current, non_tensor) {
        (format::NodeMeta::Stack(_), false) | (format::NodeMeta::NonTensor(_), true) => {}
        _ => {
            let kind = if non_tensor {
                "a NonTensorData's"
            } else {
                "a stack's"
            };
            return Err(Error::invalid(
                &path,
                format!("key {key:?}: this meta.json is not {kind}; refusing to replace it"),
            ));
        }
    }
    if expected.is_some_and(|t| t != token) {
        return Err(Error::tree(
            &path,
            format!(
                "key {key:?}: this meta.json is not the one this tree was loaded from or last wrote (the directory was saved again since); not written, the newer save's values are kept (load the directory again to write into it)"
            ),
        ));
    }
    let temp = format!(".{}.{}.tmp", format::META_FILE, std::process::id());
    let io_err = |e| Error::io(&path, e);
    let _ = dir.remove_file(&temp); // a leftover of a crashed rewrite of this process id
    dir.write_new(&temp, meta, durable).map_err(io_err)?;
    dir.rename(&temp, dir, format::META_FILE, false).map_err(|e| {
        let _ = dir.remove_file(&temp);
        io_err(e)
    })?;
    if durable {
        dir.sync().map_err(io_err)?;
    }
    Ok(format::meta::meta_token(meta))
}

/// The token (`format::meta::meta_token`) of the meta.json of the value directory of `key` in
/// `parent` (a NonTensorStack's or a NonTensorData's), as it is now: what a tree that has just
/// saved it passes to its next rewrite.
pub fn value_meta_token(parent: &Path, key: &str) -> Result<u64> {
    let root = Dir::open(parent).map_err(|e| Error::io(parent, e))?;
    let dir = crate::tree::read::open_child_dir(&root, key)?;
    let path = dir.child_path(format::META_FILE);
    match crate::tree::read::read_meta_limited_stamped(&dir, format::VALUE_META_LIMIT)? {
        (format::NodeMeta::Stack(_) | format::NodeMeta::NonTensor(_), _, token) => Ok(token),
        _ => Err(Error::invalid(
            &path,
            format!("key {key:?}: this meta.json is not a NonTensorData's or a NonTensorStack's"),
        )),
    }
}

#[cfg(test)]
mod tests;
