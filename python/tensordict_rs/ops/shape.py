"""Batch-shape operations: expand, reshape, view, squeeze, permute, split, unbind, ...

Each is a function of one leaf handed to ``map_leaves``: the leaf's batch dims change, its own
dims after them stay. Results are views where torch makes views (slices of a memory map stay
``MemoryMappedTensor`` views of the file). As in tensordict, the result of a shape change of a
locked TensorDict is locked; indexing, ``unbind`` and iteration give unlocked TensorDicts.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import torch

from .._core import dirty as _dirty
from .._core.classes import is_tensor_collection
from .._core.index import permutation
from .._core.locking import LOCK_ERROR
from .._core.nodes import NTD_TYPES, TD, TreeNode
from .._core.nontensor import NonTensorStack
from .._core.walk import KEEP, map_leaves
from ..memmap import MemoryMappedTensor

_SCALAR = torch.zeros((), dtype=torch.uint8)


def _probe(td: TD) -> torch.Tensor:
    """A stride-0 tensor of the batch size: torch computes new batch sizes on it for free."""
    return _SCALAR.expand(td.batch_size)


def _shape_args(args: tuple[Any, ...], kwargs: dict[str, Any], name: str = "shape") -> list[int]:
    """``f(2, 3)``, ``f((2, 3))``, ``f(torch.Size([2, 3]))`` or ``f(shape=...)`` as a list
    (``size=`` too, torch's other name, which tensordict's ``reshape`` and ``view`` take)."""
    if name not in kwargs and "size" in kwargs:
        kwargs[name] = kwargs.pop("size")
    if name in kwargs:
        if args:
            raise TypeError(f"{name} given both by position and by keyword")
        args = (kwargs.pop(name),)
    if kwargs:
        raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
    if len(args) == 1 and isinstance(args[0], Iterable) and not isinstance(args[0], torch.Tensor):
        args = tuple(args[0])
    return [operator.index(a) for a in args]


def dim_of(td: TD, dim: int, extra: int = 0) -> int:
    """``dim`` made non-negative against the batch dims (``extra`` more allowed, for unsqueeze)."""
    ndim = td.batch_dims + extra
    new = dim + ndim if dim < 0 else dim
    if not 0 <= new < ndim:
        raise IndexError(f"Incompatible dim {new} for tensordict with shape {td.batch_size}.")
    return new


def _with_batch(
    td: TD,
    leaf_fn: Any,
    batch: Any,
    lock: bool = True,
    names: Any = KEEP,
    stacks: bool = False,
    rows: Any = _dirty.ALL,
) -> TD:
    """``map_leaves`` of a shape operation; ``stacks``: its ``NonTensorData`` entries become
    ``NonTensorStack`` ones, as tensordict's expand and unsqueeze make them
    (``td.unsqueeze(0)["text"]`` is a list there); ``rows``: the rows of ``td`` a view covers
    (``map_leaves``)."""
    non_tensor = _stacking(leaf_fn) if stacks else None
    return map_leaves(
        td,
        _KeepMaps(leaf_fn),
        batch_size=batch,
        lock=lock,
        moves_rows=True,
        names=names,
        non_tensor=non_tensor,
        rows=rows,
    )


class _KeepMaps:
    """A shape operation's leaf function whose results that view a memory-mapped leaf's map
    stay MemoryMappedTensors of it (as rows of the tree do): a view sent to another process
    (a transposed tree to a worker) then crosses as a view of the same memory, not as a copy
    whose writes are lost. (``MemoryMappedTensor.transpose`` itself gives a plain tensor, as
    tensordict's does.)"""

    __slots__ = ("fn",)

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, value: Any, *rest: Any, **kwargs: Any) -> Any:
        out = self.fn(value, *rest, **kwargs)
        if type(value) is MemoryMappedTensor and type(out) is torch.Tensor:
            return value._keep(out)
        return out


def _stacking(leaf_fn: Any) -> Any:
    """The non-tensor map of a shape operation that makes stacks of ``NonTensorData``."""

    def move(value: Any, *_: Any) -> Any:
        if type(value) in NTD_TYPES:
            return value.stacked(leaf_fn)
        return value.apply_positions(leaf_fn)

    return move


