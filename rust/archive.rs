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

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result};
use crate::layout::{self, Entry, LeafMeta, NodeMeta};
use crate::load::{LoadedEntry, LoadedNode};
use crate::parallel;
use crate::storage::{self, MapMode, Region};

pub use crate::archive_write::write_archive;

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

pub(crate) fn file_identity(file: &File) -> io::Result<(u64, u64)> {
    let md = file.metadata()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Ok((md.dev(), md.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = md;
        Ok((0, 0))
    }
}

pub(crate) fn os_error(errno_unix: i32, kind: io::ErrorKind) -> io::Error {
    if cfg!(unix) {
        io::Error::from_raw_os_error(errno_unix)
    } else {
        kind.into()
    }
}

// ---------------------------------------------------------------------------------------------
// Reading

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

/// An archive's validated index over its map.
pub struct Archive {
    pub path: PathBuf,
    pub region: Arc<Region>,
    pub entries: Vec<ZipEntry>,
    index: HashMap<String, usize>,
    dirs: HashSet<String>,
}

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::invalid(path, message)
}

/// Where messages point: the archive and, after `::`, the entry (tensordict's notation).
fn entry_path(path: &Path, name: &str) -> PathBuf {
    PathBuf::from(format!("{}::{name}", path.display()))
}

/// Refuses names that could leave the extraction directory or that no saver writes.
fn check_name(path: &Path, name: &str) -> Result<()> {
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

/// Values of a zip64 extra block for the fields that are 0xFFFFFFFF (in the spec's order).
fn zip64_fields(extra: &[u8], wanted: usize) -> Option<Vec<u64>> {
    let mut at = 0;
    while at + 4 <= extra.len() {
        let id = u16::from_le_bytes([extra[at], extra[at + 1]]);
        let len = usize::from(u16::from_le_bytes([extra[at + 2], extra[at + 3]]));
        let body = extra.get(at + 4..at + 4 + len)?;
        if id == ZIP64_EXTRA_ID {
            if body.len() < wanted * 8 {
                return None;
            }
            return Some(
                (0..wanted)
                    .map(|i| u64::from_le_bytes(body[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8])))
                    .collect(),
            );
        }
        at += 4 + len;
    }
    (wanted == 0).then(Vec::new)
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
        let identity = file_identity(&file).map_err(|e| Error::io(&path, e))?;
        let region = storage::map_file(&file, len, Some(path.clone()), mode)
            .map_err(|e| Error::io(&path, e))?
            .as_archive(identity);
        let region = Arc::new(region);
        // SAFETY: the map spans `len` readable bytes and lives as long as `region`, which this
        // function holds. Every read below is bounds-checked against this slice, so a file
        // changed by another process gives at worst an error, never a read outside the map.
        let bytes = unsafe { std::slice::from_raw_parts(region.as_ptr(), region.len()) };
        let (entries, dirs) = index(&path, bytes)?;
        let index = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.clone(), i))
            .collect();
        Ok(Archive {
            path,
            region,
            entries,
            index,
            dirs,
        })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: as in `open`: the region is alive for the borrow of self and spans its len.
        unsafe { std::slice::from_raw_parts(self.region.as_ptr(), self.region.len()) }
    }

    pub(crate) fn entry(&self, name: &str) -> Option<&ZipEntry> {
        self.index.get(name).map(|&i| &self.entries[i])
    }

    /// The raw (maybe compressed) bytes of an entry.
    fn raw(&self, e: &ZipEntry) -> &[u8] {
        // `index` checked that data + csize lies inside the file.
        &self.bytes()[e.data as usize..(e.data + e.csize) as usize]
    }

    /// The whole content of an entry, decompressed and checked against its CRC, refusing
    /// entries larger than `limit`.
    pub(crate) fn read(&self, e: &ZipEntry, limit: u64) -> Result<Vec<u8>> {
        let at = entry_path(&self.path, &e.name);
        if e.size > limit {
            return Err(bad(
                &at,
                format!(
                    "entry {:?} is {} bytes, more than the limit of {limit}",
                    e.name, e.size
                ),
            ));
        }
        let data = match e.method {
            STORED => self.raw(e).to_vec(),
            _ => self.inflate(e)?,
        };
        if crc32(&data) != e.crc {
            return Err(bad(&at, format!("entry {:?} fails its CRC-32 check", e.name)));
        }
        Ok(data)
    }

    fn inflate(&self, e: &ZipEntry) -> Result<Vec<u8>> {
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
        let data = miniz_oxide::inflate::decompress_to_vec_with_limit(self.raw(e), limit).map_err(|err| {
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

/// Parses and validates the end records, the central directory and every local header.
fn index(path: &Path, b: &[u8]) -> Result<(Vec<ZipEntry>, HashSet<String>)> {
    let len = b.len() as u64;
    let not_zip = || bad(path, "not a zip archive (no end of central directory record)");
    let lowest = len.saturating_sub((EOCD_LEN + 0xFFFF) as u64);
    let mut eocd = None;
    let mut at = len - EOCD_LEN as u64;
    loop {
        if get32(b, at) == Some(EOCD_SIG)
            && get16(b, at + 20).map(u64::from) == Some(len - at - EOCD_LEN as u64)
        {
            eocd = Some(at);
            break;
        }
        if at == lowest {
            break;
        }
        at -= 1;
    }
    let eocd = eocd.ok_or_else(not_zip)?;
    let field16 = |off: u64| get16(b, eocd + off).ok_or_else(not_zip).map(u64::from);
    let field32 = |off: u64| get32(b, eocd + off).ok_or_else(not_zip).map(u64::from);
    let (disk, cd_disk) = (field16(4)?, field16(6)?);
    let (mut count_disk, mut count) = (field16(8)?, field16(10)?);
    let (mut cd_size, mut cd_start) = (field32(12)?, field32(16)?);
    let mut cd_end_expected = eocd;
    if eocd >= ZIP64_LOCATOR_LEN as u64
        && get32(b, eocd - ZIP64_LOCATOR_LEN as u64) == Some(ZIP64_LOCATOR_SIG)
    {
        let loc = eocd - ZIP64_LOCATOR_LEN as u64;
        let z = get64(b, loc + 8).ok_or_else(not_zip)?;
        if get32(b, z) != Some(ZIP64_EOCD_SIG) || z + ZIP64_EOCD_LEN as u64 > loc {
            return Err(bad(
                path,
                "the zip64 end of central directory record is missing or misplaced",
            ));
        }
        let g32 = |o| get32(b, z + o).map(u64::from).ok_or_else(not_zip);
        let g64 = |o| get64(b, z + o).ok_or_else(not_zip);
        if g32(16)? != 0 || g32(20)? != 0 || get32(b, loc + 4) != Some(0) {
            return Err(Error::unsupported(
                path,
                "multi-disk zip archives are not supported",
            ));
        }
        count_disk = g64(24)?;
        count = g64(32)?;
        cd_size = g64(40)?;
        cd_start = g64(48)?;
        cd_end_expected = z;
    }
    if disk != 0 || cd_disk != 0 || count_disk != count {
        return Err(Error::unsupported(
            path,
            "multi-disk zip archives are not supported",
        ));
    }
    if cd_start.checked_add(cd_size) != Some(cd_end_expected) {
        return Err(bad(
            path,
            format!(
                "the central directory ({cd_size} bytes at {cd_start}) does not end where the end record starts ({cd_end_expected}): truncated or not a plain zip archive"
            ),
        ));
    }
    if count.saturating_mul(CENTRAL_LEN as u64) > cd_size {
        return Err(bad(
            path,
            format!("the central directory is too small for {count} entries"),
        ));
    }
    let mut entries = Vec::with_capacity(count as usize);
    let mut names = HashSet::new();
    let mut dirs = HashSet::new();
    let mut p = cd_start;
    for _ in 0..count {
        let r = |o: u64| get16(b, p + o).ok_or_else(|| bad(path, "a central directory record is truncated"));
        let r32 =
            |o: u64| get32(b, p + o).ok_or_else(|| bad(path, "a central directory record is truncated"));
        if r32(0)? != CENTRAL_SIG {
            return Err(bad(
                path,
                format!("bad central directory record signature at offset {p}"),
            ));
        }
        let flags = r(8)?;
        let method = r(10)?;
        let crc = r32(16)?;
        let (mut csize, mut size) = (u64::from(r32(20)?), u64::from(r32(24)?));
        let (n, m, k) = (u64::from(r(28)?), u64::from(r(30)?), u64::from(r(32)?));
        let mut header = u64::from(r32(42)?);
        let record_end = p + CENTRAL_LEN as u64 + n + m + k;
        if record_end > cd_end_expected {
            return Err(bad(
                path,
                "a central directory record runs past the central directory",
            ));
        }
        let name_bytes = bytes_at(b, p + CENTRAL_LEN as u64, n).ok_or_else(|| bad(path, "truncated name"))?;
        let name = std::str::from_utf8(name_bytes)
            .map_err(|_| {
                bad(
                    path,
                    format!(
                        "entry name {:?} is not UTF-8",
                        String::from_utf8_lossy(name_bytes)
                    ),
                )
            })?
            .to_string();
        check_name(path, &name)?;
        let at = entry_path(path, &name);
        if !names.insert(name.clone()) {
            return Err(bad(&at, format!("entry {name:?} appears twice in the archive")));
        }
        if r(34)? != 0 {
            return Err(Error::unsupported(
                &at,
                "multi-disk zip archives are not supported",
            ));
        }
        if flags & (FLAG_ENCRYPTED | 0x40) != 0 {
            return Err(Error::unsupported(&at, format!("entry {name:?} is encrypted")));
        }
        let extra =
            bytes_at(b, p + CENTRAL_LEN as u64 + n, m).ok_or_else(|| bad(path, "truncated extra field"))?;
        let wanted = [size, csize, header]
            .iter()
            .filter(|&&v| v == 0xFFFF_FFFF)
            .count();
        if wanted > 0 {
            let values = zip64_fields(extra, wanted).ok_or_else(|| {
                bad(
                    &at,
                    format!("entry {name:?} lacks the zip64 sizes its record announces"),
                )
            })?;
            let mut it = values.into_iter();
            if size == 0xFFFF_FFFF {
                size = it.next().unwrap_or(0);
            }
            if csize == 0xFFFF_FFFF {
                csize = it.next().unwrap_or(0);
            }
            if header == 0xFFFF_FFFF {
                header = it.next().unwrap_or(0);
            }
        }
        let central = p;
        p = record_end;
        if let Some(dir) = name.strip_suffix('/') {
            if size != 0 {
                return Err(bad(&at, format!("directory entry {name:?} has data")));
            }
            dirs.insert(dir.to_string());
            continue;
        }
        // The local header: same name and method, payload inside the file before the
        // central directory.
        if header.checked_add(LOCAL_LEN).is_none_or(|end| end > cd_start)
            || get32(b, header) != Some(LOCAL_SIG)
        {
            return Err(bad(
                &at,
                format!("entry {name:?}: no local header at offset {header}"),
            ));
        }
        let ln = u64::from(get16(b, header + 26).unwrap_or(0));
        let lm = u64::from(get16(b, header + 28).unwrap_or(0));
        if bytes_at(b, header + LOCAL_LEN, ln) != Some(name_bytes) {
            return Err(bad(
                &at,
                format!("entry {name:?}: the local header names another file"),
            ));
        }
        if get16(b, header + 8) != Some(method) {
            return Err(bad(
                &at,
                format!("entry {name:?}: the local header's method differs from the directory's"),
            ));
        }
        let data = header + LOCAL_LEN + ln + lm;
        if data.checked_add(csize).is_none_or(|end| end > cd_start) {
            return Err(bad(
                &at,
                format!("entry {name:?}: its data ({csize} bytes at {data}) runs past the entries"),
            ));
        }
        if method == STORED && csize != size {
            return Err(bad(
                &at,
                format!("entry {name:?} is stored but its sizes differ ({csize} != {size})"),
            ));
        }
        entries.push(ZipEntry {
            name,
            method,
            flags,
            crc,
            csize,
            size,
            header,
            data,
            central,
        });
    }
    let mut spans: Vec<(u64, u64, usize)> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.header, e.data + e.csize, i))
        .collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        if pair[1].0 < pair[0].1 {
            let (a, c) = (&entries[pair[0].2].name, &entries[pair[1].2].name);
            return Err(bad(
                &entry_path(path, c),
                format!("entries {a:?} and {c:?} overlap"),
            ));
        }
    }
    Ok((entries, dirs))
}

