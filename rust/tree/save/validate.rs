//! Checks a tree before a save writes anything. No pyo3 here.

use std::collections::HashSet;
use std::path::Path;

use super::{EntrySpec, LeafSpec, NodeSpec};
use crate::error::{Error, Result};
use crate::format;

/// Checks that the tree can be stored and loaded back: no reserved keys, no two entries on
/// one file name, sizes consistent with shapes (within the limits the loader enforces),
/// leaves that start with their node's batch size, no deeper nesting than the loader follows.
pub fn validate(node: &NodeSpec, leaves: &[LeafSpec<'_>], path: &Path) -> Result<()> {
    validate_at(node, leaves, path, 0)
}

fn validate_at(node: &NodeSpec, leaves: &[LeafSpec<'_>], path: &Path, depth: usize) -> Result<()> {
    if depth > format::MAX_DEPTH {
        return Err(Error::tree(
            path,
            format!(
                "the tree is nested more than {} levels deep, which no loader here would read back",
                format::MAX_DEPTH
            ),
        ));
    }
    let mut names: HashSet<String> = HashSet::new();
    for (key, entry) in &node.entries {
        if format::RESERVED_KEYS.contains(&key.as_str()) {
            return Err(Error::tree(
                path,
                format!("key {key:?} is reserved by the meta.json format and would be lost; rename it"),
            ));
        }
        let name = match entry {
            EntrySpec::Leaf(_) => format::leaf_file(key),
            _ => format::encode_key(key),
        };
        let folded = format::fold_case(&name);
        if folded == format::META_FILE || !names.insert(folded) {
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
                let dt = format::dtype(&leaf.dtype).ok_or_else(|| {
                    Error::tree(
                        path,
                        format!("key {key:?}: dtype {:?} cannot be stored", leaf.dtype),
                    )
                })?;
                let expect = format::nbytes(&leaf.shape, dt.itemsize).ok_or_else(|| {
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
            EntrySpec::Node(child) => validate_at(child, leaves, &path.join(&name), depth + 1)?,
            EntrySpec::NonTensor(_) => {}
        }
    }
    Ok(())
}
