//! The tree side of `.tdz` archives: from the validated entries to a `LoadedNode`, and the
//! bytes of every leaf (a view of the one map, or a copy when compressed or unaligned). No
//! pyo3 here.
//!
//! The walk follows the meta.json entries from the top, as the directory loader follows the
//! files: every meta.json is read under `META_LIMIT` and checked against its CRC-32, every
//! leaf's entry must exist and hold at least the bytes its shape needs, depth is bounded, and
//! a child's batch size must start with its parent's.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::archive::zip::{bad, crc32, entry_path, Archive, STORED};
use crate::error::{Error, Result};
use crate::format::{self, Entry, LeafMeta, NodeMeta};
use crate::sys::pool;
use crate::sys::storage::{MapMode, Region};
use crate::tree::load::{check_nested_table, LoadedEntry, LoadedNode};
use crate::tree::read::check_stack;

/// The bytes of one loaded leaf: a view of the archive's map, or a copy.
#[derive(Debug)]
pub enum LeafData {
    View {
        offset: usize,
        len: usize,
    },
    /// Decompressed or realigned into anonymous memory (writes do not reach the archive).
    Copy(Region),
}

/// A loaded or freshly written archive: its map, and one entry per leaf (None when empty).
pub struct Loaded {
    pub region: Arc<Region>,
    pub leaves: Vec<Option<LeafData>>,
    /// Names of the entries that had to be copied (compressed or unaligned).
    pub copied: Vec<String>,
}

/// A leaf to materialize after the walk.
pub(crate) struct LeafJob {
    pub(crate) entry: usize,
    pub(crate) nbytes: usize,
    pub(crate) itemsize: usize,
}

/// meta.json entries parsed ahead of the walk, by name; the walk takes each when it gets there
/// (so an error surfaces only for a meta.json the tree reaches, as without this).
pub(crate) type Parsed = HashMap<String, Result<NodeMeta>>;

/// Below this many meta.json entries the walk parses them itself.
const PARSE_AHEAD_MIN: usize = 16;

/// Parses the stored meta.json entries on the pool: parsing is most of the walk of a tree of
/// many small leaves (110 meta.json for 10,000 leaves), and each is independent. Only stored
/// entries are parsed ahead (their size is bounded by the file's; nothing is inflated for a
/// meta.json the tree may never reach); each is read under `META_LIMIT` and checked against
/// its CRC as `read_meta` does, and only its typed form is kept.
pub(crate) fn parse_ahead(ar: &Archive) -> Parsed {
    let metas: Vec<usize> = (0..ar.entries.len())
        .filter(|&i| {
            let e = &ar.entries[i];
            e.method == STORED
                && (e.name == format::META_FILE
                    || e.name
                        .strip_suffix(format::META_FILE)
                        .is_some_and(|d| d.ends_with('/')))
        })
        .collect();
    if metas.len() < PARSE_AHEAD_MIN {
        return HashMap::new();
    }
    let workers = pool::worker_count(0, metas.len() / PARSE_AHEAD_MIN);
    let parsed = pool::run(
        &metas,
        workers,
        |&i| ar.entries[i].size as usize,
        |&i| Ok(read_meta(ar, &ar.entries[i].name)),
    );
    match parsed {
        Ok(results) => metas
            .iter()
            .zip(results)
            .map(|(&i, r)| (ar.entries[i].name.clone(), r))
            .collect(),
        Err(_) => HashMap::new(), // the walk parses them itself
    }
}

fn take_meta(ar: &Archive, parsed: &mut Parsed, name: &str) -> Result<NodeMeta> {
    match parsed.remove(name) {
        Some(meta) => meta,
        None => read_meta(ar, name),
    }
}

