//! The Unix side of `dir.rs`: every child is reached with `openat(..., O_NOFOLLOW)` relative
//! to an open directory descriptor, through `rustix`.

// `stat` field types differ between Unix systems: the casts are needed somewhere.
#![allow(clippy::unnecessary_cast)]

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, FileType, FlockOperation, Mode, OFlags};

use super::{Dir, EntryKind, EntryStat, NotRegular};
use crate::sys::identity::{self, FileId};

fn kind_of(mode: u32) -> EntryKind {
    match FileType::from_raw_mode(mode as _) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

fn describe(mode: u32) -> &'static str {
    match FileType::from_raw_mode(mode as _) {
        FileType::Directory => "a directory",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Symlink => "a symlink",
        _ => "something else",
    }
}

/// Refuses anything but a regular file (after the open: no race with a swap).
fn regular(fd: OwnedFd) -> io::Result<File> {
    let st = rfs::fstat(&fd)?;
    if kind_of(st.st_mode as u32) != EntryKind::File {
        return Err(io::Error::other(NotRegular(describe(st.st_mode as u32))));
    }
    Ok(File::from(fd))
}

/// An open that met something that is not a file (socket: ENXIO, directory: EISDIR).
fn open_error(e: rustix::io::Errno) -> io::Error {
    match e {
        rustix::io::Errno::NXIO => io::Error::other(NotRegular("a socket or device")),
        rustix::io::Errno::ISDIR => io::Error::other(NotRegular("a directory")),
        e => e.into(),
    }
}

