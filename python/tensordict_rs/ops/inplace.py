"""In-place writes into the existing leaves: ``zero_``, ``fill_``, ``copy_``, ``set_at_``,
``update_at_``, ``copy_at_``, ``masked_fill_`` (and its out-of-place form ``masked_fill``).

They write into the leaves a TensorDict already has, so they work on locked and memory-mapped
TensorDicts and reach the files; a read-only tree refuses them with the error of
``refuse_read_only``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .._core import dirty as _dirty
from .._core.locking import refuse_read_only
from .._core.nodes import TD, NonTensorData, TreeNode
from .._core.nontensor import NonTensorStack
from .._core.walk import leaves, map_leaves, zip_leaves


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
