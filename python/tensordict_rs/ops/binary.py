"""The in-place binary and ternary element-wise methods and the torch binaries added with
issue 23: ``maximum_``, ``minimum_``, ``lerp_``, ``addcmul(_)``, ``addcdiv(_)``, ``rsub``,
``mod``, ``bitwise_and``, ``logical_and``; and ``MorePointwise``, the mixin of TensorDict that
gathers them with ``copy_at_`` (ops/inplace), ``type`` (ops/casts) and ``_fast_apply``.

The operands follow ``pointwise.operand``'s rules (a tree, a mapping, a scalar, or a tensor
broadcast against the batch dims).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._core import dirty as _dirty
from .._core.locking import refuse_read_only
from .._core.nodes import TD, TreeNode
from .._core.walk import map_leaves, zip_leaves
from . import apply as _apply
from .casts import type_
from .inplace import copy_at_
from .pointwise import _documented, against, grown, keyed, operand


def _write_leaves(td: TD, pairs: list[Any], write: Callable[..., Any]) -> TD:
    """Calls ``write(leaf, *operands)`` for each ``(leaf, *operands)`` of ``pairs``, refusing a
    read-only tree first and stamping every row as written (the dirty map a checkpoint reads:
    these writes were missed by checkpoints, found by an attack); returns ``td``."""
    refuse_read_only(td)
    token = _dirty.mark(td)
    for leaf, *values in pairs:
        write(leaf, *(against(v, leaf) for v in values))
    _dirty.confirm(td, _dirty.ALL, token)
    return td


def _in_place_with(fn: Callable[..., Any]) -> Callable[..., Any]:
    """An in-place method writing ``fn(leaf, *operands)`` into every leaf (``out=leaf``)."""

    def method(td: TD, *others: Any) -> TD:
        pairs = list(zip_leaves(td, *[operand(td, o) for o in others]))
        return _write_leaves(td, pairs, lambda leaf, *v: fn(leaf, *v, out=leaf))

    return method


_maximum_ = _in_place_with(torch.maximum)
_minimum_ = _in_place_with(torch.minimum)
_lerp_ = _in_place_with(torch.lerp)


def maximum_(td: TD, other: Any) -> TD:
    """Every leaf replaced by its element-wise maximum with ``other``, in place; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.tensor([0.0, 2.0])}, [2])
    >>> td.maximum_(1.0)["a"]
    tensor([1., 2.])
    """
    if not isinstance(other, (TreeNode, Mapping, torch.Tensor)):
        other = torch.tensor(other)
    return _maximum_(td, other)


def minimum_(td: TD, other: Any) -> TD:
    """Every leaf replaced by its element-wise minimum with ``other``, in place; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.tensor([0.0, 2.0])}, [2])
    >>> td.minimum_(1.0)["a"]
    tensor([0., 1.])
    """
    if not isinstance(other, (TreeNode, Mapping, torch.Tensor)):
        other = torch.tensor(other)
    return _minimum_(td, other)


def lerp_(td: TD, end: Any, weight: Any) -> TD:
    """``td += weight * (end - td)`` per leaf, in place; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2)}, [2])
    >>> td.lerp_(td + 4, 0.25)["a"]
    tensor([1., 1.])
    """
    return _lerp_(td, end, weight)


def addcmul(td: TD, other1: Any, other2: Any, *, value: float = 1) -> TD:
    """``td + value * other1 * other2`` per leaf (a new TensorDict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.ones(2)}, [2])
    >>> td.addcmul(td * 2, td * 3, value=0.5)["a"]
    tensor([4., 4.])
    """
    td = grown(td, other1, other2)
    return map_leaves(
        td,
        lambda t, a, b: torch.addcmul(t, against(a, t), against(b, t), value=value),
        operand(td, other1),
        operand(td, other2),
        lock=True,
    )


def addcdiv(td: TD, other1: Any, other2: Any, value: float = 1) -> TD:
    """``td + value * other1 / other2`` per leaf (a new TensorDict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.ones(2)}, [2])
    >>> td.addcdiv(td * 3, td * 2, value=2)["a"]
    tensor([4., 4.])
    """
    td = grown(td, other1, other2)
    return map_leaves(
        td,
        lambda t, a, b: torch.addcdiv(t, against(a, t), against(b, t), value=value),
        operand(td, other1),
        operand(td, other2),
        lock=True,
    )


def addcmul_(td: TD, other1: Any, other2: Any, *, value: float = 1) -> TD:
    """``td += value * other1 * other2`` per leaf, in place; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.ones(2)}, [2])
    >>> td.addcmul_(td * 2, td * 3, value=0.5)["a"]
    tensor([4., 4.])
    """
    pairs = list(zip_leaves(td, operand(td, other1), operand(td, other2)))
    return _write_leaves(td, pairs, lambda leaf, a, b: leaf.addcmul_(a, b, value=value))


def addcdiv_(td: TD, other1: Any, other2: Any, *, value: float = 1) -> TD:
    """``td += value * other1 / other2`` per leaf, in place; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.ones(2)}, [2])
    >>> td.addcdiv_(td * 3, td * 2, value=2)["a"]
    tensor([4., 4.])
    """
    pairs = list(zip_leaves(td, operand(td, other1), operand(td, other2)))
    return _write_leaves(td, pairs, lambda leaf, a, b: leaf.addcdiv_(a, b, value=value))


def rsub(td: TD, other: Any, *, alpha: float | None = None, default: Any = None) -> TD:
    """``other - alpha * td`` per leaf (a new TensorDict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.ones(2)}, [2]).rsub(5.0, alpha=2)["a"]
    tensor([3., 3.])
    """
    kwargs = {} if alpha is None else {"alpha": alpha}
    return keyed(td, other, lambda t, o: torch.rsub(t, o, **kwargs), default)


def _binary_torch(name: str, fn: Callable[..., Any], doc: str) -> Callable[..., TreeNode]:
    def method(td: TreeNode, other: Any, *, default: Any = None) -> TreeNode:
        return keyed(td, other, fn, default)

    return _documented(method, name, doc)


_TWO_INTS = (
    "\n\n    >>> import torch\n    >>> from tensordict_rs import TensorDict\n"
    "    >>> td = TensorDict({'x': torch.tensor([3, 5])}, [2])\n"
)
mod = _binary_torch(
    "mod",
    torch.remainder,
    "The remainder of every leaf divided by ``other`` (``torch.remainder``)."
    + _TWO_INTS
    + "    >>> td.mod(2)['x']\n    tensor([1, 1])\n",
)
bitwise_and = _binary_torch(
    "bitwise_and",
    torch.bitwise_and,
    "The bitwise AND of every leaf and ``other``."
    + _TWO_INTS
    + "    >>> td.bitwise_and(6)['x']\n    tensor([2, 4])\n",
)
logical_and = _binary_torch(
    "logical_and",
    torch.logical_and,
    "The logical AND of every leaf and ``other``: a TensorDict of bools."
    + _TWO_INTS
    + "    >>> td.logical_and(torch.tensor(0))['x']\n    tensor([False, False])\n",
)


class MorePointwise(TreeNode):
    """The element-wise methods of TensorDict not made from ``methods()``'s tables (a mixin):
    in-place binary and ternary forms, ``copy_at_``, ``type``, and ``_fast_apply``."""

    _fast_apply = _apply.fast_apply
    copy_at_ = copy_at_
    lerp_ = lerp_
    maximum_ = maximum_
    minimum_ = minimum_
    addcmul = addcmul
    addcmul_ = addcmul_
    addcdiv = addcdiv
    addcdiv_ = addcdiv_
    rsub = rsub
    mod = mod
    bitwise_and = bitwise_and
    logical_and = logical_and
    type = type_  # last in the body: from here on ``type`` is the method in this scope
