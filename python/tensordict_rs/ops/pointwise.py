"""Element-wise operations: arithmetic (the operator tables of ``methods()``), clamps, comparisons,
copies and views. Casts are in ``ops/casts``, in-place writes (fills, masks, ``copy_``,
``set_at_``) in ``ops/inplace``, the binary and ternary forms added with issue 23 in
``ops/binary``.

Out-of-place operations map every tensor leaf through ``map_leaves`` and, as in tensordict,
give a locked result for a locked TensorDict (with its exceptions, noted below). In-place
ones (``zero_``, ``add_``, ``+=``, ``masked_fill_``, ``copy_``, ...) write into the existing
leaves, so they work on locked and memory-mapped TensorDicts and reach the files. The other
operand may be a TensorDict (leaves at the same keys), a mapping, a scalar, or a tensor, which
broadcasts with the batch size as torch broadcasts shapes (the result may have more batch
dims), then over each leaf's own dims, the way tensordict does.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Mapping
from typing import Any, overload

import torch

from .._core import dirty as _dirty
from .._core.locking import refuse_read_only
from .._core.nodes import TD, NonTensorData, TreeNode
from .._core.nontensor import NonTensorStack
from .._core.walk import copy_tree, leaves, map_leaves, walk_items, zip_leaves

# ---------------------------------------------------------------------------- operands


def operand(td: TD, other: Any) -> Any:
    """``other`` ready for the walker: a tree, a dict, a scalar, or a batch-broadcast tensor.

    A tensor with dims, and a tree of another batch size, broadcast to ``td``'s batch size
    as torch broadcasts shapes (from the right; ``RuntimeError`` as tensordict's when they
    cannot): ``grown`` first gives ``td`` the batch size they broadcast to together.
    """
    other = _untyped(other)
    if isinstance(other, TreeNode):
        if other.batch_dims and other.batch_size != td.batch_size:
            return other.expand(td.batch_size)
        return other
    if isinstance(other, Mapping):
        return dict(other)
    if isinstance(other, torch.Tensor) and other.ndim:
        if other.shape != td.batch_size:
            other = other.expand(torch.broadcast_shapes(other.shape, td.batch_size))
        return _BatchTensor(other)
    return other


_COMPARISONS = (operator.lt, operator.le, operator.gt, operator.ge)


def _is_tensorclass(other: Any) -> bool:
    return getattr(type(other), "_is_tensorclass", False) and "_tensordict" in vars(other)


def _untyped(other: Any) -> Any:
    """A tensorclass operand as its TensorDict (``td == tc`` pairs their entries), and a
    ``TensorDictParams`` as the TensorDict of its parameters."""
    if _is_tensorclass(other):
        return vars(other)["_tensordict"]
    params = getattr(other, "__dict__", {}).get("_param_td")
    return params if isinstance(params, TreeNode) else other


def grown(td: TD, *others: Any) -> TD:
    """``td`` expanded to the batch size it and ``others`` broadcast to (tensordict's rule for
    the out-of-place operations: ``td * torch.ones(2, *td.batch_size)`` has two more rows)."""
    others = tuple(_untyped(o) for o in others)
    shapes = [
        o.shape if isinstance(o, torch.Tensor) else o.batch_size
        for o in others
        if (isinstance(o, torch.Tensor) and o.ndim) or (isinstance(o, TreeNode) and o.batch_dims)
    ]
    if not shapes:
        return td
    shape = torch.broadcast_shapes(td.batch_size, *shapes)
    return td if shape == td.batch_size else td.expand(shape)


class _BatchTensor:
    """A tensor operand aligned with the batch dims: expanded to the right over each leaf."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def against(self, leaf: torch.Tensor) -> torch.Tensor:
        extra = leaf.ndim - self.tensor.ndim
        tensor = self.tensor
        if tensor.device != leaf.device:
            tensor = tensor.to(leaf.device)
        return tensor.reshape(*tensor.shape, *([1] * extra)) if extra > 0 else tensor


