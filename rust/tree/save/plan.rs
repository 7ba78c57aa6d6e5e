//! The plan of one save: the new tree walked against the old one, its files staged. No pyo3.
//!
//! `plan/old_tree.rs` reads what the target holds (the names the old tree owns, whether a
//! meta.json is a tensordict's, what is in the way) and plans the removal of what the new
//! tree drops.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

use super::{EntrySpec, LeafSpec, NodeSpec, SaveOptions};
use crate::error::{Error, Result};
use crate::format::{self, EntryMeta};
use crate::sys::dir::{Dir, EntryKind, EntryStat};
use crate::sys::identity::{self, Stamp};
use crate::sys::pool;
use crate::sys::storage::{self, MapMode, Region};
use crate::tree::commit::{self, DirState, FileState, Journal, Op, Staging, JOURNAL_VERSION};

mod old_tree;

use old_tree::{dir_present, foreign, kind_name, meta_is_ours, OldDir};

/// A data file to write into a staging directory.
struct FileJob {
    stage: usize,
    staged: String,
    final_path: PathBuf,
    leaf: usize,
}

/// Everything one save will do, gathered while walking the new tree against the old one.
pub(super) struct Plan {
    mkdirs: Vec<Op>,
    data: Vec<Op>,
    metas: Vec<Op>,
    removals: Vec<Op>,
    jobs: Vec<FileJob>,
    regions: Vec<Option<Region>>,
    staged_metas: usize,
    /// Sub-trees the target lacks, staged whole as `d<n>` (one rename each at the commit).
    staged_dirs: usize,
    /// Every directory made inside the staging directories (stage, path in it).
    synced_dirs: Vec<(usize, String)>,
    /// The meta.json of every directory the commit changes, before and after.
    dir_states: Vec<DirState>,
    /// The staged data files' identities, by (stage, staged name), once written.
    staged_ids: HashMap<(usize, String), (u64, u64)>,
    /// Where the tree goes (for messages and the maps' paths).
    root_path: PathBuf,
}

fn with(rel: &[String], name: &str) -> Vec<String> {
    let mut path = rel.to_vec();
    path.push(name.to_string());
    path
}

/// Maps an existing file in place (writable files shared, read-only ones copy-on-write).
fn map_existing(dir: &Dir, name: &str, nbytes: usize) -> Result<Region> {
    let path = dir.child_path(name);
    let (file, writable) = dir.open_file(name).map_err(|e| Error::io(&path, e))?;
    let mode = if writable {
        MapMode::Shared
    } else {
        MapMode::CopyOnWrite
    };
    if writable {
        storage::reserve_existing(&file, nbytes).map_err(|e| Error::io(&path, e))?;
    }
    storage::map_file(&file, nbytes, Some(path.clone()), mode).map_err(|e| Error::io(&path, e))
}

