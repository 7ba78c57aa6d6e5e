"""``apply``, ``named_apply`` and ``apply_``: a user function over every leaf, as tensordict's.

The options of tensordict's ``apply`` that change the walk itself (``default`` for keys the
other trees lack, ``filter_empty``, ``call_on_nested``, ``out``, ``propagate_lock``) need a
walk of their own; the plain cases are ``map_leaves``'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from .._core import dirty as _dirty
from .._core.locking import refuse_read_only
from .._core.nested import leaf_shape
from .._core.nodes import NTD_TYPES, TD, TreeNode
from .._core.nontensor import NonTensorStack
from .._core.unbatched import UnbatchedTensor
from .devices import _normalize_device

NO_DEFAULT: Any = object()


def apply(
    td: TD,
    fn: Callable[..., Any],
    *others: Any,
    batch_size: Sequence[int] | None = None,
    device: Any = NO_DEFAULT,
    names: Any = NO_DEFAULT,
    inplace: bool = False,
    default: Any = NO_DEFAULT,
    filter_empty: bool | None = None,
    propagate_lock: bool = False,
    call_on_nested: bool = False,
    out: TD | None = None,
    is_leaf: Callable[[type], bool] | None = None,
    **constructor_kwargs: Any,
) -> TD | None:
    """Calls ``fn(leaf, *other_leaves)`` on every tensor leaf; ``None`` results are left out.

    As tensordict's ``apply``: ``others`` are TensorDicts walked with ``td`` (``default``
    stands in for their missing keys); ``batch_size``/``device`` set the result's; nested
    TensorDicts left empty are dropped unless ``filter_empty=False``; ``call_on_nested`` hands
    nested TensorDicts to ``fn`` whole; ``out`` receives the results in place;
    ``propagate_lock`` locks the result when ``td`` is locked; ``inplace`` writes the results
    into ``td``'s leaves and returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.apply(lambda t: t * 2)["a"][1]
    tensor([ 6.,  8., 10.])
    """
    return _apply(
        td, fn, others, batch_size, device, names, inplace, default, filter_empty,
        propagate_lock, call_on_nested, out, constructor_kwargs, named=False, nested_keys=False,
        is_leaf=is_leaf,
    )  # fmt: skip


def fast_apply(
    td: TreeNode,
    fn: Callable[..., Any],
    *others: Any,
    named: bool = False,
    nested_keys: bool = False,
    is_leaf: Any = None,
    checked: bool = False,
    **kwargs: Any,
) -> TreeNode | None:
    """tensordict's private ``_fast_apply`` (used by code written against its internals):
    ``apply`` / ``named_apply`` with its extra keywords (``checked`` changes nothing here:
    results are always checked; ``num_threads`` neither: see below)."""
    # ``num_threads``: tensordict's hint to call ``fn`` from a thread pool; here the calls run
    # in order in this thread, with the same results (torch's kernels have their own threads)
    del checked
    kwargs.pop("num_threads", None)
    if named:
        return named_apply(td, fn, *others, nested_keys=nested_keys, is_leaf=is_leaf, **kwargs)
    return apply(td, fn, *others, is_leaf=is_leaf, **kwargs)


def named_apply(
    td: TD,
    fn: Callable[..., Any],
    *others: Any,
    nested_keys: bool = False,
    batch_size: Sequence[int] | None = None,
    device: Any = NO_DEFAULT,
    names: Any = NO_DEFAULT,
    inplace: bool = False,
    default: Any = NO_DEFAULT,
    filter_empty: bool | None = None,
    propagate_lock: bool = False,
    call_on_nested: bool = False,
    out: TD | None = None,
    is_leaf: Callable[[type], bool] | None = None,
    **constructor_kwargs: Any,
) -> TD | None:
    """``apply`` with the key first: ``fn(key, leaf, *other_leaves)``.

    The key is the entry's own name, or with ``nested_keys`` its full key (a str at the top
    level, a tuple below), as in tensordict.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.named_apply(lambda key, t: t.new_full(t.shape, len(key)))["a"][0]
    tensor([1., 1., 1.])
    """
    return _apply(
        td, fn, others, batch_size, device, names, inplace, default, filter_empty,
        propagate_lock, call_on_nested, out, constructor_kwargs, named=True,
        nested_keys=nested_keys, is_leaf=is_leaf,
    )  # fmt: skip


def apply_(td: TD, fn: Callable[..., Any], *others: Any, **kwargs: Any) -> TD:
    """``apply(fn, *others, inplace=True)``: results are copied into ``td``'s leaves.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.apply_(lambda t: t + 1)["b", "c"]
    tensor([2., 2.])
    """
    return cast(TD, apply(td, fn, *others, inplace=True, **kwargs))  # in place: td itself


def _apply(
    td: TD,
    fn: Callable[..., Any],
    others: tuple[Any, ...],
    batch_size: Sequence[int] | None,
    device: Any,
    names: Any,
    inplace: bool,
    default: Any,
    filter_empty: bool | None,
    propagate_lock: bool,
    call_on_nested: bool,
    out: TD | None,
    constructor_kwargs: dict[str, Any],
    *,
    named: bool,
    nested_keys: bool,
    is_leaf: Callable[[type], bool] | None = None,
) -> TD | None:
    lock = bool(constructor_kwargs.pop("lock", False))
    if constructor_kwargs:
        raise TypeError(f"apply() got unexpected keyword arguments {sorted(constructor_kwargs)}")
    walk = _ApplyWalk(
        fn, default, filter_empty is not False, call_on_nested, named, nested_keys, is_leaf
    )
    if inplace or out is not None:
        target = out if out is not None and not inplace else td
        refuse_read_only(target)
        token = _dirty.mark(target)
        walk.into(td, others, target, (), replace=not inplace)
        _dirty.confirm(target, _dirty.ALL, token)
        return target
    batch = td._batch_size if batch_size is None else torch.Size(batch_size)
    new_device = td._device if device is NO_DEFAULT else _normalize_device(device)
    # None when ``filter_empty`` and every call of ``fn`` gave None (a tree where ``fn`` was
    # never called stays, empty: tensordict's rule)
    result: TD | None = None
    # as tensordict: a batch_size given is the batch size of the nested trees too
    walk.fixed_batch = batch_size is not None
    out, kept = walk.new(td, others, batch, new_device, ())
    if not (walk.filter_empty and not kept and walk.calls):
        result = out
    if result is not None:
        if names is not NO_DEFAULT:
            result._set_names(None if names is None else list(names))
        elif td._names is not None and len(batch) == td.batch_dims:
            result._set_names(list(td._names))
    if result is not None and (lock or (propagate_lock and td._is_locked)):
        result._lock_tree()
    return result


class _ApplyWalk:
    """One ``apply``: the user function and the options, over the tree and the others."""

    def __init__(
        self,
        fn: Callable[..., Any],
        default: Any,
        filter_empty: bool,
        call_on_nested: bool,
        named: bool,
        nested_keys: bool,
        is_leaf: Callable[[type], bool] | None = None,
    ) -> None:
        self.fn = fn
        self.is_leaf = is_leaf
        self.calls = 0  # calls of fn so far: a node whose calls all gave None is filtered
        self.default = default
        self.filter_empty = filter_empty
        self.call_on_nested = call_on_nested
        self.named = named
        self.nested_keys = nested_keys
        self.fixed_batch = False  # a batch_size given to apply: every new tree gets it

    def _others(self, others: tuple[Any, ...], key: str) -> list[Any]:
        rest = []
        for other in others:
            if isinstance(other, TreeNode):
                if key in other._tensordict:
                    rest.append(other._get_str(key))
                elif self.default is not NO_DEFAULT:
                    rest.append(self.default)
                else:
                    raise KeyError(
                        f'key "{key}" not found in the other TensorDict, which has keys '
                        f"{sorted(other._tensordict)}; pass default= to apply"
                    )
            else:
                rest.append(other)
        return rest

    def _whole(self, value: Any) -> bool:
        """True for a nested tree or non-tensor entry that ``is_leaf`` hands to ``fn`` whole."""
        return (
            self.is_leaf is not None
            and not isinstance(value, torch.Tensor)
            and bool(self.is_leaf(type(value)))
        )

    def _call(self, path: tuple[str, ...], value: Any, rest: list[Any]) -> Any:
        self.calls += 1
        if not self.named:
            return self.fn(value, *rest)
        key: Any = path[-1]
        if self.nested_keys and len(path) > 1:
            key = path
        return self.fn(key, value, *rest)

    def new(
        self,
        td: TD,
        others: tuple[Any, ...],
        batch: torch.Size,
        device: torch.device | None,
        prefix: tuple[str, ...],
    ) -> tuple[TD, int]:
        """The new tree and how many of its entries hold results (empty trees where ``fn`` was
        never called are kept but count for nothing)."""
        out = type(td)._new_unchecked(batch, device)
        dims = td.batch_dims
        kept = 0
        for key in list(td._tensordict):
            value = td._get_str(key)
            rest = self._others(others, key)
            path = (*prefix, key)
            whole = self._whole(value)
            if isinstance(value, TreeNode) and not self.call_on_nested and not whole:
                sub_batch = (
                    batch if self.fixed_batch else torch.Size([*batch, *value._batch_size[dims:]])
                )
                sub_td: Any = value
                calls = self.calls
                sub, sub_kept = self.new(sub_td, tuple(rest), sub_batch, device, path)
                if sub_kept or not self.filter_empty or self.calls == calls:
                    out._tensordict[key] = sub
                    # as tensordict: an empty tree where fn was never called is kept, and
                    # keeps its parent from being filtered
                    kept += bool(sub_kept) or self.calls == calls
                continue
            if (type(value) in NTD_TYPES or type(value) is NonTensorStack) and not whole:
                out._tensordict[key] = value.clone(recurse=False)
                kept += 1
                continue
            if type(value) in NTD_TYPES:
                value.batch_size, value.device = td._batch_size, td._device
            if type(value) is UnbatchedTensor and batch != td._batch_size:
                out._tensordict[key] = value  # a new batch size: the payload stays whole
                kept += 1
                continue
            result = self._call(path, value, rest)
            if result is None:
                continue
            kept += 1
            if isinstance(result, torch.Tensor) and device is not None and result.device != device:
                result = result.to(device)
            if type(result) is UnbatchedTensor:
                out._tensordict[key] = result  # any shape (its batch size is set when read)
                continue
            out._check_batch(
                # (a strided nested tensor has no ``shape``: its ragged dims are -1 here)
                key,
                leaf_shape(result) if isinstance(result, torch.Tensor) else result.batch_size,
            )
            out._tensordict[key] = result
        return out, kept

    def into(
        self,
        td: TD,
        others: tuple[Any, ...],
        target: Any,
        prefix: tuple[str, ...],
        replace: bool = False,
    ) -> None:
        """The results written into ``target``: copied into its leaves (``inplace``), or with
        ``replace`` (``out=``) set as its entries, as tensordict's, unless ``target`` is locked
        (a memory-mapped ``out``: copied into its maps)."""
        for key in list(td._tensordict):
            value = td._get_str(key)
            rest = self._others(others, key)
            path = (*prefix, key)
            whole = self._whole(value)
            if isinstance(value, TreeNode) and not self.call_on_nested and not whole:
                self.into(value, tuple(rest), target._get_str(key), path, replace)
                continue
            if (type(value) in NTD_TYPES or type(value) is NonTensorStack) and not whole:
                continue
            result = self._call(path, value, rest)
            if result is None:
                continue
            current = target._get_str(key) if key in target._tensordict else None
            if current is None or (
                replace and not target._is_locked and isinstance(result, torch.Tensor)
            ):
                target._set_str(key, result)
            elif isinstance(current, TreeNode):
                current.update_(result)
            elif result is not current:
                current.copy_(result)