def _named(td: TD, order: Any) -> list[Any] | None:
    """The names of ``td``'s batch dims in ``order`` (indices, or None for a new unnamed
    dim); None when ``td`` is unnamed."""
    if td._names is None:
        return None
    return [None if i is None else td._names[i] for i in order]


def expand(td: TD, *args: Any, **kwargs: Any) -> TD:
    """Views whose batch dims are expanded to ``shape`` (leading dims may be added; -1 keeps).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.expand(4, 2).batch_size, td.expand(4, 2)["a"].shape
    (torch.Size([4, 2]), torch.Size([4, 2, 3]))
    """
    shape = _shape_args(args, kwargs)
    if len(shape) < td.batch_dims:
        raise RuntimeError(
            f"the number of sizes provided ({len(shape)}) must be greater or equal to the "
            f"number of dimensions in the TensorDict ({td.batch_dims})"
        )
    try:
        batch = _probe(td).expand(shape).shape
    except RuntimeError:
        raise RuntimeError(
            "Incompatible expanded shape: The expanded shape length at non-singleton dimension "
            f"should be same as the original length. target_shape = {torch.Size(shape)}, "
            f"existing_shape = {td.batch_size}"
        ) from None
    dims = td.batch_dims
    names = _named(td, [None] * (len(batch) - dims) + list(range(dims)))
    return _with_batch(
        td, lambda t: t.expand(*batch, *t.shape[dims:]), batch, names=names, stacks=True
    )


def expand_as(td: TD, other: Any) -> TD:
    """``expand(other.shape)`` for a tensor; for a TensorDict (or tensorclass), each leaf
    expanded as ``other``'s leaf of the same key, with ``other``'s batch size (as tensordict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.expand_as(torch.zeros(5, 2)).batch_size
    torch.Size([5, 2])
    >>> other = TensorDict({"a": torch.zeros(4, 2, 3), "b": {"c": torch.zeros(4, 2)}}, [4, 2])
    >>> td.expand_as(other)["a"].shape
    torch.Size([4, 2, 3])
    """
    if is_tensor_collection(other):
        return cast(TD, td.apply(torch.Tensor.expand_as, other, batch_size=other.batch_size))
    return expand(td, other.shape)


def reshape(td: TD, *args: Any, inplace: bool = False, **kwargs: Any) -> TD:
    """The batch dims reshaped to ``shape`` (views when torch can, copies otherwise);
    ``inplace`` gives ``td`` itself the reshaped entries.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.reshape(2, 1)["a"].shape
    torch.Size([2, 1, 3])
    """
    batch = _probe(td).reshape(_shape_args(args, kwargs)).shape
    dims = td.batch_dims
    out = _with_batch(td, lambda t: t.reshape(*batch, *t.shape[dims:]), batch, names=None)
    return _in_place(td, out, inplace)


def view(td: TD, *args: Any, **kwargs: Any) -> TD:
    """Views with the batch dims viewed as ``shape``; ``view(dtype)`` views every leaf's bytes.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.view(1, 2)["a"].shape
    torch.Size([1, 2, 3])
    """
    if (len(args) == 1 and isinstance(args[0], torch.dtype)) or ("dtype" in kwargs and not args):
        dtype = args[0] if args else kwargs.pop("dtype")
        batch = kwargs.pop("batch_size", None)
        if kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
        # a dtype of another size changes the last dim: batch_size= says what remains batch
        new_batch = batch if batch is not None else td.batch_size
        return _with_batch(td, lambda t: t.view(dtype), new_batch, lock=False)
    batch = _probe(td).view(_shape_args(args, kwargs)).shape
    if batch == td.batch_size:
        return td
    dims = td.batch_dims
    return _with_batch(td, lambda t: t.view(*batch, *t.shape[dims:]), batch, names=None)


def squeeze(td: TD, dim: int | None = None) -> TD:
    """Without the batch dims of size 1 (or only ``dim``; ``td`` itself if that is not 1).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.unsqueeze(0).squeeze(0).batch_size
    torch.Size([2])
    """
    if dim is None:
        drop = tuple(i for i, size in enumerate(td.batch_size) if size == 1)
        if not drop:
            return td
    else:
        dim = dim_of(td, dim)
        if td.batch_size[dim] != 1:
            return td
        drop = (dim,)
    batch = torch.Size(s for i, s in enumerate(td.batch_size) if i not in drop)
    names = _named(td, [i for i in range(td.batch_dims) if i not in drop])
    return _with_batch(td, lambda t: t.squeeze(drop), batch, names=names)


