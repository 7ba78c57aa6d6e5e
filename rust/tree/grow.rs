//! Trees that grow in place along their first batch dim, and incremental copies of their
//! files (issue 24: `extend_`/`resize_`/`checkpoint`). No pyo3.
//!
//! Growth keeps every leaf's rows in the leaf's own file, with room reserved past the last
//! committed row: a file longer than its leaf loads here and in tensordict (both map the
//! first `shape x itemsize` bytes). New rows are written into the reservation first, then
//! `meta.json` is replaced atomically (written beside it, renamed over it): the rename is the
//! commit point, so a reader (or a process killed at any instant) sees the old number of rows
//! or the new one, never a torn row. Files never shrink, so maps taken before a growth or a
//! shrink stay valid.
//!
//! A checkpoint copies into a second directory only the byte ranges the caller names
//! (`sync_file`), hashes fixed-size chunks of a file to find changes that no tracker saw
//! (`chunk_hashes`), and swaps two sibling directories in one step (`exchange_dirs`).

use std::fs::File;
use std::io;
use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::format;
use crate::sys::dir::Dir;
use crate::sys::identity::{self, FileId};
use crate::tree::commit;
use crate::tree::load::split_file_path;

/// Piece size of the copies in `sync_file` and of the reads in `chunk_hashes`.
const COPY_PIECE: usize = 8 << 20;

/// Makes the data file at `path` at least `nbytes` long, with real blocks behind the new
/// bytes (`fallocate`, so a full disk fails here with ENOSPC, not later with SIGBUS through a
/// map); never shortens it. Returns the file's length afterwards.
pub fn reserve_file(path: &Path, nbytes: u64) -> Result<u64> {
    let (dir, name) = split_file_path(path)?;
    let io_err = |e| Error::io(path, e);
    let (file, writable) = dir.open_file(&name).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    if len >= nbytes {
        return Ok(len);
    }
    if !writable {
        return Err(Error::tree(path, "the data file is read-only: it cannot grow"));
    }
    extend(&file, len, nbytes).map_err(io_err)?;
    Ok(nbytes)
}

#[cfg(target_os = "linux")]
fn extend(file: &File, from: u64, to: u64) -> io::Result<()> {
    use rustix::fs::{fallocate, FallocateFlags};
    match fallocate(file, FallocateFlags::empty(), from, to - from) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS | rustix::io::Errno::INVAL) => {
            file.set_len(to)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(not(target_os = "linux"))]
fn extend(file: &File, _from: u64, to: u64) -> io::Result<()> {
    file.set_len(to)
}

/// One leaf of a growing tree as the caller sees it: its key, dtype (`torch.float32`) and the
/// dims after the first.
pub struct GrowLeaf<'a> {
    pub key: &'a str,
    pub dtype: &'a str,
    pub tail: &'a [u64],
}

/// One write of a growth: `data` at `offset` of the directory's data file `name`, which must
/// still be the file `identity` (the one the caller maps; None: any).
pub struct GrowWrite<'a> {
    pub name: &'a str,
    pub offset: u64,
    /// The bytes to write; empty with `zeros > 0`: that many zero bytes (new rows of a
    /// `resize_`, written from one small buffer, never made in memory whole).
    pub data: &'a [u8],
    pub zeros: u64,
    pub identity: Option<FileId>,
}

