//! What the target directory of a save holds, read leniently: the names the old tree owns, whether
//! a meta.json is a tensordict's, what is in the way; and the removal steps for what the new tree
//! drops. No pyo3.

use std::collections::HashSet;
use std::io;
use std::path::Path;

use serde_json::Value;

use super::{with, Plan};
use crate::error::{Error, Result};
use crate::format;
use crate::sys::dir::{Dir, EntryKind, EntryStat};
use crate::sys::identity::Stamp;
use crate::tree::commit::{DirState, FileState, Op};
use crate::tree::read::{read_meta_bytes, value_header};

/// The names a directory of the old tree owns, from its meta.json (read leniently: a damaged
/// old tree still tells what is its own).
#[derive(Default)]
pub(super) struct OldDir {
    files: Vec<String>,
    dirs: Vec<String>,
    /// Its meta.json as read (for the journal: a replay checks it is still this one).
    pub(super) meta: Option<FileState>,
}

impl OldDir {
    pub(super) fn read(dir: &Dir) -> OldDir {
        let mut old = OldDir::default();
        let Ok((bytes, stamp)) = read_meta(dir) else {
            return old;
        };
        old.meta = Some(FileState::of(stamp, &bytes));
        if bytes.len() as u64 > format::META_LIMIT {
            return old; // a value directory's: it owns nothing but itself
        }
        let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(&bytes) else {
            return old;
        };
        if map
            .get("_type")
            .and_then(Value::as_str)
            .is_some_and(format::meta::is_user_class)
        {
            old.dirs.push(format::TENSORCLASS_DIR.to_string()); // a tensorclass's fields
        }
        for (key, value) in map {
            if let Value::Object(entry) = value {
                if entry.contains_key("type") {
                    old.dirs.push(format::encode_key(&key));
                } else if entry.contains_key("dtype") || entry.contains_key("shape") {
                    let file = format::leaf_file(&key);
                    if entry.get("is_nested") == Some(&Value::Bool(true)) {
                        old.files.push(format::shape_file(&file));
                    }
                    old.files.push(file);
                }
            }
        }
        old
    }

    pub(super) fn owns_file(&self, name: &str) -> bool {
        self.files.iter().any(|n| n == name)
    }
}

/// True when `dir/meta.json` is absent or a tensordict meta.json (ours to replace); with its
/// state when there is one.
pub(super) fn meta_is_ours(dir: &Dir) -> Result<(bool, Option<FileState>)> {
    let path = dir.child_path(format::META_FILE);
    match dir.stat(format::META_FILE).map_err(|e| Error::io(&path, e))? {
        None => Ok((true, None)),
        Some(st) if st.kind == EntryKind::File => {
            // only a value directory's meta.json is this large: its first bytes say so (not
            // parsed here)
            let big = st.size > format::META_LIMIT;
            if big && !value_header(dir) {
                return Ok((false, None));
            }
            let Ok((bytes, stamp)) = read_meta(dir) else {
                return Ok((false, None));
            };
            let ours = big
                || matches!(
                    serde_json::from_slice::<Value>(&bytes),
                    Ok(Value::Object(map)) if map.contains_key("_type") || map.contains_key("shape")
                );
            Ok((ours, Some(FileState::of(stamp, &bytes))))
        }
        Some(_) => Ok((false, None)),
    }
}

/// `dir/meta.json` with its stamp (`tree::read::read_meta_bytes`: up to `META_LIMIT`, a value
/// directory's up to `VALUE_META_LIMIT`).
fn read_meta(dir: &Dir) -> io::Result<(Vec<u8>, Stamp)> {
    read_meta_bytes(dir)
}

/// Whether a sub-directory the new tree needs is there: missing is fine, a directory is kept,
/// anything else is in the way.
pub(super) fn dir_present(at: &Path, name: &str, st: Option<EntryStat>) -> Result<bool> {
    match st {
        None => Ok(false),
        Some(st) if st.kind == EntryKind::Dir => Ok(true),
        Some(st) => Err(foreign(&at.join(name), kind_name(st.kind))),
    }
}

pub(super) fn foreign(path: &Path, what: &str) -> Error {
    Error::io(
        path,
        io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{what} that the saved tree does not own is in the way; refusing to replace it (move it away first)"),
        ),
    )
}

pub(super) fn kind_name(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::File => "a file",
        EntryKind::Dir => "a directory",
        EntryKind::Symlink => "a symlink",
        _ => "a special file",
    }
}

impl Plan {
    /// Removal steps for what the old tree owned in `dir` and the new one no longer has:
    /// files (only if still the same file when the step runs) and sub-directories (their
    /// owned contents, then the directory if nothing foreign is left in it).
    pub(super) fn plan_removals(
        &mut self,
        dir: &Dir,
        rel: &[String],
        old: &OldDir,
        keep: &HashSet<String>,
        depth: usize,
    ) -> Result<()> {
        for name in old.files.iter().filter(|n| !keep.contains(*n)) {
            if let Ok(Some(st)) = dir.stat(name) {
                if st.kind == EntryKind::File {
                    self.removals.push(Op::Unlink {
                        path: with(rel, name),
                        dev: st.dev,
                        ino: st.ino,
                    });
                }
            }
        }
        if depth >= format::MAX_DEPTH {
            return Ok(());
        }
        for name in old.dirs.iter().filter(|n| !keep.contains(*n)) {
            if dir.kind(name).ok() != Some(EntryKind::Dir) {
                continue;
            }
            let Ok(sub) = dir.open_dir(name) else { continue };
            let sub_rel = with(rel, name);
            let sub_old = OldDir::read(&sub);
            self.dir_states.push(DirState {
                path: sub_rel.clone(),
                old: sub_old.meta,
                new: None,
            });
            self.plan_removals(&sub, &sub_rel, &sub_old, &HashSet::new(), depth + 1)?;
            if let Ok(Some(st)) = sub.stat(format::META_FILE) {
                if st.kind == EntryKind::File {
                    self.removals.push(Op::Unlink {
                        path: with(&sub_rel, format::META_FILE),
                        dev: st.dev,
                        ino: st.ino,
                    });
                }
            }
            self.removals.push(Op::Rmdir { path: sub_rel });
        }
        Ok(())
    }
}