pub(crate) fn walk(
    ar: &Archive,
    parsed: &mut Parsed,
    dir: &str,
    depth: usize,
    jobs: &mut Vec<Option<LeafJob>>,
) -> Result<LoadedNode> {
    let meta_name = format!("{dir}{}", format::META_FILE);
    let meta_path = entry_path(&ar.path, &meta_name);
    if depth > format::MAX_DEPTH {
        return Err(bad(&meta_path, "the tree is nested too deeply"));
    }
    let meta = match take_meta(ar, parsed, &meta_name)? {
        NodeMeta::TensorDict(m) => m,
        NodeMeta::NonTensor(_) | NodeMeta::Stack(_) => {
            return Err(Error::unsupported(
                &meta_path,
                "this archive holds non-tensor values only, not a TensorDict",
            ))
        }
        NodeMeta::TensorClass(class) => {
            // tensordict's tensorclass layout: the fields are the TensorDict in _tensordict/
            let pickle = format!("{dir}other.pickle");
            if ar.entry(&pickle).is_some() {
                return Err(Error::unsupported(
                    entry_path(&ar.path, &pickle),
                    "this tensorclass has fields stored with pickle, which is never loaded (only JSON values are)",
                ));
            }
            let fields = format!("{dir}{}/", format::TENSORCLASS_DIR);
            if ar.entry(&format!("{fields}{}", format::META_FILE)).is_none() {
                return Err(bad(&meta_path, "a tensorclass without its _tensordict directory"));
            }
            let mut node = walk(ar, parsed, &fields, depth + 1, jobs)?;
            node.class = Some(serde_json::Value::Object(class).to_string());
            return Ok(node);
        }
    };
    let mut entries = Vec::with_capacity(meta.entries.len());
    for (key, entry) in meta.entries {
        match entry {
            Entry::Leaf(leaf) => {
                let index = jobs.len();
                let mut nbytes = leaf.nbytes;
                let mut nested = None;
                if leaf.nested.is_some() {
                    let data_name = format!("{dir}{}", format::portable_leaf_file(&key));
                    let table = format::shape_file(&data_name);
                    let at = entry_path(&ar.path, &table);
                    let e = ar.entry(&table).ok_or_else(|| {
                        bad(
                            &at,
                            format!("the table of component shapes of key {key:?} is missing (no entry {table:?})"),
                        )
                    })?;
                    let want = leaf.nested.and_then(|n| n.table_bytes()).unwrap_or(0);
                    let bytes = ar.read(e, want as u64 + 1)?;
                    let (loaded, size) = check_nested_table(&bytes, &key, &leaf, &meta.batch, &at)?;
                    nbytes = size;
                    nested = Some(loaded);
                }
                let LeafMeta { dtype, shape, .. } = leaf;
                if nbytes == 0 {
                    jobs.push(None);
                } else {
                    let encoded = format!("{dir}{}", format::portable_leaf_file(&key));
                    let name = match format::legacy_name(&key) {
                        Some(raw) if ar.entry(&encoded).is_none() => {
                            format!("{dir}{raw}{}", format::LEAF_SUFFIX)
                        }
                        _ => encoded,
                    };
                    let at = || entry_path(&ar.path, &name);
                    let e = *ar.index.get(&name).ok_or_else(|| {
                        bad(
                            &at(),
                            format!("the data of key {key:?} is missing (no entry {name:?})"),
                        )
                    })?;
                    if nested.is_some() && ar.entries[e].size != nbytes as u64 {
                        return Err(bad(
                            &at(),
                            format!(
                                "the data of key {key:?} holds {} bytes; its components need exactly {nbytes}",
                                ar.entries[e].size
                            ),
                        ));
                    }
                    if ar.entries[e].size < nbytes as u64 {
                        return Err(bad(
                            &at(),
                            format!(
                                "the data of key {key:?} is truncated: {} bytes, its shape needs {nbytes}",
                                ar.entries[e].size
                            ),
                        ));
                    }
                    jobs.push(Some(LeafJob {
                        entry: e,
                        nbytes,
                        itemsize: dtype.itemsize,
                    }));
                }
                entries.push((
                    key,
                    LoadedEntry::Leaf {
                        dtype: dtype.name,
                        shape,
                        index,
                        nested,
                    },
                ));
            }
            Entry::Stack => {
                let child_meta = format!("{dir}{}/{}", format::portable_key(&key), format::META_FILE);
                let at = entry_path(&ar.path, &child_meta);
                parsed.remove(&child_meta); // read again under the stacks' larger bound
                let e = ar
                    .entry(&child_meta)
                    .ok_or_else(|| bad(&at, format!("the sub-directory of key {key:?} is missing")))?;
                let bytes = ar.read(e, format::VALUE_META_LIMIT)?;
                let NodeMeta::Stack(mut stack) = format::parse_meta(&bytes, &at)? else {
                    return Err(bad(
                        &at,
                        format!(
                            "key {key:?} is listed as a NonTensorStack, but its meta.json is not a stack's"
                        ),
                    ));
                };
                check_stack(&mut stack, &key, &meta.batch, &at)?;
                entries.push((key, LoadedEntry::Stack(stack, None)));
            }
            Entry::Collection => {
                let child = format!("{dir}{}/", format::portable_key(&key));
                let child_meta = format!("{child}{}", format::META_FILE);
                if ar.entry(&child_meta).is_none() {
                    let at = entry_path(&ar.path, &child_meta);
                    let what = if ar.dirs.contains(child.trim_end_matches('/'))
                        || ar.index.keys().any(|n| n.starts_with(&child))
                    {
                        "has no meta.json"
                    } else {
                        "is missing"
                    };
                    return Err(bad(&at, format!("the sub-directory of key {key:?} {what}")));
                }
                match take_meta(ar, parsed, &child_meta)? {
                    NodeMeta::NonTensor(value) => entries.push((key, LoadedEntry::NonTensor(value, None))),
                    NodeMeta::Stack(mut stack) => {
                        check_stack(&mut stack, &key, &meta.batch, &entry_path(&ar.path, &child_meta))?;
                        entries.push((key, LoadedEntry::Stack(stack, None)));
                    }
                    sub @ (NodeMeta::TensorDict(_) | NodeMeta::TensorClass(_)) => {
                        // handed to the child's walk, which would otherwise parse it again
                        parsed.insert(child_meta.clone(), Ok(sub));
                        let node = walk(ar, parsed, &child, depth + 1, jobs)?;
                        if !node.batch.starts_with(&meta.batch) {
                            return Err(bad(
                                &entry_path(&ar.path, &child_meta),
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
        class: None,
    })
}

pub(crate) fn read_meta(ar: &Archive, name: &str) -> Result<NodeMeta> {
    let at = entry_path(&ar.path, name);
    let e = ar.entry(name).ok_or_else(|| bad(&at, "meta.json is missing"))?;
    let bytes = match ar.read(e, format::META_LIMIT) {
        // a value directory's meta.json (its values live in it) may be larger, as in a
        // directory (`tree::read::read_meta_bytes`); any other is refused as before
        Err(refused) if e.size > format::META_LIMIT => match ar.read(e, format::VALUE_META_LIMIT) {
            Ok(bytes) if format::meta::is_value_header(&bytes) => bytes,
            _ => return Err(refused),
        },
        other => other?,
    };
    format::parse_meta(&bytes, &at)
}

/// The bytes of one leaf: a view when STORED and aligned for its dtype, else a copy.
pub(crate) fn leaf_data(ar: &Archive, job: &LeafJob) -> Result<LeafData> {
    let e = &ar.entries[job.entry];
    if e.method == STORED && e.data % job.itemsize as u64 == 0 {
        return Ok(LeafData::View {
            offset: e.data as usize,
            len: job.nbytes,
        });
    }
    let copy = crate::sys::anon::anonymous(None, job.nbytes)?;
    if e.method == STORED {
        // SAFETY: `copy` is a fresh writable map of `nbytes` bytes that nothing else sees yet;
        // the slice lives only for this read into it.
        let out = unsafe { std::slice::from_raw_parts_mut(copy.as_ptr(), job.nbytes) };
        ar.raw_into(e, out)?;
    } else {
        let fill = |src: &[u8]| {
            // SAFETY: as above; `src` holds at least `nbytes` bytes (the entry size was
            // checked in the walk, and the inflated size is the entry size).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), copy.as_ptr(), job.nbytes) };
        };
        let data = ar.inflate(e)?;
        if crc32(&data) != e.crc {
            return Err(bad(
                &entry_path(&ar.path, &e.name),
                format!("entry {:?} fails its CRC-32 check", e.name),
            ));
        }
        fill(&data);
    }
    Ok(LeafData::Copy(copy))
}

/// Opens, validates and walks the archive at `path`; every leaf a view of one map when it
/// can be. `mode`: `Shared` (writes reach the file) or `CopyOnWrite` (they stay private).
pub fn load_archive(path: &Path, mode: MapMode) -> Result<Loaded> {
    load_archive_tree(path, mode).map(|(_, loaded)| loaded)
}

/// Like `load_archive`, with the tree.
pub fn load_archive_tree(path: &Path, mode: MapMode) -> Result<(LoadedNode, Loaded)> {
    let ar = Archive::open(path, mode)?;
    let mut jobs = Vec::new();
    let mut parsed = parse_ahead(&ar);
    let node = walk(&ar, &mut parsed, "", 0, &mut jobs)?;
    let copies: Vec<usize> = (0..jobs.len())
        .filter(|&i| {
            jobs[i].as_ref().is_some_and(|j| {
                let e = &ar.entries[j.entry];
                e.method != STORED || e.data % j.itemsize as u64 != 0
            })
        })
        .collect();
    let workers = pool::worker_count(0, copies.len());
    let copied_data = pool::run(
        &copies,
        workers,
        |&i| jobs[i].as_ref().map_or(0, |j| j.nbytes),
        |&i| jobs[i].as_ref().map(|j| leaf_data(&ar, j)).transpose(),
    )?;
    let mut copied = Vec::new();
    let mut leaves: Vec<Option<LeafData>> = Vec::with_capacity(jobs.len());
    let mut copied_iter = copies.iter().zip(copied_data).peekable();
    for (i, job) in jobs.iter().enumerate() {
        match copied_iter.peek() {
            Some((&c, _)) if c == i => {
                let (_, data) = copied_iter.next().unwrap_or((&0, None));
                if let Some(j) = job {
                    copied.push(ar.entries[j.entry].name.clone());
                }
                leaves.push(data);
            }
            _ => leaves.push(job.as_ref().map(|j| leaf_data(&ar, j)).transpose()?),
        }
    }
    // The views read through the map: the file must still cover it.
    ar.check_unchanged()?;
    Ok((
        node,
        Loaded {
            region: ar.region,
            leaves,
            copied,
        },
    ))
}
