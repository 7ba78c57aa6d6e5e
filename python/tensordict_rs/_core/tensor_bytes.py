"""A tensor's flat bytes and back, for memory maps and the buffers of other processes: shapes
in flat memory (a size, or the ``(n, ndim)`` table of a nested tensor's elements), a flat buffer
typed and viewed as a tensor (``torch.frombuffer``: the tensor keeps the buffer alive), and the
contiguous CPU values a Rust writer reads. Nothing is mapped here: the buffers come from
``_native``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .. import _native

Shape = Sequence[int] | torch.Tensor  # a tensor: one row per element of a nested tensor


def _numel(shape: Shape) -> int:
    """Elements of a shape, or of every element of a nested shape."""
    if isinstance(shape, torch.Tensor):
        return int(shape.prod(-1).sum()) if shape.numel() else 0
    return torch.Size(shape).numel()


def _shaped(flat: torch.Tensor, shape: Shape) -> torch.Tensor:
    """``flat`` (1-D, exactly the elements) viewed as ``shape``; a nested view for a nested one."""
    if isinstance(shape, torch.Tensor):
        strides, offsets = torch._nested_compute_contiguous_strides_offsets(shape)
        return torch._nested_view_from_buffer(flat, shape, strides, offsets)
    return flat.view(tuple(shape))


def _nested_shape(value: Any) -> torch.Tensor | None:
    """The (n, ndim) int64 tensor of a nested shape, when ``value`` is one."""
    if isinstance(value, torch.Tensor):
        if value.ndim != 2 or value.is_floating_point():
            raise ValueError(
                "a shape given as a tensor is a nested shape: 2-D, one row of ints per element, "
                f"got {value!r}"
            )
        return value.to(torch.int64)
    return None


def _nested_values(tensor: torch.Tensor) -> torch.Tensor:
    """The elements of a strided nested tensor, flat and contiguous, in element order."""
    parts = [t.reshape(-1) for t in tensor.unbind()]
    if not parts:
        return torch.empty(0, dtype=tensor.dtype)
    return torch.cat(parts)


def _tensor_from_buffer(buffer: _native.Buffer, dtype: torch.dtype, shape: Shape) -> torch.Tensor:
    """Types the flat bytes of ``buffer``; the tensor keeps ``buffer`` (and the map) alive."""
    if buffer.writable:
        flat = torch.frombuffer(buffer, dtype=dtype)
    else:
        # memory lent read-only (an object store's): torch warns that it cannot mark tensors
        # read-only; this library never writes there and its trees refuse to (share/pickling)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(buffer, dtype=dtype)
    numel = _numel(shape)
    if flat.numel() != numel:
        flat = flat[:numel]
    return _shaped(flat, shape)


def _source_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with the values of ``tensor``, for the Rust writers to read."""
    src = tensor.detach()
    if src.is_conj():  # a lazy conjugate or negative view: its memory holds other values
        src = src.resolve_conj()
    if src.is_neg():
        src = src.resolve_neg()
    if src.device.type != "cpu":
        src = src.cpu()
    if not src.is_contiguous() or src.storage_offset() < 0:
        src = src.contiguous()
    return src


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def check_same_file(filename: str, identity: Any, buffer: _native.Buffer) -> None:
    """Refuses a file sent to this process (``ForkingPickler``) that was replaced since it was
    sent (a save over its directory): the sender's tensor maps the old file, and this process
    would read and write another one."""
    if identity is not None and buffer.file_id is not None and tuple(identity) != buffer.file_id:
        raise _native.InvalidDirectoryError(
            f"{filename}: the file was replaced since this tensor was sent (a save over its "
            "directory): it holds other data than the sender's tensor; load it again there"
        )


def _refuse_jagged(tensor: torch.Tensor, where: str = "") -> None:
    if tensor.is_nested and tensor.layout == torch.jagged:
        raise _native.UnsupportedFormatError(
            f"memmap does not store nested tensors with the torch.jagged layout{where}; convert "
            "it with torch.nested.nested_tensor(list(t.unbind()), layout=torch.strided)"
        )
    if tensor.layout not in (torch.strided, torch.jagged):
        raise _native.UnsupportedFormatError(
            f"memmap does not store {tensor.layout} tensors{where}; call .to_dense() first"
        )
