//! Reopening an archive for pickled leaves: one map per archive and process, refused when the
//! file at the path is no longer the archive the leaf came from.

use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result};
use crate::sys::identity::{self, FileId};
use crate::sys::storage::{self, MapMode, Region};

use super::zip::bad;

/// Maps of archives opened to rebuild pickled leaves, shared by every leaf of one archive.
/// (device, inode, shared) of an archive, and its map while any leaf still uses it.
type Reopened = Vec<((u64, u64, bool), Weak<Region>)>;
static REOPENED: Mutex<Reopened> = Mutex::new(Vec::new());

/// The map of the archive at `path` for a pickled leaf: `identity` must still be the file's
/// (the archive was not replaced since), and `offset + nbytes` must lie inside it. One map is
/// shared by all the leaves of an archive in a process.
pub fn reopen(
    path: &Path,
    identity: FileId,
    offset: usize,
    nbytes: usize,
    shared: bool,
) -> Result<Arc<Region>> {
    let key = (identity.0, identity.1, shared);
    let mut cache = REOPENED.lock().unwrap_or_else(|e| e.into_inner());
    cache.retain(|(_, w)| w.strong_count() > 0);
    let found = cache
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, w)| w.upgrade());
    let region = match found {
        Some(r) if r.path() == Some(path) => r,
        _ => {
            let mode = if shared {
                MapMode::Shared
            } else {
                MapMode::CopyOnWrite
            };
            let file = match mode {
                MapMode::Shared => std::fs::OpenOptions::new().read(true).write(true).open(path),
                _ => File::open(path),
            }
            .map_err(|e| Error::io(path, e))?;
            if identity::of_file(&file).map_err(|e| Error::io(path, e))? != identity {
                return Err(bad(
                    path,
                    "the archive was replaced since this tensor was pickled",
                ));
            }
            let len = file.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
            let region = Arc::new(
                storage::map_file(&file, len, Some(path.to_path_buf()), mode)
                    .map_err(|e| Error::io(path, e))?
                    .as_archive(identity),
            );
            cache.push((key, Arc::downgrade(&region)));
            region
        }
    };
    if offset.checked_add(nbytes).is_none_or(|end| end > region.len()) {
        return Err(bad(
            path,
            format!("{nbytes} bytes at offset {offset} lie outside the archive"),
        ));
    }
    Ok(region)
}
