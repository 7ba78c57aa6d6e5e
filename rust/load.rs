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

use crate::dir::{self, Dir, EntryKind};
use crate::error::{Error, Result};
use crate::layout::{self, Entry, LeafMeta, NodeMeta};
use crate::parallel;
use crate::save::{EntrySpec, LeafSpec, NodeSpec};
use crate::storage::{self, MapMode, Region};

/// One loaded entry. Leaves point into the flat region list returned beside the tree.
#[derive(Debug)]
pub enum LoadedEntry {
    Leaf {
        dtype: &'static str,
        shape: Vec<u64>,
        index: usize,
    },
    Node(LoadedNode),
    NonTensor(Value),
}

/// A loaded TensorDict directory.
#[derive(Debug)]
pub struct LoadedNode {
    pub batch: Vec<u64>,
    pub device: Option<String>,
    pub entries: Vec<(String, LoadedEntry)>,
}

/// A leaf file to open and map, found while walking.
struct LeafJob {
    dir: usize,
    name: String,
    /// How messages name the leaf, e.g. `key "obs"`.
    label: String,
    nbytes: usize,
}

/// How many times a load restarts when a concurrent save swaps the prefix under it.
const SWAP_RETRIES: usize = 50;

/// Loads and validates the tree at `prefix`, mapping every leaf (in parallel).
/// Returns the tree and one region per leaf (None for empty leaves).
///
/// Everything is read through the directory opened first. If the load fails and the prefix
/// now names another directory, a concurrent save swapped it in (and is deleting the tree we
/// were reading): the load starts again on the new tree, so a reader sees one whole version.
pub fn load_tree(prefix: &Path) -> Result<(LoadedNode, Vec<Option<Region>>)> {
    let mut attempt = 0;
    loop {
        let root = Dir::open(prefix).map_err(|e| Error::io(prefix, e))?;
        let identity = root.identity().map_err(|e| Error::io(prefix, e))?;
        match load_from(root) {
            Err(_) if attempt < SWAP_RETRIES && dir::path_identity(prefix).ok() != Some(identity) => {
                attempt += 1
            }
            other => return other,
        }
    }
}

fn load_from(root: Dir) -> Result<(LoadedNode, Vec<Option<Region>>)> {
    let tree = root.identity().map_err(|e| Error::io(root.path(), e))?;
    let mut dirs = vec![root];
    let mut jobs = Vec::new();
    let node = walk(&mut dirs, 0, 0, &mut jobs)?;
    // Mapping costs a few microseconds a file: spread only trees with many leaves.
    let workers = parallel::worker_count(0, jobs.len() / 256);
    let mapped = parallel::run(
        &jobs,
        workers,
        |j| j.nbytes,
        |job| map_leaf(&dirs[job.dir], job).map(|r| r.map(|r| r.with_tree(tree))),
    )?;
    Ok((node, mapped))
}

fn read_meta(dir: &Dir) -> Result<NodeMeta> {
    let path = dir.child_path(layout::META_FILE);
    let bytes = dir
        .read_limited(layout::META_FILE, layout::META_LIMIT)
        .map_err(|e| match e.raw_os_error() {
            #[cfg(unix)]
            Some(libc::ELOOP) => Error::symlink(&path, "meta.json is a symlink; refusing to follow it"),
            _ if e.kind() == io::ErrorKind::InvalidData => Error::invalid(&path, e.to_string()),
            _ if e.kind() == io::ErrorKind::Other => Error::invalid(&path, e.to_string()),
            _ => Error::io(&path, e),
        })?;
    layout::parse_meta(&bytes, &path)
}

fn open_child_dir(parent: &Dir, key: &str) -> Result<Dir> {
    let name = layout::encode_key(key);
    let path = parent.child_path(&name);
    match parent.kind(&name).map_err(|e| Error::io(&path, e))? {
        EntryKind::Dir => parent.open_dir(&name).map_err(|e| Error::io(&path, e)),
        EntryKind::Missing => Err(Error::invalid(
            &path,
            format!("the sub-directory of key {key:?} is missing"),
        )),
        EntryKind::Symlink => Err(Error::symlink(
            &path,
            format!("key {key:?} is a symlink; refusing to follow it"),
        )),
        _ => Err(Error::invalid(
            &path,
            format!("key {key:?} should be a directory"),
        )),
    }
}

