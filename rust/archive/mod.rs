//! Owns: `.tdz` archives: the zip format, reading, writing, staging files, whole-archive checks.
//! Uses: `error`, `sys`, `format`, `tree`.
//!
//! `.tdz` archives: tensordict's one-file form of a saved tree. No pyo3 here.
//!
//! An archive is a zip file whose entries are the files of the directory form, in the order
//! tensordict writes them (at each level `meta.json`, then the leaf files sorted by name, then
//! the sub-directories sorted by name). Leaf payloads are STORED and start on a 64-byte
//! boundary, padded by an extra block (id `0x6474`, "td") in the local header, followed by the
//! zip64 block that Python's `zipfile` writes with `force_zip64=True`. A whole tree is written
//! in one pass into a file beside the target, then renamed over it, so a crash leaves the old
//! archive or the new one. Reading maps the whole file once; every aligned STORED leaf is a
//! view of that map; compressed (deflate) or unaligned leaves are copied, with bounded sizes.
//!
//! The reader is a validator: end of central directory, zip64 records, every central record
//! and local header, names that could escape (`..`, absolute, backslashes, NUL), sizes and
//! offsets inside the file, overlapping entries, and the CRC-32 of every meta.json and every
//! compressed entry. The CRCs of STORED leaves are not checked on load, as in tensordict:
//! in-place writes through a shared map (`mode="r+"`, `memmap_like`) leave them stale until
//! `refresh_checksums`; `verify` reports them.
//!
//! The work is split by responsibility: `archive_zip` parses and validates the zip structures,
//! `archive_tree` builds the tree and the leaves from the entries, `archive_write` writes.
//! This module holds the format's constants, the shared types, and the operations on a whole
//! archive (checks, checksum refresh, reopening for pickled leaves).

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result};
use crate::format;
use crate::sys::identity::{self, FileId};
use crate::sys::parallel;
use crate::sys::storage::{self, MapMode, Region};

use crate::archive::read::walk;
pub use crate::archive::read::{load_archive, load_archive_tree};
pub use crate::archive::write::write_archive;
use crate::archive::zip::bad;
pub use crate::archive::zip::{Archive, ZipEntry};

pub mod read;
pub mod staging;
pub mod write;
pub mod zip;

/// Payload alignment of STORED leaves (a multiple of every itemsize; torch.save's default).
pub const ALIGNMENT: u64 = 64;
pub(crate) const PAD_EXTRA_ID: u16 = 0x6474;
pub(crate) const ZIP64_EXTRA_ID: u16 = 0x0001;
pub(crate) const LOCAL_SIG: u32 = 0x0403_4b50;
pub(crate) const CENTRAL_SIG: u32 = 0x0201_4b50;
pub(crate) const EOCD_SIG: u32 = 0x0605_4b50;
pub(crate) const ZIP64_EOCD_SIG: u32 = 0x0606_4b50;
pub(crate) const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
pub(crate) const DESCRIPTOR_SIG: u32 = 0x0807_4b50;
pub(crate) const LOCAL_LEN: u64 = 30;
pub(crate) const CENTRAL_LEN: usize = 46;
pub(crate) const EOCD_LEN: usize = 22;
pub(crate) const ZIP64_EOCD_LEN: usize = 56;
pub(crate) const ZIP64_LOCATOR_LEN: usize = 20;
/// The zip64 block of a local header: id, length, uncompressed and compressed size.
pub(crate) const ZIP64_LOCAL_EXTRA: u64 = 20;
/// Python's zipfile moves sizes and offsets into zip64 fields above this (not at 0xFFFFFFFF).
pub(crate) const ZIP64_LIMIT: u64 = (1 << 31) - 1;
pub(crate) const VERSION: u16 = 45;
pub(crate) const MADE_BY: u16 = (3 << 8) | VERSION;
pub(crate) const EXTERNAL_ATTR: u32 = 0o644 << 16;
pub(crate) const FLAG_ENCRYPTED: u16 = 0x1;
pub(crate) const FLAG_DESCRIPTOR: u16 = 0x8;
pub(crate) const FLAG_UTF8: u16 = 0x800;
pub(crate) const STORED: u16 = 0;
pub(crate) const DEFLATED: u16 = 8;
/// Deflate cannot expand data more than ~1032:1; a larger claim is a zip bomb.
pub(crate) const MAX_DEFLATE_RATIO: u64 = 1032;

/// How leaf payloads are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    Stored,
    /// Raw deflate (zip method 8) at this level (0-10; 6 is zlib's default).
    Deflate(u8),
}

