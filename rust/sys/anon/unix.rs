//! Anonymous shared memory on Unix, which crosses processes.
//!
//! The anonymous memory of one call is one kernel object per arena: on Linux a `memfd`, sealed
//! against shrinking and growing once filled; with `TENSORDICT_RS_ANON_DIR` set (or where
//! memfds are refused) an unlinked file in that directory, `/dev/shm` or the temp dir. Its
//! descriptor stays open beside the mapping, one per arena whatever the number of leaves in it,
//! so that the memory can be handed to another process (`SCM_RIGHTS`, the way multiprocessing
//! passes fds). A call's small leaves share one arena; its large ones are spread over one arena
//! per writer thread (`create`), because a shmem inode takes one `write` at a time: two threads
//! filling one memfd run no faster than one.
//!
//! A process maps each object once: a registry keyed by (device, inode) finds the live region
//! of a descriptor received again (a round trip, the same tree sent twice) and closes the new
//! descriptor instead of mapping it a second time. The memory is freed when the last region of
//! every process is dropped.
//!
//! Space is reserved before anything is written (`fallocate`; for a memfd after checking the
//! memory that the machine and its cgroups have left), so that running out is an `OSError` at
//! allocation, never a SIGBUS on first touch. A memfd is not bounded by the size of the
//! `/dev/shm` mount (Docker's 64 MiB default).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::{arena_layout, Arenas, ARENA_ALIGN, LARGE_PART};
use crate::error::{Error, Result};
use crate::sys::identity::{self, FileId};
use crate::sys::pool;
use crate::sys::storage::{self, write_all_at, MapMode, Region};

/// What the error of a memfd names in place of a path.
const MEMFD_NAME: &str = "memfd:tensordict-rs";

fn registry() -> &'static Mutex<HashMap<FileId, Weak<Region>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<FileId, Weak<Region>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

fn identity(fd: BorrowedFd<'_>) -> io::Result<(FileId, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((identity::of_stat(&st), st.st_size as u64))
}

/// Records `region` as the mapping of its object in this process.
fn register(id: FileId, region: &Arc<Region>) {
    let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
    if map.len() >= 32 {
        map.retain(|_, weak| weak.strong_count() > 0);
    }
    map.insert(id, Arc::downgrade(region));
}

/// The live region of object `id` in this process, if it is mapped and spans `len` bytes.
fn lookup(id: FileId, len: usize) -> Option<Arc<Region>> {
    let map = registry().lock().unwrap_or_else(|p| p.into_inner());
    map.get(&id)
        .and_then(Weak::upgrade)
        .filter(|region| region.len() >= len)
}

/// Number of live shared regions this process maps (for tests and diagnostics).
pub fn live_regions() -> usize {
    let map = registry().lock().unwrap_or_else(|p| p.into_inner());
    map.values().filter(|weak| weak.strong_count() > 0).count()
}

/// Bytes of memory that a new memfd may still take: what the kernel reports available (plus
/// free swap), bounded by the limit of every cgroup (v2) above this process. `None` when
/// nothing can be read (then only `fallocate` decides).
#[cfg(target_os = "linux")]
fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    let mut available = field("MemAvailable:")?.saturating_add(field("SwapFree:").unwrap_or(0));
    if let Some(group) = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        })
    {
        let mut dir = PathBuf::from("/sys/fs/cgroup").join(group.trim_start_matches('/'));
        loop {
            let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
            if let (Some(max), Some(current)) = (read("memory.max"), read("memory.current")) {
                if let (Ok(max), Ok(current)) = (max.trim().parse::<u64>(), current.trim().parse::<u64>()) {
                    available = available.min(max.saturating_sub(current));
                }
            }
            if dir == Path::new("/sys/fs/cgroup") || !dir.pop() {
                break;
            }
        }
    }
    Some(available)
}

/// Fails with `ENOMEM` (naming the memfd) when `total` bytes of new memfds would take more
/// memory than the machine and its cgroups have left; passes when nothing can be read.
#[cfg(target_os = "linux")]
fn check_memory(total: usize) -> Result<()> {
    match available_memory() {
        Some(free) if total as u64 > free => {
            let what = format!("{MEMFD_NAME} ({total} bytes of shared memory asked for, {free} available)");
            Err(Error::io(what, io::Error::from_raw_os_error(libc::ENOMEM)))
        }
        _ => Ok(()),
    }
}

