//! Writing `.tdz` archives (see `archive/mod.rs` for the format). No pyo3 here.
//!
//! The entries are planned first (names in tensordict's order, sizes, alignment padding,
//! deflate if asked), so every offset is known before a byte is written; the file is created
//! beside the target and sized. Then runs of small entries are assembled into buffers and
//! written with one pwrite each, big leaves are written straight from their source in chunks,
//! all on the writer pool, each computing its CRC-32 as it goes (piece by piece, while the
//! piece is still in cache); the headers of big leaves, the central directory and the end
//! records come last. Written ranges get their blocks from the writes themselves (a full disk
//! fails a write with ENOSPC, and the staging file goes); the ranges of contentless leaves
//! (`memmap_like`) are reserved with `fallocate` by their job, so a writable map of the new
//! archive never meets a hole on a full disk. A big archive on a disk file system (ext4, not
//! tmpfs) gets all its blocks with one `fallocate` first (`sys::prealloc`): on ext4 the writes
//! into a preallocated file were faster than the per-page delayed allocation they replace.
//! The file is renamed over the target (fsynced with `durable`). The staging file is locked
//! from its creation to the rename (`staging.rs`).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::archive::read::{load_archive, LeafData, Loaded};
use crate::archive::staging::{create_staging, sweep_stale};
use crate::archive::zip::{
    crc32, os_error, put16, put32, put64, zeros_crc, ALIGNMENT, CENTRAL_LEN, CENTRAL_SIG, DEFLATED, EOCD_SIG,
    EXTERNAL_ATTR, FLAG_UTF8, LOCAL_LEN, LOCAL_SIG, MADE_BY, PAD_EXTRA_ID, STORED, VERSION, ZIP64_EOCD_SIG,
    ZIP64_EXTRA_ID, ZIP64_LIMIT, ZIP64_LOCAL_EXTRA, ZIP64_LOCATOR_SIG,
};
use crate::error::{Error, Result};
use crate::format::{self, EntryMeta};
use crate::sys::dir::Dir;
use crate::sys::identity;
use crate::sys::pool;
use crate::sys::prealloc;
use crate::sys::storage::{self, MapMode};
use crate::tree::save::{self, EntrySpec, LeafSpec, NodeSpec};

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

/// Stored leaves at least this big are written straight from their source, in chunks.
const BIG_LEAF: u64 = 1 << 20;
const CHUNK: u64 = 16 << 20;
/// A chunk is checksummed and written in pieces of this size, each read from memory once
/// (the write copies it while the checksum left it in cache).
const PIECE: usize = 1 << 20;
/// Small entries are gathered into runs of about this many bytes, one pwrite each.
const RUN_BYTES: u64 = 4 << 20;

enum Body {
    Meta(Vec<u8>),
    /// A stored leaf, written from its source (or zeros).
    Leaf(usize),
    /// A compressed leaf, already deflated.
    Deflated(Vec<u8>),
}

struct Planned {
    name: String,
    body: Body,
    size: u64,
    csize: u64,
    method: u16,
    /// Padding bytes of the alignment block; None when the entry has no such block.
    pad: Option<u16>,
    crc: u32,
    header: u64,
    data: u64,
    /// The leaf this entry holds (for the returned views).
    leaf: Option<usize>,
}

impl Planned {
    fn extra_len(&self) -> u64 {
        self.pad.map_or(0, |p| 4 + u64::from(p)) + ZIP64_LOCAL_EXTRA
    }

    fn flags(&self) -> u16 {
        if self.name.is_ascii() {
            0
        } else {
            FLAG_UTF8
        }
    }

    fn is_big(&self) -> bool {
        matches!(self.body, Body::Leaf(_)) && self.size >= BIG_LEAF
    }

    fn local_header(&self, out: &mut Vec<u8>) {
        put32(out, LOCAL_SIG);
        put16(out, VERSION);
        put16(out, self.flags());
        put16(out, self.method);
        out.extend_from_slice(&[0; 4]); // time and date, patched by the caller
        put32(out, self.crc);
        put32(out, u32::MAX);
        put32(out, u32::MAX);
        put16(out, self.name.len() as u16);
        put16(out, self.extra_len() as u16);
        out.extend_from_slice(self.name.as_bytes());
        if let Some(pad) = self.pad {
            put16(out, PAD_EXTRA_ID);
            put16(out, pad);
            out.resize(out.len() + usize::from(pad), 0);
        }
        put16(out, ZIP64_EXTRA_ID);
        put16(out, 16);
        put64(out, self.size);
        put64(out, self.csize);
    }
}

