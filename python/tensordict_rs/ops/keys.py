"""Key operations: select, exclude, rename, flat and nested keys, dicts, empty trees, and the
key views of a tree (``keys``, ``values``, ``items``, ``in``, ``sorted_keys``).

New trees share the tensors of the source (no copy; lazy leaves stay lazy) and are unlocked,
as tensordict's ``select``/``exclude``/``flatten_keys`` results are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from .._core import dirty as _dirty
from .._core import nested as _nested
from .._core.classes import public
from .._core.index import is_key
from .._core.index import key_path as _path
from .._core.locking import locked_error
from .._core.nodes import NTD_TYPES, TD, Key, NonTensorData, TreeNode
from .._core.nontensor import NonTensorStack
from .._core.nontensor_options import list_to_stack
from .._core.unbatched import UnbatchedTensor
from .._core.walk import KEEP, KeyList, copy_tree, is_tree, walk_items
from .._core.walk import sorted_items as _sorted


def _missing(td: TD, key: str) -> KeyError:
    return KeyError(f'key "{key}" not found in TensorDict with keys {sorted(td._tensordict)}')


def _prune(td: TD, wanted: dict[str, Any], strict: bool) -> TD:
    """A tree of the entries of ``td`` named by the nested ``wanted`` ({key: sub-wanted|None})."""
    out = type(td)._new_unchecked(td.batch_size, td.device)
    out._names = td._names
    for key, sub in wanted.items():
        if key not in td._tensordict:
            if strict:
                raise _missing(td, key)
            continue
        value = td._tensordict[key]
        if sub is None:
            out._tensordict[key] = copy_tree(value) if is_tree(value) else _share(value)
        elif is_tree(value):
            out._tensordict[key] = _prune(value, sub, strict)
        elif strict:
            raise KeyError(f"{key!r} is a leaf, not a nested TensorDict")
    return out


def _share(value: Any) -> Any:
    return type(value)(value.data) if type(value) in NTD_TYPES else value


def _key_tree(keys: Iterable[Any]) -> dict[str, Any]:
    """Nested keys as a tree of dicts; None marks a whole entry."""
    tree: dict[str, Any] = {}
    for key in keys:
        path = _path(key)
        node = tree
        for part in path[:-1]:
            child = node.get(part, {})
            if child is None:  # the whole entry is already wanted
                break
            node = node.setdefault(part, child)
        else:
            node[path[-1]] = None
    return tree


def _flat_keys(keys: tuple[Any, ...]) -> list[Any]:
    if len(keys) == 1 and isinstance(keys[0], (list, set)):
        return list(keys[0])
    return list(keys)


def select(
    td: TD, *keys: Key, inplace: bool = False, strict: bool = True, as_tensordict: bool = False
) -> TD:
    """A TensorDict of only ``keys`` (nested keys keep their parents); ``strict``: KeyError for
    a missing key. ``inplace`` drops the other entries from ``td`` itself. ``as_tensordict``
    changes nothing for a TensorDict (a tensorclass then gives a plain TensorDict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.select("a")
    TensorDict(batch_size=[2], fields={a: f32[3]})
    """
    del as_tensordict  # already a TensorDict
    result = _prune(td, _key_tree(_flat_keys(keys)), strict)
    if not inplace:
        _dirty.view_of(td, result)  # the same leaves: its writes are the tree's
        return result
    if td._is_locked:
        raise locked_error()
    td._tensordict = result._tensordict
    return td


def exclude(td: TD, *keys: Key, inplace: bool = False) -> TD:
    """A TensorDict without ``keys`` (missing keys are ignored); ``inplace`` removes them from
    ``td`` itself.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.exclude(("b", "c"))
    TensorDict(batch_size=[2], fields={a: f32[3], b: {}})
    """
    target = td if inplace else copy_tree(td)
    if inplace and td._is_locked:
        raise locked_error()
    for key in _flat_keys(keys):
        path = _path(key)
        node: Any = target
        for part in path[:-1]:
            node = node._tensordict.get(part)
            if not is_tree(node):
                break
        else:
            node._tensordict.pop(path[-1], None)
    return target


def rename_key_(td: TD, old_key: Key, new_key: Key, safe: bool = False) -> TD:
    """Moves the entry at ``old_key`` to ``new_key``, in place; ``safe``: KeyError when
    ``new_key`` exists. Nested keys may move between nested TensorDicts.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> sorted(td.rename_key_("a", "obs").keys())
    ['b', 'obs']
    """
    if td._is_locked:
        raise locked_error()
    old, new = _path(old_key), _path(new_key)
    if safe and new_key in td:
        raise KeyError(f"key {new[-1] if len(new) == 1 else new} already present in TensorDict.")
    source = td._sub(old[:-1], create=False)
    if old[-1] not in source._tensordict:
        raise _missing(source, old[-1])
    value = source._tensordict.pop(old[-1])
    td._sub(new[:-1], create=True)._tensordict[new[-1]] = value
    return td


def flatten_keys(td: TD, separator: str = ".", inplace: bool = False, is_leaf: Any = None) -> TD:
    """Nested entries as top-level keys joined by ``separator`` (``("a", "b")`` -> ``"a.b"``);
    the dim names are kept, and an empty nested TensorDict leaves no key (as in tensordict).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> sorted(td.flatten_keys("/").keys())
    ['a', 'b/c']
    """
    out = type(td)._new_unchecked(td.batch_size, td.device)
    out._names = td._names
    _flatten_into(td, out, separator, "")
    if not inplace:
        return out
    if td._is_locked:
        raise locked_error()
    td._tensordict = out._tensordict
    return td


def _flatten_into(td: TD, out: TD, separator: str, prefix: str) -> None:
    for key, value in td._tensordict.items():
        name = prefix + key
        if is_tree(value):  # an empty one leaves no key, as in tensordict
            _flatten_into(value, out, separator, name + separator)
            continue
        if name in out._tensordict:
            raise KeyError(
                f"Flattening keys in tensordict causes keys {name!r} to collide (an entry and "
                "a nested entry both give this name)"
            )
        out._tensordict[name] = _share(value)


def unflatten_keys(td: TD, separator: str = ".", inplace: bool = False) -> TD:
    """Top-level keys that hold ``separator`` become nested entries (``"a.b"``: ``a``, ``b``).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"b.c": torch.ones(2)}, [2]).unflatten_keys(".")["b", "c"]
    tensor([1., 1.])
    """
    out = type(td)._new_unchecked(td.batch_size, td.device)
    out._names = td._names  # the new sub-trees get them too (``_sub``)
    items = out._tensordict
    dotted = []
    # as tensordict: the other keys stay where they are, each joined key then moves to its
    # path (into a sub-tree that exists, or a new one at the end) and never over an entry
    for key, value in td._tensordict.items():
        if separator in key:
            dotted.append((tuple(key.split(separator)), value))
        else:
            items[key] = copy_tree(value) if is_tree(value) else _share(value)
    for parts, value in dotted:
        try:
            node = out._sub(parts[:-1], create=True)
        except KeyError:  # a leaf where the joined key needs a sub-tree
            node = None
        if node is None or parts[-1] in node._tensordict:
            raise KeyError(
                "Unflattening key(s) in tensordict will override an existing for unflattened "
                f"key {parts}."
            )
        node._tensordict[parts[-1]] = copy_tree(value) if is_tree(value) else _share(value)
    if not inplace:
        return out
    if td._is_locked:
        raise locked_error()
    td._tensordict = out._tensordict
    return td


def to_dict(td: TD, *, retain_none: bool = True, convert_tensors: bool = False) -> dict:
    """Nested plain dicts: tensors as they are (or lists with ``convert_tensors``), non-tensor
    entries as their data (``None`` dropped unless ``retain_none``).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.to_dict()["b"]
    {'c': tensor([1., 1.])}
    """
    out: dict[str, Any] = {}
    for key in list(td._tensordict):
        value = td._get_str(key)
        if is_tree(value):
            out[key] = to_dict(value, retain_none=retain_none, convert_tensors=convert_tensors)
        elif type(value) in NTD_TYPES:
            if value.data is not None or retain_none:
                out[key] = value.data
        elif type(value) is NonTensorStack:
            out[key] = value.tolist()
        else:
            out[key] = value.tolist() if convert_tensors else value
    return out


def _max_batch(td: TD, batch_dims: int | None) -> None:
    """Sets each tree's batch size to the longest prefix its entries share (deepest first),
    as tensordict's ``auto_batch_size_``: an empty nested TensorDict does not limit it (after
    the first entry) and takes the new batch size if it has fewer dims; a tree with no
    entries only drops the dims past ``batch_dims``; a ragged (-1) dim ends the prefix."""
    data = [
        value
        for value in td._tensordict.values()
        if type(value) not in NTD_TYPES and type(value) is not UnbatchedTensor
    ]
    for value in data:
        if is_tree(value):
            _max_batch(value, batch_dims)
    if not data:
        if batch_dims:
            _set_batch(td, td._batch_size[:batch_dims])
        return
    shapes = [tuple(v.batch_size) if is_tree(v) else tuple(v.shape) for v in data]
    common: list[int] = []
    for dim, size in enumerate(shapes[0]):
        if size == -1:
            break
        if not all(
            (is_tree(value) and is_empty(value)) or (len(shape) > dim and shape[dim] == size)
            for value, shape in zip(data[1:], shapes[1:], strict=True)
        ):
            break
        if batch_dims is None or len(common) < batch_dims:
            common.append(size)
    _set_batch(td, torch.Size(common))


def _set_batch(td: TD, batch: torch.Size) -> None:
    """``td``'s batch size set to ``batch`` as tensordict's setter does for ``_max_batch``:
    names kept for the dims that remain, nested trees with fewer dims given ``batch``."""
    if td._names is not None:
        names = (list(td._names) + [None] * len(batch))[: len(batch)]
        td._names = names if any(n is not None for n in names) else None
    td._batch_size = batch
    for value in td._tensordict.values():
        if is_tree(value) and len(value.batch_size) < len(batch):
            _set_batch(value, batch)
            if td._names is not None:
                value._names = list(td._names)


def from_dict(
    cls: type[TD],
    input_dict: Any,
    *,
    auto_batch_size: bool | None = None,
    batch_size: Any = None,
    device: Any = None,
    batch_dims: int | None = None,
    names: Any = None,
) -> TD:
    """A TensorDict from a (nested) mapping. Without ``batch_size`` the batch size is ``[]``,
    or with ``auto_batch_size=True`` / ``batch_dims`` the longest leading shape the entries of
    each (nested) TensorDict share (cut to ``batch_dims``). With a batch size, a Python scalar
    is kept as non-tensor data, as tensordict does.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict.from_dict({"a": torch.zeros(3, 2), "b": {"c": torch.ones(3)}})
    TensorDict(batch_size=[], fields={a: f32[3,2], b: {c: f32[3]}})
    """
    if is_tree(input_dict):
        return input_dict
    if batch_dims is not None and batch_size is not None:
        raise ValueError("Cannot pass both batch_size and batch_dims to `from_dict`.")
    if batch_size is None:
        td = cls(input_dict, [], device, names=names)
        if auto_batch_size or batch_dims is not None:
            _max_batch(td, batch_dims)
        return td
    source = {
        key: NonTensorData(value)
        if isinstance(value, (bool, int, float)) and len(torch.Size(batch_size))
        else value
        for key, value in dict(input_dict).items()
    }
    return cls(source, batch_size, device, names=names)


def fromkeys(cls: type[TD], keys: Iterable[Key], value: Any = 0) -> TD:
    """A TensorDict (batch size ``[]``) with ``value`` (a 0-dim tensor) at every key.

    >>> from tensordict_rs import TensorDict
    >>> TensorDict.fromkeys(["a", "b"], 0)["a"]
    tensor(0)
    """
    td = cls({}, [])
    for key in keys:
        td.set(key, value)
    return td


def empty(
    td: TD,
    recurse: bool = False,
    *,
    batch_size: Any = None,
    device: Any = KEEP,
    names: Any = KEEP,
) -> TD:
    """A TensorDict with the batch size, device and dim names of ``td`` and no entries (with
    ``recurse``: empty nested TensorDicts and the non-tensor entries are kept).

    As tensordict: a new ``batch_size`` keeps the names of its leading dims (the new dims
    unnamed); ``names=`` gives the names (``names=None`` drops them, except with ``recurse``
    where it keeps them, as tensordict's).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.empty(recurse=True)
    TensorDict(batch_size=[2], fields={b: {}})
    """
    batch = td.batch_size if batch_size is None else torch.Size(batch_size)
    out = type(td)._new_unchecked(batch, td.device if device is KEEP else device)
    if recurse:
        for key, value in td._tensordict.items():
            if is_tree(value):
                out._tensordict[key] = empty(value, True)
            elif type(value) in NTD_TYPES or type(value) is NonTensorStack:
                out._tensordict[key] = value.clone(recurse=False)
    if names is KEEP or (names is None and recurse):
        kept = td._names
        if kept is not None and len(kept) != len(batch):
            kept = (list(kept) + [None] * len(batch))[: len(batch)]
        if kept is not None and any(n is not None for n in kept):
            out._names = list(kept)
    elif names is not None:
        given = (list(names) + [None] * len(batch))[: len(batch)]
        if any(n is not None for n in given):
            out._names = given
            for value in out._tensordict.values():  # nested trees: their leading dims
                if is_tree(value):
                    value._set_names([*given, *value.names[len(batch) :]])
    return out


def is_empty(td: TD) -> bool:
    """True when no entry (at any depth) is a tensor or non-tensor value.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2)}}, [2])
    >>> td.is_empty(), td.empty().is_empty()
    (False, True)
    """
    for value in td._tensordict.values():
        if not is_tree(value) or not is_empty(value):
            return False
    return True


def entry_pairs(source: Mapping[Any, Any] | None, kwargs: dict[str, Any]) -> list[tuple[Any, Any]]:
    """The entries a TensorDict is built from: a mapping or keyword entries (not both, as in
    tensordict); tuple (nested) keys after the others, in tensordict's order."""
    if source is not None and kwargs:
        raise ValueError("Either a dictionary or a sequence of kwargs must be provided, not both.")
    pairs = list(source.items()) if source is not None else list(kwargs.items())
    return [p for p in pairs if not isinstance(p[0], tuple)] + [
        p for p in pairs if isinstance(p[0], tuple)
    ]


