//! The buffer object exported to Python: it owns one mapped region and hands it out through
//! the buffer protocol as flat `uint8` bytes. Python types it with `torch.frombuffer`.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::sys::storage::Region;

/// A mapped region (anonymous shared memory or a file) exposed through the buffer protocol.
///
/// The region is unmapped when the last reference goes: `torch.frombuffer` keeps this object
/// alive as long as any tensor viewing it lives.
#[pyclass(frozen, module = "tensordict_rs._native")]
pub struct Buffer {
    region: Arc<Region>,
    offset: usize,
    len: usize,
}

impl Buffer {
    /// Wraps a whole region.
    pub fn new(region: Region) -> Self {
        let len = region.len();
        Buffer {
            region: Arc::new(region),
            offset: 0,
            len,
        }
    }

    /// A part of a shared region (the leaves of one anonymous arena).
    pub fn slice(region: &Arc<Region>, offset: usize, len: usize) -> Self {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= region.len()),
            "slice out of range"
        );
        Buffer {
            region: Arc::clone(region),
            offset,
            len,
        }
    }

    /// The region, shared.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// Start of this buffer's bytes.
    pub fn as_ptr(&self) -> *mut u8 {
        // SAFETY: `offset + len <= region.len()` (checked in `slice`), so this stays in the map.
        unsafe { self.region.as_ptr().add(self.offset) }
    }

    /// Where this buffer starts in its region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length of this buffer in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer (never made: empty tensors are not mapped).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[pymethods]
impl Buffer {
    /// Exports the bytes: one dimension, `uint8`, writable unless the map is read-only.
    ///
    /// # Safety
    /// Called by CPython with a valid `view` pointer (or null, which is refused).
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("the buffer view is null"));
        }
        let this = slf.get();
        let (ptr, len, writable) = (this.as_ptr(), this.len, this.region.writable());
        if (flags & ffi::PyBUF_WRITABLE) == ffi::PyBUF_WRITABLE && !writable {
            return Err(PyBufferError::new_err("this memory map is read-only"));
        }
        // SAFETY: `view` is non-null and CPython hands us an uninitialised Py_buffer to fill.
        // `obj` takes a strong reference to the owner, so the mapping outlives the view; the
        // shape and strides pointers point into the view itself, which CPython keeps in place
        // until __releasebuffer__; the format string is a static C string.
        unsafe {
            (*view).obj = slf.into_any().into_ptr();
            (*view).buf = ptr as *mut c_void;
            (*view).len = len as isize;
            (*view).readonly = c_int::from(!writable);
            (*view).itemsize = 1;
            (*view).format = if (flags & ffi::PyBUF_FORMAT) == ffi::PyBUF_FORMAT {
                c"B".as_ptr() as *mut c_char
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if (flags & ffi::PyBUF_ND) == ffi::PyBUF_ND {
                &mut (*view).len
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if (flags & ffi::PyBUF_STRIDES) == ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    /// Nothing was allocated per view, so there is nothing to free; never fails.
    ///
    /// # Safety
    /// Called by CPython with the view filled by `__getbuffer__`.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    /// Address of the first byte (for handing this buffer to another native call as a source).
    #[getter]
    fn address(&self) -> usize {
        self.as_ptr() as usize
    }

    /// (device, inode) of the file this buffer maps shared, if any (None for anonymous
    /// memory and copy-on-write maps).
    #[getter]
    fn file_id(&self) -> Option<(u64, u64)> {
        self.region.file_id()
    }

    /// Absolute path of the backing file, or None for anonymous memory and archive leaves.
    #[getter]
    fn filename(&self) -> Option<String> {
        if self.region.archive_id().is_some() {
            return None;
        }
        self.region.path().map(|p| p.to_string_lossy().into_owned())
    }

    /// How another process can map this buffer's memory: `(fd, arena_nbytes, offset)`, where
    /// `fd` is the arena's descriptor (still owned by this buffer: duplicate it to pass it on),
    /// or None for file maps (they travel by path) and memory without a descriptor.
    #[getter]
    fn share_handle(&self) -> Option<(i32, usize, usize)> {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            self.region
                .fd()
                .map(|fd| (fd.as_raw_fd(), self.region.len(), self.offset))
        }
        #[cfg(not(unix))]
        None
    }

    /// An identity of the mapped region, the same for every buffer that slices it (while it
    /// lives): leaves of one arena group under one descriptor when they cross processes.
    #[getter]
    fn region_id(&self) -> usize {
        Arc::as_ptr(&self.region) as usize
    }

    /// For a leaf of a `.tdz` archive: `(path, (device, inode), offset, shared)`, what a pickle
    /// needs to map the same bytes again; None otherwise.
    #[getter]
    fn archive(&self) -> Option<(String, (u64, u64), usize, bool)> {
        let identity = self.region.archive_id()?;
        let path = self.region.path()?.to_string_lossy().into_owned();
        let shared = self.region.mode() == crate::sys::storage::MapMode::Shared;
        Some((path, identity, self.offset, shared))
    }

    /// A Buffer over `nbytes` bytes of this buffer's region from address `address` (the bytes of
    /// several leaves of one anonymous arena at once, keeping the arena alive), or None when
    /// that range is not inside the region or the region is not anonymous memory.
    fn arena_span(&self, address: usize, nbytes: usize) -> Option<Buffer> {
        let offset = self.region.arena_offset(address, nbytes)?;
        Some(Buffer::slice(&self.region, offset, nbytes))
    }

    /// Writes the `nbytes` at `data_ptr` into the backing file at the place this buffer shows
    /// at `address` (inside it), with a positioned write, the GIL released: the bytes land in
    /// the page cache this map shows without faulting its pages in. Only for a shared map of a
    /// file (`file_id` not None), whose file must still be the one mapped.
    fn write_through(&self, py: Python<'_>, address: usize, data_ptr: usize, nbytes: usize) -> PyResult<()> {
        let (Some(path), Some(identity)) = (self.region.path(), self.region.file_id()) else {
            return Err(PyBufferError::new_err(
                "write_through: not a shared map of a file",
            ));
        };
        let start = self.as_ptr() as usize;
        let inside = address
            .checked_sub(start)
            .filter(|at| at.checked_add(nbytes).is_some_and(|end| end <= self.len));
        let Some(at) = inside else {
            return Err(PyBufferError::new_err(
                "write_through: the range is not inside this buffer",
            ));
        };
        // A region with a file identity maps its file from offset 0 (`storage::map_file`).
        let offset = (self.offset + at) as u64;
        // SAFETY: the Python layer keeps the source tensor alive during this call.
        let data = unsafe { super::source_slice(data_ptr, nbytes) }.unwrap_or(&[]);
        let path = path.to_path_buf();
        Ok(py.detach(|| crate::tree::grow::write_existing(&path, identity, offset, data))?)
    }

    /// Whether writes are allowed through this buffer.
    #[getter]
    fn writable(&self) -> bool {
        self.region.writable()
    }

    /// Writes dirty pages to the backing file and waits for the disk (msync); the GIL is
    /// released meanwhile. A no-op for anonymous memory.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let region = Arc::clone(&self.region);
        py.detach(move || region.flush()).map_err(PyErr::from)
    }

    fn __len__(&self) -> usize {
        self.len
    }

    fn __repr__(&self) -> String {
        match self.region.path() {
            Some(p) => format!(
                "Buffer(nbytes={}, filename={:?})",
                self.len,
                p.display().to_string()
            ),
            None if self.region.is_borrowed() => format!("Buffer(nbytes={}, borrowed)", self.len),
            None => format!("Buffer(nbytes={}, anonymous)", self.len),
        }
    }
}