/// Without memfds nothing is checked here: `fallocate` decides.
#[cfg(not(target_os = "linux"))]
fn check_memory(_total: usize) -> Result<()> {
    Ok(())
}

/// Whether new arenas are memfds (Linux, `TENSORDICT_RS_ANON_DIR` unset).
fn memfds_wanted() -> bool {
    cfg!(target_os = "linux") && std::env::var_os("TENSORDICT_RS_ANON_DIR").is_none()
}

/// A new memfd of `total` bytes, its `holes` reserved (see `storage::reserve_holes`), or
/// `None` where the kernel refuses memfds. The memory left is checked by the caller, once for
/// every arena of a call (`check_memory`).
#[cfg(target_os = "linux")]
fn memfd(total: usize, holes: &[(usize, usize)]) -> Result<Option<File>> {
    use rustix::fs::{memfd_create, MemfdFlags};
    let name = Path::new(MEMFD_NAME);
    let fd = match memfd_create("tensordict-rs", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM | rustix::io::Errno::INVAL) => {
            return Ok(None)
        }
        Err(e) => return Err(Error::io(name, e.into())),
    };
    let file = File::from(fd);
    storage::reserve_holes(&file, total, holes).map_err(|e| Error::io(name, e))?;
    Ok(Some(file))
}

