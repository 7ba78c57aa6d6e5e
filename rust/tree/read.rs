//! The parts of a saved directory that every reader opens, each refusal worded once: its
//! meta.json (bounded, a regular file, never through a symlink) and the sub-directory of a key
//! (never a symlink). Loads and verification (`load`) and the `info` summary (`report`) read
//! a tree through these, so a damaged or hostile tree gets the same error from each.

use std::io;

use crate::error::{Error, Result};
use crate::format::{self, NodeMeta, TensorDictMeta};
use crate::sys::dir::{self, Dir, EntryKind};
use crate::sys::identity::Stamp;

/// Reads and parses the meta.json of `dir`: at most `META_LIMIT` bytes of a regular file,
/// never through a symlink (a `SymlinkError`), never blocking on a FIFO.
pub fn read_meta(dir: &Dir) -> Result<NodeMeta> {
    read_meta_stamped(dir).map(|(meta, _)| meta)
}

/// `read_meta`, with the stamp (identity, size, modification time) of the file it read: a
/// load checks at its end that every sub-directory's meta.json still has it.
pub fn read_meta_stamped(dir: &Dir) -> Result<(NodeMeta, Stamp)> {
    read_meta_limited_stamped(dir, format::META_LIMIT)
}

/// `read_meta` with another size bound (a stack's meta.json holds its values).
pub fn read_meta_limited(dir: &Dir, limit: u64) -> Result<NodeMeta> {
    read_meta_limited_stamped(dir, limit).map(|(meta, _)| meta)
}

fn read_meta_limited_stamped(dir: &Dir, limit: u64) -> Result<(NodeMeta, Stamp)> {
    let path = dir.child_path(format::META_FILE);
    let (bytes, stamp) = dir
        .read_limited_stamped(format::META_FILE, limit)
        .map_err(|e| match e {
            e if dir::is_symlink_refused(&e) => {
                Error::symlink(&path, "meta.json is a symlink; refusing to follow it")
            }
            e if dir::is_not_regular(&e) => Error::invalid(&path, format!("meta.json is {e}")),
            e if e.kind() == io::ErrorKind::InvalidData => Error::invalid(&path, e.to_string()),
            e => Error::io(&path, e),
        })?;
    Ok((format::parse_meta(&bytes, &path)?, stamp))
}

/// Opens and reads the directory of the NonTensorStack at `key` in `parent` (batch size
/// `batch`): its meta.json must be a stack's, whose values nest to at least `batch`.
pub fn read_stack(parent: &Dir, key: &str, batch: &[u64]) -> Result<format::StackMeta> {
    read_stack_stamped(parent, key, batch).map(|(stack, _)| stack)
}

/// `read_stack`, with the stamp of the meta.json it read (see `read_meta_stamped`).
pub fn read_stack_stamped(parent: &Dir, key: &str, batch: &[u64]) -> Result<(format::StackMeta, Stamp)> {
    let child = open_child_dir(parent, key)?;
    let path = child.child_path(format::META_FILE);
    let (meta, stamp) = read_meta_limited_stamped(&child, format::STACK_META_LIMIT)?;
    let stack = match meta {
        NodeMeta::Stack(stack) => stack,
        _ => {
            return Err(Error::invalid(
                &path,
                format!("key {key:?} is listed as a NonTensorStack, but its meta.json is not a stack's"),
            ))
        }
    };
    check_stack(&stack, key, batch, &path)?;
    Ok((stack, stamp))
}

/// A stack's values must nest to its parent's batch size (as many values as rows).
pub fn check_stack(
    stack: &format::StackMeta,
    key: &str,
    batch: &[u64],
    path: &std::path::Path,
) -> Result<()> {
    if !stack.data.shape.starts_with(batch) {
        return Err(Error::invalid(
            path,
            format!(
                "key {key:?}: the stack's values have shape {:?}, which does not start with the batch size {batch:?}",
                stack.data.shape
            ),
        ));
    }
    Ok(())
}

/// Opens the sub-directory of `key` in `parent`. A symlink there is a `SymlinkError` (never
/// followed, also when it replaces the directory between the look and the open); anything
/// else that is not a directory, or nothing, is an `InvalidDirectoryError`.
pub fn open_child_dir(parent: &Dir, key: &str) -> Result<Dir> {
    let name = format::encode_key(key);
    let path = parent.child_path(&name);
    let symlink = || Error::symlink(&path, format!("key {key:?} is a symlink; refusing to follow it"));
    match parent.kind(&name).map_err(|e| Error::io(&path, e))? {
        EntryKind::Dir => parent.open_dir(&name).map_err(|e| match e {
            e if dir::is_symlink_refused(&e) => symlink(),
            e => Error::io(&path, e),
        }),
        EntryKind::Missing => Err(Error::invalid(
            &path,
            format!("the sub-directory of key {key:?} is missing"),
        )),
        EntryKind::Symlink => Err(symlink()),
        _ => Err(Error::invalid(
            &path,
            format!("key {key:?} should be a directory"),
        )),
    }
}

/// The fields of the tensorclass directory `dir` (tensordict's layout: the class's meta.json,
/// then the TensorDict in `_tensordict/`): that sub-directory, open, and its meta.json. A
/// pickled field (`other.pickle`) is refused, never read.
pub fn tensorclass_fields(dir: &Dir) -> Result<(Dir, TensorDictMeta)> {
    let pickle = "other.pickle";
    let at = dir.child_path(pickle);
    if dir.kind(pickle).map_err(|e| Error::io(&at, e))? != EntryKind::Missing {
        return Err(Error::unsupported(
            at,
            "this tensorclass has fields stored with pickle, which is never loaded (only JSON values are)",
        ));
    }
    let sub = open_child_dir(dir, format::TENSORCLASS_DIR)?;
    match read_meta(&sub)? {
        NodeMeta::TensorDict(m) => Ok((sub, m)),
        _ => Err(Error::invalid(
            sub.child_path(format::META_FILE),
            "the _tensordict directory of a tensorclass does not hold a TensorDict",
        )),
    }
}

#[cfg(test)]
mod tests;
