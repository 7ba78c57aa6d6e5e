"""In-place writes into the existing leaves: ``zero_``, ``fill_``, ``copy_``, ``set_at_``,
``update_at_``, ``copy_at_``, ``masked_fill_`` (and its out-of-place form ``masked_fill``).

They write into the leaves a TensorDict already has, so they work on locked and memory-mapped
TensorDicts and reach the files; a read-only tree refuses them with the error of
``refuse_read_only``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .._core import dirty as _dirty
from .._core.errors import InplaceWriteError
from .._core.index import key_path
from .._core.locking import locked_error, refuse_read_only
from .._core.nodes import NTD_TYPES, TD, NonTensorData, TreeNode
from .._core.nontensor import NonTensorStack
from .._core.walk import is_tree, leaves, map_leaves, zip_leaves
from .indexing import pairs, refuse_saved_kind_change, saved_kind_change_error


def zero_(td: TD) -> TD:
    """Zeros every tensor leaf in place (locked and memory-mapped leaves too); returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.zero_()["b", "c"]
    tensor([0., 0.])
    """
    refuse_read_only(td)
    token = _dirty.mark(td)
    for _, _, leaf in list(leaves(td)):
        leaf.zero_()
    _dirty.confirm(td, _dirty.ALL, token)
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
    token = _dirty.mark(td)
    entry = td._entry(key)
    if isinstance(entry, TreeNode):
        for _, _, leaf in list(leaves(entry)):
            leaf.fill_(value)
    else:
        entry.fill_(value)
    _dirty.confirm(td, _dirty.ALL, token)
    return td


def copy_(td: TD, tensordict: Any, non_blocking: bool = False) -> TD:
    """Copies every leaf of ``tensordict`` into the leaf at the same key of ``td``; returns td.

    Non-tensor entries (strings, ``NonTensorData``, ``NonTensorStack``) are copied too, as
    tensordict's ``copy_`` (its ``update_``) does; in a saved tree they rewrite the entry's
    meta.json (see ``write_non_tensor``).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.copy_(td * 0)["a"].sum().item()
    0.0
    """
    refuse_read_only(td)
    if not isinstance(tensordict, TreeNode):
        tensordict = type(td)(dict(tensordict), td.batch_size)
    # checked before anything is written; one that td lacks is left out, as in tensordict
    non_tensor = non_tensor_entries(td, tensordict, missing_ok=True)
    lacking = [
        key
        for key, value in _flat_items(tensordict, (), non_tensor=True)
        if _is_non_tensor(value) and td._entry(key, None) is None
    ]
    if lacking:
        tensordict = tensordict.exclude(*lacking)
    token = _dirty.mark(td)
    for source, target in list(zip_leaves(tensordict, td)):
        if isinstance(target, TreeNode):
            raise KeyError("copy_: a leaf of the source is a nested TensorDict in the target")
        target.copy_(source, non_blocking=non_blocking)
    _dirty.confirm(td, _dirty.ALL, token)
    write_non_tensor(td, non_tensor, non_blocking=non_blocking)
    return td


def _is_non_tensor(value: Any) -> bool:
    return type(value) in NTD_TYPES or type(value) is NonTensorStack


def _one_value(stack: NonTensorStack) -> tuple[bool, Any]:
    """``(True, value)`` when every element of ``stack`` holds the same value."""
    values = stack.values_flat()
    if not values:
        return False, None
    first = values[0]
    try:
        return all(v is first or bool(v == first) for v in values[1:]), first
    except Exception:
        return False, None


def non_tensor_entries(
    td: TD, source: Any, *, missing_ok: bool = False
) -> list[tuple[tuple[str, ...], Any]]:
    """The non-tensor entries of ``source`` (a tree or a mapping) by full key, checked against
    ``td`` before anything is written (see ``checked_non_tensor``)."""
    found = [
        (key, value)
        for key, value in _flat_items(source, (), non_tensor=True)
        if _is_non_tensor(value)
    ]
    return checked_non_tensor(td, found, missing_ok=missing_ok)


def checked_non_tensor(
    td: TD, entries: list[tuple[tuple[str, ...], Any]], *, missing_ok: bool = False
) -> list[tuple[tuple[str, ...], Any]]:
    """``entries`` (full keys and non-tensor values) checked against ``td`` before anything is
    written, as ``write_non_tensor`` will write them: every key must exist in ``td``
    (``KeyError``; with ``missing_ok`` the missing ones are left out). A NonTensorData entry of
    a saved tree holds one value in its meta.json, which cannot become a stack in place: a
    stack of one value everywhere is written as that value, a stack of several values is
    refused (``InplaceWriteError`` naming the key), and so is a non-tensor value for a tensor
    or a nested tree."""
    out: list[tuple[tuple[str, ...], Any]] = []
    for key, value in entries:
        if missing_ok and td._entry(key, None) is None:
            continue
        target = td._entry(key)  # KeyError for a missing entry, as for tensors
        if not _is_non_tensor(target):
            name = key[0] if len(key) == 1 else key
            raise InplaceWriteError(
                f"Cannot write a {type(value).__name__} into the entry {name!r}, which is a "
                f"{type(target).__name__} (not a non-tensor entry); nothing was written."
            )
        if type(value) is NonTensorStack and type(target) in NTD_TYPES and target._saved:
            same, one = _one_value(value)
            if not same:
                raise saved_kind_change_error(key, target)
            value = NonTensorData(one)
        out.append((key, value))
    return out


def write_non_tensor(
    td: TD, entries: list[tuple[tuple[str, ...], Any]], non_blocking: bool = False
) -> None:
    """Writes the non-tensor ``entries`` (from ``non_tensor_entries``) into the entries at the
    same keys of ``td``, as ``update_`` writes them: a saved entry's meta.json is rewritten, a
    shared one's value in shared memory; an entry of a shared tree whose value is not JSON is
    skipped with ``update_``'s warning."""
    if not entries:
        return
    nested: dict[str, Any] = {}
    for key, value in entries:
        node = nested
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    update_(td, nested, non_blocking=non_blocking)