impl Plan {
    /// An empty plan for a tree of `leaves` leaves that goes to `root_path`.
    pub(super) fn new(leaves: usize, root_path: &Path) -> Plan {
        Plan {
            mkdirs: Vec::new(),
            data: Vec::new(),
            metas: Vec::new(),
            removals: Vec::new(),
            jobs: Vec::new(),
            regions: std::iter::repeat_with(|| None).take(leaves).collect(),
            staged_metas: 0,
            staged_dirs: 0,
            synced_dirs: Vec::new(),
            dir_states: Vec::new(),
            staged_ids: HashMap::new(),
            root_path: root_path.to_path_buf(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn node(
        &mut self,
        root: &Dir,
        staging: &mut Staging,
        rel: &mut Vec<String>,
        node: &NodeSpec,
        leaves: &[LeafSpec<'_>],
        opts: SaveOptions,
        exists: bool,
        parent_stage: usize,
        parent_staged: Option<&str>,
        fields: bool,
    ) -> Result<()> {
        let final_path = commit_path(&self.root_path, rel);
        // A tensorclass node is two directories: this one (its meta.json names the class) and
        // `_tensordict/` below it, the same node again as a TensorDict (`fields`).
        let wrapper = if fields { None } else { node.class.as_ref() };
        let dir = if exists {
            let dir = root.open_rel(rel).map_err(|e| Error::io(&final_path, e))?;
            if !rel.is_empty() && commit::journal_present(&dir) {
                // A save to this sub-directory as its own prefix died in its commit: finish it
                // first (a live one cannot be here: it holds this tree's lock, shared).
                commit::settle(&dir)?;
            }
            if !meta_is_ours(&dir)?.0 {
                return Err(foreign(
                    &final_path.join(format::META_FILE),
                    "a meta.json that is not a tensordict's",
                ));
            }
            Some(dir)
        } else {
            None
        };
        let old = dir.as_ref().map(OldDir::read).unwrap_or_default();
        let stage = match &dir {
            Some(d) => {
                let mount = d.mount().map_err(|e| Error::io(&final_path, e))?;
                staging.for_mount(d, rel, mount)?
            }
            None => parent_stage,
        };
        // A directory the target lacks is built whole inside the staging directory (files at
        // their final names) and goes into place with one rename: `staged` is where it is.
        // A root that does not exist is the staging directory itself (`fresh.rs`).
        let staged: Option<String> = if exists {
            None
        } else if rel.is_empty() {
            Some(String::new())
        } else {
            let name = rel.last().expect("a non-empty path has a last component");
            let at = match parent_staged {
                Some(parent) => inside(parent, name),
                None => {
                    let top = format!("d{}", self.staged_dirs);
                    self.staged_dirs += 1;
                    self.data.push(Op::Rename {
                        stage,
                        name: top.clone(),
                        to: rel.clone(),
                        id: None, // the staged directory's, filled in by `journal`
                        replaces: None,
                    });
                    top
                }
            };
            staging
                .dir(stage)
                .create_dir(&at)
                .map_err(|e| Error::io(&final_path, e))?;
            self.synced_dirs.push((stage, at.clone()));
            Some(at)
        };
        let stat = |name: &str| -> Result<Option<EntryStat>> {
            match &dir {
                Some(d) => d.stat(name).map_err(|e| Error::io(final_path.join(name), e)),
                None => Ok(None),
            }
        };
        let mut written: HashSet<String> = HashSet::new();
        let mut metas = Vec::with_capacity(node.entries.len());
        // Sub-trees are walked after this directory's own files, one open directory at a time.
        let mut children: Vec<(String, &NodeSpec, bool, bool)> = Vec::new();
        if wrapper.is_some() {
            let name = format::TENSORCLASS_DIR.to_string();
            written.insert(name.clone());
            let present = dir_present(&final_path, &name, stat(&name)?)?;
            children.push((name, node, present, true));
        }
        let entries: &[(String, EntrySpec)] = if wrapper.is_some() { &[] } else { &node.entries };
        for (key, entry) in entries {
            match entry {
                EntrySpec::Leaf(i) => {
                    let leaf = &leaves[*i];
                    metas.push((key.as_str(), leaf.entry_meta()));
                    if let Some(nested) = &leaf.nested {
                        // the table of component shapes, beside the data (small: staged whole)
                        let table = format::shape_file(&format::leaf_file(key));
                        if dir.is_some() {
                            written.insert(table.clone());
                        }
                        let path = final_path.join(&table);
                        let old_table = match stat(&table)? {
                            None => None,
                            Some(st) if st.kind == EntryKind::File && old.owns_file(&table) => {
                                Some((st.dev, st.ino))
                            }
                            Some(st) => return Err(foreign(&path, kind_name(st.kind))),
                        };
                        match &staged {
                            Some(at) => staging
                                .dir(stage)
                                .write_new(&inside(at, &table), &nested.table, opts.durable)
                                .map_err(|e| Error::io(&path, e))?,
                            None => {
                                let to = with(rel, &table);
                                self.stage_small(
                                    staging,
                                    stage,
                                    &nested.table,
                                    to,
                                    old_table,
                                    &path,
                                    opts.durable,
                                )?;
                            }
                        }
                    }
                    if leaf.nbytes == 0 {
                        continue;
                    }
                    let name = format::leaf_file(key);
                    if dir.is_some() {
                        // (only a directory that exists has old files to keep or remove)
                        written.insert(name.clone());
                    }
                    let path = final_path.join(&name);
                    let mut replaces = None;
                    match stat(&name)? {
                        None => {}
                        Some(st) if st.kind == EntryKind::File => {
                            let same = leaf.same_file == Some(st.id());
                            if (same || leaf.data.is_none()) && st.size >= leaf.nbytes as u64 {
                                // The source is this very file, or memmap_like reopens it.
                                let d = dir.as_ref().expect("a file exists, so its directory does");
                                self.regions[*i] = Some(map_existing(d, &name, leaf.nbytes)?);
                                continue;
                            }
                            if leaf.data.is_none() {
                                return Err(Error::tree(
                                    &path,
                                    format!(
                                        "key {key:?}: the existing file holds {} bytes and the shape {:?} needs {}; memmap_like maps existing files as they are and does not grow them",
                                        st.size, leaf.shape, leaf.nbytes
                                    ),
                                ));
                            }
                            if !old.owns_file(&name) {
                                return Err(foreign(&path, "a file"));
                            }
                            replaces = Some((st.dev, st.ino));
                        }
                        Some(st) => return Err(foreign(&path, kind_name(st.kind))),
                    }
                    let staged = match &staged {
                        Some(at) => inside(at, &name),
                        None => {
                            let staged = format!("f{i}");
                            self.data.push(Op::Rename {
                                stage,
                                name: staged.clone(),
                                to: with(rel, &name),
                                id: None, // the written file's, filled in by `journal`
                                replaces,
                            });
                            staged
                        }
                    };
                    self.jobs.push(FileJob {
                        stage,
                        staged,
                        final_path: path,
                        leaf: *i,
                    });
                }
                EntrySpec::Node(child) => {
                    let name = format::encode_key(key);
                    written.insert(name.clone());
                    // a missing sub-tree is staged whole (see `staged`), not made with a mkdir step
                    let present = dir_present(&final_path, &name, stat(&name)?)?;
                    children.push((name, child, present, false));
                    metas.push((
                        key.as_str(),
                        match &child.class {
                            Some(class) => EntryMeta::TensorClass(&class.name),
                            None => EntryMeta::TensorDict,
                        },
                    ));
                }
                EntrySpec::NonTensor(_) | EntrySpec::Stack(_) => {
                    let (bytes, kind) = entry.value_dir().expect("a directory of values");
                    let name = format::encode_key(key);
                    if bytes.len() as u64 > format::VALUE_META_LIMIT {
                        // what no load would read back is refused (the save changes nothing)
                        return Err(Error::tree(
                            final_path.join(&name),
                            format!(
                                "key {key:?}: the value's meta.json would be {} bytes, more than the limit of {} that a load reads",
                                bytes.len(),
                                format::VALUE_META_LIMIT
                            ),
                        ));
                    }
                    written.insert(name.clone());
                    if let Some(at) = &staged {
                        let sub = inside(at, &name);
                        let sub_meta = format!("{sub}/{}", format::META_FILE);
                        let io_err = |e| Error::io(final_path.join(&name), e);
                        staging.dir(stage).create_dir(&sub).map_err(io_err)?;
                        self.synced_dirs.push((stage, sub));
                        staging
                            .dir(stage)
                            .write_new(&sub_meta, &bytes, opts.durable)
                            .map_err(io_err)?;
                        metas.push((key.as_str(), kind));
                        continue;
                    }
                    let present = self.need_dir(&final_path, rel, &name, stat(&name)?)?;
                    let mut old_meta = None;
                    if present {
                        let d = dir.as_ref().expect("a child exists, so its directory does");
                        let sub = d
                            .open_dir(&name)
                            .map_err(|e| Error::io(final_path.join(&name), e))?;
                        let (ours, state) = meta_is_ours(&sub)?;
                        if !ours {
                            return Err(foreign(
                                &final_path.join(&name).join(format::META_FILE),
                                "a meta.json that is not a tensordict's",
                            ));
                        }
                        old_meta = state;
                    }
                    let to = with(&with(rel, &name), format::META_FILE);
                    self.stage_meta(staging, stage, &bytes, to, old_meta, &final_path, opts.durable)?;
                    metas.push((key.as_str(), kind));
                }
            }
        }
        let bytes = match wrapper {
            Some(class) => class.meta.clone(),
            None => format::tensordict_meta(metas, &node.batch),
        };
        if let Some(d) = &dir {
            self.plan_removals(d, rel, &old, &written, 0)?;
        }
        drop(dir);
        for (name, child, present, child_fields) in children {
            rel.push(name);
            let result = self.node(
                root,
                staging,
                rel,
                child,
                leaves,
                opts,
                present,
                stage,
                staged.as_deref(),
                child_fields,
            );
            rel.pop();
            result?;
        }
        if let Some(at) = &staged {
            // inside a staged sub-tree: meta.json is written at its final name
            return staging
                .dir(stage)
                .write_new(&inside(at, format::META_FILE), &bytes, opts.durable)
                .map_err(|e| Error::io(final_path.join(format::META_FILE), e));
        }
        // Post-order: a directory's meta.json goes in after its children's, the root's last.
        let to = with(rel, format::META_FILE);
        self.stage_meta(staging, stage, &bytes, to, old.meta, &final_path, opts.durable)
    }

    /// A sub-directory the new tree needs: kept when it is one, created when missing.
    /// Returns whether it exists now.
    fn need_dir(&mut self, at: &Path, rel: &[String], name: &str, st: Option<EntryStat>) -> Result<bool> {
        let present = dir_present(at, name, st)?;
        if !present {
            self.mkdirs.push(Op::Mkdir {
                path: with(rel, name),
            });
        }
        Ok(present)
    }

    /// Fsyncs the directories staged whole (their entries' names), for durable saves.
    pub(super) fn sync_staged_dirs(&self, staging: &Staging) -> Result<()> {
        for (stage, at) in &self.synced_dirs {
            let parts: Vec<String> = at.split('/').map(str::to_string).collect();
            let dir = staging.dir(*stage);
            let path = dir.path().join(at);
            let sub = dir.open_rel(&parts).map_err(|e| Error::io(&path, e))?;
            sub.sync().map_err(|e| Error::io(&path, e))?;
        }
        Ok(())
    }

    /// Stages the meta.json that goes to `to` (replacing `old`, the one there now), and
    /// records both in the directory's `DirState`.
    #[allow(clippy::too_many_arguments)]
    fn stage_meta(
        &mut self,
        staging: &Staging,
        stage: usize,
        bytes: &[u8],
        to: Vec<String>,
        old: Option<FileState>,
        at: &Path,
        durable: bool,
    ) -> Result<()> {
        let staged = format!("m{}", self.staged_metas);
        self.staged_metas += 1;
        let io_err = |e| Error::io(at.join(format::META_FILE), e);
        let dir = staging.dir(stage);
        dir.write_new(&staged, bytes, durable).map_err(io_err)?;
        let st = dir
            .stat(&staged)
            .map_err(io_err)?
            .ok_or_else(|| io_err(io::ErrorKind::NotFound.into()))?;
        let new = FileState::of(Stamp::from(st), bytes);
        self.dir_states.push(DirState {
            path: to[..to.len() - 1].to_vec(),
            old,
            new: Some(new),
        });
        self.metas.push(Op::Rename {
            stage,
            name: staged,
            to,
            id: Some(new.identity()),
            replaces: old.map(|o| o.identity()),
        });
        Ok(())
    }

    /// Stages a small file that is not a meta.json (a nested leaf's table of shapes) for `to`,
    /// replacing `old` (the old tree's file there; None: a new name, never replaced). Its
    /// rename goes with the data files'; `journal` records its identity.
    #[allow(clippy::too_many_arguments)]
    fn stage_small(
        &mut self,
        staging: &Staging,
        stage: usize,
        bytes: &[u8],
        to: Vec<String>,
        old: Option<(u64, u64)>,
        path: &Path,
        durable: bool,
    ) -> Result<()> {
        let staged = format!("m{}", self.staged_metas);
        self.staged_metas += 1;
        staging
            .dir(stage)
            .write_new(&staged, bytes, durable)
            .map_err(|e| Error::io(path, e))?;
        self.data.push(Op::Rename {
            stage,
            name: staged,
            to,
            id: None, // filled in by `journal`
            replaces: old,
        });
        Ok(())
    }

    /// The bytes `write_data` will write (or reserve).
    pub(super) fn data_bytes(&self, leaves: &[LeafSpec<'_>]) -> u64 {
        self.jobs.iter().map(|job| leaves[job.leaf].nbytes as u64).sum()
    }

    /// Writes the staged data files (in parallel) and maps them.
    pub(super) fn write_data(
        &mut self,
        staging: &Staging,
        leaves: &[LeafSpec<'_>],
        opts: SaveOptions,
    ) -> Result<()> {
        let workers = pool::worker_count(opts.num_threads, self.jobs.len());
        let mapped = pool::run(
            &self.jobs,
            workers,
            |job| leaves[job.leaf].nbytes,
            |job| {
                let leaf = &leaves[job.leaf];
                let io_err = |e| Error::io(&job.final_path, e);
                let file = staging.dir(job.stage).create_file(&job.staged).map_err(io_err)?;
                match leaf.data {
                    Some(data) => storage::fill_file(&file, Some(data), leaf.nbytes).map_err(io_err)?,
                    None if opts.sparse => file.set_len(leaf.nbytes as u64).map_err(io_err)?,
                    None => storage::reserve(&file, leaf.nbytes).map_err(io_err)?,
                }
                if opts.durable {
                    file.sync_data().map_err(io_err)?;
                }
                let identity = identity::of_file(&file).ok();
                let region = storage::map_file_as(
                    &file,
                    leaf.nbytes,
                    Some(job.final_path.clone()),
                    MapMode::Shared,
                    identity,
                )
                .map_err(io_err)?;
                Ok((region, identity))
            },
        )?;
        for (job, (region, identity)) in self.jobs.iter().zip(mapped) {
            self.regions[job.leaf] = Some(region);
            if let Some(id) = identity {
                self.staged_ids.insert((job.stage, job.staged.clone()), id);
            }
        }
        Ok(())
    }

    /// The maps of the written leaves, for a save that needs no journal (`fresh.rs`).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub(super) fn into_regions(self) -> Vec<Option<Region>> {
        self.regions
    }

    /// The journal of this plan: the root meta.json moved aside first (when there is one),
    /// new directories, data files and whole new sub-trees, meta.json files (post-order, the
    /// root's last), removals; every staged entry with its identity, every directory's
    /// meta.json before and after.
    pub(super) fn journal(self, staging: &Staging) -> Result<(Journal, Vec<Option<Region>>)> {
        let root_old = self
            .dir_states
            .iter()
            .find(|d| d.path.is_empty())
            .and_then(|d| d.old);
        let mut ops = Vec::with_capacity(1 + self.mkdirs.len() + self.data.len() + self.metas.len());
        if root_old.is_some() {
            ops.push(Op::Aside { name: "p0".into() });
        }
        ops.extend(self.mkdirs);
        for mut op in self.data {
            if let Op::Rename { stage, name, id, .. } = &mut op {
                *id = match self.staged_ids.get(&(*stage, name.clone())) {
                    Some(found) => Some(*found),
                    // a whole staged sub-tree: the directory's identity
                    None => {
                        let dir = staging.dir(*stage);
                        let st = dir
                            .stat(name)
                            .map_err(|e| Error::io(dir.child_path(name), e))?
                            .ok_or_else(|| Error::io(dir.child_path(name), io::ErrorKind::NotFound.into()))?;
                        Some((st.dev, st.ino))
                    }
                };
            }
            ops.push(op);
        }
        ops.extend(self.metas);
        ops.extend(self.removals);
        let journal = Journal {
            version: JOURNAL_VERSION,
            token: staging.token.clone(),
            stagings: staging.locations(),
            ops,
            dirs: self.dir_states,
            dropped: Vec::new(),
        };
        Ok((journal, self.regions))
    }
}

/// `name` inside the staged directory `at` ("" is the staging directory itself).
fn inside(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_string()
    } else {
        format!("{at}/{name}")
    }
}

pub(super) fn commit_path(root: &Path, rel: &[String]) -> PathBuf {
    rel.iter().fold(root.to_path_buf(), |p, c| p.join(c))
}
