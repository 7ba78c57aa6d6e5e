//! The one error type of the crate. Plain Rust: every module below `py` uses it without
//! pyo3; its mapping to Python exceptions, the one `From<Error> for PyErr`, is `py/errors.rs`.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Everything that can go wrong in the Rust core. Every variant carries the path it concerns.
#[derive(Debug)]
pub enum Error {
    /// An operating-system error on `path`.
    Io { path: PathBuf, source: io::Error },
    /// The directory at `path` is damaged or was crafted to escape; it must not load.
    Invalid { path: PathBuf, message: String },
    /// The directory at `path` is well formed but holds data this library will not load.
    Unsupported { path: PathBuf, message: String },
    /// The tree handed in for saving cannot be stored in the format.
    Tree { path: PathBuf, message: String },
    /// A symlink at `path`, where the tree has a file or directory: never followed.
    Symlink { path: PathBuf, message: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl AsRef<Path>, source: io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    /// A damaged-directory error for `path`.
    pub fn invalid(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Error::Invalid {
            path: path.as_ref().to_path_buf(),
            message: message.into(),
        }
    }

    /// An unsupported-content error for `path`.
    pub fn unsupported(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Error::Unsupported {
            path: path.as_ref().to_path_buf(),
            message: message.into(),
        }
    }

    /// A bad-tree (save input) error for `path`.
    pub fn tree(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Error::Tree {
            path: path.as_ref().to_path_buf(),
            message: message.into(),
        }
    }

    /// A refused-symlink error for `path`.
    pub fn symlink(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Error::Symlink {
            path: path.as_ref().to_path_buf(),
            message: message.into(),
        }
    }

    /// The OS error number, when this is an I/O error that has one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// True when this is an I/O "not found" error.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "{source}: '{}'", path.display()),
            Error::Invalid { path, message }
            | Error::Unsupported { path, message }
            | Error::Tree { path, message }
            | Error::Symlink { path, message } => write!(f, "{message} ('{}')", path.display()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
