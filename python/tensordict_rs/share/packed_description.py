"""The JSON description of a packed tree (see ``packed``) and the nested-tensor leaves it
carries as dense parts.

``spec`` turns a tree into the entries ``_native.describe_tree`` writes (the meta.json of
every node, nested nodes inlined), refusing a tree nested deeper than a receiver's parser
follows (``JSON_DEPTH``). A tree with nested leaves is described as a wrapper behind
``NESTED_MARK`` (``nested_description``): the nested leaves' parts (``nested_parts``, made by
``_core.nested.packed_parts``) lead the packed layout as ordinary dense leaves; a receiver
reads the list back (``nested_index``) and puts the leaves in once the data has arrived
(``unwrap``), after checking their parts. Every error about a received description is
``bad``'s ``InvalidTreeError``.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .. import _native
from .._core import nested as _nested
from .._core.dtypes import DTYPE_TO_STR, dtype_to_str
from .._core.nodes import NTD_TYPES, TD, TreeNode, _json_text
from .._core.nontensor import NonTensorStack
from ..memmap import _LazyLeaf

# the meta.json keys of a node, and the key serde_json (arbitrary_precision) gives a number's
# text: a receiver's parser would refuse a tree with it after the sender had sent it
RESERVED = (*_native.RESERVED_KEYS, _native.NUMBER_KEY)
# The first bytes of the description of a tree with nested leaves (``nested_description``).
NESTED_MARK = b"tdrs-nested 1\n"
# entry tags of describe_tree
LEAF, NODE, VALUE, STACK = _native.LEAF, _native.NODE, _native.NON_TENSOR, _native.STACK


class Parts:
    """The parts of one nested leaf, held as a node holds its leaves (``_get_str``), so that a
    plan's ``(node, key, value)`` leaves name them."""

    __slots__ = ("_tensordict",)

    def __init__(self, parts: dict[str, torch.Tensor]) -> None:
        self._tensordict = parts

    def _get_str(self, key: str) -> torch.Tensor:
        return self._tensordict[key]


# The parts of the nested leaves ``settle`` made from one buffer, by id of the leaf: a strided
# nested tensor keeps its own copy of its table of shapes, so the table's view of the buffer
# is found here (and a consolidated tree's plan finds every part where the buffer has it).
BUFFER_PARTS: dict[int, tuple[weakref.ref[Any], dict[str, Any], dict[str, torch.Tensor]]] = {}


def nested_parts(
    value: torch.Tensor, path: tuple[str, ...]
) -> tuple[tuple[str, ...], dict[str, Any], dict[str, torch.Tensor]]:
    entry = BUFFER_PARTS.get(id(value))
    if entry is not None and entry[0]() is value:
        return path, entry[1], entry[2]
    try:
        meta, parts = _nested.packed_parts(value)
    except NotImplementedError as e:
        raise _native.InvalidTreeError(
            f"key {'.'.join(path)!r} holds a nested tensor one message cannot carry: {e}"
        ) from None
    return path, meta, parts


def remember_parts(value: torch.Tensor, meta: dict[str, Any], parts: dict[str, Any]) -> None:
    key = id(value)

    def forget(_: Any, key: int = key, table: dict[int, Any] = BUFFER_PARTS) -> None:
        table.pop(key, None)

    BUFFER_PARTS[key] = (weakref.ref(value, forget), meta, parts)


# The JSON nesting a receiver parses (serde_json's limit: 128 levels of objects and arrays,
# the root object being one). A node ``k`` levels below the root lies at level ``k + 1``,
# its leaves' objects at ``k + 2`` and their shape lists at ``k + 3``.
JSON_DEPTH = _native.JSON_DEPTH


def json_depth(data: Any, limit: int) -> int:
    """Levels of lists and dicts in a JSON value (counted up to just past ``limit``)."""
    if limit < 0 or not isinstance(data, (list, tuple, dict)):
        return 0
    items = data.values() if isinstance(data, dict) else data
    return 1 + max((json_depth(v, limit - 1) for v in items), default=0)


def too_deep(path: tuple[str, ...], key: str) -> _native.InvalidTreeError:
    return _native.InvalidTreeError(
        f"key {'.'.join((*path, key))!r} is nested too deep for a tree description "
        f"({JSON_DEPTH} levels of JSON, a nested TensorDict one each, a leaf three): "
        "no rank could parse it"
    )


