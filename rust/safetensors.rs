//! Reading and writing `.safetensors` files (Hugging Face's tensor format) with the
//! `safetensors` crate, the format's own validating parser and serializer. No pyo3 here.
//!
//! A file is read by reading its header with `pread` and validating it with the crate's
//! `Metadata` (the checks of `SafeTensors::read_metadata`): offsets in bounds, contiguous and
//! covering the data exactly, shapes consistent with dtypes; then it is mapped whole,
//! copy-on-write (writes to the tensors never reach the file). Each tensor is
//! then a slice of that one map; a tensor whose offset is not a multiple of its element size
//! (possible in files from other writers) is copied into its own aligned anonymous map.
//! A file is written into a locked staging file beside its target (`sys::staging`, as `.tdz`
//! archives) and renamed over it, so a reader (or a map of the old file) never sees a partial
//! file, and what a killed write left is removed by the next write to the same path.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, Metadata, View};

use crate::error::{Error, Result};
use crate::sys::dir::Dir;
use crate::sys::staging;
use crate::sys::storage::{self, MapMode, Region};

/// torch dtype strings (`str(torch.dtype)`) and their safetensors names, as the `safetensors`
/// Python package maps them.
const DTYPES: &[(&str, Dtype)] = &[
    ("torch.bool", Dtype::BOOL),
    ("torch.uint8", Dtype::U8),
    ("torch.int8", Dtype::I8),
    ("torch.int16", Dtype::I16),
    ("torch.uint16", Dtype::U16),
    ("torch.float16", Dtype::F16),
    ("torch.bfloat16", Dtype::BF16),
    ("torch.int32", Dtype::I32),
    ("torch.uint32", Dtype::U32),
    ("torch.float32", Dtype::F32),
    ("torch.complex64", Dtype::C64),
    ("torch.float64", Dtype::F64),
    ("torch.int64", Dtype::I64),
    ("torch.uint64", Dtype::U64),
    ("torch.float8_e5m2", Dtype::F8_E5M2),
    ("torch.float8_e4m3fn", Dtype::F8_E4M3),
    ("torch.float8_e4m3fnuz", Dtype::F8_E4M3FNUZ),
    ("torch.float8_e5m2fnuz", Dtype::F8_E5M2FNUZ),
];

/// Every dtype of the table is whole bytes wide (the sub-byte F4/F6 types have no entry).
fn to_safetensors_dtype(name: &str) -> Option<Dtype> {
    DTYPES.iter().find(|(n, _)| *n == name).map(|(_, d)| *d)
}

fn to_torch_dtype(dtype: Dtype) -> Option<&'static str> {
    DTYPES.iter().find(|(_, d)| *d == dtype).map(|(n, _)| *n)
}

/// One tensor of a read file: its name, torch dtype string, shape, and bytes (None: empty).
pub struct ReadTensor {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    pub data: Option<TensorBytes>,
}

/// Where a read tensor's bytes are: a slice of the file's map, or a copy of their own.
pub enum TensorBytes {
    InFile { offset: usize, len: usize },
    Copied(Region),
}

/// A read file: the map of the whole file, the tensors in file order, and `__metadata__`.
pub struct ReadFile {
    pub map: Region,
    pub tensors: Vec<ReadTensor>,
    pub metadata: HashMap<String, String>,
}

fn invalid(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::invalid(path, format!("not a valid safetensors file: {what}"))
}

/// The largest header read (the `safetensors` crate's own limit).
const MAX_HEADER: u64 = 100_000_000;

/// `len` bytes at `at`, read with `pread`: a file that shrank gives an error naming it.
fn read_at(file: &std::fs::File, path: &Path, at: u64, len: u64) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; usize::try_from(len).map_err(|_| invalid(path, "too large"))?];
    storage::read_exact_at(file, &mut buf, at).map_err(|e| changed(path, e))?;
    Ok(buf)
}

fn changed(path: &Path, e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        invalid(
            path,
            "the file is shorter than its header says: it changed while it was read (rewritten in place?), or is truncated",
        )
    } else {
        Error::io(path, e)
    }
}

