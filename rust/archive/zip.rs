//! The zip side of `.tdz` archives: the end records, the central directory and the local
//! headers, read with `pread` and validated. No pyo3 here.
//!
//! `Archive::open` reads the file's index (never through a map: a file that shrinks while
//! it is read gives an error, not SIGBUS), maps the file for the leaves' views, and refuses
//! whatever a
//! saver would not write or a reader could be fooled by: a missing or misplaced end record,
//! multi-disk and encrypted archives, names that could escape (`..`, absolute, backslashes,
//! NUL, drive letters), duplicate names, local headers that disagree with the directory,
//! sizes and offsets outside the file, overlapping entries, and deflate entries claiming more
//! than deflate can expand (zip bombs). Every message names the archive and the entry.
//!
//! `zip/index.rs` parses and validates the index (the end records, the central directory,
//! the local headers); the format's constants, the byte helpers and `Archive`'s reads are here.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::sys::identity;
use crate::sys::storage::{self, MapMode, Region};

mod index;

use index::index;

// ---------------------------------------------------------------------------------------------
// The zip format's constants

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

// ---------------------------------------------------------------------------------------------
// The validated index

/// One validated data entry of an archive.
#[derive(Debug, Clone)]
pub struct ZipEntry {
    pub name: String,
    pub method: u16,
    pub flags: u16,
    pub crc: u32,
    pub csize: u64,
    pub size: u64,
    pub header: u64,
    pub data: u64,
    /// Offset of the entry's central directory record.
    pub central: u64,
}

/// An archive's validated index, and its map (the backing of the leaves it gives out).
///
/// Nothing is parsed from the map: the index, every meta.json, compressed entries, copies and
/// checksums are read with `pread` from `file`, so an archive that shrinks while it is read
/// (`cp new.tdz a.tdz` truncates, then writes) gives a short read, an error naming it, never a
/// fault. Only the views handed out (aligned STORED leaves) read through the map.
pub struct Archive {
    pub path: PathBuf,
    pub region: Arc<Region>,
    pub entries: Vec<ZipEntry>,
    pub(crate) index: HashMap<String, usize>,
    pub(crate) dirs: HashSet<String>,
    /// The open archive, read with `pread`.
    pub(crate) file: File,
    /// Its length when opened (the map's).
    pub(crate) len: u64,
}

pub(crate) fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::invalid(path, message)
}

/// Where messages point: the archive and, after `::`, the entry (tensordict's notation).
pub(crate) fn entry_path(path: &Path, name: &str) -> PathBuf {
    PathBuf::from(format!("{}::{name}", path.display()))
}

/// Refuses names that could leave the extraction directory or that no saver writes.
pub(crate) fn check_name(path: &Path, name: &str) -> Result<()> {
    let body = name.strip_suffix('/').unwrap_or(name);
    let hostile = body.is_empty()
        || name.starts_with('/')
        || name.contains(['\\', '\0'])
        || body.split('/').any(|c| c.is_empty() || c == "." || c == "..")
        || body.as_bytes().get(1) == Some(&b':');
    if hostile {
        return Err(bad(
            path,
            format!("entry {name:?} has a name that could escape the archive"),
        ));
    }
    Ok(())
}

/// `len` bytes of `file` at `at`, read with `pread`; a short read means the archive shrank
/// since it was opened (or lies about its layout): an error naming it.
pub(crate) fn read_at(file: &File, path: &Path, at: u64, len: u64) -> Result<Vec<u8>> {
    let n = usize::try_from(len).map_err(|_| bad(path, "an entry is too large to read"))?;
    let mut buf = vec![0u8; n];
    storage::read_exact_at(file, &mut buf, at).map_err(|e| short_read(path, e))?;
    Ok(buf)
}

/// The error of a `pread` that came back short or failed.
pub(crate) fn short_read(path: &Path, e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        bad(
            path,
            "the archive is shorter than its index says: it changed while it was read (rewritten in place?), or is truncated",
        )
    } else {
        Error::io(path, e)
    }
}

impl Archive {
    /// Opens, maps and validates the archive at `path`.
    pub fn open(path: &Path, mode: MapMode) -> Result<Archive> {
        let path = std::path::absolute(path).map_err(|e| Error::io(path, e))?;
        let file = match mode {
            MapMode::Shared => std::fs::OpenOptions::new().read(true).write(true).open(&path),
            _ => File::open(&path),
        }
        .map_err(|e| Error::io(&path, e))?;
        let md = file.metadata().map_err(|e| Error::io(&path, e))?;
        if md.is_dir() {
            return Err(Error::io(&path, os_error(21, io::ErrorKind::IsADirectory)));
        }
        if !md.is_file() {
            return Err(bad(&path, "the archive is not a regular file"));
        }
        let len = usize::try_from(md.len()).map_err(|_| bad(&path, "the archive is too large"))?;
        if len < EOCD_LEN {
            return Err(bad(&path, "not a zip archive: the file is too short"));
        }
        let (entries, index, dirs) = index(&path, &file, len as u64)?;
        let identity = identity::of_file(&file).map_err(|e| Error::io(&path, e))?;
        let region = storage::map_file(&file, len, Some(path.clone()), mode)
            .map_err(|e| Error::io(&path, e))?
            .as_archive(identity);
        Ok(Archive {
            path,
            region: Arc::new(region),
            entries,
            index,
            dirs,
            file,
            len: len as u64,
        })
    }