/// Lists the entries of `node` (its directory in the archive is `dir`, "" or ending in "/"):
/// a tensorclass node is its meta.json, then its TensorDict in `_tensordict/`.
fn plan_node(dir: &str, node: &NodeSpec, leaves: &[LeafSpec<'_>], out: &mut Vec<Planned>) {
    match &node.class {
        Some(class) => {
            out.push(meta_entry(
                format!("{dir}{}", format::META_FILE),
                class.meta.clone(),
            ));
            plan_fields(&format!("{dir}{}/", format::TENSORCLASS_DIR), node, leaves, out);
        }
        None => plan_fields(dir, node, leaves, out),
    }
}

/// Lists the entries of the TensorDict `node` at `dir`.
fn plan_fields(dir: &str, node: &NodeSpec, leaves: &[LeafSpec<'_>], out: &mut Vec<Planned>) {
    let mut metas = Vec::with_capacity(node.entries.len());
    let mut files: Vec<(String, usize)> = Vec::new();
    let mut tables: Vec<(String, &[u8])> = Vec::new();
    let mut dirs: Vec<(String, &EntrySpec)> = Vec::new();
    for (key, entry) in &node.entries {
        match entry {
            EntrySpec::Leaf(i) => {
                let leaf = &leaves[*i];
                if leaf.nbytes > 0 {
                    files.push((format::portable_leaf_file(key), *i));
                }
                if let Some(nested) = &leaf.nested {
                    tables.push((
                        format::shape_file(&format::portable_leaf_file(key)),
                        &nested.table,
                    ));
                }
                metas.push((key.as_str(), leaf.entry_meta()));
            }
            EntrySpec::Node(child) => {
                dirs.push((format::portable_key(key), entry));
                metas.push((
                    key.as_str(),
                    match &child.class {
                        Some(class) => EntryMeta::TensorClass(&class.name),
                        None => EntryMeta::TensorDict,
                    },
                ));
            }
            EntrySpec::NonTensor(_) => {
                dirs.push((format::portable_key(key), entry));
                metas.push((key.as_str(), EntryMeta::NonTensorData));
            }
            EntrySpec::Stack(_) => {
                dirs.push((format::portable_key(key), entry));
                metas.push((key.as_str(), EntryMeta::NonTensorStack));
            }
        }
    }
    out.push(meta_entry(
        format!("{dir}{}", format::META_FILE),
        format::tensordict_meta(metas, &node.batch),
    ));
    files.sort();
    for (name, i) in files {
        out.push(Planned {
            name: format!("{dir}{name}"),
            body: Body::Leaf(i),
            size: leaves[i].nbytes as u64,
            csize: leaves[i].nbytes as u64,
            method: STORED,
            pad: Some(0),
            crc: 0,
            header: 0,
            data: 0,
            leaf: Some(i),
        });
    }
    tables.sort();
    for (name, table) in tables {
        out.push(meta_entry(format!("{dir}{name}"), table.to_vec()));
    }
    dirs.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, entry) in dirs {
        match entry {
            EntrySpec::Node(child) => plan_node(&format!("{dir}{name}/"), child, leaves, out),
            EntrySpec::NonTensor(value) => out.push(meta_entry(
                format!("{dir}{name}/{}", format::META_FILE),
                format::non_tensor_meta(value),
            )),
            EntrySpec::Stack(bytes) => out.push(meta_entry(
                format!("{dir}{name}/{}", format::META_FILE),
                bytes.clone(),
            )),
            EntrySpec::Leaf(_) => {}
        }
    }
}

fn meta_entry(name: String, bytes: Vec<u8>) -> Planned {
    Planned {
        name,
        size: bytes.len() as u64,
        csize: bytes.len() as u64,
        method: STORED,
        pad: None,
        crc: crc32(&bytes),
        header: 0,
        data: 0,
        leaf: None,
        body: Body::Meta(bytes),
    }
}

/// Gives every entry its offsets (alignment padding included); returns where the central
/// directory starts.
fn lay_out(entries: &mut [Planned]) -> Result<u64> {
    let mut at: u64 = 0;
    for e in entries.iter_mut() {
        if e.name.len() > usize::from(u16::MAX) {
            return Err(Error::tree(
                &e.name,
                "the entry name is too long for a zip archive",
            ));
        }
        e.header = at;
        if e.pad.is_some() {
            let unpadded = at + LOCAL_LEN + e.name.len() as u64 + 4 + ZIP64_LOCAL_EXTRA;
            e.pad = Some(((ALIGNMENT - unpadded % ALIGNMENT) % ALIGNMENT) as u16);
        }
        e.data = at + LOCAL_LEN + e.name.len() as u64 + e.extra_len();
        at = e
            .data
            .checked_add(e.csize)
            .ok_or_else(|| Error::tree(&e.name, "the archive would be too large"))?;
    }
    Ok(at)
}

/// The central directory and end records for entries starting at `cd_start`.
fn central_directory(entries: &[Planned], cd_start: u64, time: u16, date: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * (CENTRAL_LEN + 64) + 128);
    for e in entries {
        let mut zip64 = Vec::new();
        let (mut size32, mut csize32, mut off32) = (e.size as u32, e.csize as u32, e.header as u32);
        if e.size > ZIP64_LIMIT || e.csize > ZIP64_LIMIT {
            zip64.extend([e.size, e.csize]);
            size32 = u32::MAX;
            csize32 = u32::MAX;
        }
        if e.header > ZIP64_LIMIT {
            zip64.push(e.header);
            off32 = u32::MAX;
        }
        let pad_len = e.pad.map_or(0, |p| 4 + usize::from(p));
        let zip64_len = if zip64.is_empty() { 0 } else { 4 + 8 * zip64.len() };
        put32(&mut out, CENTRAL_SIG);
        put16(&mut out, MADE_BY);
        put16(&mut out, VERSION);
        put16(&mut out, e.flags());
        put16(&mut out, e.method);
        put16(&mut out, time);
        put16(&mut out, date);
        put32(&mut out, e.crc);
        put32(&mut out, csize32);
        put32(&mut out, size32);
        put16(&mut out, e.name.len() as u16);
        put16(&mut out, (zip64_len + pad_len) as u16);
        put16(&mut out, 0); // comment
        put16(&mut out, 0); // disk
        put16(&mut out, 0); // internal attributes
        put32(&mut out, EXTERNAL_ATTR);
        put32(&mut out, off32);
        out.extend_from_slice(e.name.as_bytes());
        if !zip64.is_empty() {
            put16(&mut out, ZIP64_EXTRA_ID);
            put16(&mut out, (8 * zip64.len()) as u16);
            for v in zip64 {
                put64(&mut out, v);
            }
        }
        if let Some(pad) = e.pad {
            put16(&mut out, PAD_EXTRA_ID);
            put16(&mut out, pad);
            out.resize(out.len() + usize::from(pad), 0);
        }
    }
    let cd_size = out.len() as u64;
    let count = entries.len() as u64;
    let cd_end = cd_start + cd_size;
    if count > 0xFFFF || cd_start > ZIP64_LIMIT || cd_size > ZIP64_LIMIT {
        put32(&mut out, ZIP64_EOCD_SIG);
        put64(&mut out, 44);
        put16(&mut out, VERSION);
        put16(&mut out, VERSION);
        put32(&mut out, 0);
        put32(&mut out, 0);
        put64(&mut out, count);
        put64(&mut out, count);
        put64(&mut out, cd_size);
        put64(&mut out, cd_start);
        put32(&mut out, ZIP64_LOCATOR_SIG);
        put32(&mut out, 0);
        put64(&mut out, cd_end);
        put32(&mut out, 1);
    }
    put32(&mut out, EOCD_SIG);
    put16(&mut out, 0);
    put16(&mut out, 0);
    put16(&mut out, count.min(0xFFFF) as u16);
    put16(&mut out, count.min(0xFFFF) as u16);
    put32(&mut out, cd_size.min(0xFFFF_FFFF) as u32);
    put32(&mut out, cd_start.min(0xFFFF_FFFF) as u32);
    put16(&mut out, 0);
    out
}

