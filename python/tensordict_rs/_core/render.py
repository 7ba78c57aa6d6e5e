"""The compact repr of a tree, as tensordict 0.15 prints it: the rendering of its entries.

``TensorDict(batch_size=[10], device=cpu, fields={a: f32[], b: {c: f32[]}})``: shapes without
the batch dims, abbreviated dtypes, ``@device`` per entry only when the TensorDict has no device
and the entry is not on the CPU, one line when it fits in 80 columns, else one entry per line.
This module does not import torch: the command line renders saved trees with it too
(``cli/info.py``), and ``repr.py`` renders live trees.
"""

from __future__ import annotations

from typing import Any

WIDTH = 80
Node = str | tuple[str, list[tuple[str, Any]]]
_SHORT = {"float": "f", "uint": "u", "int": "i", "complex": "c"}


def short_name(dtype: Any) -> str:
    """The abbreviation of the compact repr (f32, i64, u8, c64, bf16, bool) of a torch dtype or
    of its meta.json string (``"torch.float32"``)."""
    name = str(dtype).replace("torch.", "")
    for long, short in _SHORT.items():
        name = name.replace(long, short)
    return name


def sort_entries(entries: list[tuple[str, Node]]) -> list[tuple[str, Node]]:
    """The entries of one level in the repr's order (by their flat text)."""
    entries.sort(key=lambda e: f"{e[0]}: {_flat(e[1])}")
    return entries


def _flat(node: Node) -> str:
    if isinstance(node, str):
        return node
    prefix, entries = node
    return prefix + "{" + ", ".join(f"{k}: {_flat(v)}" for k, v in entries) + "}"


def _render(node: Node, indent: str, used: int, tail: int) -> str:
    flat = _flat(node)
    if isinstance(node, str) or not node[1] or used + len(flat) + tail <= WIDTH:
        return flat
    prefix, entries = node
    pad = indent + "    "
    lines = []
    for i, (key, value) in enumerate(entries):
        if isinstance(value, str):  # a leaf: always its flat text (the common case, kept cheap)
            lines.append(f"{pad}{key}: {value}")
            continue
        value_tail = tail + 1 if i == len(entries) - 1 else 1
        lines.append(f"{pad}{key}: {_render(value, pad, len(pad) + len(key) + 2, value_tail)}")
    return prefix + "{\n" + ",\n".join(lines) + "}"


def render(name: str, batch_size: Any, device: Any, body: list[tuple[str, Node]]) -> str:
    """The repr of a tree given as sorted ``(key, node)`` entries (see ``sort_entries``)."""
    header = [f"batch_size=[{','.join(map(str, batch_size))}]"]
    if device is not None:
        header.append(f"device={device}")
    head = f"{name}(" + "".join(f"{h}, " for h in header) + "fields="
    return head + _render(("", body), "", len(head), 1) + ")"
