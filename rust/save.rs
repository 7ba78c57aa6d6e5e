//! Atomic saves of a whole tree. No pyo3 here.
//!
//! The new tree is written beside the target, in `.<name>.tdrs-<pid>-<random>`, complete with
//! every data file and meta.json, and only then swapped in with one rename:
//! `renameat2(RENAME_EXCHANGE)` on Linux when the target exists, a plain `rename` when it does
//! not. A process killed at any instant therefore leaves the target either as it was or as
//! the new tree. Data files are always new inodes, so maps of the old version stay valid and
//! unchanged. Where the exchange is not supported (non-Linux, some network file systems) the
//! old directory is first renamed aside: a reader in that short window gets FileNotFoundError,
//! never a mix. Entries of the old directory that the old tree does not own (files a user put
//! there) are moved into the new one, so a save never deletes foreign data.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::dir::{Dir, EntryKind};
use crate::error::{Error, Result};
use crate::layout::{self, EntryMeta};
use crate::parallel;
use crate::storage::{self, MapMode, Region};
use crate::swap::{swap_in, sweep_stale_staging, STAGING_MARKER};

/// One tensor leaf to save. `data` is `None` for `memmap_like` (zero-filled, space reserved).
pub struct LeafSpec<'a> {
    pub dtype: String,
    pub shape: Vec<u64>,
    pub device: String,
    pub data: Option<&'a [u8]>,
    pub nbytes: usize,
}

/// One entry of a node: a leaf (index into the flat leaf list), a sub-tree or a JSON value.
pub enum EntrySpec {
    Leaf(usize),
    Node(NodeSpec),
    NonTensor(Value),
}

/// A TensorDict to save.
pub struct NodeSpec {
    pub batch: Vec<u64>,
    pub entries: Vec<(String, EntrySpec)>,
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
}

struct FileJob {
    dir: usize,
    name: String,
    final_path: PathBuf,
    leaf: usize,
}

