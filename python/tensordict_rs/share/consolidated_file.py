"""``consolidate(filename=...)`` and ``from_consolidated(filename)``: a tree in one file, in
the reference's single-file layout.

The file is ``[leaves][JSON][8-byte little-endian JSON length]``. The JSON is tensordict's:
per node ``{"cls", "non_tensors": {key: [value, batch_size, device]}, "leaves": {key: [dtype,
shape, start, stop, pad]}, "cls_metadata": {"device", "names", "batch_size", "is_locked"}}``
with each nested node under its key; a ``NonTensorStack`` is a node ``{"cls":
"NonTensorStack", "non_tensors": {"0": [value, [], device], ...}}`` (one more such node per
element for each dim past the first). The leaves are written in this package's packed layout
(depth-first, sorted keys, 64-byte aligned offsets) by the Rust core, straight into the mapped
file, so the tree made from the file is consolidated (one buffer, sent without a copy). Files
written by tensordict (insertion order, 8-byte alignment) are read too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from .. import _native
from .._core.dtypes import DTYPE_TO_STR, STR_TO_DTYPE
from .._core.nodes import NTD_TYPES, TD, NonTensorData, TreeNode
from .._core.nontensor import NonTensorStack
from . import packed as _packed
from . import packed_description as _desc

_RESERVED = ("cls", "non_tensors", "leaves", "cls_metadata", "size")


def _metadata(td: Any, offsets: dict[tuple[int, str], tuple[int, int]]) -> dict[str, Any]:
    node: dict[str, Any] = {"cls": "TensorDict", "non_tensors": {}, "leaves": {}}
    nested = {}
    for key in td._tensordict:
        if key in _RESERVED:
            raise ValueError(
                f"consolidate(filename=...): the key {key!r} is reserved by the file's JSON "
                "layout (tensordict's)"
            )
        value = td._tensordict[key]
        if type(value) in NTD_TYPES:
            device = None if td.device is None else str(td.device)
            node["non_tensors"][key] = [value.data, list(td.batch_size), device]
        elif type(value) is NonTensorStack:
            device = None if value.device is None else str(value.device)
            nested[key] = _stack_node(value.tolist(), len(value.batch_size), device)
            nested[key]["cls_metadata"]["stack_dim"] = value.stack_dim
        elif isinstance(value, TreeNode):
            nested[key] = _metadata(value, offsets)
        else:
            start, nbytes = offsets[(id(td), key)]
            dtype = value.dtype
            shape = list(value.shape)
            node["leaves"][key] = [DTYPE_TO_STR[dtype], shape, start, start + nbytes, 0]
    node["cls_metadata"] = {
        "device": None if td.device is None else str(td.device),
        "names": [None] * td.batch_dims,
        "batch_size": list(td.batch_size),
        "is_locked": bool(td.is_locked),
    }
    node.update(nested)
    return node


def consolidate_to_file(td: TD, filename: str | os.PathLike[str]) -> TD:
    """Writes ``td`` to ``filename`` in the single-file layout and returns the tree of views of
    the (shared) mapped file, consolidated and locked."""
    plan = _packed.plan(td)
    if plan.groups:
        raise _native.InvalidTreeError(
            f"key {'.'.join(plan.groups[0][0])!r} holds a nested tensor: consolidate(filename="
            "...) writes tensordict's single-file layout, which this library writes for dense "
            "leaves only; consolidate() without a file, or memmap_/save, keep nested leaves"
        )
    total = plan.total
    offsets = {
        (id(plan.node(node)), key): (
            offset,
            value.nbytes if isinstance(value, torch.Tensor) else value.buffer.nbytes,
        )
        for (node, key, value), offset in zip(plan.leaves, plan.offsets, strict=True)
    }
    blob = json.dumps(_metadata(td, offsets)).encode()
    size = total + len(blob) + 8
    path = Path(filename)
    with open(path, "wb") as f:
        f.truncate(size)
    buffer = _native.open_file(os.fspath(path.absolute()), size)
    whole = torch.frombuffer(buffer, dtype=torch.uint8)
    if total:
        plan.pack_range(whole[:total], 0, total)
    whole[total : total + len(blob)].copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
    whole[total + len(blob) :].copy_(
        torch.frombuffer(bytearray(len(blob).to_bytes(8, "little")), dtype=torch.uint8)
    )
    out, _ = _packed.build(type(td), plan.description(), total, None, into=(buffer, whole[:total]))
    classes = _desc.node_classes(td)
    if classes is not None:  # tensorclasses inside keep their class (in this process)
        _desc.retype(out, classes)
    out._set_device_tree(torch.device("cpu"))  # the leaves are in (file-backed) CPU memory
    return out.lock_()  # type: ignore[no-any-return]


def _stack_node(values: list[Any], dims: int, device: str | None) -> dict[str, Any]:
    """tensordict's node of a ``NonTensorStack`` of ``dims`` dims holding ``values``."""
    node: dict[str, Any] = {
        "cls": "NonTensorStack",
        "non_tensors": {},
        "leaves": {},
        "cls_metadata": {"stack_dim": 0, "stack_dim_name": None, "is_locked": False},
    }
    for i, value in enumerate(values):
        if dims > 1:
            node[str(i)] = _stack_node(value, dims - 1, device)
        else:
            node["non_tensors"][str(i)] = [value, [], device]
    return node


