"""Batch indexing: ``td[rows]``, ``td[rows] = value`` and ``index_select`` (bound onto
TensorDict as ``_index``, ``_set_rows``, ``_preallocate`` and ``index_select``).

Row gathers of CPU trees are one native call (``gather.py``); other indexes go leaf by leaf.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from .._core import dirty as _dirty
from .._core import index as _items
from .._core.errors import InplaceWriteError
from .._core.locking import locked_error, mark_read_only, refuse_read_only
from .._core.nodes import NTD_TYPES, TD, NonTensorData, TreeNode
from .._core.nontensor import NonTensorStack
from .._core.unbatched import UnbatchedTensor
from .._core.walk import is_tree, map_leaves, zip_leaves
from . import gather as _gather
from . import keys as _keys


def pairs(source: Any) -> Iterator[tuple[str, Any]]:
    """The top-level ``(key, value)`` pairs of a TensorDict (lazy leaves made) or a mapping."""
    if is_tree(source):
        for key in list(source._tensordict):
            value = source._get_str(key)
            yield key, value
    else:
        yield from source.items()


def index(td: TD, index: Any) -> TD:
    """``td[index]`` for a batch index (see ``TensorDict.__getitem__``)."""
    rows = _items.row_index(index)
    if rows is not None and td.batch_dims >= 1:
        gathered = _gather.gather(td, rows)  # one native call for CPU trees
        if gathered is not None:
            if td._names is not None:
                gathered._set_names(list(td._names))
            return gathered
        # index_select refuses negative rows; wrap them like tensor indexing does.
        size = td._batch_size[0]
        if rows.numel():
            low, high = (int(v) for v in torch.aminmax(rows))
            if low < -size or high >= size:
                bad = high if high >= size else low
                raise IndexError(f"index {bad} is out of bounds for dimension 0 with size {size}")
        rows = torch.where(rows < 0, rows + size, rows)
        batch = torch.Size([rows.numel(), *td._batch_size[1:]])
        return map_leaves(
            td,
            lambda t: torch.index_select(t, 0, rows.to(t.device)),
            batch_size=batch,
            moves_rows=True,
        )
    # A view of rows is a new, unlocked tree, never a saved one (as tensordict's td[1:]).
    items = _items.normalize(index, td.batch_dims)
    batch = _items.indexed_batch_size(td._batch_size, items)
    out = map_leaves(
        td,
        lambda t: t[items],
        batch_size=batch,
        moves_rows=True,
        names=_index_names(td, items, len(batch)),
        rows=_view_rows(items, td._batch_size[0] if td._batch_size else 0),
    )
    if td._read_only:
        mark_read_only(out)  # views of the same read-only buffer
    if td._is_shared and all(i is None or isinstance(i, (int, slice)) for i in items):
        out._mark_shared()  # a view of shared memory is shared (tensordict's td[0], td[1:])
    if td._is_locked and (td._is_shared or td._is_memmap) and _from_the_start(index):
        # as tensordict's: a view from the first row of a locked shared or memory-mapped tree
        # (td[0], unbind, td[:2]) is locked, so a key added to it raises instead of reaching
        # no tree
        out.lock_()
    return out


def _from_the_start(index: Any) -> bool:
    """Whether ``index`` keeps the first element's address (ints, slices from 0, None, ...),
    tensordict's test for the views of shared and memory-mapped trees it locks."""
    if isinstance(index, tuple):
        return all(map(_from_the_start, index))
    if isinstance(index, slice):
        return index.start is None or index.start == 0
    return index is None or index is Ellipsis or (type(index) is int)


def _view_rows(items: tuple[Any, ...], n: int) -> Any:
    """The rows of the first batch dim (of ``n``) that a view by the basic index ``items``
    covers: a slice, or ``_dirty.ALL`` (what a write through the view stamps)."""
    first = items[0] if items else slice(None)
    if isinstance(first, int) and not isinstance(first, bool):
        row = first + n if first < 0 else first
        return slice(row, row + 1)
    if isinstance(first, slice):
        start, stop, step = first.indices(n)
        if step > 0:
            return slice(start, max(start, stop))
    return _dirty.ALL


def _first_class_dim(item: Any) -> bool:
    """Whether ``item`` is a first-class dimension (``functorch.dim``), told by its type's
    module so that functorch is not imported here."""
    return type(item).__module__ == "functorch.dim" and type(item).__name__ == "Dim"


