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

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::sys::identity;
use crate::sys::storage::{self, MapMode, Region};

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

/// Bytes of the file held in memory from absolute offset `start` (a piece of the archive read
/// with `pread`); the little-endian helpers take absolute offsets and give None outside it.
struct Window {
    start: u64,
    bytes: Vec<u8>,
}

impl Window {
    fn read(file: &File, path: &Path, start: u64, end: u64) -> Result<Window> {
        Ok(Window {
            start,
            bytes: read_at(file, path, start, end - start)?,
        })
    }
    fn rel(&self, at: u64) -> Option<u64> {
        at.checked_sub(self.start)
    }
    fn get16(&self, at: u64) -> Option<u16> {
        get16(&self.bytes, self.rel(at)?)
    }
    fn get32(&self, at: u64) -> Option<u32> {
        get32(&self.bytes, self.rel(at)?)
    }
    fn get64(&self, at: u64) -> Option<u64> {
        get64(&self.bytes, self.rel(at)?)
    }
    fn bytes_at(&self, at: u64, len: u64) -> Option<&[u8]> {
        bytes_at(&self.bytes, self.rel(at)?, len)
    }
    fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
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

/// Parses and validates the end records, the central directory and every local header.
type Index = (Vec<ZipEntry>, HashMap<String, usize>, HashSet<String>);

/// Consecutive local headers closer than this share one read.
const HEADER_GAP: u64 = 64 << 10;
/// The largest read of local headers at once.
const HEADER_READ: u64 = 4 << 20;

/// One central record, before its local header is checked.
struct Central {
    entry: ZipEntry,
    name_bytes: Vec<u8>,
}

fn index(path: &Path, file: &File, len: u64) -> Result<Index> {
    let not_zip = || bad(path, "not a zip archive (no end of central directory record)");
    // The end record lies in the last 64 KiB + 22 bytes (its comment is at most 64 KiB),
    // after a zip64 locator (20 bytes) when there is one.
    let tail_start = len.saturating_sub((EOCD_LEN + 0xFFFF + ZIP64_LOCATOR_LEN) as u64);
    let tail = Window::read(file, path, tail_start, len)?;
    let lowest = len.saturating_sub((EOCD_LEN + 0xFFFF) as u64);
    let mut eocd = None;
    let mut at = len - EOCD_LEN as u64;
    loop {
        if tail.get32(at) == Some(EOCD_SIG)
            && tail.get16(at + 20).map(u64::from) == Some(len - at - EOCD_LEN as u64)
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
    let field16 = |off: u64| tail.get16(eocd + off).ok_or_else(not_zip).map(u64::from);
    let field32 = |off: u64| tail.get32(eocd + off).ok_or_else(not_zip).map(u64::from);
    let (disk, cd_disk) = (field16(4)?, field16(6)?);
    let (mut count_disk, mut count) = (field16(8)?, field16(10)?);
    let (mut cd_size, mut cd_start) = (field32(12)?, field32(16)?);
    let mut cd_end_expected = eocd;
    if eocd >= ZIP64_LOCATOR_LEN as u64
        && tail.get32(eocd - ZIP64_LOCATOR_LEN as u64) == Some(ZIP64_LOCATOR_SIG)
    {
        let loc = eocd - ZIP64_LOCATOR_LEN as u64;
        let z = tail.get64(loc + 8).ok_or_else(not_zip)?;
        if z.checked_add(ZIP64_EOCD_LEN as u64).is_none_or(|end| end > loc) {
            return Err(bad(
                path,
                "the zip64 end of central directory record is missing or misplaced",
            ));
        }
        let record = Window::read(file, path, z, z + ZIP64_EOCD_LEN as u64)?;
        if record.get32(z) != Some(ZIP64_EOCD_SIG) {
            return Err(bad(
                path,
                "the zip64 end of central directory record is missing or misplaced",
            ));
        }
        let g32 = |o| record.get32(z + o).map(u64::from).ok_or_else(not_zip);
        let g64 = |o| record.get64(z + o).ok_or_else(not_zip);
        if g32(16)? != 0 || g32(20)? != 0 || tail.get32(loc + 4) != Some(0) {
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
    // (cd_end_expected <= eocd < len: the whole central directory is inside the file)
    let cd = Window::read(file, path, cd_start, cd_end_expected)?;
    let mut centrals: Vec<Central> = Vec::with_capacity(count as usize);
    let mut names: HashMap<String, usize> = HashMap::with_capacity(count as usize);
    let mut dirs = HashSet::new();
    let mut p = cd_start;
    for _ in 0..count {
        let r = |o: u64| {
            cd.get16(p + o)
                .ok_or_else(|| bad(path, "a central directory record is truncated"))
        };
        let r32 = |o: u64| {
            cd.get32(p + o)
                .ok_or_else(|| bad(path, "a central directory record is truncated"))
        };
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
        let name_bytes = cd
            .bytes_at(p + CENTRAL_LEN as u64, n)
            .ok_or_else(|| bad(path, "truncated name"))?;
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
        // Only errors need the entry's path: made when one is raised.
        let at = || entry_path(path, &name);
        if names.contains_key(&name) {
            return Err(bad(&at(), format!("entry {name:?} appears twice in the archive")));
        }
        if r(34)? != 0 {
            return Err(Error::unsupported(
                at(),
                "multi-disk zip archives are not supported",
            ));
        }
        if flags & (FLAG_ENCRYPTED | 0x40) != 0 {
            return Err(Error::unsupported(at(), format!("entry {name:?} is encrypted")));
        }
        let extra = cd
            .bytes_at(p + CENTRAL_LEN as u64 + n, m)
            .ok_or_else(|| bad(path, "truncated extra field"))?;
        let wanted = [size, csize, header]
            .iter()
            .filter(|&&v| v == 0xFFFF_FFFF)
            .count();
        if wanted > 0 {
            let values = zip64_fields(extra, wanted).ok_or_else(|| {
                bad(
                    &at(),
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
                return Err(bad(&at(), format!("directory entry {name:?} has data")));
            }
            dirs.insert(dir.to_string());
            continue;
        }
        if header.checked_add(LOCAL_LEN + n).is_none_or(|end| end > cd_start) {
            return Err(bad(
                &at(),
                format!("entry {name:?}: no local header at offset {header}"),
            ));
        }
        names.insert(name.clone(), centrals.len());
        centrals.push(Central {
            name_bytes: name_bytes.to_vec(),
            entry: ZipEntry {
                name,
                method,
                flags,
                crc,
                csize,
                size,
                header,
                data: 0, // from the local header, below
                central,
            },
        });
    }
    drop(cd);
    check_local_headers(path, file, cd_start, &mut centrals)?;
    let entries: Vec<ZipEntry> = centrals.into_iter().map(|c| c.entry).collect();
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
    Ok((entries, names, dirs))
}

/// Reads every local header (in file order, neighbours closer than `HEADER_GAP` in one
/// `pread`), checks its signature, name and method against the central record, and sets the
/// entry's data offset, which must leave its payload inside the file before the central
/// directory.
fn check_local_headers(path: &Path, file: &File, cd_start: u64, centrals: &mut [Central]) -> Result<()> {
    let mut order: Vec<usize> = (0..centrals.len()).collect();
    order.sort_unstable_by_key(|&i| centrals[i].entry.header);
    let mut window: Option<Window> = None;
    for (pos, &i) in order.iter().enumerate() {
        let c = &centrals[i];
        let (header, n) = (c.entry.header, c.name_bytes.len() as u64);
        let need = header + LOCAL_LEN + n; // <= cd_start, checked with the central record
        if window.as_ref().is_none_or(|w| header < w.start || need > w.end()) {
            // Read this header and the following ones that lie close enough after it.
            let mut end = need;
            for &j in &order[pos + 1..] {
                let next = &centrals[j];
                let next_end = next.entry.header + LOCAL_LEN + next.name_bytes.len() as u64;
                if next.entry.header > end + HEADER_GAP || next_end - header > HEADER_READ {
                    break;
                }
                end = end.max(next_end);
            }
            window = Some(Window::read(file, path, header, end.min(cd_start))?);
        }
        let w = window.as_ref().expect("just read");
        let name = &c.entry.name;
        let at = || entry_path(path, name);
        if w.get32(header) != Some(LOCAL_SIG) {
            return Err(bad(
                &at(),
                format!("entry {name:?}: no local header at offset {header}"),
            ));
        }
        let ln = u64::from(w.get16(header + 26).unwrap_or(0));
        let lm = u64::from(w.get16(header + 28).unwrap_or(0));
        if ln != n || w.bytes_at(header + LOCAL_LEN, ln) != Some(&c.name_bytes[..]) {
            return Err(bad(
                &at(),
                format!("entry {name:?}: the local header names another file"),
            ));
        }
        if w.get16(header + 8) != Some(c.entry.method) {
            return Err(bad(
                &at(),
                format!("entry {name:?}: the local header's method differs from the directory's"),
            ));
        }
        let data = header + LOCAL_LEN + ln + lm;
        let csize = c.entry.csize;
        if data.checked_add(csize).is_none_or(|end| end > cd_start) {
            return Err(bad(
                &at(),
                format!("entry {name:?}: its data ({csize} bytes at {data}) runs past the entries"),
            ));
        }
        if c.entry.method == STORED && csize != c.entry.size {
            return Err(bad(
                &at(),
                format!(
                    "entry {name:?} is stored but its sizes differ ({csize} != {})",
                    c.entry.size
                ),
            ));
        }
        centrals[i].entry.data = data;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
