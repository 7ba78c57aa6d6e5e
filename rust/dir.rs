//! Directory handles that never follow a symlink below the prefix. No pyo3 here.
//!
//! On Unix a `Dir` is an open directory descriptor and every child is reached with
//! `openat(..., O_NOFOLLOW)`, one path component at a time: a key cannot climb out of the
//! prefix, a symlink planted in the tree is refused, and a reader that opened a directory
//! keeps reading that directory even if a writer swaps another one into its place.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// What a directory entry is, seen without following links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
    Missing,
}

/// An open directory plus the path it was reached by (for messages only).
#[derive(Debug)]
pub struct Dir {
    #[cfg(unix)]
    fd: std::os::fd::OwnedFd,
    path: PathBuf,
}

#[cfg(unix)]
mod imp {
    use super::*;
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;

    fn cstr(name: &str) -> io::Result<CString> {
        CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    }

    impl Dir {
        /// Opens the prefix itself (a symlink given by the user as the prefix is followed).
        pub fn open(path: &Path) -> io::Result<Dir> {
            let c = CString::new(path.as_os_str().as_bytes())
                .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
            // SAFETY: `c` is a valid C string; the returned descriptor is owned below.
            let fd = check(unsafe {
                libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC)
            })?;
            // SAFETY: `fd` was just returned by open and is owned by nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            Ok(Dir {
                fd,
                path: path.to_path_buf(),
            })
        }

        fn openat(&self, name: &str, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
            let c = cstr(name)?;
            let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            // SAFETY: valid dirfd and C string; the result is owned below.
            let fd =
                check(unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint) })?;
            // SAFETY: `fd` was just returned by openat and is owned by nobody else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        }

        /// Opens a child directory; a symlink fails with `ELOOP`/`ENOTDIR`.
        pub fn open_dir(&self, name: &str) -> io::Result<Dir> {
            let fd = self.openat(name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            Ok(Dir {
                fd,
                path: self.path.join(name),
            })
        }

        /// Creates a child directory and opens it.
        pub fn create_dir(&self, name: &str) -> io::Result<Dir> {
            let c = cstr(name)?;
            // SAFETY: valid dirfd and C string.
            check(unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o755) })?;
            self.open_dir(name)
        }

        /// Creates a new file for reading and writing; fails if the name exists.
        pub fn create_file(&self, name: &str) -> io::Result<File> {
            let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
            Ok(File::from(self.openat(name, flags, 0o644)?))
        }

        /// Opens an existing regular file read-write, or read-only when it is not writable.
        /// Returns the file and whether it is writable.
        pub fn open_file(&self, name: &str) -> io::Result<(File, bool)> {
            match self.openat(name, libc::O_RDWR, 0) {
                Ok(fd) => Ok((File::from(fd), true)),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EROFS | libc::EPERM)) => {
                    Ok((File::from(self.openat(name, libc::O_RDONLY, 0)?), false))
                }
                Err(e) => Err(e),
            }
        }

        /// Opens an existing file read-only.
        pub fn open_read(&self, name: &str) -> io::Result<File> {
            Ok(File::from(self.openat(name, libc::O_RDONLY, 0)?))
        }

        /// The kind of a child entry, without following links.
        pub fn kind(&self, name: &str) -> io::Result<EntryKind> {
            let c = cstr(name)?;
            // SAFETY: stat is plain old data; zeroed is a valid initial value.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: valid dirfd, C string and out-pointer.
            let rc = unsafe {
                libc::fstatat(
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                return if e.kind() == io::ErrorKind::NotFound {
                    Ok(EntryKind::Missing)
                } else {
                    Err(e)
                };
            }
            Ok(match st.st_mode & libc::S_IFMT {
                libc::S_IFREG => EntryKind::File,
                libc::S_IFDIR => EntryKind::Dir,
                libc::S_IFLNK => EntryKind::Symlink,
                _ => EntryKind::Other,
            })
        }

        /// Removes a file (not a directory) of this directory.
        pub fn remove_file(&self, name: &str) -> io::Result<()> {
            let c = cstr(name)?;
            // SAFETY: valid dirfd and C string.
            check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) }).map(|_| ())
        }

        /// fsync of the directory itself (makes created or renamed entries durable).
        pub fn sync(&self) -> io::Result<()> {
            // SAFETY: fsync on a descriptor we own.
            check(unsafe { libc::fsync(self.fd.as_raw_fd()) }).map(|_| ())
        }

        /// Device and inode of the open directory (to detect a swapped prefix).
        pub fn identity(&self) -> io::Result<(u64, u64)> {
            // SAFETY: stat is plain old data; zeroed is a valid initial value.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: valid descriptor and out-pointer.
            check(unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) })?;
            Ok((st.st_dev as u64, st.st_ino as u64))
        }
    }

    /// Device and inode of a path, following a final symlink like `Dir::open` does.
    pub fn path_identity(path: &Path) -> io::Result<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(path)?;
        Ok((md.dev(), md.ino()))
    }
}