def set_at_(td: TD, key: Any, value: Any, index: Any, *, non_blocking: bool = False) -> TD:
    """Writes ``value`` into rows ``index`` of the existing entry at ``key``; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.set_at_("a", torch.full((3,), 9.0), 0)["a"][0]
    tensor([9., 9., 9.])
    """
    refuse_read_only(td)
    entry = td._entry(key)
    token = _dirty.mark(td, index)
    if not isinstance(value, torch.Tensor) and hasattr(value, "__array__"):
        value = torch.as_tensor(value)  # a NumPy array, as ``set`` takes it
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
    entries = [
        (key, value)
        for key, value in _flat_items(input_dict_or_td, (), non_tensor=True)
        if wanted is None or any(key[: len(w)] == w for w in wanted)
    ]
    for key, value in entries:
        # before any row is written: a value that would turn a NonTensorData entry of a saved
        # tree into a stack is refused (its meta.json holds one value)
        if _is_non_tensor(value):
            try:
                node = td._sub(key[:-1], create=False) if len(key) > 1 else td
            except KeyError:
                continue  # (the write below names the missing key)
            refuse_saved_kind_change(node, {key[-1]: value}, key[:-1])
    for key, value in entries:
        if _is_non_tensor(value):
            # the rows of a non-tensor entry, as ``td[idx] = {key: value}`` writes them (a value
            # that differs turns a NonTensorData into a stack, as in tensordict)
            td._entry(key)  # KeyError for a missing entry, as for tensors
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
    exist); returns ``td``. As tensordict's: ``fast=False`` is ``update_at_`` (non-tensor
    entries written too); with ``fast=True`` a source of non-tensor entries only raises
    ``RuntimeError``, and the non-tensor entries of a mixed one are skipped with a
    ``FutureWarning``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(3, 2)}, [3])
    >>> td.copy_at_(TensorDict({"a": torch.ones(2)}, []), 1)["a"][1]
    tensor([1., 1.])
    """
    if fast is None:
        raise TypeError(
            "copy_at_(..., fast=None) is no longer supported. Pass fast=True to require the "
            "optimized tensor-only copy path, or fast=False for the general update_at_ "
            "semantics."
        )
    if not fast:
        return update_at_(td, tensordict, idx, non_blocking=non_blocking)
    entries = _flat_items(tensordict, (), non_tensor=True)
    tensors = [
        (key, value)
        for key, value in entries
        if type(value) not in NTD_TYPES and type(value) is not NonTensorStack
    ]
    if len(tensors) < len(entries):
        if not tensors:
            raise RuntimeError(
                "copy_at_(..., fast=True) requires the optimized tensor-only copy path, but the "
                "source holds non-tensor entries only. Use fast=False or update_at_ for the "
                "general update semantics."
            )
        warnings.warn(
            "copy_at_(..., fast=True) copied the tensors of the source and skipped its "
            "non-tensor entries. Starting with TensorDict 0.17, the default will change to "
            "raising a RuntimeError, as for a source with only non-tensor entries. Use "
            "fast=False or update_at_ to write the non-tensor entries.",
            FutureWarning,
            stacklevel=2,
        )
    for key, value in tensors:
        if key not in td:
            raise KeyError(f"copy_at_: key {key!r} is not in the destination tensordict")
        set_at_(td, key, value, idx, non_blocking=non_blocking)
    return td


def _key_tuple(key: Any) -> tuple[str, ...]:
    if isinstance(key, str) or (isinstance(key, tuple) and key):
        return key_path(key)  # ("a", ("b",), "c") is ("a", "b", "c"), as tensordict unravels
    return tuple(key)  # an empty key: the caller names it


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
        elif non_tensor or (type(value) not in NTD_TYPES and type(value) is not NonTensorStack):
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


def _narrow(wanted: list[tuple[str, ...]] | None, key: tuple[str, ...]) -> list[Any] | None:
    """The keys of ``wanted`` under ``key``, relative to it: None for everything under ``key``
    (no filter, or a wanted key at or above it), ``[]`` for nothing."""
    if wanted is None:
        return None
    below: list[Any] = []
    for w in wanted:
        if key[: len(w)] == w:
            return None
        if w[: len(key)] == key:
            below.append(w[len(key) :])
    return below


def _default_is_leaf(cls: type) -> bool:
    """tensordict's ``is_leaf_nontensor``: tensors are leaves (a mapping is merged into)."""
    return issubclass(cls, torch.Tensor)