def leaf_value(value: Any) -> Any:
    """A new entry as tensordict stores it: Python and NumPy scalars, NumPy arrays and lists
    of numbers (empty ones too) become tensors (a 0-dim tensor for a scalar), lists of
    tensors of one shape their stack; other lists a NonTensorStack (one value per row,
    nested lists of equal lengths as dims); other values NonTensorData."""
    if isinstance(value, (torch.Tensor, NonTensorData, NonTensorStack)):
        return value
    if isinstance(value, (bool, int, float, complex)):
        return torch.tensor(value)
    if type(value).__module__ == "numpy" and hasattr(value, "dtype"):
        return torch.as_tensor(value)
    if isinstance(value, (list, tuple)) and not value:
        # an empty 1-d tensor, as tensordict's (float64 for a tuple, which it reads via NumPy)
        return torch.tensor([], dtype=torch.float64 if type(value) is tuple else None)
    if isinstance(value, (list, tuple)):
        try:
            if all(isinstance(v, torch.Tensor) for v in value):
                return torch.stack(list(value))  # a list of tensors, as tensordict stacks it
            return torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            if type(value) is list and list_to_stack():
                return NonTensorStack.from_list(value)
            return NonTensorData(value)
    return NonTensorData(value)


# ---------------------------------------------------------------------- non-tensor entries

