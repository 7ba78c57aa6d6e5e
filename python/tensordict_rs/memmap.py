"""MemoryMappedTensor: a ``torch.Tensor`` whose storage is a memory map owned by the Rust core.

Its buffers are typed as tensors by ``_core/tensor_bytes.py`` (shapes in flat memory, nested
ones too, and the contiguous bytes a writer reads).
"""

from __future__ import annotations

import os
import warnings
from multiprocessing import reduction
from pathlib import Path
from typing import Any, Self

import torch

from . import _native
from ._core.dtypes import MEMORY_DTYPE_TO_STR, memory_dtype_from_str, memory_dtype_to_str
from ._core.tensor_bytes import (
    Shape,
    _itemsize,
    _nested_shape,
    _nested_values,
    _numel,
    _refuse_jagged,
    _shaped,
    _source_bytes,
    _tensor_from_buffer,
    check_same_file,
)

__all__ = ["MemoryMappedTensor"]

PathLike = str | os.PathLike[str]
Dims = tuple[int, ...]


def _is_writable(filename: PathLike) -> bool:
    """True when this process may write ``filename`` (its permission bits, as tensordict checks)."""
    return os.access(os.fspath(filename), os.W_OK)


def _wrap(
    tensor: torch.Tensor,
    buffer: _native.Buffer | None,
    filename: str | None,
    shared: bool = False,
) -> MemoryMappedTensor:
    """``tensor`` as a MemoryMappedTensor over ``buffer``; ``shared``: anonymous memory that
    belongs to a shared tree (``is_shared()``)."""
    out = tensor.as_subclass(MemoryMappedTensor)
    out._buffer = buffer
    out._filename = filename
    out._shared = shared
    return out


def _from_buffer(
    buffer: _native.Buffer, dtype: torch.dtype, shape: Shape, shared: bool = False
) -> MemoryMappedTensor:
    return _wrap(_tensor_from_buffer(buffer, dtype, shape), buffer, buffer.filename, shared)


def _empty_result(dtype: torch.dtype, shape: Shape) -> MemoryMappedTensor:
    # Empty tensors have no memory map (nothing to map, and frombuffer refuses 0 bytes).
    return _wrap(_shaped(torch.empty(0, dtype=dtype), shape), None, None)


def _parse_shape(args: tuple[Any, ...], shape: Any) -> Shape:
    if shape is not None:
        if args:
            raise TypeError("Pass the shape either as positional arguments or as shape=, not both.")
        nested = _nested_shape(shape)
        return nested if nested is not None else tuple(torch.Size(shape))
    if not args:
        raise TypeError("Could not find the shape argument in the arguments.")
    if len(args) == 1:
        nested = _nested_shape(args[0])
        if nested is not None:
            return nested
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        return tuple(torch.Size(args[0]))
    return tuple(torch.Size(args))


def _check_device(device: Any) -> None:
    if device is not None and torch.device(device).type != "cpu":
        raise RuntimeError("Only CPU tensors are supported.")


def _rebuild_file(
    filename: str, dtype: str, nbytes: int, size: Dims, stride: Dims, offset: int
) -> MemoryMappedTensor:
    buffer = _native.open_file(filename, nbytes)
    base = torch.frombuffer(buffer, dtype=memory_dtype_from_str(dtype))
    return _wrap(base.as_strided(size, stride, offset), buffer, buffer.filename)


def _rebuild_sent_file(identity: Any, *args: Any) -> MemoryMappedTensor:
    out = _rebuild_file(*args)
    assert out._buffer is not None
    check_same_file(args[0], identity, out._buffer)
    return out


def _rebuild_nested_file(
    filename: str, dtype: str, nbytes: int, shape: torch.Tensor
) -> MemoryMappedTensor:
    buffer = _native.open_file(filename, nbytes)
    return _from_buffer(buffer, memory_dtype_from_str(dtype), shape)


