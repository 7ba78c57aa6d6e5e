//! One leaf's files, for loads and checks: the file name of a key (encoded or legacy), a
//! nested leaf's table of component shapes, the data file opened without following a symlink,
//! checked against its shape and mapped; single files (`open_file`). No pyo3 here.

use std::io;
use std::path::Path;

use super::LoadedNested;
use crate::error::{Error, Result};
use crate::format::{self, Layout, LeafMeta};
use crate::sys::dir::{self, Dir, EntryKind};
use crate::sys::identity;
use crate::sys::storage::{self, MapMode, Region};

/// A leaf file to open and map, found while walking.
pub(super) struct LeafJob {
    pub(super) name: String,
    /// The leaf's key (None: a single file, see `open_file`), for messages only.
    pub(super) key: Option<String>,
    pub(super) nbytes: usize,
    /// The file must hold exactly `nbytes` (a nested leaf's data: a longer file means the
    /// table of component shapes does not describe it).
    pub(super) exact: bool,
}

impl LeafJob {
    /// How messages name the leaf, e.g. `key "obs"` (made only when a message is).
    fn label(&self) -> String {
        match &self.key {
            Some(key) => format!("key {key:?}"),
            None => "this tensor".into(),
        }
    }
}

/// The file name of a leaf: the encoded key, or the raw legacy name when only that exists.
pub(super) fn leaf_name(dir: &Dir, key: &str) -> Result<String> {
    let encoded = format::leaf_file(key);
    if let Some(raw) = format::legacy_name(key) {
        // (most keys encode to themselves: then there is no other name to look for)
        if encoded.strip_suffix(format::LEAF_SUFFIX) == Some(raw) {
            return Ok(encoded);
        }
        let legacy = format!("{raw}{}", format::LEAF_SUFFIX);
        if dir
            .kind(&encoded)
            .map_err(|e| Error::io(dir.child_path(&encoded), e))?
            == EntryKind::Missing
            && dir
                .kind(&legacy)
                .map_err(|e| Error::io(dir.child_path(&legacy), e))?
                != EntryKind::Missing
        {
            return Ok(legacy);
        }
    }
    Ok(encoded)
}

/// Parses a nested leaf's table of component shapes (`bytes`, int64 little-endian) and checks
/// it against the entry (`leaf`) and the batch size: its size exactly, no negative size, the
/// components' leading dims equal to the batch dims after the first. Returns the loaded
/// nested description and the data's exact size. `what` names the file in messages.
pub fn check_nested_table(
    bytes: &[u8],
    key: &str,
    leaf: &LeafMeta,
    batch: &[u64],
    path: &Path,
) -> Result<(LoadedNested, usize)> {
    let nested = leaf.nested.expect("a nested leaf");
    let want = nested.table_bytes().ok_or_else(|| {
        Error::invalid(
            path,
            format!("key {key:?}: the table of component shapes overflows"),
        )
    })?;
    if bytes.len() != want {
        return Err(Error::invalid(
            path,
            format!(
                "the table of component shapes of key {key:?} holds {} bytes; its entry ({} components of {} dims) needs {want}",
                bytes.len(),
                nested.components,
                nested.dims
            ),
        ));
    }
    let sizes: Vec<i64> = bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let tail = batch.get(1..).unwrap_or(&[]);
    let nbytes = format::nested_nbytes(&sizes, nested.dims as usize, leaf.dtype.itemsize, tail)
        .map_err(|why| Error::invalid(path, format!("key {key:?}: {why}")))?;
    if nested.layout == Layout::Jagged {
        // a jagged tensor is ragged in its first dim only: the others are one size for all
        let dims = nested.dims as usize;
        let mut rows = sizes.chunks_exact(dims.max(1));
        if let Some(first) = rows.next() {
            if let Some(i) = rows.position(|row| row[1..] != first[1..]) {
                return Err(Error::invalid(
                    path,
                    format!(
                        "key {key:?}: a jagged leaf's components differ after their first dim (component {} is {:?}, component 0 {first:?})",
                        i + 1,
                        &sizes[(i + 1) * dims..(i + 2) * dims]
                    ),
                ));
            }
        }
    }
    Ok((
        LoadedNested {
            sizes,
            dims: nested.dims,
            layout: nested.layout,
        },
        nbytes,
    ))
}

/// Reads and checks the table of component shapes of the nested leaf `key` in `dir`.
pub fn read_nested_table(
    dir: &Dir,
    key: &str,
    leaf: &LeafMeta,
    batch: &[u64],
) -> Result<(LoadedNested, usize)> {
    let name = leaf_name(dir, key)?;
    read_nested(dir, key, &name, leaf, batch)
}

