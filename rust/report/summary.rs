//! What a saved tree holds, read from its meta.json files alone: keys, dtypes, shapes, byte
//! sizes, batch sizes, devices and the format version. No data file is opened or mapped, so a
//! 10,000-leaf directory is summarized in the time it takes to read its meta.json files. This
//! is what the command line's `info` shows. No pyo3 here.

use std::path::Path;

use serde_json::Value;

use crate::archive::Archive;
use crate::error::{Error, Result};
use crate::format::{self, Entry, LeafMeta, NodeMeta, TensorDictMeta};
use crate::sys::dir::Dir;
use crate::sys::storage::MapMode;
use crate::tree::load::{check_nested_table, read_nested_table, LoadedNested};
use crate::tree::read::{check_stack, open_child_dir, read_meta, read_stack, tensorclass_fields};

/// One entry of a summarized directory.
#[derive(Debug)]
pub enum SummaryEntry {
    Leaf {
        dtype: &'static str,
        shape: Vec<u64>,
        nbytes: usize,
    },
    Node(SummaryNode),
    NonTensor(Value),
    /// A nested leaf: `shape` has -1 where the components' sizes differ (as its repr shows).
    Nested {
        dtype: &'static str,
        shape: Vec<i64>,
        nbytes: usize,
        jagged: bool,
    },
    /// A NonTensorStack of `shape` (its values are not shown).
    Stack {
        shape: Vec<u64>,
    },
}

/// The summary of a nested leaf from its checked table of component shapes.
fn nested_summary(leaf: &LeafMeta, loaded: &LoadedNested, nbytes: usize) -> SummaryEntry {
    let dims = loaded.dims as usize;
    let mut shape = vec![i64::try_from(loaded.sizes.len() / dims.max(1)).unwrap_or(-1)];
    if dims == 0 {
        shape[0] = leaf.shape.first().map_or(0, |&n| n as i64);
    }
    for d in 0..dims {
        let mut sizes = loaded.sizes.iter().skip(d).step_by(dims);
        let first = sizes.next().copied();
        shape.push(match first {
            Some(f) if sizes.all(|&s| s == f) => f,
            Some(_) => -1,
            None => 0,
        });
    }
    SummaryEntry::Nested {
        dtype: leaf.dtype.name,
        shape,
        nbytes,
        jagged: loaded.layout == format::Layout::Jagged,
    }
}

/// A summarized TensorDict directory.
#[derive(Debug)]
pub struct SummaryNode {
    pub batch: Vec<u64>,
    pub device: Option<String>,
    /// `_format_version` of this directory's meta.json (absent in old trees).
    pub format_version: Option<u64>,
    pub entries: Vec<(String, SummaryEntry)>,
}

fn tensordict(meta: NodeMeta, at: &Path, what: &str) -> Result<TensorDictMeta> {
    match meta {
        NodeMeta::TensorDict(m) => Ok(m),
        NodeMeta::NonTensor(_) | NodeMeta::Stack(_) => Err(Error::unsupported(
            at,
            format!("this {what} holds non-tensor values only, not a TensorDict"),
        )),
        NodeMeta::TensorClass(_) => Err(Error::invalid(
            at,
            "the _tensordict directory of a tensorclass holds another tensorclass, not a TensorDict",
        )),
    }
}

/// Summarizes `dir`, whose meta.json (`meta`) was read by its parent (each meta.json is read
/// and parsed once).
fn summarize_dir(dir: &Dir, meta: TensorDictMeta, depth: usize) -> Result<SummaryNode> {
    if depth > format::MAX_DEPTH {
        return Err(Error::invalid(dir.path(), "the tree is nested too deeply"));
    }
    let mut entries = Vec::with_capacity(meta.entries.len());
    for (key, entry) in meta.entries {
        let summary = match entry {
            Entry::Leaf(leaf) if leaf.nested.is_some() => {
                let (loaded, nbytes) = read_nested_table(dir, &key, &leaf, &meta.batch)?;
                nested_summary(&leaf, &loaded, nbytes)
            }
            Entry::Leaf(leaf) => SummaryEntry::Leaf {
                dtype: leaf.dtype.name,
                shape: leaf.shape,
                nbytes: leaf.nbytes,
            },
            Entry::Stack => SummaryEntry::Stack {
                shape: read_stack(dir, &key, &meta.batch)?.data.shape,
            },
            Entry::Collection => {
                let child = open_child_dir(dir, &key)?;
                match read_meta(&child)? {
                    NodeMeta::NonTensor(value) => SummaryEntry::NonTensor(value),
                    NodeMeta::Stack(mut stack) => {
                        check_stack(
                            &mut stack,
                            &key,
                            &meta.batch,
                            &child.child_path(format::META_FILE),
                        )?;
                        SummaryEntry::Stack {
                            shape: stack.data.shape,
                        }
                    }
                    NodeMeta::TensorDict(sub) => SummaryEntry::Node(summarize_dir(&child, sub, depth + 1)?),
                    NodeMeta::TensorClass(_) => {
                        let (fields, sub) = tensorclass_fields(&child)?;
                        SummaryEntry::Node(summarize_dir(&fields, sub, depth + 1)?)
                    }
                }
            }
        };
        entries.push((key, summary));
    }
    Ok(SummaryNode {
        batch: meta.batch,
        device: meta.device,
        format_version: meta.format_version,
        entries,
    })
}

/// Summarizes the tree at `prefix` from its meta.json files (validated as the loader does;
/// data files are not checked: that is `verify_tree`'s job).
pub fn summarize(prefix: &Path) -> Result<SummaryNode> {
    let root = Dir::open(prefix).map_err(|e| Error::io(prefix, e))?;
    if let NodeMeta::TensorClass(_) = read_meta(&root)? {
        let (fields, meta) = tensorclass_fields(&root)?;
        return summarize_dir(&fields, meta, 0);
    }
    let meta = tensordict(read_meta(&root)?, root.path(), "directory")?;
    summarize_dir(&root, meta, 0)
}