fn walk(dirs: &mut Vec<Dir>, at: usize, depth: usize, jobs: &mut Vec<LeafJob>) -> Result<LoadedNode> {
    if depth > layout::MAX_DEPTH {
        return Err(Error::invalid(dirs[at].path(), "the tree is nested too deeply"));
    }
    let meta = match read_meta(&dirs[at])? {
        NodeMeta::TensorDict(m) => m,
        NodeMeta::NonTensor(_) => {
            return Err(Error::unsupported(
                dirs[at].path(),
                "this directory holds a single non-tensor value, not a TensorDict",
            ))
        }
    };
    let mut entries = Vec::with_capacity(meta.entries.len());
    for (key, entry) in meta.entries {
        match entry {
            Entry::Leaf(leaf) => {
                let index = jobs.len();
                let LeafMeta { dtype, shape, nbytes } = leaf;
                let name = if nbytes > 0 {
                    leaf_name(&dirs[at], &key)?
                } else {
                    String::new()
                };
                jobs.push(LeafJob {
                    dir: at,
                    name,
                    label: format!("key {key:?}"),
                    nbytes,
                });
                entries.push((
                    key,
                    LoadedEntry::Leaf {
                        dtype: dtype.name,
                        shape,
                        index,
                    },
                ));
            }
            Entry::Collection => {
                let child = open_child_dir(&dirs[at], &key)?;
                match read_meta(&child)? {
                    NodeMeta::NonTensor(value) => entries.push((key, LoadedEntry::NonTensor(value))),
                    NodeMeta::TensorDict(_) => {
                        dirs.push(child);
                        let child_at = dirs.len() - 1;
                        let node = walk(dirs, child_at, depth + 1, jobs)?;
                        if !node.batch.starts_with(&meta.batch) {
                            return Err(Error::invalid(
                                dirs[child_at].path(),
                                format!(
                                    "key {key:?}: batch size {:?} does not start with its parent's {:?}",
                                    node.batch, meta.batch
                                ),
                            ));
                        }
                        entries.push((key, LoadedEntry::Node(node)));
                    }
                }
            }
        }
    }
    Ok(LoadedNode {
        batch: meta.batch,
        device: meta.device,
        entries,
    })
}