/// Reads and checks a nested leaf's table of component shapes from `dir`.
pub(super) fn read_nested(
    dir: &Dir,
    key: &str,
    name: &str,
    leaf: &LeafMeta,
    batch: &[u64],
) -> Result<(LoadedNested, usize)> {
    let table = format::shape_file(name);
    let path = dir.child_path(&table);
    let want = leaf.nested.and_then(|n| n.table_bytes()).ok_or_else(|| {
        Error::invalid(
            &path,
            format!("key {key:?}: the table of component shapes overflows"),
        )
    })?;
    // one byte more than needed: a longer file is refused, not cut
    let bytes = dir.read_limited(&table, want as u64 + 1).map_err(|e| match e {
        e if dir::is_symlink_refused(&e) => Error::symlink(
            &path,
            format!("the table of component shapes of key {key:?} is a symlink; refusing to follow it"),
        ),
        e if e.kind() == io::ErrorKind::NotFound => Error::invalid(
            &path,
            format!("the table of component shapes of key {key:?} is missing"),
        ),
        e if e.kind() == io::ErrorKind::InvalidData => Error::invalid(
            &path,
            format!("the table of component shapes of key {key:?} is longer than its entry says ({e})"),
        ),
        e if dir::is_not_regular(&e) => Error::invalid(
            &path,
            format!("the table of component shapes of key {key:?} is {e}"),
        ),
        e => Error::io(&path, e),
    })?;
    check_nested_table(&bytes, key, leaf, batch, &path)
}

/// Opens a leaf file (never blocking), checks it is a regular file long enough for its shape.
/// `path` is the file's path (`dir.child_path(&job.name)`), for messages.
pub(super) fn check_leaf(
    dir: &Dir,
    job: &LeafJob,
    path: &Path,
) -> Result<(std::fs::File, bool, std::fs::Metadata)> {
    let (file, writable) = dir.open_file(&job.name).map_err(|e| match e {
        e if dir::is_symlink_refused(&e) => Error::symlink(
            path,
            format!(
                "the data file of {} is a symlink; refusing to follow it",
                job.label()
            ),
        ),
        e if e.kind() == io::ErrorKind::NotFound => {
            Error::invalid(path, format!("the data file of {} is missing", job.label()))
        }
        e if dir::is_not_regular(&e) => Error::invalid(path, format!("the data of {} is {e}", job.label())),
        e => Error::io(path, e),
    })?;
    let md = file.metadata().map_err(|e| Error::io(path, e))?;
    if job.exact && md.len() != job.nbytes as u64 {
        return Err(Error::invalid(
            path,
            format!(
                "the data file of {} holds {} bytes; its components need exactly {}",
                job.label(),
                md.len(),
                job.nbytes
            ),
        ));
    }
    if md.len() < job.nbytes as u64 {
        return Err(Error::invalid(
            path,
            format!(
                "the data file of {} is truncated: {} bytes, its shape needs {}",
                job.label(),
                md.len(),
                job.nbytes
            ),
        ));
    }
    Ok((file, writable, md))
}

/// Maps a checked leaf file: writable files shared (their space reserved first, so a full
/// disk is ENOSPC now and not SIGBUS on a later write), read-only files copy-on-write.
/// A file whose blocks already cover `nbytes` has nothing to reserve (the common case: files
/// written by a save), which spares a fallocate per leaf.
fn map_checked(
    file: &std::fs::File,
    writable: bool,
    md: &std::fs::Metadata,
    nbytes: usize,
    path: &Path,
) -> Result<Region> {
    let mode = if writable {
        if !storage::fully_allocated(md, nbytes) {
            storage::reserve_existing(file, nbytes).map_err(|e| Error::io(path, e))?;
        }
        MapMode::Shared
    } else {
        MapMode::CopyOnWrite
    };
    storage::map_file_as(
        file,
        nbytes,
        Some(path.to_path_buf()),
        mode,
        identity::of_metadata(md),
    )
    .map_err(|e| Error::io(path, e))
}

pub(super) fn map_leaf(dir: &Dir, job: &LeafJob) -> Result<Option<Region>> {
    if job.nbytes == 0 {
        return Ok(None);
    }
    let path = dir.child_path(&job.name);
    let (file, writable, md) = check_leaf(dir, job, &path)?;
    map_checked(&file, writable, &md, job.nbytes, &path).map(Some)
}

/// Opens and maps one existing data file of at least `nbytes` bytes (read-only files, and
/// every file with `private`, are mapped copy-on-write: writes stay in this process). The last
/// path component must not be a symlink.
pub fn open_file(path: &Path, nbytes: usize, private: bool) -> Result<Region> {
    let (dir, name) = split_file_path(path)?;
    let job = LeafJob {
        name,
        key: None,
        nbytes,
        exact: false,
    };
    let path = dir.child_path(&job.name);
    let (file, writable, md) = check_leaf(&dir, &job, &path)?;
    map_checked(&file, writable && !private, &md, nbytes, &path)
}

/// The open parent directory of a file path and the file's name.
pub fn split_file_path(path: &Path) -> Result<(Dir, String)> {
    let absolute = std::path::absolute(path).map_err(|e| Error::io(path, e))?;
    let name = absolute
        .file_name()
        .ok_or_else(|| Error::tree(&absolute, "not a file name"))?
        .to_string_lossy()
        .into_owned();
    let parent = absolute.parent().unwrap_or(Path::new("/"));
    let dir = Dir::open(parent).map_err(|e| Error::io(parent, e))?;
    Ok((dir, name))
}
