//! Validating loads and integrity checks of saved trees. No pyo3 here.
//!
//! The loader is a validator first: meta.json size is bounded, shapes use checked arithmetic,
//! dtypes come from a fixed table, every data file must hold at least shape x itemsize bytes,
//! keys are encoded into single path components and opened with `O_NOFOLLOW` relative to their
//! directory, so nothing resolves outside the prefix or through a symlink, and pickles are
//! never read. A damaged directory raises; it never loads as wrong data.

use std::io;
use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::format::{self, Entry, Layout, LeafMeta, NodeMeta, StackMeta, TensorDictMeta};
use crate::sys::dir::{self, Dir, EntryKind};
use crate::sys::identity::Stamp;
use crate::sys::identity::{self, FileId};
use crate::sys::pool;
use crate::sys::storage::{self, MapMode, Region};
use crate::tree::commit;
use crate::tree::read::{
    open_child_dir, read_meta, read_meta_stamped, read_stack, read_stack_stamped, tensorclass_fields,
};

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
    NonTensor(Value),
    Stack(StackMeta),
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

/// A leaf file to open and map, found while walking.
struct LeafJob {
    name: String,
    /// The leaf's key (None: a single file, see `open_file`), for messages only.
    key: Option<String>,
    nbytes: usize,
    /// The file must hold exactly `nbytes` (a nested leaf's data: a longer file means the
    /// table of component shapes does not describe it).
    exact: bool,
}

