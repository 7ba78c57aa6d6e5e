//! The exceptions of tensordict_rs and the one bridge from the crate's `Error` to them,
//! `From<Error> for PyErr`: io not-found / permission / exists become `FileNotFoundError`,
//! `PermissionError`, `FileExistsError` (and so on, from the errno), with the path; the
//! others the library's own classes. The classes live in module `tensordict_rs` (their
//! Python-visible path, which pickles and `except` clauses name), re-exported from
//! `__init__.py`.

use std::io;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyFileExistsError, PyOSError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use pyo3::PyErr;

use crate::error::Error;

create_exception!(
    tensordict_rs,
    TensorDictError,
    PyException,
    "Base class of every error raised by tensordict_rs (I/O errors stay OSError)."
);
create_exception!(
    tensordict_rs,
    InvalidDirectoryError,
    TensorDictError,
    "A saved directory is damaged or hostile: bad meta.json, short file, bad key, symlink."
);
create_exception!(
    tensordict_rs,
    UnsupportedFormatError,
    TensorDictError,
    "A saved directory is valid but holds something this library refuses to load (pickle, nested tensors, newer format)."
);
create_exception!(
    tensordict_rs,
    InvalidTreeError,
    TensorDictError,
    "A TensorDict cannot be saved as given: reserved key, colliding file names, bad shape."
);

// Errors that tensordict raises as `RuntimeError` are `RuntimeError`s here too, and also the
// precise class: `except RuntimeError` (code written for tensordict) and `except
// FileExistsError` / `except InvalidTreeError` both catch them. create_exception! takes one
// base, so these are made with `type(name, bases, namespace)` once, on first use.
static FILE_EXISTS_RUNTIME: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static SYMLINK: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static LOCKED: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn dual_type<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
    doc: &str,
    bases: Vec<Bound<'py, PyType>>,
) -> PyResult<Bound<'py, PyType>> {
    cell.get_or_try_init(py, || {
        let namespace = PyDict::new(py);
        namespace.set_item("__module__", "tensordict_rs")?;
        namespace.set_item("__doc__", doc)?;
        let made = py
            .get_type::<PyType>()
            .call1((name, PyTuple::new(py, bases)?, namespace))?;
        Ok(made.cast_into::<PyType>()?.unbind())
    })
    .map(|t| t.bind(py).clone())
}

/// `FileExistsRuntimeError(FileExistsError, RuntimeError)`: a file or tree that exists where
/// a new one was asked for (tensordict raises `RuntimeError("... already exists")`).
pub fn file_exists_runtime_error(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    dual_type(
        py,
        &FILE_EXISTS_RUNTIME,
        "FileExistsRuntimeError",
        "A file or tree already exists where a new one was asked for (FileExistsError, and a RuntimeError as tensordict raises).",
        vec![py.get_type::<PyFileExistsError>(), py.get_type::<PyRuntimeError>()],
    )
}

/// `SymlinkError(InvalidDirectoryError, InvalidTreeError, RuntimeError)`: a symlink where a
/// file or directory of the tree should be; never followed, to read or to write.
pub fn symlink_error(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    dual_type(
        py,
        &SYMLINK,
        "SymlinkError",
        "A symlink where a file or directory of a tree should be; it is never followed (a RuntimeError too, as tensordict raises).",
        vec![
            py.get_type::<InvalidDirectoryError>(),
            py.get_type::<InvalidTreeError>(),
            py.get_type::<PyRuntimeError>(),
        ],
    )
}

/// `LockedError(TensorDictError, RuntimeError)`: a key change on a locked TensorDict.
pub fn locked_error(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    dual_type(
        py,
        &LOCKED,
        "LockedError",
        "A key was added, removed or replaced in a locked TensorDict (a RuntimeError too, as tensordict raises).",
        vec![py.get_type::<TensorDictError>(), py.get_type::<PyRuntimeError>()],
    )
}

/// Errno for an `io::Error` that has none (errors built by std or by us from a kind).
fn errno_for_kind(kind: io::ErrorKind) -> i32 {
    #[cfg(unix)]
    {
        match kind {
            io::ErrorKind::NotFound => libc::ENOENT,
            io::ErrorKind::PermissionDenied => libc::EACCES,
            io::ErrorKind::AlreadyExists => libc::EEXIST,
            io::ErrorKind::StorageFull => libc::ENOSPC,
            _ => libc::EIO,
        }
    }
    #[cfg(not(unix))]
    {
        match kind {
            io::ErrorKind::NotFound => 2,
            io::ErrorKind::PermissionDenied => 13,
            io::ErrorKind::AlreadyExists => 17,
            io::ErrorKind::StorageFull => 28,
            _ => 5,
        }
    }
}

impl From<Error> for PyErr {
    fn from(err: Error) -> PyErr {
        match err {
            Error::Io { path, source } => {
                let errno = source
                    .raw_os_error()
                    .unwrap_or_else(|| errno_for_kind(source.kind()));
                // OSError(errno, strerror, filename) picks the subclass from errno itself:
                // FileNotFoundError, PermissionError, FileExistsError, NotADirectoryError...
                let strerror = match source.raw_os_error() {
                    Some(_) => io::Error::from_raw_os_error(errno).to_string(),
                    None => source.to_string(),
                };
                let strerror = match strerror.find(" (os error") {
                    Some(cut) => strerror[..cut].to_string(),
                    None => strerror,
                };
                let path = path.to_string_lossy().into_owned();
                if source.kind() == io::ErrorKind::AlreadyExists {
                    // tensordict's "The file ... already exists." is a RuntimeError
                    // (a message of our own, e.g. a foreign file in the way, is kept)
                    let errno = errno_for_kind(io::ErrorKind::AlreadyExists);
                    let message = match source.raw_os_error() {
                        Some(_) => "File already exists".to_string(),
                        None => strerror,
                    };
                    return Python::attach(|py| match file_exists_runtime_error(py) {
                        Ok(ty) => PyErr::from_type(ty, (errno, message, path)),
                        Err(err) => err,
                    });
                }
                // Windows: the OS code is a Win32 error, not an errno; OSError(errno, strerror,
                // filename, winerror) maps it to the errno and the subclass, as CPython does.
                #[cfg(windows)]
                if let Some(winerror) = source.raw_os_error() {
                    let errno = errno_for_kind(source.kind());
                    return PyOSError::new_err((errno, strerror, path, winerror));
                }
                PyOSError::new_err((errno, strerror, path))
            }
            Error::Invalid { .. } => InvalidDirectoryError::new_err(err.to_string()),
            Error::Unsupported { .. } => UnsupportedFormatError::new_err(err.to_string()),
            Error::Tree { .. } => InvalidTreeError::new_err(err.to_string()),
            Error::Symlink { .. } => Python::attach(|py| match symlink_error(py) {
                Ok(ty) => PyErr::from_type(ty, err.to_string()),
                Err(made) => made,
            }),
        }
    }
}
