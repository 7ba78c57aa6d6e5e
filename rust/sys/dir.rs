//! Directory handles that never follow a symlink below the prefix. No pyo3 here.
//!
//! On Unix a `Dir` is an open directory descriptor and every child is reached with
//! `openat(..., O_NOFOLLOW)`, one path component at a time: a key cannot climb out of the
//! prefix, a symlink planted in the tree is refused, and a reader that opened a directory
//! keeps reading that directory even if it is moved. Files are opened with `O_NONBLOCK` and
//! checked with `fstat` before use, so a FIFO, socket or device named like a data file is
//! refused instead of blocking. The system calls go through `rustix`.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::sys::identity::{self, FileId, Stamp};

/// What a directory entry is, seen without following links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
    Missing,
}

/// What `lstat` says about an entry: its kind, identity, size and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryStat {
    pub kind: EntryKind,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Modification time in nanoseconds (since the epoch on Unix; Windows: since 1601, only
    /// ever compared): an in-place write changes it.
    pub mtime_ns: i64,
}

impl EntryStat {
    /// The entry's identity (see `sys::identity`).
    pub fn id(&self) -> FileId {
        (self.dev, self.ino)
    }
}

impl From<EntryStat> for Stamp {
    fn from(st: EntryStat) -> Stamp {
        Stamp {
            dev: st.dev,
            ino: st.ino,
            size: st.size,
            mtime_ns: st.mtime_ns,
        }
    }
}

/// The error of opening something that is not a regular file where one is needed.
#[derive(Debug)]
pub struct NotRegular(pub &'static str);

impl std::fmt::Display for NotRegular {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a regular file but {}", self.0)
    }
}

impl std::error::Error for NotRegular {}

/// True for the error returned when a name is not a regular file.
pub fn is_not_regular(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<NotRegular>())
}

/// The error of a symlink met where a file or directory of the tree should be (Windows; on
/// Unix the kernel's `ELOOP` says it).
#[derive(Debug)]
pub struct SymlinkRefused;

impl std::fmt::Display for SymlinkRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refusing to follow a symlink")
    }
}

impl std::error::Error for SymlinkRefused {}

/// True for the error of opening a name that is a symlink (never followed): `ELOOP` from an
/// `O_NOFOLLOW` open on Unix, [`SymlinkRefused`] on Windows.
pub fn is_symlink_refused(e: &io::Error) -> bool {
    #[cfg(unix)]
    if e.raw_os_error() == Some(libc::ELOOP) {
        return true;
    }
    e.get_ref().is_some_and(|inner| inner.is::<SymlinkRefused>())
}

/// An open directory plus the path it was reached by (for messages only).
#[derive(Debug)]
pub struct Dir {
    #[cfg(unix)]
    fd: std::os::fd::OwnedFd,
    path: PathBuf,
    /// The lock taken with `lock` (Windows: a lock file inside the directory).
    #[cfg(windows)]
    lock: std::sync::Mutex<Option<imp::Held>>,
}

#[cfg(unix)]
mod unix;
#[cfg(unix)]
use unix as imp;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as imp;

pub use imp::locks_unsupported;
#[cfg(windows)]
pub use imp::{in_use, LOCK_FILE};

impl Dir {
    /// The path this directory was reached by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of a child, for messages.
    pub fn child_path(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Creates a child directory (mode 0777 less the umask, like `mkdir`) and opens it.
    pub fn create_dir(&self, name: &str) -> io::Result<Dir> {
        self.create_dir_mode(name, 0o777)
    }

    /// The kind of a child entry, without following links.
    pub fn kind(&self, name: &str) -> io::Result<EntryKind> {
        Ok(self.stat(name)?.map_or(EntryKind::Missing, |s| s.kind))
    }

    /// `stat` of `name` in the directory at `rel` below this one, in one call (intermediate
    /// components are resolved by the system: for change detection, not for opening).
    pub fn stat_rel(&self, rel: &[String], name: &str) -> io::Result<Option<EntryStat>> {
        if rel.is_empty() {
            return self.stat(name);
        }
        let mut path = rel.join("/");
        path.push('/');
        path.push_str(name);
        self.stat(&path)
    }

    /// Opens a directory below this one, one component at a time, never following a symlink.
    /// Only the result stays open.
    pub fn open_rel(&self, components: &[String]) -> io::Result<Dir> {
        let Some((first, rest)) = components.split_first() else {
            return self.reopen();
        };
        let mut dir = self.open_dir(first)?;
        for name in rest {
            dir = dir.open_dir(name)?;
        }
        Ok(dir)
    }

    /// Reads a whole small regular file, refusing files larger than `limit` bytes.
    pub fn read_limited(&self, name: &str, limit: u64) -> io::Result<Vec<u8>> {
        self.read_limited_stamped(name, limit).map(|(bytes, _)| bytes)
    }

    /// `read_limited`, with the stamp of the file read (taken before reading it: a write
    /// after that changes the stamp the file has later).
    pub fn read_limited_stamped(&self, name: &str, limit: u64) -> io::Result<(Vec<u8>, Stamp)> {
        let file = self.open_read(name)?;
        let stamp = identity::stamp_of_file(&file)?;
        if stamp.size > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("file is {} bytes, more than the limit of {limit}", stamp.size),
            ));
        }
        let mut out = Vec::with_capacity(stamp.size as usize);
        file.take(limit + 1).read_to_end(&mut out)?;
        if out.len() as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "file grew past the limit",
            ));
        }
        Ok((out, stamp))
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
}
