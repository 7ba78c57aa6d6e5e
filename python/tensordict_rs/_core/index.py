"""Indexing over batch dimensions: turning a user index into one that every leaf accepts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .errors import ZeroBatchDimsIndexError

_SCALAR = torch.zeros((), dtype=torch.uint8)


def _consumed(item: Any) -> int:
    """How many batch dims one index item uses up."""
    if item is None or item is Ellipsis:
        return 0
    if isinstance(item, torch.Tensor) and item.dtype == torch.bool:
        return item.ndim  # a 0-dim mask consumes no dim (it adds one, as ``None``)
    return 1


def is_key(item: Any) -> bool:
    """A str, or a non-empty tuple of keys (nested tuples as tensordict's ``unravel_key``)."""
    if isinstance(item, str):
        return True
    return isinstance(item, tuple) and bool(item) and all(map(is_key, item))


def is_batch_index(index: Any) -> bool:
    """True for indices over batch dims (as opposed to string or tuple-of-string keys)."""
    if isinstance(index, str):
        return False
    if isinstance(index, tuple):
        return not is_key(index)
    return True


def key_path(key: Any) -> tuple[str, ...]:
    """A key as its path of str: ``"a"`` is ``("a",)``, a tuple of str is itself, and nested
    tuples are flattened as tensordict's ``unravel_key`` does (``(("a", "b"), "c")`` is
    ``("a", "b", "c")``). Anything else is a ``TypeError`` naming it."""
    if isinstance(key, str):
        return (key,)
    if isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
        return key
    if is_key(key):
        return tuple(part for k in key for part in key_path(k))
    raise TypeError(f"keys are str or non-empty tuples of str, got {key!r}")


def _list_index(items: list[Any]) -> torch.Tensor:
    """A list index as a tensor: an empty one picks no rows (``torch.as_tensor([])`` is a
    float tensor, which torch refuses as an index), as a list index does for a tensor."""
    return torch.as_tensor(items) if items else torch.zeros(0, dtype=torch.int64)


def normalize(index: Any, batch_dims: int) -> tuple[Any, ...]:
    """The index as a tuple whose Ellipsis is spelled out against the batch dims only.

    A leaf has the batch dims first and its own dims after; a bare ``...`` would otherwise
    expand over the leaf's own dims too.
    """
    items = index if isinstance(index, tuple) else (index,)
    items = tuple(_list_index(i) if isinstance(i, list) else i for i in items)
    used = sum(_consumed(i) for i in items)
    if used and not batch_dims:
        shown = items[0] if isinstance(index, tuple) and len(index) == 1 else index
        raise ZeroBatchDimsIndexError(
            f"indexing a tensordict with td.batch_dims==0 is not permitted. Got index {shown}."
        )
    if used > batch_dims:
        raise IndexError(f"too many indices for a TensorDict with {batch_dims} batch dimension(s)")
    if any(i is Ellipsis for i in items):
        at = next(k for k, i in enumerate(items) if i is Ellipsis)
        fill = (slice(None),) * (batch_dims - used)
        items = items[:at] + fill + tuple(i for i in items[at + 1 :] if i is not Ellipsis)
    return items


def indexed_batch_size(batch_size: torch.Size, index: tuple[Any, ...]) -> torch.Size:
    """The batch size after ``index``, computed on a stride-0 view (no allocation)."""
    probe = tuple(
        i.cpu() if isinstance(i, torch.Tensor) and i.device.type != "cpu" else i for i in index
    )
    return _SCALAR.expand(batch_size)[probe].shape


def row_index(index: Any) -> torch.Tensor | None:
    """A 1-D int64 index of rows of batch dim 0, when ``index`` is one (the fast gather path)."""
    if isinstance(index, tuple):
        if len(index) != 1:
            return None
        index = index[0]
    if isinstance(index, list) and index and all(type(i) is int for i in index):
        index = torch.tensor(index)
    if (
        isinstance(index, torch.Tensor)
        and index.ndim == 1
        and not index.is_floating_point()
        and index.dtype not in (torch.bool, torch.uint8)  # uint8 is a mask, as in torch
    ):
        return index if index.dtype == torch.int64 else index.long()
    return None


def permutation(given: Sequence[int], batch_size: torch.Size) -> list[int]:
    """``given`` as a permutation of the dims of ``batch_size``, made non-negative; any
    invalid one (a dim count other than the batch dims', a dim out of range, a repeated dim)
    is a ``ValueError``, as tensordict raises for every invalid permutation."""
    ndim = len(batch_size)
    if len(given) != ndim:
        raise ValueError(
            f"permute needs one dim per batch dim, got {list(given)} for batch size {batch_size}"
        )
    dims = [d + ndim if d < 0 else d for d in given]
    if sorted(dims) != list(range(ndim)):
        raise ValueError(
            f"Got incompatible argument permute_dims: {list(given)} with tensordict "
            f"batch_size {batch_size}: expected a permutation of {list(range(ndim))}."
        )
    return dims