def _index_names(td: TreeNode, items: tuple[Any, ...], ndim: int) -> list[Any] | None:
    """The names of the ``ndim`` batch dims left by a normalized index, by torch's rules: an
    int drops its dim, a slice keeps it, ``None`` adds an unnamed one; the index tensors (a
    k-d boolean mask counts as one over its k dims) give the dims of their broadcast, in their
    place when nothing but ints lies between them, else first. Those dims keep the name of the
    indexed dim for a lone 1-d index (as tensordict), and are unnamed otherwise."""
    if td._names is None:
        return None
    names = list(td._names)
    advanced: list[tuple[torch.Tensor, int]] = []  # index tensors and their first dim
    pieces: list[Any] = []  # names of basic dims, and one marker where the advanced dims go
    at = 0
    marker_at = None
    broken = False  # a slice, None or Ellipsis between two index tensors
    for position, item in enumerate(items):
        if isinstance(item, np.ndarray):  # numpy indices name dims as the tensors they make
            item = torch.as_tensor(item)
        elif isinstance(item, np.integer):
            item = int(item)
        if item is Ellipsis:
            after = items[position + 1 :]
            rest = len(names) - at - sum(_consumed(i) for i in after if i is not None)
            pieces.extend(names[at : at + rest])
            at += rest
            if advanced and rest:
                broken = True
        elif item is None:
            pieces.append(None)
            if advanced:
                broken = True
        elif (
            isinstance(item, (int, torch.SymInt))
            or (isinstance(item, torch.Tensor) and item.ndim == 0 and item.dtype != torch.bool)
            or _first_class_dim(item)  # its dim leaves the batch, as an int's
        ):
            at += 1
        elif isinstance(item, slice):
            pieces.append(names[at])
            at += 1
            if advanced:
                broken = True
        elif isinstance(item, (torch.Tensor, list, range)):
            t = item if isinstance(item, torch.Tensor) else torch.as_tensor(item)
            if advanced and broken:
                marker_at = 0  # index tensors apart: their dims go first, as torch's
            if not advanced:
                marker_at = len(pieces)
                pieces.append(_ADVANCED)
            advanced.append((t, at))
            at += t.ndim if t.dtype == torch.bool else 1
        else:
            return None
    pieces.extend(names[at:])
    if advanced:
        pieces.remove(_ADVANCED)
        pieces[marker_at or 0 : marker_at or 0] = _block_names(names, advanced)
    if len(pieces) != ndim:  # an index this rule does not foresee: no names, never wrong ones
        return None
    return pieces if any(n is not None for n in pieces) else None


_ADVANCED = object()


def _block_names(names: list[Any], advanced: list[tuple[torch.Tensor, int]]) -> list[Any]:
    """The names of the dims of the advanced block (index tensors, with the first batch dim
    each one indexes), by tensordict's rule: a dim keeps the name of the one indexed dim that
    the index tensors varying along it (or, if none varies, all that have it) index; a mask
    over several dims, or tensors of several dims, leave it unnamed. A name that several
    block dims would take stays only on the one along which its index varies, if there is
    exactly one."""
    shapes: list[tuple[tuple[Any, ...], range]] = []
    ndim = 0
    for t, first in advanced:
        if t.dtype == torch.bool:
            ndim = max(ndim, 1)
            if t.ndim:  # a mask: one dim of unknown length over the dims it covers
                shapes.append(((None,), range(first, first + t.ndim)))
            continue
        ndim = max(ndim, t.ndim)
        shapes.append((tuple(t.shape), range(first, first + 1)))
    block: list[tuple[Any, bool]] = []
    for dim in range(-ndim, 0):
        having = [(shape[dim], used) for shape, used in shapes if len(shape) >= -dim]
        varying = [used for size, used in having if size != 1]
        sources: set[int] = set().union(*(varying or [used for _, used in having]))
        block.append((names[sources.pop()] if len(sources) == 1 else None, bool(varying)))
    taken = [name for name, _ in block]
    return [
        name
        if name is None
        or taken.count(name) == 1
        or (varies and [v for other, v in block if other == name].count(True) == 1)
        else None
        for name, varies in block
    ]


def _consumed(item: Any) -> int:
    """The batch dims an item of a normalized index consumes."""
    if isinstance(item, torch.Tensor) and item.dtype == torch.bool:
        return item.ndim
    return 1