_MISSING: Any = object()


def set_non_tensor(td: TD, key: Any, value: Any) -> TD:
    """Stores ``value`` as one non-tensor value for every row (a list too: it is not split
    into rows, as ``td[key] = list`` does).

    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({}, [2]).set_non_tensor("tags", ["a", "b", "c"])
    >>> td.get_non_tensor("tags")
    ['a', 'b', 'c']
    """
    if isinstance(value, NonTensorStack):
        return td.set(key, value)
    data = value.data if type(value) in NTD_TYPES else value
    return td.set(key, NonTensorData(data))


def get_non_tensor(td: TD, key: Any, default: Any = _MISSING) -> Any:
    """The value of a non-tensor entry (a stack's values as a ``LinkedList``); a tensor entry
    is returned as it is, a missing key gives ``default`` (KeyError without one).

    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"s": "hello", "names": ["a", "b"]}, [2])
    >>> td.get_non_tensor("s"), td.get_non_tensor("names"), td.get_non_tensor("x", None)
    ('hello', LinkedList(['a', 'b']), None)
    """
    if default is _MISSING:
        value = td._entry(key)
    else:
        value = td.get(key, _MISSING)
        if value is _MISSING:
            return default
    if type(value) in NTD_TYPES:
        return value.data
    if type(value) is NonTensorStack:
        return value.tolist(as_linked_list=True)
    return value


