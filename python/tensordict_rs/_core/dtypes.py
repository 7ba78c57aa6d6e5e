"""The dtype strings of the on-disk format (``str(torch.dtype)``) and their torch dtypes."""

from __future__ import annotations

import torch

from .. import _native

# The format's dtype table is the Rust core's (``_native.DTYPES``, "torch.bool" ...).
STR_TO_DTYPE: dict[str, torch.dtype] = {
    name: getattr(torch, name.removeprefix("torch."))
    for name in _native.DTYPES
    if hasattr(torch, name.removeprefix("torch."))
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