def against(value: Any, leaf: torch.Tensor) -> Any:
    """An operand from ``operand`` as it applies to ``leaf``."""
    return value.against(leaf) if type(value) is _BatchTensor else value


# tensordict locks the result of an operation on a locked TensorDict for most operations, but
# not for comparisons, clamp, masked_fill, | and ^, nor when the operand is a tensor: matched.


def _binary(fn: Callable[[Any, Any], Any], lock: bool = True) -> Callable[..., Any]:
    if lock:  # arithmetic: the trees paired key by key, tensordict's ``default=`` rule

        def method(td: TD, other: Any, *, default: Any = None) -> TD:
            return keyed(td, other, fn, default)

        return method

    def unlocked(td: TD, other: Any) -> TD:  # comparisons, | and ^: as tensordict's __eq__
        if fn in _COMPARISONS and _is_tensorclass(other):
            return NotImplemented  # Python asks the tensorclass
        td = grown(td, other)
        other = operand(td, other)
        return map_leaves(td, lambda t, o: fn(t, against(o, t)), other)

    return unlocked


def keyed(
    td: TD, other: Any, fn: Callable[[Any, Any], Any], default: Any = None, lock: bool = True
) -> TD:
    """``fn(leaf, other_leaf)`` for every leaf, ``other`` paired key by key when it is a tree.

    tensordict's ``default=`` rule of its arithmetic methods (``add``, ``mul``, ``clamp_min``,
    ...): with ``None`` both trees must hold the same leaves (``KeyError`` naming the keys
    each lacks); ``"intersection"`` keeps the leaves both hold; any other value stands in for
    the entry the other side lacks, and the result holds the leaves of both. Non-tensor entries
    are kept as they are (``td``'s first).
    """
    td = grown(td, other)
    other = operand(td, other)
    keep = lock and type(other) is not _BatchTensor
    if not isinstance(other, TreeNode):
        return map_leaves(td, lambda t, o: fn(t, against(o, t)), other, lock=keep)
    ours, theirs = _leaf_paths(td), _leaf_paths(other)
    missing = [k for k in ours if k not in theirs]
    extra = [k for k in theirs if k not in ours]
    if default is None:
        if missing or extra:
            raise KeyError(
                "the two TensorDicts hold different keys: "
                f"{_named(missing)} missing in the other, {_named(extra)} missing in this one "
                "(default='intersection' keeps the keys both hold; a tensor as default stands "
                "in for the missing entries)"
            )
        return map_leaves(td, lambda t, o: fn(t, against(o, t)), other, lock=keep)
    if isinstance(default, str) and default == "intersection":
        common = set(ours) & set(theirs)
        kept = copy_tree(td, keep=lambda path: path in common)
        out = map_leaves(kept, lambda t, o: fn(t, against(o, t)), other)
    else:
        out = map_leaves(td, fn, _filled(td, other, default))
        for path in extra:
            value = other.get(path)
            out.set(path, fn(default, value) if isinstance(value, torch.Tensor) else value)
    if keep and td._is_locked:
        out._lock_tree()
    return out


def _leaf_paths(td: TreeNode) -> dict[tuple[str, ...], None]:
    """The paths of ``td``'s leaves and non-tensor entries, in order (a dict as ordered set)."""
    items = walk_items(td, True, True, False, is_leaf=lambda cls: not issubclass(cls, TreeNode))
    return {(key,) if isinstance(key, str) else key: None for key, _ in items}


def _named(paths: list[tuple[str, ...]]) -> str:
    return "[" + ", ".join(repr(p[0] if len(p) == 1 else p) for p in paths) + "]"


def _filled(td: TreeNode, other: TreeNode | None, default: Any) -> dict[str, Any]:
    """``other`` as a nested dict shaped as ``td``: its entry at each of ``td``'s keys, or
    ``default`` where it has none."""
    out: dict[str, Any] = {}
    for key, value in td._tensordict.items():
        theirs = other._get_str(key) if other is not None and key in other._tensordict else None
        if isinstance(value, TreeNode):
            out[key] = _filled(value, theirs if isinstance(theirs, TreeNode) else None, default)
        else:
            out[key] = default if theirs is None or isinstance(theirs, TreeNode) else theirs
    return out


