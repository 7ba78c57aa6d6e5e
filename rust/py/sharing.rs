//! The `#[pyfunction]`s of sharing across processes: mapping memory received from another
//! process (`sys::anon`) and opening many files at once. GIL released for the work.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::py::buffer::Buffer;

/// Maps `nbytes` of the shared memory behind `fd`, a descriptor received from another process
/// (`multiprocessing.reduction.DupFd(...).detach()`), and returns one Buffer per
/// `(offset, nbytes)` slice of it. Takes ownership of `fd` in every case: it is kept with the
/// mapping, or closed at once when this process already maps the same memory (that mapping is
/// reused, so a tree received again opens nothing new) or when the call fails.
#[cfg(unix)]
#[pyfunction]
pub fn receive_shared(
    py: Python<'_>,
    fd: i32,
    nbytes: usize,
    slices: Vec<(usize, usize)>,
) -> PyResult<Vec<Buffer>> {
    use pyo3::exceptions::PyValueError;
    use std::os::fd::{FromRawFd, OwnedFd};
    if fd < 0 {
        return Err(PyValueError::new_err(format!("invalid file descriptor {fd}")));
    }
    // SAFETY: the caller hands over a descriptor it owns and never uses again (the contract of
    // this function, documented above); OwnedFd closes it exactly once.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Some(&(off, n)) = slices
        .iter()
        .find(|&&(off, n)| n == 0 || off.checked_add(n).is_none_or(|end| end > nbytes))
    {
        return Err(PyValueError::new_err(format!(
            "slice of {n} bytes at {off} is outside the {nbytes} bytes of shared memory"
        )));
    }
    let region = py.detach(|| crate::sys::anon::receive(owned, nbytes))?;
    Ok(slices
        .into_iter()
        .map(|(off, n)| Buffer::slice(&region, off, n))
        .collect())
}

/// One arena of a message: `(fd, arena_nbytes, slices, positions)`.
#[cfg(unix)]
type ArenaGroup = (i32, usize, Vec<(usize, usize)>, Vec<usize>);

/// Groups `buffers` (the leaves of one tree, in order) by the arena they slice, in one call:
/// returns `(arenas, others)`, each arena `(fd, arena_nbytes, [(offset, nbytes)], [position])`
/// in order of first use, and the positions of the buffers that have no descriptor to pass
/// (file maps). The fds stay owned by the buffers.
#[cfg(unix)]
#[pyfunction]
pub fn group_shared(buffers: Vec<Bound<'_, Buffer>>) -> (Vec<ArenaGroup>, Vec<usize>) {
    use std::collections::HashMap;
    use std::os::fd::AsRawFd;
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut arenas: Vec<ArenaGroup> = Vec::new();
    let mut others = Vec::new();
    for (position, buffer) in buffers.iter().enumerate() {
        let buffer = buffer.get();
        let region = buffer.region();
        let Some(fd) = region.fd() else {
            others.push(position);
            continue;
        };
        let id = std::sync::Arc::as_ptr(region) as usize;
        let at = *index.entry(id).or_insert_with(|| {
            arenas.push((fd.as_raw_fd(), region.len(), Vec::new(), Vec::new()));
            arenas.len() - 1
        });
        arenas[at].2.push((buffer.offset(), buffer.len()));
        arenas[at].3.push(position);
    }
    (arenas, others)
}

/// Number of shared-memory arenas this process maps now (made here or received).
#[cfg(unix)]
#[pyfunction]
pub fn shared_regions() -> usize {
    crate::sys::anon::live_regions()
}

/// Maps the first `nbytes` of each `(path, nbytes)` file (which must be at least that long),
/// in one call with the GIL released: a tree's file-backed leaves opened in another process.
#[pyfunction]
pub fn open_files(py: Python<'_>, files: Vec<(PathBuf, usize)>) -> PyResult<Vec<Buffer>> {
    let regions = py.detach(|| {
        files
            .iter()
            .map(|(path, nbytes)| {
                if *nbytes == 0 {
                    return Err(crate::error::Error::tree(path, "empty tensors have no data file"));
                }
                crate::tree::load::open_file(path, *nbytes, false)
            })
            .collect::<crate::error::Result<Vec<_>>>()
    })?;
    Ok(regions.into_iter().map(Buffer::new).collect())
}