/// The backing file of a new arena of `total` bytes, its `holes` reserved, and the place
/// errors name.
fn backing_file(total: usize, holes: &[(usize, usize)]) -> Result<(File, PathBuf, bool)> {
    #[cfg(target_os = "linux")]
    if memfds_wanted() {
        if let Some(file) = memfd(total, holes)? {
            return Ok((file, PathBuf::from(MEMFD_NAME), true));
        }
    }
    let dirs = anonymous_dirs(total);
    let mut last = None;
    for dir in &dirs {
        let attempt = unnamed_file(dir).and_then(|file| {
            storage::reserve_holes(&file, total, holes)
                .map(|()| file)
                .map_err(|e| Error::io(dir, e))
        });
        match attempt {
            Ok(file) => return Ok((file, dir.clone(), false)),
            // /dev/shm filled up between statvfs and now: try the next place.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && dirs.len() > 1 => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::io(std::env::temp_dir(), io::ErrorKind::NotFound.into())))
}

/// Where anonymous maps live: `TENSORDICT_RS_ANON_DIR` when set (used as is, for tests and
/// for machines with a better place), else `/dev/shm` when it has room, else the temp dir.
fn anonymous_dirs(len: usize) -> Vec<PathBuf> {
    if let Some(dir) = std::env::var_os("TENSORDICT_RS_ANON_DIR") {
        return vec![PathBuf::from(dir)];
    }
    let temp = std::env::temp_dir();
    let shm = Path::new("/dev/shm");
    if cfg!(target_os = "linux") && free_bytes(shm).is_some_and(|free| free >= len as u64) {
        vec![shm.to_path_buf(), temp]
    } else {
        vec![temp]
    }
}

fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; zeroed is a valid initial value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out-pointer for the call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// Creates an unnamed file in `dir`: `O_TMPFILE` where the file system has it, else an
/// exclusively created file with an unguessable name, unlinked at once.
fn unnamed_file(dir: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    #[cfg(target_os = "linux")]
    {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .open(dir)
        {
            Ok(file) => return Ok(file),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                ) => {}
            Err(e) => return Err(Error::io(dir, e)),
        }
    }
    let path = dir.join(format!(
        "tdrs-{}-{}",
        std::process::id(),
        storage::random_suffix()
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
    Ok(file)
}

/// Writes the parts that have data at their offsets with `pwritev`, 1024 at a time; the
/// gaps (alignment, zero-filled parts) are already reserved zeros.
fn write_parts(file: &File, parts: &[(Option<&[u8]>, usize)], offsets: &[usize]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    static ZEROS: [u8; ARENA_ALIGN] = [0; ARENA_ALIGN];
    const MAX_IOV: usize = 1024;
    let mut i = 0;
    while i < parts.len() {
        // One run: consecutive parts with data, padding included, up to MAX_IOV vectors.
        let Some(start) = parts[i].0.map(|_| offsets[i]) else {
            i += 1;
            continue;
        };
        let mut pieces: Vec<&[u8]> = Vec::with_capacity(MAX_IOV);
        let mut end = start;
        while i < parts.len() && pieces.len() + 2 <= MAX_IOV {
            let (Some(data), len) = parts[i] else { break };
            if offsets[i] != end {
                pieces.push(&ZEROS[..offsets[i] - end]);
            }
            pieces.push(&data[..len]);
            end = offsets[i] + len;
            i += 1;
        }
        let iov: Vec<libc::iovec> = pieces
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut _,
                iov_len: p.len(),
            })
            .collect();
        // SAFETY: every iovec points into a live slice of `pieces` for its length; pwritev only
        // reads them.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                start as libc::off_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        // A short write (signals, runs past the 2 GiB a call writes): finish piece by piece.
        let mut done = n as usize;
        let mut at = start;
        for piece in pieces {
            if done >= piece.len() {
                done -= piece.len();
            } else {
                write_all_at(file, &piece[done..], (at + done) as u64)?;
                done = 0;
            }
            at += piece.len();
        }
    }
    Ok(())
}

/// Large parts are spread over more than one arena only when each would get this much: an
/// arena more is one descriptor more for every process the tree crosses to (a connection to
/// `resource_sharer` after start-up), which a few MiB of writing do not pay back.
pub const SPLIT_MIN: usize = 64 << 20;

/// The arenas of one call: `(number of arenas, arena of each part)`. Small parts all go into
/// arena 0; parts of `LARGE_PART` bytes and more are spread, largest first, over one arena per
/// writer thread (each arena then has one writer: a shmem inode takes one write at a time,
/// so two threads writing one memfd go no faster than one), at most one per `SPLIT_MIN` bytes.
fn assign(parts: &[(Option<&[u8]>, usize)], num_threads: usize) -> (usize, Vec<usize>) {
    let mut arena = vec![0; parts.len()];
    let mut large: Vec<usize> = (0..parts.len()).filter(|&i| parts[i].1 >= LARGE_PART).collect();
    let large_bytes: usize = large.iter().map(|&i| parts[i].1).sum();
    let count = pool::worker_count(num_threads, large.len()).min((large_bytes / SPLIT_MIN).max(1));
    if count > 1 {
        let mut load = vec![0usize; count];
        load[0] = parts.iter().filter(|p| p.1 < LARGE_PART).map(|p| p.1).sum();
        large.sort_by_key(|&i| std::cmp::Reverse(parts[i].1));
        for i in large {
            let (least, _) = load
                .iter()
                .enumerate()
                .min_by_key(|&(_, &l)| l)
                .unwrap_or((0, &0));
            arena[i] = least;
            load[least] += parts[i].1;
        }
    }
    (count, arena)
}

/// The shareable anonymous arenas holding `parts` (`(data, len)`, data `None`: zeros), and
/// where each part went: `(arena, offset)`. Small parts are packed back to back into the first
/// arena (vectored writes); parts of `LARGE_PART` bytes and more sit on their own pages, spread
/// over up to one arena per writer thread (`num_threads`, 0: one per CPU, see `assign`), each
/// arena made, reserved and written by its own thread. A tree of small leaves is one arena
/// (one descriptor, whatever its number of leaves); a big one a few.
pub fn create(parts: &[(Option<&[u8]>, usize)], num_threads: usize) -> Result<Arenas> {
    let (count, arena) = assign(parts, num_threads);
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); count];
    for (i, &a) in arena.iter().enumerate() {
        members[a].push(i);
    }
    let layouts = members
        .iter()
        .map(|idx| arena_layout(&idx.iter().map(|&i| parts[i]).collect::<Vec<_>>()))
        .collect::<Result<Vec<_>>>()?;
    if memfds_wanted() {
        check_memory(layouts.iter().map(|(_, total)| total).sum())?;
    }
    let jobs: Vec<usize> = (0..count).collect();
    let built = pool::run(
        &jobs,
        count,
        |&a| {
            members[a]
                .iter()
                .map(|&i| parts[i].0.map_or(0, <[u8]>::len))
                .sum()
        },
        |&a| {
            let sub: Vec<_> = members[a].iter().map(|&i| parts[i]).collect();
            fill(&sub, &layouts[a].0, layouts[a].1)
        },
    )?;
    let mut places = vec![(0, 0); parts.len()];
    for (a, idx) in members.iter().enumerate() {
        for (&i, &off) in idx.iter().zip(&layouts[a].0) {
            places[i] = (a, off);
        }
    }
    let regions = built
        .into_iter()
        .map(|(region, id)| {
            let region = Arc::new(region);
            register(id, &region);
            region
        })
        .collect();
    Ok((regions, places))
}

