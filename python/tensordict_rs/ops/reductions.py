"""Reductions: sum, mean, std, var, prod, nansum, nanmean, max, min, amax, amin, cummax, cummin,
quantile, logsumexp, norm, softmax.

One driver, ``reduce_leaves``, gives them tensordict 0.15.3's semantics: every one is a torch
reduction of each leaf plus a batch-size rule, walked by ``map_leaves``:

- no ``dim`` (the default): each leaf over all its elements; the result has batch size ``[]``;
- an int or a tuple of batch dims: those dims of every leaf (a leaf's own dims stay); the batch
  size loses them (or keeps them as 1 with ``keepdim``);
- ``dim="feature"``: each leaf over its own dims, after the batch dims of the tree holding it;
  the batch size stays;
- ``reduce=True``: all the leaves together, one tensor (the leaves flattened and concatenated,
  or concatenated along ``dim``).

The quirks the reference documents as deprecated are kept (a tuple ``dim`` of max, min, prod,
cummax, cummin and quantile reduces its first dim only, with the reference's warning), so that
code written against it gives the same numbers here.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .._core import dirty as _dirty
from .._core.nodes import TD, TreeNode
from .._core.walk import leaves, map_leaves, walk_items


class _NoDefault:
    """The "not given" default of ``dim`` and ``keepdim`` (``None`` means something else)."""

    _instance: _NoDefault | None = None

    def __new__(cls) -> _NoDefault:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NO_DEFAULT"

    def __bool__(self) -> bool:
        return False


NO_DEFAULT: Any = _NoDefault()
# dim=() means "every element" as in torch.sum(x, dim=()), except for these, which refuse it
_NO_EMPTY_DIM = frozenset({"max", "min", "cummax", "cummin", "quantile"})
# a tuple dim reduces its first dim only (deprecated in the reference, kept for its numbers)
_FIRST_OF_TUPLE = frozenset({"max", "min", "prod", "cummax", "cummin", "quantile"})


def _batch_dim(dim: int, ndim: int) -> int:
    new = dim + ndim if dim < 0 else dim
    if not 0 <= new < ndim:
        raise IndexError(f"Incompatible dim {dim} for tensordict with batch dims {ndim}.")
    return new


def _warn_tuple(name: str, dim: tuple[Any, ...]) -> None:
    if name in ("amax", "amin"):
        message = (
            f"{name}(dim={dim}) reduces only the first dim of the tuple, and does not check it "
            "against the batch dims. Starting with TensorDict 0.17, the default will change to "
            f"reducing every dim of the tuple, counted from the batch dims, as torch.{name} does."
        )
    else:
        warnings.warn(
            f"Passing a tuple as the dim of {name}(), which reduces only its first dim, is "
            f"deprecated and will be removed in TensorDict 0.17. Use an int dim, as "
            f"torch.{name} takes instead.",
            DeprecationWarning,
            stacklevel=4,
        )
        return
    warnings.warn(message, FutureWarning, stacklevel=4)


def _call(name: str, value: torch.Tensor, kwargs: dict[str, Any]) -> Any:
    if name == "quantile":
        args = dict(kwargs)
        q = args.pop("q")
        dim = args.pop("dim", None)
        if isinstance(dim, tuple):
            dim = dim[0]
        return value.quantile(q, dim, **args) if dim is not None else value.quantile(q, **args)
    return getattr(value, name)(**kwargs)


def _together(td: TreeNode, name: str, dim: Any, keepdim: Any, kwargs: dict[str, Any]) -> Any:
    """``reduce=True``: every leaf reduced together into one tensor."""
    values = [v for _, _, v in leaves(td)]
    if not values:
        raise ValueError(
            f"{name}(reduce=True) reduces the tensor leaves together, and this tensordict has "
            "no tensor leaves."
        )
    if dim is NO_DEFAULT:
        joined = torch.cat([v.contiguous().flatten() for v in values])
        return _call(name, joined, kwargs)
    ndim = td.batch_dims
    negative = values[0].ndim != ndim and any(
        isinstance(d, int) and d < 0 for d in (dim if isinstance(dim, tuple) else (dim,))
    )
    if dim == "feature":
        values = [v.flatten(ndim, -1) if v.ndim > ndim else v.unsqueeze(-1) for v in values]
        cat_dim, dim, keepdim = -1, -1, NO_DEFAULT
    else:
        cat_dim = dim[0] if isinstance(dim, tuple) else dim
    joined = torch.cat(values, dim=cat_dim)
    extra = dict(kwargs, dim=dim)
    if keepdim is not NO_DEFAULT:
        extra["keepdim"] = keepdim
    result = _call(name, joined, extra)
    if negative:
        warnings.warn(
            f"{name}(dim={dim}, reduce=True) counts a negative dim from the end of each leaf. "
            "Starting with TensorDict 0.17, the default will change to counting it from the "
            "end of the batch dims, as with reduce=False. Pass a non-negative dim to get the "
            "same result in every version.",
            FutureWarning,
            stacklevel=4,
        )
    return result


class _Pairs:
    """Collects the second tensor of each leaf result (the indices of max, cummax, ...)."""

    def __init__(self, name: str, kwargs: dict[str, Any], with_indices: bool) -> None:
        self.name, self.kwargs, self.with_indices = name, kwargs, with_indices
        # id of a leaf's first result (kept alive in the result tree) -> its second
        self.second: dict[int, torch.Tensor] = {}

    def __call__(self, value: torch.Tensor, node_dims: int | None = None) -> torch.Tensor:
        result = _call(self.name, value, self.kwargs)
        if isinstance(result, tuple):
            if self.with_indices:
                self.second[id(result[0])] = result[1]
            return result[0]
        return result  # type: ignore[no-any-return]


def reduce_leaves(
    td: TreeNode,
    name: str,
    dim: Any = NO_DEFAULT,
    keepdim: Any = NO_DEFAULT,
    *,
    further: bool | None = False,
    tuple_ok: bool = True,
    with_indices: bool = False,
    keep_batch: bool = False,
    key_transform: Callable[[Any], Any] | None = None,
    **kwargs: Any,
) -> Any:
    """The reduction ``name`` of every leaf (see the module docstring for ``dim`` and
    ``reduce``). ``with_indices``: max-like reductions return ``torch.return_types.<name>`` of
    two TensorDicts (values, indices). ``keep_batch``: cumulative ops keep the batch size."""
    if isinstance(dim, tuple) and not dim and name not in _NO_EMPTY_DIM:
        dim = None
    if dim is None and not keepdim:
        dim = NO_DEFAULT
    if further:
        return _together(td, name, dim, keepdim, kwargs)

    q_dims: list[int] = []
    if name == "quantile":
        q = kwargs["q"]
        if isinstance(q, torch.Tensor) and q.ndim == 1:
            q_dims = [q.shape[0]]

    ndim = td.batch_dims
    tuple_dim = None
    if isinstance(dim, tuple) and dim:
        if name in _FIRST_OF_TUPLE or (
            name in ("amax", "amin") and (len(dim) > 1 or not 0 <= dim[0] < ndim)
        ):
            tuple_dim = dim
    if dim is not NO_DEFAULT and dim != "feature" and dim is not None:
        if isinstance(dim, tuple):
            dim = dim[0] if not tuple_ok else tuple(_batch_dim(d, ndim) for d in dim)
            if name == "quantile" and isinstance(dim, tuple):
                dim = dim[0]
        else:
            dim = _batch_dim(operator.index(dim), ndim)

    pairs = _Pairs(name, kwargs, with_indices)
    if dim == "feature":
        if keepdim:
            raise TypeError("dim='feature' is incompatible with keepdim=True.")

        def feature(value: torch.Tensor, node_dims: int) -> torch.Tensor:
            value = value.flatten(node_dims, -1) if value.ndim > node_dims else value.unsqueeze(-1)
            return pairs(value) if name != "quantile" else _feature_quantile(value, kwargs)

        pairs.kwargs = dict(kwargs, dim=-1)
        result = map_leaves(
            td,
            feature,
            node_dims=True,
            node_batch=lambda batch: [*q_dims, *batch],
            names=None if td._names is None else [*[None] * len(q_dims), *td._names],
        )
    elif dim is not NO_DEFAULT or keepdim:
        call_kwargs = dict(kwargs)
        if dim is not NO_DEFAULT:
            call_kwargs["dim"] = dim
        elif name in ("sum", "mean"):
            call_kwargs["dim"] = None  # torch needs a dim with keepdim
        if keepdim is not NO_DEFAULT:
            call_kwargs["keepdim"] = keepdim
        pairs.kwargs = call_kwargs
        dims = set(dim) if isinstance(dim, tuple) else ({dim} if dim is not None else None)

        def rule(batch: torch.Size) -> list[int]:
            if keep_batch:
                return [*q_dims, *batch]
            if dims is None:  # keepdim without dim: every dim kept as 1
                return [*q_dims, *([1] * ndim), *batch[ndim:]]
            if keepdim:
                kept = [1 if i in dims else b for i, b in enumerate(batch[:ndim])]
            else:
                kept = [b for i, b in enumerate(batch[:ndim]) if i not in dims]
            return [*q_dims, *kept, *batch[ndim:]]

        names = None
        if td._names is not None:
            if keepdim or keep_batch:
                names = [*[None] * len(q_dims), *td._names]
            elif dims is not None:
                names = [
                    *[None] * len(q_dims),
                    *(n for i, n in enumerate(td._names) if i not in dims),
                ]
        result = map_leaves(td, pairs, node_batch=rule, names=names)
        if tuple_dim is not None:
            _warn_tuple(name, tuple_dim)
    else:
        pairs.kwargs = dict(kwargs)
        result = map_leaves(td, pairs, node_batch=lambda batch: [])
    if with_indices and pairs.second:
        # the indices of each leaf that has them (an UnbatchedTensor kept whole has none)
        second = pairs.second
        indices = map_leaves(
            result, lambda v: second.get(id(v)), unbatched=lambda v, *_: second.get(id(v))
        )
        result = getattr(torch.return_types, name)((result, indices))
    if key_transform is not None:
        result = transform_keys(result, key_transform)
    return result


def _feature_quantile(value: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    args = dict(kwargs)
    q = args.pop("q")
    return value.quantile(q, -1, **args)


def transform_keys(td: TD, key_transform: Callable[[Any], Any]) -> TD:
    """A new tree with every key (at every level) renamed by ``key_transform``."""
    out = type(td)._new_unchecked(td.batch_size, td.device)
    for key in list(td._tensordict):
        value = td._get_str(key)
        if isinstance(getattr(value, "_tensordict", None), dict):  # a tree
            value = transform_keys(value, key_transform)
        out._tensordict[key_transform(key)] = value
    return out


# ---------------------------------------------------------------------------- the methods


def _documented(fn: Callable[..., Any], name: str, doc: str) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


def _sum_like(name: str, doc: str, transform: bool = True) -> Callable[..., Any]:
    def method(
        td: TreeNode,
        dim: Any = NO_DEFAULT,
        keepdim: Any = NO_DEFAULT,
        *,
        dtype: torch.dtype | None = None,
        reduce: bool | None = None,
        key_transform: Callable[[Any], Any] | None = None,
    ) -> Any:
        kwargs: dict[str, Any] = {} if dtype is None else {"dtype": dtype}
        return reduce_leaves(
            td, name, dim, keepdim, further=reduce,
            key_transform=key_transform if not reduce else None, **kwargs,
        )  # fmt: skip

    return _documented(method, name, doc)


def _spread(name: str, doc: str) -> Callable[..., Any]:
    def method(
        td: TreeNode,
        dim: Any = NO_DEFAULT,
        keepdim: Any = NO_DEFAULT,
        *,
        correction: int = 1,
        reduce: bool | None = None,
        key_transform: Callable[[Any], Any] | None = None,
    ) -> Any:
        return reduce_leaves(
            td, name, dim, keepdim, further=reduce, correction=correction,
            key_transform=key_transform if not reduce else None,
        )  # fmt: skip

    return _documented(method, name, doc)


def _extremum(name: str, doc: str) -> Callable[..., Any]:
    def method(
        td: TreeNode,
        dim: Any = NO_DEFAULT,
        keepdim: bool = False,
        *,
        reduce: bool | None = None,
        return_indices: bool = True,
    ) -> Any:
        given = dim is not NO_DEFAULT and dim is not None
        return reduce_leaves(
            td, name, dim, keepdim, further=reduce, tuple_ok=False,
            with_indices=given and return_indices,
        )  # fmt: skip

    return _documented(method, name, doc)


def _a_extremum(name: str, doc: str) -> Callable[..., Any]:
    def method(
        td: TreeNode, dim: Any = NO_DEFAULT, keepdim: bool = False, *, reduce: bool | None = None
    ) -> Any:
        return reduce_leaves(td, name, dim, keepdim, further=reduce, tuple_ok=False)

    return _documented(method, name, doc)


def _cumulative(name: str, doc: str) -> Callable[..., Any]:
    def method(
        td: TreeNode, dim: int, *, reduce: bool | None = None, return_indices: bool = True
    ) -> Any:
        return reduce_leaves(
            td, name, dim, further=reduce, tuple_ok=False, with_indices=return_indices,
            keep_batch=True,
        )  # fmt: skip

    return _documented(method, name, doc)


_EXAMPLE = """

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({{"a": torch.arange(6.0).view(2, 3), "n": {{"b": torch.ones(2)}}}}, [2])
    >>> {call}
    {result}
