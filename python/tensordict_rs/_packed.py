"""A whole tree as one message: the packed layout, its copy plans, and the JSON description.

The packed layout lists the tensor leaves depth-first in sorted-key order (the order of the
reference's per-leaf protocol), each at an offset rounded up to ``ALIGN`` bytes so that every
dtype can be viewed in place. ``Plan`` holds a tree's leaves in that order and a table of
``(address, offset, nbytes)`` for the Rust core, which packs the leaves into one buffer or
scatters one buffer into them (``_native.copy_packed``: GIL released, parallel).

Plans are cached per tree and checked on every use against the tree's dicts (same keys,
same value objects), which costs about 30 ns per leaf instead of a rebuild. A plan keeps the
storage of every leaf referenced, so its addresses stay valid even if a tensor is swapped
out of the tree. A tree received as one message (``build``) lies in one buffer already: its
plan sends and receives that buffer as it is, with no copy.

The description is the JSON of ``meta.json`` (the same per-leaf entries and reserved keys),
with each nested TensorDict's own ``meta.json`` object inlined under its key, so that a rank
that knows nothing can build the receiving tree without pickle.
"""

from __future__ import annotations

import json
import operator
import weakref
from array import array
from typing import TYPE_CHECKING, Any

import torch

from . import _native
from ._dtypes import STR_TO_DTYPE, dtype_to_str
from ._tree import NonTensorData, _gc_paused, _json_text, _LazyLeaf

if TYPE_CHECKING:
    from .tensordict import TensorDict

ALIGN = 16
DESCRIPTION_LIMIT = 64 << 20  # the meta.json limit of the loader
MAX_DEPTH = 256

TD_TYPE = "<class 'tensordict._td.TensorDict'>"
TD_CLASS = "tensordict:TensorDict"
NTD_TYPE = "<class 'tensordict.tensorclass.NonTensorData'>"
RESERVED = ("shape", "device", "_type", "_format_version", "_class", "_names")
_CPU = torch.device("cpu")


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def _is_leaf(value: Any) -> bool:
    return type(value) is _LazyLeaf or isinstance(value, torch.Tensor)


def _nbytes(value: Any) -> int:
    return value.buffer.nbytes if type(value) is _LazyLeaf else value.nbytes