def _cloned(value: Any) -> Any:
    """``value`` cloned for ``update(clone=True)``: a tensor or tree by its ``clone``, a plain
    mapping entry by entry (tensordict's ``tree_map(torch.clone, value)``)."""
    if hasattr(value, "clone"):
        return value.clone()
    if isinstance(value, Mapping):
        return {k: _cloned(v) for k, v in value.items()}
    return value


def _sources(input_dict_or_td: Any, kwargs: dict[str, Any]) -> list[Any]:
    """What an ``update`` writes, in order: the mapping or tree, then the keyword entries
    (which win on a conflict, as in tensordict)."""
    if not kwargs:
        return [] if input_dict_or_td is None else [input_dict_or_td]
    if input_dict_or_td is None:
        return [kwargs]
    if isinstance(input_dict_or_td, dict):
        return [{**input_dict_or_td, **kwargs}]
    return [input_dict_or_td, kwargs]


def update(
    td: TD,
    input_dict_or_td: Any = None,
    clone: bool = False,
    inplace: bool = False,
    *,
    non_blocking: bool = False,
    keys_to_update: Sequence[Any] | None = None,
    is_leaf: Any = None,
    update_batch_size: bool = False,
    ignore_lock: bool = False,
    **kwargs: Any,
) -> TD:
    """``TensorDict.update`` (see its docstring)."""
    if ignore_lock:
        warnings.warn(
            "update(ignore_lock=True) is deprecated (tensordict removes it in 0.17): update inside "
            "`with td.unlock_():` or pass inplace=True",
            DeprecationWarning,
            stacklevel=3,
        )
    elif not inplace and td.is_locked:
        raise locked_error()
    if keys_to_update is not None and len(keys_to_update) == 0:
        return td
    wanted = None if keys_to_update is None else [_key_tuple(k) for k in keys_to_update]
    leaf = _default_is_leaf if is_leaf is None else is_leaf
    flags = {
        "clone": clone,
        "inplace": inplace,
        "non_blocking": non_blocking,
        "is_leaf": is_leaf,
        "update_batch_size": update_batch_size,
    }
    for source in _sources(input_dict_or_td, kwargs):
        if source is td:
            continue
        if is_tree(source) and (
            td.batch_size[: source.batch_dims] != source.batch_size[: td.batch_dims]
        ):
            _replace_batch_size(td, source, wanted, **flags)
            continue
        for key, value in pairs(source):
            k = _key_tuple(key)
            if not k:
                raise KeyError(f"update(): an empty key {key!r}")
            below = _narrow(wanted, k)
            if below is not None and not below:
                continue
            if clone:
                value = _cloned(value)
            first = k[0]
            target = td._get_str(first) if first in td._tensordict else None
            if (
                target is not None
                and is_tree(target)
                and not leaf(type(target))
                and not leaf(type(value))
            ):
                if len(k) > 1:
                    update(
                        target, {k[1:]: value}, keys_to_update=_narrow(wanted, (first,)), **flags
                    )
                    continue
                if isinstance(value, Mapping) or is_tree(value):
                    update(target, value, keys_to_update=below, **flags)
                    continue
            td.set(k if len(k) > 1 else first, value, inplace=inplace, non_blocking=non_blocking)
    return td