/// Maps and validates the file at `path`; see the module documentation. The header is read
/// with `pread` (not through the map), so a file rewritten in place while it is read gives an
/// error, not SIGBUS; only the returned views read through the map.
pub fn read(path: &Path) -> Result<ReadFile> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let md = file.metadata().map_err(|e| Error::io(path, e))?;
    if !md.is_file() {
        return Err(Error::invalid(path, "not a regular file"));
    }
    let len = usize::try_from(md.len()).map_err(|_| invalid(path, "too large"))?;
    if len < 8 {
        return Err(invalid(
            path,
            format!("{len} bytes, shorter than the header length"),
        ));
    }
    let n_bytes = read_at(&file, path, 0, 8)?;
    let n = u64::from_le_bytes(n_bytes.try_into().unwrap_or([0xFF; 8]));
    if n > MAX_HEADER {
        return Err(invalid(path, "header too large"));
    }
    if n + 8 > len as u64 {
        return Err(invalid(path, "invalid header length"));
    }
    let header = read_at(&file, path, 8, n)?;
    let text = std::str::from_utf8(&header).map_err(|e| invalid(path, format!("invalid header: {e}")))?;
    // The same checks as `SafeTensors::read_metadata` (offsets contiguous, sizes matching the
    // dtypes and shapes), on the header alone; then the data must cover the file exactly.
    let metadata: Metadata =
        serde_json::from_str(text).map_err(|e| invalid(path, format!("invalid JSON in header: {e}")))?;
    if (metadata.data_len() as u64).checked_add(8 + n) != Some(len as u64) {
        return Err(invalid(path, "incomplete metadata, file not fully covered"));
    }
    let header = usize::try_from(n).map_err(|_| invalid(path, "too large"))?;
    let map = storage::map_file(&file, len, Some(path.to_path_buf()), MapMode::CopyOnWrite)
        .map_err(|e| Error::io(path, e))?;
    let start = 8 + header;
    let mut tensors = Vec::with_capacity(metadata.tensors().len());
    for name in metadata.offset_keys() {
        let info = metadata
            .info(&name)
            .ok_or_else(|| invalid(path, format!("tensor {name:?} has no entry")))?;
        let dtype = to_torch_dtype(info.dtype).ok_or_else(|| {
            Error::unsupported(
                path,
                format!(
                    "tensor {name:?}: dtype {:?} has no torch equivalent here",
                    info.dtype
                ),
            )
        })?;
        let (begin, end) = info.data_offsets;
        let len = end - begin; // validated with the metadata: begin <= end, within the data
        let offset = start + begin;
        let data = if len == 0 {
            None
        } else if offset % (info.dtype.bitsize() / 8).max(1) == 0 {
            Some(TensorBytes::InFile { offset, len })
        } else {
            let copy = crate::sys::anon::anonymous(None, len)?;
            // SAFETY: `copy` is a fresh writable map of `len` bytes that nothing else sees
            // yet; the slice lives only for this read into it.
            let out = unsafe { std::slice::from_raw_parts_mut(copy.as_ptr(), len) };
            storage::read_exact_at(&file, out, offset as u64).map_err(|e| changed(path, e))?;
            Some(TensorBytes::Copied(copy))
        };
        tensors.push(ReadTensor {
            name,
            dtype,
            shape: info.shape.iter().map(|&d| d as u64).collect(),
            data,
        });
    }
    // The views read through the map: the file must still cover it.
    if file.metadata().map_err(|e| Error::io(path, e))?.len() < len as u64 {
        return Err(invalid(
            path,
            "the file shrank while it was read (rewritten in place?)",
        ));
    }
    let extra = metadata.metadata().clone().unwrap_or_default();
    Ok(ReadFile {
        map,
        tensors,
        metadata: extra,
    })
}

/// One tensor to write: its name, torch dtype string, shape and C-order bytes.
pub struct WriteTensor<'a> {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

struct TensorRef<'a> {
    dtype: Dtype,
    shape: &'a [usize],
    data: &'a [u8],
}

impl View for &TensorRef<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// A tensor as the header sees it: dtype, shape and length, no bytes. The crate lays the
/// header out from these (its order and offsets), and `write` puts the bytes where it says.
struct HeaderOnly<'a>(&'a TensorRef<'a>);

impl View for HeaderOnly<'_> {
    fn dtype(&self) -> Dtype {
        self.0.dtype
    }
    fn shape(&self) -> &[usize] {
        self.0.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&[])
    }
    fn data_len(&self) -> usize {
        self.0.data.len()
    }
}