/// Summarizes the `.tdz` archive at `path` from its meta.json entries (the archive index is
/// validated as the loader does; data entries are neither read nor inflated).
pub fn summarize_archive(path: &Path) -> Result<SummaryNode> {
    let ar = Archive::open(path, MapMode::ReadOnly)?;
    let at = ar.path.join(format::META_FILE);
    let (root, meta) = match archive_meta(&ar, "")? {
        None => return Err(Error::invalid(&at, "meta.json is missing")),
        Some(NodeMeta::TensorClass(_)) => archive_fields(&ar, "")?,
        Some(meta) => (String::new(), tensordict(meta, &at, "archive")?),
    };
    summarize_entry(&ar, &root, meta, 0)
}

/// The entry prefix of the fields of the tensorclass at `dir` in an archive, and their meta.
fn archive_fields(ar: &Archive, dir: &str) -> Result<(String, TensorDictMeta)> {
    let fields = format!("{dir}{}/", format::TENSORCLASS_DIR);
    let at = ar.path.join(&fields).join(format::META_FILE);
    match archive_meta(ar, &fields)? {
        None => Err(Error::invalid(
            &at,
            "a tensorclass without its _tensordict directory",
        )),
        Some(meta) => Ok((fields, tensordict(meta, &at, "archive")?)),
    }
}

fn archive_meta(ar: &Archive, dir: &str) -> Result<Option<NodeMeta>> {
    let name = format!("{dir}{}", format::META_FILE);
    if ar.entry(&name).is_none() {
        return Ok(None);
    }
    // as a load reads it: a value directory's past `META_LIMIT` too
    crate::archive::read::read_meta(ar, &name).map(Some)
}

fn archive_meta_limited(ar: &Archive, dir: &str, limit: u64) -> Result<Option<NodeMeta>> {
    let name = format!("{dir}{}", format::META_FILE);
    let Some(e) = ar.entry(&name) else { return Ok(None) };
    let bytes = ar.read(e, limit)?;
    format::parse_meta(&bytes, &ar.path.join(&name)).map(Some)
}

/// Summarizes the archive directory `dir`, whose meta.json (`meta`) was read by its parent.
fn summarize_entry(ar: &Archive, dir: &str, meta: TensorDictMeta, depth: usize) -> Result<SummaryNode> {
    if depth > format::MAX_DEPTH {
        let at = ar.path.join(format!("{dir}{}", format::META_FILE));
        return Err(Error::invalid(&at, "the tree is nested too deeply"));
    }
    let mut entries = Vec::with_capacity(meta.entries.len());
    for (key, entry) in meta.entries {
        let summary = match entry {
            Entry::Leaf(leaf) if leaf.nested.is_some() => {
                let table = format::shape_file(&format!("{dir}{}", format::leaf_file(&key)));
                let at = ar.path.join(&table);
                let e = ar.entry(&table).ok_or_else(|| {
                    Error::invalid(
                        &at,
                        format!("the table of component shapes of key {key:?} is missing"),
                    )
                })?;
                let want = leaf.nested.and_then(|n| n.table_bytes()).unwrap_or(0);
                let bytes = ar.read(e, want as u64 + 1)?;
                let (loaded, nbytes) = check_nested_table(&bytes, &key, &leaf, &meta.batch, &at)?;
                nested_summary(&leaf, &loaded, nbytes)
            }
            Entry::Leaf(leaf) => SummaryEntry::Leaf {
                dtype: leaf.dtype.name,
                shape: leaf.shape,
                nbytes: leaf.nbytes,
            },
            Entry::Stack => {
                let child = format!("{dir}{}/", format::encode_key(&key));
                let at = ar.path.join(&child).join(format::META_FILE);
                match archive_meta_limited(ar, &child, format::VALUE_META_LIMIT)? {
                    Some(NodeMeta::Stack(mut stack)) => {
                        check_stack(&mut stack, &key, &meta.batch, &at)?;
                        SummaryEntry::Stack {
                            shape: stack.data.shape,
                        }
                    }
                    _ => {
                        return Err(Error::invalid(
                            at,
                            format!(
                            "key {key:?} is listed as a NonTensorStack, but its meta.json is not a stack's"
                        ),
                        ))
                    }
                }
            }
            Entry::Collection => {
                let child = format!("{dir}{}/", format::encode_key(&key));
                match archive_meta(ar, &child)? {
                    None => {
                        return Err(Error::invalid(
                            ar.path.join(&child),
                            format!("the sub-directory of key {key:?} is missing"),
                        ))
                    }
                    Some(NodeMeta::NonTensor(value)) => SummaryEntry::NonTensor(value),
                    Some(NodeMeta::Stack(mut stack)) => {
                        check_stack(&mut stack, &key, &meta.batch, &ar.path.join(&child))?;
                        SummaryEntry::Stack {
                            shape: stack.data.shape,
                        }
                    }
                    Some(NodeMeta::TensorDict(sub)) => {
                        SummaryEntry::Node(summarize_entry(ar, &child, sub, depth + 1)?)
                    }
                    Some(NodeMeta::TensorClass(_)) => {
                        let (fields, sub) = archive_fields(ar, &child)?;
                        SummaryEntry::Node(summarize_entry(ar, &fields, sub, depth + 1)?)
                    }
                }
            }
        };
        entries.push((key, summary));
    }
    Ok(SummaryNode {
        batch: meta.batch,
        device: meta.device,
        format_version: meta.format_version,
        entries,
    })
}

#[cfg(test)]
mod tests;