"""


def methods() -> dict[str, Callable[..., Any]]:
    """The reduction methods of TensorDict, by name."""
    out: dict[str, Callable[..., Any]] = {}
    for name, what in [
        ("sum", "sum"), ("mean", "mean"), ("nansum", "sum of the non-NaN elements"),
        ("nanmean", "mean of the non-NaN elements"),
    ]:  # fmt: skip
        out[name] = _sum_like(
            name,
            f"The {what} of every leaf: over all its elements (batch size ``[]``), over batch "
            "dims ``dim`` (an int or a tuple), or over each leaf's own dims "
            "(``dim='feature'``); ``reduce=True`` gives one tensor for all the leaves "
            "together; ``key_transform`` renames the keys of the result."
            + _EXAMPLE.format(
                call=f'td.{name}()["a"], td.{name}(0)["a"].tolist()',
                result={"sum": "(tensor(15.), [3.0, 5.0, 7.0])",
                        "mean": "(tensor(2.5000), [1.5, 2.5, 3.5])",
                        "nansum": "(tensor(15.), [3.0, 5.0, 7.0])",
                        "nanmean": "(tensor(2.5000), [1.5, 2.5, 3.5])"}[name],
            ),
        )  # fmt: skip
    for name, what in [("std", "standard deviation"), ("var", "variance")]:
        out[name] = _spread(
            name,
            f"The {what} of every leaf (``correction`` as in ``torch.{name}``), over all its "
            "elements, batch dims ``dim``, or ``'feature'``; ``reduce=True`` gives one tensor."
            + _EXAMPLE.format(
                call=f'td.{name}(0)["a"].tolist()',
                result={"std": "[2.1213202476501465, 2.1213202476501465, 2.1213202476501465]",
                        "var": "[4.5, 4.5, 4.5]"}[name],
            ),
        )  # fmt: skip
    out["prod"] = _documented(
        _prod,
        "prod",
        "The product of every leaf, over all its elements or along batch dim ``dim``."
        + _EXAMPLE.format(call='td.prod(0)["a"].tolist()', result="[0.0, 4.0, 10.0]"),
    )
    for name in ("max", "min"):
        out[name] = _extremum(
            name,
            f"The {name}imum of every leaf: over all its elements, or along batch dim ``dim``, "
            f"which gives ``torch.return_types.{name}`` of two TensorDicts (values, indices) "
            "unless ``return_indices=False``."
            + _EXAMPLE.format(
                call=f'td.{name}(0).values["a"].tolist(), td.{name}(0).indices["a"].tolist()',
                result=(
                    "([3.0, 4.0, 5.0], [1, 1, 1])"
                    if name == "max"
                    else "([0.0, 1.0, 2.0], [0, 0, 0])"
                ),
            ),
        )
    for name in ("amax", "amin"):
        out[name] = _a_extremum(
            name,
            f"The {name[1:]}imum of every leaf (no indices), over all its elements or along "
            "batch dim ``dim``."
            + _EXAMPLE.format(
                call=f'td.{name}(0)["a"].tolist()',
                result="[3.0, 4.0, 5.0]" if name == "amax" else "[0.0, 1.0, 2.0]",
            ),
        )
    for name in ("cummax", "cummin"):
        out[name] = _cumulative(
            name,
            f"The cumulative {name[3:]}imum of every leaf along batch dim ``dim``: "
            f"``torch.return_types.{name}`` of two TensorDicts unless ``return_indices=False``."
            + _EXAMPLE.format(
                call=f'td.{name}(0, return_indices=False)["a"][1].tolist()',
                result="[3.0, 4.0, 5.0]" if name == "cummax" else "[0.0, 1.0, 2.0]",
            ),
        )
    out["quantile"] = quantile
    out["logsumexp"] = logsumexp
    out["norm"] = norm
    out["softmax"] = softmax
    return out


def _prod(
    td: TreeNode,
    dim: Any = NO_DEFAULT,
    keepdim: Any = NO_DEFAULT,
    *,
    dtype: torch.dtype | None = None,
    reduce: bool | None = None,
) -> Any:
    kwargs: dict[str, Any] = {} if dtype is None else {"dtype": dtype}
    result = reduce_leaves(td, "prod", dim, False, further=reduce, tuple_ok=False, **kwargs)
    if keepdim:
        if isinstance(dim, tuple):
            dim = dim[0]
        if dim is not None and dim is not NO_DEFAULT:
            return result.unsqueeze(dim)
        return result.reshape([1] * td.batch_dims)
    return result


def quantile(
    td: TreeNode,
    q: float | torch.Tensor,
    dim: Any = NO_DEFAULT,
    keepdim: Any = NO_DEFAULT,
    *,
    interpolation: str = "linear",
    reduce: bool | None = None,
    key_transform: Callable[[Any], Any] | None = None,
) -> Any:
    """The ``q``-th quantile of every leaf, over all its elements or along batch dim ``dim``
    (a 1-d ``q`` adds a leading batch dim of its length, as ``torch.quantile`` does).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).view(2, 3)}, [2])
    >>> td.quantile(0.5)["a"], td.quantile(0.5, dim=0)["a"].tolist()
    (tensor(2.5000), [1.5, 2.5, 3.5])
    """
    return reduce_leaves(
        td, "quantile", dim, keepdim, further=reduce, q=q, interpolation=interpolation,
        key_transform=key_transform if not reduce else None,
    )  # fmt: skip


def logsumexp(td: TreeNode, dim: Any = None, keepdim: bool = False, *, out: Any = None) -> Any:
    """``torch.logsumexp`` of every leaf over batch dims ``dim`` (default: all of them); the
    leaves' own dims are never reduced. ``out`` receives the result.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict(a=torch.zeros(2, 3), batch_size=[2]).logsumexp()["a"]
    tensor([0.6931, 0.6931, 0.6931])
    """
    ndim = td.batch_dims
    if isinstance(dim, int):
        dims: tuple[int, ...] = (dim + ndim if dim < 0 else dim,)
    elif dim is not None:
        dims = tuple(d + ndim if d < 0 else d for d in dim)
    else:
        dims = tuple(range(ndim))
    if any(d < 0 or d >= ndim for d in dims):
        raise ValueError(
            f"The dimension {dim} is incompatible with a tensordict with batch_size "
            f"{td.batch_size}."
        )

    def rule(batch: torch.Size) -> list[int]:
        if keepdim:
            return [1 if i in dims else b for i, b in enumerate(batch)]
        return [b for i, b in enumerate(batch) if i not in dims]

    result = map_leaves(
        td, lambda t: torch.logsumexp(t, dim=dims, keepdim=keepdim), node_batch=rule
    )
    if out is not None:
        return write_out(out, result)
    return result


def write_out(out: Any, result: TD) -> Any:
    """``result`` written into ``out`` (tensordict's ``out=``): into the leaf of the same key and
    shape in place (``out``'s tensors are the results, as torch's ``out=``), or set where
    ``out`` lacks it; returns ``out``. Every row of ``out`` is stamped in its dirty map (what a
    checkpoint copies: these writes were missed, found by an attack)."""
    token = _dirty.mark(out)
    for key, value in list(walk_items(result, True, True)):
        target = out._entry(key, None)
        if isinstance(target, torch.Tensor) and target.shape == value.shape:
            target.copy_(value)
        else:
            out.set(key, value)
    _dirty.confirm(out, _dirty.ALL, token)
    return out


def norm(
    td: TreeNode,
    *,
    out: Any = None,
    dtype: torch.dtype | None = None,
    key_transform: Callable[[Any], Any] | None = None,
) -> Any:
    """The 2-norm of every leaf over all its elements (batch size ``[]``).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict(a=torch.full((3, 4), 2.0), b={"c": torch.ones(3)}, batch_size=[3])
    >>> norms = td.norm()
    >>> norms["a"], norms["b", "c"], norms.batch_size
    (tensor(6.9282), tensor(1.7321), torch.Size([]))
    """
    result = map_leaves(
        td,
        (lambda t: t.norm()) if dtype is None else (lambda t: t.norm(dtype=dtype)),
        node_batch=lambda batch: [],
        lock=True,
    )
    if out is not None:  # tensordict's norm sets new tensors into ``out`` (not in place)
        result = out.update(result)
    if key_transform is not None:
        result = transform_keys(result, key_transform)
    return result


def softmax(td: TD, dim: int, dtype: torch.dtype | None = None) -> TD:
    """``torch.softmax`` of every leaf along batch dim ``dim``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict(x=torch.zeros(2, 3), batch_size=[2]).softmax(0)["x"][0]
    tensor([0.5000, 0.5000, 0.5000])
    """
    if not isinstance(dim, int):
        raise ValueError(f"Expected dim of type int, got {type(dim)}.")
    dim = _batch_dim(dim, td.batch_dims)
    return map_leaves(td, lambda t: torch.softmax(t, dim=dim, dtype=dtype))


class Reductions(TreeNode):
    """The reductions of TensorDict (a mixin): ``sum``, ``mean``, ``std``, ``max``, ...,
    set from ``methods()`` below, and ``quantile``, ``logsumexp``, ``norm``, ``softmax``."""


for _name, _method in methods().items():
    setattr(Reductions, _name, _method)
