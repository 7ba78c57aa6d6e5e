"""Between TensorDict trees and the Rust core: one native call per tree, each way.

Saving walks the tree once to build a plain spec (keys, dtype strings, shapes, source pointers),
hands it to Rust, and gets every leaf's buffer back in the same depth-first order. Loading gets
the whole validated tree and all buffers from one call. Leaves become ``_LazyLeaf`` entries: the
torch tensor is made on first access, so a 10,000-leaf save or load costs no torch call per leaf
until the leaf is used.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from . import _native
from ._dtypes import STR_TO_DTYPE, dtype_to_str
from .memmap import MemoryMappedTensor, _from_buffer, _source_bytes

if TYPE_CHECKING:
    from .tensordict import TensorDict

LEAF, NODE, NON_TENSOR = 0, 1, 2
_TENSORDICT: list[type] = []  # filled by tensordict.py (avoids an import cycle)
_CPU = torch.device("cpu")


class NonTensorData:
    """A non-tensor value stored in a TensorDict (a string, number, list or dict)."""

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"NonTensorData(data={self.data!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NonTensorData) and other.data == self.data

    __hash__ = None  # type: ignore[assignment]


class _LazyLeaf:
    """A mapped leaf whose tensor is made on first access (``torch.frombuffer`` + view)."""

    __slots__ = ("buffer", "dtype", "shape")

    def __init__(self, buffer: _native.Buffer, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self.buffer = buffer
        self.dtype = dtype
        self.shape = shape

    def materialize(self) -> MemoryMappedTensor:
        return _from_buffer(self.buffer, self.dtype, self.shape)


def _json_text(value: Any, key: str) -> str:
    def check(v: Any) -> None:
        if v is None or isinstance(v, (str, bool, int)):
            return
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError("non-finite float")
            return
        if isinstance(v, (list, tuple)):
            for item in v:
                check(item)
            return
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            for item in v.values():
                check(item)
            return
        raise TypeError(type(v).__name__)

    try:
        check(value)
    except (TypeError, ValueError) as err:
        raise _native.InvalidTreeError(
            f"key {key!r}: a value of type {type(value).__name__} ({err}) cannot be saved; "
            "only JSON values (str, int, float, bool, None, lists, dicts with str keys) "
            "are stored, never pickles"
        ) from None
    return json.dumps(value, ensure_ascii=False)


class _Plan:
    """The spec of one save, the source tensors it points into, and where results go."""

    def __init__(self, like: bool, reuse_maps: bool) -> None:
        self.like = like
        self.reuse_maps = reuse_maps
        self.keep: list[torch.Tensor] = []  # sources stay alive while Rust reads them
        self.slots: list[tuple[TensorDict, str, torch.dtype, tuple[int, ...]]] = []
        self.sources: list[tuple[int, int]] = []  # anonymous: (data_ptr, nbytes) per slot

    def _source(self, tensor: torch.Tensor, nbytes: int) -> int:
        if self.like or nbytes == 0:
            return 0
        src = _source_bytes(tensor)
        self.keep.append(src)
        return src.data_ptr()

    def node(self, td: TensorDict) -> tuple[list[int], list[tuple[Any, ...]]]:
        """The directory spec of ``td`` (for saves with a prefix)."""
        entries: list[tuple[Any, ...]] = []
        for key in list(td._tensordict):
            value = td._tensordict[key]
            if isinstance(value, NonTensorData):
                entries.append((NON_TENSOR, key, _json_text(value.data, key)))
            elif isinstance(value, (torch.Tensor, _LazyLeaf)):
                tensor = td._get_str(key)
                dtype, shape = tensor.dtype, tuple(tensor.shape)
                nbytes = tensor.numel() * tensor.element_size()
                ptr = self._source(tensor, nbytes)
                entries.append(
                    (LEAF, key, dtype_to_str(dtype), shape, str(tensor.device), ptr, nbytes)
                )
                self.slots.append((td, key, dtype, shape))
            else:
                entries.append((NODE, key, self.node(value)))
        return list(td.batch_size), entries

    def anonymous(self, td: TensorDict) -> None:
        """Collects the leaves of ``td`` that need anonymous maps."""
        for key in list(td._tensordict):
            value = td._tensordict[key]
            if isinstance(value, NonTensorData):
                continue
            if not isinstance(value, (torch.Tensor, _LazyLeaf)):
                self.anonymous(value)
                continue
            if self.reuse_maps and isinstance(value, (MemoryMappedTensor, _LazyLeaf)):
                continue
            tensor = td._get_str(key)
            dtype_to_str(tensor.dtype)  # refuse dtypes the format cannot hold, before any work
            dtype, shape = tensor.dtype, tuple(tensor.shape)
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes == 0:
                td._tensordict[key] = torch.empty(shape, dtype=dtype)
                continue
            self.sources.append((self._source(tensor, nbytes), nbytes))
            self.slots.append((td, key, dtype, shape))

    def place(self, buffers: list[Any]) -> None:
        """Puts the returned buffers into the target tree."""
        for (td, key, dtype, shape), buffer in zip(self.slots, buffers, strict=True):
            td._tensordict[key] = (
                torch.empty(shape, dtype=dtype)
                if buffer is None
                else _LazyLeaf(buffer, dtype, shape)
            )


def _mark(td: TensorDict, prefix: Path | None) -> None:
    td._device = _CPU
    td._is_memmap = True
    td._memmap_prefix = prefix
    for key, value in td._tensordict.items():
        if isinstance(value, _TENSORDICT[0]):
            _mark(value, None if prefix is None else prefix / _native.encode_key(key))


def save(
    target: TensorDict,
    prefix: str | os.PathLike[str] | None,
    *,
    like: bool,
    reuse_maps: bool,
    existsok: bool,
    durable: bool,
    num_threads: int,
) -> None:
    """Memory-maps every leaf of ``target`` in place (anonymous, or under ``prefix``).

    ``target``'s leaves are the sources; on success they are replaced by the maps, the tree is
    marked memory-mapped and put on the CPU. On failure nothing in ``target`` has changed.
    """
    plan = _Plan(like=like, reuse_maps=reuse_maps)
    if prefix is None:
        plan.anonymous(target)
        buffers = (
            _native.anonymous_buffers(plan.sources, num_threads=num_threads) if plan.sources else []
        )
        path = None
    else:
        path = Path(prefix).absolute()
        spec = plan.node(target)
        buffers = _native.write_tree(
            os.fspath(path), spec, existsok=existsok, durable=durable, num_threads=num_threads
        )
    del plan.keep
    plan.place(buffers)
    _mark(target, path)


def load(
    cls: type[TensorDict], prefix: str | os.PathLike[str], device: torch.device | None
) -> TensorDict:
    """Loads the tree at ``prefix`` with one native call; see ``TensorDict.load_memmap``."""
    path = Path(prefix).absolute()
    node, buffers = _native.load_tree(os.fspath(path))
    return _build(cls, node, buffers, path, device)


def _build(
    cls: type[TensorDict], node: Any, buffers: list[Any], path: Path, device: torch.device | None
) -> TensorDict:
    batch, saved_device, entries = node
    td = cls._new_unchecked(
        torch.Size(batch), device if device is not None else _device_or_none(saved_device)
    )
    td._memmap_prefix = path
    items = td._tensordict
    move = device is not None and device.type != "cpu"
    for entry in entries:
        tag, key = entry[0], entry[1]
        if tag == LEAF:
            dtype = STR_TO_DTYPE[entry[2]]
            shape = entry[3]
            buffer = buffers[entry[4]]
            if move:
                value: Any = (
                    torch.empty(shape, dtype=dtype, device=device)
                    if buffer is None or device.type == "meta"
                    else _from_buffer(buffer, dtype, shape).to(device)
                )
            else:
                value = (
                    torch.empty(shape, dtype=dtype)
                    if buffer is None
                    else _LazyLeaf(buffer, dtype, shape)
                )
            items[key] = value
        elif tag == NODE:
            items[key] = _build(cls, entry[2], buffers, path / _native.encode_key(key), device)
        else:
            items[key] = NonTensorData(json.loads(entry[2]))
    return td


def _device_or_none(name: str | None) -> torch.device | None:
    return None if name is None else torch.device(name)