def _reflected(fn: Callable[[Any, Any], Any]) -> Callable[[TD, Any], TD]:
    def method(td: TD, other: Any) -> TD:
        td = grown(td, other)
        other = operand(td, other)
        keep = type(other) is not _BatchTensor
        return map_leaves(td, lambda t, o: fn(against(o, t), t), other, lock=keep)

    return method


def _inplace(name: str) -> Callable[..., TD]:
    def method(td: TD, other: Any, **kwargs: Any) -> TD:
        refuse_read_only(td)
        token = _dirty.mark(td)
        for leaf, value in list(zip_leaves(td, operand(td, other))):
            getattr(leaf, name)(against(value, leaf), **kwargs)
        _dirty.confirm(td, _dirty.ALL, token)
        return td

    return method


def _unary(name: str) -> Callable[[TD], TD]:
    def method(td: TD) -> TD:
        return map_leaves(td, lambda t: getattr(t, name)(), lock=True)

    return method


def _unary_(name: str) -> Callable[[TD], TD]:
    def method(td: TD) -> TD:
        refuse_read_only(td)
        token = _dirty.mark(td)
        for _, _, leaf in list(leaves(td)):
            getattr(leaf, name)()
        _dirty.confirm(td, _dirty.ALL, token)
        return td

    return method


def _documented(fn: Callable[..., Any], name: str, doc: str) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


# ---------------------------------------------------------------------------- arithmetic


def add(td: TD, other: Any, *, alpha: float | None = None, default: Any = None) -> TD:
    """``td + alpha * other`` per leaf (a new TensorDict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.add(td, alpha=2)["a"][0]
    tensor([0., 3., 6.])
    """
    if alpha is None:
        return keyed(td, other, operator.add, default)
    return keyed(td, other, lambda t, o: torch.add(t, o, alpha=alpha), default)


def sub(td: TD, other: Any, *, alpha: float | None = None, default: Any = None) -> TD:
    """``td - alpha * other`` per leaf (a new TensorDict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.sub(td)["a"].abs().sum().item()
    0.0
    """
    if alpha is None:
        return keyed(td, other, operator.sub, default)
    return keyed(td, other, lambda t, o: torch.sub(t, o, alpha=alpha), default)


def add_(td: TD, other: Any, *, alpha: float | None = None) -> TD:
    """Adds ``alpha * other`` into every leaf, in place; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.add_(1)["b", "c"]
    tensor([2., 2.])
    """
    return (
        _inplace("add_")(td, other) if alpha is None else _inplace("add_")(td, other, alpha=alpha)
    )


def sub_(td: TD, other: Any, *, alpha: float | None = None) -> TD:
    """Subtracts ``alpha * other`` from every leaf, in place; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.sub_(1)["b", "c"]
    tensor([0., 0.])
    """
    return (
        _inplace("sub_")(td, other) if alpha is None else _inplace("sub_")(td, other, alpha=alpha)
    )