/// A leaf to materialize after the walk.
struct LeafJob {
    entry: usize,
    nbytes: usize,
    itemsize: usize,
}

fn walk(ar: &Archive, dir: &str, depth: usize, jobs: &mut Vec<Option<LeafJob>>) -> Result<LoadedNode> {
    let meta_name = format!("{dir}{}", layout::META_FILE);
    let meta_path = entry_path(&ar.path, &meta_name);
    if depth > layout::MAX_DEPTH {
        return Err(bad(&meta_path, "the tree is nested too deeply"));
    }
    let meta = match read_meta(ar, &meta_name)? {
        NodeMeta::TensorDict(m) => m,
        NodeMeta::NonTensor(_) => {
            return Err(Error::unsupported(
                &meta_path,
                "this archive holds a single non-tensor value, not a TensorDict",
            ))
        }
    };
    let mut entries = Vec::with_capacity(meta.entries.len());
    for (key, entry) in meta.entries {
        match entry {
            Entry::Leaf(LeafMeta { dtype, shape, nbytes }) => {
                let index = jobs.len();
                if nbytes == 0 {
                    jobs.push(None);
                } else {
                    let encoded = format!("{dir}{}", layout::leaf_file(&key));
                    let name = match layout::legacy_name(&key) {
                        Some(raw) if ar.entry(&encoded).is_none() => {
                            format!("{dir}{raw}{}", layout::LEAF_SUFFIX)
                        }
                        _ => encoded,
                    };
                    let at = entry_path(&ar.path, &name);
                    let e = *ar.index.get(&name).ok_or_else(|| {
                        bad(
                            &at,
                            format!("the data of key {key:?} is missing (no entry {name:?})"),
                        )
                    })?;
                    if ar.entries[e].size < nbytes as u64 {
                        return Err(bad(
                            &at,
                            format!(
                                "the data of key {key:?} is truncated: {} bytes, its shape needs {nbytes}",
                                ar.entries[e].size
                            ),
                        ));
                    }
                    jobs.push(Some(LeafJob {
                        entry: e,
                        nbytes,
                        itemsize: dtype.itemsize,
                    }));
                }
                entries.push((
                    key,
                    LoadedEntry::Leaf {
                        dtype: dtype.name,
                        shape,
                        index,
                    },
                ));
            }
            Entry::Collection => {
                let child = format!("{dir}{}/", layout::encode_key(&key));
                let child_meta = format!("{child}{}", layout::META_FILE);
                if ar.entry(&child_meta).is_none() {
                    let at = entry_path(&ar.path, &child_meta);
                    let what = if ar.dirs.contains(child.trim_end_matches('/'))
                        || ar.index.keys().any(|n| n.starts_with(&child))
                    {
                        "has no meta.json"
                    } else {
                        "is missing"
                    };
                    return Err(bad(&at, format!("the sub-directory of key {key:?} {what}")));
                }
                match read_meta(ar, &child_meta)? {
                    NodeMeta::NonTensor(value) => entries.push((key, LoadedEntry::NonTensor(value))),
                    NodeMeta::TensorDict(_) => {
                        let node = walk(ar, &child, depth + 1, jobs)?;
                        if !node.batch.starts_with(&meta.batch) {
                            return Err(bad(
                                &entry_path(&ar.path, &child_meta),
                                format!(
                                    "key {key:?}: batch size {:?} does not start with its parent's {:?}",
                                    node.batch, meta.batch
                                ),
                            ));
                        }
                        entries.push((key, LoadedEntry::Node(node)));
                    }
                }
            }
        }
    }
    Ok(LoadedNode {
        batch: meta.batch,
        device: meta.device,
        entries,
    })
}

