//! The parts of a saved directory that every reader opens, each refusal worded once: its
//! meta.json (bounded, a regular file, never through a symlink) and the sub-directory of a key
//! (never a symlink). Loads and verification (`load`) and the `info` summary (`report`) read
//! a tree through these, so a damaged or hostile tree gets the same error from each.

use std::io;

use crate::error::{Error, Result};
use crate::format::{self, NodeMeta, TensorDictMeta};
use crate::sys::dir::{self, Dir, EntryKind};
use crate::sys::identity::Stamp;

/// Reads and parses the meta.json of `dir`: at most `META_LIMIT` bytes of a regular file (a
/// value directory's, known by its first bytes, up to `VALUE_META_LIMIT`: see
/// `read_meta_bytes`), never through a symlink (a `SymlinkError`), never blocking on a FIFO.
pub fn read_meta(dir: &Dir) -> Result<NodeMeta> {
    read_meta_stamped(dir).map(|(meta, _, _)| meta)
}

/// `read_meta`, with the stamp (identity, size, modification time) of the file it read (a
/// load checks at its end that every sub-directory's meta.json still has it) and the token of
/// its bytes (`format::meta::meta_token`: a value written in place later checks that the
/// meta.json is still this one).
pub fn read_meta_stamped(dir: &Dir) -> Result<(NodeMeta, Stamp, u64)> {
    let (bytes, stamp) = read_meta_bytes(dir).map_err(|e| meta_error(dir, e))?;
    let meta = format::parse_meta(&bytes, &dir.child_path(format::META_FILE))?;
    Ok((meta, stamp, format::meta::meta_token(&bytes)))
}

/// `read_meta` with another size bound (a stack's meta.json holds its values).
pub fn read_meta_limited(dir: &Dir, limit: u64) -> Result<NodeMeta> {
    read_meta_limited_stamped(dir, limit).map(|(meta, _, _)| meta)
}

/// The bytes of `dir/meta.json` and its stamp: at most `META_LIMIT` bytes, or, when its first
/// bytes say it is a value directory's (a NonTensorData's or a NonTensorStack's, whose values
/// live in it: `format::meta::is_value_header`), at most `VALUE_META_LIMIT`. What a save
/// writes there is bounded by the same limits, so every saved value reads back.
pub fn read_meta_bytes(dir: &Dir) -> io::Result<(Vec<u8>, Stamp)> {
    match dir.read_limited_stamped(format::META_FILE, format::META_LIMIT) {
        Err(e) if e.kind() == io::ErrorKind::InvalidData && value_header(dir) => {
            dir.read_limited_stamped(format::META_FILE, format::VALUE_META_LIMIT)
        }
        other => other,
    }
}

/// True when `dir/meta.json` starts as a value directory's does (read: its first bytes only).
pub fn value_header(dir: &Dir) -> bool {
    use std::io::Read;
    let Ok(file) = dir.open_read(format::META_FILE) else {
        return false;
    };
    let mut head = Vec::new();
    if file
        .take(format::meta::VALUE_HEADER_LEN as u64)
        .read_to_end(&mut head)
        .is_err()
    {
        return false;
    }
    format::meta::is_value_header(&head)
}

/// `read_meta_stamped` with another size bound.
pub fn read_meta_limited_stamped(dir: &Dir, limit: u64) -> Result<(NodeMeta, Stamp, u64)> {
    let path = dir.child_path(format::META_FILE);
    let (bytes, stamp) = dir
        .read_limited_stamped(format::META_FILE, limit)
        .map_err(|e| meta_error(dir, e))?;
    Ok((
        format::parse_meta(&bytes, &path)?,
        stamp,
        format::meta::meta_token(&bytes),
    ))
}

/// The error of a failed read of `dir/meta.json`, worded once.
fn meta_error(dir: &Dir, e: io::Error) -> Error {
    let path = dir.child_path(format::META_FILE);
    match e {
        e if dir::is_symlink_refused(&e) => {
            Error::symlink(&path, "meta.json is a symlink; refusing to follow it")
        }
        e if dir::is_not_regular(&e) => Error::invalid(&path, format!("meta.json is {e}")),
        e if e.kind() == io::ErrorKind::InvalidData => Error::invalid(&path, e.to_string()),
        e => Error::io(&path, e),
    }
}

/// Opens and reads the directory of the NonTensorStack at `key` in `parent` (batch size
/// `batch`): its meta.json must be a stack's, whose values nest to at least `batch`.
pub fn read_stack(parent: &Dir, key: &str, batch: &[u64]) -> Result<format::StackMeta> {
    read_stack_stamped(parent, key, batch).map(|(stack, _, _)| stack)
}

/// `read_stack`, with the stamp and token of the meta.json it read (see `read_meta_stamped`).
pub fn read_stack_stamped(parent: &Dir, key: &str, batch: &[u64]) -> Result<(format::StackMeta, Stamp, u64)> {
    let child = open_child_dir(parent, key)?;
    let path = child.child_path(format::META_FILE);
    let (meta, stamp, token) = read_meta_limited_stamped(&child, format::VALUE_META_LIMIT)?;
    let mut stack = match meta {
        NodeMeta::Stack(stack) => stack,
        _ => {
            return Err(Error::invalid(
                &path,
                format!("key {key:?} is listed as a NonTensorStack, but its meta.json is not a stack's"),
            ))
        }
    };
    check_stack(&mut stack, key, batch, &path)?;
    Ok((stack, stamp, token))
}

/// A stack's values must nest to its parent's batch size (as many values as rows). A stack
/// without cells whose file gives no `"shape"` takes its parent's batch size where its
/// nesting stopped at an empty dim that the batch size has too (`StackData::fit_batch`).
pub fn check_stack(
    stack: &mut format::StackMeta,
    key: &str,
    batch: &[u64],
    path: &std::path::Path,
) -> Result<()> {
    stack.data.fit_batch(batch);
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