def set_rows(td: TreeNode, index: Any, value: Any) -> None:
    """``td[index] = value`` for a batch index (see ``TensorDict.__setitem__``)."""
    refuse_read_only(td)
    items = _items.normalize(index, td.batch_dims)
    rows = _items.indexed_batch_size(td._batch_size, items)  # out-of-range rows: IndexError
    if is_tree(value) and value.batch_size != rows:
        try:
            fits = torch.broadcast_shapes(value.batch_size, rows) == rows
        except RuntimeError:
            fits = False
        if not fits:  # before any row is written (tensordict's message)
            raise RuntimeError(
                f"indexed destination TensorDict batch size is {torch.Size(rows)} (batch_size ="
                f" {td._batch_size}, index={index}), which differs from the source batch size "
                f"{value.batch_size}"
            )
    refuse_saved_kind_change(td, value)  # before any row is written
    token = _dirty.mark(td, items)
    try:
        _write_rows(td, items, value)
    finally:
        _dirty.confirm(td, items, token)


def _write_rows(td: TreeNode, items: tuple[Any, ...], value: Any) -> None:
    if is_tree(value) or isinstance(value, Mapping):
        for key, sub_value in pairs(value):
            if key not in td._tensordict:
                preallocate(td, key, sub_value, items)
            target = td._get_str(key)
            if is_tree(target):
                target[items] = sub_value
            elif type(target) in NTD_TYPES:
                _set_non_tensor_rows(td, key, target, items, sub_value)
            elif type(target) is NonTensorStack:
                target[_stack_index(items)] = sub_value
            elif type(target) is UnbatchedTensor:
                target.copy_(sub_value)  # the whole batch's payload: written whole, any index
            else:
                target[items] = sub_value
        return
    for key in list(td._tensordict):
        target = td._get_str(key)
        # (an UnbatchedTensor has no rows: a value for every leaf leaves it as it is)
        if not isinstance(target, (NonTensorData, NonTensorStack, UnbatchedTensor)):
            target[items] = value


def _stack_index(items: tuple[Any, ...]) -> Any:
    """A batch index as a stack takes it (lists as int64 tensors)."""
    return tuple(torch.as_tensor(i) if isinstance(i, list) else i for i in items)


def saved_kind_change_error(key: Any, target: NonTensorData) -> InplaceWriteError:
    """The error of a write that would turn the NonTensorData ``target`` of a saved tree (one
    value in its meta.json) into a stack of values per row, which its directory cannot take in
    place (the directory would keep the old value: lost on reload)."""
    name = key[0] if isinstance(key, tuple) and len(key) == 1 else key
    where = f" in {target._saved[0]}" if target._saved else ""
    return InplaceWriteError(
        f"Cannot write different values per row into the non-tensor entry {name!r} of a saved "
        f"tree{where}: it is saved as one value (a NonTensorData meta.json), which cannot become "
        "a NonTensorStack in place. Nothing was written. Write the same value into every row, "
        "or replace the entry (td.set(key, values)) and save the tree again (memmap)."
    )


def refuse_saved_kind_change(td: TreeNode, value: Any, prefix: tuple[str, ...] = ()) -> None:
    """Raises ``saved_kind_change_error`` when ``td[rows] = value`` would turn a NonTensorData
    entry of a saved (loaded, unlocked) tree into a stack: checked before any row is written.
    (A locked tree refuses that change with ``LockedError`` when the entry is reached, after
    the rows before it, as tensordict does.) A non-tensor entry of a tree mapped shared onto a
    ``.tdz`` archive, which cannot be rewritten in place, is refused here too, locked or not,
    so that the row's tensors are not written without it."""
    if not (is_tree(value) or isinstance(value, Mapping)):
        return
    for key, sub_value in pairs(value):
        if not isinstance(key, str) or key not in td._tensordict:
            continue
        target = td._get_str(key)
        if is_tree(target):
            refuse_saved_kind_change(target, sub_value, (*prefix, key))
        elif type(target) is NonTensorStack and target._cells.saved is not None:
            _refuse_archive_entry(target._cells.saved[1])
        elif (
            type(target) in NTD_TYPES
            and target._saved is not None
            and not _same_non_tensor(target, sub_value)
        ):
            _refuse_archive_entry(target._saved[0])
            if not td._is_locked:
                raise saved_kind_change_error((*prefix, key), target)


def _refuse_archive_entry(parent: Any) -> None:
    """Raises the error of a non-tensor value saved in a ``.tdz`` archive mapped shared (its
    saved ``parent`` is then ``io.directory._ArchiveEntry``, which refuses any rewrite)."""
    refuse = getattr(parent, "_refuse", None)
    if refuse is not None:
        refuse()


