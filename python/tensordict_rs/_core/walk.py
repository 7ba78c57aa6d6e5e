"""The one tree walker: every TensorDict operation that maps leaves goes through here.

A tree holds four kinds of entries: nested trees (``TreeNode``), tensors, lazy leaves
(``_LazyLeaf``: a mapped leaf whose tensor is made on first access) and ``NonTensorData``.
``map_leaves`` knows all four, the batch sizes of nested trees, and the device and lock of the
result; an operation is then a function of one leaf. New trees are made with ``type(td)``, so
no module that walks trees imports ``tensordict.py``.

Leaf functions see tensors whose leading dims are the batch dims of the ROOT tree (a nested
tree's extra batch dims come after them, like a leaf's own dims), so one function serves every
depth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from . import dirty as _dirty
from . import nested as _nested
from .index import is_key, key_path
from .nodes import NTD_TYPES, TD, TreeNode
from .nontensor import NonTensorStack
from .unbatched import UnbatchedTensor, with_batch_size

_TENSOR = torch.Tensor

KEEP: Any = object()  # "the source tree's" (device; names when the batch dims stay as many)
LeafFn = Callable[..., Any]


def is_tree(value: Any) -> bool:
    """True for a TensorDict (of any subclass)."""
    return isinstance(value, TreeNode)


def other_entry(other: Any, key: str) -> Any:
    """The entry of ``other`` at ``key`` when it is a tree (or mapping), else ``other`` itself.

    Scalars and tensors given beside trees are broadcast to every leaf.
    """
    if isinstance(other, TreeNode):
        if key not in other._tensordict:
            raise KeyError(
                f'key "{key}" not found in the other TensorDict, which has keys '
                f"{sorted(other._tensordict)}"
            )
        return other._get_str(key)
    if isinstance(other, dict):
        if key not in other:
            raise KeyError(f'key "{key}" not found in the other mapping')
        return other[key]
    return other


def map_leaves(
    td: TD,
    fn: LeafFn,
    *others: Any,
    batch_size: Any = None,
    device: Any = KEEP,
    inplace: bool = False,
    check: bool = False,
    lock: bool = False,
    non_tensor: LeafFn | None = None,
    moves_rows: bool = False,
    node_batch: Callable[[torch.Size], Any] | None = None,
    node_dims: bool = False,
    names: Any = KEEP,
    unbatched: LeafFn | None = None,
    rows: Any = _dirty.ALL,
) -> TD:
    """A new tree of ``fn(leaf, *other_leaves)`` for every tensor leaf of ``td``.

    ``others`` are walked together with ``td`` (trees: the entry at the same key; anything else
    is passed to every call). A ``None`` result leaves the key out. ``batch_size`` is the
    result's (default: ``td``'s); nested trees keep their extra batch dims after it. ``device``
    is the result's device (default ``td``'s). ``check`` moves results to that device and
    checks them against the batch size (for user functions). ``lock`` locks the result when
    ``td`` is locked. ``non_tensor(value, *others)`` maps the non-tensor entries
    (``NonTensorData`` and ``NonTensorStack``, their batch sizes set; default: a copy).
    ``moves_rows`` says that ``fn`` only moves elements (an index, a shape operation): a
    ``NonTensorStack`` then moves its values the same way (``fn`` runs on its positions).
    With ``inplace`` the results are copied into ``td``'s leaves and ``td`` is returned.
    ``node_batch(batch_size)`` is the batch-size rule of the operation, applied to every node
    (the root and each nested tree, from its own batch size): it replaces ``batch_size`` for
    operations whose nested results do not keep their extra batch dims (reductions).
    With ``node_dims`` the leaf function gets the batch dims of the tree that holds the leaf
    as ``fn(leaf, *others, node_dims=n)`` (operations over a leaf's own dims: ``"feature"``).
    ``names`` are the names of the result's batch dims (a list, or None for unnamed); by
    default the source's when the result has as many batch dims (element-wise operations,
    slices, ``cat``...), else unnamed. Nested trees keep the names of their own extra dims.
    An ``UnbatchedTensor`` entry stays whole (an alias with the result's batch size) when the
    operation moves rows or changes the batch size, and goes through ``fn`` otherwise;
    ``unbatched(value, *others)`` replaces that rule (``stack`` keeps the first one).
    A result that views ``td``'s memory (an index, a shape operation, ``detach``) reports its
    writes to ``td``'s dirty map: as the rows ``rows`` of ``td`` (a slice; default all of them),
    or row for row when the batch size stays and ``fn`` moves no rows.
    """
    if inplace:
        for leaf, *rest in list(zip_leaves(td, *others)):
            result = fn(leaf, *rest)
            if result is not None and result is not leaf:
                leaf.copy_(result)
        return td
    if node_batch is not None:
        batch = torch.Size(node_batch(td._batch_size))
    else:
        batch = td._batch_size if batch_size is None else torch.Size(batch_size)
    target = td._device if device is KEEP else device
    if non_tensor is None and moves_rows:
        non_tensor = _moved(fn)
    if node_dims:
        base_fn = fn
        fn = _NodeDims(base_fn)
    if names is KEEP:
        names = td._names if len(batch) == len(td._batch_size) else None
    out = _map(
        td,
        fn,
        others,
        batch,
        target,
        check,
        non_tensor,
        moves_rows,
        td.batch_dims,
        node_batch,
        names,
        unbatched,
    )
    if lock and td._is_locked:
        out._lock_tree()
    if td._tracker is not None and _dirty.shares_memory(td, out):
        same = batch == td._batch_size and not moves_rows
        _dirty.view_of(td, out, None if same else rows)
    return out


def _map(
    td: TD,
    fn: LeafFn,
    others: tuple[Any, ...],
    batch: torch.Size,
    device: torch.device | None,
    check: bool,
    non_tensor: LeafFn | None,
    moves: bool = False,
    root_dims: int = 0,
    node_batch: Callable[[torch.Size], Any] | None = None,
    names: list[Any] | None = None,
    unbatched: LeafFn | None = None,
) -> TD:
    out = type(td)._new_unchecked(batch, device)
    if names is not None and any(n is not None for n in names):
        out._names = list(names)
    items = out._tensordict
    dims = td.batch_dims
    if type(fn) is _NodeDims:
        fn = fn.at(dims)
    for key in list(td._tensordict):
        value = td._get_str(key)
        rest = [other_entry(o, key) for o in others]
        if isinstance(value, TreeNode):
            if node_batch is None:
                sub = torch.Size([*batch, *value._batch_size[dims:]])
            else:
                sub = torch.Size(node_batch(value._batch_size))
            extra = len(sub) - len(batch)
            own = value._names[len(value._names) - extra :] if value._names and extra > 0 else []
            sub_names = None
            if out._names is not None or any(n is not None for n in own):
                sub_names = [
                    *(out._names or [None] * len(batch)),
                    *own,
                    *[None] * (extra - len(own)),
                ]
                sub_names = sub_names[: len(sub)]
            items[key] = _map(
                value,
                fn,
                tuple(rest),
                sub,
                device,
                check,
                non_tensor,
                moves,
                root_dims,
                node_batch,
                sub_names,
                unbatched,
            )
        elif type(value) in NTD_TYPES or type(value) is NonTensorStack:
            if non_tensor is None:
                data = value.clone(recurse=False)
            else:
                if type(value) in NTD_TYPES:
                    value.batch_size, value.device = td._batch_size, td._device
                for o, r in zip(others, rest, strict=True):
                    if type(r) in NTD_TYPES and isinstance(o, TreeNode):
                        r.batch_size, r.device = o._batch_size, o._device
                data = non_tensor(value, *rest)
            if data is not None:
                items[key] = data
        elif type(value) is UnbatchedTensor:
            if unbatched is not None:
                got = unbatched(value, *rest)
                if got is not None:  # None leaves the key out, as ``fn``'s
                    items[key] = with_batch_size(got, batch)
                continue
            if moves or node_batch is not None or batch != td._batch_size:
                # a shape operation: the payload stays whole, the batch size is the result's
                items[key] = with_batch_size(value, batch)
                continue
            result = fn(value, *rest)
            if result is not None:
                items[key] = UnbatchedTensor(result, batch)
        else:
            if moves and value.is_nested:
                result = _nested.moved(fn, value, root_dims)
            else:
                result = fn(value, *rest)
            if result is None:
                continue
            if check:
                if device is not None and result.device != device:
                    result = result.to(device)
                out._check_batch(key, _nested.leaf_shape(result))
            items[key] = result
    return out


def _moved(fn: LeafFn) -> LeafFn:
    """The non-tensor map of a row-moving ``fn``: a stack's values move as its elements would;
    a NonTensorData keeps its value (its batch size is its tree's)."""

    def move(value: Any, *_: Any) -> Any:
        if type(value) is NonTensorStack:
            return value.apply_positions(fn)
        return type(value)(value.data)  # a MetaData stays one

    return move


class _NodeDims:
    """A leaf function that wants the batch dims of the node holding each leaf."""

    __slots__ = ("dims", "fn")

    def __init__(self, fn: LeafFn, dims: int = -1) -> None:
        self.fn, self.dims = fn, dims

    def at(self, dims: int) -> _NodeDims:
        return _NodeDims(self.fn, dims)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args, node_dims=self.dims)


def zip_leaves(td: TreeNode, *others: Any) -> Iterator[tuple[Any, ...]]:
    """Each tensor leaf of ``td`` with the entries at the same key in ``others``."""
    for key in list(td._tensordict):
        value = td._get_str(key)
        rest = [other_entry(o, key) for o in others]
        if isinstance(value, TreeNode):
            yield from zip_leaves(value, *rest)
        elif isinstance(value, torch.Tensor):
            yield (value, *rest)


def leaves(td: TreeNode) -> Iterator[tuple[Any, str, torch.Tensor]]:
    """``(tree, key, tensor)`` for every tensor leaf, depth first (lazy leaves are made)."""
    for key in list(td._tensordict):
        value = td._get_str(key)
        if isinstance(value, TreeNode):
            yield from leaves(value)
        elif isinstance(value, torch.Tensor):
            yield td, key, value


class KeyList(list[Any]):
    """The list ``keys()`` returns: ``in`` works as on tensordict's key views (a 1-tuple is
    its str; anything but str and tuples of str raises TypeError)."""

    def __contains__(self, key: object) -> bool:
        if isinstance(key, tuple):
            if not is_key(key):
                raise TypeError("TensorDict keys are always strings.")
            key = key_path(key)  # nested tuples unravelled, as tensordict's unravel_key
            if len(key) == 1:
                key = key[0]
        elif not isinstance(key, str):
            raise TypeError(
                "TensorDict keys are always strings. Membership checks are only supported for "
                "strings or non-empty tuples of strings (for nested TensorDicts)"
            )
        return list.__contains__(self, key)


def sorted_items(items: Iterable[tuple[Any, Any]], sort: bool) -> Iterable[tuple[Any, Any]]:
    """``items`` as they come, or with ``sort`` ordered by key, a nested key by its
    ``"."``-joined name (tensordict's ``sort=`` of ``keys``, ``values`` and ``items``)."""
    if not sort:
        return items
    return sorted(items, key=lambda kv: ".".join(kv[0]) if isinstance(kv[0], tuple) else kv[0])


def walk_items(
    td: TreeNode,
    nested: bool,
    leaves_only: bool,
    materialize: bool = True,
    prefix: tuple[str, ...] = (),
    is_leaf: Callable[[type], bool] | None = None,
) -> Iterator[tuple[Any, Any]]:
    """``(key, value)`` pairs in tensordict's order: a nested tree comes after its own entries.

    Keys are str at the top level and tuples below. As in tensordict, a non-tensor entry is
    not a leaf (``leaves_only`` leaves it out) and comes as its ``NonTensorData``. With
    ``is_leaf``, a nested tree or non-tensor entry whose type it accepts is a leaf: yielded
    whole (with ``leaves_only`` too), never entered (tensordict's ``is_leaf=`` of ``keys``).
    """
    items = td._tensordict
    for key in list(items):
        value = items[key]
        if type(value) is _TENSOR:  # the common leaf: nothing to check or make
            yield ((*prefix, key) if prefix else key), value
            continue
        if materialize:
            value = td._get_str(key)
        full: Any = (*prefix, key) if prefix else key
        if is_leaf is not None and not isinstance(value, torch.Tensor) and is_leaf(type(value)):
            if type(value) in NTD_TYPES:
                value.batch_size, value.device = td._batch_size, td._device
            yield full, value
        elif isinstance(value, TreeNode):
            if nested:
                yield from walk_items(
                    value, nested, leaves_only, materialize, (*prefix, key), is_leaf
                )
            if not leaves_only:
                yield full, value
        elif type(value) in NTD_TYPES:
            if not leaves_only:
                value.batch_size, value.device = td._batch_size, td._device
                yield full, value
        elif type(value) is NonTensorStack:
            if not leaves_only:
                yield full, value
        else:
            yield full, value


def copy_tree(td: TD, keep: Callable[[tuple[str, ...]], bool] | None = None) -> TD:
    """A new tree of the same entries (tensors and lazy leaves shared, not copied).

    ``keep(path)`` chooses which leaves and NonTensorData stay; nested trees are always kept.
    """
    out = _copy(td, keep, ())
    _dirty.view_of(td, out)  # the same leaves, the same rows
    return out


def _copy(td: TD, keep: Callable[[tuple[str, ...]], bool] | None, prefix: tuple[str, ...]) -> TD:
    out = type(td)._new_unchecked(td._batch_size, td._device)
    out._names = td._names
    items = out._tensordict
    for key, value in td._tensordict.items():
        path = (*prefix, key)
        if isinstance(value, TreeNode):
            items[key] = _copy(value, keep, path)
        elif keep is None or keep(path):
            items[key] = type(value)(value.data) if type(value) in NTD_TYPES else value
    return out


def unbatched_key(td: TreeNode, prefix: tuple[str, ...] = ()) -> Any:
    """The key of the first ``UnbatchedTensor`` entry of ``td`` (a str at the top level, a
    tuple below), None when it holds none; lazy leaves are not made."""
    for key, value in td._tensordict.items():
        if type(value) is UnbatchedTensor:
            return (*prefix, key) if prefix else key
        if isinstance(value, TreeNode):
            found = unbatched_key(value, (*prefix, key))
            if found is not None:
                return found
    return None


def refuse_unbatched(td: TreeNode, what: str) -> None:
    """Raises tensordict's ``NotImplementedError`` when ``td`` holds an ``UnbatchedTensor``
    (``what``: "memory-mapped", "consolidated"): the formats have no record of one."""
    key = unbatched_key(td)
    if key is not None:
        hint = ""
        if what == "memory-mapped":
            hint = f" Exclude it first, e.g. with td.exclude({key!r})."
        raise NotImplementedError(
            f"UnbatchedTensor entries cannot be {what} yet, but {key!r} is one.{hint}"
        )
