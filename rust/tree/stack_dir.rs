//! A NonTensorStack saved on its own, as tensordict's `stack.memmap(prefix)` saves it: the
//! directory `prefix` holding the stack's meta.json, nothing else. Written atomically (a new
//! meta.json beside the old one, renamed over it); never over a directory that holds
//! something other than a stack.

use std::path::Path;

use crate::error::{Error, Result};
use crate::format::{self, NodeMeta};
use crate::sys::dir::{self, Dir, EntryKind};
use crate::tree::read::read_meta_limited;

/// Writes the stack meta.json `meta` into the directory `prefix` (made when missing, its
/// parents too). A symlink at `prefix` is refused, never followed; a directory whose
/// meta.json is not a stack's (a TensorDict, say) is refused, not overwritten.
pub fn write_stack_dir(prefix: &Path, meta: &[u8], durable: bool) -> Result<()> {
    let name = prefix
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::invalid(prefix, "a stack's directory needs a (UTF-8) name"))?;
    let parent_path = match prefix.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(parent_path).map_err(|e| Error::io(parent_path, e))?;
    let parent = Dir::open(parent_path).map_err(|e| Error::io(parent_path, e))?;
    let symlink = || {
        Error::symlink(
            prefix,
            "the stack's directory is a symlink; refusing to follow it",
        )
    };
    let dir = match parent.kind(name).map_err(|e| Error::io(prefix, e))? {
        EntryKind::Missing => match parent.create_dir(name) {
            Ok(d) => d,
            // made by another process meanwhile: open it as it is
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                parent.open_dir(name).map_err(|e| Error::io(prefix, e))?
            }
            Err(e) => return Err(Error::io(prefix, e)),
        },
        EntryKind::Dir => parent.open_dir(name).map_err(|e| match e {
            e if dir::is_symlink_refused(&e) => symlink(),
            e => Error::io(prefix, e),
        })?,
        EntryKind::Symlink => return Err(symlink()),
        _ => return Err(Error::invalid(prefix, "exists and is not a directory")),
    };
    let path = dir.child_path(format::META_FILE);
    if dir.kind(format::META_FILE).map_err(|e| Error::io(&path, e))? != EntryKind::Missing {
        match read_meta_limited(&dir, format::VALUE_META_LIMIT) {
            Ok(NodeMeta::Stack(_)) => {}
            _ => {
                return Err(Error::invalid(
                    &path,
                    "this directory holds something other than a NonTensorStack; refusing to replace it",
                ))
            }
        }
    }
    let temp = format!(".{}.{}.tmp", format::META_FILE, std::process::id());
    let io_err = |e| Error::io(&path, e);
    let _ = dir.remove_file(&temp);
    dir.write_new(&temp, meta, durable).map_err(io_err)?;
    dir.rename(&temp, &dir, format::META_FILE, false).map_err(|e| {
        let _ = dir.remove_file(&temp);
        io_err(e)
    })?;
    if durable {
        dir.sync().map_err(io_err)?;
    }
    Ok(())
}

/// Reads the stack saved on its own at `prefix` (its meta.json must be a stack's).
pub fn read_stack_dir(prefix: &Path) -> Result<format::StackMeta> {
    let dir = Dir::open(prefix).map_err(|e| Error::io(prefix, e))?;
    match read_meta_limited(&dir, format::VALUE_META_LIMIT)? {
        NodeMeta::Stack(stack) => Ok(stack),
        _ => Err(Error::invalid(
            dir.child_path(format::META_FILE),
            "this meta.json is not a NonTensorStack's",
        )),
    }
}