/// Anonymous shared memory of `len` bytes, filled from `src` or zeroed: an arena of one part,
/// not entered in the registry (its owner wraps it on its own).
pub fn anonymous(src: Option<&[u8]>, len: usize) -> Result<Region> {
    let parts = [(src, len)];
    let (offsets, total) = arena_layout(&parts)?;
    if memfds_wanted() {
        check_memory(total)?;
    }
    fill(&parts, &offsets, total).map(|(region, _)| region)
}

/// One arena of `total` bytes: made, reserved, `parts` written at `offsets` (from this thread:
/// small ones with vectored writes, large ones with one `pwrite` each), sealed and mapped.
///
/// Every byte is allocated before the map exists, so that running out is an error here and
/// never a SIGBUS later: the large parts with data by their `pwrite`, everything else (small
/// parts, zeros, padding) by `fallocate` first. Reserving the whole arena first, as for a
/// file, would allocate the large parts' pages twice (a fifth more CPU time for 1 GiB).
fn fill(parts: &[(Option<&[u8]>, usize)], offsets: &[usize], total: usize) -> Result<(Region, FileId)> {
    let mut holes = Vec::new();
    let mut end = 0;
    for (&(data, len), &off) in parts.iter().zip(offsets) {
        if data.is_some() && len >= LARGE_PART {
            holes.push((end, off.saturating_sub(end)));
            end = off + len;
        }
    }
    holes.push((end, total.saturating_sub(end)));
    let (file, place, sealable) = backing_file(total, &holes)?;
    let small: Vec<(Option<&[u8]>, usize)> = parts
        .iter()
        .map(|&(data, len)| (data.filter(|_| len < LARGE_PART), len))
        .collect();
    write_parts(&file, &small, offsets).map_err(|e| Error::io(&place, e))?;
    for (&(data, len), &off) in parts.iter().zip(offsets) {
        if let Some(data) = data.filter(|_| len >= LARGE_PART) {
            write_all_at(&file, data, off as u64).map_err(|e| Error::io(&place, e))?;
        }
    }
    #[cfg(target_os = "linux")]
    if sealable {
        use rustix::fs::{fcntl_add_seals, SealFlags};
        // Nobody can shrink the memory under a mapping (a SIGBUS in another process) or grow it.
        fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| Error::io(&place, e.into()))?;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = sealable;
    let (id, _) = identity(file.as_fd()).map_err(|e| Error::io(&place, e))?;
    let region = storage::map_file(&file, total, None, MapMode::Shared).map_err(|e| Error::io(&place, e))?;
    Ok((region.with_fd(OwnedFd::from(file)), id))
}

/// Maps `len` bytes of a descriptor received from another process (or returns the region that
/// already maps the same object here, closing `fd`). The object must be a regular file (a memfd
/// or an unlinked file) of at least `len` bytes.
pub fn receive(fd: OwnedFd, len: usize) -> Result<Arc<Region>> {
    let place = Path::new("<received shared memory>");
    let st = rustix::fs::fstat(&fd).map_err(|e| Error::io(place, e.into()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(Error::invalid(
            place,
            "the received descriptor is not shared memory",
        ));
    }
    let id = identity::of_stat(&st);
    if let Some(region) = lookup(id, len) {
        return Ok(region); // `fd` closes here: this process already maps the object
    }
    if len == 0 || (st.st_size as u64) < len as u64 {
        return Err(Error::invalid(
            place,
            format!("the shared memory holds {} bytes, {len} expected", st.st_size),
        ));
    }
    let file = File::from(fd);
    let region = storage::map_file(&file, len, None, MapMode::Shared).map_err(|e| Error::io(place, e))?;
    let region = Arc::new(region.with_fd(OwnedFd::from(file)));
    register(id, &region);
    Ok(region)
}

#[cfg(test)]
mod tests;