    pub(crate) fn entry(&self, name: &str) -> Option<&ZipEntry> {
        self.index.get(name).map(|&i| &self.entries[i])
    }

    /// `len` bytes at `at`, read with `pread` (not through the map).
    pub(crate) fn read_at(&self, at: u64, len: u64) -> Result<Vec<u8>> {
        read_at(&self.file, &self.path, at, len)
    }

    /// The raw (maybe compressed) bytes of an entry, read with `pread`.
    pub(crate) fn raw(&self, e: &ZipEntry) -> Result<Vec<u8>> {
        // `index` checked that data + csize lies inside the file (as it was when opened).
        self.read_at(e.data, e.csize)
    }

    /// Reads `len` bytes of the entry's payload at its start into `out` (a copy's memory).
    pub(crate) fn raw_into(&self, e: &ZipEntry, out: &mut [u8]) -> Result<()> {
        storage::read_exact_at(&self.file, out, e.data).map_err(|err| short_read(&self.path, err))
    }

    /// CRC-32 of bytes `range` of an entry's raw bytes, read in 4 MiB pieces with `pread`
    /// (never through the map: an archive cut meanwhile is a short-read error, not a fault).
    pub(crate) fn raw_crc_range(&self, e: &ZipEntry, range: std::ops::Range<usize>) -> Result<u32> {
        const PIECE: u64 = 4 << 20;
        let (start, end) = (range.start as u64, (range.end as u64).min(e.csize));
        let mut h = crc32fast::Hasher::new();
        let mut buf = vec![0u8; end.saturating_sub(start).min(PIECE) as usize];
        let mut at = start;
        while at < end {
            let n = (end - at).min(PIECE) as usize;
            storage::read_exact_at(&self.file, &mut buf[..n], e.data + at)
                .map_err(|err| short_read(&self.path, err))?;
            h.update(&buf[..n]);
            at += n as u64;
        }
        Ok(h.finalize())
    }

    /// Checks that the file still holds at least the bytes it had when opened: after the views
    /// are made, so that an archive cut while it was loaded is an error here, not a fault in
    /// the caller's first touch of a leaf.
    pub(crate) fn check_unchanged(&self) -> Result<()> {
        let now = self.file.metadata().map_err(|e| Error::io(&self.path, e))?.len();
        if now < self.len {
            return Err(bad(
                &self.path,
                format!(
                    "the archive shrank from {} to {now} bytes while it was loaded (rewritten in place?)",
                    self.len
                ),
            ));
        }
        Ok(())
    }

    /// The whole content of an entry, decompressed and checked against its CRC, refusing
    /// entries larger than `limit`.
    pub(crate) fn read(&self, e: &ZipEntry, limit: u64) -> Result<Vec<u8>> {
        let at = entry_path(&self.path, &e.name);
        if e.size > limit || (e.method == STORED && e.csize > limit) {
            return Err(bad(
                &at,
                format!(
                    "entry {:?} is {} bytes, more than the limit of {limit}",
                    e.name, e.size
                ),
            ));
        }
        let data = match e.method {
            STORED => self.raw(e)?,
            _ => self.inflate(e)?,
        };
        if crc32(&data) != e.crc {
            return Err(bad(&at, format!("entry {:?} fails its CRC-32 check", e.name)));
        }
        Ok(data)
    }

    pub(crate) fn inflate(&self, e: &ZipEntry) -> Result<Vec<u8>> {
        let at = entry_path(&self.path, &e.name);
        if e.method != DEFLATED {
            return Err(Error::unsupported(
                &at,
                format!(
                    "entry {:?} is compressed with zip method {} ({}); only stored and deflate entries are read",
                    e.name,
                    e.method,
                    match e.method {
                        12 => "bzip2",
                        14 => "lzma",
                        _ => "unknown",
                    }
                ),
            ));
        }
        if e.size > e.csize.saturating_mul(MAX_DEFLATE_RATIO).saturating_add(1024) {
            return Err(bad(
                &at,
                format!(
                    "entry {:?} claims {} bytes from {} compressed bytes, more than deflate can expand: refusing a zip bomb",
                    e.name, e.size, e.csize
                ),
            ));
        }
        let limit = usize::try_from(e.size).map_err(|_| bad(&at, "entry too large"))?;
        let compressed = self.raw(e)?;
        let data = miniz_oxide::inflate::decompress_to_vec_with_limit(&compressed, limit).map_err(|err| {
            bad(
                &at,
                format!(
                    "entry {:?} is not a valid deflate stream of its declared size ({:?})",
                    e.name, err.status
                ),
            )
        })?;
        if data.len() != limit {
            return Err(bad(
                &at,
                format!(
                    "entry {:?} inflates to {} bytes, its header says {}",
                    e.name,
                    data.len(),
                    e.size
                ),
            ));
        }
        Ok(data)
    }
}

#[cfg(test)]
mod tests;
