//! Memory maps and the files behind them: the `Region` every map is, mapping files (shared,
//! copy-on-write, read-only), reserving their space, positioned writes, temporary names.
//! Anonymous memory (`anon`) is made of the same regions, and so is memory another owner lends
//! (`Region::borrowed`: a buffer received from another library, kept alive by its owner).
//!
//! Every map is created with its space already reserved (written, or `fallocate`d), so that a
//! full file system shows up as an `ENOSPC` error at creation and never as a SIGBUS on first
//! touch. File maps close their descriptor as soon as the map exists: a tree of 10,000 leaves
//! keeps no descriptor open. Anonymous memory keeps one per arena, to share it.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{Error, Result};
use crate::sys::identity::{self, FileId};

/// How a file is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapMode {
    /// `MAP_SHARED`, read-write: writes reach the file and every other mapping of it.
    Shared,
    /// `MAP_PRIVATE`: a read-only file, mapped writable copy-on-write; writes stay private.
    CopyOnWrite,
    /// Read-only mapping; the exported buffer refuses writable requests.
    ReadOnly,
}

/// The memory of a region: a map it owns, or memory another library owns and lends.
enum Memory {
    /// A map made here (file or anonymous), unmapped on drop.
    Map(MmapRaw),
    /// Memory exported by another owner (a buffer received from another library, e.g. an
    /// object store's shared memory): `owner` keeps it alive and in place; dropped with it.
    Borrowed {
        address: usize,
        len: usize,
        _owner: Box<dyn Send + Sync>,
    },
}

/// One range of memory: a map it owns (unmapped on drop), or memory it borrows and keeps
/// alive (see [`Region::borrowed`]).
pub struct Region {
    map: Memory,
    path: Option<PathBuf>,
    mode: MapMode,
    file: Option<FileId>,
    /// The open backing file of shareable anonymous memory (see `anon`): kept so that the
    /// memory can be handed to another process. `None` for file maps (they travel by path).
    #[cfg(unix)]
    fd: Option<std::os::fd::OwnedFd>,
    /// Device and inode of a whole `.tdz` archive this region maps: leaves are parts of it, it
    /// is no leaf's own file (so `file` stays None), and pickles reopen it by this identity.
    archive: Option<FileId>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("len", &self.len())
            .field("path", &self.path)
            .field("mode", &self.mode)
            .finish()
    }
}

impl Region {
    /// A region over `len` bytes at `address` that this crate did not map: memory exported by
    /// `owner` (e.g. a Python buffer view), which the region keeps, and drops last. Read-only
    /// (the exported buffer refuses writable requests) unless `writable`; never a file, never
    /// passed to another process by descriptor.
    ///
    /// # Safety
    /// `[address, address + len)` must stay valid, in place, for as long as `owner` lives, and
    /// must not be written through this region when the owner lent it read-only (`writable`
    /// false).
    pub unsafe fn borrowed(
        address: *mut u8,
        len: usize,
        writable: bool,
        owner: Box<dyn Send + Sync>,
    ) -> Region {
        Region {
            map: Memory::Borrowed {
                address: address as usize,
                len,
                _owner: owner,
            },
            path: None,
            mode: if writable {
                MapMode::Shared
            } else {
                MapMode::ReadOnly
            },
            file: None,
            #[cfg(unix)]
            fd: None,
            archive: None,
        }
    }

    /// Whether this region borrows memory another owner exported (see [`Region::borrowed`]).
    pub fn is_borrowed(&self) -> bool {
        matches!(self.map, Memory::Borrowed { .. })
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        match &self.map {
            Memory::Map(map) => map.as_mut_ptr(),
            Memory::Borrowed { address, .. } => *address as *mut u8,
        }
    }

    /// Length in bytes (never 0 for maps: empty tensors are not mapped).
    pub fn len(&self) -> usize {
        match &self.map {
            Memory::Map(map) => map.len(),
            Memory::Borrowed { len, .. } => *len,
        }
    }

    /// True for a region of no bytes (never a map; a borrowed buffer may be empty).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The backing file's path, or `None` for anonymous memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Device and inode of the named file this region maps shared (None for anonymous
    /// memory and copy-on-write maps, whose bytes may differ from the file's): a later save
    /// keeps the file at a leaf's name when it still is this one.
    pub fn file_id(&self) -> Option<FileId> {
        self.file
    }

    /// Keeps `fd`, the backing file of this anonymous region, open for as long as the region
    /// lives (one descriptor per arena, whatever the number of leaves in it).
    #[cfg(unix)]
    pub fn with_fd(mut self, fd: std::os::fd::OwnedFd) -> Self {
        self.fd = Some(fd);
        self
    }

