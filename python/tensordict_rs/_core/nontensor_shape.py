"""``StackShapes``, the shape operations of a ``NonTensorStack`` (a mixin): each is the torch
operation applied to the stack's positions (``reshape``, ``permute``, ``expand``, ``flip``,
``split``, ...); a view of the positions shares the cells, anything else copies them.

A stack made by stacking entries of more than 0 dims (``torch.stack`` of TensorDicts holding
one value each) remembers which of its dims are its members' own (``_data_dims``): an index
that selects exactly one member along the stacking dims gives that member, a
``NonTensorData`` of the remaining dims, as tensordict's stacked members are. Indexing,
``unbind``, ``split``, ``chunk``, ``permute``, ``transpose``, ``squeeze`` and copies keep that
record, ``unsqueeze`` and ``expand`` add stacking dims (as tensordict's do); other shape
operations drop it (every element then counts as a member).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .index import permutation

if TYPE_CHECKING:
    from .nodes import NonTensorData
    from .nontensor import NonTensorStack


class StackShapes:
    """The shape operations of ``NonTensorStack`` (its base): views of its positions
    (``_view``), or copies of the cells they hold (``_gathered``)."""

    __slots__ = ()

    if TYPE_CHECKING:
        _pos: np.ndarray
        _data_dims: tuple[bool, ...] | None

        def _view(
            self, pos: np.ndarray, data_dims: tuple[bool, ...] | None = None
        ) -> NonTensorStack: ...
        def _gathered(
            self, pos: np.ndarray, data_dims: tuple[bool, ...] | None = None
        ) -> NonTensorStack: ...
        def _row(self, cell: int) -> NonTensorData: ...
        def _select(
            self, pos: np.ndarray, data_dims: tuple[bool, ...] | None, view: bool
        ) -> Any: ...

    def reshape(self, *shape: Any) -> NonTensorStack:
        """The stack with another batch shape (row-major), as ``Tensor.reshape``."""
        pos = _torch_op(self._pos, lambda t: t.reshape(*shape))
        return self._view(pos, self._data_dims if pos.shape == self._pos.shape else None)

    def view(self, *shape: Any) -> NonTensorStack:
        """As ``reshape``."""
        return self.reshape(*shape)

    def unsqueeze(self, dim: int) -> NonTensorStack:
        """A dim of size one at ``dim`` (a stacking dim: a stack of this one stack)."""
        pos = _torch_op(self._pos, lambda t: t.unsqueeze(dim))
        flags = self._data_dims
        return self._view(pos, None if flags is None else _unsqueezed(flags, dim))

    def squeeze(self, dim: int | None = None) -> NonTensorStack:
        """Dims of size one removed (all, or ``dim``)."""
        pos = _torch_op(self._pos, lambda t: t.squeeze() if dim is None else t.squeeze(dim))
        flags = self._data_dims
        if flags is not None:
            flags = _squeezed(flags, self._pos.shape, dim)
        return self._view(pos, flags)

    def permute(self, *dims: Any) -> NonTensorStack:
        """The batch dims in another order; an invalid permutation is a ``ValueError``."""
        given = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], Sequence) else dims
        order = permutation([int(d) for d in given], torch.Size(self._pos.shape))
        flags = self._data_dims
        return self._view(
            _torch_op(self._pos, lambda t: t.permute(*order)),
            None if flags is None else tuple(flags[d] for d in order),
        )

    def transpose(self, dim0: int, dim1: int) -> NonTensorStack:
        """Two batch dims swapped."""
        pos = _torch_op(self._pos, lambda t: t.transpose(dim0, dim1))
        flags = self._data_dims
        if flags is not None:
            swapped = list(flags)
            a, b = dim0 % len(flags), dim1 % len(flags)
            swapped[a], swapped[b] = flags[b], flags[a]
            flags = tuple(swapped)
        return self._view(pos, flags)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> NonTensorStack:
        """Batch dims ``start_dim..end_dim`` made one."""
        return self._view(_torch_op(self._pos, lambda t: t.flatten(start_dim, end_dim)))

    def unflatten(self, dim: int, sizes: Sequence[int]) -> NonTensorStack:
        """Batch dim ``dim`` split into ``sizes``."""
        return self._view(_torch_op(self._pos, lambda t: t.unflatten(dim, sizes)))

    def expand(self, *shape: Any) -> NonTensorStack:
        """The stack repeated over new leading dims (the values are not copied, the cells are:
        a write into one element leaves the others, as in tensordict)."""
        pos = _torch_op(self._pos, lambda t: t.expand(*shape))
        flags = self._data_dims
        if flags is not None:
            flags = (False,) * (pos.ndim - len(flags)) + flags
        return self._gathered(pos, flags)

    def apply_positions(self, fn: Any) -> Any:
        """The stack whose elements are ``fn(positions)`` (``fn`` applied to an int64 tensor of
        the batch shape holding each element's position): how index and shape operations act
        on a stack. A view of the positions (basic indexing, reshape, permute...) shares the
        values, so writes reach this stack; anything else (advanced indexing, expand, flip...)
        copies them, as tensordict does. A 0-dim result is a ``NonTensorData``, and so is a
        result that is one member of a stack of entries (see the module docstring)."""
        source = torch.from_numpy(_writable_positions(self._pos))
        flags = self._data_dims
        if flags is None:
            out = fn(source)
        else:  # the index (or permutation) ``fn`` is: the members it keeps follow from it
            probe = source.as_subclass(_IndexProbe)
            out = fn(probe)
            seen = probe.__dict__.get("seen")
            flags = _moved_data_dims(flags, seen[0], seen[1]) if seen and seen[2] is out else None
        if out.ndim == 0:
            return self._row(int(out))
        shares = (
            out.untyped_storage().data_ptr() == source.untyped_storage().data_ptr()
            and out.numel() > 0
            and all(
                stride or size == 1 for size, stride in zip(out.shape, out.stride(), strict=True)
            )
        )
        return self._select(out.numpy(), flags, shares)

    def take_rows(self, rows: torch.Tensor) -> NonTensorStack:
        """The rows ``rows`` (int64, negative from the end) of the first dim, copied (as an
        advanced index copies); IndexError, as torch words it, for a row out of range."""
        index = rows.detach().cpu().numpy()
        size = self._pos.shape[0]
        if index.size:
            low, high = int(index.min()), int(index.max())
            if low < -size or high >= size:
                bad = high if high >= size else low
                raise IndexError(f"index {bad} is out of bounds for dimension 0 with size {size}")
        return self._gathered(self._pos[index], self._data_dims)

    def repeat(self, *sizes: Any) -> NonTensorStack:
        """The stack repeated along each dim, as ``Tensor.repeat``."""
        return self.apply_positions(lambda t: t.repeat(*sizes))

    def repeat_interleave(self, repeats: Any, dim: int | None = None) -> NonTensorStack:
        """Each element repeated along ``dim``, as ``Tensor.repeat_interleave``."""
        return self.apply_positions(lambda t: t.repeat_interleave(repeats, dim=dim))

    def flip(self, dims: Any) -> NonTensorStack:
        """The elements in reverse order along ``dims``."""
        return self.apply_positions(lambda t: t.flip(dims))

    def unbind(self, dim: int = 0) -> tuple[Any, ...]:
        """The elements along ``dim`` (the members, for the stacking dim of a stack of
        entries)."""
        moved = np.moveaxis(self._pos, dim, 0)
        flags = self._data_dims
        if flags is not None:
            flags = flags[: dim % len(flags)] + flags[dim % len(flags) + 1 :]
        return tuple(self._result(moved[i], flags) for i in range(moved.shape[0]))

    def _result(self, pos: np.ndarray, data_dims: tuple[bool, ...] | None = None) -> Any:
        if pos.ndim == 0:
            return self._row(int(pos))
        return self._select(pos, data_dims, True)

    def split(self, split_size: Any, dim: int = 0) -> tuple[NonTensorStack, ...]:
        """Pieces along ``dim``, as ``Tensor.split``."""
        parts = torch.from_numpy(self._pos).split(split_size, dim)
        return tuple(self._view(p.numpy(), self._data_dims) for p in parts)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[NonTensorStack, ...]:
        """Pieces along ``dim``, as ``Tensor.chunk``."""
        parts = torch.from_numpy(self._pos).chunk(chunks, dim)
        return tuple(self._view(p.numpy(), self._data_dims) for p in parts)


def _writable_positions(pos: np.ndarray) -> np.ndarray:
    """``pos`` as torch.from_numpy takes it without a warning (a writable array)."""
    return pos if pos.flags.writeable else pos.copy()


def _torch_op(pos: np.ndarray, fn: Any) -> np.ndarray:
    """``fn`` applied to the positions as a torch tensor (torch's argument rules and errors)."""
    out = fn(torch.from_numpy(_writable_positions(pos)))
    return np.asarray(out.numpy())


class _IndexProbe(torch.Tensor):
    """The positions as ``apply_positions`` hands them to a function when the stack keeps
    its members: it records the index, permutation or transposition the function does
    (``seen``: its kind, its arguments and its result), torch's operation otherwise unchanged
    (results are plain tensors)."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    def __getitem__(self, index: Any) -> Any:
        out = torch.Tensor.__getitem__(self, index)
        self.__dict__["seen"] = ("index", index, out)
        return out

    def permute(self, *dims: Any) -> Any:  # type: ignore[override]
        out = torch.Tensor.permute(self, *dims)
        given = dims[0] if len(dims) == 1 and isinstance(dims[0], Sequence) else dims
        self.__dict__["seen"] = ("permute", [int(d) % self.ndim for d in given], out)
        return out

    def transpose(self, dim0: Any, dim1: Any) -> Any:  # type: ignore[override]
        out = torch.Tensor.transpose(self, dim0, dim1)
        order = list(range(self.ndim))
        a, b = int(dim0) % self.ndim, int(dim1) % self.ndim
        order[a], order[b] = b, a
        self.__dict__["seen"] = ("permute", order, out)
        return out

    def unsqueeze(self, dim: Any) -> Any:  # type: ignore[override]
        out = torch.Tensor.unsqueeze(self, dim)
        self.__dict__["seen"] = ("unsqueeze", int(dim), out)
        return out

    def squeeze(self, *dim: Any) -> Any:  # type: ignore[override]
        out = torch.Tensor.squeeze(self, *dim)
        self.__dict__["seen"] = ("squeeze", (tuple(self.shape), dim[0] if dim else None), out)
        return out

    def expand(self, *sizes: Any) -> Any:  # type: ignore[override]
        out = torch.Tensor.expand(self, *sizes)
        self.__dict__["seen"] = ("expand", out.ndim - self.ndim, out)
        return out


def _moved_data_dims(data_dims: tuple[bool, ...], kind: str, args: Any) -> Any:
    """The members' dims after the operation an ``_IndexProbe`` saw."""
    if kind == "index":
        return index_data_dims(data_dims, args)
    if kind == "unsqueeze":
        return _unsqueezed(data_dims, args)
    if kind == "squeeze":
        return _squeezed(data_dims, *args)
    if kind == "expand":
        return (False,) * args + data_dims
    return tuple(data_dims[d] for d in args)


def _unsqueezed(data_dims: tuple[bool, ...], dim: int) -> tuple[bool, ...]:
    """The members' dims after a new dim at ``dim``: a stacking dim, as in tensordict."""
    flags = list(data_dims)
    flags.insert(dim % (len(flags) + 1), False)
    return tuple(flags)


def _squeezed(data_dims: tuple[bool, ...], shape: Sequence[int], dim: Any) -> tuple[bool, ...]:
    """The members' dims after ``squeeze(dim)`` of a stack of ``shape``."""
    n = len(shape)
    if dim is None:
        gone = {d for d in range(n) if shape[d] == 1}
    else:
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        gone = {int(d) % n for d in dims if shape[int(d) % n] == 1} if n else set()
    return tuple(flag for d, flag in enumerate(data_dims) if d not in gone)


def stacked_data_dims(
    members: Sequence[tuple[bool, ...] | None], ndims: int, dim: int
) -> tuple[bool, ...] | None:
    """The dims of a stack of ``members`` (their ``_data_dims``: which of their ``ndims``
    dims are a member's own, ``None`` for none) along ``dim`` that are its members' own: those
    that are so in every member (the stacking dim never is). ``None`` when there are none."""
    flags = [True] * ndims
    for member in members:
        if member is None:
            return None
        flags = [a and b for a, b in zip(flags, member, strict=True)]
    flags.insert(dim, False)
    return tuple(flags) if any(flags) else None


def index_data_dims(data_dims: tuple[bool, ...], index: Any) -> tuple[bool, ...] | None:
    """Which dims of a stack indexed by ``index`` are its members' own, given those of the
    stack (``data_dims``): an int drops its dim, a slice (or one 1-d index tensor) keeps it,
    ``None`` adds a member's dim. ``None`` when there are none left, or for an index that this
    rule does not follow (several index tensors, a multi-dim one, a 0-dim mask)."""
    parts = index if isinstance(index, tuple) else (index,)
    kinds: list[str] = []
    advanced = consumed = 0
    for part in parts:
        if part is None:
            kinds.append("new")
            continue
        if part is Ellipsis:
            kinds.append("...")
            continue
        if isinstance(part, (bool, np.bool_)):
            return None
        if isinstance(part, slice):
            kinds.append("keep")
        elif isinstance(part, (torch.Tensor, np.ndarray, list, range)):
            ndim = np.ndim(part) if not isinstance(part, torch.Tensor) else part.ndim
            is_mask = (
                part.dtype == torch.bool
                if isinstance(part, torch.Tensor)
                else np.asarray(part).dtype == np.bool_
            )
            if ndim == 0 and not is_mask:
                kinds.append("drop")
            elif ndim == 1:
                kinds.append("keep")
                advanced += 1
            else:
                return None
        elif hasattr(part, "__index__"):
            kinds.append("drop")
        else:
            return None
        consumed += 1
    fill = len(data_dims) - consumed
    if advanced > 1 or kinds.count("...") > 1 or fill < 0:
        return None
    out: list[bool] = []
    at = 0
    for kind in kinds:
        if kind == "new":
            out.append(True)
        elif kind == "...":
            out.extend(data_dims[at : at + fill])
            at += fill
        elif kind == "keep":
            out.append(data_dims[at])
            at += 1
        else:
            at += 1
    out.extend(data_dims[at:])
    return tuple(out) if any(out) else None
