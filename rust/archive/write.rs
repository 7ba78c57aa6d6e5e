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
//! from its creation to the rename (`sys/staging.rs`).
//!
//! `write/layout.rs` lists the entries and lays them out (offsets, alignment padding) and makes
//! their local headers, the central directory and the end records; the writes are here.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::archive::read::{load_archive, LeafData, Loaded};
use crate::archive::zip::{crc32, os_error, zeros_crc, DEFLATED};
use crate::error::{Error, Result};
use crate::sys::dir::Dir;
use crate::sys::identity;
use crate::sys::pool;
use crate::sys::prealloc;
use crate::sys::staging::{create_staging, resolve_target, sweep_stale};
use crate::sys::storage::{self, MapMode};
use crate::tree::save::{self, LeafSpec, NodeSpec};

mod layout;

use layout::{central_directory, lay_out, plan_node, Body, Planned};

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