    /// The backing file of shareable anonymous memory, if this region keeps one.
    #[cfg(unix)]
    pub fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.fd.as_ref().map(|fd| fd.as_fd())
    }

    /// Marks the region as the map of the whole `.tdz` archive with this device and inode
    /// (see `archive::reopen`).
    pub fn as_archive(mut self, identity: FileId) -> Self {
        self.file = None;
        self.archive = Some(identity);
        self
    }

    /// Device and inode of the whole `.tdz` archive this region maps, if it maps one.
    pub fn archive_id(&self) -> Option<FileId> {
        self.archive
    }

    /// How the region is mapped.
    pub fn mode(&self) -> MapMode {
        self.mode
    }

    /// True when writes through the mapping are allowed.
    pub fn writable(&self) -> bool {
        self.mode != MapMode::ReadOnly
    }

    /// Where `[address, address + len)` starts in this region, when the range lies inside it and
    /// the region is anonymous memory (an arena: between its parts only padding, no file or
    /// archive headers), else `None`. Several leaves of one arena then travel as one range.
    pub fn arena_offset(&self, address: usize, len: usize) -> Option<usize> {
        let start = self.as_ptr() as usize;
        let offset = address.checked_sub(start)?;
        let inside = len > 0 && offset.checked_add(len).is_some_and(|end| end <= self.len());
        (inside && self.path.is_none() && self.archive.is_none()).then_some(offset)
    }

    /// Writes dirty pages of a file-backed shared map to its file and waits (msync).
    pub fn flush(&self) -> Result<()> {
        if self.mode != MapMode::Shared || self.path.is_none() {
            return Ok(());
        }
        let path = self.path.as_deref().unwrap_or(Path::new(""));
        match &self.map {
            Memory::Map(map) => map.flush().map_err(|e| Error::io(path, e)),
            Memory::Borrowed { .. } => Ok(()),
        }
    }

    /// Faults the map's pages in with one call (a message is about to fill them; page by page,
    /// shared memory costs a fault per 4 KiB). Best effort: kernels before 5.14 lack it.
    pub fn populate(&self) {
        // A borrowed buffer is not ours to advise.
        #[cfg(target_os = "linux")]
        if !self.is_borrowed() {
            // SAFETY: the range is exactly the live mapping this region owns;
            // MADV_POPULATE_WRITE only faults its pages in (writable, shared: no content changes).
            unsafe {
                let _ = rustix::mm::madvise(
                    self.as_ptr().cast(),
                    self.len(),
                    rustix::mm::Advice::LinuxPopulateWrite,
                );
            }
        }
    }

    /// Copies `self[range]` into a slice; used by tests.
    #[cfg(test)]
    pub fn to_vec(&self) -> Vec<u8> {
        // SAFETY: the map is alive for the borrow of self and spans len() readable bytes.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()).to_vec() }
    }
}

/// A new pagefile-backed map of `len` zeroed bytes (Windows' anonymous memory, see
/// `sys/anon/windows.rs`).
#[cfg(windows)]
pub fn map_anonymous(len: usize) -> io::Result<Region> {
    let map = MmapRaw::from(MmapOptions::new().len(len).map_anon()?);
    Ok(Region {
        map: Memory::Map(map),
        path: None,
        mode: MapMode::Shared,
        file: None,
        archive: None,
    })
}

/// Maps the first `len` bytes of an open file.
pub fn map_file(file: &File, len: usize, path: Option<PathBuf>, mode: MapMode) -> io::Result<Region> {
    let identity = match (mode, &path) {
        (MapMode::Shared, Some(_)) => identity::of_file(file).ok(),
        _ => None,
    };
    map_file_as(file, len, path, mode, identity)
}

/// `map_file` for a file whose (device, inode) the caller already has from its own `fstat`
/// (recorded for shared maps with a path, as `map_file` does): one system call less.
pub fn map_file_as(
    file: &File,
    len: usize,
    path: Option<PathBuf>,
    mode: MapMode,
    identity: Option<FileId>,
) -> io::Result<Region> {
    let mut opts = MmapOptions::new();
    opts.len(len);
    let map = match mode {
        MapMode::Shared => opts.map_raw(file)?,
        MapMode::ReadOnly => opts.map_raw_read_only(file)?,
        // SAFETY: a private copy-on-write map; later changes of the file by other processes
        // may or may not show through, which is the documented behaviour of such maps.
        MapMode::CopyOnWrite => MmapRaw::from(unsafe { opts.map_copy(file)? }),
    };
    let file = match (mode, &path) {
        (MapMode::Shared, Some(_)) => identity,
        _ => None,
    };
    Ok(Region {
        map: Memory::Map(map),
        path,
        mode,
        file,
        #[cfg(unix)]
        fd: None,
        archive: None,
    })
}

/// True when the file has no hole: its allocated blocks cover its whole size (which is at
/// least `len`). Files written by a save are; a sparse one (tensordict's `memmap_like`) is not
/// and gets its space reserved before it is mapped shared.
#[cfg(unix)]
pub fn fully_allocated(md: &std::fs::Metadata, len: usize) -> bool {
    use std::os::unix::fs::MetadataExt;
    md.size() >= len as u64 && md.blocks().saturating_mul(512) >= md.size()
}

