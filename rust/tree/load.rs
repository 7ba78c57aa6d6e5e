//! Validating loads and integrity checks of saved trees. No pyo3 here.
//!
//! The loader is a validator first: meta.json size is bounded, shapes use checked arithmetic,
//! dtypes come from a fixed table, every data file must hold at least shape x itemsize bytes,
//! keys are encoded into single path components and opened with `O_NOFOLLOW` relative to their
//! directory, so nothing resolves outside the prefix or through a symlink, and pickles are
//! never read. A damaged directory raises; it never loads as wrong data.
//!
//! `load/leaf.rs` holds what one leaf's files need (its file name, a nested leaf's table of
//! component shapes, the data file opened, checked and mapped; single files), `load/verify.rs`
//! the check that reports every problem of a tree instead of raising on the first
//! (`verify_tree`); the walk that loads a whole tree is here.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::format::{self, Entry, Layout, LeafMeta, NodeMeta, StackMeta, TensorDictMeta};
use crate::sys::dir::Dir;
use crate::sys::identity::Stamp;
use crate::sys::identity::{self, FileId};
use crate::sys::pool;
use crate::sys::storage::Region;
use crate::tree::commit;
use crate::tree::read::{
    open_child_dir, read_meta, read_meta_stamped, read_stack_stamped, tensorclass_fields,
};

mod leaf;
mod verify;

pub use leaf::{check_nested_table, open_file, read_nested_table, split_file_path};
use leaf::{leaf_name, map_leaf, read_nested, LeafJob};
pub use verify::verify_tree;

/// One loaded entry. Leaves point into the flat region list returned beside the tree.
#[derive(Debug)]
pub enum LoadedEntry {
    Leaf {
        dtype: &'static str,
        shape: Vec<u64>,
        index: usize,
        /// A nested leaf's table of component shapes and layout (`shape` is the table's).
        nested: Option<LoadedNested>,
    },
    Node(LoadedNode),
    /// A NonTensorData, and the token of the meta.json it was read from
    /// (`format::meta::meta_token`; None where there is no file to write again: an archive).
    NonTensor(Value, Option<u64>),
    /// A NonTensorStack, and the token of its meta.json (as for `NonTensor`).
    Stack(StackMeta, Option<u64>),
}

/// What a nested leaf needs besides its data: the shape of every component (`dims` sizes per
/// component, row-major) and its layout.
#[derive(Debug, Clone)]
pub struct LoadedNested {
    pub sizes: Vec<i64>,
    pub dims: u64,
    pub layout: Layout,
}

/// A loaded TensorDict directory.
#[derive(Debug)]
pub struct LoadedNode {
    pub batch: Vec<u64>,
    pub device: Option<String>,
    pub entries: Vec<(String, LoadedEntry)>,
    /// For a tensorclass directory: its meta.json (JSON text), which names the class; the
    /// node is then the TensorDict of its `_tensordict/` sub-directory.
    pub class: Option<String>,
}

/// How many times a load starts again when a save commits into the tree under it.
const COMMIT_RETRIES: usize = 50;

