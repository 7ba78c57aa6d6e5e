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
        // a nested leaf also owns `key.shape.memmap`, the data file of a key `key.shape`
        if let EntrySpec::Leaf(i) = entry {
            if leaves.get(*i).is_some_and(|l| l.nested.is_some()) {
                let table = format::fold_case(&format::shape_file(&name));
                if !names.insert(table) {
                    return Err(clash(path, key, node));
                }
            }
        }
        let folded = format::fold_case(&name);
        if folded == format::META_FILE || !names.insert(folded) {
            if matches!(entry, EntrySpec::Leaf(_)) && names_a_table(&name, node, leaves) {
                return Err(clash(path, key, node));
            }
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
                if let Some(nested) = &leaf.nested {
                    validate_nested(key, leaf, nested, dt.itemsize, &node.batch, path)?;
                    continue;
                }
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
            EntrySpec::NonTensor(_) | EntrySpec::Stack(_) => {}
        }
    }
    Ok(())
}

/// Whether the data file `name` is the table of component shapes of a nested leaf of `node`.
fn names_a_table(name: &str, node: &NodeSpec, leaves: &[LeafSpec<'_>]) -> bool {
    node.entries.iter().any(|(k, e)| {
        matches!(e, EntrySpec::Leaf(i) if leaves.get(*i).is_some_and(|l| l.nested.is_some()))
            && format::shape_file(&format::leaf_file(k)) == name
    })
}

/// A nested leaf `x` keeps its table in `x.shape.memmap`, which a leaf `x.shape` would write.
fn clash(path: &Path, key: &str, node: &NodeSpec) -> Error {
    let other = node
        .entries
        .iter()
        .map(|(k, _)| k.as_str())
        .find(|k| *k != key && (format!("{k}.shape") == key || format!("{key}.shape") == *k))
        .unwrap_or("another entry");
    Error::tree(
        path,
        format!(
            "keys {key:?} and {other:?} would both be stored in one file: a nested leaf keeps its \
             component shapes in <key>.shape.memmap, the data file of a leaf named <key>.shape; rename one"
        ),
    )
}

/// A nested leaf: its table of component shapes matches its `[components, dims]` shape and
/// the batch size, and its data is exactly the components' bytes.
fn validate_nested(
    key: &str,
    leaf: &LeafSpec<'_>,
    nested: &super::NestedSpec,
    itemsize: usize,
    batch: &[u64],
    path: &Path,
) -> Result<()> {
    let bad = |why: String| Error::tree(path, format!("key {key:?}: {why}"));
    let &[components, dims] = leaf.shape.as_slice() else {
        return Err(bad(format!(
            "a nested leaf's shape {:?} is not [components, dims]",
            leaf.shape
        )));
    };
    let table_bytes =
        format::nbytes(&[components, dims], 8).ok_or_else(|| bad("the shape table overflows".into()))?;
    if nested.table.len() != table_bytes {
        return Err(bad(format!(
            "{} bytes of component shapes for {components} components of {dims} dims",
            nested.table.len()
        )));
    }
    if batch.first().is_some_and(|&b| b != components) || batch.len() as u64 > dims + 1 {
        return Err(bad(format!(
            "{components} components of {dims} dims do not fit the batch size {batch:?}"
        )));
    }
    let sizes: Vec<i64> = nested
        .table
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let expect =
        format::nested_nbytes(&sizes, dims as usize, itemsize, batch.get(1..).unwrap_or(&[])).map_err(bad)?;
    if expect != leaf.nbytes || leaf.data.is_some_and(|d| d.len() != expect) {
        return Err(bad(format!(
            "{} bytes given for components of {expect} bytes",
            leaf.nbytes
        )));
    }
    Ok(())
}