fn read_meta(ar: &Archive, name: &str) -> Result<NodeMeta> {
    let at = entry_path(&ar.path, name);
    let e = ar.entry(name).ok_or_else(|| bad(&at, "meta.json is missing"))?;
    let bytes = ar.read(e, layout::META_LIMIT)?;
    layout::parse_meta(&bytes, &at)
}

/// The bytes of one leaf: a view when STORED and aligned for its dtype, else a copy.
fn leaf_data(ar: &Archive, job: &LeafJob) -> Result<LeafData> {
    let e = &ar.entries[job.entry];
    if e.method == STORED && e.data % job.itemsize as u64 == 0 {
        return Ok(LeafData::View {
            offset: e.data as usize,
            len: job.nbytes,
        });
    }
    let copy = storage::anonymous(None, job.nbytes)?;
    let fill = |src: &[u8]| {
        // SAFETY: `copy` is a fresh writable map of `nbytes` bytes that nothing else sees yet,
        // and `src` holds at least `nbytes` bytes (the entry size was checked in the walk).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), copy.as_ptr(), job.nbytes) };
    };
    if e.method == STORED {
        fill(ar.raw(e));
    } else {
        let data = ar.inflate(e)?;
        if crc32(&data) != e.crc {
            return Err(bad(
                &entry_path(&ar.path, &e.name),
                format!("entry {:?} fails its CRC-32 check", e.name),
            ));
        }
        fill(&data);
    }
    Ok(LeafData::Copy(copy))
}