/// How to write an archive.
#[derive(Clone, Copy, Debug)]
pub struct ArchiveOptions {
    pub existsok: bool,
    /// fsync the archive and its directory before returning.
    pub durable: bool,
    pub num_threads: usize,
    pub compression: Compression,
    /// How the new archive is mapped for the returned leaves.
    pub mode: MapMode,
    /// MS-DOS time and date of the entries (the caller's local time, as zipfile writes).
    pub dos_time: u16,
    pub dos_date: u16,
}

/// The bytes of one loaded leaf: a view of the archive's map, or a copy.
#[derive(Debug)]
pub enum LeafData {
    View {
        offset: usize,
        len: usize,
    },
    /// Decompressed or realigned into anonymous memory (writes do not reach the archive).
    Copy(Region),
}

/// A loaded or freshly written archive: its map, and one entry per leaf (None when empty).
pub struct Loaded {
    pub region: Arc<Region>,
    pub leaves: Vec<Option<LeafData>>,
    /// Names of the entries that had to be copied (compressed or unaligned).
    pub copied: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Little-endian helpers

pub(crate) fn put16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn get16(b: &[u8], at: u64) -> Option<u16> {
    let at = usize::try_from(at).ok()?;
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}
pub(crate) fn get32(b: &[u8], at: u64) -> Option<u32> {
    let at = usize::try_from(at).ok()?;
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
pub(crate) fn get64(b: &[u8], at: u64) -> Option<u64> {
    let at = usize::try_from(at).ok()?;
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}
pub(crate) fn bytes_at(b: &[u8], at: u64, len: u64) -> Option<&[u8]> {
    let at = usize::try_from(at).ok()?;
    let len = usize::try_from(len).ok()?;
    b.get(at..at.checked_add(len)?)
}

pub(crate) fn crc32(data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(data);
    h.finalize()
}

/// CRC-32 of `len` zero bytes.
pub(crate) fn zeros_crc(len: u64) -> u32 {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let mut h = crc32fast::Hasher::new();
    let mut left = len;
    while left > 0 {
        let n = left.min(ZEROS.len() as u64) as usize;
        h.update(&ZEROS[..n]);
        left -= n as u64;
    }
    h.finalize()
}

pub(crate) fn os_error(errno_unix: i32, kind: io::ErrorKind) -> io::Error {
    if cfg!(unix) {
        io::Error::from_raw_os_error(errno_unix)
    } else {
        kind.into()
    }
}

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
    let workers = parallel::worker_count(num_threads, stored.len() / 64 + 1);
    let crcs = parallel::run(
        &stored,
        workers,
        |&i| ar.entries[i].size as usize,
        |&i| Ok(crc32(ar.raw(&ar.entries[i]))),
    )?;
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
            if get32(ar.bytes(), after) == Some(DESCRIPTOR_SIG) {
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
    for e in &ar.entries {
        let ok = match e.method {
            STORED => crc32(ar.raw(e)) == e.crc,
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tree::save::{EntrySpec, LeafSpec, NodeSpec};
    use serde_json::json;
    use std::path::PathBuf;

    pub(crate) fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "tdrs-archive-{}-{}",
            std::process::id(),
            storage::random_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    pub(crate) fn opts(compression: Compression) -> ArchiveOptions {
        ArchiveOptions {
            existsok: true,
            durable: false,
            num_threads: 2,
            compression,
            mode: MapMode::CopyOnWrite,
            dos_time: 0,
            dos_date: 33,
        }
    }

    pub(crate) fn sample(data: &[Vec<u8>]) -> (NodeSpec, Vec<LeafSpec<'_>>) {
        let leaves = vec![
            LeafSpec {
                dtype: "torch.float32".into(),
                shape: vec![3],
                device: "cpu".into(),
                data: Some(&data[0]),
                nbytes: 12,
                same_file: None,
            },
            LeafSpec {
                dtype: "torch.uint8".into(),
                shape: vec![3, data[1].len() as u64 / 3],
                device: "cpu".into(),
                data: Some(&data[1]),
                nbytes: data[1].len(),
                same_file: None,
            },
            LeafSpec {
                dtype: "torch.int64".into(),
                shape: vec![3, 0],
                device: "cpu".into(),
                data: Some(&[]),
                nbytes: 0,
                same_file: None,
            },
        ];
        let nested = NodeSpec {
            batch: vec![3],
            entries: vec![("b".into(), EntrySpec::Leaf(1)), ("e".into(), EntrySpec::Leaf(2))],
        };
        let root = NodeSpec {
            batch: vec![3],
            entries: vec![
                ("z".into(), EntrySpec::Leaf(0)),
                ("nested".into(), EntrySpec::Node(nested)),
                ("s".into(), EntrySpec::NonTensor(json!("hello"))),
            ],
        };
        (root, leaves)
    }

    fn view(loaded: &Loaded, i: usize) -> &[u8] {
        match loaded.leaves[i].as_ref().unwrap() {
            // SAFETY: the region outlives the borrow of `loaded`; offset + len is inside it.
            LeafData::View { offset, len } => unsafe {
                std::slice::from_raw_parts(loaded.region.as_ptr().add(*offset), *len)
            },
            // SAFETY: the copy's map spans its len and lives as long as `loaded`.
            LeafData::Copy(r) => unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len()) },
        }
    }

    #[test]
    fn round_trip_stored_and_deflated() {
        let data = vec![
            vec![1u8; 12],
            (0..3 * 700_000).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
        ];
        for compression in [Compression::Stored, Compression::Deflate(6)] {
            let (root, leaves) = sample(&data);
            let path = tmp("a.tdz");
            let written = write_archive(&path, &root, &leaves, opts(compression)).unwrap();
            assert_eq!(view(&written, 0), &data[0][..]);
            assert_eq!(view(&written, 1), &data[1][..]);
            assert!(written.leaves[2].is_none());
            let (node, loaded) = load_archive_tree(&path, MapMode::CopyOnWrite).unwrap();
            assert_eq!(node.batch, vec![3]);
            assert_eq!(view(&loaded, 0), &data[0][..]);
            assert_eq!(view(&loaded, 1), &data[1][..]);
            assert_eq!(
                loaded.copied.len(),
                if compression == Compression::Stored { 0 } else { 2 }
            );
            assert!(verify_archive(&path).is_empty(), "{:?}", verify_archive(&path));
            assert!(is_archive(&path));
        }
    }

    #[test]
    fn entries_follow_the_reference_order_and_alignment() {
        let data = vec![vec![1u8; 12], vec![2u8; 6]];
        let (root, leaves) = sample(&data);
        let path = tmp("order.tdz");
        write_archive(&path, &root, &leaves, opts(Compression::Stored)).unwrap();
        let ar = Archive::open(&path, MapMode::ReadOnly).unwrap();
        let names: Vec<&str> = ar.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "meta.json",
                "z.memmap",
                "nested/meta.json",
                "nested/b.memmap",
                "s/meta.json"
            ]
        );
        for e in ar.entries.iter().filter(|e| e.name.ends_with(".memmap")) {
            assert_eq!(e.data % ALIGNMENT, 0, "{}", e.name);
        }
    }

