"""Batches in one native call: ``td[rows]`` and ``td.index_select(0, rows, out=)``.

For a tree whose leaves are all contiguous CPU memory (memory maps, lazy leaves or plain
tensors), every leaf's rows are gathered by one Rust call (``_native.gather_rows``) with the GIL
released, copied in parallel, and runs of consecutive rows become one copy each. Anything else
(a leaf on another device, a leaf that needs autograd, a strided view, a mismatched ``out``)
returns ``None`` and the caller uses torch's per-leaf ``index_select`` (below ``MIN_BYTES``
too, which measures 0: the native call is ahead from one row on).

SAFETY contract with the Rust core: the addresses passed are ``data_ptr()``s (or Buffer
addresses) of contiguous CPU tensors that this module keeps referenced (``keep``) until the
call returns; the output tensors are allocated here or checked for dtype, shape and
contiguity. The Rust side bounds-checks every row and refuses outputs that overlap a source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _native
from .._core.nodes import NTD_TYPES, TD, NonTensorData
from .._core.nontensor import NonTensorStack
from .._core.unbatched import UnbatchedTensor
from ..memmap import _LazyLeaf

# Below this many gathered bytes torch's per-leaf path would be used. Re-measured with
# benches/gather_crossover.py after the batch plan (2026-12-01, 2 CPUs): the native call is
# ahead at every batch size from 1 row on, for W4's 6-leaf tree (29 us against 58 us for one
# 12 KiB row) and for a one-leaf tree of 64-byte rows (14 us against 37 us; tensordict 0.15.3
# 17 us), so there is no crossover left and the bound is 0. It stays a knob for that script.
MIN_BYTES = 0
# From this many bytes in rows of at least BULK_ROW bytes, the Rust core copies on several
# threads (rust/sys/gather.rs PARALLEL_MIN, BULK_MIN): its helper threads are then woken before
# the batch is allocated, so that they are running by the time the copy starts.
PARALLEL_BYTES = _native.PARALLEL_BYTES
BULK_ROW = _native.BULK_ROW

_CPU = torch.device("cpu")

# Makes the leaves of a batch: their (shape, dtype)s in, contiguous CPU tensors (or None) out.
Alloc = Callable[[list[tuple[tuple[int, ...], torch.dtype]]], "list[torch.Tensor] | None"]


def _source(value: Any, keep: list[Any]) -> tuple[int, tuple[int, ...], torch.dtype] | None:
    """``(address, shape, dtype)`` of a leaf whose bytes the Rust core can read, else None."""
    if type(value) is _LazyLeaf:
        keep.append(value.buffer)
        return value.buffer.address, value.shape, value.dtype
    if (
        value.device.type != "cpu"
        or value.requires_grad
        or value.is_nested
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


# ---------------------------------------------------------------------------- the batch plan
# What a walk of the tree finds, kept on the tree between batches (``_gather_plan``
# in its ``__dict__``), so that a batch costs one identity check of the tree's entries and a
# few attribute reads per leaf instead of a walk. A plan is only used while every node still
# holds exactly the same key and value objects (``_native.same_entries``), and every tensor
# leaf still has the address, shape, dtype and contiguity it was planned with (in-place
# ``set_``, ``resize_`` or ``.data =`` change those); else it is made again.

_LEAF, _NODE, _VALUE, _STACK, _WHOLE = 0, 1, 2, 3, 4  # _WHOLE: an UnbatchedTensor, kept


class _Plan:
    """The shape of one tree's batch: its nodes, leaves and where each leaf's rows go."""

    __slots__ = (
        "bulk_bytes",
        "entries",
        "flat",
        "flat_known",
        "leaves",
        "nodes",
        "owners",
        "row_bytes",
        "sizes",
        "tensors",
    )

    def __init__(self) -> None:
        self.nodes: list[tuple[dict, tuple, tuple]] = []  # for _native.same_entries
        self.owners: list[Any] = []  # the TensorDict of each node (its dict must not change)
        self.entries: list[list[tuple[str, int, Any]]] = []  # per node, in key order
        # (value, address, rows, row_bytes, dtype, tail shape) per leaf
        self.leaves: list[tuple[Any, int, int, int, torch.dtype, tuple[int, ...]]] = []
        # (value, address, shape, dtype) of the tensor leaves (lazy leaves cannot change)
        self.tensors: list[tuple[torch.Tensor, int, torch.Size, torch.dtype]] = []
        self.flat: tuple[str, ...] | None = None  # see flat_keys
        self.flat_known = False
        self.row_bytes = 0
        self.bulk_bytes = 0  # of the rows of at least BULK_ROW bytes
        # n, then the leaf shapes of n rows and their (shape, dtype)s (what ``alloc`` gets)
        self.sizes: tuple[int, list[tuple[int, ...]], list[tuple[tuple[int, ...], Any]]] = (
            -1,
            [],
            [],
        )

    def add(self, td: TD) -> bool:
        """Plans ``td`` and its nested nodes; False when a leaf needs torch's path."""
        items = td._tensordict
        self.nodes.append((items, tuple(items), tuple(items.values())))
        # The root is not kept (the plan lives in its __dict__: no reference cycle).
        self.owners.append(td if self.nodes[1:] else None)
        entries: list[tuple[str, int, Any]] = []
        self.entries.append(entries)
        for key, value in items.items():
            if type(value) in NTD_TYPES:
                entries.append((key, _VALUE, value))
                continue
            if type(value) is NonTensorStack:
                entries.append((key, _STACK, value))
                continue
            if type(value) is UnbatchedTensor:
                entries.append((key, _WHOLE, value))
                continue
            if not (type(value) is _LazyLeaf or isinstance(value, torch.Tensor)):
                entries.append((key, _NODE, len(self.nodes)))
                if not self.add(value):
                    return False
                continue
            src = _source(value, [])
            if src is None:
                return False
            address, shape, dtype = src
            if not shape:
                return False
            row = _row_bytes(shape, dtype)
            entries.append((key, _LEAF, len(self.leaves)))
            self.leaves.append((value, address, shape[0], row, dtype, shape[1:]))
            if isinstance(value, torch.Tensor):  # lazy leaves cannot change
                self.tensors.append((value, address, value.shape, dtype))
            self.row_bytes += row
            if row >= BULK_ROW:
                self.bulk_bytes += row
        return True

    def valid(self, td: TD) -> bool:
        """True while the tree ``td`` is as planned (see the comment above)."""
        if td._tensordict is not self.nodes[0][0]:
            return False
        for owner, node in zip(self.owners[1:], self.nodes[1:], strict=True):
            if owner._tensordict is not node[0]:
                return False
        if not _native.same_entries(self.nodes):
            return False
        for value, address, shape, dtype in self.tensors:
            if (
                value.data_ptr() != address
                or value.shape != shape
                or value.dtype != dtype
                or not value.is_contiguous()
                or value.requires_grad
                or not value.is_cpu
                or value.is_conj()  # `.data = t.conj()` keeps address and shape
                or value.is_neg()
            ):
                return False
        return True

    def specs(self, n: int) -> list[tuple[tuple[int, ...], Any]]:
        """The ``(shape, dtype)`` of each leaf of a batch of ``n`` rows (what ``alloc`` gets)."""
        if self.sizes[0] != n:
            shapes = [(n, *leaf[5]) for leaf in self.leaves]
            specs = [(size, leaf[4]) for size, leaf in zip(shapes, self.leaves, strict=True)]
            self.sizes = (n, shapes, specs)
        return self.sizes[2]

    def flat_keys(self) -> tuple[str, ...] | None:
        """The keys of a flat tree (one node, every entry a leaf, in the leaves' order)."""
        if not self.flat_known:
            flat = len(self.owners) == 1 and all(kind == _LEAF for _, kind, _ in self.entries[0])
            self.flat = tuple(key for key, _, _ in self.entries[0]) if flat else None
            self.flat_known = True
        return self.flat

    def jobs_into(self, offsets: list[int], base: int) -> list[tuple[int, int, int, int]]:
        """The copies of a flat tree's rows into leaves at ``base + offsets[i]`` (the
        ``jobs`` of ``copy_rows``; a leaf with no bytes per row has none)."""
        return [
            (address, rows, base + offset, row)
            for (_, address, rows, row, _, _), offset in zip(self.leaves, offsets, strict=True)
            if row
        ]

    def build(
        self,
        td: TD,
        index: torch.Tensor,
        jobs: list[tuple[int, int, int, int]],
        alloc: Alloc | None = None,
    ) -> TD:
        """The batch of rows ``index`` of ``td`` (the planned tree): leaves allocated (by
        ``alloc`` when given and it can), the copies listed in ``jobs``; stacks of non-tensor
        values take their rows at once."""
        n = index.numel()
        made: list[Any] = [None] * len(self.owners)
        leaves = self.leaves
        specs = self.specs(n)
        sizes = self.sizes[1]
        given = None
        if alloc is not None:
            given = alloc(specs)
        for i in range(len(self.owners) - 1, -1, -1):  # children come after their parents
            src = self.owners[i] if i else td
            out = type(src)._new_unchecked(torch.Size((n, *src._batch_size[1:])), src._device)
            items = out._tensordict
            for key, kind, x in self.entries[i]:
                if kind == _LEAF:
                    _, address, rows, row, dtype, _ = leaves[x]
                    leaf = torch.empty(sizes[x], dtype=dtype) if given is None else given[x]
                    items[key] = leaf
                    if row:
                        jobs.append((address, rows, leaf.data_ptr(), row))
                elif kind == _NODE:
                    items[key] = made[x]
                elif kind == _STACK:
                    items[key] = x.take_rows(index)
                elif kind == _WHOLE:
                    items[key] = x  # the whole batch's (its batch size is set when read)
                else:
                    items[key] = type(x)(x.data)
            made[i] = out
        return made[0]

    def into(
        self,
        out: TD,
        n: int,
        keep: list[Any],
        jobs: list[Any],
        stacks: list[tuple[Any, Any]],
        i: int = 0,
    ) -> bool:
        """Lists the copies of the planned tree's rows into ``out``'s leaves (of ``n`` rows,
        matching keys, dtypes and shapes, writable), in the tree's order, and the stacks of
        non-tensor values that take rows in ``stacks`` (target, source); False when one
        cannot take them. ``i`` is the node of the plan that ``out`` matches."""
        items = out._tensordict
        for key, kind, x in self.entries[i]:
            if kind == _VALUE or kind == _WHOLE:
                continue
            if kind == _STACK:
                target = items.get(key)
                if type(target) is not NonTensorStack or target.batch_size[:1] != (n,):
                    return False
                stacks.append((target, x))
                continue
            value = items.get(key)
            if value is None:
                return False
            if kind == _NODE:
                if isinstance(value, torch.Tensor) or type(value) in (_LazyLeaf, NonTensorData):
                    return False
                if not self.into(value, n, keep, jobs, stacks, x):
                    return False
                continue
            if type(value) is _LazyLeaf:
                value = out._get_str(key)
            if not isinstance(value, torch.Tensor) or not _writable(value):
                return False
            dst = _source(value, keep)
            _, address, rows, row, dtype, tail = self.leaves[x]
            if dst is None or dst[2] != dtype or dst[1] != (n, *tail):
                return False
            if row:
                jobs.append((address, rows, dst[0], row))
        return True