/// Opens, validates and walks the archive at `path`; every leaf a view of one map when it
/// can be. `mode`: `Shared` (writes reach the file) or `CopyOnWrite` (they stay private).
pub fn load_archive(path: &Path, mode: MapMode) -> Result<Loaded> {
    load_archive_tree(path, mode).map(|(_, loaded)| loaded)
}

/// Like `load_archive`, with the tree.
pub fn load_archive_tree(path: &Path, mode: MapMode) -> Result<(LoadedNode, Loaded)> {
    let ar = Archive::open(path, mode)?;
    let mut jobs = Vec::new();
    let node = walk(&ar, "", 0, &mut jobs)?;
    let copies: Vec<usize> = (0..jobs.len())
        .filter(|&i| {
            jobs[i].as_ref().is_some_and(|j| {
                let e = &ar.entries[j.entry];
                e.method != STORED || e.data % j.itemsize as u64 != 0
            })
        })
        .collect();
    let workers = parallel::worker_count(0, copies.len());
    let copied_data = parallel::run(
        &copies,
        workers,
        |&i| jobs[i].as_ref().map_or(0, |j| j.nbytes),
        |&i| jobs[i].as_ref().map(|j| leaf_data(&ar, j)).transpose(),
    )?;
    let mut copied = Vec::new();
    let mut leaves: Vec<Option<LeafData>> = Vec::with_capacity(jobs.len());
    let mut copied_iter = copies.iter().zip(copied_data).peekable();
    for (i, job) in jobs.iter().enumerate() {
        match copied_iter.peek() {
            Some((&c, _)) if c == i => {
                let (_, data) = copied_iter.next().unwrap_or((&0, None));
                if let Some(j) = job {
                    copied.push(ar.entries[j.entry].name.clone());
                }
                leaves.push(data);
            }
            _ => leaves.push(job.as_ref().map(|j| leaf_data(&ar, j)).transpose()?),
        }
    }
    Ok((
        node,
        Loaded {
            region: ar.region,
            leaves,
            copied,
        },
    ))
}