def _replace_batch_size(
    td: TD, source: TD, wanted: list[tuple[str, ...]] | None, **flags: Any
) -> None:
    """``update`` from a tree of another batch size: with ``update_batch_size=True`` every
    entry of ``td`` is replaced by the source's and the batch size with it, as in tensordict."""
    if not flags["update_batch_size"]:
        raise RuntimeError(
            f"update() got a source with batch size {source.batch_size} for a destination "
            f"with batch size {td.batch_size}. Pass update_batch_size=True to replace the "
            "batch size."
        )
    if flags["inplace"]:
        raise RuntimeError(
            "Source and destination tensor collection shapes mismatch, but update was called "
            "with inplace=True, which cannot be achieved."
        )
    if wanted is not None:
        raise RuntimeError(
            "Updating tensordicts of different batch-size with keys_to_update is currently "
            "not supported."
        )
    keys_source = set(source.keys(True))
    keys_dest = set(td.keys(True))
    if not keys_dest.issubset(keys_source):
        raise RuntimeError(
            "Some keys of the dest tensordict are not present in the source during update "
            f"with mismatching batch-size. batch_size of source={source.batch_size}, "
            f"batch_size of dest={td.batch_size}, keys in dest but not in source: "
            f"{keys_dest - keys_source}."
        )
    for key in list(td._tensordict):
        del td[key]
    td.batch_size = source.batch_size
    for key, value in pairs(source):
        td.set(key, _cloned(value) if flags["clone"] else value, non_blocking=flags["non_blocking"])


def update_(
    td: TD,
    input_dict_or_td: Any = None,
    clone: bool = False,
    *,
    non_blocking: bool = False,
    keys_to_update: Sequence[Any] | None = None,
    **kwargs: Any,
) -> TD:
    """``TensorDict.update_`` (see its docstring). A non-tensor entry of a shared tree whose
    value is not JSON (kept in this process, see ``share_entries``) cannot take a value in
    place: it is skipped, with tensordict 0.15.3's warning naming the keys."""
    skipped: list[Any] = []
    _update_(td, input_dict_or_td, clone, non_blocking, keys_to_update, kwargs, skipped, ())
    if skipped:
        warnings.warn(
            f"update_() skipped the non-tensor entries {skipped} of the source: the shared or "
            "memory-mapped destination cannot store their values.",
            UserWarning,
            stacklevel=3,
        )
    return td


def _cannot_copy(
    td: TD, prefix: tuple[str, ...], k: tuple[str, ...], value: Any, err: RuntimeError
) -> RuntimeError:
    """torch's error of a failed copy into an entry, naming the key and both shapes, as
    tensordict's ``update_`` says it."""
    full = (*prefix, *k)
    key = full[0] if len(full) == 1 else full
    entry = td.get(k if len(k) > 1 else k[0])
    return RuntimeError(
        f"update_() cannot copy the value of shape {getattr(value, 'shape', None)} under the "
        f"key {key!r} into the entry of shape {getattr(entry, 'shape', None)}: {err}"
    )


def _update_(
    td: TD,
    input_dict_or_td: Any,
    clone: bool,
    non_blocking: bool,
    keys_to_update: Sequence[Any] | None,
    kwargs: dict[str, Any],
    skipped: list[Any],
    prefix: tuple[str, ...],
) -> None:
    if keys_to_update is not None and len(keys_to_update) == 0:
        return
    wanted = None if keys_to_update is None else [_key_tuple(k) for k in keys_to_update]
    for source in _sources(input_dict_or_td, kwargs):
        if source is td:
            continue
        for key, value in pairs(source):
            k = _key_tuple(key)
            below = _narrow(wanted, k)
            if below is not None and not below:
                continue
            if clone:
                value = _cloned(value)
            first = k[0]
            target = td._get_str(first) if first in td._tensordict else None
            if (
                target is not None
                and is_tree(target)
                and (isinstance(value, Mapping) or is_tree(value))
            ):
                path = (*prefix, first)
                _update_(target, value, False, non_blocking, below, {}, skipped, path)
                continue
            if len(k) == 1 and isinstance(target, NonTensorData) and target._local is not None:
                skipped.append((*prefix, first) if prefix else first)
                continue
            if (k if len(k) > 1 else first) not in td:
                full = (*prefix, *k)
                raise KeyError(
                    f"The key {full[0] if len(full) == 1 else full} was not found in the dest "
                    "tensordict."
                )
            try:
                td.set_(k if len(k) > 1 else first, value, non_blocking=non_blocking)
            except RuntimeError as err:
                # set_'s error of a value that does not fit: worded as tensordict's update_
                cause = err.__cause__ if type(err) is InplaceWriteError else err
                if type(cause) is not RuntimeError:  # this library's own errors (locked, ...)
                    raise
                raise _cannot_copy(td, prefix, k, value, cause) from cause