BINARY: dict[str, tuple[Callable[[Any, Any], Any], str]] = {  # locked results
    "mul": (operator.mul, "``td * other`` per leaf."),
    "div": (operator.truediv, "``td / other`` per leaf."),
    "pow": (operator.pow, "``td ** other`` per leaf."),
    "maximum": (torch.maximum, "The element-wise maximum of ``td`` and ``other``."),
    "minimum": (torch.minimum, "The element-wise minimum of ``td`` and ``other``."),
    "__add__": (operator.add, "``td + other``."),
    "__sub__": (operator.sub, "``td - other``."),
    "__mul__": (operator.mul, "``td * other``."),
    "__truediv__": (operator.truediv, "``td / other``."),
    "__floordiv__": (operator.floordiv, "``td // other``."),
    "__mod__": (operator.mod, "``td % other``."),
    "__pow__": (operator.pow, "``td ** other``."),
    "__and__": (operator.and_, "``td & other``."),
}
UNLOCKED_BINARY: dict[str, tuple[Callable[[Any, Any], Any], str]] = {
    "__or__": (operator.or_, "``td | other``."),
    "__xor__": (operator.xor, "``td ^ other``."),
    "__lt__": (operator.lt, "``td < other``: a TensorDict of bools."),
    "__le__": (operator.le, "``td <= other``: a TensorDict of bools."),
    "__gt__": (operator.gt, "``td > other``: a TensorDict of bools."),
    "__ge__": (operator.ge, "``td >= other``: a TensorDict of bools."),
}
REFLECTED: dict[str, tuple[Callable[[Any, Any], Any], str]] = {
    "__radd__": (operator.add, "``other + td``."),
    "__rsub__": (operator.sub, "``other - td``."),
    "__rmul__": (operator.mul, "``other * td``."),
    "__rtruediv__": (operator.truediv, "``other / td``."),
    "__rfloordiv__": (operator.floordiv, "``other // td``."),
    "__rmod__": (operator.mod, "``other % td``."),
    "__rpow__": (operator.pow, "``other ** td``."),
    "__rand__": (operator.and_, "``other & td``."),
    "__ror__": (operator.or_, "``other | td``."),
    "__rxor__": (operator.xor, "``other ^ td``."),
}
INPLACE: dict[str, tuple[str, str]] = {
    "mul_": ("mul_", "Multiplies every leaf by ``other``, in place."),
    "div_": ("div_", "Divides every leaf by ``other``, in place."),
    "pow_": ("pow_", "Raises every leaf to ``other``, in place."),
    "__iadd__": ("add_", "``td += other``: in place, so locked and memory-mapped leaves work."),
    "__isub__": ("sub_", "``td -= other``, in place."),
    "__imul__": ("mul_", "``td *= other``, in place."),
    "__itruediv__": ("div_", "``td /= other``, in place."),
    "__ipow__": ("pow_", "``td **= other``, in place."),
    "__iand__": ("bitwise_and_", "``td &= other``, in place."),
    "__ior__": ("bitwise_or_", "``td |= other``, in place."),
    "__ixor__": ("bitwise_xor_", "``td ^= other``, in place."),
}
UNARY: dict[str, tuple[str, str]] = {
    "__neg__": ("neg", "``-td``."),
    "__abs__": ("abs", "``abs(td)``."),
    "__invert__": ("bitwise_not", "``~td``."),
    "neg": ("neg", "The negation of every leaf."),
    "abs": ("abs", "The absolute value of every leaf."),
    "exp": ("exp", "``exp`` of every leaf."),
    "log": ("log", "``log`` of every leaf."),
    "sqrt": ("sqrt", "The square root of every leaf."),
    "sign": ("sign", "The sign of every leaf."),
    "sigmoid": ("sigmoid", "The sigmoid of every leaf."),
    "floor": ("floor", "``floor`` of every leaf."),
    "ceil": ("ceil", "``ceil`` of every leaf."),
    "round": ("round", "``round`` of every leaf."),
}
# the element-wise functions added with issue 23: each has an out-of-place form (a new tree,
# locked like its source) and an in-place form (``name_``: the leaves written, memory maps too)
ELEMENTWISE = (
    "acos", "asin", "atan", "cos", "cosh", "erf", "erfc", "expm1", "frac", "lgamma", "log10",
    "log1p", "log2", "reciprocal", "sin", "sinh", "tan", "tanh", "trunc",
)  # fmt: skip
UNARY.update({name: (name, f"``torch.{name}`` of every leaf.") for name in ELEMENTWISE})
# the predicates: a tree of bools, never locked (as the reference's)
PREDICATES = ("isfinite", "isnan", "isneginf", "isposinf", "isreal")
UNARY_INPLACE = (
    "neg_", "abs_", "exp_", "log_", "sqrt_", "sign_", "sigmoid_", "floor_", "ceil_", "round_",
    *(name + "_" for name in ELEMENTWISE),
)  # fmt: skip