def real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def nested_description(
    root: TD, groups: list[tuple[tuple[str, ...], dict[str, Any], dict[str, Any]]]
) -> bytes:
    """The description of a tree with nested leaves: ``NESTED_MARK``, the JSON list of its
    nested leaves (key path, layout, ragged dim) and a line break, then the description of a
    wrapper tree (batch size ``[]``) whose node ``n`` holds the parts of nested leaf ``i``
    under node ``f"{i:09d}"`` and whose node ``t`` is the tree without its nested leaves.

    The parts are dense leaves, so the Rust parser checks their dtypes, shapes and sizes as
    any other's, and they lead the packed layout (``n`` sorts before ``t``); the mark makes
    the text no JSON, so that a receiver that predates it refuses it rather than build the
    wrapper."""
    device = None if root.device is None else str(root.device)
    names = DTYPE_TO_STR
    index: list[dict[str, Any]] = []
    holders: list[tuple[Any, ...]] = []
    for i, (path, meta, parts) in enumerate(groups):
        index.append({"key": list(path), **meta})
        entries: list[tuple[Any, ...]] = []
        for name in sorted(parts):
            t = parts[name]
            dtype = names.get(t.dtype) or dtype_to_str(t.dtype)
            entries.append((LEAF, name, dtype, t.shape, "cpu" if t.is_cpu else str(t.device)))
        holders.append((NODE, f"{i:09d}", ([], device, entries)))
    wrapper: tuple[Any, ...] = (
        [],
        device,
        [(NODE, "n", ([], device, holders)), (NODE, "t", spec(root, (), 1))],
    )
    text = json.dumps(index, ensure_ascii=False, separators=(",", ":")).encode()
    return NESTED_MARK + text + b"\n" + _native.describe_tree(wrapper)


def spec(td: TD, path: tuple[str, ...], base: int = 0) -> tuple[Any, ...]:
    """The ``describe_tree`` form of ``td``: entries in sorted-key order.

    Refuses a tree nested deeper than a receiver parses (``JSON_DEPTH``), so that the sender
    raises rather than a receiver after the whole message came."""
    entries: list[tuple[Any, ...]] = []
    level = len(path) + 1 + base  # of this node's JSON object (``base``: levels above the root)
    items = td._tensordict
    names = DTYPE_TO_STR
    for key in sorted(items):
        if key in RESERVED:
            raise _native.InvalidTreeError(
                f"key {'.'.join((*path, key))!r} is reserved by the meta.json format and "
                "cannot be sent with its description"
            )
        value = items[key]
        kind = type(value)
        if kind is NonTensorStack:
            data, shape = value.json_data(key)
            if level + 1 + json_depth(value.tolist(), JSON_DEPTH - level - 1) > JSON_DEPTH:
                raise too_deep(path, key)
            device = None if value.device is None else str(value.device)
            entries.append((STACK, key, value.stack_dim, device, data, shape))
            continue
        if level + 2 > JSON_DEPTH and kind not in NTD_TYPES:
            raise too_deep(path, key)  # a leaf (object and shape list) or a deeper node
        if kind is _LazyLeaf:
            name = names.get(value.dtype) or dtype_to_str(value.dtype)
            entries.append((LEAF, key, name, value.shape, "cpu"))
        elif kind in NTD_TYPES:
            text = _json_text(value.data, key)
            if level + 1 + json_depth(value.data, JSON_DEPTH - level - 1) > JSON_DEPTH:
                raise too_deep(path, key)
            entries.append((VALUE, key, text))
        elif isinstance(value, torch.Tensor):
            if value.is_nested:  # described apart (``nested_description``)
                continue
            dtype = value.dtype
            device = "cpu" if value.is_cpu else str(value.device)
            name = names.get(dtype) or dtype_to_str(dtype)
            entries.append((LEAF, key, name, value.shape, device))
        else:
            entries.append((NODE, key, spec(value, (*path, key), base)))
    return list(td.batch_size), None if td.device is None else str(td.device), entries


