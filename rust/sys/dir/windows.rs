//! The Windows side of `dir.rs`. Path-based (checked under Wine by `.ci/windows`): each step
//! refuses a symlink, but without handles relative to a directory a swap between check and
//! open is not seen.
//! A directory's lock is `LockFileEx` on a lock file inside it, `LOCK_FILE`, deleted again
//! when an exclusive lock is released (a killed process leaves it; the next lock reuses it).
use std::os::windows::ffi::OsStrExt;
use std::os::windows::fs::OpenOptionsExt;
use std::os::windows::io::AsRawHandle;
use std::sync::Mutex;

use windows_sys::Win32::Foundation::{ERROR_ACCESS_DENIED, ERROR_LOCK_VIOLATION, ERROR_SHARING_VIOLATION};
use windows_sys::Win32::Storage::FileSystem as wfs;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::{Dir, EntryKind, EntryStat, NotRegular, SymlinkRefused};
use crate::sys::identity::{self, open_entry, FileId};

/// The lock file of a locked directory. `%l` is no `%XX` escape: no key is stored so.
pub const LOCK_FILE: &str = ".tdrs%lock";
const SHARE_ALL: u32 = wfs::FILE_SHARE_READ | wfs::FILE_SHARE_WRITE | wfs::FILE_SHARE_DELETE;

/// A lock held on a directory's lock file; an exclusive one deletes the file on release.
#[derive(Debug)]
pub struct Held {
    /// Kept open: closing it releases the lock (after `drop` deleted the name).
    _file: File,
    path: PathBuf,
    exclusive: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.exclusive {
            // Ours while we hold it; waiters that opened it see the name gone and retry.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn refuse_link(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_symlink() => Err(io::Error::other(SymlinkRefused)),
        _ => Ok(()),
    }
}

fn regular(file: File) -> io::Result<File> {
    if file.metadata()?.is_file() {
        Ok(file)
    } else {
        Err(io::Error::other(NotRegular("something else")))
    }
}

fn wide(path: &Path) -> Vec<u16> {
    path.as_os_str().encode_wide().chain(Some(0)).collect()
}

/// True for the errors of deleting or replacing a file that is mapped or open elsewhere.
pub fn in_use(e: &io::Error) -> bool {
    e.raw_os_error()
        .is_some_and(|c| c == ERROR_ACCESS_DENIED as i32 || c == ERROR_SHARING_VIOLATION as i32)
}