impl LeafJob {
    /// How messages name the leaf, e.g. `key "obs"` (made only when a message is).
    fn label(&self) -> String {
        match &self.key {
            Some(key) => format!("key {key:?}"),
            None => "this tensor".into(),
        }
    }
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
fn read_settled_child(parent: &Dir, key: &str) -> Result<(Dir, NodeMeta, Stamp)> {
    let mut attempt = 0;
    loop {
        let child = open_child_dir(parent, key)?;
        if commit::journal_present(&child) {
            commit::settle(&child)?;
        }
        let before = meta_stamp(&child);
        match read_meta_stamped(&child) {
            Ok((meta, stamp)) => return Ok((child, meta, stamp)),
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
                let (stack, stamp) = read_stack_stamped(&dir, &key, &meta.batch)?;
                let mut child_rel = rel.clone();
                child_rel.push(format::encode_key(&key));
                found.stamps.push((child_rel, stamp));
                entries.push((key, Some(LoadedEntry::Stack(stack))));
            }
            Entry::Collection => {
                let (child, child_meta, stamp) = read_settled_child(&dir, &key)?;
                let mut child_rel = rel.clone();
                child_rel.push(format::encode_key(&key));
                found.stamps.push((child_rel, stamp));
                match child_meta {
                    NodeMeta::NonTensor(value) => entries.push((key, Some(LoadedEntry::NonTensor(value)))),
                    NodeMeta::Stack(stack) => {
                        crate::tree::read::check_stack(
                            &stack,
                            &key,
                            &meta.batch,
                            &child.child_path(format::META_FILE),
                        )?;
                        entries.push((key, Some(LoadedEntry::Stack(stack))));
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

/// The file name of a leaf: the encoded key, or the raw legacy name when only that exists.
fn leaf_name(dir: &Dir, key: &str) -> Result<String> {
    let encoded = format::leaf_file(key);
    if let Some(raw) = format::legacy_name(key) {
        // (most keys encode to themselves: then there is no other name to look for)
        if encoded.strip_suffix(format::LEAF_SUFFIX) == Some(raw) {
            return Ok(encoded);
        }
        let legacy = format!("{raw}{}", format::LEAF_SUFFIX);
        if dir
            .kind(&encoded)
            .map_err(|e| Error::io(dir.child_path(&encoded), e))?
            == EntryKind::Missing
            && dir
                .kind(&legacy)
                .map_err(|e| Error::io(dir.child_path(&legacy), e))?
                != EntryKind::Missing
        {
            return Ok(legacy);
        }
    }
    Ok(encoded)
}

/// Parses a nested leaf's table of component shapes (`bytes`, int64 little-endian) and checks
/// it against the entry (`leaf`) and the batch size: its size exactly, no negative size, the
/// components' leading dims equal to the batch dims after the first. Returns the loaded
/// nested description and the data's exact size. `what` names the file in messages.
pub fn check_nested_table(
    bytes: &[u8],
    key: &str,
    leaf: &LeafMeta,
    batch: &[u64],
    path: &Path,
) -> Result<(LoadedNested, usize)> {
    let nested = leaf.nested.expect("a nested leaf");
    let want = nested.table_bytes().ok_or_else(|| {
        Error::invalid(
            path,
            format!("key {key:?}: the table of component shapes overflows"),
        )
    })?;
    if bytes.len() != want {
        return Err(Error::invalid(
            path,
            format!(
                "the table of component shapes of key {key:?} holds {} bytes; its entry ({} components of {} dims) needs {want}",
                bytes.len(),
                nested.components,
                nested.dims
            ),
        ));
    }
    let sizes: Vec<i64> = bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let tail = batch.get(1..).unwrap_or(&[]);
    let nbytes = format::nested_nbytes(&sizes, nested.dims as usize, leaf.dtype.itemsize, tail)
        .map_err(|why| Error::invalid(path, format!("key {key:?}: {why}")))?;
    if nested.layout == Layout::Jagged {
        // a jagged tensor is ragged in its first dim only: the others are one size for all
        let dims = nested.dims as usize;
        let mut rows = sizes.chunks_exact(dims.max(1));
        if let Some(first) = rows.next() {
            if let Some(i) = rows.position(|row| row[1..] != first[1..]) {
                return Err(Error::invalid(
                    path,
                    format!(
                        "key {key:?}: a jagged leaf's components differ after their first dim (component {} is {:?}, component 0 {first:?})",
                        i + 1,
                        &sizes[(i + 1) * dims..(i + 2) * dims]
                    ),
                ));
            }
        }
    }
    Ok((
        LoadedNested {
            sizes,
            dims: nested.dims,
            layout: nested.layout,
        },
        nbytes,
    ))
}

/// Reads and checks the table of component shapes of the nested leaf `key` in `dir`.
pub fn read_nested_table(
    dir: &Dir,
    key: &str,
    leaf: &LeafMeta,
    batch: &[u64],
) -> Result<(LoadedNested, usize)> {
    let name = leaf_name(dir, key)?;
    read_nested(dir, key, &name, leaf, batch)
}

/// Reads and checks a nested leaf's table of component shapes from `dir`.
fn read_nested(
    dir: &Dir,
    key: &str,
    name: &str,
    leaf: &LeafMeta,
    batch: &[u64],
) -> Result<(LoadedNested, usize)> {
    let table = format::shape_file(name);
    let path = dir.child_path(&table);
    let want = leaf.nested.and_then(|n| n.table_bytes()).ok_or_else(|| {
        Error::invalid(
            &path,
            format!("key {key:?}: the table of component shapes overflows"),
        )
    })?;
    // one byte more than needed: a longer file is refused, not cut
    let bytes = dir.read_limited(&table, want as u64 + 1).map_err(|e| match e {
        e if dir::is_symlink_refused(&e) => Error::symlink(
            &path,
            format!("the table of component shapes of key {key:?} is a symlink; refusing to follow it"),
        ),
        e if e.kind() == io::ErrorKind::NotFound => Error::invalid(
            &path,
            format!("the table of component shapes of key {key:?} is missing"),
        ),
        e if e.kind() == io::ErrorKind::InvalidData => Error::invalid(
            &path,
            format!("the table of component shapes of key {key:?} is longer than its entry says ({e})"),
        ),
        e if dir::is_not_regular(&e) => Error::invalid(
            &path,
            format!("the table of component shapes of key {key:?} is {e}"),
        ),
        e => Error::io(&path, e),
    })?;
    check_nested_table(&bytes, key, leaf, batch, &path)
}

/// Opens a leaf file (never blocking), checks it is a regular file long enough for its shape.
/// `path` is the file's path (`dir.child_path(&job.name)`), for messages.
fn check_leaf(dir: &Dir, job: &LeafJob, path: &Path) -> Result<(std::fs::File, bool, std::fs::Metadata)> {
    let (file, writable) = dir.open_file(&job.name).map_err(|e| match e {
        e if dir::is_symlink_refused(&e) => Error::symlink(
            path,
            format!(
                "the data file of {} is a symlink; refusing to follow it",
                job.label()
            ),
        ),
        e if e.kind() == io::ErrorKind::NotFound => {
            Error::invalid(path, format!("the data file of {} is missing", job.label()))
        }
        e if dir::is_not_regular(&e) => Error::invalid(path, format!("the data of {} is {e}", job.label())),
        e => Error::io(path, e),
    })?;
    let md = file.metadata().map_err(|e| Error::io(path, e))?;
    if job.exact && md.len() != job.nbytes as u64 {
        return Err(Error::invalid(
            path,
            format!(
                "the data file of {} holds {} bytes; its components need exactly {}",
                job.label(),
                md.len(),
                job.nbytes
            ),
        ));
    }
    if md.len() < job.nbytes as u64 {
        return Err(Error::invalid(
            path,
            format!(
                "the data file of {} is truncated: {} bytes, its shape needs {}",
                job.label(),
                md.len(),
                job.nbytes
            ),
        ));
    }
    Ok((file, writable, md))
}

/// Maps a checked leaf file: writable files shared (their space reserved first, so a full
/// disk is ENOSPC now and not SIGBUS on a later write), read-only files copy-on-write.
/// A file whose blocks already cover `nbytes` has nothing to reserve (the common case: files
/// written by a save), which spares a fallocate per leaf.
fn map_checked(
    file: &std::fs::File,
    writable: bool,
    md: &std::fs::Metadata,
    nbytes: usize,
    path: &Path,
) -> Result<Region> {
    let mode = if writable {
        if !storage::fully_allocated(md, nbytes) {
            storage::reserve_existing(file, nbytes).map_err(|e| Error::io(path, e))?;
        }
        MapMode::Shared
    } else {
        MapMode::CopyOnWrite
    };
    storage::map_file_as(
        file,
        nbytes,
        Some(path.to_path_buf()),
        mode,
        identity::of_metadata(md),
    )
    .map_err(|e| Error::io(path, e))
}

fn map_leaf(dir: &Dir, job: &LeafJob) -> Result<Option<Region>> {
    if job.nbytes == 0 {
        return Ok(None);
    }
    let path = dir.child_path(&job.name);
    let (file, writable, md) = check_leaf(dir, job, &path)?;
    map_checked(&file, writable, &md, job.nbytes, &path).map(Some)
}

/// Opens and maps one existing data file of at least `nbytes` bytes (read-only files are
/// mapped copy-on-write). The last path component must not be a symlink.
pub fn open_file(path: &Path, nbytes: usize) -> Result<Region> {
    let (dir, name) = split_file_path(path)?;
    let job = LeafJob {
        name,
        key: None,
        nbytes,
        exact: false,
    };
    let path = dir.child_path(&job.name);
    let (file, writable, md) = check_leaf(&dir, &job, &path)?;
    map_checked(&file, writable, &md, nbytes, &path)
}

/// The open parent directory of a file path and the file's name.
pub fn split_file_path(path: &Path) -> Result<(Dir, String)> {
    let absolute = std::path::absolute(path).map_err(|e| Error::io(path, e))?;
    let name = absolute
        .file_name()
        .ok_or_else(|| Error::tree(&absolute, "not a file name"))?
        .to_string_lossy()
        .into_owned();
    let parent = absolute.parent().unwrap_or(Path::new("/"));
    let dir = Dir::open(parent).map_err(|e| Error::io(parent, e))?;
    Ok((dir, name))
}

/// Walks the tree at `prefix` and returns every problem found, without mapping any data.
/// An empty list means the directory loads. An interrupted save is reported, not finished.
pub fn verify_tree(prefix: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    match Dir::open(prefix) {
        Ok(root) => {
            if commit::journal_present(&root) {
                // (mid-commit the tree is in neither version: nothing more to check)
                problems.push(
                    Error::invalid(
                        root.child_path(commit::JOURNAL),
                        "a save into this directory is committing or was interrupted; the next save or load finishes it",
                    )
                    .to_string(),
                );
            } else {
                verify_dir(&root, &mut Vec::new(), 0, None, &mut problems)
            }
        }
        Err(e) => problems.push(Error::io(prefix, e).to_string()),
    }
    problems
}

/// Verifies the directory at `rel` below `root`; `known` is its meta.json when its parent
/// already read it (each meta.json is read and parsed once).
fn verify_dir(
    root: &Dir,
    rel: &mut Vec<String>,
    depth: usize,
    known: Option<TensorDictMeta>,
    problems: &mut Vec<String>,
) {
    let path = rel.iter().fold(root.path().to_path_buf(), |p, c| p.join(c));
    if depth > format::MAX_DEPTH {
        problems.push(Error::invalid(&path, "the tree is nested too deeply").to_string());
        return;
    }
    let dir = match root.open_rel(rel) {
        Ok(d) => d,
        Err(e) => {
            problems.push(Error::io(&path, e).to_string());
            return;
        }
    };
    let meta = match known
        .map(NodeMeta::TensorDict)
        .map_or_else(|| read_meta(&dir), Ok)
    {
        Ok(NodeMeta::TensorDict(m)) => m,
        Ok(NodeMeta::NonTensor(_) | NodeMeta::Stack(_)) => {
            problems.push(Error::unsupported(&path, "non-tensor values only, not a TensorDict").to_string());
            return;
        }
        Ok(NodeMeta::TensorClass(_)) => match tensorclass_fields(&dir) {
            Ok((_, sub)) => {
                drop(dir);
                rel.push(format::TENSORCLASS_DIR.to_string());
                verify_dir(root, rel, depth + 1, Some(sub), problems);
                rel.pop();
                return;
            }
            Err(e) => {
                problems.push(e.to_string());
                return;
            }
        },
        Err(e) => {
            problems.push(e.to_string());
            return;
        }
    };
    let mut children = Vec::new();
    for (key, entry) in meta.entries {
        match entry {
            Entry::Leaf(leaf) if leaf.nbytes == 0 && leaf.nested.is_none() => {}
            Entry::Leaf(leaf) => {
                let checked = leaf_name(&dir, &key).and_then(|name| {
                    let (nbytes, exact) = match leaf.nested {
                        Some(_) => (read_nested(&dir, &key, &name, &leaf, &meta.batch)?.1, true),
                        None => (leaf.nbytes, false),
                    };
                    let path = dir.child_path(&name);
                    let job = LeafJob {
                        name,
                        key: Some(key.clone()),
                        nbytes,
                        exact,
                    };
                    if nbytes == 0 {
                        return Ok(());
                    }
                    check_leaf(&dir, &job, &path).map(|_| ())
                });
                if let Err(e) = checked {
                    problems.push(e.to_string());
                }
            }
            Entry::Stack => {
                if let Err(e) = read_stack(&dir, &key, &meta.batch) {
                    problems.push(e.to_string());
                }
            }
            Entry::Collection => match open_child_dir(&dir, &key) {
                Ok(child) if commit::journal_present(&child) => problems.push(
                    Error::invalid(
                        child.child_path(commit::JOURNAL),
                        format!(
                            "key {key:?}: a save into this sub-directory (as its own prefix) is committing or was interrupted; the next load or save of it, or of this tree, finishes it"
                        ),
                    )
                    .to_string(),
                ),
                Ok(child) => match read_meta(&child) {
                    Ok(NodeMeta::NonTensor(_)) => {}
                    Ok(NodeMeta::Stack(stack)) => {
                        if let Err(e) = crate::tree::read::check_stack(
                            &stack,
                            &key,
                            &meta.batch,
                            &child.child_path(format::META_FILE),
                        ) {
                            problems.push(e.to_string());
                        }
                    }
                    Ok(NodeMeta::TensorDict(sub)) if !sub.batch.starts_with(&meta.batch) => problems.push(
                        Error::invalid(
                            child.path(),
                            format!(
                                "key {key:?}: batch size {:?} does not start with its parent's {:?}",
                                sub.batch, meta.batch
                            ),
                        )
                        .to_string(),
                    ),
                    Ok(NodeMeta::TensorDict(sub)) => children.push((vec![format::encode_key(&key)], sub)),
                    Ok(NodeMeta::TensorClass(_)) => match tensorclass_fields(&child) {
                        Ok((_, sub)) if !sub.batch.starts_with(&meta.batch) => problems.push(
                            Error::invalid(
                                child.path(),
                                format!(
                                    "key {key:?}: batch size {:?} does not start with its parent's {:?}",
                                    sub.batch, meta.batch
                                ),
                            )
                            .to_string(),
                        ),
                        Ok((_, sub)) => children.push((
                            vec![format::encode_key(&key), format::TENSORCLASS_DIR.to_string()],
                            sub,
                        )),
                        Err(e) => problems.push(e.to_string()),
                    },
                    Err(e) => problems.push(e.to_string()),
                },
                Err(e) => problems.push(e.to_string()),
            },
        }
    }
    drop(dir);
    for (names, sub) in children {
        let n = names.len();
        rel.extend(names);
        verify_dir(root, rel, depth + 1, Some(sub), problems);
        rel.truncate(rel.len() - n);
    }
}

#[cfg(test)]
mod tests;
