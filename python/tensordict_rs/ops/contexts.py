"""Shape operations used as a context, as tensordict's: ``with td.view(-1) as v:`` then, on
exit, ``v``'s entries (new ones too) written back into ``td`` through the inverse operation
(``update``, or ``update_`` when ``td`` is locked; nothing when the block raised).

Each method here is the operation of ``ops/shape``, ``ops/rearrange`` or ``ops/keys`` with its
inverse recorded on the result (``_core/locking.WriteBack``), which ``__exit__`` runs. The
record holds the source weakly and the call's arguments, never the result, so that a result
not used as a context costs one small object and makes no reference cycle.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch

from .._core.locking import WriteBack
from .._core.nodes import TreeNode
from . import keys as _keys
from . import rearrange as _rearrange
from . import shape as _shape

F = TypeVar("F", bound=Callable[..., Any])
Inverse = Callable[..., Any]  # (result, source batch size, *args, **kwargs) -> tree


def as_context(fn: F, inverse: Inverse) -> F:
    """``fn`` with the write-back of ``with`` recorded on its result."""

    @functools.wraps(fn)
    def method(td: TreeNode, *args: Any, **kwargs: Any) -> Any:
        result = fn(td, *args, **kwargs)
        if result is td or not isinstance(result, TreeNode):
            return result  # in place, or a tree it did not make: nothing to write back
        shape = td.batch_size
        return WriteBack.record(result, td, lambda r: inverse(r, shape, *args, **kwargs))

    return cast(F, method)


def _dims(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> list[int]:
    """The dims of ``permute(*dims)`` / ``permute(dims)`` / ``permute(dims=...)``."""
    dims = args[0] if len(args) == 1 and not isinstance(args[0], int) else args
    return [int(d) for d in kwargs.get(name, dims)]


def _permute_back(r: Any, shape: torch.Size, *args: Any, **kwargs: Any) -> Any:
    dims = [d % len(shape) for d in _dims(args, kwargs, "dims")] if shape else []
    return r.permute([dims.index(i) for i in range(len(dims))])


def _squeeze_back(r: Any, shape: torch.Size, dim: int | None = None) -> Any:
    n = len(shape)
    squeezed = [d for d in range(n) if shape[d] == 1 and (dim is None or d == dim % n)]
    for d in squeezed:  # ascending: each at its place in the source
        r = r.unsqueeze(d)
    return r


def _flatten_back(
    r: Any, shape: torch.Size, start_dim: int | None = 0, end_dim: int | None = -1, **_: Any
) -> Any:
    if not shape:
        return r.squeeze(0)
    start = (0 if start_dim is None else start_dim) % len(shape)
    end = (-1 if end_dim is None else end_dim) % len(shape)
    return r if start == end else r.unflatten(start, shape[start : end + 1])


def _unflatten_back(r: Any, shape: torch.Size, dim: int, unflattened_size: Any, **_: Any) -> Any:
    start = dim % len(shape)
    return r.flatten(start, start + len(unflattened_size) - 1)


def _roll_back(r: Any, shape: torch.Size, shifts: Any, dims: Any = None) -> Any:
    back = -shifts if isinstance(shifts, int) else tuple(-s for s in shifts)
    return r.roll(back, dims)


def _atleast_back(r: Any, shape: torch.Size) -> Any:
    for _ in range(r.batch_dims - len(shape)):  # the leading dims it added
        r = r.squeeze(0)
    return r


def _separator(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return str(args[0] if args else kwargs.get("separator", "."))


view = as_context(_shape.view, lambda r, shape, *a, **k: r.view(shape))
squeeze = as_context(_shape.squeeze, _squeeze_back)
unsqueeze = as_context(_shape.unsqueeze, lambda r, shape, dim: r.squeeze(dim))
permute = as_context(_shape.permute, _permute_back)
transpose = as_context(_shape.transpose, lambda r, shape, d0, d1: r.transpose(d0, d1))
flatten = as_context(_shape.flatten, _flatten_back)
unflatten = as_context(_shape.unflatten, _unflatten_back)
movedim = as_context(_rearrange.movedim, lambda r, shape, src, dst: r.movedim(dst, src))
flip = as_context(_rearrange.flip, lambda r, shape, dims: r.flip(dims))
fliplr = as_context(_rearrange.fliplr, lambda r, shape: r.fliplr())
flipud = as_context(_rearrange.flipud, lambda r, shape: r.flipud())
roll = as_context(_rearrange.roll, _roll_back)
rot90 = as_context(_rearrange.rot90, lambda r, shape, k=1, dims=(0, 1): r.rot90(-k, dims))
atleast_1d = as_context(_rearrange.atleast_1d, _atleast_back)
atleast_2d = as_context(_rearrange.atleast_2d, _atleast_back)
atleast_3d = as_context(_rearrange.atleast_3d, _atleast_back)
flatten_keys = as_context(
    _keys.flatten_keys, lambda r, shape, *a, **k: r.unflatten_keys(_separator(a, k))
)
unflatten_keys = as_context(
    _keys.unflatten_keys, lambda r, shape, *a, **k: r.flatten_keys(_separator(a, k))
)


class ShapeContexts(TreeNode):
    """The shape operations above as methods (a mixin of TensorDict, first among its bases so
    that these forms, which also work as a context, are the ones its instances get)."""

    view = view
    squeeze = squeeze
    unsqueeze = unsqueeze
    permute = permute
    transpose = swapaxes = swapdims = transpose
    flatten = flatten
    unflatten = unflatten
    movedim = moveaxis = movedim
    flip = flip
    fliplr = fliplr
    flipud = flipud
    roll = roll
    rot90 = rot90
    atleast_1d = atleast_1d
    atleast_2d = atleast_2d
    atleast_3d = atleast_3d
    flatten_keys = flatten_keys
    unflatten_keys = unflatten_keys
