"""MemoryMappedTensor: a ``torch.Tensor`` whose storage is a memory map owned by the Rust core."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from . import _native
from ._dtypes import dtype_from_str, dtype_to_str

__all__ = ["MemoryMappedTensor"]

PathLike = str | os.PathLike[str]


def _tensor_from_buffer(
    buffer: _native.Buffer, dtype: torch.dtype, shape: Sequence[int]
) -> torch.Tensor:
    """Types the flat bytes of ``buffer``; the tensor keeps ``buffer`` (and the map) alive."""
    return torch.frombuffer(buffer, dtype=dtype).view(tuple(shape))


def _wrap(
    tensor: torch.Tensor, buffer: _native.Buffer | None, filename: str | None
) -> MemoryMappedTensor:
    out = tensor.as_subclass(MemoryMappedTensor)
    out._buffer = buffer
    out._filename = filename
    return out


def _from_buffer(
    buffer: _native.Buffer, dtype: torch.dtype, shape: Sequence[int]
) -> MemoryMappedTensor:
    return _wrap(_tensor_from_buffer(buffer, dtype, shape), buffer, buffer.filename)


def _source_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with the values of ``tensor``, for the Rust writers to read."""
    src = tensor.detach()
    if src.device.type != "cpu":
        src = src.cpu()
    if not src.is_contiguous() or src.storage_offset() < 0:
        src = src.contiguous()
    return src


def _empty_result(dtype: torch.dtype, shape: Sequence[int]) -> MemoryMappedTensor:
    # Empty tensors have no memory map (nothing to map, and frombuffer refuses 0 bytes).
    return _wrap(torch.empty(tuple(shape), dtype=dtype), None, None)


def _parse_shape(args: tuple[Any, ...], shape: Any) -> tuple[int, ...]:
    if shape is not None:
        if args:
            raise TypeError("Pass the shape either as positional arguments or as shape=, not both.")
        return tuple(torch.Size(shape))
    if not args:
        raise TypeError("Could not find the shape argument in the arguments.")
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        return tuple(torch.Size(args[0]))
    return tuple(torch.Size(args))


def _check_device(device: Any) -> None:
    if device is not None and torch.device(device).type != "cpu":
        raise RuntimeError("Only CPU tensors are supported.")


def _rebuild_file(
    filename: str,
    dtype: str,
    nbytes: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    offset: int,
) -> MemoryMappedTensor:
    buffer = _native.open_file(filename, nbytes)
    base = torch.frombuffer(buffer, dtype=dtype_from_str(dtype))
    return _wrap(base.as_strided(size, stride, offset), buffer, buffer.filename)


def _rebuild_archive(
    path: str,
    identity: tuple[int, int],
    offset: int,
    nbytes: int,
    shared: bool,
    dtype: str,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    storage_offset: int,
) -> MemoryMappedTensor:
    # every leaf of one archive shares one map of it in this process
    buffer = _native.reopen_archive(path, identity, offset, nbytes, shared)
    base = torch.frombuffer(buffer, dtype=dtype_from_str(dtype))
    return _wrap(base.as_strided(size, stride, storage_offset), buffer, None)


def _rebuild_plain(tensor: torch.Tensor) -> MemoryMappedTensor:
    return _wrap(tensor, None, None)