/// One growth of the flat tree at `prefix`, under the lock saves take: checks that the
/// directory still is the tree the caller sees (its meta.json holds `expect` rows and exactly
/// the `leaves`, with their dtypes and trailing dims, and each data file written is still the
/// file the caller maps: another process may have grown, shrunk or saved another tree there
/// since), writes each of `writes` into its existing data file (`pwrite` from the source
/// memory: no page fault per page, as writing through a fresh map of the reservation would
/// cost), then commits `rows` rows: the batch size's first dim and every leaf's, in a meta.json
/// replaced in one step (the commit point). Returns None when committed, or the rows the
/// directory holds when it is not the caller's tree (then nothing was written, and the
/// caller reloads it). With `durable` the data, the meta.json and the directory are fsynced.
/// Refuses a tree with sub-directories (their meta.json files could not change in the same
/// step) and leaves whose first dim is not the batch's.
pub fn grow_rows(
    prefix: &Path,
    expect: u64,
    rows: u64,
    leaves: &[GrowLeaf<'_>],
    writes: &[GrowWrite<'_>],
    durable: bool,
) -> Result<Option<u64>> {
    let dir = Dir::open(prefix).map_err(|e| Error::io(prefix, e))?;
    let _lock = commit::SaveLock::acquire(&dir)?;
    let path = dir.child_path(format::META_FILE);
    let bytes = dir
        .read_limited(format::META_FILE, format::META_LIMIT)
        .map_err(|e| Error::io(&path, e))?;
    let mut meta: Value =
        serde_json::from_slice(&bytes).map_err(|e| Error::invalid(&path, format!("not JSON: {e}")))?;
    let old = batch_rows(&meta, &path)?;
    if old != expect || !same_leaves(&meta, leaves) {
        return Ok(Some(old));
    }
    let mut files = Vec::with_capacity(writes.len());
    for write in writes {
        let file_path = dir.child_path(write.name);
        let io_err = |e| Error::io(&file_path, e);
        let (file, writable) = match dir.open_file(write.name) {
            Ok(opened) => opened,
            // the file of a leaf that meta.json still lists is gone: not the caller's tree
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Some(old)),
            Err(e) => return Err(io_err(e)),
        };
        if write.identity.is_some() && write.identity != Some(identity::of_file(&file).map_err(io_err)?) {
            return Ok(Some(old)); // another save replaced the file: the caller maps the old one
        }
        if !writable {
            return Err(Error::tree(
                &file_path,
                "the data file is read-only: it cannot grow",
            ));
        }
        files.push((file_path, file));
    }
    for ((file_path, file), write) in files.iter().zip(writes) {
        let io_err = |e| Error::io(file_path, e);
        if write.data.is_empty() && write.zeros > 0 {
            write_zeros(file, write.offset, write.zeros).map_err(io_err)?;
        } else {
            crate::sys::storage::write_all_at(file, write.data, write.offset).map_err(io_err)?;
        }
        if durable {
            file.sync_data().map_err(io_err)?;
        }
    }
    set_first_dims(&mut meta, old, rows, &path)?;
    let out = format::write::to_json_bytes(&meta);
    replace_file(&dir, format::META_FILE, &out, durable).map_err(|e| Error::io(&path, e))?;
    Ok(None)
}

/// Whether the leaf entries of a flat tree's meta.json are exactly `leaves`: the same keys,
/// each with the same dtype and the same dims after the first (anything else there, a
/// sub-directory's entry or a nested leaf's, is not).
fn same_leaves(meta: &Value, leaves: &[GrowLeaf<'_>]) -> bool {
    let Some(obj) = meta.as_object() else {
        return false;
    };
    let entries: Vec<(&String, &Value)> = obj.iter().filter(|(_, v)| v.is_object()).collect();
    entries.len() == leaves.len()
        && leaves.iter().all(|leaf| {
            let Some(entry) = obj.get(leaf.key).and_then(Value::as_object) else {
                return false;
            };
            let tail: Option<Vec<u64>> = entry
                .get("shape")
                .and_then(Value::as_array)
                .and_then(|s| s.get(1..))
                .and_then(|t| t.iter().map(Value::as_u64).collect());
            !entry.contains_key("type")
                && entry.get("dtype").and_then(Value::as_str) == Some(leaf.dtype)
                && tail.as_deref() == Some(leaf.tail)
        })
}

/// The first dim of the batch size in a meta.json (`path` for messages).
fn batch_rows(meta: &Value, path: &Path) -> Result<u64> {
    let bad = |m: &str| Error::invalid(path, m);
    let first = meta
        .as_object()
        .ok_or_else(|| bad("not a JSON object"))?
        .get("shape")
        .and_then(|s| s.as_array())
        .and_then(|s| s.first())
        .ok_or_else(|| bad("no first batch dim: a tree grows along its first batch dim"))?;
    first
        .as_u64()
        .ok_or_else(|| bad("a batch size that is not a list of ints"))
}

/// Sets the first dim of the batch size and of every tensor leaf of a flat tree's meta.json
/// from `old` to `rows`.
fn set_first_dims(meta: &mut Value, old: u64, rows: u64, path: &Path) -> Result<()> {
    let bad = |m: String| Error::invalid(path, m);
    let obj = meta
        .as_object_mut()
        .ok_or_else(|| bad("not a JSON object".into()))?;
    for (key, entry) in obj.iter_mut() {
        let Some(entry) = entry.as_object_mut() else {
            continue;
        };
        if entry.contains_key("type") {
            return Err(bad(format!(
                "key {key:?} is a sub-directory: only a tree whose entries are all tensors grows"
            )));
        }
        if entry.get("is_nested").and_then(Value::as_bool) == Some(true) {
            return Err(bad(format!("key {key:?} is a nested tensor: it cannot grow")));
        }
        let Some(first) = entry
            .get_mut("shape")
            .and_then(|s| s.as_array_mut())
            .and_then(|s| s.first_mut())
        else {
            return Err(bad(format!("key {key:?} has no first dim")));
        };
        if first.as_u64() != Some(old) {
            return Err(bad(format!(
                "key {key:?}: its first dim is not the batch's {old}"
            )));
        }
        *first = Value::from(rows);
    }
    if let Some(first) = obj
        .get_mut("shape")
        .and_then(|s| s.as_array_mut())
        .and_then(|s| s.first_mut())
    {
        *first = Value::from(rows);
    }
    Ok(())
}

/// Writes `len` zero bytes at `offset` of `file`, 1 MiB at a time.
fn write_zeros(file: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK.min(len) as usize];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(CHUNK) as usize;
        crate::sys::storage::write_all_at(file, &zeros[..n], offset + at)?;
        at += n as u64;
    }
    Ok(())
}