def non_tensor_items(td: TD, include_nested: bool = False) -> list[tuple[Any, Any]]:
    """``(key, entry)`` for every ``NonTensorData`` and ``NonTensorStack`` entry.

    >>> from tensordict_rs import TensorDict
    >>> [key for key, _ in TensorDict({"s": "x", "n": {"t": "y"}}, []).non_tensor_items(True)]
    ['s', ('n', 't')]
    """
    return [
        (key, value)
        for key, value in td.items(include_nested=include_nested)
        if type(value) in NTD_TYPES or type(value) is NonTensorStack
    ]


def is_non_tensor(td: TD, key: Any) -> bool:
    """True when the entry at ``key`` is non-tensor data (a ``NonTensorData`` or a
    ``NonTensorStack``); KeyError when it is missing. Unlike the function ``is_non_tensor``,
    which checks a value, this checks the stored entry.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"obs": torch.zeros(4)}, []).set_non_tensor("label", "cat")
    >>> td.is_non_tensor("label"), td.is_non_tensor("obs")
    (True, False)
    """
    value = td._entry(key)
    return type(value) in NTD_TYPES or isinstance(value, NonTensorStack)


def filter_non_tensor_data(td: TD) -> TD:
    """A new TensorDict without the non-tensor entries (nested TensorDicts kept, even empty).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"x": torch.zeros(2), "s": "text"}, [2]).filter_non_tensor_data().keys()
    ['x']
    """
    return copy_tree(td, keep=lambda path: not _is_non_tensor_at(td, path))