/// Loads and validates the tree at `prefix`, mapping every leaf.
/// Returns the tree and one region per leaf (None for empty leaves).
///
/// A commit that an earlier save left unfinished is finished first (see `commit.rs`). The
/// load then reads without a lock and checks at the end that no commit ran meanwhile: no
/// journal appeared, and the root meta.json is still the file it opened first (held open, so
/// its inode cannot be reused). Otherwise it starts again, so a reader sees one whole version.
pub fn load_tree(prefix: &Path) -> Result<(LoadedNode, Vec<Option<Region>>)> {
    if let Ok(absolute) = std::path::absolute(prefix) {
        commit::settle_ancestors(&absolute);
    }
    let mut attempt = 0;
    loop {
        let root = Dir::open(prefix).map_err(|e| Error::io(prefix, e))?;
        let root_id = root.identity().map_err(|e| Error::io(prefix, e))?;
        commit::settle(&root)?;
        // Held open for the whole load, the root meta.json's inode cannot be reused.
        let pin = root.open_read(format::META_FILE).ok();
        let pinned = pin.as_ref().and_then(|f| identity::of_file(f).ok());
        let mut found = Found::default();
        let result = load_from(&root, &mut found);
        let changed = commit::journal_present(&root)
            || pinned.is_none()
            || meta_identity(&root) != pinned
            || identity::of_path(prefix).ok() != Some(root_id)
            || sub_trees_changed(&root, &found.stamps);
        if !changed {
            return result;
        }
        if attempt >= COMMIT_RETRIES {
            return result.and_then(|_| {
                Err(Error::invalid(
                    prefix,
                    "saves kept replacing this tree while it was being loaded; try again",
                ))
            });
        }
        attempt += 1;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// True when a sub-directory's meta.json is no longer the one the walk read (its identity,
/// size or modification time changed): a save to that sub-directory as its own prefix
/// committed during the load. (A commit moves its root meta.json away as its first step, so
/// one still in progress shows here too.) One `stat` per directory, no descriptor held.
fn sub_trees_changed(root: &Dir, stamps: &[(Vec<String>, Stamp)]) -> bool {
    stamps.iter().any(|(rel, stamp)| {
        root.stat_rel(rel, format::META_FILE)
            .ok()
            .flatten()
            .map(Stamp::from)
            != Some(*stamp)
    })
}

/// The identity of the root meta.json now in place.
fn meta_identity(root: &Dir) -> Option<FileId> {
    root.stat(format::META_FILE).ok().flatten().map(|st| st.id())
}

/// Leaves mapped per claim of the worker pool: one directory open per claim.
const MAP_GROUP: usize = 128;

/// The leaf files of one directory (at most `MAP_GROUP` of them), to map together.
struct MapGroup {
    rel: Vec<String>,
    jobs: Vec<LeafJob>,
}

/// What the walk gathers besides the tree: the leaf files to map, and the stamp of every
/// sub-directory's meta.json (checked again at the end of the load).
#[derive(Default)]
struct Found {
    groups: Vec<MapGroup>,
    count: usize,
    stamps: Vec<(Vec<String>, Stamp)>,
}

/// Walks and maps the tree. `found` keeps the stamps of the sub-directories' meta.json read
/// so far even when the load fails: a failure they explain (a save to a sub-tree committed
/// meanwhile) is a race to retry, not damage.
fn load_from(root: &Dir, found: &mut Found) -> Result<(LoadedNode, Vec<Option<Region>>)> {
    let mut rel = Vec::new();
    let (meta, class) = match read_meta(root)? {
        NodeMeta::TensorDict(m) => (m, None),
        NodeMeta::NonTensor(_) | NodeMeta::Stack(_) => {
            return Err(Error::unsupported(
                root.path(),
                "this directory holds non-tensor values only, not a TensorDict",
            ))
        }
        NodeMeta::TensorClass(class) => {
            rel.push(format::TENSORCLASS_DIR.to_string());
            (tensorclass_fields(root)?.1, Some(class))
        }
    };
    let mut node = walk(root, &mut rel, 0, &[], meta, found)?;
    node.class = class.map(|c| Value::Object(c).to_string());
    let groups = std::mem::take(&mut found.groups);
    let count = found.count;
    // Every directory's meta.json is read first; then the files are mapped in parallel, a
    // group at a time (each worker holds one directory open while it maps its group).
    let leaves: usize = groups.iter().map(|g: &MapGroup| g.jobs.len()).sum();
    let workers = pool::worker_count(0, leaves / 256);
    let mapped = pool::run(
        &groups,
        workers,
        |g| g.jobs.len(),
        |group| {
            let path = group.rel.iter().fold(root.path().to_path_buf(), |p, c| p.join(c));
            let dir = root.open_rel(&group.rel).map_err(|e| Error::io(&path, e))?;
            group
                .jobs
                .iter()
                .map(|job| map_leaf(&dir, job))
                .collect::<Result<Vec<_>>>()
        },
    )?;
    let regions: Vec<Option<Region>> = mapped.into_iter().flatten().collect();
    debug_assert_eq!(regions.len(), count);
    Ok((node, regions))
}

/// Opens the sub-directory of `key` and reads its meta.json. When a save to it as its own
/// prefix is committing or was interrupted there (its own journal), waits for it or finishes
/// it first (see `commit::settle`), so a sub-tree is never read in the middle of its own
/// commit. A commit can also start between that check and the read (its first step moves the
/// meta.json aside): a read that fails while a journal appeared, or while the meta.json in
/// place changed, is such a race, and the sub-tree is settled and read again.
fn read_settled_child(parent: &Dir, key: &str) -> Result<(Dir, NodeMeta, Stamp, u64)> {
    let mut attempt = 0;
    loop {
        let child = open_child_dir(parent, key)?;
        if commit::journal_present(&child) {
            commit::settle(&child)?;
        }
        let before = meta_stamp(&child);
        match read_meta_stamped(&child) {
            Ok((meta, stamp, token)) => return Ok((child, meta, stamp, token)),
            Err(err) => {
                let raced = commit::journal_present(&child) || meta_stamp(&child) != before;
                if !raced || attempt >= COMMIT_RETRIES {
                    return Err(err);
                }
            }
        }
        attempt += 1;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The stamp of the meta.json in `dir` now (None: there is none, or it cannot be read).
fn meta_stamp(dir: &Dir) -> Option<Stamp> {
    dir.stat(format::META_FILE).ok().flatten().map(Stamp::from)
}

/// Loads the directory at `rel` below `root`, whose meta.json (`meta`) its parent read
/// (each meta.json is read and parsed once). Only this directory is open while its entries
/// are walked; sub-trees are opened afresh from the root afterwards, so the descriptors in
/// use stay a small constant whatever the shape of the tree.
fn walk(
    root: &Dir,
    rel: &mut Vec<String>,
    depth: usize,
    parent_batch: &[u64],
    meta: TensorDictMeta,
    found: &mut Found,
) -> Result<LoadedNode> {
    let path = rel.iter().fold(root.path().to_path_buf(), |p, c| p.join(c));
    if depth > format::MAX_DEPTH {
        return Err(Error::invalid(&path, "the tree is nested too deeply"));
    }
    let dir = root.open_rel(rel).map_err(|e| Error::io(&path, e))?;
    if !meta.batch.starts_with(parent_batch) {
        return Err(Error::invalid(
            &path,
            format!(
                "batch size {:?} does not start with its parent's {:?}",
                meta.batch, parent_batch
            ),
        ));
    }
    let mut entries: Vec<(String, Option<LoadedEntry>)> = Vec::with_capacity(meta.entries.len());
    let mut jobs = Vec::new();
    let mut children = Vec::new();
    for (key, entry) in meta.entries {
        match entry {
            Entry::Leaf(leaf) => {
                let index = found.count + jobs.len();
                let (nested, nbytes, name) = match leaf.nested {
                    Some(_) => {
                        let name = leaf_name(&dir, &key)?;
                        let (loaded, nbytes) = read_nested(&dir, &key, &name, &leaf, &meta.batch)?;
                        (Some(loaded), nbytes, name)
                    }
                    None if leaf.nbytes > 0 => (None, leaf.nbytes, leaf_name(&dir, &key)?),
                    None => (None, 0, String::new()),
                };
                let LeafMeta { dtype, shape, .. } = leaf;
                jobs.push(LeafJob {
                    name,
                    key: Some(key.clone()),
                    nbytes,
                    exact: nested.is_some(),
                });
                entries.push((
                    key,
                    Some(LoadedEntry::Leaf {
                        dtype: dtype.name,
                        shape,
                        index,
                        nested,
                    }),
                ));
            }
            Entry::Stack => {
                let (stack, stamp, token) = read_stack_stamped(&dir, &key, &meta.batch)?;
                let mut child_rel = rel.clone();
                child_rel.push(format::encode_key(&key));
                found.stamps.push((child_rel, stamp));
                entries.push((key, Some(LoadedEntry::Stack(stack, Some(token)))));
            }
            Entry::Collection => {
                let (child, child_meta, stamp, token) = read_settled_child(&dir, &key)?;
                let mut child_rel = rel.clone();
                child_rel.push(format::encode_key(&key));
                found.stamps.push((child_rel, stamp));
                match child_meta {
                    NodeMeta::NonTensor(value) => {
                        entries.push((key, Some(LoadedEntry::NonTensor(value, Some(token)))))
                    }
                    NodeMeta::Stack(mut stack) => {
                        crate::tree::read::check_stack(
                            &mut stack,
                            &key,
                            &meta.batch,
                            &child.child_path(format::META_FILE),
                        )?;
                        entries.push((key, Some(LoadedEntry::Stack(stack, Some(token)))));
                    }
                    NodeMeta::TensorDict(sub) => {
                        children.push((entries.len(), format::encode_key(&key), sub, None));
                        entries.push((key, None));
                    }
                    NodeMeta::TensorClass(class) => {
                        let sub = tensorclass_fields(&child)?.1;
                        children.push((entries.len(), format::encode_key(&key), sub, Some(class)));
                        entries.push((key, None));
                    }
                }
            }
        }
    }
    found.count += jobs.len();
    let mut jobs = jobs.into_iter().peekable();
    while jobs.peek().is_some() {
        found.groups.push(MapGroup {
            rel: rel.clone(),
            jobs: jobs.by_ref().take(MAP_GROUP).collect(),
        });
    }
    drop(dir);
    for (at, name, sub, class) in children {
        rel.push(name);
        if class.is_some() {
            rel.push(format::TENSORCLASS_DIR.to_string());
        }
        let node = walk(root, rel, depth + 1, &meta.batch, sub, found);
        if class.is_some() {
            rel.pop();
        }
        rel.pop();
        let mut node = node?;
        node.class = class.map(|c| Value::Object(c).to_string());
        entries[at].1 = Some(LoadedEntry::Node(node));
    }
    Ok(LoadedNode {
        class: None,
        batch: meta.batch,
        device: meta.device,
        entries: entries
            .into_iter()
            .map(|(k, e)| (k, e.expect("every entry was filled")))
            .collect(),
    })
}

#[cfg(test)]
mod tests;
