"""Batches in one native call: ``td[rows]`` and ``td.index_select(0, rows, out=)``.

For a tree whose leaves are all contiguous CPU memory (memory maps, lazy leaves or plain
tensors), every leaf's rows are gathered by one Rust call (``_native.gather_rows``) with the GIL
released, copied in parallel, and runs of consecutive rows become one copy each. Anything else
(a leaf on another device, a leaf that needs autograd, a strided view, a mismatched ``out``)
returns ``None`` and the caller uses torch's per-leaf ``index_select``, which is also kept for
tiny batches, where building the call costs more than torch's per-leaf kernels.

SAFETY contract with the Rust core: the addresses passed are ``data_ptr()``s (or Buffer
addresses) of contiguous CPU tensors that this module keeps referenced (``keep``) until the
call returns; the output tensors are allocated here or checked for dtype, shape and
contiguity. The Rust side bounds-checks every row and refuses outputs that overlap a source.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from . import _native
from ._tree import NonTensorData, _LazyLeaf

if TYPE_CHECKING:
    from .tensordict import TensorDict

# Below this many gathered bytes torch's per-leaf path is as fast: re-measured with
# benches/gather_crossover.py (W4 rows of 12,322 B, 2026-12-01): a tie at 1 row (12 KB), the
# native call ahead from 2 rows (24 KB) on, so the crossover lies between 12 and 24 KiB.
MIN_BYTES = 16 << 10

_CPU = torch.device("cpu")


def _source(value: Any, keep: list[Any]) -> tuple[int, tuple[int, ...], torch.dtype] | None:
    """``(address, shape, dtype)`` of a leaf whose bytes the Rust core can read, else None."""
    if type(value) is _LazyLeaf:
        keep.append(value.buffer)
        return value.buffer.address, value.shape, value.dtype
    if (
        value.device.type != "cpu"
        or value.requires_grad
        or value.layout is not torch.strided
        or not value.is_contiguous()
        or value.is_conj()
        or value.is_neg()
    ):
        return None
    keep.append(value)
    return value.data_ptr(), tuple(value.shape), value.dtype


def _writable(tensor: torch.Tensor) -> bool:
    """False for a tensor over a read-only map (the Rust core must never write there)."""
    buffer = getattr(tensor, "_buffer", None)
    return buffer is None or buffer.writable


def _row_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = dtype.itemsize
    for d in shape[1:]:
        n *= d
    return n


def _index(rows: torch.Tensor) -> torch.Tensor | None:
    if rows.device.type != "cpu" or rows.dtype != torch.int64 or rows.ndim != 1:
        return None
    return rows if rows.is_contiguous() else rows.contiguous()


def _fresh(td: TensorDict, n: int, keep: list[Any], jobs: list[Any]) -> TensorDict | None:
    """The result tree of ``td`` with ``n`` rows, empty leaves allocated, jobs listed."""
    batch = torch.Size([n, *td.batch_size[1:]])
    out = type(td)._new_unchecked(batch, td.device)
    items = out._tensordict
    for key, value in td._tensordict.items():
        if type(value) is NonTensorData:
            items[key] = NonTensorData(value.data)
            continue
        if not (type(value) is _LazyLeaf or isinstance(value, torch.Tensor)):
            sub = _fresh(value, n, keep, jobs)
            if sub is None:
                return None
            items[key] = sub
            continue
        src = _source(value, keep)
        if src is None:
            return None
        address, shape, dtype = src
        leaf = torch.empty((n, *shape[1:]), dtype=dtype)
        items[key] = leaf
        row = _row_bytes(shape, dtype)
        if row:
            jobs.append((address, shape[0], leaf.data_ptr(), row))
    return out


def _into(td: TensorDict, out: TensorDict, n: int, keep: list[Any], jobs: list[Any]) -> bool:
    """Lists the jobs that write ``td``'s rows into ``out``'s leaves; False when one cannot."""
    target_items = out._tensordict
    for key, value in td._tensordict.items():
        if type(value) is NonTensorData:
            continue
        target = target_items.get(key)
        if target is None:
            return False
        if not (type(value) is _LazyLeaf or isinstance(value, torch.Tensor)):
            if isinstance(target, torch.Tensor) or type(target) in (_LazyLeaf, NonTensorData):
                return False
            if not _into(value, target, n, keep, jobs):
                return False
            continue
        src = _source(value, keep)
        if src is None:
            return False
        address, shape, dtype = src
        if type(target) is _LazyLeaf:
            target = out._get_str(key)
        if not isinstance(target, torch.Tensor) or not _writable(target):
            return False
        dst = _source(target, keep)
        if dst is None or dst[2] != dtype or dst[1] != (n, *shape[1:]):
            return False
        row = _row_bytes(shape, dtype)
        if row:
            jobs.append((address, shape[0], dst[0], row))
    return True


def _worth_it(td: TensorDict, n: int) -> bool:
    """Whether the batch is large enough for the native call to beat torch's per-leaf path."""
    total = 0
    for value in td._tensordict.values():
        if type(value) is _LazyLeaf or isinstance(value, torch.Tensor):
            total += _row_bytes(tuple(value.shape), value.dtype) * n
            if total >= MIN_BYTES:
                return True
        elif type(value) is not NonTensorData:
            if _worth_it(value, n):
                return True
    return False


def gather(td: TensorDict, rows: torch.Tensor, out: TensorDict | None = None) -> TensorDict | None:
    """Rows ``rows`` of batch dim 0 of every leaf, in one native call; None: use torch's path.

    With ``out``, the rows are written into its leaves (``index_select(0, rows, out=out)``)
    and ``out`` is returned. Raises ``IndexError`` for a row out of range.
    """
    if not td.batch_size or (td.device is not None and td.device != _CPU):
        return None
    index = _index(rows)
    if index is None:
        return None
    n = index.numel()
    if not _worth_it(td, n):
        return None
    keep: list[Any] = [index]
    jobs: list[tuple[int, int, int, int]] = []
    if out is None:
        result = _fresh(td, n, keep, jobs)
        if result is None:
            return None
    else:
        if tuple(out.batch_size[:1]) != (n,) or not _into(td, out, n, keep, jobs):
            return None
        result = out
    _native.gather_rows(index.data_ptr(), n, jobs)
    del keep
    return result