class Plan:
    """The packed layout of one tree and how to copy its leaves to and from one buffer."""

    def __init__(self, td: TensorDict, whole: torch.Tensor | None = None) -> None:
        self.nodes: list[tuple[dict[str, Any], tuple[str, ...], tuple[Any, ...]]] = []
        self.leaves: list[tuple[TensorDict, str, Any]] = []
        self._collect(td)
        self.offsets: list[int] = []
        total = 0
        for _, _, value in self.leaves:
            total = _aligned(total)
            self.offsets.append(total)
            total += _nbytes(value)
        self.total = total
        self.native = all(_native_leaf(v) for _, _, v in self.leaves)
        self.writable = all(_writable(v) for _, _, v in self.leaves)
        self.keep: list[Any] = []
        self.table = array("Q")
        if self.native:
            for (_, _, value), off in zip(self.leaves, self.offsets, strict=True):
                n = _nbytes(value)
                if n:
                    address, owner = _address(value)
                    self.keep.append(owner)
                    self.table.extend((address, off, n))
        self.whole = whole if whole is not None else self._one_buffer()
        self._scratch: torch.Tensor | None = None
        self._busy: Any = None

    def _collect(self, td: TensorDict) -> None:
        items = td._tensordict
        self.nodes.append((items, tuple(items), tuple(items.values())))
        for key in sorted(items):
            value = items[key]
            if _is_leaf(value):
                self.leaves.append((td, key, value))
            elif type(value) is not NonTensorData:
                self._collect(value)

    def _one_buffer(self) -> torch.Tensor | None:
        """A uint8 view of the one storage that already holds every leaf in packed layout."""
        tensors = [v for _, _, v in self.leaves if isinstance(v, torch.Tensor) and v.nbytes]
        if not self.native or not tensors or len(tensors) != len(self.table) // 3:
            return None
        storage = tensors[0].untyped_storage()
        base = self.table[0] - self.table[1]
        if any(self.table[i] - self.table[i + 1] != base for i in range(0, len(self.table), 3)):
            return None
        if any(t.untyped_storage().data_ptr() != storage.data_ptr() for t in tensors):
            return None
        start = base - storage.data_ptr()
        if start < 0 or start + self.total > storage.nbytes():
            return None
        return torch.empty(0, dtype=torch.uint8).set_(storage, start, (self.total,), (1,))

    def is_current(self) -> bool:
        """Whether the tree still has the keys and value objects this plan was made for."""
        for items, keys, values in self.nodes:
            if len(items) != len(keys) or tuple(items) != keys:
                return False
            if not all(map(operator.is_, items.values(), values)):
                return False
        return True

    def pack(self, fresh: bool = False) -> torch.Tensor:
        """One uint8 CPU (or device) tensor with every leaf at its offset.

        Without a copy when the leaves already lie in one buffer; else into a scratch buffer
        that the next call reuses, or a new one with ``fresh`` (a message still in flight).
        """
        if self.whole is not None:
            return self.whole
        out = self._buffer(fresh)
        if self.native:
            if self.table:
                _native.copy_packed(self.table, out.data_ptr(), out.numel(), True)
        else:
            for (td, key, value), off in zip(self.leaves, self.offsets, strict=True):
                n = _nbytes(value)
                if n:
                    leaf = td._get_str(key)
                    out[off : off + n].view(leaf.dtype).view(leaf.shape).copy_(leaf)
        return out

    def receive_buffer(self, fresh: bool = False) -> torch.Tensor:
        """The buffer to receive one message into (the leaves themselves when they can be).

        The scratch buffer is reused unless ``fresh`` (a receive that may still be running
        when the next one starts).
        """
        if not self.writable:
            raise RuntimeError("cannot receive into a read-only memory map")
        if self.whole is not None:
            return self.whole
        return self._buffer(fresh)

    def unpack(self, buffer: torch.Tensor) -> None:
        """Writes ``buffer`` (from ``receive_buffer``) into every leaf."""
        if buffer is self.whole:
            return
        if not self.writable:
            raise RuntimeError("cannot receive into a read-only memory map")
        if self.native:
            if self.table:
                _native.copy_packed(self.table, buffer.data_ptr(), buffer.numel(), False)
            return
        for (td, key, value), off in zip(self.leaves, self.offsets, strict=True):
            n = _nbytes(value)
            if n:
                target = td._get_str(key)
                target.copy_(buffer[off : off + n].view(value.dtype).view(value.shape))

    def _buffer(self, fresh: bool) -> torch.Tensor:
        device = _device(self.leaves)
        if fresh or device != _CPU:
            return torch.empty(self.total, dtype=torch.uint8, device=device)
        if self._scratch is None:
            self._scratch = torch.empty(self.total, dtype=torch.uint8)
        return self._scratch


def _device(leaves: list[tuple[Any, str, Any]]) -> torch.device:
    for _, _, value in leaves:
        if isinstance(value, torch.Tensor) and value.device != _CPU:
            return value.device
    return _CPU


def _native_leaf(value: Any) -> bool:
    if type(value) is _LazyLeaf:
        return True
    return (
        value.device.type == "cpu"
        and value.layout is torch.strided
        and value.is_contiguous()
        and not value.is_conj()
        and not value.is_neg()
    )


def _address(value: Any) -> tuple[int, Any]:
    """The address of a leaf's bytes and the object that keeps them alive."""
    if type(value) is _LazyLeaf:
        return value.buffer.address, value.buffer
    return value.data_ptr(), value.untyped_storage()