/// A Buffer over the memory of `source`, any object with the buffer protocol (a `memoryview`,
/// `bytes`, `bytearray`, a `pickle.PickleBuffer`, an object store's buffer), without a copy.
///
/// The Buffer holds `source`'s buffer view until the last tensor or slice made from it goes,
/// so the memory stays alive and in place meanwhile. It is read-only (it refuses writable
/// requests, and nothing in this crate writes through it) when `source` exported it
/// read-only, or when `writable` is False. The memory must be C-contiguous (any item
/// format: its bytes are taken as they are). `ValueError` otherwise.
#[pyfunction]
#[pyo3(signature = (source, writable = true))]
pub fn borrow_buffer(source: &Bound<'_, PyAny>, writable: bool) -> PyResult<Buffer> {
    use pyo3::buffer::PyUntypedBuffer;
    use pyo3::exceptions::PyValueError;
    let view = PyUntypedBuffer::get(source)?;
    if !view.is_c_contiguous() {
        return Err(PyValueError::new_err(
            "a buffer lent to a tree must be C-contiguous (one range of bytes)",
        ));
    }
    let (address, len) = (view.buf_ptr().cast::<u8>(), view.len_bytes());
    let writable = writable && !view.readonly();
    // SAFETY: `view` is a live buffer view of `source` (PyObject_GetBuffer succeeded), which by
    // the buffer protocol keeps `[address, address + len)` valid and in place until the view is
    // released; the region owns `view` and releases it only when it is dropped, after every
    // Buffer (and so every tensor) over it is gone. `writable` is false when the exporter lent
    // the memory read-only, so the region then exports it read-only and never writes to it.
    let region = unsafe { Region::borrowed(address, len, writable, Box::new(view)) };
    Ok(Buffer::new(region))
}