/// The file name of a leaf: the encoded key, or the raw legacy name when only that exists.
fn leaf_name(dir: &Dir, key: &str) -> Result<String> {
    let encoded = layout::leaf_file(key);
    if let Some(raw) = layout::legacy_name(key) {
        let legacy = format!("{raw}{}", layout::LEAF_SUFFIX);
        if legacy != encoded
            && dir
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

/// Opens a leaf file, checks it is a regular file long enough for its shape, and maps it.
fn check_leaf(dir: &Dir, job: &LeafJob) -> Result<(std::fs::File, bool)> {
    let path = dir.child_path(&job.name);
    let what = &job.label;
    let (file, writable) = dir.open_file(&job.name).map_err(|e| match e.raw_os_error() {
        #[cfg(unix)]
        Some(libc::ELOOP) => Error::symlink(
            &path,
            format!("the data file of {what} is a symlink; refusing to follow it"),
        ),
        _ if e.kind() == io::ErrorKind::NotFound => {
            Error::invalid(&path, format!("the data file of {what} is missing"))
        }
        _ => Error::io(&path, e),
    })?;
    let md = file.metadata().map_err(|e| Error::io(&path, e))?;
    if !md.is_file() {
        return Err(Error::invalid(
            &path,
            format!("the data of {what} is not a regular file"),
        ));
    }
    if md.len() < job.nbytes as u64 {
        return Err(Error::invalid(
            &path,
            format!(
                "the data file of {what} is truncated: {} bytes, its shape needs {}",
                md.len(),
                job.nbytes
            ),
        ));
    }
    Ok((file, writable))
}

fn map_leaf(dir: &Dir, job: &LeafJob) -> Result<Option<Region>> {
    if job.nbytes == 0 {
        return Ok(None);
    }
    let (file, writable) = check_leaf(dir, job)?;
    let path = dir.child_path(&job.name);
    let mode = if writable {
        MapMode::Shared
    } else {
        MapMode::CopyOnWrite
    };
    storage::map_file(&file, job.nbytes, Some(path.clone()), mode)
        .map(Some)
        .map_err(|e| Error::io(&path, e))
}

/// True when the tree at `prefix` is the directory `tree` (device, inode) and its meta.json
/// files describe exactly `root`: then a save of `root` whose leaves already map these files
/// has nothing to write.
pub fn tree_matches(prefix: &Path, root: &NodeSpec, leaves: &[LeafSpec<'_>], tree: (u64, u64)) -> bool {
    let Ok(dir) = Dir::open(prefix) else { return false };
    dir.identity().ok() == Some(tree) && node_matches(&dir, root, leaves, 0)
}

fn node_matches(dir: &Dir, node: &NodeSpec, leaves: &[LeafSpec<'_>], depth: usize) -> bool {
    let Ok(NodeMeta::TensorDict(meta)) = read_meta(dir) else {
        return false;
    };
    if depth > layout::MAX_DEPTH || meta.batch != node.batch || meta.entries.len() != node.entries.len() {
        return false;
    }
    node.entries
        .iter()
        .zip(&meta.entries)
        .all(|((key, spec), (meta_key, entry))| {
            key == meta_key
                && match (spec, entry) {
                    (EntrySpec::Leaf(i), Entry::Leaf(leaf)) => {
                        leaves[*i].dtype == leaf.dtype.name && leaves[*i].shape == leaf.shape
                    }
                    (EntrySpec::Node(child), Entry::Collection) => {
                        open_child_dir(dir, key).is_ok_and(|d| node_matches(&d, child, leaves, depth + 1))
                    }
                    (EntrySpec::NonTensor(value), Entry::Collection) => open_child_dir(dir, key)
                        .is_ok_and(|d| matches!(read_meta(&d), Ok(NodeMeta::NonTensor(v)) if &v == value)),
                    _ => false,
                }
        })
}

/// Opens and maps one existing data file of at least `nbytes` bytes (read-only files are
/// mapped copy-on-write). The last path component must not be a symlink.
pub fn open_file(path: &Path, nbytes: usize) -> Result<Region> {
    let (dir, name) = split_file_path(path)?;
    let job = LeafJob {
        dir: 0,
        name,
        label: "this tensor".into(),
        nbytes,
    };
    let (file, writable) = check_leaf(&dir, &job)?;
    let mode = if writable {
        MapMode::Shared
    } else {
        MapMode::CopyOnWrite
    };
    let path = dir.child_path(&job.name);
    storage::map_file(&file, nbytes, Some(path.clone()), mode).map_err(|e| Error::io(&path, e))
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
/// An empty list means the directory loads.
pub fn verify_tree(prefix: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    match Dir::open(prefix) {
        Ok(root) => verify_dir(&root, 0, &mut problems),
        Err(e) => problems.push(Error::io(prefix, e).to_string()),
    }
    problems
}

fn verify_dir(dir: &Dir, depth: usize, problems: &mut Vec<String>) {
    if depth > layout::MAX_DEPTH {
        problems.push(Error::invalid(dir.path(), "the tree is nested too deeply").to_string());
        return;
    }
    let meta = match read_meta(dir) {
        Ok(NodeMeta::TensorDict(m)) => m,
        Ok(NodeMeta::NonTensor(_)) => {
            problems.push(
                Error::unsupported(dir.path(), "a single non-tensor value, not a TensorDict").to_string(),
            );
            return;
        }
        Err(e) => {
            problems.push(e.to_string());
            return;
        }
    };
    for (key, entry) in meta.entries {
        match entry {
            Entry::Leaf(leaf) if leaf.nbytes == 0 => {}
            Entry::Leaf(leaf) => {
                let checked = leaf_name(dir, &key).and_then(|name| {
                    check_leaf(
                        dir,
                        &LeafJob {
                            dir: 0,
                            name,
                            label: format!("key {key:?}"),
                            nbytes: leaf.nbytes,
                        },
                    )
                });
                if let Err(e) = checked {
                    problems.push(e.to_string());
                }
            }
            Entry::Collection => match open_child_dir(dir, &key) {
                Ok(child) => match read_meta(&child) {
                    Ok(NodeMeta::NonTensor(_)) => {}
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
                    Ok(NodeMeta::TensorDict(_)) => verify_dir(&child, depth + 1, problems),
                    Err(e) => problems.push(e.to_string()),
                },
                Err(e) => problems.push(e.to_string()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::save::{write_tree, EntrySpec, LeafSpec, NodeSpec, SaveOptions};

    fn saved() -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("tdrs-load-{}", storage::random_suffix()));
        let data: Vec<u8> = (0..24).collect();
        let leaves = vec![LeafSpec {
            dtype: "torch.float32".into(),
            shape: vec![3, 2],
            device: "cpu".into(),
            data: Some(&data),
            nbytes: 24,
        }];
        let child = NodeSpec {
            batch: vec![3],
            entries: vec![("x".into(), EntrySpec::Leaf(0))],
        };
        let root = NodeSpec {
            batch: vec![3],
            entries: vec![("sub".into(), EntrySpec::Node(child))],
        };
        write_tree(
            &p,
            &root,
            &leaves,
            SaveOptions {
                existsok: true,
                ..Default::default()
            },
        )
        .unwrap();
        p
    }

    fn load_err(p: &Path) -> String {
        load_tree(p).unwrap_err().to_string()
    }

    #[test]
    fn loads_a_saved_tree() {
        let p = saved();
        let (node, regions) = load_tree(&p).unwrap();
        let LoadedEntry::Node(sub) = &node.entries[0].1 else {
            panic!()
        };
        let LoadedEntry::Leaf { dtype, shape, index } = &sub.entries[0].1 else {
            panic!()
        };
        assert_eq!((*dtype, shape.as_slice()), ("torch.float32", &[3u64, 2][..]));
        assert_eq!(
            regions[*index].as_ref().unwrap().to_vec(),
            (0..24).collect::<Vec<u8>>()
        );
        assert!(verify_tree(&p).is_empty());
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn refuses_truncated_missing_and_symlinked_files() {
        let p = saved();
        let file = p.join("sub/x.memmap");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(10)
            .unwrap();
        assert!(load_err(&p).contains("truncated"));
        assert_eq!(verify_tree(&p).len(), 1);
        std::fs::remove_file(&file).unwrap();
        assert!(load_err(&p).contains("missing"));
        #[cfg(unix)]
        {
            let outside = p.with_extension("outside");
            std::fs::write(&outside, [0u8; 24]).unwrap();
            std::os::unix::fs::symlink(&outside, &file).unwrap();
            assert!(load_err(&p).contains("symlink"));
            std::fs::remove_file(&outside).unwrap();
        }
        std::fs::remove_dir_all(p.join("sub")).unwrap();
        assert!(load_err(&p).contains("sub-directory"));
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn tree_matches_only_the_same_tree() {
        let p = saved();
        let (_, regions) = load_tree(&p).unwrap();
        let tree = regions[0].as_ref().unwrap().tree().unwrap();
        let data: Vec<u8> = (0..24).collect();
        let spec = |shape: Vec<u64>| {
            let leaves = vec![LeafSpec {
                dtype: "torch.float32".into(),
                shape,
                device: "cpu".into(),
                data: Some(&data[..]),
                nbytes: 24,
            }];
            let child = NodeSpec {
                batch: vec![3],
                entries: vec![("x".into(), EntrySpec::Leaf(0))],
            };
            (
                NodeSpec {
                    batch: vec![3],
                    entries: vec![("sub".into(), EntrySpec::Node(child))],
                },
                leaves,
            )
        };
        let (root, leaves) = spec(vec![3, 2]);
        assert!(tree_matches(&p, &root, &leaves, tree));
        assert!(!tree_matches(&p, &root, &leaves, (tree.0, tree.1 + 1)));
        let (other, other_leaves) = spec(vec![3, 2, 1]);
        assert!(!tree_matches(&p, &other, &other_leaves, tree));
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn longer_files_load() {
        let p = saved();
        let file = p.join("sub/x.memmap");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(100)
            .unwrap();
        assert!(load_tree(&p).is_ok());
        std::fs::remove_dir_all(&p).unwrap();
    }
}