/// True when `path` is a regular file holding a valid zip with a top-level `meta.json`.
pub fn is_archive(path: &Path) -> bool {
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return false;
    }
    Archive::open(path, MapMode::ReadOnly).is_ok_and(|ar| ar.entry(layout::META_FILE).is_some())
}

/// Recomputes the CRC-32 of every STORED entry after in-place writes and patches the local
/// headers (or data descriptors) and the central directory. Returns the entries changed.
pub fn refresh_checksums(path: &Path, num_threads: usize) -> Result<Vec<String>> {
    let ar = Archive::open(path, MapMode::ReadOnly)?;
    if ar.entry(layout::META_FILE).is_none() {
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
    if let Err(e) = walk(&ar, "", 0, &mut jobs) {
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
    identity: (u64, u64),
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
            if file_identity(&file).map_err(|e| Error::io(path, e))? != identity {
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
mod tests {
    use super::*;
    use crate::save::{EntrySpec, LeafSpec, NodeSpec};
    use serde_json::json;

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "tdrs-archive-{}-{}",
            std::process::id(),
            storage::random_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    fn opts(compression: Compression) -> ArchiveOptions {
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

    fn sample(data: &[Vec<u8>]) -> (NodeSpec, Vec<LeafSpec<'_>>) {
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

    #[test]
    fn hostile_names_are_refused() {
        for name in ["../x", "/abs", "a/../b", "a\\b", "C:/x", "a//b", "."] {
            assert!(check_name(Path::new("x"), name).is_err(), "{name}");
        }
        for name in ["meta.json", "a/b.memmap", "dir/", "%2E%2E/meta.json"] {
            assert!(check_name(Path::new("x"), name).is_ok(), "{name}");
        }
    }

    #[test]
    fn truncated_and_garbage_files_are_refused() {
        let data = vec![vec![1u8; 12], vec![2u8; 6]];
        let (root, leaves) = sample(&data);
        let path = tmp("t.tdz");
        write_archive(&path, &root, &leaves, opts(Compression::Stored)).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
            let p = tmp("cut.tdz");
            std::fs::write(&p, &bytes[..cut]).unwrap();
            assert!(load_archive(&p, MapMode::CopyOnWrite).is_err(), "cut at {cut}");
            assert!(!is_archive(&p));
        }
    }

    #[test]
    fn deflate_bombs_are_refused() {
        let e = ZipEntry {
            name: "a.memmap".into(),
            method: DEFLATED,
            flags: 0,
            crc: 0,
            csize: 10,
            size: 1 << 40,
            header: 0,
            data: 0,
            central: 0,
        };
        let path = tmp("bomb.tdz");
        let data = vec![vec![1u8; 12], vec![2u8; 6]];
        let (root, leaves) = sample(&data);
        write_archive(&path, &root, &leaves, opts(Compression::Stored)).unwrap();
        let ar = Archive::open(&path, MapMode::ReadOnly).unwrap();
        let err = ar.inflate(&e).unwrap_err().to_string();
        assert!(err.contains("zip bomb"), "{err}");
    }
}
