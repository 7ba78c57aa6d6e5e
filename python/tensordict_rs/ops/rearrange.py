"""Batch rearrangements: flip, roll, rot90, narrow, movedim, repeat, repeat_interleave, tile,
broadcast_to, atleast_nd, tensor_split, gather, masked_select.

Like ``shape.py``, each is one function of a leaf (whose leading dims are the batch dims, its
own dims after them) and a batch-size rule, handed to ``map_leaves``; the leaves' own dims are
never touched. The semantics are tensordict 0.15.3's (tested side by side).
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .._core.nodes import TD, TreeNode
from .._core.walk import map_leaves
from .shape import _probe, _with_batch, unsqueeze


def _dim(td: TreeNode, dim: int) -> int:
    ndim = td.batch_dims
    new = dim + ndim if dim < 0 else dim
    if not 0 <= new < ndim:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [-{ndim}, {ndim - 1}], but got "
            f"{new})"
        )
    return new


def flip(td: TD, dims: int | Sequence[int]) -> TD:
    """The batch reversed along batch dims ``dims``, as ``torch.flip``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.arange(3)}, [3]).flip(0)["a"]
    tensor([2, 1, 0])
    """
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    normal = tuple(_dim(td, d) for d in dims)
    return _with_batch(td, lambda t: t.flip(normal), td.batch_size)


def fliplr(td: TD) -> TD:
    """The batch reversed along batch dim 1 (at least 2 batch dims).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.arange(4).view(2, 2)}, [2, 2]).fliplr()["a"]
    tensor([[1, 0],
            [3, 2]])
    """
    if td.batch_dims < 2:
        raise RuntimeError("fliplr requires at least 2 batch dimensions")
    return flip(td, 1)


def flipud(td: TD) -> TD:
    """The batch reversed along batch dim 0.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.arange(3)}, [3]).flipud()["a"]
    tensor([2, 1, 0])
    """
    if td.batch_dims < 1:
        raise RuntimeError("flipud requires at least 1 batch dimension")
    return flip(td, 0)


def roll(
    td: TD,
    shifts: int | Sequence[int],
    dims: int | Sequence[int] | None = None,
    *,
    inplace: bool = False,
) -> TD:
    """The batch rolled along batch dims ``dims`` (default: the flattened batch), as
    ``torch.roll``; ``inplace`` writes the result into the leaves.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.arange(4)}, [4]).roll(1)["a"]
    tensor([3, 0, 1, 2])
    """
    n = td.batch_dims
    if dims is not None and not isinstance(dims, int) and not len(dims):
        dims = None
    if dims is None:
        numel = td.batch_size.numel()

        def leaf(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(numel, *t.shape[n:]).roll(shifts, 0).reshape(t.shape)

    else:
        normal: Any = (
            _batch_dim(td, dims)
            if isinstance(dims, int)
            else tuple(_batch_dim(td, d) for d in dims)
        )

        def leaf(t: torch.Tensor) -> torch.Tensor:
            return t.roll(shifts, normal)

    if inplace:
        return map_leaves(td, lambda t: leaf(t).clone(), inplace=True)
    return _with_batch(td, leaf, td.batch_size)


def _batch_dim(td: TreeNode, dim: int) -> int:
    ndim = td.batch_dims
    new = dim + ndim if dim < 0 else dim
    if not 0 <= new < ndim:
        raise IndexError(f"Incompatible dim {dim} for tensordict with batch dims {ndim}.")
    return new


def rot90(td: TD, k: int = 1, dims: Sequence[int] = (0, 1)) -> TD:
    """The batch rotated by 90 degrees ``k`` times in the plane of batch dims ``dims``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.arange(4).view(2, 2)}, [2, 2]).rot90()["a"]
    tensor([[1, 3],
            [0, 2]])
    """
    if td.batch_dims < 2:
        raise RuntimeError("rot90 requires at least 2 batch dimensions")
    if len(dims) != 2:
        raise RuntimeError("rot90 requires exactly 2 dims")
    ndim = td.batch_dims
    plane = tuple(d if d >= 0 else ndim + d for d in dims)
    k = k % 4
    if k == 0:
        return td
    batch = list(td.batch_size)
    if k in (1, 3):
        batch[plane[0]], batch[plane[1]] = batch[plane[1]], batch[plane[0]]
    return _with_batch(td, lambda t: t.rot90(k, plane), batch)


def narrow(td: TD, dim: int, start: int, length: int) -> TD:
    """Rows ``start:start + length`` of batch dim ``dim`` (views), as ``Tensor.narrow``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.arange(5)}, [5]).narrow(0, 1, 3)["a"]
    tensor([1, 2, 3])
    """
    dim = _dim(td, dim)
    batch = list(td.batch_size)
    batch[dim] = length
    return _with_batch(td, lambda t: t.narrow(dim, start, length), batch)


def movedim(td: TD, source: int | Sequence[int], destination: int | Sequence[int]) -> TD:
    """Batch dims ``source`` moved to positions ``destination``, as ``torch.movedim``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2, 3, 4)}, [2, 3]).movedim(0, 1)["a"].shape
    torch.Size([3, 2, 4])
    """
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(src) != len(dst):
        raise ValueError(
            "movedim: source and destination must have the same number of elements, got "
            f"{len(src)} and {len(dst)}"
        )
    src = tuple(_dim(td, s) for s in src)
    dst = tuple(_dim(td, d) for d in dst)
    batch = _probe(td).movedim(src, dst).shape
    return _with_batch(td, lambda t: t.movedim(src, dst), batch)


def repeat(td: TD, *repeats: Any, inplace: bool = False) -> TD:
    """The batch repeated ``repeats[i]`` times along batch dim ``i`` (one count per batch
    dim), as ``Tensor.repeat``; ``inplace`` rebinds this TensorDict's leaves.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.arange(2)}, [2]).repeat(2)["a"]
    tensor([0, 1, 0, 1])
    """
    if len(repeats) == 1 and not isinstance(repeats[0], int):
        counts = repeats[0]
        if isinstance(counts, torch.Tensor):
            values = counts.tolist()
            counts = (values,) if counts.ndim == 0 else values
        elif not isinstance(counts, (list, tuple)):
            raise ValueError(
                "repeats must be a sequence of integers, a tensor or a torch.Size object. Got "
                f"{type(counts)} instead."
            )
        return repeat(td, *counts, inplace=inplace)
    if len(repeats) != td.batch_dims:
        raise ValueError(
            "The number of repeat elements must match the number of dimensions of the "
            f"tensordict. Got {len(repeats)} but ndim={td.batch_dims}."
        )
    n = td.batch_dims
    batch = [s * r for s, r in zip(td.batch_size, repeats, strict=True)]
    result = _with_batch(td, lambda t: t.repeat(*repeats, *((1,) * (t.ndim - n))), batch)
    return _rebind(td, result) if inplace else result


def _rebind(td: TD, result: Any) -> TD:
    """``td`` given the entries and batch size of ``result`` (the ``inplace=True`` forms)."""
    from .shape import _in_place

    return _in_place(td, result, True)


def repeat_interleave(
    td: TD,
    repeats: torch.Tensor | int,
    dim: int | None = None,
    *,
    output_size: int | None = None,
    inplace: bool = False,
) -> TD:
    """Each element of batch dim ``dim`` repeated ``repeats`` times (an int or a count per
    element), as ``Tensor.repeat_interleave``; ``dim=None`` flattens the batch first.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.arange(2)}, [2]).repeat_interleave(2, dim=0)["a"]
    tensor([0, 0, 1, 1])
    """
    ndim = td.batch_dims
    if ndim == 0:
        if inplace:
            raise RuntimeError(
                "repeat_interleave(inplace=True) is not supported on a scalar tensordict "
                "because the operation changes ndim."
            )
        return repeat_interleave(unsqueeze(td, 0), repeats, dim, output_size=output_size)
    if dim is None:
        if inplace:
            raise RuntimeError(
                "repeat_interleave(inplace=True) requires an explicit dim; the dim=None path "
                "reshapes the tensordict to 1D first, which would change ndim."
            )
        flat = td.reshape(-1) if ndim > 1 else td
        return repeat_interleave(flat, repeats, 0)
    dim = dim + ndim if dim < 0 else dim
    if dim < 0:
        raise ValueError(f"dim {dim} is out of range for tensordict with shape {td.batch_size}.")
    if dim >= ndim:
        warnings.warn(
            "repeat_interleave: a dim past the batch dims repeats the leaves' own dims, which "
            "will raise in TensorDict 0.17.",
            FutureWarning,
            stacklevel=2,
        )
    batch = _probe(td).repeat_interleave(repeats, dim=dim, output_size=output_size).shape[:ndim]
    result = _with_batch(
        td, lambda t: t.repeat_interleave(repeats, dim=dim, output_size=output_size), batch
    )
    return _rebind(td, result) if inplace else result


def tile(td: TD, dims: int | Sequence[int]) -> TD:
    """The batch tiled, as ``torch.tile`` with ``dims`` aligned to the last batch dims (more
    counts than batch dims add leading batch dims).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.arange(2)}, [2]).tile((2,))["a"]
    tensor([0, 1, 0, 1])
    """
    counts = (dims,) if isinstance(dims, int) else tuple(dims)
    ndim = td.batch_dims
    if len(counts) > ndim:
        batch = [1] * (len(counts) - ndim) + list(td.batch_size)
        for i, d in enumerate(counts):
            batch[i] *= d
    else:
        batch = list(td.batch_size)
        offset = ndim - len(counts)
        for i, d in enumerate(counts):
            batch[offset + i] *= d
    reps = (1,) * (ndim - len(counts)) + counts
    return _with_batch(td, lambda t: t.tile(reps + (1,) * (t.ndim - ndim)), batch)


def broadcast_to(td: TD, shape: Sequence[int]) -> TD:
    """The batch broadcast to ``shape``, as ``torch.broadcast_to`` (views).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(1, 3)}, [1]).broadcast_to((4,))["a"].shape
    torch.Size([4, 3])
    """
    return td.expand(*shape)


def atleast_1d(td: TD) -> TD:
    """At least one batch dim (a leading dim of size 1 is added), as ``torch.atleast_1d``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.tensor(1.0)}).atleast_1d().batch_size
    torch.Size([1])
    """
    return _leading(td, 1)


def _leading(td: TD, n: int) -> TD:
    """``td`` with leading batch dims of size 1 added up to ``n`` batch dims (as the
    reference does; unlike ``torch.atleast_3d``, a 2-d batch gets its new dim first)."""
    missing = n - td.batch_dims
    if missing <= 0:
        return td
    batch = [1] * missing + list(td.batch_size)
    return _with_batch(td, lambda t: t.reshape(*([1] * missing), *t.shape), batch)


def atleast_2d(td: TD) -> TD:
    """At least two batch dims: leading dims of size 1 are added ([n] becomes [1, n]).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(3)}, [3]).atleast_2d().batch_size
    torch.Size([1, 3])
    """
    return _leading(td, 2)


def atleast_3d(td: TD) -> TD:
    """At least three batch dims: leading dims of size 1 are added ([m, n] becomes [1, m, n]).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2, 3)}, [2, 3]).atleast_3d().batch_size
    torch.Size([1, 2, 3])
    """
    return _leading(td, 3)


def tensor_split(
    td: TreeNode, indices_or_sections: int | Sequence[int] | torch.Tensor, dim: int = 0
) -> tuple[TreeNode, ...]:
    """Pieces along batch dim ``dim``, as ``torch.tensor_split`` (a number of sections, or the
    indices where to split).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> [t.batch_size[0] for t in TensorDict({"a": torch.arange(5)}, [5]).tensor_split(2)]
    [3, 2]
    """
    dim = _batch_dim(td, dim)
    pieces = _probe(td).tensor_split(indices_or_sections, dim)
    out = []
    start = 0
    for piece in pieces:
        length = piece.shape[dim]
        out.append(narrow(td, dim, start, length))
        start += length
    return tuple(out)


def gather(
    td: TD,
    dim: int,
    index: torch.Tensor,
    out: TD | None = None,
    *,
    inplace: bool = False,
) -> TD:
    """Values gathered along batch dim ``dim`` at ``index`` (whose dims are batch dims), as
    ``torch.gather``: the result's batch size is ``index.shape``; every leaf's own dims come
    along. ``out`` receives the result; ``inplace`` rebinds this TensorDict's leaves.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6).view(2, 3)}, [2, 3])
    >>> td.gather(1, torch.tensor([[2, 0], [1, 1]]))["a"]
    tensor([[2, 0],
            [4, 4]])
    """
    if inplace and out is not None:
        raise ValueError("`out` and `inplace=True` are mutually exclusive in gather.")
    if index.ndim != td.batch_dims and inplace:
        raise NotImplementedError(
            "gather(inplace=True) requires index.ndim == self.batch_dims so the result keeps "
            f"the same number of batch dims; got index.ndim={index.ndim} and "
            f"batch_dims={td.batch_dims}. Use inplace=False instead."
        )
    ndim = td.batch_dims
    corrected = dim + ndim if dim < 0 else dim
    if not 0 <= corrected < ndim:
        raise RuntimeError(f"Cannot gather tensordict with shape {td.batch_size} along dim {dim}.")
    if index.ndim > ndim:
        raise RuntimeError(
            f"index has {index.ndim} dims, more than the {ndim} batch dims of the tensordict."
        )
    batch = torch.Size(index.shape)
    target = list(map(min, index.shape, td.batch_size))

    def leaf(t: torch.Tensor) -> torch.Tensor:
        idx = index.to(t.device) if index.device != t.device else index
        idx = idx.reshape(*idx.shape, *([1] * (t.ndim - idx.ndim)))
        shape = list(t.shape)
        shape[: len(target)] = target
        shape[corrected] = index.shape[corrected]
        return torch.gather(t, corrected, idx.expand(shape))

    result = _with_batch(td, leaf, batch, lock=False)
    if inplace:
        return _rebind(td, result)
    if out is not None:
        out.update_(result) if out.is_locked else out.update(result)
        return out
    return result


def masked_select(td: TD, mask: torch.Tensor, *, inplace: bool = False) -> TD:
    """The elements of the batch where ``mask`` (shaped like leading batch dims) is True: those
    dims become one dim of the count of True, as ``Tensor.masked_select`` / boolean indexing.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(3)}, [3])
    >>> td.masked_select(torch.tensor([True, False, True]))["a"]
    tensor([0, 2])
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"masked_select needs a boolean mask, got {mask.dtype}.")
    count = operator.index(int(mask.sum()))
    batch = [count, *td.batch_size[mask.ndim :]]
    result = _with_batch(td, lambda t: t[mask.to(t.device)], batch, lock=False)
    return _rebind(td, result) if inplace else result