def _is_non_tensor_at(td: Any, path: tuple[str, ...]) -> bool:
    for part in path[:-1]:
        td = td._tensordict[part]
    value = td._tensordict[path[-1]]
    return type(value) in NTD_TYPES or type(value) is NonTensorStack


def check_batch_size(td: TD, *, raise_exception: bool = True) -> bool:
    """Whether every entry's leading dims are the batch size, at every depth (tensordict's
    internal consistency check, which code written against it calls); a mismatch raises
    ``RuntimeError`` unless ``raise_exception=False``.

    >>> import torch; from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(3, 2)}, [3])._check_batch_size()
    True
    """
    batch = td._batch_size
    for key, value in td._tensordict.items():
        if isinstance(value, TreeNode):
            if not check_batch_size(value, raise_exception=raise_exception):
                return False
            shape: Any = value._batch_size
        elif type(value) is UnbatchedTensor:
            continue
        elif type(value) is NonTensorStack:
            shape = value.batch_size
        elif type(value) in NTD_TYPES:
            shape = batch
        else:
            shape = _nested.leaf_shape(value)
        if tuple(shape[: len(batch)]) != tuple(batch):
            if raise_exception:
                raise RuntimeError(
                    f"batch_size are incongruent, got value with shape {shape} for key "
                    f"{key!r}, -- expected {batch}"
                )
            return False
    return True