#[cfg(windows)]
mod imp {
    //! Path-based fallback. Unverified: there is no Windows toolchain where this was written.
    use super::*;

    fn refuse_link(path: &Path) -> io::Result<()> {
        match std::fs::symlink_metadata(path) {
            Ok(md) if md.file_type().is_symlink() => Err(io::Error::other("refusing to follow a symlink")),
            _ => Ok(()),
        }
    }

    impl Dir {
        pub fn open(path: &Path) -> io::Result<Dir> {
            if !std::fs::metadata(path)?.is_dir() {
                return Err(io::Error::other("not a directory"));
            }
            Ok(Dir {
                path: path.to_path_buf(),
            })
        }
        pub fn open_dir(&self, name: &str) -> io::Result<Dir> {
            let p = self.path.join(name);
            refuse_link(&p)?;
            Dir::open(&p)
        }
        pub fn create_dir(&self, name: &str) -> io::Result<Dir> {
            std::fs::create_dir(self.path.join(name))?;
            self.open_dir(name)
        }
        pub fn create_file(&self, name: &str) -> io::Result<File> {
            File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(self.path.join(name))
        }
        pub fn open_file(&self, name: &str) -> io::Result<(File, bool)> {
            let p = self.path.join(name);
            refuse_link(&p)?;
            match File::options().read(true).write(true).open(&p) {
                Ok(f) => Ok((f, true)),
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Ok((File::open(&p)?, false)),
                Err(e) => Err(e),
            }
        }
        pub fn open_read(&self, name: &str) -> io::Result<File> {
            let p = self.path.join(name);
            refuse_link(&p)?;
            File::open(p)
        }
        pub fn kind(&self, name: &str) -> io::Result<EntryKind> {
            match std::fs::symlink_metadata(self.path.join(name)) {
                Ok(md) if md.file_type().is_symlink() => Ok(EntryKind::Symlink),
                Ok(md) if md.is_dir() => Ok(EntryKind::Dir),
                Ok(md) if md.is_file() => Ok(EntryKind::File),
                Ok(_) => Ok(EntryKind::Other),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(EntryKind::Missing),
                Err(e) => Err(e),
            }
        }
        pub fn remove_file(&self, name: &str) -> io::Result<()> {
            std::fs::remove_file(self.path.join(name))
        }
        pub fn sync(&self) -> io::Result<()> {
            Ok(())
        }
        pub fn identity(&self) -> io::Result<(u64, u64)> {
            Ok((0, 0))
        }
    }

    pub fn path_identity(_path: &Path) -> io::Result<(u64, u64)> {
        Ok((0, 0))
    }
}

pub use imp::path_identity;

impl Dir {
    /// The path this directory was reached by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of a child, for messages.
    pub fn child_path(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Reads a whole small file, refusing files larger than `limit` bytes.
    pub fn read_limited(&self, name: &str, limit: u64) -> io::Result<Vec<u8>> {
        let file = self.open_read(name)?;
        let md = file.metadata()?;
        if !md.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        if md.len() > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("file is {} bytes, more than the limit of {limit}", md.len()),
            ));
        }
        let mut out = Vec::with_capacity(md.len() as usize);
        file.take(limit + 1).read_to_end(&mut out)?;
        if out.len() as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "file grew past the limit",
            ));
        }
        Ok(out)
    }

    /// Writes a new file with `bytes`, optionally fsynced.
    pub fn write_new(&self, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
        use std::io::Write;
        let mut file = self.create_file(name)?;
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        Ok(())
    }

    /// Names of the entries of this directory (not following links).
    pub fn entry_names(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.path)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }
}