def _plan(td: TD) -> _Plan | None:
    """The valid batch plan of ``td`` (made and kept if needed); None: torch's path."""
    plan = td.__dict__.get("_gather_plan")
    if plan is not None and plan.valid(td):
        return plan
    plan = _Plan()
    if not plan.add(td):
        td.__dict__.pop("_gather_plan", None)
        return None
    td.__dict__["_gather_plan"] = plan
    return plan


def _planned(td: TD, rows: torch.Tensor) -> tuple[_Plan, torch.Tensor] | None:
    """The valid plan of ``td`` and the index as the native call takes it; None: torch's path."""
    if not td.batch_size or (td.device is not None and td.device != _CPU):
        return None
    index = _index(rows)
    if index is None:
        return None
    plan = _plan(td)
    if plan is None or plan.row_bytes * index.numel() < MIN_BYTES:
        return None
    return plan, index


def flat_plan(td: TD, rows: torch.Tensor) -> tuple[_Plan, tuple[str, ...], torch.Tensor] | None:
    """The valid plan of ``td`` and its keys when its batch is flat (one node, every entry a
    leaf), and the index as ``copy_rows`` takes it; None: ``gather`` handles ``td``. A
    DataLoader worker's ring copies such a batch with jobs it prepared once per slot."""
    got = _planned(td, rows)
    if got is None:
        return None
    plan, index = got
    keys = plan.flat_keys()
    if keys is None:
        return None
    return plan, keys, index


