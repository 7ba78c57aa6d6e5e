"""``tensordict-rs info DIR``: what a saved directory holds, from its meta.json files alone.

No torch import and no data file opened: the Rust core reads and validates every meta.json
and renders the report (``_native.tree_report``, used by the command line: one call, so that a
10,000-leaf directory prints in well under 100 ms, interpreter start included).
``summarize`` gives the same tree as Python objects (``_native.tree_summary``), with its
compact repr and totals.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

from .. import _native

if TYPE_CHECKING:
    from .._core.render import Node

LEAF, NODE, NON_TENSOR = _native.LEAF, _native.NODE, _native.NON_TENSOR


class Summary:
    """One TensorDict directory: its batch size, device, format version, entries and totals.

    ``entries`` are the core's tuples: ``(0, key, dtype, shape, nbytes)`` for a tensor,
    ``(1, key, Summary)`` for a sub-tree, ``(2, key, value)`` for a JSON value.
    """

    __slots__ = (
        "batch_size",
        "device",
        "entries",
        "format_version",
        "leaves",
        "nbytes",
        "sub_trees",
    )

    def __init__(self, node: Any) -> None:
        import json

        batch, self.device, self.format_version, raw = node
        self.batch_size: list[int] = list(batch)
        self.entries: list[tuple[Any, ...]] = []
        self.nbytes = self.leaves = self.sub_trees = 0
        for entry in raw:
            tag = entry[0]
            if tag == LEAF:
                self.entries.append(entry)
                self.nbytes += entry[4]
                self.leaves += 1
            elif tag == NODE:
                sub = Summary(entry[2])
                self.entries.append((NODE, entry[1], sub))
                self.nbytes += sub.nbytes
                self.leaves += sub.leaves
                self.sub_trees += sub.sub_trees + 1
            else:
                self.entries.append((NON_TENSOR, entry[1], json.loads(entry[2])))

    def get(self, key: str) -> Any:
        """The entry of ``key``: a ``Summary``, a ``(dtype, shape, nbytes)`` tuple or a value."""
        for entry in self.entries:
            if entry[1] == key:
                return entry[2] if entry[0] != LEAF else (entry[2], list(entry[3]), entry[4])
        raise KeyError(key)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of this tree (every entry, with its kind and sizes)."""
        entries: dict[str, Any] = {}
        for entry in self.entries:
            tag, key = entry[0], entry[1]
            if tag == LEAF:
                entries[key] = {
                    "kind": "tensor",
                    "dtype": entry[2],
                    "shape": entry[3],
                    "nbytes": entry[4],
                }
            elif tag == NODE:
                entries[key] = entry[2].to_json()
            else:
                entries[key] = {"kind": "non_tensor", "value": entry[2]}
        return {
            "kind": "tensordict",
            "batch_size": self.batch_size,
            "device": self.device,
            "format_version": self.format_version,
            "nbytes": self.nbytes,
            "leaves": self.leaves,
            "sub_trees": self.sub_trees,
            "entries": entries,
        }


def summarize(prefix: str | os.PathLike[str]) -> Summary:
    """Reads the tree at ``prefix`` (meta.json files only, validated as the loader does).

    >>> import tempfile, torch, tensordict_rs
    >>> d = tempfile.mkdtemp()
    >>> _ = tensordict_rs.TensorDict({"a": torch.zeros(4, 3)}, [4]).memmap(d + "/td")
    >>> s = summarize(d + "/td")
    >>> (s.leaves, s.nbytes, s.get("a"))
    (1, 48, ('torch.float32', [4, 3], 48))
    """
    return Summary(_native.tree_summary(os.fspath(prefix)))


_SHORT: dict[str, str] = {}


def _short(dtype: str) -> str:
    """``short_name`` of a dtype string, cached (a tree has few dtypes and many leaves)."""
    name = _SHORT.get(dtype)
    if name is None:
        from .._core.render import short_name

        name = _SHORT[dtype] = short_name(dtype)
    return name


def _repr_node(node: Summary) -> list[tuple[str, Node]]:
    from .._core.render import sort_entries

    dims = len(node.batch_size)
    body: list[tuple[str, Node]] = []
    for entry in node.entries:
        tag, key = entry[0], entry[1]
        if tag == LEAF:
            body.append((key, f"{_short(entry[2])}[{','.join(map(str, entry[3][dims:]))}]"))
        elif tag == NODE:
            extra = entry[2].batch_size[dims:]
            prefix = f"[{','.join(map(str, extra))}]" if extra else ""
            body.append((key, (prefix, _repr_node(entry[2]))))
        else:
            body.append((key, type(entry[2]).__name__))
    return sort_entries(body)


def compact_repr(summary: Summary) -> str:
    """The repr that ``TensorDict.load_memmap`` of this directory prints.

    >>> import tempfile, torch, tensordict_rs
    >>> d = tempfile.mkdtemp()
    >>> td = tensordict_rs.TensorDict({"a": torch.zeros(4, 3), "b": {"c": torch.ones(4)}}, [4])
    >>> _ = td.memmap(d + "/td")
    >>> compact_repr(summarize(d + "/td"))
    'TensorDict(batch_size=[4], device=cpu, fields={a: f32[3], b: {c: f32[]}})'
    """
    from .._core.render import render

    return render("TensorDict", summary.batch_size, summary.device, _repr_node(summary))


@functools.lru_cache(maxsize=1024)
def human_bytes(n: int) -> str:
    """``1536`` -> ``'1.5 KiB'``; sizes below 1 KiB in bytes.

    >>> human_bytes(1536), human_bytes(100), human_bytes(3 << 30)
    ('1.5 KiB', '100 B', '3.0 GiB')
    """
    if n < 1024:
        return f"{n} B"
    size, units = n / 1024, ["KiB", "MiB", "GiB", "TiB", "PiB"]
    while size >= 1024 and len(units) > 1:
        size /= 1024
        units.pop(0)
    return f"{size:.1f} {units[0]}"


def report(path: str | os.PathLike[str], as_json: bool = False) -> str:
    """The ``info`` report of a directory or ``.tdz`` archive, rendered by the Rust core.

    Text: the path, the compact repr, the totals, then one row per entry (size, dtype, shape,
    name). JSON (``as_json``): ``path`` (absolute), ``repr``, ``format_version``, ``nbytes``,
    ``leaves``, ``sub_trees`` and ``tree``. Both come from one native call that reads the
    meta.json files with the GIL released; nothing is rendered per leaf in Python.

    >>> import json, tempfile, torch, tensordict_rs
    >>> d = tempfile.mkdtemp()
    >>> _ = tensordict_rs.TensorDict({"a": torch.zeros(4, 3)}, [4]).memmap(d + "/td")
    >>> print(report(d + "/td").splitlines()[-1])
      48 B  float32  [4, 3]  a
    >>> json.loads(report(d + "/td", as_json=True))["tree"]["entries"]["a"]["nbytes"]
    48
    """
    text = os.fspath(path)
    shown = os.path.abspath(text) if as_json else text
    return _native.tree_report(text, shown, json=as_json)
