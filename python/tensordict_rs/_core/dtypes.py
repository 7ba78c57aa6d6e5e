"""The dtype strings of the on-disk format (``str(torch.dtype)``) and their torch dtypes."""

from __future__ import annotations

import torch

_NAMES = [
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
]  # fmt: skip

STR_TO_DTYPE: dict[str, torch.dtype] = {
    f"torch.{name}": getattr(torch, name) for name in _NAMES if hasattr(torch, name)
}
DTYPE_TO_STR: dict[torch.dtype, str] = {dtype: name for name, dtype in STR_TO_DTYPE.items()}


def dtype_from_str(name: str) -> torch.dtype:
    """The torch dtype written as ``name`` in meta.json (``"torch.float32"``)."""
    try:
        return STR_TO_DTYPE[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}") from None


def dtype_to_str(dtype: torch.dtype) -> str:
    """The meta.json string of ``dtype``; dtypes the format cannot store raise ``TypeError``."""
    try:
        return DTYPE_TO_STR[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} cannot be stored in a memory-mapped directory") from None
