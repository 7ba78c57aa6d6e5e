"""Element-wise and in-place operations: arithmetic, comparisons, casts, fills, masks, copies.

Out-of-place operations map every tensor leaf through ``map_leaves`` and, as in tensordict,
give a locked result for a locked TensorDict (with its exceptions, noted below). In-place
ones (``zero_``, ``add_``, ``+=``, ``masked_fill_``, ``copy_``, ...) write into the existing
leaves, so they work on locked and memory-mapped TensorDicts and reach the files. The other
operand may be a TensorDict (leaves at the same keys), a mapping, a scalar, or a tensor, which
broadcasts against the batch dims the way tensordict does (left-aligned, then to the right
over each leaf's own dims).
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .._core import dirty as _dirty
from .._core.locking import refuse_read_only
from .._core.nodes import TD, NonTensorData, TreeNode
from .._core.nontensor import NonTensorStack
from .._core.walk import leaves, map_leaves, zip_leaves
from . import apply as _apply

# ---------------------------------------------------------------------------- operands


def operand(td: TD, other: Any) -> Any:
    """``other`` ready for the walker: a tree, a dict, a scalar, or a batch-broadcast tensor."""
    if isinstance(other, TreeNode):
        return other
    if isinstance(other, Mapping):
        return dict(other)
    if isinstance(other, torch.Tensor) and other.ndim:
        torch.broadcast_shapes(other.shape, td.batch_size)  # RuntimeError as tensordict's
        return _BatchTensor(other)
    return other


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
    def method(td: TD, other: Any) -> TD:
        other = operand(td, other)
        keep = lock and type(other) is not _BatchTensor
        return map_leaves(td, lambda t, o: fn(t, against(o, t)), other, lock=keep)

    return method


def _reflected(fn: Callable[[Any, Any], Any]) -> Callable[[TD, Any], TD]:
    def method(td: TD, other: Any) -> TD:
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


def add(td: TD, other: Any, *, alpha: float | None = None) -> TD:
    """``td + alpha * other`` per leaf (a new TensorDict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.add(td, alpha=2)["a"][0]
    tensor([0., 3., 6.])
    """
    if alpha is None:
        return _binary(operator.add)(td, other)
    return _binary(lambda t, o: torch.add(t, o, alpha=alpha))(td, other)


def sub(td: TD, other: Any, *, alpha: float | None = None) -> TD:
    """``td - alpha * other`` per leaf (a new TensorDict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.sub(td)["a"].abs().sum().item()
    0.0
    """
    if alpha is None:
        return _binary(operator.sub)(td, other)
    return _binary(lambda t, o: torch.sub(t, o, alpha=alpha))(td, other)


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
    return map_leaves(
        td,
        lambda t, lo, hi: torch.clamp(t, against(lo, t), against(hi, t)),
        operand(td, min),
        operand(td, max),
    )


def clamp_min(td: TD, min: Any) -> TD:
    """Every leaf clamped from below.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.clamp_min(2)["a"][0]
    tensor([2., 2., 2.])
    """
    return clamp(td, min=min)


def clamp_max(td: TD, max: Any) -> TD:
    """Every leaf clamped from above.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.clamp_max(1)["a"][1]
    tensor([1., 1., 1.])
    """
    return clamp(td, max=max)


def lerp(td: TD, end: Any, weight: Any) -> TD:
    """``td + weight * (end - td)`` per leaf.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.lerp(td * 3, 0.5)["a"][0]
    tensor([0., 2., 4.])
    """
    return map_leaves(
        td,
        lambda t, e, w: torch.lerp(t, against(e, t), against(w, t)),
        operand(td, end),
        operand(td, weight),
        lock=True,
    )


def _in_place_with(fn: Callable[..., Any]) -> Callable[..., Any]:
    """An in-place method writing ``fn(leaf, *operands)`` into every leaf (``out=leaf``)."""

    def method(td: TD, *others: Any) -> TD:
        ops = [operand(td, o) for o in others]
        for leaf, *values in list(zip_leaves(td, *ops)):
            fn(leaf, *(against(v, leaf) for v in values), out=leaf)
        return td

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
    for leaf, a, b in list(zip_leaves(td, operand(td, other1), operand(td, other2))):
        leaf.addcmul_(against(a, leaf), against(b, leaf), value=value)
    return td


def addcdiv_(td: TD, other1: Any, other2: Any, *, value: float = 1) -> TD:
    """``td += value * other1 / other2`` per leaf, in place; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.ones(2)}, [2])
    >>> td.addcdiv_(td * 3, td * 2, value=2)["a"]
    tensor([4., 4.])
    """
    for leaf, a, b in list(zip_leaves(td, operand(td, other1), operand(td, other2))):
        leaf.addcdiv_(against(a, leaf), against(b, leaf), value=value)
    return td


def rsub(td: TD, other: Any, *, alpha: float | None = None, default: Any = None) -> TD:
    """``other - alpha * td`` per leaf (a new TensorDict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.ones(2)}, [2]).rsub(5.0, alpha=2)["a"]
    tensor([3., 3.])
    """
    del default
    kwargs = {} if alpha is None else {"alpha": alpha}
    return map_leaves(
        td,
        lambda t, o: torch.rsub(t, against(o, t), **kwargs),
        operand(td, other),
        lock=True,
    )


def _binary_torch(name: str, fn: Callable[..., Any], doc: str) -> Callable[..., TreeNode]:
    def method(td: TreeNode, other: Any, *, default: Any = None) -> TreeNode:
        del default  # entries missing in ``other`` raise KeyError, as without a default
        other = operand(td, other)
        keep = type(other) is not _BatchTensor
        return map_leaves(td, lambda t, o: fn(t, against(o, t)), other, lock=keep)

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


# ---------------------------------------------------------------------------- casts


def _cast(dtype: torch.dtype, name: str) -> Callable[..., TD]:
    def method(td: TD, *, cast_filter: Callable[..., bool] | None = None) -> TD:
        if cast_filter is None:
            return map_leaves(td, lambda t: t.to(dtype), lock=True)
        return _cast_filtered(td, dtype, cast_filter, ())

    return _documented(
        method,
        name,
        f"Every tensor leaf cast to ``{dtype}`` (a new TensorDict). ``cast_filter(key, leaf)`` "
        "(key: a tuple) chooses the leaves to cast; the others are kept as they are.\n\n"
        "    >>> import torch\n    >>> from tensordict_rs import TensorDict\n"
        "    >>> td = TensorDict({'x': torch.tensor([1.5, 2.0])}, [2])\n" + _cast_call(name, dtype),
    )


def _cast_call(name: str, dtype: torch.dtype) -> str:
    """The example's call: torch warns that complex32 is experimental, which doctests (warnings as
    errors) would take for a failure."""
    if dtype is not torch.complex32:
        return f"    >>> td.{name}()['x'].dtype\n    {dtype}\n"
    return (
        "    >>> import warnings\n    >>> with warnings.catch_warnings():\n"
        "    ...     warnings.simplefilter('ignore')  # torch: ComplexHalf is experimental\n"
        f"    ...     out = td.{name}()\n    >>> out['x'].dtype\n    {dtype}\n"
    )


def _cast_filtered(
    td: TD,
    dtype: Any,
    keep: Callable[..., bool],
    prefix: tuple[str, ...],
    method: str = "to",
) -> TD:
    out = type(td)._new_unchecked(td._batch_size, td._device)
    for key in list(td._tensordict):
        value = td._get_str(key)
        if isinstance(value, TreeNode):
            out._tensordict[key] = _cast_filtered(value, dtype, keep, (*prefix, key), method)  # type: ignore[arg-type]
        elif type(value) is NonTensorData or type(value) is NonTensorStack:
            out._tensordict[key] = value.clone(recurse=False)
        else:
            keep_it = keep((*prefix, key), value)
            out._tensordict[key] = getattr(value, method)(dtype) if keep_it else value
    if td._is_locked:
        out._lock_tree()
    return out


def type_(
    td: TD, dst_type: torch.dtype | str, *, cast_filter: Callable[..., bool] | None = None
) -> TD:
    """Every tensor leaf cast with ``Tensor.type(dst_type)`` (a dtype or a name such as
    ``"torch.IntTensor"``). A locked TensorDict gives an unlocked result with a FutureWarning,
    as in tensordict 0.15.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"x": torch.tensor([1.5])}, [1]).type(torch.int32)["x"]
    tensor([1], dtype=torch.int32)
    """
    if td.is_locked:
        warnings.warn(
            "type() returns an unlocked tensordict for a locked one. Starting with TensorDict "
            "0.17, the default will change to a locked result, as int(), float() and "
            "to(dtype) return.",
            FutureWarning,
            stacklevel=2,
        )
    if cast_filter is None:
        return map_leaves(td, lambda t: t.type(dst_type))
    out = _cast_filtered(td, dst_type, cast_filter, (), method="type")
    out._unlock_tree() if out.is_locked else None
    return out


def _quantized(dtype: torch.dtype, name: str) -> Callable[..., TreeNode]:
    cast = _cast(dtype, name)

    def method(td: TreeNode, *, cast_filter: Callable[..., bool] | None = None) -> TreeNode:
        warnings.warn(
            f"TensorDictBase.{name}() is deprecated and will be removed in TensorDict 0.18. "
            "Use td.apply(lambda x: torch.quantize_per_tensor(x, scale, zero_point, "
            f"torch.{name})) instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return cast(td, cast_filter=cast_filter)

    return _documented(
        method,
        name,
        f"Deprecated (as in tensordict 0.15): casts every leaf to ``torch.{name}``, which torch "
        "refuses for plain tensors; quantize with ``torch.quantize_per_tensor`` instead, as the "
        "deprecation warning says:\n\n"
        "    >>> import torch, warnings\n    >>> from tensordict_rs import TensorDict\n"
        "    >>> td = TensorDict({'x': torch.tensor([1.5, 2.0])}, [2])\n"
        "    >>> with warnings.catch_warnings(record=True) as caught:\n"
        "    ...     warnings.simplefilter('always')\n"
        "    ...     try:\n"
        f"    ...         _ = td.{name}()\n"
        "    ...     except RuntimeError:  # torch: no quantized tensors from plain casts\n"
        "    ...         pass\n"
        "    >>> caught[0].category.__name__\n    'DeprecationWarning'\n",
    )


CASTS = {
    **{
        name: _cast(getattr(torch, name), name)
        for name in (
            "float16",
            "float32",
            "float64",
            "int8",
            "int16",
            "int32",
            "int64",
            "uint8",
            "uint16",
            "uint32",
            "uint64",
            "complex32",
            "complex64",
            "complex128",
        )
    },
    **{
        name: _quantized(getattr(torch, name), name)
        for name in ("qint8", "qint32", "quint8", "quint4x2")
    },
    "float": _cast(torch.float32, "float"),
    "double": _cast(torch.float64, "double"),
    "half": _cast(torch.float16, "half"),
    "bfloat16": _cast(torch.bfloat16, "bfloat16"),
    "int": _cast(torch.int32, "int"),
    "long": _cast(torch.int64, "long"),
    "bool": _cast(torch.bool, "bool"),
}


# ---------------------------------------------------------------------------- in place


def zero_(td: TD) -> TD:
    """Zeros every tensor leaf in place (locked and memory-mapped leaves too); returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.zero_()["b", "c"]
    tensor([0., 0.])
    """
    refuse_read_only(td)
    _dirty.mark(td)
    for _, _, leaf in list(leaves(td)):
        leaf.zero_()
    return td


def fill_(td: TD, key: Any, value: float | bool) -> TD:
    """Fills the entry at ``key`` with ``value`` in place (every leaf of a nested TensorDict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.fill_("a", 7.0)["a"][0]
    tensor([7., 7., 7.])
    """
    refuse_read_only(td)
    _dirty.mark(td)
    entry = td.get(key)
    if isinstance(entry, TreeNode):
        for _, _, leaf in list(leaves(entry)):
            leaf.fill_(value)
    else:
        entry.fill_(value)
    return td


def copy_(td: TD, tensordict: Any, non_blocking: bool = False) -> TD:
    """Copies every leaf of ``tensordict`` into the leaf at the same key of ``td``; returns td.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.copy_(td * 0)["a"].sum().item()
    0.0
    """
    refuse_read_only(td)
    if not isinstance(tensordict, TreeNode):
        tensordict = type(td)(dict(tensordict), td.batch_size)
    token = _dirty.mark(td)
    for source, target in list(zip_leaves(tensordict, td)):
        if isinstance(target, TreeNode):
            raise KeyError("copy_: a leaf of the source is a nested TensorDict in the target")
        target.copy_(source, non_blocking=non_blocking)
    _dirty.confirm(td, _dirty.ALL, token)
    return td


def set_at_(td: TD, key: Any, value: Any, index: Any, *, non_blocking: bool = False) -> TD:
    """Writes ``value`` into rows ``index`` of the existing entry at ``key``; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.set_at_("a", torch.full((3,), 9.0), 0)["a"][0]
    tensor([9., 9., 9.])
    """
    refuse_read_only(td)
    entry = td.get(key)
    token = _dirty.mark(td, index)
    if isinstance(entry, TreeNode):
        entry[index] = value
    elif isinstance(value, torch.Tensor) and value.device != entry.device:
        entry[index] = value.to(entry.device, non_blocking=non_blocking)
    else:
        entry[index] = value
    _dirty.confirm(td, index, token)
    return td


def update_at_(
    td: TD,
    input_dict_or_td: Any,
    idx: Any,
    clone: bool = False,
    *,
    non_blocking: bool = False,
    keys_to_update: Sequence[Any] | None = None,
) -> TD:
    """Writes every entry of ``input_dict_or_td`` into rows ``idx`` of the existing entries.

    ``keys_to_update`` limits the keys written; ``clone`` copies the values first.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.update_at_({"a": torch.full((3,), 5.0)}, 1)["a"][1]
    tensor([5., 5., 5.])
    """
    wanted = None if keys_to_update is None else {_key_tuple(k) for k in keys_to_update}
    for key, value in _flat_items(input_dict_or_td, (), non_tensor=True):
        if wanted is not None and not any(key[: len(w)] == w for w in wanted):
            continue
        if type(value) is NonTensorData or type(value) is NonTensorStack:
            # the rows of a non-tensor entry, as ``td[idx] = {key: value}`` writes them (a value
            # that differs turns a NonTensorData into a stack, as in tensordict)
            td.get(key)  # KeyError for a missing entry, as for tensors
            node = td._sub(key[:-1], create=False) if len(key) > 1 else td
            node[idx] = {key[-1]: value}
            continue
        if clone and isinstance(value, torch.Tensor):
            value = value.clone()
        set_at_(td, key, value, idx, non_blocking=non_blocking)
    return td


def copy_at_(
    td: TD, tensordict: Any, idx: Any, non_blocking: bool = False, *, fast: bool = True
) -> TD:
    """Copies the leaves of ``tensordict`` into rows ``idx`` of the matching leaves (which must
    exist); returns ``td``. ``fast`` is accepted for tensordict's signature.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(3, 2)}, [3])
    >>> td.copy_at_(TensorDict({"a": torch.ones(2)}, []), 1)["a"][1]
    tensor([1., 1.])
    """
    del fast
    for key, value in _flat_items(tensordict, ()):
        if key not in td:
            raise KeyError(f"copy_at_: key {key!r} is not in the destination tensordict")
        set_at_(td, key, value, idx, non_blocking=non_blocking)
    return td


def _key_tuple(key: Any) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _flat_items(
    source: Any, prefix: tuple[str, ...], non_tensor: bool = False
) -> list[tuple[tuple[str, ...], Any]]:
    items = (
        [(k, source._get_str(k)) for k in list(source._tensordict)]
        if isinstance(source, TreeNode)
        else list(source.items())
    )
    out: list[tuple[tuple[str, ...], Any]] = []
    for key, value in items:
        path = (*prefix, *_key_tuple(key))
        if isinstance(value, (TreeNode, Mapping)):
            out.extend(_flat_items(value, path, non_tensor))
        elif non_tensor or (type(value) is not NonTensorData and type(value) is not NonTensorStack):
            out.append((path, value))
    return out


def _mask_for(mask: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    if mask.device != leaf.device:
        mask = mask.to(leaf.device)
    return mask.reshape(*mask.shape, *([1] * (leaf.ndim - mask.ndim))).expand_as(leaf)


def masked_fill_(td: TD, mask: torch.Tensor, value: float | bool) -> TD:
    """Fills, in place, the rows where ``mask`` (over the leading batch dims) is true.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.masked_fill_(torch.tensor([False, True]), 0.0)["b", "c"]
    tensor([1., 0.])
    """
    refuse_read_only(td)
    _dirty.mark(td)
    for _, _, leaf in list(leaves(td)):
        leaf.masked_fill_(_mask_for(mask, leaf), value)
    return td


def masked_fill(td: TD, mask: torch.Tensor, value: float | bool) -> TD:
    """A new TensorDict with the rows where ``mask`` is true set to ``value``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.masked_fill(torch.tensor([True, False]), -1.0)["a"]
    tensor([[-1., -1., -1.],
            [ 3.,  4.,  5.]])
    """
    return map_leaves(td, lambda t: t.masked_fill(_mask_for(mask, t), value))


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

    Contiguous memory-mapped leaves stay memory-mapped views, as in tensordict.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.transpose(0, 0).contiguous()["a"].is_contiguous()
    True
    """
    if inplace:
        for tree, key, leaf in list(leaves(td)):
            tree._tensordict[key] = leaf.contiguous()
        return td
    return map_leaves(td, lambda t: t.contiguous())


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


def _compare(td: TD, other: Any, op: Callable[[Any, Any], torch.Tensor]) -> TD:
    batch = td.batch_size

    def non_tensor(value: Any, other_value: Any) -> torch.Tensor:
        if type(value) is NonTensorStack or type(other_value) is NonTensorStack:
            return op(value, other_value)  # element by element, of the stack's batch size
        data = other_value.data if isinstance(other_value, NonTensorData) else other_value
        return torch.tensor(op(value.data, data)).expand(batch)

    other = operand(td, other)  # a tensor broadcasts over the batch dims
    return map_leaves(td, lambda t, o: op(t, against(o, t)), other, non_tensor=non_tensor)


def eq(td: TD, other: object) -> TD:
    """Element-wise ``==``: a TensorDict of boolean leaves (``other`` as for ``add``)."""
    return _compare(td, other, lambda a, b: a == b)


def ne(td: TD, other: object) -> TD:
    """Element-wise ``!=``: a TensorDict of boolean leaves (``other`` as for ``add``)."""
    return _compare(td, other, lambda a, b: a != b)


def no_bool(td: TD) -> bool:
    """Refuses ``bool(td)`` as tensordict does: the truth of many tensors is ambiguous."""
    raise RuntimeError(
        "Converting a tensordict to boolean value is not permitted; use .all() or .any()."
    )


def all_true(td: TD) -> bool:
    """True when every element of every leaf is true.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.tensor([True, False]), "b": {"c": torch.ones(2)}}, [2])
    >>> td.all(), td.select("b").all()
    (False, True)
    """
    return all(bool(leaf.all()) for _, _, leaf in leaves(td))


def any_true(td: TD) -> bool:
    """True when some element of some leaf is true.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.tensor([True, False]), "b": {"c": torch.zeros(2)}}, [2])
    >>> td.any(), td.select("b").any()
    (True, False)
    """
    return any(bool(leaf.any()) for _, _, leaf in leaves(td))


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
