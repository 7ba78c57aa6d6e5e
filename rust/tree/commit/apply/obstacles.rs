//! What a commit does about a step that meets something it does not own at a name it creates
//! (see `apply.rs`'s module doc): keep another save's tree as the key, merge into a plain
//! directory, or leave the key out, with the journal amended. No pyo3 here.

use std::io;
use std::path::PathBuf;

use serde_json::Value;

use super::prove::unprovable;
use super::{abandon, gone, identity, Finished, Outcome, StageDir};
use crate::error::{Error, Result};
use crate::format::{self, NodeMeta};
use crate::sys::dir::{Dir, EntryKind};
use crate::sys::identity::Stamp;
use crate::tree::commit::{join, FileState, Journal, Op, JOURNAL, JOURNAL_DRAFT};

/// The path of the key a step stores: a leaf's file, a sub-tree's or NonTensorData's
/// directory (for a meta.json step, its directory).
fn key_path(op: &Op) -> &[String] {
    match op {
        Op::Rename { to, .. } if to.last().is_some_and(|n| n == format::META_FILE) => &to[..to.len() - 1],
        Op::Rename { to, .. } | Op::Merge { to, .. } => to,
        Op::Mkdir { path } | Op::Unlink { path, .. } | Op::Rmdir { path } => path,
        Op::Aside { .. } => &[],
    }
}

/// What took a new sub-tree's name.
enum Taker {
    /// A tree (tensordict or NonTensorData meta.json) that fits under its parent: another
    /// save's, to keep as the key.
    Tree,
    /// A directory without meta.json: it receives the sub-tree's entries.
    Directory,
    Other,
}

fn classify_taker(root: &Dir, to: &[String], parent_batch: Option<&[u64]>) -> Taker {
    let Ok(dir) = root.open_rel(to) else {
        return Taker::Other; // a file, a symlink, something else
    };
    match dir.stat(format::META_FILE) {
        Ok(None) => Taker::Directory,
        Ok(Some(st)) if st.kind == EntryKind::File => {
            let path = dir.child_path(format::META_FILE);
            let parsed = dir
                .read_limited(format::META_FILE, format::META_LIMIT)
                .ok()
                .and_then(|bytes| format::parse_meta(&bytes, &path).ok());
            match (parsed, parent_batch) {
                (Some(NodeMeta::NonTensor(_)), _) => Taker::Tree,
                (Some(NodeMeta::TensorDict(m)), Some(batch)) if m.batch.starts_with(batch) => Taker::Tree,
                _ => Taker::Other,
            }
        }
        _ => Taker::Other,
    }
}

/// The staged meta.json of the directory `dir` (its step's index, staging, staged name).
fn staged_meta(journal: &Journal, dir: &[String]) -> Option<(usize, usize, String)> {
    journal.ops.iter().enumerate().find_map(|(m, op)| match op {
        Op::Rename { stage, name, to, .. }
            if to.len() == dir.len() + 1 && to.starts_with(dir) && is_meta(to) =>
        {
            Some((m, *stage, name.clone()))
        }
        _ => None,
    })
}

fn is_meta(to: &[String]) -> bool {
    to.last().is_some_and(|n| n == format::META_FILE)
}

fn read_staged_meta(
    stagings: &[StageDir<'_>],
    stage: usize,
    name: &str,
) -> Result<serde_json::Map<String, Value>> {
    let dir = stagings[stage]
        .get()
        .ok_or_else(|| Error::invalid(PathBuf::from(name), "the staging directory is gone"))?;
    let path = dir.child_path(name);
    let bytes = dir
        .read_limited(name, format::META_LIMIT)
        .map_err(|e| Error::io(&path, e))?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(Error::invalid(&path, "a staged meta.json is damaged")),
    }
}