def unsqueeze(td: TD, dim: int) -> TD:
    """With a new batch dim of size 1 at ``dim`` (in ``[-batch_dims - 1, batch_dims]``).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.unsqueeze(0).batch_size, td.unsqueeze(0)["a"].shape
    (torch.Size([1, 2]), torch.Size([1, 2, 3]))
    """
    new = td.batch_dims + dim + 1 if dim < 0 else dim
    if not 0 <= new <= td.batch_dims:
        raise RuntimeError(
            "unsqueezing is allowed for dims comprised between `-td.batch_dims - 1` and "
            f"`td.batch_dims` only. Got dim={dim} with a batch size of {td.batch_size}."
        )
    batch = list(td.batch_size)
    batch.insert(new, 1)
    order: list[Any] = list(range(td.batch_dims))
    order.insert(new, None)
    return _with_batch(td, lambda t: t.unsqueeze(new), batch, names=_named(td, order), stacks=True)


def permute(td: TD, *args: Any, **kwargs: Any) -> TD:
    """The batch dims in the order ``dims`` (every batch dim once).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2, 3, 4)}, [2, 3])
    >>> td.permute(1, 0)["a"].shape
    torch.Size([3, 2, 4])
    """
    dims = permutation(_shape_args(args, kwargs, "dims"), td.batch_size)
    if dims == list(range(td.batch_dims)):
        return td
    batch = [td.batch_size[d] for d in dims]
    n = td.batch_dims
    names = _named(td, dims)
    return _with_batch(td, lambda t: t.permute(*dims, *range(n, t.ndim)), batch, names=names)


def transpose(td: TD, dim0: int, dim1: int) -> TD:
    """Batch dims ``dim0`` and ``dim1`` swapped.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2, 3, 5)}, [2, 3])
    >>> td.transpose(0, 1)["a"].shape
    torch.Size([3, 2, 5])
    """
    n = td.batch_dims
    dim0, dim1 = (d + n if d < 0 else d for d in (dim0, dim1))
    if not (0 <= dim0 < n and 0 <= dim1 < n):
        raise ValueError("dim0 and dim1 must be within the range of the number of dimensions.")
    if dim0 == dim1:
        return td
    batch = list(td.batch_size)
    batch[dim0], batch[dim1] = batch[dim1], batch[dim0]
    order = list(range(n))
    order[dim0], order[dim1] = order[dim1], order[dim0]
    return _with_batch(td, lambda t: t.transpose(dim0, dim1), batch, names=_named(td, order))


def _in_place(td: TD, result: TD, inplace: bool) -> TD:
    """``result``, or (``inplace``) ``td`` given ``result``'s entries and batch size."""
    if not inplace or result is td:
        return result
    if td._is_locked:
        raise RuntimeError(LOCK_ERROR)
    td._tensordict, td._batch_size = result._tensordict, result._batch_size
    td._names = result._names
    return td


def flatten(
    td: TD, start_dim: int | None = 0, end_dim: int | None = -1, *, inplace: bool = False
) -> TD:
    """Batch dims ``start_dim`` to ``end_dim`` (both included) flattened into one; a TensorDict
    without batch dims gets one of size 1, as ``torch.flatten`` of a 0-dim tensor.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2, 3, 4)}, [2, 3])
    >>> td.flatten(0, 1).batch_size, td.flatten(0, 1)["a"].shape
    (torch.Size([6]), torch.Size([6, 4]))
    """
    start_dim = 0 if start_dim is None else start_dim
    end_dim = -1 if end_dim is None else end_dim
    if td.batch_dims == 0:
        if start_dim not in (0, -1) or end_dim not in (0, -1):
            raise IndexError(f"Incompatible dims for tensordict with shape {td.batch_size}.")
        return _in_place(td, unsqueeze(td, 0), inplace)
    start, end = dim_of(td, start_dim), dim_of(td, end_dim)
    if end < start:
        raise ValueError(
            f"The end dimension must be strictly greater than the start dim, got "
            f"end_dim={end_dim} and start_dim={start_dim}."
        )
    if start == end:
        return td
    batch = _probe(td).flatten(start, end).shape
    order = [*range(start), None, *range(end + 1, td.batch_dims)]  # the merged dim unnamed
    out = _with_batch(td, lambda t: t.flatten(start, end), batch, names=_named(td, order))
    return _in_place(td, out, inplace)