def _rebuild_archive(
    path: str, identity: tuple[int, int], offset: int, nbytes: int, shared: bool,
    dtype: str, size: Dims, stride: Dims, storage_offset: int,
) -> MemoryMappedTensor:  # fmt: skip
    # every leaf of one archive shares one map of it in this process
    buffer = _native.reopen_archive(path, identity, offset, nbytes, shared)
    base = torch.frombuffer(buffer, dtype=memory_dtype_from_str(dtype))
    return _wrap(base.as_strided(size, stride, storage_offset), buffer, None)


def _rebuild_plain(tensor: torch.Tensor) -> MemoryMappedTensor:
    return _wrap(tensor, None, None)


class MemoryMappedTensor(torch.Tensor):
    """A CPU tensor stored in a memory map: anonymous shared memory, or a file.

    Operations return plain tensors (``__torch_function__`` is disabled, so they cost nothing
    extra); basic indexing, ``unbind``, ``split``, ``chunk`` and iteration keep the class
    because their results are views of the same map. File-backed tensors pickle by path and
    can be opened in any process; anonymous ones cross processes through multiprocessing
    (any start method) as one file descriptor of their shared memory, never as a copy.

    >>> import pickle
    >>> t = MemoryMappedTensor.from_tensor(torch.arange(4), filename="t.memmap")
    >>> t.filename.endswith("t.memmap"), t[1:].filename == t.filename
    (True, True)
    >>> pickle.loads(pickle.dumps(t))  # by path: the same file, opened again
    MemoryMappedTensor([0, 1, 2, 3])
    """

    _buffer: _native.Buffer | None
    _filename: str | None
    _shared: bool = False  # anonymous memory of a shared tree (see is_shared)
    _storage_bytes: int = 0  # from_storage without a buffer: the bytes of the storage

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    def __new__(
        cls,
        source: Any,
        *,
        dtype: torch.dtype | None = None,
        shape: Any = None,
        index: Any = None,
        device: Any = None,
        handler: _native.Buffer | None = None,
        filename: PathLike | None = None,
    ) -> MemoryMappedTensor:
        """Copies ``source`` (a tensor, or data such as a list) into a new map.

        A path opens that file (``from_filename``), a storage views it (``from_storage``),
        ``handler`` (the ``_handler`` of an anonymous map) views that map. A list becomes a
        tensor of the default dtype, as ``torch.Tensor(list)`` does.
        """
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"{cls} device must be cpu!")
        if isinstance(source, (str, os.PathLike)):
            if filename is not None:
                raise TypeError("Duplicated filename argument.")
            if dtype is None or shape is None:
                raise TypeError("Opening a file needs dtype= and shape=.")
            return cls.from_filename(source, dtype=dtype, shape=shape, index=index)
        if isinstance(source, torch.UntypedStorage | torch.TypedStorage):
            return cls.from_storage(
                source, dtype=dtype, shape=shape, index=index, filename=filename
            )
        if handler is not None:
            if dtype is None or shape is None:
                raise TypeError("Viewing a handler needs dtype= and shape=.")
            return _view_handler(handler, dtype, shape, index)
        if not isinstance(source, torch.Tensor):
            source = torch.as_tensor(source, dtype=dtype or torch.get_default_dtype())
        elif dtype is not None and dtype != source.dtype:
            raise TypeError("Cannot pass new dtype if source is provided.")
        out = cls.from_tensor(source, filename=filename, shape=shape)
        return out if index is None else out[index]  # type: ignore[return-value]

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
        _refuse_jagged(input)
        size: Shape
        if input.is_nested:
            size = input._nested_tensor_size()
            flat = _nested_values(input) if copy_data else None
            dtype, nbytes = input.dtype, _numel(size) * input.element_size()
        else:
            if shape is not None:
                input = input.expand(tuple(torch.Size(shape)))
            flat = input
            dtype, size = input.dtype, tuple(input.shape)
            nbytes = input.numel() * input.element_size()
        if nbytes == 0:
            return _empty_result(dtype, size)
        src = _source_bytes(flat) if copy_data and flat is not None else None
        ptr = src.data_ptr() if src is not None else 0
        if filename is None:
            buffer = _native.anonymous_buffers([(ptr, nbytes)])[0]
        else:
            buffer = _native.write_file(os.fspath(filename), ptr, nbytes, existsok=existsok)
        del src
        return _from_buffer(buffer, dtype, size)

    @classmethod
    def from_filename(
        cls,
        filename: PathLike,
        dtype: torch.dtype,
        shape: Any,
        index: Any = None,
        mode: str | None = None,
    ) -> MemoryMappedTensor:
        """Maps the file ``filename`` as a tensor of ``dtype`` and ``shape`` (a nested shape:
        a 2-D tensor with one row per element).

        A file that does not exist yet is created, zero-filled, with exactly the bytes needed.
        An existing file must hold at least ``shape x itemsize`` bytes (a longer one is fine); a
        short file raises instead of being grown with zeros. A read-only file is mapped
        copy-on-write: writes stay in this process. ``mode="r"`` maps any file so, and
        ``mode="r+"`` refuses a file this process may not write (``PermissionError``), as in
        tensordict; both need the file to exist.
        """
        if mode not in (None, "r", "r+"):
            raise ValueError(f"mode must be 'r', 'r+' or None, got {mode!r}.")
        name = os.fspath(filename)
        if mode == "r+" and not _is_writable(name):
            raise PermissionError(f"{name} is not writable: it cannot be mapped with mode='r+'")
        nested = _nested_shape(shape)
        size: Shape = nested if nested is not None else tuple(torch.Size(shape))
        nbytes = _numel(size) * _itemsize(dtype)
        if nbytes == 0:
            out = _empty_result(dtype, size)
        elif mode is not None:
            out = _from_buffer(_native.open_file(name, nbytes, private=mode == "r"), dtype, size)
        else:
            out = _from_buffer(_open_or_create(name, nbytes), dtype, size)
        return out if index is None else out[index]  # type: ignore[return-value]

    @classmethod
    def from_storage(
        cls,
        storage: torch.UntypedStorage | torch.TypedStorage,
        *,
        shape: Any = None,
        dtype: torch.dtype | None = None,
        device: Any = None,
        index: Any = None,
        filename: PathLike | None = None,
        handler: _native.Buffer | None = None,
    ) -> MemoryMappedTensor:
        """A MemoryMappedTensor viewing ``storage`` (no copy), e.g. ``t.untyped_storage()`` of
        another one, as ``shape`` (a nested shape: a 2-D tensor) and ``dtype``.

        ``filename`` names the file the storage maps (it makes the result picklable by path).
        """
        _check_device(device)
        if isinstance(storage, torch.TypedStorage):
            dtype = dtype or storage.dtype
            storage = storage.untyped()
        dtype = dtype or torch.get_default_dtype()
        flat = torch.empty(0, dtype=dtype)
        flat.set_(storage, 0, torch.Size([storage.nbytes() // _itemsize(dtype)]), (1,))
        nested = None if shape is None else _nested_shape(shape)
        if shape is None:
            view = flat
        else:
            size: Shape = nested if nested is not None else tuple(torch.Size(shape))
            numel = _numel(size)
            if numel > flat.numel():
                raise ValueError(
                    f"a storage of {storage.nbytes()} bytes cannot hold shape {shape!r} of {dtype}"
                )
            view = _shaped(flat[:numel], size)
        if filename is None:  # a storage of torch.from_file names its file
            filename = getattr(storage, "filename", None) or None
        name = None if filename is None else str(Path(filename).absolute())
        out = _wrap(view, handler, name)
        out._storage_bytes = storage.nbytes()
        return out if index is None else out[index]  # type: ignore[return-value]

    @classmethod
    def from_handler(
        cls, handler: _native.Buffer, dtype: torch.dtype, shape: Any, index: Any = None
    ) -> MemoryMappedTensor:
        """Views the anonymous map ``handler`` (a tensor's ``_handler``) as ``dtype``/``shape``.

        Deprecated in tensordict 0.15 (the handler is private); kept for code and pickles that
        call it, with the same DeprecationWarning.
        """
        warnings.warn(
            "MemoryMappedTensor.from_handler() is deprecated and will be removed in tensordict "
            "0.17: the handler is private.",
            DeprecationWarning,
            stacklevel=2,
        )
        return _view_handler(handler, dtype, shape, index)

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
        nbytes = _numel(dims) * _itemsize(dtype)
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
    def _handler(self) -> _native.Buffer | None:
        """The anonymous map this tensor views (None when file-backed), as in tensordict."""
        return self._buffer if self._filename is None else None

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
        """True for file-backed maps, and for the leaves of a ``share_memory_()`` tree or of a
        tree received from another process (shared anonymous memory), as tensordict's leaves
        answer. A standalone anonymous MemoryMappedTensor answers False, as in tensordict.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(3)}, [3]).share_memory_()
        >>> td["a"].is_shared(), td["a"].clone().is_shared()
        (True, False)
        """
        return self._filename is not None or self._shared

    def share_memory_(self) -> Self:
        """Returns self when its memory is shared already (``is_shared()``) or is a memory
        map: torch's ``share_memory_`` would copy it into new shared memory, away from the
        tree, map or file it belongs to. Otherwise torch's ``share_memory_``.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(3)}, [3]).share_memory_()
        >>> leaf = td["a"]
        >>> leaf.share_memory_().data_ptr() == td["a"].data_ptr()
        True
        """
        if self.is_shared() or self._buffer is not None:
            return self  # (a map, anonymous or of a file, crosses processes without a copy)
        torch.Tensor.share_memory_(self)
        return self

    def contiguous(
        self, memory_format: torch.memory_format = torch.contiguous_format
    ) -> torch.Tensor:  # type: ignore[override]
        """``self`` when already contiguous (still memory-mapped), else a plain copy."""
        if self.is_nested or self.is_contiguous(memory_format=memory_format):
            return self
        return torch.Tensor.contiguous(self, memory_format=memory_format)

    # ------------------------------------------------------------------ views

    def _keep(self, out: Any) -> Any:
        if isinstance(out, torch.Tensor) and not isinstance(out, MemoryMappedTensor):
            if not out.is_nested and _same_memory(self, out):
                return _wrap(out, self._buffer, self._filename, self._shared)
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
                        memory_dtype_to_str(self.dtype),
                        tuple(self.shape),
                        self.stride(),
                        self.storage_offset(),
                    ),
                )
            raise RuntimeError(
                "An anonymous MemoryMappedTensor cannot be pickled with plain pickle: its memory "
                "has no name, only a file descriptor, which a pickle cannot carry. Send it "
                "through multiprocessing or torch.multiprocessing instead (Process arguments, "
                "Queue, Pipe, Pool, DataLoader workers, any start method), which passes the "
                "descriptor, or save it to a file first (MemoryMappedTensor.from_tensor(t, "
                "filename=...), TensorDict.memmap_(prefix=...)) to pickle it by path."
            )
        nbytes = self._buffer.nbytes if self._buffer is not None else self._storage_bytes
        if self.is_nested:
            return (
                _rebuild_nested_file,
                (
                    self._filename,
                    memory_dtype_to_str(self.dtype),
                    nbytes,
                    self._nested_tensor_size(),
                ),
            )
        return (
            _rebuild_file,
            (
                self._filename,
                memory_dtype_to_str(self.dtype),
                nbytes,
                tuple(self.shape),
                self.stride(),
                self.storage_offset(),
            ),
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        return self.as_subclass(torch.Tensor).clone()


# ----------------------------------------------------------------- lazy leaves of a tree


class _LazyLeaf:
    """A mapped leaf whose tensor is made on first access (``torch.frombuffer`` + view)."""

    __slots__ = ("buffer", "dtype", "shape", "shared")

    def __init__(
        self,
        buffer: _native.Buffer,
        dtype: torch.dtype,
        shape: tuple[int, ...],
        shared: bool = False,
    ) -> None:
        self.buffer = buffer
        self.dtype = dtype
        self.shape = shape
        self.shared = shared  # anonymous memory of a shared tree (MemoryMappedTensor.is_shared)

    def materialize(self) -> MemoryMappedTensor:
        return _from_buffer(self.buffer, self.dtype, self.shape, self.shared)


def value_nbytes(value: Any) -> int:
    """Bytes of a lazy leaf or tensor."""
    return value.buffer.nbytes if type(value) is _LazyLeaf else value.nbytes


def _same_memory(base: MemoryMappedTensor, view: torch.Tensor) -> bool:
    """Whether ``view`` lies in the memory of ``base`` (so it is a view of the same map)."""
    if base._buffer is not None:
        start = base._buffer.address
        return start <= view.untyped_storage().data_ptr() < start + base._buffer.nbytes
    if base.is_nested:
        return False
    return bool(view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr())


def _view_handler(
    handler: _native.Buffer, dtype: torch.dtype, shape: Any, index: Any
) -> MemoryMappedTensor:
    nested = _nested_shape(shape)
    size: Shape = nested if nested is not None else tuple(torch.Size(shape))
    if _numel(size) * _itemsize(dtype) > handler.nbytes:
        raise ValueError(f"a map of {handler.nbytes} bytes cannot hold shape {shape!r} of {dtype}")
    out = _from_buffer(handler, dtype, size)
    return out if index is None else out[index]  # type: ignore[return-value]


def _open_or_create(filename: str, nbytes: int) -> _native.Buffer:
    """Maps ``filename``; a missing file is created first (zero-filled, exactly ``nbytes``)."""
    if not os.path.lexists(filename):
        try:
            return _native.write_file(filename, 0, nbytes, existsok=False)
        except FileExistsError:  # made by another process in between: map that one
            pass
    return _native.open_file(filename, nbytes)


def _rebuild_mmt(
    handle: Any, nbytes: int, offset: int, length: int, dtype_name: str, geometry: Any
) -> MemoryMappedTensor:
    """(in the receiving process) An anonymous MemoryMappedTensor sent with its arena's fd."""
    buffer = _native.receive_shared(handle.detach(), nbytes, [(offset, length)])[0]
    size, stride, storage_offset = geometry
    storage = torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage()
    view = torch.empty(0, dtype=memory_dtype_from_str(dtype_name))
    view.set_(storage, storage_offset, size, stride)
    return _wrap(view, buffer, None, shared=True)


def reduce_memmap_tensor(t: MemoryMappedTensor) -> tuple[Any, ...]:
    """ForkingPickler reducer of a MemoryMappedTensor (multiprocessing's queues, pipes and
    Process arguments, torch's too): an anonymous one passes its arena's descriptor, so the
    receiver maps the same memory; others pickle as with ``pickle``."""
    buffer = t._buffer
    handle = None if buffer is None else buffer.share_handle
    dtype_name = MEMORY_DTYPE_TO_STR.get(t.dtype)
    if (
        buffer is None
        or handle is None
        or dtype_name is None
        or t.untyped_storage().data_ptr() != buffer.address
    ):
        pickled = t.__reduce_ex__(2)
        if pickled[0] is _rebuild_file and buffer is not None:  # checked against a re-save
            return (_rebuild_sent_file, (buffer.file_id, *pickled[1]))
        return pickled
    fd, nbytes, offset = handle
    geometry = (tuple(t.shape), tuple(t.stride()), t.storage_offset())
    return (
        _rebuild_mmt,
        (reduction.DupFd(fd), nbytes, offset, buffer.nbytes, dtype_name, geometry),
    )


# registered with the class (not with TensorDict): a program that imports MemoryMappedTensor
# alone sends it through multiprocessing as well
reduction.ForkingPickler.register(MemoryMappedTensor, reduce_memmap_tensor)
