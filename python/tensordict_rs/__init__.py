"""tensordict-rs: TensorDict with devices and memory-mapped tensors, on a Rust core.

Directories are in the format of PyTorch's ``tensordict`` (0.15) and move both ways.

The torch-dependent names (``TensorDict``, ``MemoryMappedTensor``, ``NonTensorData``) are
imported on first use (PEP 562), so that the command line (``tensordict_rs.cli``) and
``verify`` read directories without importing torch:

>>> from tensordict_rs import TensorDict
>>> TensorDict({"a": [1.0, 2.0]}, batch_size=[2])["a"]
tensor([1., 2.])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._native import (
    FileExistsRuntimeError,
    InvalidDirectoryError,
    InvalidTreeError,
    LockedError,
    SymlinkError,
    TensorDictError,
    UnsupportedFormatError,
)
from .verify import verify

if TYPE_CHECKING:
    from .io.archive import is_memmap_archive, pack_memmap, refresh_archive_checksums, unpack_memmap
    from .io.directory import NonTensorData
    from .io.saving import TensorDictFuture
    from .memmap import MemoryMappedTensor
    from .tensordict import TensorDict

__version__ = "0.1.0"

__all__ = [
    "FileExistsRuntimeError",
    "InvalidDirectoryError",
    "InvalidTreeError",
    "LockedError",
    "MemoryMappedTensor",
    "NonTensorData",
    "SymlinkError",
    "TensorDict",
    "TensorDictError",
    "TensorDictFuture",
    "UnsupportedFormatError",
    "__version__",
    "is_memmap_archive",
    "pack_memmap",
    "refresh_archive_checksums",
    "unpack_memmap",
    "verify",
]

_LAZY = {
    "MemoryMappedTensor": ".memmap",
    "NonTensorData": ".io.directory",
    "TensorDict": ".tensordict",
    "TensorDictFuture": ".io.saving",
    "is_memmap_archive": ".io.archive",
    "pack_memmap": ".io.archive",
    "refresh_archive_checksums": ".io.archive",
    "unpack_memmap": ".io.archive",
}


def __getattr__(name: str) -> Any:
    """Imports a torch-dependent name on first access and caches it in the module."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