    #[test]
    fn zeros_and_big_leaves_get_right_crcs() {
        let big = (0..(3 << 20) + 5)
            .map(|i| (i * 7 % 256) as u8)
            .collect::<Vec<u8>>();
        fn leaf(data: Option<&[u8]>, n: usize) -> LeafSpec<'_> {
            LeafSpec {
                dtype: "torch.uint8".into(),
                shape: vec![n as u64],
                device: "cpu".into(),
                data,
                nbytes: n,
                same_file: None,
            }
        }
        let leaves = vec![leaf(Some(&big), big.len()), leaf(None, big.len())];
        let root = NodeSpec {
            batch: vec![],
            entries: vec![("a".into(), EntrySpec::Leaf(0)), ("b".into(), EntrySpec::Leaf(1))],
        };
        let path = tmp("big.tdz");
        write_archive(&path, &root, &leaves, opts(Compression::Stored)).unwrap();
        assert!(verify_archive(&path).is_empty(), "{:?}", verify_archive(&path));
    }

    #[test]
    fn stale_crcs_load_and_refresh() {
        let data = vec![vec![1u8; 12], vec![2u8; 6]];
        let (root, leaves) = sample(&data);
        let path = tmp("crc.tdz");
        let mut o = opts(Compression::Stored);
        o.mode = MapMode::Shared;
        let written = write_archive(&path, &root, &leaves, o).unwrap();
        let LeafData::View { offset, .. } = written.leaves[0].as_ref().unwrap() else {
            panic!()
        };
        // SAFETY: a shared writable map of the archive; the offset is the leaf's.
        unsafe { *written.region.as_ptr().add(*offset) = 9 };
        written.region.flush().unwrap();
        assert_eq!(verify_archive(&path).len(), 1);
        assert!(load_archive(&path, MapMode::CopyOnWrite).is_ok());
        assert_eq!(refresh_checksums(&path, 0).unwrap(), ["z.memmap"]);
        assert!(verify_archive(&path).is_empty());
    }
}
