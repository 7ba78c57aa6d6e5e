"""The repr of a live tree (``TensorDict.__repr__``): its entries as ``render.py`` draws them.

``TensorDict(batch_size=[10], device=cpu, fields={a: f32[], b: {c: f32[]}})``.
"""

from __future__ import annotations

from .nodes import NTD_TYPES, TreeNode
from .render import Node, render, short_name, sort_entries
from .unbatched import UnbatchedTensor


def _entry(td: TreeNode, key: str) -> Node:
    value = td._tensordict[key]
    if isinstance(value, TreeNode):
        extra = value.batch_size[td.batch_dims :]
        prefix = f"[{','.join(map(str, extra))}]" if extra else ""
        if type(value)._tensorclass is not None:  # a nested tensorclass: its class name
            prefix = type(value)._tensorclass.__name__ + prefix
        return prefix, _body(value)
    info = td._leaf_info(key)
    if info is None:
        value = td._tensordict[key]
        return type(value).__name__ if type(value) not in NTD_TYPES else type(value.data).__name__
    shape, dtype, device = info
    own = shape if type(value) is UnbatchedTensor else shape[td.batch_dims :]
    token = f"{short_name(dtype)}[{','.join(map(str, own))}]"
    if td.device is None and device.type != "cpu":
        token += f"@{device}"
    return token


def _body(td: TreeNode) -> list[tuple[str, Node]]:
    return sort_entries([(key, _entry(td, key)) for key in td._tensordict])


def compact_repr(td: TreeNode) -> str:
    """The one repr of a TensorDict (of any tree)."""
    return render(type(td).__name__, td.batch_size, td.device, _body(td))