def _same_non_tensor(target: NonTensorData, value: Any) -> bool:
    """Whether writing ``value`` into rows of ``target`` keeps it (the same one value)."""
    data = value.data if type(value) in NTD_TYPES else value
    if type(data) is NonTensorStack:
        return False
    try:
        return data is target.data or bool(data == target.data)
    except Exception:
        return False


def _set_non_tensor_rows(
    td: TD, key: str, target: NonTensorData, items: tuple[Any, ...], value: Any
) -> None:
    """``td[items] = {key: value}`` on a NonTensorData entry: a value equal to the entry's
    keeps it; another value turns the entry into a stack (one value per row), as tensordict
    does, also in a locked tree (writing rows is in place there); a shared or memory-mapped
    entry refuses that change (its value is one cell in shared memory or one meta.json)."""
    if _same_non_tensor(target, value):
        return
    if target._saved is not None and not td._is_locked:
        raise saved_kind_change_error(key, target)  # (set_rows checks it before any write)
    if td._is_locked and (target._shared is not None or target._saved is not None):
        raise locked_error()
    target.batch_size, target.device = td._batch_size, td._device
    stack = target.maybe_to_stack()
    stack[_stack_index(items)] = value
    td._tensordict[key] = stack


def preallocate(td: TD, key: str, value: Any, items: tuple[Any, ...]) -> None:
    """A new zero-filled entry for ``td[items] = {key: value}`` (tensordict's lazy
    preallocation): the batch size of ``td``, then ``value``'s own dims and dtype."""
    if td._is_locked:
        raise locked_error()
    rows = len(_items.indexed_batch_size(td._batch_size, items))
    if is_tree(value) or isinstance(value, Mapping):
        extra = value.batch_size[rows:] if is_tree(value) else ()
        batch = torch.Size([*td._batch_size, *extra])
        td._tensordict[key] = type(td)._new_unchecked(batch, td._device)
        return
    leaf = _keys.leaf_value(value)
    if isinstance(leaf, NonTensorData):
        td._tensordict[key] = type(leaf)(leaf.data)
        return
    if isinstance(leaf, NonTensorStack):
        # the rows' values, written by the caller; the other rows hold None until written
        batch = torch.Size([*td._batch_size, *leaf.batch_size[rows:]])
        td._tensordict[key] = NonTensorStack.from_values([None] * batch.numel(), batch, td._device)
        return
    device = td._device if td._device is not None else leaf.device
    shape = (*td._batch_size, *leaf.shape[rows:])
    td._tensordict[key] = torch.zeros(shape, dtype=leaf.dtype, device=device)


def index_select(td: TD, dim: int, index: torch.Tensor, *, out: TD | None = None) -> TD:
    """Gathers rows ``index`` of batch dim ``dim`` from every leaf with ``torch.index_select``.

    With ``out`` (a TensorDict of the result's shape, e.g. from a previous call) the rows are
    written into its tensors and no memory is allocated: the training-loop form.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(8).reshape(4, 2), "b": {"c": torch.arange(4)}}, [4])
    >>> rows = td.index_select(0, torch.tensor([3, 0]))
    >>> rows["a"].tolist(), rows["b", "c"].tolist()
    ([[6, 7], [0, 1]], [3, 0])
    >>> td.index_select(0, torch.tensor([1, 2]), out=rows)["b", "c"].tolist()  # no allocation
    [1, 2]
    """
    index = index if index.dtype == torch.int64 else index.long()
    if dim < 0:
        dim += td.batch_dims
    if out is None:
        if dim == 0:
            gathered = _gather.gather(td, index)  # one native call for CPU trees
            if gathered is not None:
                return gathered
        batch = list(td._batch_size)
        batch[dim] = index.numel()
        return map_leaves(
            td, lambda t: torch.index_select(t, dim, index.to(t.device)), batch_size=batch
        )
    # the rows of ``out`` a checkpoint copies (they were missed: found by an attack)
    token = _dirty.mark(out)
    if dim != 0 or _gather.gather(td, index, out) is None:  # one native call for CPU trees
        for leaf, target in zip_leaves(td, out):
            torch.index_select(
                leaf, dim, index if leaf.is_cpu else index.to(leaf.device), out=target
            )
    _dirty.confirm(out, _dirty.ALL, token)
    return out