def methods() -> dict[str, Callable[..., Any]]:
    """The operator methods of TensorDict, by name (``__add__``, ``mul_``, ``exp``, ...)."""
    out: dict[str, Callable[..., Any]] = {}
    for name, (fn, doc) in BINARY.items():
        out[name] = _documented(_binary(fn), name, doc + _example(name, "y"))
    for name, (fn, doc) in UNLOCKED_BINARY.items():
        out[name] = _documented(_binary(fn, lock=False), name, doc + _example(name, "y"))
    for name, (fn, doc) in REFLECTED.items():
        out[name] = _documented(_reflected(fn), name, doc + _example(name, "y"))
    for name, (torch_name, doc) in INPLACE.items():
        out[name] = _documented(_inplace(torch_name), name, doc + _example(name, "y", True))
    for name, (torch_name, doc) in UNARY.items():
        out[name] = _documented(_unary(torch_name), name, doc + _example(name, ""))
    for name in UNARY_INPLACE:
        doc = f"``{name[:-1]}`` of every leaf, in place." + _example(name, "", True)
        out[name] = _documented(_unary_(name), name, doc)
    for name in PREDICATES:
        doc = f"``torch.{name}`` of every leaf: a TensorDict of bools." + _example(name, "")
        out[name] = _documented(_predicate(name), name, doc)
    for name, (torch_name, doc) in INPLACE_BINARY.items():
        out[name] = _documented(_inplace(torch_name), name, doc + _example(name, "y", True))
    return out


def _predicate(name: str) -> Callable[[TreeNode], TreeNode]:
    def method(td: TreeNode) -> TreeNode:
        return map_leaves(td, lambda t: getattr(torch, name)(t))

    return method


INPLACE_BINARY: dict[str, tuple[str, str]] = {
    "clamp_min_": ("clamp_min_", "Every leaf clamped from below by ``other``, in place."),
    "clamp_max_": ("clamp_max_", "Every leaf clamped from above by ``other``, in place."),
}


_BITWISE = ("and", "or", "xor", "invert")


_UNIT_DOMAIN = {"acos", "asin", "arccos", "arcsin", "atanh", "arctanh"}


def _example(name: str, arg: str, inplace: bool = False) -> str:
    """A doctest showing that the method does to each leaf what the tensor method does."""
    bitwise = any(f"_{b}_" in name or name.endswith(f"{b}__") for b in _BITWISE)
    if bitwise:
        values = "x, y = torch.tensor([3, 5]), torch.tensor([1, 4])"
        if name == "__invert__":
            values = "x = torch.tensor([True, False])"
    elif name.strip("_") in _UNIT_DOMAIN:
        # defined on [-1, 1] only: values outside would compare NaN with NaN
        values = "x, y = torch.tensor([0.5, -0.25]), torch.tensor([2.0, 3.0])"
    else:
        values = "x, y = torch.tensor([1.0, 6.0]), torch.tensor([2.0, 3.0])"
    if inplace:
        call = f">>> _ = td.{name}({arg})\n    >>> torch.equal(td['x'], x.clone().{name}({arg}))"
    else:
        call = f">>> torch.equal(td.{name}({arg})['x'], x.{name}({arg}))"
    return (
        "\n\n    >>> import torch\n    >>> from tensordict_rs import TensorDict\n"
        f"    >>> {values}\n    >>> td = TensorDict({{'x': x.clone()}}, [2])\n"
        f"    {call}\n    True\n"
    )


def clamp(td: TD, min: Any = None, max: Any = None) -> TD:
    """Every leaf clamped to ``[min, max]`` (scalars, tensors or TensorDicts).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.clamp(1, 4)["a"][0]
    tensor([1., 1., 2.])
    """
    td = grown(td, min, max)
    return map_leaves(
        td,
        lambda t, lo, hi: torch.clamp(t, against(lo, t), against(hi, t)),
        operand(td, min),
        operand(td, max),
    )