#[cfg(not(unix))]
pub fn fully_allocated(_md: &std::fs::Metadata, _len: usize) -> bool {
    false
}

/// Reserves the blocks of the first `len` bytes of an existing file without changing its
/// size (`fallocate(FALLOC_FL_KEEP_SIZE)`), so that writing through a shared map of a sparse
/// file on a full disk fails here with ENOSPC instead of a SIGBUS later. A no-op where the
/// file system cannot (the file is then mapped as it is).
#[cfg(target_os = "linux")]
pub fn reserve_existing(file: &File, len: usize) -> io::Result<()> {
    use rustix::fs::{fallocate, FallocateFlags};
    match fallocate(file, FallocateFlags::KEEP_SIZE, 0, len as u64) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS | rustix::io::Errno::INVAL) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Without fallocate there is nothing to reserve with.
#[cfg(not(target_os = "linux"))]
pub fn reserve_existing(_file: &File, _len: usize) -> io::Result<()> {
    Ok(())
}

/// Fills a new, empty file with `src` (pwrite) or reserves `len` zero bytes (fallocate).
///
/// Writing from the source memory avoids the page fault per 4 KiB page that copying into a
/// fresh shared mapping costs; reserving up front turns a full disk into `ENOSPC` here. A
/// big file on a disk file system gets its blocks before the write (`sys::prealloc`: one
/// writer into a preallocated file was the fastest way measured there).
pub fn fill_file(file: &File, src: Option<&[u8]>, len: usize) -> io::Result<()> {
    match src {
        Some(data) => {
            crate::sys::prealloc::preallocate(file, data.len())?;
            write_all_at(file, data, 0)
        }
        None => reserve(file, len),
    }
}

/// `pwrite` of all of `data` at `offset`. In a counted call (`progress::counting`, a progress
/// bar) it writes in `PROGRESS_CHUNK` pieces and advances the counter after each one.
pub fn write_all_at(file: &File, data: &[u8], offset: u64) -> io::Result<()> {
    if !crate::sys::progress::counted() {
        return pwrite_all(file, data, offset);
    }
    for (i, piece) in data.chunks(crate::sys::progress::PROGRESS_CHUNK).enumerate() {
        pwrite_all(
            file,
            piece,
            offset + (i * crate::sys::progress::PROGRESS_CHUNK) as u64,
        )?;
        crate::sys::progress::advance(piece.len() as u64);
    }
    Ok(())
}

/// `pread` of exactly `buf.len()` bytes at `offset`: a file shorter than that gives
/// `UnexpectedEof` (never a fault, as a read through a map of a shrinking file would).
pub fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        file.read_exact_at(buf, offset)
    }
    #[cfg(windows)]
    {
        use std::os::windows::fs::FileExt;
        let (mut buf, mut offset) = (buf, offset);
        while !buf.is_empty() {
            match file.seek_read(buf, offset)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
            }
        }
        Ok(())
    }
}

#[cfg(unix)]
fn pwrite_all(file: &File, data: &[u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(data, offset)
}

#[cfg(windows)]
fn pwrite_all(file: &File, mut data: &[u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !data.is_empty() {
        let n = file.seek_write(data, offset)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        data = &data[n..];
        offset += n as u64;
    }
    Ok(())
}

/// Reserves `len` bytes of real space for a file (not a sparse hole).
#[cfg(target_os = "linux")]
pub fn reserve(file: &File, len: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: fallocate on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        // File systems without fallocate: fall back to a sized (sparse) file.
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => file.set_len(len as u64),
        _ => Err(err),
    }
}

/// Reserves `len` bytes for a file; without fallocate only the size can be set.
#[cfg(not(target_os = "linux"))]
pub fn reserve(file: &File, len: usize) -> io::Result<()> {
    file.set_len(len as u64)
}

/// Sets the size of a new file to `total` and reserves real space for the `holes` (`(offset,
/// len)`) only: the caller writes every other byte with `pwrite`, which allocates as it writes
/// (and fails with `ENOSPC`/`ENOMEM` there, never later), so those pages are not allocated
/// twice. Without fallocate only the size is set.
pub fn reserve_holes(file: &File, total: usize, holes: &[(usize, usize)]) -> io::Result<()> {
    file.set_len(total as u64)?;
    #[cfg(target_os = "linux")]
    for &(offset, len) in holes.iter().filter(|h| h.1 > 0) {
        use rustix::fs::{fallocate, FallocateFlags};
        match fallocate(file, FallocateFlags::empty(), offset as u64, len as u64) {
            Ok(()) => {}
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = holes;
    Ok(())
}

/// A fresh unguessable suffix for temporary names (seeded from the OS by `RandomState`).
pub fn random_suffix() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests;