def unflatten(td: TD, dim: int, unflattened_size: Sequence[int], *, inplace: bool = False) -> TD:
    """Batch dim ``dim`` split into the dims ``unflattened_size`` (one of them may be -1).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(6, 2)}, [6])
    >>> td.unflatten(0, (2, 3)).batch_size
    torch.Size([2, 3])
    """
    dim = dim_of(td, dim)
    sizes = [operator.index(s) for s in unflattened_size]
    batch = _probe(td).unflatten(dim, sizes).shape
    # (the last new dim keeps the split dim's name, as tensordict's)
    order = [*range(dim), *[None] * (len(sizes) - 1), *range(dim, td.batch_dims)]
    out = _with_batch(td, lambda t: t.unflatten(dim, sizes), batch, names=_named(td, order))
    return _in_place(td, out, inplace)


def _narrow(td: TD, dim: int, start: int, length: int) -> TD:
    """Rows ``start:start+length`` of batch dim ``dim``, by basic indexing (keeps map views)."""
    index = (slice(None),) * dim + (slice(start, start + length),)
    batch = list(td.batch_size)
    batch[dim] = length
    rows = slice(start, start + length) if dim == 0 else _dirty.ALL
    return _with_batch(td, lambda t: t[index], batch, rows=rows)


def split(td: TD, split_size: int | Sequence[int], dim: int = 0) -> tuple[TD, ...]:
    """Pieces along batch dim ``dim``, as ``torch.split``: of ``split_size`` rows each (the last
    may be shorter), or of the sizes of a list that must add up to the dim.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> [t["a"].shape for t in td.split([1, 1])]
    [torch.Size([1, 3]), torch.Size([1, 3])]
    """
    dim = dim_of(td, dim)
    total = td.batch_size[dim]
    if isinstance(split_size, int):
        if split_size < 0 or (split_size == 0 and total != 0):
            raise ValueError(f"TensorDict.split: split_size must be positive, got {split_size}.")
        if total == 0:
            sizes = [0]
        else:
            full, rest = divmod(total, min(split_size, total))
            sizes = [min(split_size, total)] * full + ([rest] if rest else [])
    elif isinstance(split_size, Iterable):
        try:
            sizes = [operator.index(s) for s in split_size]
        except TypeError:
            raise TypeError("split(): argument 'split_size' must be int or list of ints") from None
        if sum(sizes) != total or any(s < 0 for s in sizes):
            raise RuntimeError(
                f"Split method expects split_size to sum exactly to {total} (the size of dim "
                f"{dim}), but got sum({sizes}) = {sum(sizes)}"
                if sizes
                else "Insufficient number of elements in split_size."
            )
    else:
        raise TypeError("split(): argument 'split_size' must be int or list of ints")
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return tuple(_narrow(td, dim, s, n) for s, n in zip(starts, sizes, strict=True))