impl Dir {
    /// Opens the prefix itself (a symlink given by the user as the prefix is followed).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = rfs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
        })
    }

    fn openat(&self, name: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        rfs::openat(&self.fd, name, flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, mode).map_err(open_error)
    }

    /// Opens a child directory; a symlink fails with `ELOOP`/`ENOTDIR`.
    pub fn open_dir(&self, name: &str) -> io::Result<Dir> {
        let fd = self.openat(name, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        Ok(Dir {
            fd,
            path: self.path.join(name),
        })
    }

    /// A second handle on this directory (its own open file description).
    pub fn reopen(&self) -> io::Result<Dir> {
        let fd = self.openat(".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        Ok(Dir {
            fd,
            path: self.path.clone(),
        })
    }

    /// Creates a child directory with `mode` (less the umask) and opens it.
    pub fn create_dir_mode(&self, name: &str, mode: u32) -> io::Result<Dir> {
        rfs::mkdirat(&self.fd, name, Mode::from_raw_mode(mode as _))?;
        self.open_dir(name)
    }

    /// Creates a new file for reading and writing; fails if the name exists.
    pub fn create_file(&self, name: &str) -> io::Result<File> {
        let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL;
        Ok(File::from(self.openat(
            name,
            flags,
            Mode::from_raw_mode(0o644),
        )?))
    }

    /// Opens an existing regular file read-write, or read-only when it is not writable.
    /// Never blocks (`O_NONBLOCK`); anything but a regular file is refused.
    pub fn open_file(&self, name: &str) -> io::Result<(File, bool)> {
        match self.openat(name, OFlags::RDWR | OFlags::NONBLOCK, Mode::empty()) {
            Ok(fd) => Ok((regular(fd)?, true)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EROFS | libc::EPERM)) => {
                Ok((self.open_read(name)?, false))
            }
            Err(e) => Err(e),
        }
    }

    /// Opens an existing regular file read-only, without blocking.
    pub fn open_read(&self, name: &str) -> io::Result<File> {
        regular(self.openat(name, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())?)
    }

    /// `lstat` of a child: None when it does not exist.
    pub fn stat(&self, name: &str) -> io::Result<Option<EntryStat>> {
        match rfs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                let (dev, ino) = identity::of_stat(&st);
                Ok(Some(EntryStat {
                    kind: kind_of(st.st_mode as u32),
                    dev,
                    ino,
                    size: st.st_size as u64,
                    mtime_ns: identity::mtime_ns(&st),
                }))
            }
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Fails with `EACCES` (or `EROFS`) where this process may not create, rename or remove
    /// entries of this directory (its permissions with the process's effective ids and
    /// capabilities, as a rename would check them).
    pub fn check_writable(&self) -> io::Result<()> {
        Ok(rfs::accessat(
            &self.fd,
            ".",
            rfs::Access::WRITE_OK | rfs::Access::EXEC_OK,
            AtFlags::EACCESS,
        )?)
    }

    /// Removes a file (not a directory) of this directory.
    pub fn remove_file(&self, name: &str) -> io::Result<()> {
        Ok(rfs::unlinkat(&self.fd, name, AtFlags::empty())?)
    }

    /// Removes an empty child directory.
    pub fn remove_dir(&self, name: &str) -> io::Result<()> {
        Ok(rfs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)?)
    }

    /// Renames a child of this directory to `to_name` in `to`, replacing a file there
    /// (or, with `noreplace`, failing with `EEXIST`; `EINVAL` where unsupported).
    pub fn rename(&self, name: &str, to: &Dir, to_name: &str, noreplace: bool) -> io::Result<()> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if noreplace {
            return Ok(rfs::renameat_with(
                &self.fd,
                name,
                &to.fd,
                to_name,
                rfs::RenameFlags::NOREPLACE,
            )?);
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        if noreplace {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(rfs::renameat(&self.fd, name, &to.fd, to_name)?)
    }

    /// Exchanges a child of this directory with `to_name` in `to`, atomically
    /// (`renameat2(RENAME_EXCHANGE)`): both names exist before and after, each now naming
    /// the other's file. `EINVAL` (or `Unsupported`) where the file system or the system has
    /// no exchange: callers then rename.
    pub fn exchange(&self, name: &str, to: &Dir, to_name: &str) -> io::Result<()> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            Ok(rfs::renameat_with(
                &self.fd,
                name,
                &to.fd,
                to_name,
                rfs::RenameFlags::EXCHANGE,
            )?)
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = (name, to, to_name);
            Err(io::ErrorKind::Unsupported.into())
        }
    }

    /// Bytes an unprivileged user may still write on this directory's file system.
    pub fn free_space(&self) -> io::Result<u64> {
        let st = rfs::fstatvfs(&self.fd)?;
        Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }

    /// A handle on a child that keeps its file alive after its name is removed (`O_PATH`,
    /// never following a link): the file's space is freed when the handle is closed, not in
    /// the `unlink` or `rename` that drops its last name. See `sys::reclaim`.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub fn hold(&self, name: &str) -> io::Result<OwnedFd> {
        Ok(rfs::openat(
            &self.fd,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// Hard-links a child of this directory as `to_name` in `to` (fails if it exists).
    pub fn link(&self, name: &str, to: &Dir, to_name: &str) -> io::Result<()> {
        Ok(rfs::linkat(&self.fd, name, &to.fd, to_name, AtFlags::empty())?)
    }

    /// fsync of the directory itself (makes created or renamed entries durable).
    pub fn sync(&self) -> io::Result<()> {
        Ok(rfs::fsync(&self.fd)?)
    }
    /// A new unnamed file in this directory (`O_TMPFILE`), or None where the file system
    /// cannot make one; give it a name with `link_unnamed`.
    pub fn create_unnamed(&self) -> io::Result<Option<File>> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            let flags = OFlags::RDWR | OFlags::TMPFILE | OFlags::CLOEXEC;
            match rfs::openat(&self.fd, ".", flags, Mode::from_raw_mode(0o644)) {
                Ok(fd) => return Ok(Some(File::from(fd))),
                Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR | rustix::io::Errno::INVAL) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// Links a file made by `create_unnamed` as `name` (fails if the name exists).
    pub fn link_unnamed(&self, file: &File, name: &str) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
        Ok(rfs::linkat(
            rfs::CWD,
            proc_path.as_str(),
            &self.fd,
            name,
            AtFlags::SYMLINK_FOLLOW,
        )?)
    }

    /// Device and inode of the open directory.
    pub fn identity(&self) -> io::Result<FileId> {
        identity::of_file(&self.fd)
    }

    /// Which mount the directory is on: a rename can only stay within one. The mount id
    /// (`statx`) tells bind mounts of one file system apart; elsewhere the device does.
    pub fn mount(&self) -> io::Result<u64> {
        #[cfg(target_os = "linux")]
        if let Ok(st) = rfs::statx(&self.fd, "", AtFlags::EMPTY_PATH, rfs::StatxFlags::MNT_ID) {
            if st.stx_mask & rfs::StatxFlags::MNT_ID.bits() != 0 {
                return Ok(st.stx_mnt_id);
            }
        }
        Ok(self.identity()?.0)
    }

    /// `flock` on the directory. Returns false when `wait` is off and another open of it
    /// holds a conflicting lock; an error when the file system has no such locks.
    pub fn lock(&self, exclusive: bool, wait: bool) -> io::Result<bool> {
        let op = match (exclusive, wait) {
            (true, true) => FlockOperation::LockExclusive,
            (true, false) => FlockOperation::NonBlockingLockExclusive,
            (false, true) => FlockOperation::LockShared,
            (false, false) => FlockOperation::NonBlockingLockShared,
        };
        loop {
            match rfs::flock(&self.fd, op) {
                Ok(()) => return Ok(true),
                Err(rustix::io::Errno::WOULDBLOCK) => return Ok(false),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Releases a lock taken with `lock`.
    pub fn unlock(&self) {
        let _ = rfs::flock(&self.fd, FlockOperation::Unlock);
    }

    /// Names of the entries of this directory, read through the descriptor (sorted).
    pub fn entry_names(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        let mut dir = rfs::Dir::read_from(&self.fd)?;
        while let Some(entry) = dir.read() {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != "." && name != ".." {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }
}

/// True for the errors of a file system that has no `flock`.
pub fn locks_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::EINVAL | libc::EBADF | libc::ENOSYS)
    )
}
