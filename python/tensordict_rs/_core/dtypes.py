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


# Memory (anonymous maps, pickles, other processes) holds more than the format: 8-bit floats
# and raw bit types, fixed-size elements that torch shares and pickles too, but that neither
# library's directories load (tensordict writes float8 directories it cannot load again).
_MEMORY_ONLY = (
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "bits8", "bits16",
)  # fmt: skip
MEMORY_STR_TO_DTYPE: dict[str, torch.dtype] = {
    **STR_TO_DTYPE,
    **{
        f"torch.{name}": getattr(torch, name)
        for name in _MEMORY_ONLY
        if isinstance(getattr(torch, name, None), torch.dtype)
    },
}
MEMORY_DTYPE_TO_STR: dict[torch.dtype, str] = {d: n for n, d in MEMORY_STR_TO_DTYPE.items()}


def memory_dtype_from_str(name: str) -> torch.dtype:
    """The dtype named ``name`` in a pickle or a message between processes."""
    try:
        return MEMORY_STR_TO_DTYPE[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}") from None


def memory_dtype_to_str(dtype: torch.dtype) -> str:
    """The name of ``dtype`` in a pickle or a message between processes; ``TypeError`` for a
    dtype that memory maps cannot hold (quantized, sub-byte)."""
    try:
        return MEMORY_DTYPE_TO_STR[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} cannot be held in a memory map") from None