class Rearrange(TreeNode):
    """Rearrangements of the batch dims (a mixin of TensorDict): flips, rolls, repeats,
    ``narrow``, ``movedim``, ``gather``, ``masked_select``, ``size``..."""

    flip = flip
    fliplr = fliplr
    flipud = flipud
    roll = roll
    rot90 = rot90
    narrow = narrow
    movedim = moveaxis = movedim
    repeat = repeat
    repeat_interleave = repeat_interleave
    tile = tile
    broadcast_to = broadcast_to
    atleast_1d = atleast_1d
    atleast_2d = atleast_2d
    atleast_3d = atleast_3d
    tensor_split = tensor_split
    gather = gather
    masked_select = masked_select

    def size(self, dim: int | None = None) -> torch.Size | int:
        """The batch size, or the size of batch dim ``dim``.

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3])
        >>> td.size(), td.size(-1)
        (torch.Size([2, 3]), 3)
        """
        return self._batch_size if dim is None else self._batch_size[dim]

    def ndimension(self) -> int:
        """The number of batch dims (same as ``batch_dims``).

        >>> import torch; from tensordict_rs import TensorDict
        >>> TensorDict({"a": torch.zeros(2, 3)}, [2, 3]).ndimension()
        2
        """
        return len(self._batch_size)
