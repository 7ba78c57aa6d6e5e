"""tensordict-rs: TensorDict with devices and memory-mapped tensors, on a Rust core.

Directories are in the format of PyTorch's ``tensordict`` (0.15) and move both ways.
"""

from __future__ import annotations

from ._native import (
    InvalidDirectoryError,
    InvalidTreeError,
    TensorDictError,
    UnsupportedFormatError,
)
from ._tree import NonTensorData
from .memmap import MemoryMappedTensor
from .tensordict import TensorDict
from .verify import verify

__version__ = "0.1.0"

__all__ = [
    "InvalidDirectoryError",
    "InvalidTreeError",
    "MemoryMappedTensor",
    "NonTensorData",
    "TensorDict",
    "TensorDictError",
    "UnsupportedFormatError",
    "__version__",
    "verify",
]