def clamp_min(td: TD, other: Any, default: Any = None) -> TD:
    """Every leaf clamped from below.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.clamp_min(2)["a"][0]
    tensor([2., 2., 2.])
    """
    return keyed(td, other, torch.clamp_min, default)


def clamp_max(td: TD, other: Any, *, default: Any = None) -> TD:
    """Every leaf clamped from above.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.clamp_max(1)["a"][1]
    tensor([1., 1., 1.])
    """
    return keyed(td, other, torch.clamp_max, default)


def lerp(td: TD, end: Any, weight: Any) -> TD:
    """``td + weight * (end - td)`` per leaf.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.lerp(td * 3, 0.5)["a"][0]
    tensor([0., 2., 4.])
    """
    td = grown(td, end, weight)
    return map_leaves(
        td,
        lambda t, e, w: torch.lerp(t, against(e, t), against(w, t)),
        operand(td, end),
        operand(td, weight),
        lock=True,
    )


# ---------------------------------------------------------------------------- copies and views


def detach(td: TD) -> TD:
    """Every leaf detached from autograd (views; locked when ``td`` is).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.detach()["a"].requires_grad
    False
    """
    return map_leaves(td, lambda t: t.detach(), lock=True)


def detach_(td: TD) -> TD:
    """Detaches every leaf in place; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(3, requires_grad=True) * 2}, [3])
    >>> td.detach_()["a"].requires_grad
    False
    """
    for _, _, leaf in list(leaves(td)):
        leaf.detach_()
    return td


def contiguous(td: TD, *, canonical: bool = False, inplace: bool = False) -> TD:
    """Every leaf contiguous; a new, unlocked TensorDict (``inplace``: ``td``'s entries replaced).

    Contiguous memory-mapped leaves stay memory-mapped views, as in tensordict. With
    ``canonical`` a leaf whose strides are not the row-major ones of its shape is copied too,
    even when ``is_contiguous`` says True (size-1 dims).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.transpose(0, 0).contiguous()["a"].is_contiguous()
    True
    """
    make = _canonical_contiguous if canonical else torch.Tensor.contiguous
    if inplace:
        for tree, key, leaf in list(leaves(td)):
            tree._tensordict[key] = make(leaf)
        return td
    return map_leaves(td, make)