/// Checks that the tree can be stored: no reserved keys, no two entries on one file name,
/// sizes consistent with shapes, leaves that start with their node's batch size.
pub fn validate(node: &NodeSpec, leaves: &[LeafSpec<'_>], path: &Path) -> Result<()> {
    let mut names: HashSet<String> = HashSet::new();
    for (key, entry) in &node.entries {
        if layout::RESERVED_KEYS.contains(&key.as_str()) {
            return Err(Error::tree(
                path,
                format!("key {key:?} is reserved by the meta.json format and would be lost; rename it"),
            ));
        }
        let name = match entry {
            EntrySpec::Leaf(_) => layout::leaf_file(key),
            _ => layout::encode_key(key),
        };
        if name == layout::META_FILE || !names.insert(name.clone()) {
            return Err(Error::tree(
                path,
                format!("key {key:?} would be stored as {name:?}, which another entry uses"),
            ));
        }
        match entry {
            EntrySpec::Leaf(i) => {
                let leaf = leaves
                    .get(*i)
                    .ok_or_else(|| Error::tree(path, format!("key {key:?}: no such leaf")))?;
                let dt = layout::dtype(&leaf.dtype).ok_or_else(|| {
                    Error::tree(
                        path,
                        format!("key {key:?}: dtype {:?} cannot be stored", leaf.dtype),
                    )
                })?;
                let expect = layout::nbytes(&leaf.shape, dt.itemsize).ok_or_else(|| {
                    Error::tree(path, format!("key {key:?}: shape {:?} overflows", leaf.shape))
                })?;
                if expect != leaf.nbytes || leaf.data.is_some_and(|d| d.len() != expect) {
                    return Err(Error::tree(
                        path,
                        format!(
                            "key {key:?}: {} bytes given for shape {:?}",
                            leaf.nbytes, leaf.shape
                        ),
                    ));
                }
                if !leaf.shape.starts_with(&node.batch) {
                    return Err(Error::tree(
                        path,
                        format!(
                            "key {key:?}: shape {:?} does not start with the batch size {:?}",
                            leaf.shape, node.batch
                        ),
                    ));
                }
            }
            EntrySpec::Node(child) => validate(child, leaves, &path.join(&name))?,
            EntrySpec::NonTensor(_) => {}
        }
    }
    Ok(())
}

/// Writes the tree to `prefix` atomically and maps every leaf file.
/// Returns one region per leaf (None for empty leaves, which have no file).
pub fn write_tree(
    prefix: &Path,
    root: &NodeSpec,
    leaves: &[LeafSpec<'_>],
    opts: SaveOptions,
) -> Result<Vec<Option<Region>>> {
    validate(root, leaves, prefix)?;
    let target = resolve_target(prefix)?;
    let exists = match std::fs::symlink_metadata(&target) {
        Ok(md) if md.is_dir() => true,
        Ok(_) => {
            return Err(Error::io(
                &target,
                io::Error::from_raw_os_error(not_a_dir_errno()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(Error::io(&target, e)),
    };
    if exists && !opts.existsok {
        refuse_existing(&target, root)?;
    }
    let parent_path = target
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let base = target
        .file_name()
        .ok_or_else(|| Error::tree(&target, "the prefix must name a directory"))?
        .to_string_lossy()
        .into_owned();
    std::fs::create_dir_all(&parent_path).map_err(|e| Error::io(&parent_path, e))?;
    let parent = Dir::open(&parent_path).map_err(|e| Error::io(&parent_path, e))?;
    let staging = format!(".{base}.tdrs-{}-{}", std::process::id(), storage::random_suffix());
    let staged = parent
        .create_dir(&staging)
        .map_err(|e| Error::io(parent.child_path(&staging), e))?;
    // Until this marker goes, the staging directory is known to hold nothing but our partial
    // tree: a later save may delete it outright if this process dies (see sweep_stale_staging).
    staged
        .write_new(STAGING_MARKER, b"", false)
        .map_err(|e| Error::io(staged.child_path(STAGING_MARKER), e))?;

    let result = fill_staged(staged, &target, root, leaves, opts)
        .and_then(|regions| swap_in(&parent, &staging, &base, &target, exists, opts).map(|()| regions));
    if result.is_err() {
        let _ = std::fs::remove_dir_all(parent.child_path(&staging));
    } else {
        sweep_stale_staging(&parent, &base, &target);
    }
    result
}

/// The real directory a prefix names: a symlink given as the prefix is resolved once.
fn resolve_target(prefix: &Path) -> Result<PathBuf> {
    let absolute = std::path::absolute(prefix).map_err(|e| Error::io(prefix, e))?;
    match std::fs::symlink_metadata(&absolute) {
        Ok(md) if md.file_type().is_symlink() => {
            std::fs::canonicalize(&absolute).map_err(|e| Error::io(&absolute, e))
        }
        _ => Ok(absolute),
    }
}

fn already_exists() -> io::Error {
    #[cfg(unix)]
    {
        io::Error::from_raw_os_error(libc::EEXIST)
    }
    #[cfg(not(unix))]
    {
        io::ErrorKind::AlreadyExists.into()
    }
}

fn not_a_dir_errno() -> i32 {
    #[cfg(unix)]
    {
        libc::ENOTDIR
    }
    #[cfg(not(unix))]
    {
        267
    }
}

/// With `existsok=False`, an existing tree (or any file this tree would write) is an error.
fn refuse_existing(target: &Path, root: &NodeSpec) -> Result<()> {
    let dir = Dir::open(target).map_err(|e| Error::io(target, e))?;
    let mut names = vec![layout::META_FILE.to_string()];
    for (key, entry) in &root.entries {
        names.push(match entry {
            EntrySpec::Leaf(_) => layout::leaf_file(key),
            _ => layout::encode_key(key),
        });
    }
    for name in names {
        if dir.kind(&name).map_err(|e| Error::io(dir.child_path(&name), e))? != EntryKind::Missing {
            return Err(Error::io(dir.child_path(&name), already_exists()));
        }
    }
    Ok(())
}

/// Writes directories, meta.json files and (in parallel) data files into the staging dir.
fn fill_staged(
    staged: Dir,
    target: &Path,
    root: &NodeSpec,
    leaves: &[LeafSpec<'_>],
    opts: SaveOptions,
) -> Result<Vec<Option<Region>>> {
    let tree = staged.identity().map_err(|e| Error::io(staged.path(), e))?;
    let mut dirs = vec![staged];
    let mut jobs = Vec::new();
    plan_node(&mut dirs, 0, target, root, leaves, &mut jobs, opts.durable)?;
    let workers = parallel::worker_count(opts.num_threads, jobs.len());
    let mapped = parallel::run(
        &jobs,
        workers,
        |job| leaves[job.leaf].nbytes,
        |job| {
            let dir = &dirs[job.dir];
            let leaf = &leaves[job.leaf];
            let io_err = |e| Error::io(&job.final_path, e);
            let file = dir.create_file(&job.name).map_err(io_err)?;
            storage::fill_file(&file, leaf.data, leaf.nbytes).map_err(io_err)?;
            if opts.durable {
                file.sync_data().map_err(io_err)?;
            }
            storage::map_file(&file, leaf.nbytes, Some(job.final_path.clone()), MapMode::Shared)
                .map(|r| r.with_tree(tree))
                .map_err(io_err)
        },
    )?;
    dirs[0]
        .remove_file(STAGING_MARKER)
        .map_err(|e| Error::io(dirs[0].child_path(STAGING_MARKER), e))?;
    if opts.durable {
        for dir in &dirs {
            dir.sync().map_err(|e| Error::io(dir.path(), e))?;
        }
    }
    let mut regions: Vec<Option<Region>> = std::iter::repeat_with(|| None).take(leaves.len()).collect();
    for (job, region) in jobs.iter().zip(mapped) {
        regions[job.leaf] = Some(region);
    }
    Ok(regions)
}

fn plan_node(
    dirs: &mut Vec<Dir>,
    at: usize,
    final_path: &Path,
    node: &NodeSpec,
    leaves: &[LeafSpec<'_>],
    jobs: &mut Vec<FileJob>,
    durable: bool,
) -> Result<()> {
    let mut metas = Vec::with_capacity(node.entries.len());
    for (key, entry) in &node.entries {
        match entry {
            EntrySpec::Leaf(i) => {
                let leaf = &leaves[*i];
                if leaf.nbytes > 0 {
                    let name = layout::leaf_file(key);
                    jobs.push(FileJob {
                        dir: at,
                        final_path: final_path.join(&name),
                        name,
                        leaf: *i,
                    });
                }
                metas.push((
                    key.as_str(),
                    EntryMeta::Leaf {
                        dtype: &leaf.dtype,
                        shape: &leaf.shape,
                        device: &leaf.device,
                    },
                ));
            }
            EntrySpec::Node(child) => {
                let name = layout::encode_key(key);
                let child_dir = dirs[at]
                    .create_dir(&name)
                    .map_err(|e| Error::io(final_path.join(&name), e))?;
                dirs.push(child_dir);
                let child_at = dirs.len() - 1;
                plan_node(
                    dirs,
                    child_at,
                    &final_path.join(&name),
                    child,
                    leaves,
                    jobs,
                    durable,
                )?;
                metas.push((key.as_str(), EntryMeta::TensorDict));
            }
            EntrySpec::NonTensor(value) => {
                let name = layout::encode_key(key);
                let child_dir = dirs[at]
                    .create_dir(&name)
                    .map_err(|e| Error::io(final_path.join(&name), e))?;
                let meta_path = final_path.join(&name).join(layout::META_FILE);
                child_dir
                    .write_new(layout::META_FILE, &layout::non_tensor_meta(value), durable)
                    .map_err(|e| Error::io(&meta_path, e))?;
                dirs.push(child_dir);
                metas.push((key.as_str(), EntryMeta::NonTensorData));
            }
        }
    }
    let bytes = layout::tensordict_meta(metas, &node.batch);
    dirs[at]
        .write_new(layout::META_FILE, &bytes, durable)
        .map_err(|e| Error::io(final_path.join(layout::META_FILE), e))
}

/// Writes one data file atomically (staged beside it, then renamed into place) and maps it.
/// An existing file is replaced only with `existsok`; maps of the old file keep their values.
pub fn write_file(path: &Path, data: Option<&[u8]>, nbytes: usize, existsok: bool) -> Result<Region> {
    let (dir, name) = crate::load::split_file_path(path)?;
    let final_path = dir.child_path(&name);
    match dir.kind(&name).map_err(|e| Error::io(&final_path, e))? {
        EntryKind::Missing => {}
        EntryKind::Symlink => {
            return Err(Error::symlink(
                &final_path,
                "refusing to write a memory-mapped tensor through symlink",
            ))
        }
        EntryKind::File if existsok => {}
        EntryKind::File => return Err(Error::io(&final_path, already_exists())),
        _ => return Err(Error::tree(&final_path, "not a regular file")),
    }
    let staging = format!(".{name}.tdrs-{}-{}", std::process::id(), storage::random_suffix());
    let staged_path = dir.child_path(&staging);
    let result = (|| {
        let file = dir.create_file(&staging).map_err(|e| Error::io(&final_path, e))?;
        storage::fill_file(&file, data, nbytes).map_err(|e| Error::io(&final_path, e))?;
        let region = storage::map_file(&file, nbytes, Some(final_path.clone()), MapMode::Shared)
            .map_err(|e| Error::io(&final_path, e))?;
        std::fs::rename(&staged_path, &final_path).map_err(|e| Error::io(&final_path, e))?;
        Ok(region)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&staged_path);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load;

    fn tmp() -> PathBuf {
        let p = std::env::temp_dir().join(format!("tdrs-save-{}", storage::random_suffix()));
        std::fs::create_dir(&p).unwrap();
        p
    }

    fn tree(data: &[u8]) -> (NodeSpec, Vec<LeafSpec<'_>>) {
        let leaves = vec![
            LeafSpec {
                dtype: "torch.uint8".into(),
                shape: vec![2, 2],
                device: "cpu".into(),
                data: Some(data),
                nbytes: 4,
            },
            LeafSpec {
                dtype: "torch.float32".into(),
                shape: vec![2, 0],
                device: "cpu".into(),
                data: Some(&[]),
                nbytes: 0,
            },
        ];
        let child = NodeSpec {
            batch: vec![2],
            entries: vec![("e".into(), EntrySpec::Leaf(1))],
        };
        let root = NodeSpec {
            batch: vec![2],
            entries: vec![
                ("a/b".into(), EntrySpec::Leaf(0)),
                ("n".into(), EntrySpec::Node(child)),
                ("s".into(), EntrySpec::NonTensor(Value::from("hi"))),
            ],
        };
        (root, leaves)
    }

    fn opts() -> SaveOptions {
        SaveOptions {
            existsok: true,
            durable: false,
            num_threads: 2,
        }
    }

    #[test]
    fn writes_and_replaces_atomically() {
        let dir = tmp();
        let prefix = dir.join("td");
        let (root, leaves) = tree(&[1, 2, 3, 4]);
        let regions = write_tree(&prefix, &root, &leaves, opts()).unwrap();
        assert_eq!(regions[0].as_ref().unwrap().to_vec(), vec![1, 2, 3, 4]);
        assert!(regions[1].is_none());
        assert_eq!(
            std::fs::read(prefix.join("a%2Fb.memmap")).unwrap(),
            vec![1, 2, 3, 4]
        );
        std::fs::write(prefix.join("notes.txt"), b"mine").unwrap();

        let (root2, leaves2) = tree(&[5, 6, 7, 8]);
        write_tree(&prefix, &root2, &leaves2, opts()).unwrap();
        // The old map still shows the old values; the directory has the new ones.
        assert_eq!(regions[0].as_ref().unwrap().to_vec(), vec![1, 2, 3, 4]);
        assert_eq!(
            std::fs::read(prefix.join("a%2Fb.memmap")).unwrap(),
            vec![5, 6, 7, 8]
        );
        assert_eq!(std::fs::read(prefix.join("notes.txt")).unwrap(), b"mine");
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
        let (node, regions) = load::load_tree(&prefix).unwrap();
        assert_eq!(node.entries.len(), 3);
        assert_eq!(regions[0].as_ref().unwrap().to_vec(), vec![5, 6, 7, 8]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sweeps_staging_dirs_of_dead_processes() {
        let dir = tmp();
        let prefix = dir.join("td");
        // A pid far above pid_max stands for a process killed mid-save.
        let stale = dir.join(".td.tdrs-2147483600-0123456789abcdef");
        let swapped_out = dir.join(".td.tdrs-2147483601-fedcba9876543210");
        let live = dir.join(format!(".td.tdrs-{}-live", std::process::id()));
        std::fs::create_dir_all(stale.join("sub")).unwrap();
        std::fs::write(stale.join(STAGING_MARKER), b"").unwrap();
        std::fs::create_dir(&swapped_out).unwrap();
        std::fs::write(swapped_out.join("notes.txt"), b"mine").unwrap();
        std::fs::create_dir(&live).unwrap();
        let (root, leaves) = tree(&[1, 2, 3, 4]);
        write_tree(&prefix, &root, &leaves, opts()).unwrap();
        assert!(!stale.exists());
        assert!(!swapped_out.exists());
        assert!(!prefix.join("sub").exists());
        // A user's file in an old tree swapped out by a killed save is kept.
        assert_eq!(std::fs::read(prefix.join("notes.txt")).unwrap(), b"mine");
        assert!(live.exists());
        assert!(!prefix.join(STAGING_MARKER).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn existsok_false_refuses() {
        let dir = tmp();
        let (root, leaves) = tree(&[1, 2, 3, 4]);
        write_tree(&dir, &root, &leaves, opts()).unwrap();
        let err = write_tree(
            &dir,
            &root,
            &leaves,
            SaveOptions {
                existsok: false,
                ..opts()
            },
        )
        .unwrap_err();
        assert!(
            matches!(&err, Error::Io { source, .. } if source.kind() == io::ErrorKind::AlreadyExists),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_reserved_and_colliding_keys() {
        let data = [0u8; 4];
        let leaves = vec![LeafSpec {
            dtype: "torch.uint8".into(),
            shape: vec![4],
            device: "cpu".into(),
            data: Some(&data),
            nbytes: 4,
        }];
        for bad in ["shape", "device", "_type", "_class"] {
            let root = NodeSpec {
                batch: vec![],
                entries: vec![(bad.into(), EntrySpec::Leaf(0))],
            };
            assert!(validate(&root, &leaves, Path::new("p"))
                .unwrap_err()
                .to_string()
                .contains("reserved"));
        }
        let root = NodeSpec {
            batch: vec![],
            entries: vec![
                ("a".into(), EntrySpec::Leaf(0)),
                (
                    "a.memmap".into(),
                    EntrySpec::Node(NodeSpec {
                        batch: vec![],
                        entries: vec![],
                    }),
                ),
            ],
        };
        assert!(validate(&root, &leaves, Path::new("p"))
            .unwrap_err()
            .to_string()
            .contains("another entry"));
        let root = NodeSpec {
            batch: vec![3],
            entries: vec![("a".into(), EntrySpec::Leaf(0))],
        };
        assert!(validate(&root, &leaves, Path::new("p"))
            .unwrap_err()
            .to_string()
            .contains("batch size"));
    }

    #[test]
    fn failed_save_leaves_target_untouched() {
        let dir = tmp();
        let prefix = dir.join("td");
        let (root, leaves) = tree(&[1, 2, 3, 4]);
        write_tree(&prefix, &root, &leaves, opts()).unwrap();
        let before = std::fs::read(prefix.join("meta.json")).unwrap();
        let bad = vec![LeafSpec {
            dtype: "torch.nope".into(),
            shape: vec![2, 2],
            device: "cpu".into(),
            data: None,
            nbytes: 4,
        }];
        let root_bad = NodeSpec {
            batch: vec![2],
            entries: vec![("x".into(), EntrySpec::Leaf(0))],
        };
        assert!(write_tree(&prefix, &root_bad, &bad, opts()).is_err());
        assert_eq!(std::fs::read(prefix.join("meta.json")).unwrap(), before);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