def _writable(value: Any) -> bool:
    buffer = value.buffer if type(value) is _LazyLeaf else getattr(value, "_buffer", None)
    return buffer is None or buffer.writable


_PLANS: dict[int, tuple[weakref.ref[Any], Plan]] = {}


@_gc_paused()
def plan(td: Any) -> Plan:
    """The cached plan of ``td``, rebuilt when the tree changed since it was made."""
    entry = _PLANS.get(id(td))
    if entry is not None and entry[0]() is td and entry[1].is_current():
        return entry[1]
    hint = entry[1].whole if entry is not None and entry[0]() is td else None
    new = Plan(td)
    if hint is not None and new.whole is None and _matches(new, hint):
        new.whole = hint
    _remember(td, new)
    return new


def _matches(new: Plan, whole: torch.Tensor) -> bool:
    """Whether ``new``'s leaves still lie at their offsets in ``whole`` (after materializing)."""
    if not new.native or whole.numel() != new.total or whole.device != _CPU:
        return False
    base = whole.data_ptr()
    table = new.table
    return all(table[i] == base + table[i + 1] for i in range(0, len(table), 3))


def _remember(td: TensorDict, new: Plan) -> None:
    key = id(td)

    def forget(_: Any, key: int = key, plans: dict[int, Any] = _PLANS) -> None:
        plans.pop(key, None)  # ``plans`` bound here: the module may be gone at shutdown

    _PLANS[key] = (weakref.ref(td, forget), new)


# ---------------------------------------------------------------------------- description


@_gc_paused()
def describe(td: Any) -> bytes:
    """The tree's structure as JSON bytes: meta.json entries, nested nodes inlined."""
    return json.dumps(_node(td, ()), ensure_ascii=False, allow_nan=False).encode()


def _node(td: TensorDict, path: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    items = td._tensordict
    for key in sorted(items):
        if key in RESERVED:
            raise _native.InvalidTreeError(
                f"key {'.'.join((*path, key))!r} is reserved by the meta.json format and "
                "cannot be sent with its description"
            )
        value = items[key]
        if type(value) is _LazyLeaf:
            out[key] = _leaf_entry(value.dtype, value.shape, "cpu")
        elif isinstance(value, torch.Tensor):
            device = "cpu" if value.is_cpu else str(value.device)
            out[key] = _leaf_entry(value.dtype, tuple(value.shape), device)
        elif type(value) is NonTensorData:
            data = json.loads(_json_text(value.data, key))
            out[key] = {"_type": NTD_TYPE, "data": data, "_metadata": None, "_is_non_tensor": True}
        else:
            out[key] = _node(value, (*path, key))
    out["shape"] = list(td.batch_size)
    out["device"] = None if td.device is None else str(td.device)
    out["_type"] = TD_TYPE
    out["_format_version"] = 1
    out["_class"] = TD_CLASS
    return out


def _leaf_entry(dtype: torch.dtype, shape: tuple[int, ...], device: str) -> dict[str, Any]:
    name = dtype_to_str(dtype)
    return {"device": device, "shape": list(shape), "dtype": name, "is_nested": False}


class _Spec:
    """A parsed description: the tree to build and its leaves in packed order."""

    def __init__(self) -> None:
        self.leaves: list[tuple[Any, str, torch.dtype, tuple[int, ...]]] = []


def _bad(path: tuple[str, ...], why: str) -> _native.InvalidTreeError:
    where = ".".join(path) or "<root>"
    return _native.InvalidTreeError(f"received tree description, at {where!r}: {why}")


def _shape(value: Any, path: tuple[str, ...]) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(d) is int and 0 <= d < (1 << 63) for d in value):
        raise _bad(path, f"shape {value!r} is not a list of non-negative ints")
    return tuple(value)