def chunk(td: TD, chunks: int, dim: int = 0) -> tuple[TD, ...]:
    """``chunks`` pieces (or fewer) along batch dim ``dim``, as ``torch.chunk``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> [t.batch_size for t in td.chunk(2)]
    [torch.Size([1]), torch.Size([1])]
    """
    chunks = operator.index(chunks)
    if chunks < 1:
        raise ValueError(f"chunks must be a strictly positive integer, got {chunks}.")
    dim = dim_of(td, dim)
    total = td.batch_size[dim]
    if total == 0:
        return split(td, [0] * chunks, dim)
    return split(td, -(total // -chunks), dim)


def unbind(td: TD, dim: int = 0) -> tuple[TD, ...]:
    """The TensorDicts along batch dim ``dim`` (views, unlocked, as tensordict's).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> [t["a"] for t in td.unbind(0)]
    [tensor([0., 1., 2.]), tensor([3., 4., 5.])]
    """
    dim = dim_of(td, dim)
    before = (slice(None),) * dim
    return tuple(td[(*before, i)] for i in range(td.batch_size[dim]))


def densify(td: TD, layout: torch.layout = torch.strided) -> TD:
    """Returns the TensorDict as it is: tensordict's ``densify`` replaces lazy stacks by
    dense TensorDicts, and this library's stacks are always dense.

    >>> import torch; from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2)}, [2])
    >>> td.densify() is td
    True
    """
    if layout not in (torch.strided, torch.jagged):
        raise ValueError(f"densify: layout must be torch.strided or torch.jagged, got {layout}")
    return td


def iterate(td: TD) -> Iterator[TD]:
    """The rows of the first batch dim (a TensorDict with no batch dims cannot be iterated)."""
    if not td.batch_size:
        raise TypeError(
            "iteration over a 0-d tensordict. Use keys(), values() or items() to iterate over "
            "its entries."
        )
    return iter(unbind(td, 0))


def pad(
    td: TD, pad_size: Sequence[int], value: float = 0.0, inplace: bool = False, safe: bool = True
) -> TD:
    """The TensorDict padded along its batch dims with ``value``: ``pad_size`` is
    ``[before_0, after_0, before_1, after_1, ...]`` in batch-dim order, up to two per batch
    dim; a negative pad crops. A non-tensor entry becomes a ``NonTensorStack`` padded with
    ``None``, as in tensordict. With ``inplace`` the TensorDict takes the padded leaves (its
    stacks padded in place) and is returned. Every leaf is padded before any is replaced, so a
    failure leaves the TensorDict as it was (``safe`` is accepted for tensordict's signature:
    this is always so).

    >>> import torch; from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(3, 4)}, batch_size=[3, 4])
    >>> td.pad([0, 0, 0, 1]).batch_size
    torch.Size([3, 5])
    >>> td.pad([0, 0, 0, 1], inplace=True) is td, td.batch_size
    (True, torch.Size([3, 5]))
    """
    del safe
    if len(pad_size) > 2 * td.batch_dims:
        raise RuntimeError("The length of pad_size must be <= 2 * the number of batch dimensions")
    if len(pad_size) % 2:
        raise RuntimeError("pad_size must have an even number of dimensions")
    batch = list(td.batch_size)
    for i, size in enumerate(pad_size):
        batch[i // 2] += size
    for d, size in enumerate(batch):
        if size < 0:
            raise RuntimeError(
                f"Pad {tuple(pad_size[2 * d : 2 * d + 2])} on batch dim {d} (size "
                f"{td.batch_size[d]}) would produce a negative output size."
            )

    def pads_of(ndim: int) -> list[int]:
        pads: list[int] = []
        for d in reversed(range(ndim)):
            pads += [pad_size[2 * d], pad_size[2 * d + 1]] if 2 * d < len(pad_size) else [0, 0]
        return pads

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, pads_of(t.dim()), value=value)

    def non_tensor(entry: Any, *_: Any) -> Any:
        # the element ids padded with -1 (torch's pad: negative pads crop, and a negative
        # size raises as for a tensor), then the values at them, None at -1
        shape = tuple(entry.batch_size)
        if type(entry) in NTD_TYPES:
            values = [entry.data] * math.prod(shape)
        else:
            values = list(entry._cells.get(entry._pos.ravel()))
        ids = torch.arange(len(values)).view(shape)
        padded = torch.nn.functional.pad(ids, pads_of(len(shape)), value=-1)
        flat = [values[i] if i >= 0 else None for i in padded.ravel().tolist()]
        return NonTensorStack.from_values(flat, padded.shape, entry.device)

    result = map_leaves(td, leaf, batch_size=batch, non_tensor=non_tensor)
    if not inplace:
        return result
    if td.is_locked:
        raise RuntimeError(LOCK_ERROR)
    _keep_stacks(td, result)
    td._tensordict = result._tensordict
    td._batch_size = result._batch_size
    return td


def _keep_stacks(old: TD, new: TD) -> None:
    """The padded stacks and nested trees of ``new`` put into ``old``'s objects
    (``pad(inplace=True)`` keeps their identity, as tensordict's does), at every depth."""
    for key, value in new._tensordict.items():
        before = old._tensordict.get(key)
        if type(value) is NonTensorStack and type(before) is NonTensorStack:
            before._cells, before._pos = value._cells, value._pos
            new._tensordict[key] = before
        elif isinstance(value, TreeNode) and isinstance(before, type(value)):
            _keep_stacks(before, value)
            before._tensordict, before._batch_size = value._tensordict, value._batch_size
            before._names = value._names
            new._tensordict[key] = before