def has_non_tensor(td: TD) -> bool:
    """Whether a non-tensor entry is held at any depth (tensordict's internal
    ``_has_non_tensor``, which code written against it reads).

    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"n": {"s": "x"}})._has_non_tensor
    True
    """
    return any(
        type(v) in NTD_TYPES or type(v) is NonTensorStack
        for _, v in walk_items(td, True, False, materialize=False)
    )


# ---------------------------------------------------------------------- the key views


def keys(
    td: TD,
    include_nested: bool = False,
    leaves_only: bool = False,
    is_leaf: Callable[[type], bool] | None = None,
    *,
    sort: bool = False,
) -> list[Key]:
    """Entry keys in insertion order; nested keys are tuples with ``include_nested``.
    ``is_leaf(type)`` marks nested trees or non-tensor entries to take whole as leaves;
    ``sort`` orders the keys by their ``"."``-joined names (as tensordict).

    >>> import torch; from tensordict_rs import TensorDict
    >>> td = TensorDict({"b": {"c": torch.ones(2)}, "a": torch.zeros(2)}, [2])
    >>> td.keys(), td.keys(include_nested=True, leaves_only=True, sort=True)
    (['b', 'a'], ['a', ('b', 'c')])
    """
    if not (include_nested or leaves_only or sort):  # every key of this level
        return KeyList(td._tensordict)
    items = walk_items(td, include_nested, leaves_only, False, is_leaf=is_leaf)
    return KeyList(k for k, _ in _sorted(items, sort))


def values(
    td: TD,
    include_nested: bool = False,
    leaves_only: bool = False,
    is_leaf: Callable[[type], bool] | None = None,
    *,
    sort: bool = False,
) -> list[Any]:
    """Entry values, in the order of ``keys`` (the same arguments).

    >>> import torch; from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2), "b": {"c": torch.ones(2)}}, [2])
    >>> td.values(include_nested=True, leaves_only=True)
    [tensor([0., 0.]), tensor([1., 1.])]
    """
    items = walk_items(td, include_nested, leaves_only, is_leaf=is_leaf)
    return [public(v) for _, v in _sorted(items, sort)]


def items(
    td: TD,
    include_nested: bool = False,
    leaves_only: bool = False,
    is_leaf: Callable[[type], bool] | None = None,
    *,
    sort: bool = False,
) -> list[tuple[Key, Any]]:
    """``(key, value)`` pairs, in the order of ``keys`` (the same arguments).

    >>> import torch; from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2), "b": {"c": torch.ones(2)}}, [2])
    >>> [(key, value.tolist()) for key, value in td.items(True, leaves_only=True)]
    [('a', [0.0, 0.0]), (('b', 'c'), [1.0, 1.0])]
    """
    items = walk_items(td, include_nested, leaves_only, is_leaf=is_leaf)
    return [(k, public(v)) for k, v in _sorted(items, sort)]


def contains(td: TD, key: object) -> bool:
    if isinstance(key, str):
        return key in td._tensordict
    if isinstance(key, tuple) and is_key(key):
        try:
            td._entry(key)
        except KeyError:
            return False
        return True
    raise TypeError(f"keys are str or tuples of str, got {key!r}")


def sorted_keys(td: TD) -> list[str]:
    """The top-level keys, sorted.

    >>> import torch; from tensordict_rs import TensorDict
    >>> TensorDict({"b": torch.zeros(2), "a": torch.ones(2)}, [2]).sorted_keys
    ['a', 'b']
    """
    return sorted(td._tensordict)