class MemoryMappedTensor(torch.Tensor):
    """A CPU tensor stored in a memory map: anonymous shared memory, or a file.

    Operations return plain tensors (``__torch_function__`` is disabled, so they cost nothing
    extra); basic indexing, ``unbind``, ``split``, ``chunk`` and iteration keep the class
    because their results are views of the same map. File-backed tensors pickle by path and
    can be opened in any process; anonymous ones travel to forked children as shared memory.
    """

    _buffer: _native.Buffer | None
    _filename: str | None

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    def __new__(
        cls,
        source: Any,
        *,
        dtype: torch.dtype | None = None,
        shape: Any = None,
        filename: PathLike | None = None,
        device: Any = None,
    ) -> MemoryMappedTensor:
        """Copies ``source`` (a tensor) into a new map; a path source opens that file."""
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"{cls} device must be cpu!")
        if isinstance(source, (str, os.PathLike)):
            if dtype is None or shape is None:
                raise TypeError("Opening a file needs dtype= and shape=.")
            return cls.from_filename(source, dtype=dtype, shape=shape)
        if not isinstance(source, torch.Tensor):
            source = torch.as_tensor(source, dtype=dtype)
        elif dtype is not None and dtype != source.dtype:
            raise TypeError("Cannot pass new dtype if source is provided.")
        return cls.from_tensor(source, filename=filename, shape=shape)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_tensor(
        cls,
        input: torch.Tensor,
        *,
        filename: PathLike | None = None,
        existsok: bool = False,
        copy_existing: bool = False,
        copy_data: bool = True,
        shape: Any = None,
    ) -> MemoryMappedTensor:
        """Returns a memory-mapped copy of ``input``.

        With ``filename`` the data goes to that file (written beside it and renamed into
        place, so a crash never leaves half a file); otherwise to anonymous shared memory.
        ``copy_data=False`` allocates zeros of the same shape and dtype. An input that is
        already a MemoryMappedTensor at the same place is returned as it is.
        """
        if not isinstance(input, torch.Tensor):
            raise TypeError(
                "Convert input to torch.Tensor before calling MemoryMappedTensor.from_tensor."
            )
        if input.requires_grad:
            raise RuntimeError(
                "MemoryMappedTensor.from_tensor is incompatible with tensor.requires_grad."
            )
        if isinstance(input, MemoryMappedTensor) and shape is None:
            target = None if filename is None else str(Path(filename).absolute())
            if target is None and input._filename is None:
                return input
            if target is not None and target == input._filename:
                return input
            if target is not None and input._filename is not None and not copy_existing:
                raise RuntimeError(
                    f"A filename was provided but the tensor already has a file associated "
                    f"({input._filename}). To copy the tensor onto the new location, "
                    "pass copy_existing=True."
                )
        if shape is not None:
            input = input.expand(tuple(torch.Size(shape)))
        dtype, size = input.dtype, tuple(input.shape)
        nbytes = input.numel() * input.element_size()
        if nbytes == 0:
            return _empty_result(dtype, size)
        src = _source_bytes(input) if copy_data else None
        ptr = src.data_ptr() if src is not None else 0
        if filename is None:
            buffer = _native.anonymous_buffers([(ptr, nbytes)])[0]
        else:
            buffer = _native.write_file(os.fspath(filename), ptr, nbytes, existsok=existsok)
        del src
        return _from_buffer(buffer, dtype, size)

    @classmethod
    def from_filename(
        cls, filename: PathLike, dtype: torch.dtype, shape: Any, index: Any = None
    ) -> MemoryMappedTensor:
        """Maps an existing file as a tensor of ``dtype`` and ``shape``.

        The file must hold at least ``shape x itemsize`` bytes (a longer file is fine); a
        missing or short file raises instead of being created or zero-filled. A read-only file
        is mapped copy-on-write: writes stay in this process.
        """
        size = tuple(torch.Size(shape))
        nbytes = torch.Size(size).numel() * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0:
            out = _empty_result(dtype, size)
        else:
            out = _from_buffer(_native.open_file(os.fspath(filename), nbytes), dtype, size)
        return out if index is None else out[index]  # type: ignore[return-value]

    @classmethod
    def empty(
        cls,
        *size: Any,
        dtype: torch.dtype | None = None,
        device: Any = None,
        filename: PathLike | None = None,
        existsok: bool = False,
        shape: Any = None,
    ) -> MemoryMappedTensor:
        """A new map of ``size`` (its bytes are zero: fresh maps always are)."""
        _check_device(device)
        dims = _parse_shape(size, shape)
        dtype = dtype or torch.get_default_dtype()
        nbytes = torch.Size(dims).numel() * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0:
            return _empty_result(dtype, dims)
        if filename is None:
            buffer = _native.anonymous_buffers([(0, nbytes)])[0]
        else:
            buffer = _native.write_file(os.fspath(filename), 0, nbytes, existsok=existsok)
        return _from_buffer(buffer, dtype, dims)

    @classmethod
    def zeros(
        cls,
        *size: Any,
        dtype: torch.dtype | None = None,
        device: Any = None,
        filename: PathLike | None = None,
        existsok: bool = False,
        shape: Any = None,
    ) -> MemoryMappedTensor:
        """A new map of ``size`` filled with zeros."""
        return cls.empty(
            *size, dtype=dtype, device=device, filename=filename, existsok=existsok, shape=shape
        )

    @classmethod
    def ones(
        cls,
        *size: Any,
        dtype: torch.dtype | None = None,
        device: Any = None,
        filename: PathLike | None = None,
        existsok: bool = False,
        shape: Any = None,
    ) -> MemoryMappedTensor:
        """A new map of ``size`` filled with ones."""
        return cls.full(
            *size,
            fill_value=1,
            dtype=dtype,
            device=device,
            filename=filename,
            existsok=existsok,
            shape=shape,
        )

    @classmethod
    def full(
        cls,
        *size: Any,
        fill_value: Any,
        dtype: torch.dtype | None = None,
        device: Any = None,
        filename: PathLike | None = None,
        existsok: bool = False,
        shape: Any = None,
    ) -> MemoryMappedTensor:
        """A new map of ``size`` filled with ``fill_value``."""
        out = cls.empty(
            *size, dtype=dtype, device=device, filename=filename, existsok=existsok, shape=shape
        )
        if out.numel():
            out.fill_(fill_value)
        return out

    @classmethod
    def empty_like(
        cls, input: torch.Tensor, *, filename: PathLike | None = None
    ) -> MemoryMappedTensor:
        """A new map with the shape and dtype of ``input`` (on any device)."""
        return cls.empty(tuple(input.shape), dtype=input.dtype, filename=filename)

    @classmethod
    def zeros_like(
        cls, input: torch.Tensor, *, filename: PathLike | None = None
    ) -> MemoryMappedTensor:
        """Zeros with the shape and dtype of ``input``."""
        return cls.zeros(tuple(input.shape), dtype=input.dtype, filename=filename)

    @classmethod
    def ones_like(
        cls, input: torch.Tensor, *, filename: PathLike | None = None
    ) -> MemoryMappedTensor:
        """Ones with the shape and dtype of ``input``."""
        return cls.ones(tuple(input.shape), dtype=input.dtype, filename=filename)

    @classmethod
    def full_like(
        cls, input: torch.Tensor, fill_value: Any, *, filename: PathLike | None = None
    ) -> MemoryMappedTensor:
        """``fill_value`` everywhere, with the shape and dtype of ``input``."""
        return cls.full(
            tuple(input.shape), fill_value=fill_value, dtype=input.dtype, filename=filename
        )

    # ------------------------------------------------------------------ attributes

    @property
    def filename(self) -> str:
        """Absolute path of the backing file; anonymous tensors raise ``RuntimeError``."""
        if self._filename is None:
            raise RuntimeError("The MemoryMappedTensor has no file associated.")
        return self._filename

    def flush(self) -> None:
        """Writes this tensor's dirty pages to its file and waits (msync); no-op if anonymous."""
        if self._buffer is not None:
            self._buffer.flush()

    def is_shared(self) -> bool:
        """True for file-backed maps (visible to every process), as in tensordict."""
        return self._filename is not None

    def contiguous(
        self, memory_format: torch.memory_format = torch.contiguous_format
    ) -> torch.Tensor:  # type: ignore[override]
        """``self`` when already contiguous (still memory-mapped), else a plain copy."""
        if self.is_contiguous(memory_format=memory_format):
            return self
        return torch.Tensor.contiguous(self, memory_format=memory_format)

    # ------------------------------------------------------------------ views

    def _keep(self, out: Any) -> Any:
        if isinstance(out, torch.Tensor) and not isinstance(out, MemoryMappedTensor):
            if (
                out.numel()
                and out.untyped_storage().data_ptr() == self.untyped_storage().data_ptr()
            ):
                return _wrap(out, self._buffer, self._filename)
        return out

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self._keep(torch.Tensor.__getitem__(self, index))

    def unbind(self, dim: int = 0) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        """Views along ``dim``, still memory-mapped."""
        return tuple(self._keep(t) for t in torch.Tensor.unbind(self, dim))

    def split(self, split_size: Any, dim: int = 0) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        """Views of ``split_size`` along ``dim``, still memory-mapped."""
        return tuple(self._keep(t) for t in torch.Tensor.split(self, split_size, dim))

    def chunk(self, chunks: int, dim: int = 0) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        """``chunks`` views along ``dim``, still memory-mapped."""
        return tuple(self._keep(t) for t in torch.Tensor.chunk(self, chunks, dim))

    def __iter__(self):  # type: ignore[override]
        return iter(self.unbind(0))

    # ------------------------------------------------------------------ pickling

    def __reduce_ex__(self, protocol: Any) -> Any:
        if self._filename is None:
            if self._buffer is None:
                return (_rebuild_plain, (self.as_subclass(torch.Tensor).clone(),))
            archive = self._buffer.archive
            if archive is not None:
                # a leaf of a .tdz archive: the archive's path and where the leaf lies in it
                path, identity, offset, shared = archive
                return (
                    _rebuild_archive,
                    (
                        path,
                        identity,
                        offset,
                        self._buffer.nbytes,
                        shared,
                        dtype_to_str(self.dtype),
                        tuple(self.shape),
                        self.stride(),
                        self.storage_offset(),
                    ),
                )
            raise RuntimeError(
                "An anonymous MemoryMappedTensor cannot be pickled: its memory has no name another "
                "process could open. Save it with a filename (or TensorDict.memmap_(prefix=...)), "
                "or share it with forked workers, which inherit the map."
            )
        assert self._buffer is not None
        return (
            _rebuild_file,
            (
                self._filename,
                dtype_to_str(self.dtype),
                self._buffer.nbytes,
                tuple(self.shape),
                self.stride(),
                self.storage_offset(),
            ),
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        return self.as_subclass(torch.Tensor).clone()