def _parse_node(
    cls: type[TensorDict],
    obj: Any,
    path: tuple[str, ...],
    spec: _Spec,
    device: torch.device | None,
) -> TensorDict:
    if len(path) > MAX_DEPTH:
        raise _bad(path, f"nested deeper than {MAX_DEPTH}")
    if not isinstance(obj, dict) or obj.get("_type") != TD_TYPE:
        raise _bad(path, "not a TensorDict entry")
    batch = _shape(obj.get("shape"), path)
    td = cls._new_unchecked(torch.Size(batch), device)
    items = td._tensordict
    entries = [k for k in obj if k not in RESERVED]
    for key in sorted(entries):
        entry = obj[key]
        here = (*path, key)
        if not isinstance(entry, dict):
            raise _bad(here, "entry is not an object")
        if "dtype" in entry:
            dtype = STR_TO_DTYPE.get(entry["dtype"])
            if dtype is None:
                raise _bad(here, f"unknown dtype {entry['dtype']!r}")
            if entry.get("is_nested"):
                raise _bad(here, "nested tensors are not supported")
            shape = _shape(entry.get("shape"), here)
            if shape[: len(batch)] != batch:
                raise _bad(here, f"shape {list(shape)} does not start with the batch size")
            items[key] = None  # placed by build()
            spec.leaves.append((td, key, dtype, shape))
        elif entry.get("_type") == NTD_TYPE and "data" in entry:
            items[key] = NonTensorData(entry["data"])
        else:
            items[key] = _parse_node(cls, entry, here, spec, device)
    return td


@_gc_paused()
def build(
    cls: type[Any],
    text: bytes,
    total: int,
    device: torch.device | None = None,
    capacity: int | None = None,
) -> tuple[Any, torch.Tensor]:
    """A new tree from a description, and the one buffer to receive its ``total`` bytes into.

    On the CPU the leaves are lazy slices of one anonymous map (no tensor is made per leaf
    until it is used); on another device, views of one device buffer. ``capacity`` makes the
    buffer that long (a padded collective), the leaves still in its first ``total`` bytes.
    """
    capacity = total if capacity is None else capacity
    try:
        obj = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _bad((), f"not valid JSON: {err}") from None
    spec = _Spec()
    target = None if device is None or device == _CPU else device
    td = _parse_node(cls, obj, (), spec, target or (_CPU if obj.get("device") else None))
    offsets, end = [], 0
    for _, _, dtype, shape in spec.leaves:
        end = _aligned(end)
        offsets.append(end)
        n = dtype.itemsize
        for d in shape:
            n *= d
        end += n
    if end != total:
        raise _bad((), f"the leaves hold {end} bytes, but the message holds {total}")
    if capacity < total:
        raise _bad((), f"{total} bytes do not fit a buffer of {capacity}")
    if target is not None:
        whole = torch.empty(capacity, dtype=torch.uint8, device=target)
        for (node, key, dtype, shape), off in zip(spec.leaves, offsets, strict=True):
            n = dtype.itemsize * _numel(shape)
            node._tensordict[key] = whole[off : off + n].view(dtype).view(shape)
        _remember(td, Plan(td, whole=whole[:total]))
        return td, whole
    slices = array("Q")
    for (_, _, dtype, shape), off in zip(spec.leaves, offsets, strict=True):
        n = dtype.itemsize * _numel(shape)
        if n:
            slices.extend((off, n))
    if capacity == 0:
        whole = torch.empty(0, dtype=torch.uint8)
        parts: list[Any] = []
    else:
        arena, parts = _native.packed_arena(capacity, slices)
        whole = torch.frombuffer(arena, dtype=torch.uint8)
    it = iter(parts)
    for node, key, dtype, shape in spec.leaves:
        node._tensordict[key] = (
            _LazyLeaf(next(it), dtype, shape)
            if dtype.itemsize * _numel(shape)
            else torch.empty(shape, dtype=dtype)
        )
    _remember(td, Plan(td, whole=whole[:total]))
    return td, whole


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
