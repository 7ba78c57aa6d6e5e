//! The parts of a saved directory that every reader opens, each refusal worded once: its
//! meta.json (bounded, a regular file, never through a symlink) and the sub-directory of a key
//! (never a symlink). Loads and verification (`load`) and the `info` summary (`report`) read
//! a tree through these, so a damaged or hostile tree gets the same error from each.

use std::io;

use crate::error::{Error, Result};
use crate::format::{self, NodeMeta};
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
    let path = dir.child_path(format::META_FILE);
    let (bytes, stamp) = dir
        .read_limited_stamped(format::META_FILE, format::META_LIMIT)
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

#[cfg(test)]
mod tests;
