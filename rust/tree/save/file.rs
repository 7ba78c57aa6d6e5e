//! Single data files written atomically (`MemoryMappedTensor.from_tensor(filename=)`). No pyo3.

use std::path::Path;

use super::already_exists;
use crate::error::{Error, Result};
use crate::sys::dir::{Dir, EntryKind};
use crate::sys::reclaim::Later;
use crate::sys::storage::{self, MapMode, Region};
use crate::tree::commit;

/// Writes one data file and maps it, atomically: the file is filled unnamed (`O_TMPFILE`
/// where the file system has it) and only then linked at its name, so a process killed
/// meanwhile leaves nothing behind. An existing file is replaced only with `existsok`; maps
/// of the old file keep their values.
pub fn write_file(path: &Path, data: Option<&[u8]>, nbytes: usize, existsok: bool) -> Result<Region> {
    let (dir, name) = crate::tree::load::split_file_path(path)?;
    let final_path = dir.child_path(&name);
    let replace = match dir.kind(&name).map_err(|e| Error::io(&final_path, e))? {
        EntryKind::Missing => false,
        EntryKind::Symlink => {
            return Err(Error::symlink(
                &final_path,
                "refusing to write a memory-mapped tensor through symlink",
            ))
        }
        EntryKind::File if existsok => true,
        EntryKind::File => return Err(Error::io(&final_path, already_exists())),
        _ => return Err(Error::tree(&final_path, "not a regular file")),
    };
    let io_err = |e| Error::io(&final_path, e);
    let temp = format!("{}{}", commit::TEMP_PREFIX, storage::random_suffix());
    let (file, named) = match dir.create_unnamed().map_err(io_err)? {
        Some(file) => (file, false),
        None => (dir.create_file(&temp).map_err(io_err)?, true),
    };
    let result = (|| {
        storage::fill_file(&file, data, nbytes).map_err(io_err)?;
        let region =
            storage::map_file(&file, nbytes, Some(final_path.clone()), MapMode::Shared).map_err(io_err)?;
        if !named {
            let link_as = if replace { temp.as_str() } else { name.as_str() };
            dir.link_unnamed(&file, link_as).map_err(io_err)?;
        }
        if replace || named {
            if replace {
                replace_file(&dir, &temp, &name).map_err(io_err)?;
            } else {
                // exclusive: a file created at the name meanwhile is not replaced
                #[cfg(windows)] // (a mapped file cannot be deleted there, but renamed)
                dir.rename(&temp, &dir, &name, true).map_err(io_err)?;
                #[cfg(not(windows))]
                {
                    dir.link(&temp, &dir, &name).map_err(io_err)?;
                    let _ = dir.remove_file(&temp);
                }
            }
        }
        Ok(region)
    })();
    if result.is_err() && (named || replace) {
        let _ = dir.remove_file(&temp);
    }
    result
}

/// Puts `temp` in place of the existing file `name`: exchanged with it where the file system
/// can (then the old file, now at `temp`, is unlinked and its space freed in the background,
/// see `sys::reclaim`), else renamed over it (the old file still freed in the background).
fn replace_file(dir: &Dir, temp: &str, name: &str) -> std::io::Result<()> {
    let mut later = Later::new();
    let old_size = dir.stat(name)?.map_or(0, |st| st.size);
    match dir.exchange(temp, dir, name) {
        Ok(()) => {
            // The new file is in place; an old one that cannot go stays under its temporary
            // name (`.tdrs%tmp-...`), as a failed link would leave it.
            let _ = later.remove_file(dir, temp, old_size);
            Ok(())
        }
        Err(_) => {
            later.keep(dir, name, old_size);
            dir.rename(temp, dir, name, false)
        }
    }
}