def copy_rows(plan: _Plan, index: torch.Tensor, jobs: list[tuple[int, int, int, int]]) -> None:
    """Copies the rows ``index`` of the planned tree's leaves as ``jobs`` list them (source
    address, source rows, destination address, bytes per row: one native call). The plan
    keeps the sources referenced; the caller keeps the destinations."""
    n = index.numel()
    _native.gather_rows(index.data_ptr(), n, jobs, _threads(plan, n))


def _threads(plan: _Plan, n: int) -> bool:
    """Whether the copy of ``n`` rows runs on several threads; their helpers are woken now."""
    # Several threads only where torch uses several too (DataLoader workers set 1).
    parallel = torch.get_num_threads() > 1
    if parallel and plan.bulk_bytes * n >= PARALLEL_BYTES:
        _native.gather_prepare()
    return parallel


def gather(
    td: TD, rows: torch.Tensor, out: TD | None = None, alloc: Alloc | None = None
) -> TD | None:
    """Rows ``rows`` of batch dim 0 of every leaf, in one native call; None: use torch's path.

    With ``out``, the rows are written into its leaves (``index_select(0, rows, out=out)``)
    and ``out`` is returned. With ``alloc``, the new leaves are the contiguous CPU tensors it
    returns for their ``(shape, dtype)``s, in the tree's order (None from it: allocated as
    usual); a DataLoader worker's ring passes one. Raises ``IndexError`` for a row out of range.
    """
    got = _planned(td, rows)
    if got is None:
        return None
    plan, index = got
    n = index.numel()
    parallel = _threads(plan, n)
    keep: list[Any] = [index, plan]  # the plan's leaves (the sources) stay referenced
    jobs: list[tuple[int, int, int, int]] = []
    stacks: list[tuple[Any, Any]] = []
    if out is None:
        result = plan.build(td, index, jobs, alloc)
    else:
        if tuple(out.batch_size[:1]) != (n,) or not plan.into(out, n, keep, jobs, stacks):
            return None
        result = out
    _native.gather_rows(index.data_ptr(), n, jobs, parallel)
    for target, source in stacks:
        target[...] = source.take_rows(index)
    del keep
    return result
