"""The compact repr of a TensorDict, as tensordict 0.15 prints it.

``TensorDict(batch_size=[10], device=cpu, fields={a: f32[], b: {c: f32[]}})``: shapes without
the batch dims, abbreviated dtypes, ``@device`` per entry only when the TensorDict has no device
and the entry is not on the CPU, one line when it fits in 80 columns, else one entry per line.
This module does not import torch: the command line renders saved trees with it too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..tensordict import TensorDict

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


def _entry(td: TensorDict, key: str) -> Node:
    from ..tensordict import TensorDict

    value = td._tensordict[key]
    if isinstance(value, TensorDict):
        extra = value.batch_size[td.batch_dims :]
        prefix = f"[{','.join(map(str, extra))}]" if extra else ""
        return prefix, _body(value)
    info = td._leaf_info(key)
    if info is None:
        return type(td._tensordict[key].data).__name__
    shape, dtype, device = info
    token = f"{short_name(dtype)}[{','.join(map(str, shape[td.batch_dims :]))}]"
    if td.device is None and device.type != "cpu":
        token += f"@{device}"
    return token


def _body(td: TensorDict) -> list[tuple[str, Node]]:
    return sort_entries([(key, _entry(td, key)) for key in td._tensordict])


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


def compact_repr(td: TensorDict) -> str:
    """The one repr of a TensorDict."""
    return render(type(td).__name__, td.batch_size, td.device, _body(td))


def render(name: str, batch_size: Any, device: Any, body: list[tuple[str, Node]]) -> str:
    """The repr of a tree given as sorted ``(key, node)`` entries (see ``sort_entries``)."""
    header = [f"batch_size=[{','.join(map(str, batch_size))}]"]
    if device is not None:
        header.append(f"device={device}")
    head = f"{name}(" + "".join(f"{h}, " for h in header) + "fields="
    return head + _render(("", body), "", len(head), 1) + ")"