/// Decides what to do about the step `i` whose name is taken. None: the taker is kept as
/// the key and the other steps go on; Some: the journal was amended (or the commit ended).
pub(super) fn resolve(
    root: &Dir,
    journal: &mut Journal,
    stagings: &[StageDir<'_>],
    i: usize,
    durable: bool,
) -> Result<Option<Outcome>> {
    let op = journal.ops[i].clone();
    if let Op::Rename { stage, name, to, .. } = &op {
        if name.starts_with('d') {
            let parent = &to[..to.len() - 1];
            let batch = staged_meta(journal, parent)
                .and_then(|(_, s, n)| read_staged_meta(stagings, s, &n).ok())
                .and_then(|m| {
                    m.get("shape")?
                        .as_array()?
                        .iter()
                        .map(Value::as_u64)
                        .collect::<Option<Vec<u64>>>()
                });
            match classify_taker(root, to, batch.as_deref()) {
                Taker::Tree => return Ok(None),
                Taker::Directory => {
                    let holder = stagings[*stage]
                        .get()
                        .ok_or_else(|| unprovable(root, stagings, *stage, name, to))?;
                    let from = holder
                        .open_dir(name)
                        .map_err(|e| Error::io(holder.child_path(name), e))?;
                    let mut children = Vec::new();
                    for child in from.entry_names().map_err(|e| Error::io(from.path(), e))? {
                        if let Ok(Some(st)) = from.stat(&child) {
                            children.push((child, st.dev, st.ino));
                        }
                    }
                    // meta.json last: the directory is a tree only once all of it is in
                    children.sort_by_key(|(c, _, _)| c == format::META_FILE);
                    journal.ops[i] = Op::Merge {
                        stage: *stage,
                        name: name.clone(),
                        to: to.clone(),
                        children,
                    };
                    rewrite_journal(root, journal, stagings, durable)?;
                    return Ok(Some(Outcome::Amended));
                }
                Taker::Other => {}
            }
        }
    }
    if let Op::Merge {
        stage,
        name,
        to,
        children,
    } = &op
    {
        undo_merge(root, stagings, *stage, name, to, children)?;
    }
    let key = key_path(&op).to_vec();
    if key.is_empty() {
        // the root itself cannot be left out
        abandon(root, journal, stagings);
        return Ok(Some(Outcome::Finished(Finished::Superseded)));
    }
    drop_key(root, journal, stagings, &key, durable)?;
    Ok(Some(Outcome::Amended))
}

/// Moves back into the staged directory the entries a merge moved (their identity tells).
fn undo_merge(
    root: &Dir,
    stagings: &[StageDir<'_>],
    stage: usize,
    name: &str,
    to: &[String],
    children: &[(String, u64, u64)],
) -> Result<()> {
    let (Some(holder), Ok(target)) = (stagings[stage].get(), root.open_rel(to)) else {
        return Ok(());
    };
    let from = holder
        .open_dir(name)
        .map_err(|e| Error::io(holder.child_path(name), e))?;
    for (child, dev, ino) in children {
        if target
            .stat(child)
            .ok()
            .flatten()
            .is_some_and(|st| identity(&st) == (*dev, *ino))
        {
            target
                .rename(child, &from, child, true)
                .map_err(|e| Error::io(target.child_path(child), e))?;
        }
    }
    Ok(())
}

/// Leaves the key stored at `key` out of the new tree: its parent's staged meta.json is
/// rewritten without it (a new staged file), the key's steps go, and the amended journal
/// replaces the old one.
fn drop_key(
    root: &Dir,
    journal: &mut Journal,
    stagings: &[StageDir<'_>],
    key: &[String],
    durable: bool,
) -> Result<()> {
    let (parent, name) = (&key[..key.len() - 1], &key[key.len() - 1]);
    let key_at = join(root.path(), key);
    let (m, stage, staged) = staged_meta(journal, parent)
        .ok_or_else(|| Error::invalid(&key_at, "the commit has no meta.json step for this directory"))?;
    let mut map = read_staged_meta(stagings, stage, &staged)?;
    // A key's names: a sub-tree's or value's directory; a leaf's file and, for a nested leaf,
    // its table of shapes beside it.
    let names_of = |k: &str, v: &Value| -> Vec<String> {
        let leaf = v.as_object().is_some_and(|e| !e.contains_key("type"));
        if !leaf {
            return vec![format::encode_key(k)];
        }
        let file = format::leaf_file(k);
        let nested = v.get("is_nested") == Some(&Value::Bool(true));
        let mut names = vec![file.clone()];
        if nested {
            names.push(format::shape_file(&file));
        }
        names
    };
    let (entry, names) = map
        .iter()
        .map(|(k, v)| (k, names_of(k, v)))
        .find(|(_, names)| names.iter().any(|n| n == name))
        .map(|(k, names)| (k.clone(), names))
        .ok_or_else(|| Error::invalid(&key_at, "no key of the new tree is stored under this name"))?;
    map.shift_remove(&entry);
    let paths: Vec<Vec<String>> = names
        .iter()
        .map(|n| {
            let mut p = parent.to_vec();
            p.push(n.clone());
            p
        })
        .collect();
    let of_key = |p: &[String]| p.starts_with(key) || paths.iter().any(|k| p.starts_with(k));
    let bytes = format::to_json_bytes(&Value::Object(map));
    let dir = stagings[stage].get().expect("read above");
    let amended = format!("a{}", journal.dropped.len());
    let io_err = |e| Error::io(dir.child_path(&amended), e);
    match dir.remove_file(&amended) {
        Err(e) if !gone(&e) => return Err(io_err(e)),
        _ => {}
    }
    dir.write_new(&amended, &bytes, durable).map_err(io_err)?;
    let st = dir
        .stat(&amended)
        .map_err(io_err)?
        .ok_or_else(|| io_err(io::ErrorKind::NotFound.into()))?;
    let state = FileState::of(Stamp::from(st), &bytes);
    if let Op::Rename { name, id, .. } = &mut journal.ops[m] {
        *name = amended.clone();
        *id = Some(state.identity());
    }
    if let Some(ds) = journal.dirs.iter_mut().find(|d| d.path == parent) {
        ds.new = Some(state);
    }
    // the key's own steps go (removals of the old tree's files stay: they check identities)
    journal.ops.retain(|op| match op {
        Op::Rename { to, .. } | Op::Merge { to, .. } => !of_key(to),
        Op::Mkdir { path } => !of_key(path),
        _ => true,
    });
    journal.dirs.retain(|d| !of_key(&d.path));
    journal.dropped.push(key.to_vec());
    rewrite_journal(root, journal, stagings, durable)
}

/// Writes the amended journal into staging directory 0 and renames it over the journal in
/// place (atomic: a kill leaves one or the other, each replayable).
fn rewrite_journal(root: &Dir, journal: &Journal, stagings: &[StageDir<'_>], durable: bool) -> Result<()> {
    let path = root.child_path(JOURNAL);
    let bytes = serde_json::to_vec(journal).map_err(|e| Error::tree(&path, e.to_string()))?;
    let draft = stagings
        .first()
        .and_then(StageDir::get)
        .ok_or_else(|| Error::invalid(&path, "the root staging directory is gone"))?;
    match draft.remove_file(JOURNAL_DRAFT) {
        Err(e) if !gone(&e) => return Err(Error::io(&path, e)),
        _ => {}
    }
    draft
        .write_new(JOURNAL_DRAFT, &bytes, durable)
        .map_err(|e| Error::io(&path, e))?;
    draft
        .rename(JOURNAL_DRAFT, root, JOURNAL, false)
        .map_err(|e| Error::io(&path, e))?;
    if durable {
        root.sync().map_err(|e| Error::io(root.path(), e))?;
    }
    Ok(())
}