/// Replaces `dir/name` with `bytes` in one step (a temporary beside it, exchanged with it).
fn replace_file(dir: &Dir, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    let temp = format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        crate::sys::storage::random_suffix()
    );
    dir.write_new(&temp, bytes, durable)?;
    // An exchange, then the old file (now at the temporary name) removed: a rename over the
    // old file would do too, but ext4 then writes the new file back inside the rename
    // (`auto_da_alloc`), milliseconds per commit under I/O load, paid by every `extend_`.
    // Where there is no exchange, the rename. A leftover temporary is never read.
    let swapped = dir.exchange(&temp, dir, name).is_ok();
    let done = if swapped {
        Ok(())
    } else {
        dir.rename(&temp, dir, name, false)
    };
    if swapped || done.is_err() {
        let _ = dir.remove_file(&temp);
    }
    done?;
    if durable {
        dir.sync()?;
    }
    Ok(())
}

/// Writes `data` at `offset` of the existing data file `path`, which must still be the file
/// `identity` (the one the caller maps: a file replaced since is refused, naming it): a
/// positioned write goes into the same page cache as the caller's map of the file without
/// faulting its pages in one by one, which is most of the cost of a first write through a
/// fresh map (`map`'s workers writing their chunks into a memory-mapped `out`).
pub fn write_existing(path: &Path, identity: FileId, offset: u64, data: &[u8]) -> Result<()> {
    let (dir, name) = split_file_path(path)?;
    let io_err = |e| Error::io(path, e);
    let (file, writable) = dir.open_file(&name).map_err(io_err)?;
    if identity::of_file(&file).map_err(io_err)? != identity {
        return Err(Error::tree(
            path,
            "the data file was replaced since it was mapped: not written",
        ));
    }
    if !writable {
        return Err(Error::tree(path, "the data file is read-only"));
    }
    let end = offset.saturating_add(data.len() as u64);
    if file.metadata().map_err(io_err)?.len() < end {
        return Err(Error::tree(
            path,
            format!("the data file is shorter than the {end} bytes the write reaches"),
        ));
    }
    crate::sys::storage::write_all_at(&file, data, offset).map_err(io_err)
}