def _stack_values(meta: dict[str, Any], path: str) -> tuple[list[Any], list[int]]:
    """The values (flat) and shape of a ``NonTensorStack`` node of the file."""
    values = meta.get("non_tensors") or {}
    subs = {k: v for k, v in meta.items() if k not in _RESERVED}
    n = len(subs) if subs else len(values)
    names = [str(i) for i in range(n)]
    if (subs and values) or sorted(subs or values) != sorted(names):
        raise ValueError(f"{path}: a NonTensorStack node is not elements '0'..'{n - 1}'")
    if not subs:
        return [values[name][0] for name in names], [n]
    flat: list[Any] = []
    shapes = []
    for name in names:
        part, shape = _stack_values(subs[name], path)
        flat += part
        shapes.append(shape)
    if any(shape != shapes[0] for shape in shapes):
        raise ValueError(f"{path}: the elements of a NonTensorStack node differ in shape")
    return flat, [n, *(shapes[0] if shapes else [])]


def from_consolidated(cls: type[TD], filename: str | os.PathLike[str]) -> TD:
    """The tree of a file written by ``consolidate(filename=...)``, here or by tensordict: its
    leaves are views of a copy-on-write map of the file (writes do not reach it); not locked.

    >>> import torch, tempfile
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict(a=torch.zeros(3), b={"c": torch.ones(3)}, batch_size=[3])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = td.consolidate(filename=f"{d}/td.bin")
    ...     loaded = TensorDict.from_consolidated(f"{d}/td.bin")
    ...     loaded["b", "c"], loaded.is_consolidated()
    (tensor([1., 1., 1.]), True)
    """
    path = os.fspath(filename)
    size = os.path.getsize(path)
    if size < 8:
        raise ValueError(f"{path}: too short for a consolidated tensordict file")
    # a private (copy-on-write) map, as the reference reads the file
    file = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
    length = int.from_bytes(bytes(file[-8:].tolist()), "little")
    if length <= 0 or length + 8 > size:
        raise ValueError(f"{path}: bad JSON length {length} in a file of {size} bytes")
    metadata = json.loads(bytes(file[size - 8 - length : size - 8].tolist()))
    storage = file[: size - 8 - length]
    td = _build(cls, metadata, storage, path)
    plan = _packed.Plan(td)
    if plan.whole is not None:
        plan.consolidated = True  # our own files: every leaf at its packed offset
        _packed._remember(td, plan)
    return td


def _build(cls: type[TreeNode], meta: dict[str, Any], storage: torch.Tensor, path: str) -> Any:
    meta = dict(meta)
    non_tensors = meta.pop("non_tensors", {})
    leaves = meta.pop("leaves", {})
    meta.pop("cls", None)
    meta.pop("size", None)
    info = dict(meta.pop("cls_metadata", {}))
    device = info.get("device")
    td = cls._new_unchecked(
        torch.Size(info.get("batch_size", [])), None if device is None else torch.device(device)
    )
    entries = td._tensordict
    for key, (value, _batch, _device) in non_tensors.items():
        entries[key] = NonTensorData(value)
    for key, leaf in leaves.items():
        dtype_name, shape, start, stop = leaf[:4]
        if dtype_name not in STR_TO_DTYPE:
            raise ValueError(f"{path}: unknown dtype {dtype_name!r} for key {key!r}")
        if not 0 <= start <= stop <= storage.numel():
            raise ValueError(f"{path}: key {key!r} lies outside the file ({start}:{stop})")
        dtype = STR_TO_DTYPE[dtype_name]
        count = 1
        for n in shape:
            count *= n
        nbytes = count * dtype.itemsize
        if start + nbytes > stop:
            raise ValueError(f"{path}: key {key!r} needs {nbytes} bytes, has {stop - start}")
        entries[key] = storage[start : start + nbytes].view(dtype).view(shape)
    for key, sub in meta.items():
        if isinstance(sub, dict) and sub.get("cls") == "NonTensorStack":
            flat, shape = _stack_values(sub, path)
            stack = NonTensorStack.from_values(flat, shape, td.device)
            stack_dim = sub.get("cls_metadata", {}).get("stack_dim", 0)
            stack.stack_dim = stack_dim if type(stack_dim) is int else 0
            entries[key] = stack
        else:
            entries[key] = _build(cls, sub, storage, path)
    if info.get("is_locked"):
        td.lock_()
    return td