def _canonical_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t.contiguous()``, copied again when its strides are not the row-major strides of its
    shape (``is_contiguous`` ignores the strides of size-1 dims), as tensordict's
    ``contiguous(canonical=True)``."""
    t = t.contiguous()
    if t.is_nested or t.layout != torch.strided:
        return t
    stride, running = [], 1
    for size in reversed(t.shape):
        stride.append(running)
        running *= size
    if tuple(t.stride()) == tuple(reversed(stride)):
        return t
    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    out.copy_(t)
    return out


def to_tensordict(td: TD, *, retain_none: bool | None = None) -> TD:
    """A plain TensorDict with copies of every tensor: not memory-mapped, not locked.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.memmap_().to_tensordict().is_memmap()
    False
    """
    return map_leaves(td, lambda t: t.clone().as_subclass(torch.Tensor))


# ---------------------------------------------------------------------------- comparisons


def _compare(
    td: TD, other: Any, op: Callable[[Any, Any], torch.Tensor], default: bool
) -> TD | bool:
    if _is_tensorclass(other):
        # as tensordict's: ``td == tc`` is the tensorclass's ``tc == td`` (a tensorclass)
        return NotImplemented
    other = _untyped(other)
    if not isinstance(other, (numbers.Number, torch.Tensor, Mapping, TreeNode)):
        return default  # as tensordict's: ``td == "z"`` is False, ``td != None`` True

    def non_tensor(value: Any, other_value: Any) -> Any:
        if isinstance(other_value, (numbers.Number, torch.Tensor)):
            # as tensordict's: a non-tensor entry against a number or a tensor gives an
            # empty tree (which ``all()`` and ``any()`` pass over)
            return type(td)._new_unchecked(value.batch_size, value.device)
        if type(value) is NonTensorStack or type(other_value) is NonTensorStack:
            return op(value, other_value)  # element by element, of the stack's batch size
        data = other_value.data if isinstance(other_value, NonTensorData) else other_value
        return torch.tensor(op(value.data, data)).expand(value.batch_size)

    td = grown(td, other)  # batch sizes broadcast together, as for the arithmetic
    other = operand(td, other)  # a tensor broadcasts over the batch dims
    return map_leaves(td, lambda t, o: op(t, against(o, t)), other, non_tensor=non_tensor)


_Operand = TreeNode | torch.Tensor | Mapping[Any, Any] | float | int | bool


@overload
def eq(td: TD, other: _Operand) -> TD: ...
@overload
def eq(td: TD, other: object) -> TD | bool: ...
def eq(td: TD, other: object) -> TD | bool:
    """Element-wise ``==``: a TensorDict of boolean leaves (``other`` as for ``add``), or
    ``False`` for an operand that is no number, tensor, mapping or tree."""
    return _compare(td, other, lambda a, b: a == b, False)


@overload
def ne(td: TD, other: _Operand) -> TD: ...
@overload
def ne(td: TD, other: object) -> TD | bool: ...
def ne(td: TD, other: object) -> TD | bool:
    """Element-wise ``!=``: a TensorDict of boolean leaves (``other`` as for ``add``), or
    ``True`` for an operand that is no number, tensor, mapping or tree."""
    return _compare(td, other, lambda a, b: a != b, True)


def no_bool(td: TD) -> bool:
    """Refuses ``bool(td)`` as tensordict does: the truth of many tensors is ambiguous."""
    raise RuntimeError(
        "Converting a tensordict to boolean value is not permitted; use .all() or .any()."
    )


def _along(td: TD, dim: int, name: str) -> TD:
    """``td.all(dim)`` / ``td.any(dim)``: each leaf's reduction along batch dim ``dim``, in a
    tree without that dim (as tensordict)."""
    n = td.batch_dims
    if not -n <= dim < n:
        raise RuntimeError(
            "dim must be greater than or equal to -tensordict.batch_dims and "
            "smaller than tensordict.batch_dims"
        )
    dim %= n
    names = None if td._names is None else [x for i, x in enumerate(td._names) if i != dim]
    return map_leaves(
        td,
        lambda t: getattr(t, name)(dim=dim),
        node_batch=lambda batch: [b for i, b in enumerate(batch) if i != dim],
        names=names,
    )


@overload
def all_true(td: TD, dim: None = None) -> bool: ...
@overload
def all_true(td: TD, dim: int) -> TD: ...
def all_true(td: TD, dim: int | None = None) -> bool | TD:
    """True when every element of every leaf is true; with ``dim``, a tree of each leaf's
    ``all`` along that batch dim.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.tensor([True, False]), "b": {"c": torch.ones(2)}}, [2])
    >>> td.all(), td.select("b").all(), td.all(dim=0)["a"]
    (False, True, tensor(False))
    """
    if dim is not None:
        return _along(td, dim, "all")
    return all(bool(leaf.all()) for _, _, leaf in leaves(td))


@overload
def any_true(td: TD, dim: None = None) -> bool: ...
@overload
def any_true(td: TD, dim: int) -> TD: ...
def any_true(td: TD, dim: int | None = None) -> bool | TD:
    """True when some element of some leaf is true; with ``dim``, a tree of each leaf's
    ``any`` along that batch dim.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.tensor([True, False]), "b": {"c": torch.zeros(2)}}, [2])
    >>> td.any(), td.select("b").any(), td.any(dim=0)["a"]
    (True, False, tensor(True))
    """
    if dim is not None:
        return _along(td, dim, "any")
    return any(bool(leaf.any()) for _, _, leaf in leaves(td))