def node_classes(td: TD) -> list[type] | None:
    """The class of every node of ``td``, depth first with keys sorted (the order ``build``
    makes them in); None when every node is of the root's class, as ``build`` makes them. A
    tensorclass inside a TensorDict is a node of its own class, which the description does not
    carry: ``retype`` gives it back to the built tree."""
    out: list[type] = []

    def walk(node: TreeNode) -> None:
        out.append(type(node))
        children = [(k, v) for k, v in node._tensordict.items() if isinstance(v, TreeNode)]
        for _, child in sorted(children, key=_first):
            walk(child)

    walk(td)
    return None if all(c is out[0] for c in out) else out


def _first(pair: tuple[str, Any]) -> str:
    return pair[0]


def retype(td: TreeNode, classes: list[type]) -> None:
    """Gives the nodes of a tree ``build`` made the classes ``node_classes`` listed (the same
    node objects and dicts, so the tree's copy plan stays valid)."""
    at = iter(classes)

    def walk(node: TreeNode) -> None:
        cls = next(at, None)
        if not (isinstance(cls, type) and issubclass(cls, TreeNode)):
            raise bad("the node classes do not fit the tree")
        if type(node) is not cls:
            node.__class__ = cls
        items = node._tensordict
        for key in sorted(items):
            value = items[key]
            if isinstance(value, TreeNode):
                walk(value)

    walk(td)
    if next(at, None) is not None:
        raise bad("the node classes do not fit the tree")


def nested_index(text: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """The list of nested leaves of a ``nested_description`` and the wrapper's description."""
    head, sep, rest = text[len(NESTED_MARK) :].partition(b"\n")
    try:
        index = json.loads(head) if sep else None
    except ValueError:
        index = None
    if type(index) is not list or not all(
        type(e) is dict
        and type(e.get("key")) is list
        and e["key"]
        and all(type(k) is str for k in e["key"])
        for e in index
    ):
        raise bad("the list of nested leaves is not a JSON list of {key: [str, ...], ...}")
    return index, rest


def unwrap(wrapper: Any, index: list[dict[str, Any]]) -> tuple[Any, Callable[[], None]]:
    """The tree inside a ``nested_description``'s wrapper, and what puts its nested leaves in
    (checked, see ``_nested.from_packed_parts``) once the data has arrived."""
    items = wrapper._tensordict
    holders = items.get("n")
    td = items.get("t")
    if sorted(items) != ["n", "t"] or not is_node(holders) or not is_node(td):
        raise bad("a tree with nested leaves is a wrapper of nodes 'n' and 't'")
    names = [f"{i:09d}" for i in range(len(index))]
    if sorted(holders._tensordict) != names:
        raise bad(f"the nested leaves' parts are not {len(index)} nodes 0..{len(index) - 1}")
    places = []
    seen = set()
    for entry, name in zip(index, names, strict=True):
        path = tuple(entry["key"])
        key = ".".join(path)
        node = td
        for step in path[:-1]:
            node = node._tensordict.get(step)
            if not is_node(node):
                raise bad(f"nested leaf {key!r}: {step!r} is no node of the tree")
        if path[-1] in node._tensordict or path[-1] in RESERVED or path in seen:
            raise bad(f"nested leaf {key!r}: the key is taken or reserved")
        seen.add(path)
        holder = holders._tensordict[name]
        parts = holder._tensordict
        if not all(type(v) is _LazyLeaf or isinstance(v, torch.Tensor) for v in parts.values()):
            raise bad(f"nested leaf {key!r}: its parts are not all tensors")
        meta = {k: v for k, v in entry.items() if k != "key"}
        if tuple(sorted(parts)) not in _nested.part_names(meta):
            raise bad(f"nested leaf {key!r}: parts {sorted(parts)} do not match {meta}")
        places.append((node, path[-1], key, meta, holder))

    def settle() -> None:
        for node, name, key, meta, holder in places:
            parts = {k: holder._get_str(k) for k in holder._tensordict}
            try:
                value = _nested.from_packed_parts(meta, parts, tuple(node.batch_size), key)
            except ValueError as e:
                raise bad(str(e)) from None
            node._tensordict[name] = value
            remember_parts(value, meta, parts)

    return td, settle


def is_node(value: Any) -> bool:
    return (
        value is not None
        and type(value) is not _LazyLeaf
        and type(value) not in NTD_TYPES
        and type(value) is not NonTensorStack
        and not isinstance(value, torch.Tensor)
    )


def bad(why: str) -> _native.InvalidTreeError:
    return _native.InvalidTreeError(f"received tree description: {why}")