/// Writes `tensors` and `metadata` to `path`: into a locked staging file beside it
/// (`sys::staging`), then renamed over it, so a reader or a map of the old file never sees a
/// partial file, and a killed write's staging file is removed by the next write to `path`. The
/// header is the crate's (`serialize` of the tensors without their bytes), so the file is
/// byte for byte what the crate and the Python package write. A new file is 0600, as the
/// package makes them; a replaced file keeps its permissions, and a symlink given as `path` is
/// followed once (the file it names is replaced), as for `.tdz` archives.
pub fn write(path: &Path, tensors: &[WriteTensor<'_>], metadata: HashMap<String, String>) -> Result<()> {
    let mut refs = Vec::with_capacity(tensors.len());
    for t in tensors {
        let dtype = to_safetensors_dtype(&t.dtype).ok_or_else(|| {
            Error::tree(
                path,
                format!(
                    "key {:?}: dtype {} cannot be stored in a safetensors file",
                    t.name, t.dtype
                ),
            )
        })?;
        let expect = t
            .shape
            .iter()
            .try_fold(dtype.bitsize() / 8, |n, &d| n.checked_mul(d))
            .ok_or_else(|| Error::tree(path, format!("key {:?}: shape overflows", t.name)))?;
        if expect != t.data.len() {
            return Err(Error::tree(
                path,
                format!(
                    "key {:?}: {} bytes given for shape {:?}",
                    t.name,
                    t.data.len(),
                    t.shape
                ),
            ));
        }
        refs.push((
            t.name.as_str(),
            TensorRef {
                dtype,
                shape: &t.shape,
                data: t.data,
            },
        ));
    }
    let target = staging::resolve_target(path)?;
    let parent_path = target
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    if !parent_path.is_dir() {
        return Err(Error::io(&parent_path, io::Error::from(io::ErrorKind::NotFound)));
    }
    let base = target
        .file_name()
        .ok_or_else(|| Error::tree(&target, "the path must name a file"))?
        .to_string_lossy()
        .into_owned();
    let cannot = |e: safetensors::SafeTensorError| match e {
        safetensors::SafeTensorError::IoError(err) => Error::io(&target, err),
        other => Error::tree(&target, format!("cannot write a safetensors file: {other}")),
    };
    let info = if metadata.is_empty() { None } else { Some(metadata) };
    // the 8-byte length and the padded header, without any tensor bytes
    let header =
        safetensors::serialize(refs.iter().map(|(n, t)| (*n, HeaderOnly(t))), info).map_err(cannot)?;
    let laid_out: Metadata = serde_json::from_slice(&header[8..])
        .map_err(|e| Error::tree(&target, format!("cannot write a safetensors file: {e}")))?;
    let by_name: HashMap<&str, &[u8]> = refs.iter().map(|(n, t)| (*n, t.data)).collect();
    let mut order = Vec::with_capacity(refs.len());
    let mut end = 0usize;
    for name in laid_out.offset_keys() {
        let (data, info) = by_name
            .get(name.as_str())
            .zip(laid_out.info(&name))
            .ok_or_else(|| {
                Error::tree(
                    &target,
                    format!("cannot write a safetensors file: key {name:?} in no header"),
                )
            })?;
        if info.data_offsets != (end, end + data.len()) {
            return Err(Error::tree(
                &target,
                format!("cannot write a safetensors file: key {name:?} laid out out of order"),
            ));
        }
        end += data.len();
        order.push(*data);
    }
    let old_permissions = std::fs::metadata(&target).ok().map(|md| md.permissions());
    let parent = Dir::open(&parent_path).map_err(|e| Error::io(&parent_path, e))?;
    let (name, file) = staging::create_staging(&parent, &base)?;
    let staging_path = parent.child_path(&name);
    let written = (|| -> io::Result<()> {
        file.set_len((header.len() + end) as u64)?;
        let mut out = io::BufWriter::with_capacity(1 << 20, &file);
        out.write_all(&header)?;
        for data in order {
            out.write_all(data)?;
        }
        out.flush()?;
        drop(out);
        match old_permissions {
            Some(permissions) => file.set_permissions(permissions)?,
            #[cfg(unix)]
            None => {
                // as the `safetensors` package's files (the crate's temporary files are 0600)
                use std::os::unix::fs::PermissionsExt;
                file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            }
            #[cfg(not(unix))]
            None => {}
        }
        Ok(())
    })()
    .map_err(|e| Error::io(&staging_path, e))
    .and_then(|()| std::fs::rename(&staging_path, &target).map_err(|e| Error::io(&target, e)));
    if let Err(e) = written {
        // Our own staging file beside the target, which is untouched. If the removal fails,
        // the file (locked name, ours) is swept by the next write to this path.
        let _ = parent.remove_file(&name);
        return Err(e);
    }
    staging::sweep_stale(&parent, &base);
    Ok(())
}

#[cfg(test)]
mod tests;
