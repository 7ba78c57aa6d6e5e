//! Integrity checks of saved trees: every problem of a directory reported, without mapping
//! any data (`verify_tree`). No pyo3 here.

use std::path::Path;

use super::leaf::{check_leaf, leaf_name, read_nested, LeafJob};
use crate::error::Error;
use crate::format::{self, Entry, NodeMeta, TensorDictMeta};
use crate::sys::dir::Dir;
use crate::tree::commit;
use crate::tree::read::{open_child_dir, read_meta, read_stack, tensorclass_fields};

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
                    Ok(NodeMeta::Stack(mut stack)) => {
                        if let Err(e) = crate::tree::read::check_stack(
                            &mut stack,
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
