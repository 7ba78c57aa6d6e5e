"""Entry operations that work on keys, not leaves: ``clear``, ``popitem``, ``setdefault``,
``del_``, ``create_nested``, ``separates``, ``split_keys``, ``rename_keys``, ``replace``,
``get_at``, ``get_item_shape``, ``entry_class``, ``filter_empty_``, ``depth``, and the
introspection of leaves (``dtype``, ``is_contiguous``, ``param_count``, ``bytes``, ...).

Semantics are tensordict 0.15.3's, tested side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import torch

from .._core.index import key_path as _path
from .._core.locking import locked_error
from .._core.nodes import NTD_TYPES, TD, TreeNode
from .._core.walk import copy_tree, leaves, map_leaves, walk_items
from ..memmap import _LazyLeaf
from .keys import _max_batch

_NO_DEFAULT: Any = object()


def _flat(key: tuple[str, ...]) -> Any:
    return key[0] if len(key) == 1 else key


def clear(td: TD) -> TD:
    """Removes every entry; returns ``td`` (a locked TensorDict raises ``RuntimeError``).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2)}, [2]).clear().keys()
    []
    """
    if td.is_locked:
        raise locked_error()
    td._tensordict.clear()
    return td


def popitem(td: TreeNode) -> tuple[str, Any]:
    """Removes the last top-level entry and returns ``(key, value)``, as ``dict.popitem``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [2]).popitem()
    ('b', tensor([1., 1.]))
    """
    if td.is_locked:
        raise locked_error()
    if not td._tensordict:
        raise KeyError("popitem(): dictionary is empty")
    key = next(reversed(td._tensordict))
    value = td._get_str(key)
    del td._tensordict[key]
    if type(value) in NTD_TYPES:
        return key, value.data
    return key, value


def setdefault(td: TreeNode, key: Any, default: Any, inplace: bool = False) -> Any:
    """The entry at ``key``, after writing ``default`` there if the key is missing.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2)}, [2])
    >>> td.setdefault("a", torch.ones(2)), td.setdefault("b", torch.ones(2))
    (tensor([0., 0.]), tensor([1., 1.]))
    """
    if key not in td:
        td.set(key, default, inplace=inplace)
    return td._entry(key)


def del_(td: TD, key: Any) -> TD:
    """Deletes the entry at ``key`` in place; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [2]).del_("a").keys()
    ['b']
    """
    path = _path(key)
    if td.is_locked:
        raise locked_error()
    node = td._sub(path[:-1], create=False)
    if path[-1] not in node._tensordict:
        raise KeyError(path[-1] if len(path) == 1 else key)
    del node._tensordict[path[-1]]
    return td


def create_nested(td: TD, key: Any) -> TD:
    """Adds an empty nested TensorDict at ``key`` (batch size and device of its parent);
    returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({}, [2]).create_nested(("a", "b"))
    >>> td["a", "b"].batch_size
    torch.Size([2])
    """
    path = _path(key)
    parent = td._sub(path[:-1], create=True)
    parent._set_str(
        path[-1], type(td)._new_unchecked(parent.batch_size, parent.device), validate=False
    )
    return td


def get_at(td: TreeNode, key: Any, *args: Any, **kwargs: Any) -> Any:
    """``td.get(key)[index]`` (``default`` when the key is missing, None unless given).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"x": torch.arange(3)}, batch_size=[3])
    >>> td.get_at("x", 1), td.get_at("y", 1), td.get_at("y", 1, default=-1)
    (tensor(1), None, -1)
    """
    if args:
        index, *rest = args
    else:
        index, rest = kwargs.pop("index"), []
    default = rest[0] if rest else kwargs.pop("default", None)
    if kwargs:
        raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
    value = td.get(key, _NO_DEFAULT)
    if value is _NO_DEFAULT:
        return default  # (None unless given, as tensordict's)
    if type(value) in NTD_TYPES:
        return value.data
    return value[index]


def get_item_shape(td: TreeNode, key: Any) -> torch.Size:
    """The shape of the entry at ``key`` (a nested TensorDict: its batch size), without making
    a lazy memory-mapped leaf.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2, 3)}, [2]).get_item_shape("a")
    torch.Size([2, 3])
    """
    path = _path(key)
    node = td._sub(path[:-1], create=False)
    if path[-1] not in node._tensordict:
        raise KeyError(f'key "{key}" not found in TensorDict with keys {sorted(node._tensordict)}')
    value = node._tensordict[path[-1]]
    if type(value) in NTD_TYPES:
        return node.batch_size
    shape = node._entry_shape(path[-1])
    return node.batch_size if shape is None else torch.Size(shape)


def entry_class(td: TreeNode, key: Any) -> type:
    """The class of the entry at ``key``, without reading it (a lazy memory-mapped leaf is a
    ``MemoryMappedTensor``).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2)}, [2]).entry_class("a")
    <class 'torch.Tensor'>
    """
    path = _path(key)
    node = td._sub(path[:-1], create=False)
    if path[-1] not in node._tensordict:
        raise KeyError(f'key "{key}" not found in TensorDict with keys {sorted(node._tensordict)}')
    value = node._tensordict[path[-1]]
    if type(value) is _LazyLeaf:
        from ..memmap import MemoryMappedTensor

        return MemoryMappedTensor
    return type(value)


def filter_empty_(td: TD) -> TD:
    """Removes, in place, the nested TensorDicts that hold no leaf; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2), "e": {}}, [2]).filter_empty_().keys()
    ['a']
    """
    for key in list(td._tensordict):
        value = td._tensordict[key]
        if isinstance(value, TreeNode):
            filter_empty_(value)  # type: ignore[arg-type]
            if not value._tensordict:
                if td.is_locked:
                    raise locked_error()
                del td._tensordict[key]
    return td


def depth(td: TreeNode) -> int:
    """The number of levels of nested TensorDicts above the deepest leaf (0 for a flat one;
    empty nested TensorDicts count for nothing, as in tensordict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": {"b": {"c": torch.zeros(())}}}).depth
    2
    """
    deepest = 0
    for key, _ in walk_items(
        td, True, True, False, is_leaf=lambda cls: not issubclass(cls, TreeNode)
    ):
        if isinstance(key, tuple):  # levels down to a leaf: an empty nested tree adds none
            deepest = max(deepest, len(key) - 1)
    return deepest


def _remove(td: TreeNode, path: tuple[str, ...]) -> Any:
    node = td._sub(path[:-1], create=False)
    if node.is_locked:
        raise locked_error()
    return node._tensordict.pop(path[-1])


def _place(out: TreeNode, path: tuple[str, ...], value: Any) -> None:
    node = out._sub(path[:-1], create=True)
    node._tensordict[path[-1]] = value


def separates(
    td: TD,
    *keys: Any,
    default: Any = _NO_DEFAULT,
    strict: bool = True,
    filter_empty: bool = True,
) -> TD:
    """Removes the entries ``keys`` in place and returns them in a new TensorDict (same batch
    size; the nested TensorDicts that hold them come along).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [2])
    >>> td.separates("a").keys(), td.keys()
    (['a'], ['b'])
    """
    return split_keys(
        td,
        list(keys),
        inplace=True,
        default=default,
        strict=strict,
        reproduce_struct=not filter_empty,
    )[0]


def _prune_nested_emptied(td: TreeNode, parents: set[tuple[str, ...]]) -> None:
    """Removes nested TensorDicts left empty by a removal (only those, and their parents)."""
    for parent in sorted(parents, key=len, reverse=True):
        for cut in range(len(parent), 0, -1):
            prefix = parent[:cut]
            try:
                node = td._sub(prefix, create=False)
            except KeyError:
                break
            if node._tensordict:
                break
            holder = td._sub(prefix[:-1], create=False)
            del holder._tensordict[prefix[-1]]


def split_keys(
    td: TD,
    *key_sets: Any,
    inplace: bool = False,
    default: Any = _NO_DEFAULT,
    strict: bool = True,
    reproduce_struct: bool = False,
) -> tuple[TD, ...]:
    """One TensorDict per set of keys (a list, a ``{key: new_key}`` dict, or a predicate
    ``fn(key, leaf)``), plus one of the remaining entries; ``inplace`` removes the selected
    entries from ``td``, which is then the last one.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2), "b": torch.ones(2), "c": torch.ones(2)}, [2])
    >>> [t.keys() for t in td.split_keys(["a"], ["b"])]
    [['a'], ['b'], ['c']]
    """
    rest = td if inplace else copy_tree(td)
    outs = []
    for key_set in key_sets:
        out = type(td)._new_unchecked(td.batch_size, td.device)
        if callable(key_set) and not isinstance(key_set, Mapping):
            chosen = [
                (path, path) for path in _leaf_paths(rest) if key_set(path, rest.get(_flat(path)))
            ]
        elif isinstance(key_set, Mapping):
            chosen = [(_path(k), _path(v)) for k, v in key_set.items()]
        else:
            chosen = [(_path(k), _path(k)) for k in key_set]
        emptied: set[tuple[str, ...]] = set()
        for old, new in chosen:
            try:
                value = _remove(rest, old)
            except KeyError:
                if strict and default is _NO_DEFAULT:
                    raise KeyError(
                        f'key "{_flat(old)}" not found in TensorDict with keys '
                        f"{sorted(rest.keys())}"
                    ) from None
                if default is not _NO_DEFAULT:
                    out.set(_flat(new), default)
                continue
            _place(out, new, value)
            emptied.add(old[:-1])
        if not reproduce_struct:
            _prune_nested_emptied(rest, emptied)
        outs.append(out)
    return (*outs, rest)


def _leaf_paths(td: TreeNode, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for key in list(td._tensordict):
        value = td._tensordict[key]
        if isinstance(value, TreeNode):
            paths.extend(_leaf_paths(value, (*prefix, key)))  # type: ignore[arg-type]
        elif type(value) not in NTD_TYPES:
            paths.append((*prefix, key))
    return paths


def rename_keys(td: TD, mapping: Mapping[Any, Any], *, strict: bool = True) -> TD:
    """A shallow copy with the keys of ``mapping`` renamed to its values, all at once (a
    missing key raises ``KeyError`` unless ``strict=False``).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [2])
    >>> td.rename_keys({"a": "x", "b": ("n", "b")}).keys(True, True)
    ['x', ('n', 'b')]
    """
    out = copy_tree(td)
    moved = []
    for old, new in mapping.items():
        try:
            value = _remove(out, _path(old))
        except KeyError:
            if strict:
                known = sorted(map(str, td.keys(True)))
                raise KeyError(f'key "{old}" not found in TensorDict with keys {known}') from None
            continue
        moved.append((_path(new), value))
    for new, value in moved:
        _place(out, new, value)
    return out


def replace(td: TD, *args: Any, **kwargs: Any) -> TD:
    """A shallow copy with entries replaced (merged as ``update`` does); ``td`` itself when
    nothing is given.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2)}, [2])
    >>> td.replace(a=torch.ones(2))["a"], td["a"]
    (tensor([1., 1.]), tensor([0., 0.]))
    """
    if len(args) > 1:
        raise TypeError(f"replace takes at most one positional argument, got {len(args)}")
    if not args and not kwargs:
        return td
    entries: Any = args[0] if args else {}
    if kwargs:
        if isinstance(entries, TreeNode):
            entries = copy_tree(entries).update(kwargs)
        else:
            entries = {**entries, **kwargs}
    return copy_tree(td).update(entries)


# ---------------------------------------------------------------------------- introspection


def dtype(td: TreeNode) -> torch.dtype | None:
    """The dtype of the leaves if they all share one, else None."""
    found = None
    for _, _key, value in _infos(td):
        if found is None:
            found = value
        elif value != found:
            return None
    return found


def _infos(td: TreeNode) -> Any:
    """``(node, key, dtype)`` of every tensor leaf, without making lazy leaves."""
    for key in list(td._tensordict):
        value = td._tensordict[key]
        if isinstance(value, TreeNode):
            yield from _infos(value)  # type: ignore[arg-type]
        elif type(value) is _LazyLeaf:
            yield td, key, value.dtype
        elif isinstance(value, torch.Tensor):
            yield td, key, value.dtype


def is_contiguous(td: TreeNode) -> bool:
    """True when every leaf (nested ones too) is contiguous.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3])
    >>> td.is_contiguous(), td.permute(1, 0).is_contiguous()
    (True, False)
    """
    return all(value.is_contiguous() for _, _, value in leaves(td))


def is_floating_point(td: TreeNode) -> bool:
    """True when every tensor leaf has a floating-point dtype.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2), "b": torch.arange(2)}, [2]).is_floating_point()
    False
    """
    return all(d.is_floating_point for _, _, d in _infos(td))


def param_count(td: TreeNode, *, count_duplicates: bool = True) -> int:
    """The number of elements of the tensor leaves (a tensor under several keys counts once
    with ``count_duplicates=False``).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> x = torch.zeros(6)
    >>> td = TensorDict(a=x, b=x, c=torch.zeros(2, 3))
    >>> td.param_count(), td.param_count(count_duplicates=False)
    (18, 12)
    """
    values = [v for _, _, v in leaves(td)]
    if not count_duplicates:
        values = list({id(v): v for v in values}.values())
    return sum(v.numel() for v in values)


def bytes_(td: TreeNode, *, count_duplicates: bool = True) -> int:
    """The bytes of the tensor leaves (and of their gradients), ``numel * itemsize`` each.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> x = torch.zeros(6)
    >>> td = TensorDict(a=x, b=x, c=torch.zeros(2, 3))
    >>> td.bytes(), td.bytes(count_duplicates=False)
    (72, 48)
    """
    values = [v for _, _, v in leaves(td)]
    if not count_duplicates:
        values = list({id(v): v for v in values}.values())
    total = 0
    for v in values:
        total += v.numel() * v.element_size()
        if v.grad is not None:
            total += v.grad.numel() * v.grad.element_size()
    return total


def data_ptr(td: TD, *, storage: bool = False) -> TD:
    """A TensorDict of the data pointers of the leaves (of their storages with
    ``storage=True``), batch size ``[]``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> x = torch.zeros(2)
    >>> TensorDict({"a": x}, [2]).data_ptr()["a"].item() == x.data_ptr()
    True
    """
    if storage:
        fn = lambda t: torch.tensor(t.untyped_storage().data_ptr())  # noqa: E731
    else:
        fn = lambda t: torch.tensor(t.data_ptr())  # noqa: E731
    return map_leaves(td, fn, node_batch=lambda batch: [], device=None)


class Entries(TreeNode):
    """TensorDict's entry methods beyond get/set (a mixin): ``clear``, ``popitem``,
    ``setdefault``, ``del_``, ``get_at``, ``split_keys``, introspection (``dtype``, ``depth``,
    ``bytes``, ...) and ``auto_batch_size_``."""

    clear = clear
    popitem = popitem
    setdefault = setdefault
    del_ = del_
    create_nested = create_nested
    get_at = get_at
    get_item_shape = get_item_shape
    entry_class = entry_class
    filter_empty_ = filter_empty_
    separates = separates
    split_keys = split_keys
    rename_keys = rename_keys
    replace = replace
    is_contiguous = is_contiguous
    is_floating_point = is_floating_point
    param_count = param_count
    bytes = bytes_
    data_ptr = data_ptr

    @property
    def depth(self) -> int:
        """The number of levels of nested TensorDicts below this one (0 for a flat one).

        >>> import torch; from tensordict_rs import TensorDict
        >>> TensorDict({"a": {"b": {"c": torch.zeros(())}}}).depth
        2
        """
        return depth(self)

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype shared by every leaf, or None (different dtypes, or no leaf).

        >>> import torch; from tensordict_rs import TensorDict
        >>> TensorDict({"a": torch.zeros(2), "b": torch.zeros(2, dtype=torch.int64)}, [2]).dtype
        >>> TensorDict({"a": torch.zeros(2)}, [2]).dtype
        torch.float32
        """
        return dtype(self)

    @property
    def is_meta(self) -> bool:
        """True when the TensorDict's device is ``meta`` (False without a device).

        >>> import torch; from tensordict_rs import TensorDict
        >>> TensorDict({"a": torch.zeros(2)}, [2], device="meta").is_meta
        True
        """
        return self._device is not None and self._device.type == "meta"

    def auto_batch_size_(
        self, batch_dims: int | None = None, keep_compliant_size: bool = False
    ) -> Self:
        """Sets the batch size to the longest leading shape every entry shares (nested
        TensorDicts first), cut to ``batch_dims``; returns self.

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2, 3), "b": torch.zeros(2, 3, 4)})
        >>> td.auto_batch_size_().batch_size
        torch.Size([2, 3])
        """
        if keep_compliant_size and self.batch_size:
            return self
        _max_batch(self, batch_dims)
        return self
