//! The index of a `.tdz` archive, parsed and validated: the end records (zip64 ones
//! included), the central directory and every local header, read with `pread` in windows.
//! No pyo3 here.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::Path;

use super::{
    bad, bytes_at, check_name, entry_path, get16, get32, get64, read_at, ZipEntry, CENTRAL_LEN, CENTRAL_SIG,
    EOCD_LEN, EOCD_SIG, FLAG_ENCRYPTED, LOCAL_LEN, LOCAL_SIG, STORED, ZIP64_EOCD_LEN, ZIP64_EOCD_SIG,
    ZIP64_EXTRA_ID, ZIP64_LOCATOR_LEN, ZIP64_LOCATOR_SIG,
};
use crate::error::{Error, Result};

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

/// What `index` gives: the entries, the position of each name, the names of directory entries.
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

/// Parses and validates the end records, the central directory and every local header.
pub(super) fn index(path: &Path, file: &File, len: u64) -> Result<Index> {
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
