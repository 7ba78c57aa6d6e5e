"""TensorDict as a ``torch.utils._pytree`` node, so that ``torch.vmap``, ``torch.func`` and
``tree_map`` see its leaves: ``vmap(fn, (0, None))(params, x)`` over a stacked tree of
parameters is the ensemble recipe of ``from_modules`` / ``to_module``.

A node flattens to its entries (nested trees are nodes again) and a context of its keys, batch
size, device and the number of own dims of each entry. Unflattening gives the batch size back;
inside a transform that removed or added leading dims (``vmap``), the batch size is what the
leaves now have before their own dims.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.utils import _pytree

from .._core.nodes import NTD_TYPES, NonTensorData, TreeNode
from .._core.unbatched import UnbatchedTensor


def _flatten(td: Any) -> tuple[list[Any], Any]:
    keys: list[str] = []
    values: list[Any] = []
    own: list[int | None] = []
    fixed: dict[str, Any] = {}
    for key in list(td._tensordict):
        value = td._get_str(key)
        if type(value) in NTD_TYPES:  # not a leaf of the transform: kept in the context
            fixed[key] = value.data
            continue
        keys.append(key)
        values.append(value)
        if isinstance(value, TreeNode):
            own.append(len(value._batch_size) - len(td._batch_size))
        elif type(value) is UnbatchedTensor:  # no batch dims: says nothing of the batch size
            own.append(None)
        elif isinstance(value, torch.Tensor):
            own.append(value.ndim - len(td._batch_size))
        else:  # torch's own structures (in_dims, out_dims) ride on the tree: any object
            own.append(None)
    order = tuple(td._tensordict)
    context = (
        type(td), tuple(keys), tuple(td._batch_size), td._device, tuple(own),
        tuple(fixed.items()), order,
    )  # fmt: skip
    return values, context


def _flatten_with_keys(td: Any) -> tuple[list[tuple[Any, Any]], Any]:
    values, context = _flatten(td)
    return [(_pytree.MappingKey(k), v) for k, v in zip(context[1], values, strict=True)], context


def _batch_of(values: list[Any], own: tuple[Any, ...], batch: tuple[int, ...]) -> torch.Size:
    shapes = []
    for value, extra in zip(values, own, strict=True):
        if extra is None:
            continue
        if isinstance(value, TreeNode):
            shape = tuple(value._batch_size)
        elif isinstance(value, torch.Tensor):
            shape = tuple(value.shape)
        else:
            continue
        shapes.append(shape[: max(len(shape) - extra, 0)])
    if not shapes or all(s == batch for s in shapes):
        return torch.Size(batch)
    first = shapes[0]
    common = min(len(s) for s in shapes)
    while common and any(s[:common] != first[:common] for s in shapes):
        common -= 1
    return torch.Size(first[:common])


def _unflatten(values: Iterable[Any], context: Any) -> Any:
    cls, keys, batch, device, own, fixed, order = context
    td = cls._new_unchecked(_batch_of(list(values), own, batch), device)
    entries = dict(zip(keys, values, strict=True))
    fixed = dict(fixed)
    for key in order:
        if key in fixed:
            td._tensordict[key] = NonTensorData(fixed[key])
        elif key in entries:
            td._tensordict[key] = entries[key]
    return td


def register(cls: type) -> None:
    """Registers ``cls`` (a TensorDict class) as a pytree node."""
    _pytree.register_pytree_node(
        cls,
        _flatten,
        _unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=_flatten_with_keys,
    )