enum Job {
    /// Entries `first..last`, none of them big: one buffer, one pwrite.
    Run { first: usize, last: usize },
    /// A chunk of a big stored leaf, written straight from its source.
    Chunk { entry: usize, from: u64, len: u64 },
}

enum JobOut {
    Crcs(Vec<(usize, u32)>),
    Part {
        entry: usize,
        from: u64,
        crc: u32,
        len: u64,
    },
}

fn leaf_source<'a>(leaves: &[LeafSpec<'a>], body: &Body) -> Option<&'a [u8]> {
    match body {
        Body::Leaf(i) => leaves[*i].data,
        _ => None,
    }
}

fn run_job(
    job: &Job,
    entries: &[Planned],
    leaves: &[LeafSpec<'_>],
    file: &File,
    path: &Path,
    stamp: [u8; 4],
) -> Result<JobOut> {
    let io_err = |e| Error::io(path, e);
    match *job {
        Job::Run { first, last } => {
            let start = entries[first].header;
            let end = entries[last - 1].data + entries[last - 1].csize;
            let mut buf = Vec::with_capacity((end - start) as usize);
            let mut crcs = Vec::new();
            for (i, e) in entries.iter().enumerate().take(last).skip(first) {
                let mut e_crc = e.crc;
                if let Body::Leaf(_) = e.body {
                    e_crc = match leaf_source(leaves, &e.body) {
                        Some(data) => crc32(data),
                        None => zeros_crc(e.size),
                    };
                    crcs.push((i, e_crc));
                }
                let at = buf.len();
                e.local_header(&mut buf);
                buf[at + 10..at + 14].copy_from_slice(&stamp);
                buf[at + 14..at + 18].copy_from_slice(&e_crc.to_le_bytes());
                match &e.body {
                    Body::Meta(bytes) | Body::Deflated(bytes) => buf.extend_from_slice(bytes),
                    Body::Leaf(_) => match leaf_source(leaves, &e.body) {
                        Some(data) => buf.extend_from_slice(data),
                        None => buf.resize(buf.len() + e.size as usize, 0),
                    },
                }
            }
            storage::write_all_at(file, &buf, start).map_err(io_err)?;
            Ok(JobOut::Crcs(crcs))
        }
        Job::Chunk { entry, from, len } => {
            let e = &entries[entry];
            let crc = match leaf_source(leaves, &e.body) {
                Some(data) => {
                    let part = &data[from as usize..(from + len) as usize];
                    let mut h = crc32fast::Hasher::new();
                    let mut at = e.data + from;
                    for piece in part.chunks(PIECE) {
                        h.update(piece);
                        storage::write_all_at(file, piece, at).map_err(io_err)?;
                        at += piece.len() as u64;
                    }
                    h.finalize()
                }
                // The sized file reads as zeros here: reserve the blocks, checksum the zeros.
                None => {
                    reserve_range(file, e.data + from, len).map_err(io_err)?;
                    zeros_crc(len)
                }
            };
            Ok(JobOut::Part {
                entry,
                from,
                crc,
                len,
            })
        }
    }
}

fn plan_jobs(entries: &[Planned]) -> Vec<Job> {
    let mut jobs = Vec::new();
    let mut first: Option<usize> = None;
    let mut bytes = 0;
    for (i, e) in entries.iter().enumerate() {
        if e.is_big() {
            if let Some(f) = first.take() {
                jobs.push(Job::Run { first: f, last: i });
            }
            bytes = 0;
            let mut from = 0;
            while from < e.size {
                let len = CHUNK.min(e.size - from);
                jobs.push(Job::Chunk { entry: i, from, len });
                from += len;
            }
            continue;
        }
        first.get_or_insert(i);
        bytes += e.data + e.csize - e.header;
        if bytes >= RUN_BYTES {
            jobs.push(Job::Run {
                first: first.take().unwrap_or(i),
                last: i + 1,
            });
            bytes = 0;
        }
    }
    if let Some(f) = first {
        jobs.push(Job::Run {
            first: f,
            last: entries.len(),
        });
    }
    jobs
}

/// Reserves the blocks of `len` bytes at `offset` of a sized file (they read as zeros), so
/// that writes through a shared map of them cannot fail on a full disk. A no-op where the
/// file system has no `fallocate` (the range stays a hole, as a sized file's is).
#[cfg(target_os = "linux")]
fn reserve_range(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use rustix::fs::{fallocate, FallocateFlags};
    match fallocate(file, FallocateFlags::KEEP_SIZE, offset, len) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS | rustix::io::Errno::INVAL) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(not(target_os = "linux"))]