/// Brings the file `dst` up to date with `src`: copies the byte `ranges` (`(offset, len)`,
/// clipped to `len`; None: all of it), then sets `dst`'s size to exactly `len`. `dst` is
/// created when missing (then every byte is copied). Returns the bytes written.
pub fn sync_file(
    src: &Path,
    dst: &Path,
    ranges: Option<&[(u64, u64)]>,
    len: u64,
    durable: bool,
) -> Result<u64> {
    let (sdir, sname) = split_file_path(src)?;
    let (ddir, dname) = split_file_path(dst)?;
    let source = sdir.open_read(&sname).map_err(|e| Error::io(src, e))?;
    let have = source.metadata().map_err(|e| Error::io(src, e))?.len();
    if have < len {
        return Err(Error::tree(
            src,
            format!("holds {have} bytes, fewer than the {len} to copy"),
        ));
    }
    let (target, fresh) = match ddir.open_file(&dname) {
        Ok((f, true)) => (f, false),
        Ok((_, false)) => return Err(Error::tree(dst, "the checkpoint's file is read-only")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            (ddir.create_file(&dname).map_err(|e| Error::io(dst, e))?, true)
        }
        Err(e) => return Err(Error::io(dst, e)),
    };
    let old = target.metadata().map_err(|e| Error::io(dst, e))?.len();
    let all = [(0, len)];
    let ranges = if fresh { &all[..] } else { ranges.unwrap_or(&all) };
    let mut written = 0u64;
    let mut buf = vec![0u8; COPY_PIECE];
    if old > len {
        target.set_len(len).map_err(|e| Error::io(dst, e))?;
    }
    for &(start, n) in ranges {
        let end = start.saturating_add(n).min(len);
        let mut at = start;
        while at < end {
            let piece = ((end - at) as usize).min(COPY_PIECE);
            read_exact_at(&source, &mut buf[..piece], at).map_err(|e| Error::io(src, e))?;
            crate::sys::storage::write_all_at(&target, &buf[..piece], at).map_err(|e| Error::io(dst, e))?;
            at += piece as u64;
            written += piece as u64;
        }
    }
    if target.metadata().map_err(|e| Error::io(dst, e))?.len() != len {
        target.set_len(len).map_err(|e| Error::io(dst, e))?;
    }
    if durable {
        target.sync_all().map_err(|e| Error::io(dst, e))?;
    }
    Ok(written)
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(buf, offset)
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        let n = file.seek_read(buf, offset)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf = &mut buf[n..];
        offset += n as u64;
    }
    Ok(())
}

/// One 64-bit hash per `chunk` bytes of the first `len` bytes of `path` (the last chunk may be
/// shorter): two CRC-32s, of each half of the chunk, with the chunk's length folded in.
pub fn chunk_hashes(path: &Path, len: u64, chunk: u64) -> Result<Vec<u64>> {
    if chunk == 0 {
        return Err(Error::tree(path, "the chunk size must be positive"));
    }
    let (dir, name) = split_file_path(path)?;
    let file = dir.open_read(&name).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::with_capacity(len.div_ceil(chunk) as usize);
    let mut buf = vec![0u8; chunk.min(COPY_PIECE as u64 * 4) as usize];
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(chunk);
        let (mut lo, mut hi) = (crc32fast::Hasher::new(), crc32fast::Hasher::new());
        let half = n / 2;
        let mut done = 0u64;
        while done < n {
            let piece = ((n - done) as usize).min(buf.len());
            read_exact_at(&file, &mut buf[..piece], at + done).map_err(|e| Error::io(path, e))?;
            // split the piece at the chunk's middle
            let cut = half.saturating_sub(done).min(piece as u64) as usize;
            lo.update(&buf[..cut]);
            hi.update(&buf[cut..piece]);
            done += piece as u64;
        }
        hi.update(&n.to_le_bytes());
        out.push(((lo.finalize() as u64) << 32) | hi.finalize() as u64);
        at += n;
    }
    Ok(out)
}

