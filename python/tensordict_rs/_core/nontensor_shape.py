"""``StackShapes``, the shape operations of a ``NonTensorStack`` (a mixin): each is the torch
operation applied to the stack's positions (``reshape``, ``permute``, ``expand``, ``flip``,
``split``, ...); a view of the positions shares the cells, anything else copies them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from .nodes import NonTensorData
    from .nontensor import NonTensorStack


class StackShapes:
    """The shape operations of ``NonTensorStack`` (its base): views of its positions
    (``_view``), or copies of the cells they hold (``_gathered``)."""

    __slots__ = ()

    if TYPE_CHECKING:
        _pos: np.ndarray

        def _view(self, pos: np.ndarray) -> NonTensorStack: ...
        def _gathered(self, pos: np.ndarray) -> NonTensorStack: ...
        def _row(self, cell: int) -> NonTensorData: ...

    def reshape(self, *shape: Any) -> NonTensorStack:
        """The stack with another batch shape (row-major), as ``Tensor.reshape``."""
        return self._view(_torch_op(self._pos, lambda t: t.reshape(*shape)))

    def view(self, *shape: Any) -> NonTensorStack:
        """As ``reshape``."""
        return self.reshape(*shape)

    def unsqueeze(self, dim: int) -> NonTensorStack:
        """A dim of size one at ``dim``."""
        return self._view(_torch_op(self._pos, lambda t: t.unsqueeze(dim)))

    def squeeze(self, dim: int | None = None) -> NonTensorStack:
        """Dims of size one removed (all, or ``dim``)."""
        return self._view(
            _torch_op(self._pos, lambda t: t.squeeze() if dim is None else t.squeeze(dim))
        )

    def permute(self, *dims: Any) -> NonTensorStack:
        """The batch dims in another order."""
        return self._view(_torch_op(self._pos, lambda t: t.permute(*dims)))

    def transpose(self, dim0: int, dim1: int) -> NonTensorStack:
        """Two batch dims swapped."""
        return self._view(_torch_op(self._pos, lambda t: t.transpose(dim0, dim1)))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> NonTensorStack:
        """Batch dims ``start_dim..end_dim`` made one."""
        return self._view(_torch_op(self._pos, lambda t: t.flatten(start_dim, end_dim)))

    def unflatten(self, dim: int, sizes: Sequence[int]) -> NonTensorStack:
        """Batch dim ``dim`` split into ``sizes``."""
        return self._view(_torch_op(self._pos, lambda t: t.unflatten(dim, sizes)))

    def expand(self, *shape: Any) -> NonTensorStack:
        """The stack repeated over new leading dims (the values are not copied, the cells are:
        a write into one element leaves the others, as in tensordict)."""
        return self._gathered(_torch_op(self._pos, lambda t: t.expand(*shape)))

    def apply_positions(self, fn: Any) -> Any:
        """The stack whose elements are ``fn(positions)`` (``fn`` applied to an int64 tensor of
        the batch shape holding each element's position): how index and shape operations act
        on a stack. A view of the positions (basic indexing, reshape, permute...) shares the
        values, so writes reach this stack; anything else (advanced indexing, expand, flip...)
        copies them, as tensordict does. A 0-dim result is a ``NonTensorData``."""
        source = torch.from_numpy(_writable_positions(self._pos))
        out = fn(source)
        if out.ndim == 0:
            return self._row(int(out))
        shares = (
            out.untyped_storage().data_ptr() == source.untyped_storage().data_ptr()
            and out.numel() > 0
            and all(
                stride or size == 1 for size, stride in zip(out.shape, out.stride(), strict=True)
            )
        )
        pos = out.numpy()
        return self._view(pos) if shares else self._gathered(pos)

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
        return self._gathered(self._pos[index])

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
        """The elements along ``dim``."""
        moved = np.moveaxis(self._pos, dim, 0)
        return tuple(self._result(moved[i]) for i in range(moved.shape[0]))

    def _result(self, pos: np.ndarray) -> Any:
        if pos.ndim == 0:
            return self._row(int(pos))
        return self._view(pos)

    def split(self, split_size: Any, dim: int = 0) -> tuple[NonTensorStack, ...]:
        """Pieces along ``dim``, as ``Tensor.split``."""
        parts = torch.from_numpy(self._pos).split(split_size, dim)
        return tuple(self._view(p.numpy()) for p in parts)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[NonTensorStack, ...]:
        """Pieces along ``dim``, as ``Tensor.chunk``."""
        parts = torch.from_numpy(self._pos).chunk(chunks, dim)
        return tuple(self._view(p.numpy()) for p in parts)


def _writable_positions(pos: np.ndarray) -> np.ndarray:
    """``pos`` as torch.from_numpy takes it without a warning (a writable array)."""
    return pos if pos.flags.writeable else pos.copy()


def _torch_op(pos: np.ndarray, fn: Any) -> np.ndarray:
    """``fn`` applied to the positions as a torch tensor (torch's argument rules and errors)."""
    out = fn(torch.from_numpy(_writable_positions(pos)))
    return np.asarray(out.numpy())