impl Dir {
    pub fn open(path: &Path) -> io::Result<Dir> {
        if !std::fs::metadata(path)?.is_dir() {
            return Err(io::Error::other("not a directory"));
        }
        Ok(Dir {
            path: path.to_path_buf(),
            lock: Mutex::new(None),
        })
    }
    pub fn open_dir(&self, name: &str) -> io::Result<Dir> {
        let p = self.path.join(name);
        refuse_link(&p)?;
        Dir::open(&p)
    }
    pub fn reopen(&self) -> io::Result<Dir> {
        Dir::open(&self.path)
    }
    pub fn create_dir_mode(&self, name: &str, _mode: u32) -> io::Result<Dir> {
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
            Ok(f) => Ok((regular(f)?, true)),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Ok((regular(File::open(&p)?)?, false)),
            Err(e) => Err(e),
        }
    }
    pub fn open_read(&self, name: &str) -> io::Result<File> {
        let p = self.path.join(name);
        refuse_link(&p)?;
        regular(File::open(p)?)
    }
    /// Kind, identity (volume serial, file index) and size, without following a link.
    pub fn stat(&self, name: &str) -> io::Result<Option<EntryStat>> {
        let file = match open_entry(&self.path.join(name), false) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let info = identity::handle_info(&file)?;
        let attrs = info.dwFileAttributes;
        let kind = if attrs & wfs::FILE_ATTRIBUTE_REPARSE_POINT != 0 {
            EntryKind::Symlink
        } else if attrs & wfs::FILE_ATTRIBUTE_DIRECTORY != 0 {
            EntryKind::Dir
        } else {
            EntryKind::File
        };
        let (dev, ino) = identity::of_info(&info);
        Ok(Some(EntryStat {
            kind,
            dev,
            ino,
            size: (u64::from(info.nFileSizeHigh) << 32) | u64::from(info.nFileSizeLow),
            // 100 ns ticks since 1601: only compared, never converted
            mtime_ns: ((i64::from(info.ftLastWriteTime.dwHighDateTime) << 32)
                | i64::from(info.ftLastWriteTime.dwLowDateTime))
            .saturating_mul(100),
        }))
    }
    /// Windows checks access per operation (ACLs, read-only files): nothing is refused ahead.
    pub fn check_writable(&self) -> io::Result<()> {
        Ok(())
    }

    pub fn remove_file(&self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.path.join(name))
    }
    pub fn remove_dir(&self, name: &str) -> io::Result<()> {
        std::fs::remove_dir(self.path.join(name))
    }
    /// Renames, replacing a file there; with `noreplace`, `MoveFileExW` without
    /// `MOVEFILE_REPLACE_EXISTING`, which fails with `AlreadyExists` (one system call).
    pub fn rename(&self, name: &str, to: &Dir, to_name: &str, noreplace: bool) -> io::Result<()> {
        let (from, dest) = (self.path.join(name), to.path.join(to_name));
        if !noreplace {
            return std::fs::rename(from, dest);
        }
        let (from, dest) = (wide(&from), wide(&dest));
        // SAFETY: both are NUL-terminated UTF-16 strings that live across the call.
        if unsafe { wfs::MoveFileExW(from.as_ptr(), dest.as_ptr(), 0) } == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
    /// Not asked for here (nothing is freed in the background on Windows).
    pub fn free_space(&self) -> io::Result<u64> {
        Err(io::ErrorKind::Unsupported.into())
    }
    /// No atomic exchange of two names here: callers rename instead.
    pub fn exchange(&self, _name: &str, _to: &Dir, _to_name: &str) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    pub fn link(&self, name: &str, to: &Dir, to_name: &str) -> io::Result<()> {
        std::fs::hard_link(self.path.join(name), to.path.join(to_name))
    }
    /// A no-op: Windows cannot flush a directory's entries (NTFS journals them).
    pub fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    pub fn create_unnamed(&self) -> io::Result<Option<File>> {
        Ok(None)
    }
    pub fn link_unnamed(&self, _file: &File, _name: &str) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    pub fn identity(&self) -> io::Result<FileId> {
        identity::of_path(&self.path)
    }
    /// The volume (a rename stays within one).
    pub fn mount(&self) -> io::Result<u64> {
        Ok(self.identity()?.0)
    }
    /// Locks the directory's lock file (created when missing). Returns false when `wait`
    /// is off and another handle holds a conflicting lock; an `Unsupported` error when no
    /// lock file can be created here (a read-only directory).
    pub fn lock(&self, exclusive: bool, wait: bool) -> io::Result<bool> {
        let mut slot = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Ok(true);
        }
        let path = self.path.join(LOCK_FILE);
        let mut pending = 0;
        loop {
            let file = match File::options()
                .read(true)
                .write(true)
                .create(true)
                .share_mode(SHARE_ALL)
                .open(&path)
            {
                Ok(file) => file,
                // Deleted by the holder that just released it (delete pending): retry.
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied && pending < 5000 => {
                    if std::fs::symlink_metadata(&path).is_err_and(|e| e.kind() == io::ErrorKind::NotFound) {
                        return Err(io::Error::new(io::ErrorKind::Unsupported, e));
                    }
                    pending += 1;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    return Err(io::Error::new(io::ErrorKind::Unsupported, e))
                }
                Err(e) => return Err(e),
            };
            let mut flags = 0;
            if exclusive {
                flags |= wfs::LOCKFILE_EXCLUSIVE_LOCK;
            }
            if !wait {
                flags |= wfs::LOCKFILE_FAIL_IMMEDIATELY;
            }
            let mut overlapped = windows_sys::Win32::System::IO::OVERLAPPED::default();
            // SAFETY: a synchronous handle we own; `overlapped` (offset 0) outlives the call,
            // which returns only once the lock is granted or refused.
            let ok = unsafe { wfs::LockFileEx(file.as_raw_handle(), flags, 0, 1, 0, &mut overlapped) };
            if ok == 0 {
                let e = io::Error::last_os_error();
                if !wait && e.raw_os_error() == Some(ERROR_LOCK_VIOLATION as i32) {
                    return Ok(false);
                }
                return Err(e);
            }
            // The lock counts only if the file still has the name: a holder deletes it
            // on release, so a waiter may have locked a file that is gone.
            let current = open_entry(&path, false).and_then(|f| identity::of_file(&f));
            if current.ok() == identity::of_file(&file).ok() {
                *slot = Some(Held {
                    _file: file,
                    path,
                    exclusive,
                });
                return Ok(true);
            }
        }
    }
    pub fn unlock(&self) {
        drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
    pub fn entry_names(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.path)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }
}

/// True for the error of a directory where no lock file can be made.
pub fn locks_unsupported(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Unsupported
}