/// Exchanges two directories of the same parent in one step (`renameat2(RENAME_EXCHANGE)`):
/// each name then holds the other's tree, and at no instant is either name missing or half
/// of each. With `durable` the parent is fsynced. Fails where the system has no exchange.
pub fn exchange_dirs(parent: &Path, a: &str, b: &str, durable: bool) -> Result<()> {
    let dir = Dir::open(parent).map_err(|e| Error::io(parent, e))?;
    dir.exchange(a, &dir, b)
        .map_err(|e| Error::io(dir.child_path(a), e))?;
    if durable {
        dir.sync().map_err(|e| Error::io(parent, e))?;
    }
    Ok(())
}

/// Moves directory `a` of `parent` to the free name `b` (fails if `b` exists).
pub fn rename_new(parent: &Path, a: &str, b: &str, durable: bool) -> Result<()> {
    let dir = Dir::open(parent).map_err(|e| Error::io(parent, e))?;
    dir.rename(a, &dir, b, true)
        .map_err(|e| Error::io(dir.child_path(b), e))?;
    if durable {
        dir.sync().map_err(|e| Error::io(parent, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tdrs-grow-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const A: [GrowLeaf<'static>; 1] = [GrowLeaf {
        key: "a",
        dtype: "torch.float32",
        tail: &[2],
    }];

    fn write_a(data: &[u8], identity: Option<FileId>) -> [GrowWrite<'_>; 1] {
        [GrowWrite {
            name: "a.memmap",
            offset: 24,
            data,
            zeros: 0,
            identity,
        }]
    }

    #[test]
    fn grow_rows_writes_then_rewrites_batch_and_leaves() {
        let d = temp("rows");
        std::fs::write(
            d.join("meta.json"),
            br#"{"a": {"device": "cpu", "shape": [3, 2], "dtype": "torch.float32", "is_nested": false}, "shape": [3], "device": "cpu"}"#,
        )
        .unwrap();
        std::fs::write(d.join("a.memmap"), [0u8; 24]).unwrap();
        // another count of rows than the caller expects: nothing is written
        assert_eq!(
            grow_rows(&d, 2, 7, &A, &write_a(&[1u8; 32], None), false).unwrap(),
            Some(3)
        );
        assert_eq!(std::fs::read(d.join("a.memmap")).unwrap().len(), 24);
        assert_eq!(
            grow_rows(&d, 3, 7, &A, &write_a(&[1u8; 32], None), false).unwrap(),
            None
        );
        assert_eq!(std::fs::read(d.join("a.memmap")).unwrap()[24..], [1u8; 32]);
        let text = std::fs::read_to_string(d.join("meta.json")).unwrap();
        assert_eq!(
            text,
            r#"{"a": {"device": "cpu", "shape": [7, 2], "dtype": "torch.float32", "is_nested": false}, "shape": [7], "device": "cpu"}"#
        );
        std::fs::write(
            d.join("meta.json"),
            br#"{"b": {"type": "TensorDict"}, "shape": [3]}"#,
        )
        .unwrap();
        assert_eq!(grow_rows(&d, 3, 7, &[], &[], false).unwrap(), Some(3));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn grow_rows_writes_nothing_into_another_tree() {
        let d = temp("other");
        let meta = |extra: &str| {
            format!(r#"{{"a": {{"shape": [3, 2], "dtype": "torch.float32"}}{extra}, "shape": [3]}}"#)
        };
        std::fs::write(d.join("a.memmap"), [0u8; 24]).unwrap();
        let id = identity::of_path(&d.join("a.memmap")).unwrap();
        let other_trees = [
            meta(r#", "b": {"shape": [3], "dtype": "torch.int64"}"#), // a key more
            r#"{"a": {"shape": [3, 4], "dtype": "torch.float32"}, "shape": [3]}"#.to_string(),
            r#"{"a": {"shape": [3, 2], "dtype": "torch.float64"}, "shape": [3]}"#.to_string(),
            r#"{"c": {"shape": [3, 2], "dtype": "torch.float32"}, "shape": [3]}"#.to_string(),
        ];
        for text in &other_trees {
            std::fs::write(d.join("meta.json"), text).unwrap();
            assert_eq!(
                grow_rows(&d, 3, 5, &A, &write_a(&[1u8; 16], Some(id)), false).unwrap(),
                Some(3),
                "{text}"
            );
            assert_eq!(std::fs::read(d.join("a.memmap")).unwrap(), [0u8; 24]);
            assert_eq!(std::fs::read_to_string(d.join("meta.json")).unwrap(), *text);
        }
        // the same layout, but the data file replaced since the caller mapped it
        std::fs::write(d.join("meta.json"), meta("")).unwrap();
        std::fs::rename(d.join("a.memmap"), d.join("old")).unwrap();
        std::fs::write(d.join("a.memmap"), [0u8; 24]).unwrap();
        assert_eq!(
            grow_rows(&d, 3, 5, &A, &write_a(&[1u8; 16], Some(id)), false).unwrap(),
            Some(3)
        );
        assert_eq!(std::fs::read(d.join("a.memmap")).unwrap(), [0u8; 24]);
        let new_id = identity::of_path(&d.join("a.memmap")).unwrap();
        assert_eq!(
            grow_rows(&d, 3, 5, &A, &write_a(&[1u8; 16], Some(new_id)), false).unwrap(),
            None
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn write_existing_writes_only_into_the_file_mapped() {
        let d = temp("existing");
        let path = d.join("a.memmap");
        std::fs::write(&path, [0u8; 16]).unwrap();
        let id = identity::of_path(&path).unwrap();
        write_existing(&path, id, 4, &[7u8; 8]).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            [[0u8; 4], [7; 4], [7; 4], [0; 4]].concat()
        );
        assert!(write_existing(&path, id, 12, &[1u8; 8]).is_err()); // past the end
        std::fs::rename(&path, d.join("old")).unwrap();
        std::fs::write(&path, [0u8; 16]).unwrap();
        assert!(write_existing(&path, id, 0, &[1u8; 4]).is_err()); // replaced since
        assert_eq!(std::fs::read(&path).unwrap(), [0u8; 16]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn sync_copies_ranges_and_sets_length() {
        let d = temp("sync");
        let data: Vec<u8> = (0..100u8).collect();
        std::fs::write(d.join("src"), &data).unwrap();
        assert_eq!(
            sync_file(&d.join("src"), &d.join("dst"), Some(&[]), 100, false).unwrap(),
            100
        );
        let mut changed = data.clone();
        changed[10..20].fill(9);
        std::fs::write(d.join("src"), &changed).unwrap();
        assert_eq!(
            sync_file(&d.join("src"), &d.join("dst"), Some(&[(10, 10)]), 60, false).unwrap(),
            10
        );
        assert_eq!(std::fs::read(d.join("dst")).unwrap(), changed[..60]);
        let h = chunk_hashes(&d.join("src"), 100, 30).unwrap();
        assert_eq!(h.len(), 4);
        assert_eq!(reserve_file(&d.join("src"), 200).unwrap(), 200);
        assert_eq!(reserve_file(&d.join("src"), 50).unwrap(), 200);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
