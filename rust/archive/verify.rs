//! Operations on a whole archive: is a file one, what is wrong with it (structure, tree,
//! every CRC), and the checksum refresh after in-place writes.

use std::path::Path;

use crate::error::{Error, Result};
use crate::format;
use crate::sys::storage::{self, MapMode};

use super::checksum;
use super::read::walk;
use super::zip::{bad, crc32, get32, Archive, ZipEntry, DESCRIPTOR_SIG, FLAG_DESCRIPTOR, STORED};

/// True when `path` is a regular file holding a valid zip with a top-level `meta.json`.
pub fn is_archive(path: &Path) -> bool {
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return false;
    }
    Archive::open(path, MapMode::ReadOnly).is_ok_and(|ar| ar.entry(format::META_FILE).is_some())
}

/// Recomputes the CRC-32 of every STORED entry after in-place writes and patches the local
/// headers (or data descriptors) and the central directory. Returns the entries changed.
pub fn refresh_checksums(path: &Path, num_threads: usize) -> Result<Vec<String>> {
    let ar = Archive::open(path, MapMode::ReadOnly)?;
    if ar.entry(format::META_FILE).is_none() {
        return Err(bad(&ar.path, "not a tensordict archive: no top-level meta.json"));
    }
    let stored: Vec<usize> = (0..ar.entries.len())
        .filter(|&i| ar.entries[i].method == STORED)
        .collect();
    let lens: Vec<usize> = stored.iter().map(|&i| ar.entries[i].csize as usize).collect();
    let crcs = checksum::crc32_ranges(&lens, num_threads, |k, range| {
        ar.raw_crc_range(&ar.entries[stored[k]], range)
    })?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&ar.path)
        .map_err(|e| Error::io(&ar.path, e))?;
    let mut changed = Vec::new();
    for (&i, crc) in stored.iter().zip(crcs) {
        let e = &ar.entries[i];
        if crc == e.crc {
            continue;
        }
        let bytes = crc.to_le_bytes();
        let local = if e.flags & FLAG_DESCRIPTOR == 0 {
            e.header + 14
        } else {
            let after = e.data + e.csize;
            let sig = ar.read_at(after, 4).ok();
            if sig.as_deref().and_then(|b| get32(b, 0)) == Some(DESCRIPTOR_SIG) {
                after + 4
            } else {
                after
            }
        };
        storage::write_all_at(&file, &bytes, local).map_err(|err| Error::io(&ar.path, err))?;
        storage::write_all_at(&file, &bytes, e.central + 16).map_err(|err| Error::io(&ar.path, err))?;
        changed.push(e.name.clone());
    }
    Ok(changed)
}

/// Every problem of the archive at `path` (empty: it loads, and every CRC matches).
pub fn verify_archive(path: &Path) -> Vec<String> {
    let ar = match Archive::open(path, MapMode::ReadOnly) {
        Ok(ar) => ar,
        Err(e) => return vec![e.to_string()],
    };
    let mut jobs = Vec::new();
    let mut problems = Vec::new();
    if let Err(e) = walk(&ar, &mut Default::default(), "", 0, &mut jobs) {
        problems.push(e.to_string());
    }
    // The STORED entries' CRCs at once, big ones in ranges across the threads.
    let stored: Vec<&ZipEntry> = ar.entries.iter().filter(|e| e.method == STORED).collect();
    let lens: Vec<usize> = stored.iter().map(|e| e.csize as usize).collect();
    let mut stored_crcs =
        match checksum::crc32_ranges(&lens, 0, |k, range| ar.raw_crc_range(stored[k], range)) {
            Ok(crcs) => crcs.into_iter(),
            Err(e) => {
                problems.push(e.to_string());
                return problems;
            }
        };
    for e in &ar.entries {
        let ok = match e.method {
            STORED => stored_crcs.next() == Some(e.crc),
            _ => match ar.inflate(e) {
                Ok(data) => crc32(&data) == e.crc,
                Err(err) => {
                    problems.push(err.to_string());
                    continue;
                }
            },
        };
        if !ok {
            problems.push(format!(
                "entry {:?} fails its CRC-32 check ('{}'); after in-place writes, refresh_archive_checksums updates it",
                e.name,
                ar.path.display()
            ));
        }
    }
    problems
}
