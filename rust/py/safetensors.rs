//! `.safetensors` files (`_safetensors.py`): read (mapped, validated) and written, the GIL
//! released.

use std::collections::HashMap;
use std::path::PathBuf;

use pyo3::prelude::*;

use super::buffer::Buffer;
use super::source_slice;
use crate::error::Error;
use crate::safetensors::{self, TensorBytes};

/// One tensor of a read `.safetensors` file: name, torch dtype, shape, bytes (None: empty).
type SafetensorsEntry = (String, &'static str, Vec<u64>, Option<Buffer>);

/// Maps and validates a `.safetensors` file (copy-on-write: writes never reach the file), with
/// the GIL released. Returns `(tensors, metadata)`: the tensors in file order as `(name,
/// dtype, shape, buffer)`, and the file's `__metadata__` (empty when it has none).
#[pyfunction]
pub fn read_safetensors(
    py: Python<'_>,
    path: PathBuf,
) -> PyResult<(Vec<SafetensorsEntry>, HashMap<String, String>)> {
    let file = py.detach(|| safetensors::read(&path))?;
    let map = std::sync::Arc::new(file.map);
    let tensors = file
        .tensors
        .into_iter()
        .map(|t| {
            let buffer = t.data.map(|d| match d {
                TensorBytes::InFile { offset, len } => Buffer::slice(&map, offset, len),
                TensorBytes::Copied(region) => Buffer::new(region),
            });
            (t.name, t.dtype, t.shape, buffer)
        })
        .collect();
    Ok((tensors, file.metadata))
}

/// Writes tensors given as `(name, dtype, shape, data_ptr, nbytes)` and `metadata` to a
/// `.safetensors` file at `path` (written beside it, then renamed over it), with the GIL
/// released.
#[pyfunction]
pub fn write_safetensors(
    py: Python<'_>,
    path: PathBuf,
    tensors: Vec<(String, String, Vec<usize>, usize, usize)>,
    metadata: HashMap<String, String>,
) -> PyResult<()> {
    let mut rows = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, ptr, nbytes) in tensors {
        // SAFETY: the Python layer keeps every source tensor alive during this call.
        let data = unsafe { source_slice(ptr, nbytes) }
            .ok_or_else(|| Error::tree(&path, format!("key {name:?}: no data pointer")))?;
        rows.push(safetensors::WriteTensor {
            name,
            dtype,
            shape,
            data,
        });
    }
    py.detach(|| safetensors::write(&path, &rows, metadata))?;
    Ok(())
}
