//! Which file a handle or a name is: its (device, inode) on Unix, its (volume serial number,
//! file index) on Windows. The one place these are read: a save keeps a file when it still is
//! the one a source maps, a load sees a tree replaced under it, a pickled archive leaf refuses
//! an archive replaced since, a process maps each shared-memory object once.

#[cfg(windows)]
use std::fs::File;
use std::io;
use std::path::Path;

/// A file's identity: (device, inode), or (volume serial number, file index) on Windows.
pub type FileId = (u64, u64);

/// The identity of an open file: one `fstat` (std's `metadata` is a `statx` with an empty
/// path, which costs more per call).
#[cfg(unix)]
pub fn of_file(file: &impl std::os::fd::AsFd) -> io::Result<FileId> {
    Ok(of_stat(&rustix::fs::fstat(file)?))
}

/// A file's identity, size and modification time: what tells whether it was replaced (a new
/// identity) or rewritten in place (size, time) since it was looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Nanoseconds (Unix: since the epoch; Windows: since 1601, only ever compared).
    pub mtime_ns: i64,
}

/// The stamp of an open file: one `fstat`.
#[cfg(unix)]
pub fn stamp_of_file(file: &impl std::os::fd::AsFd) -> io::Result<Stamp> {
    let st = rustix::fs::fstat(file)?;
    let (dev, ino) = of_stat(&st);
    Ok(Stamp {
        dev,
        ino,
        size: st.st_size as u64,
        mtime_ns: mtime_ns(&st),
    })
}

/// The stamp of an open file (`GetFileInformationByHandle`).
#[cfg(windows)]
pub fn stamp_of_file(file: &File) -> io::Result<Stamp> {
    let info = handle_info(file)?;
    let (dev, ino) = of_info(&info);
    Ok(Stamp {
        dev,
        ino,
        size: (u64::from(info.nFileSizeHigh) << 32) | u64::from(info.nFileSizeLow),
        mtime_ns: ((i64::from(info.ftLastWriteTime.dwHighDateTime) << 32)
            | i64::from(info.ftLastWriteTime.dwLowDateTime))
        .saturating_mul(100),
    })
}

/// The modification time in a `stat` result, in nanoseconds since the epoch.
#[cfg(unix)]
#[allow(clippy::unnecessary_cast)] // time_t is not i64 on every Unix
pub fn mtime_ns(st: &rustix::fs::Stat) -> i64 {
    (st.st_mtime as i64)
        .saturating_mul(1_000_000_000)
        .saturating_add(st.st_mtime_nsec as i64)
}

/// The identity of an open file (`GetFileInformationByHandle`).
#[cfg(windows)]
pub fn of_file(file: &File) -> io::Result<FileId> {
    Ok(of_info(&handle_info(file)?))
}

/// The identity of the file at `path`, following a final symlink (as `Dir::open` does).
#[cfg(unix)]
pub fn of_path(path: &Path) -> io::Result<FileId> {
    Ok(of_stat(&rustix::fs::stat(path)?))
}

/// The identity of the file at `path`, following a final link (as `Dir::open` does).
#[cfg(windows)]
pub fn of_path(path: &Path) -> io::Result<FileId> {
    of_file(&open_entry(path, true)?)
}

/// The identity in std's metadata of a file. Only Unix has it there: Windows' `Metadata`
/// lacks the file index on stable Rust (None; `of_file` asks the handle).
pub fn of_metadata(md: &std::fs::Metadata) -> Option<FileId> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((md.dev(), md.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = md;
        None
    }
}

/// The identity in a `stat` result.
#[cfg(unix)]
#[allow(clippy::unnecessary_cast)] // dev_t and ino_t are not u64 on every Unix
pub fn of_stat(st: &rustix::fs::Stat) -> FileId {
    (st.st_dev as u64, st.st_ino as u64)
}

/// What Windows says about an open handle: attributes, size, volume and file index.
#[cfg(windows)]
pub fn handle_info(
    file: &File,
) -> io::Result<windows_sys::Win32::Storage::FileSystem::BY_HANDLE_FILE_INFORMATION> {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Storage::FileSystem as wfs;
    // SAFETY: the struct is plain old data; zeroed is a valid initial value.
    let mut info: wfs::BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: `file` owns a valid handle for the call and `info` is a valid out-pointer.
    if unsafe { wfs::GetFileInformationByHandle(file.as_raw_handle(), &mut info) } == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}

/// The identity in a handle's information: volume serial number and file index.
#[cfg(windows)]
pub fn of_info(info: &windows_sys::Win32::Storage::FileSystem::BY_HANDLE_FILE_INFORMATION) -> FileId {
    let index = (u64::from(info.nFileIndexHigh) << 32) | u64::from(info.nFileIndexLow);
    (u64::from(info.dwVolumeSerialNumber), index)
}

/// Opens an entry for its metadata only (no access rights, every share mode), following a
/// final link or not; backup semantics let a directory be opened too.
#[cfg(windows)]
pub fn open_entry(path: &Path, follow: bool) -> io::Result<File> {
    use std::os::windows::fs::OpenOptionsExt;
    use windows_sys::Win32::Storage::FileSystem as wfs;
    let mut flags = wfs::FILE_FLAG_BACKUP_SEMANTICS;
    if !follow {
        flags |= wfs::FILE_FLAG_OPEN_REPARSE_POINT;
    }
    File::options()
        .access_mode(0)
        .share_mode(wfs::FILE_SHARE_READ | wfs::FILE_SHARE_WRITE | wfs::FILE_SHARE_DELETE)
        .custom_flags(flags)
        .open(path)
}

#[cfg(test)]
mod tests;