fn reserve_range(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Ok(())
}

/// The real file a target names: a symlink given as the target is resolved once.
fn resolve_target(path: &Path) -> Result<PathBuf> {
    let absolute = std::path::absolute(path).map_err(|e| Error::io(path, e))?;
    match std::fs::symlink_metadata(&absolute) {
        Ok(md) if md.file_type().is_symlink() => {
            std::fs::canonicalize(&absolute).map_err(|e| Error::io(&absolute, e))
        }
        _ => Ok(absolute),
    }
}

/// Writes the tree as an archive at `target`, atomically, and maps it for the leaves.
pub fn write_archive(
    target: &Path,
    root: &NodeSpec,
    leaves: &[LeafSpec<'_>],
    opts: ArchiveOptions,
) -> Result<Loaded> {
    save::validate(root, leaves, target)?;
    let target = resolve_target(target)?;
    let old = match std::fs::symlink_metadata(&target) {
        Ok(md) if md.is_dir() => {
            return Err(Error::io(&target, os_error(21, io::ErrorKind::IsADirectory)));
        }
        Ok(md) => Some(md),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(&target, e)),
    };
    if old.is_some() && !opts.existsok {
        return Err(Error::io(&target, os_error(17, io::ErrorKind::AlreadyExists)));
    }
    let parent_path = target
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let base = target
        .file_name()
        .ok_or_else(|| Error::tree(&target, "the archive path must name a file"))?
        .to_string_lossy()
        .into_owned();
    std::fs::create_dir_all(&parent_path).map_err(|e| Error::io(&parent_path, e))?;
    let parent = Dir::open(&parent_path).map_err(|e| Error::io(&parent_path, e))?;
    let (staging, file) = create_staging(&parent, &base)?;
    let staging_path = parent.child_path(&staging);
    let result = fill(&file, &staging_path, root, leaves, opts).and_then(|entries| {
        if let Some(md) = &old {
            file.set_permissions(md.permissions())
                .map_err(|e| Error::io(&staging_path, e))?;
        }
        if opts.durable {
            file.sync_all().map_err(|e| Error::io(&staging_path, e))?;
        }
        let len = file.metadata().map_err(|e| Error::io(&staging_path, e))?.len() as usize;
        let identity = identity::of_file(&file).map_err(|e| Error::io(&staging_path, e))?;
        let region = if opts.compression == Compression::Stored {
            Some(
                storage::map_file(&file, len, Some(target.clone()), opts.mode)
                    .map_err(|e| Error::io(&staging_path, e))?
                    .as_archive(identity),
            )
        } else {
            None
        };
        std::fs::rename(&staging_path, &target).map_err(|e| Error::io(&target, e))?;
        if opts.durable {
            parent.sync().map_err(|e| Error::io(&parent_path, e))?;
        }
        Ok((entries, region))
    });
    let (entries, region) = match result {
        Ok(done) => done,
        Err(e) => {
            // Our failed staging file beside the target; the target itself is untouched. If
            // the removal fails, the file (locked name, ours) is swept by the next save.
            let _ = parent.remove_file(&staging);
            return Err(e);
        }
    };
    sweep_stale(&parent, &base);
    drop(file);
    let Some(region) = region else {
        // Compressed leaves are copies either way: read them back like any archive.
        return load_archive(&target, opts.mode);
    };
    let mut out: Vec<Option<LeafData>> = std::iter::repeat_with(|| None).take(leaves.len()).collect();
    for e in &entries {
        if let Some(i) = e.leaf {
            out[i] = Some(LeafData::View {
                offset: e.data as usize,
                len: e.size as usize,
            });
        }
    }
    Ok(Loaded {
        region: Arc::new(region),
        leaves: out,
        copied: Vec::new(),
    })
}

/// Fills the new archive file; returns the entries with their offsets and CRCs.
fn fill(
    file: &File,
    path: &Path,
    root: &NodeSpec,
    leaves: &[LeafSpec<'_>],
    opts: ArchiveOptions,
) -> Result<Vec<Planned>> {
    let mut entries = Vec::new();
    plan_node("", root, leaves, &mut entries);
    if let Compression::Deflate(level) = opts.compression {
        let idx: Vec<usize> = (0..entries.len())
            .filter(|&i| entries[i].leaf.is_some())
            .collect();
        let workers = pool::worker_count(opts.num_threads, idx.len());
        let packed = pool::run(
            &idx,
            workers,
            |&i| entries[i].size as usize,
            |&i| {
                let leaf = &leaves[entries[i].leaf.unwrap_or(0)];
                let zeros;
                let data = match leaf.data {
                    Some(d) => d,
                    None => {
                        zeros = vec![0u8; leaf.nbytes];
                        &zeros
                    }
                };
                Ok((crc32(data), miniz_oxide::deflate::compress_to_vec(data, level)))
            },
        )?;
        for (&i, (crc, bytes)) in idx.iter().zip(packed) {
            let e = &mut entries[i];
            e.crc = crc;
            e.csize = bytes.len() as u64;
            e.method = DEFLATED;
            e.pad = None;
            e.body = Body::Deflated(bytes);
        }
    }
    let cd_start = lay_out(&mut entries)?;
    let mut stamp = [0u8; 4];
    stamp[..2].copy_from_slice(&opts.dos_time.to_le_bytes());
    stamp[2..].copy_from_slice(&opts.dos_date.to_le_bytes());
    // The central directory's size does not depend on the CRCs: the file gets its final size
    // now (blocks come with the writes, and with `reserve_range` for contentless leaves).
    let tail_len = central_directory(&entries, cd_start, opts.dos_time, opts.dos_date).len() as u64;
    let total =
        usize::try_from(cd_start + tail_len).map_err(|_| Error::tree(path, "the archive is too large"))?;
    file.set_len(total as u64).map_err(|e| Error::io(path, e))?;
    // A big archive on a disk file system gets its blocks in one call first (`sys::prealloc`);
    // a full disk fails here, before anything is written.
    prealloc::preallocate_range(file, 0, total as u64, total).map_err(|e| Error::io(path, e))?;
    let jobs = plan_jobs(&entries);
    let workers = pool::worker_count(opts.num_threads, jobs.len());
    let outs = pool::run(
        &jobs,
        workers,
        |job| match job {
            Job::Run { first, last } => {
                (entries[*last - 1].data + entries[*last - 1].csize - entries[*first].header) as usize
            }
            Job::Chunk { len, .. } => *len as usize,
        },
        |job| run_job(job, &entries, leaves, file, path, stamp),
    )?;
    let mut parts: HashMap<usize, Vec<(u64, u32, u64)>> = HashMap::new();
    for out in outs {
        match out {
            JobOut::Crcs(crcs) => {
                for (i, crc) in crcs {
                    entries[i].crc = crc;
                }
            }
            JobOut::Part {
                entry,
                from,
                crc,
                len,
            } => parts.entry(entry).or_default().push((from, crc, len)),
        }
    }
    let mut headers = Vec::new();
    for (entry, mut pieces) in parts {
        pieces.sort_unstable();
        let mut h = crc32fast::Hasher::new();
        for (_, crc, len) in pieces {
            h.combine(&crc32fast::Hasher::new_with_initial_len(crc, len));
        }
        let e = &mut entries[entry];
        e.crc = h.finalize();
        headers.clear();
        e.local_header(&mut headers);
        headers[10..14].copy_from_slice(&stamp);
        storage::write_all_at(file, &headers, e.header).map_err(|err| Error::io(path, err))?;
    }
    let tail = central_directory(&entries, cd_start, opts.dos_time, opts.dos_date);
    storage::write_all_at(file, &tail, cd_start).map_err(|e| Error::io(path, e))?;
    Ok(entries)
}

#[cfg(all(test, unix))]
mod tests;
