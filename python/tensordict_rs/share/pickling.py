"""Pickle protocol 5: a tree as one out-of-band buffer and a description, for object stores.

``pickle.dumps(td, protocol=5, buffer_callback=cb)`` hands ``cb`` one ``pickle.PickleBuffer``
for the whole tree and puts in-band only the tree's description: the JSON of ``packed.py``
(keys, dtypes, shapes, batch sizes, device, non-tensor values as JSON; the leaves' offsets
follow from the packed layout), the class, the total size and the lock flag. No tensor is
pickled. ``pickle.loads(data, buffers=...)`` builds every leaf as a view into the buffer it is
given (``packed.build(into=...)``): no copy per leaf, none at all for a buffer in place.

This is how Ray's object store (and any protocol-5 transport) takes trees: ``ray.put`` copies
the buffer once into shared memory, ``ray.get`` on the same node lends it back read-only, and
the tree received is views of the object store's memory, kept alive as long as any of its
leaves lives.

Which bytes go out:

- a tree whose leaves already lie in one buffer in the packed layout (``consolidate()``,
  a tree received as one message or through this pickle, ``memmap_()`` of a tree of small
  leaves): that buffer, as it is (no copy here);
- any other tree of CPU tensors (several arenas, plain tensors, views): its leaves packed into
  one new anonymous arena first (one copy, in parallel, GIL released);
- trees with a file-backed leaf (a saved directory, a ``.tdz`` archive) and trees with leaves
  that the packed layout does not hold (on another device, requiring grad, nested tensors,
  non-JSON values): the per-leaf pickle of ``processes.getstate`` (file-backed leaves by path),
  as with protocols below 5.

A buffer lent read-only (``ray.get``'s) gives a read-only tree: the in-place methods of this
library refuse to write into it (``LockedError``, saying to ``clone()`` it: one copy of the
whole buffer). Writes through torch on a leaf itself are not checked: never write into a
tensor you got from an object store. Without ``buffer_callback`` the buffer is written
in-band (one copy) and the tree loads writable, from its own copy.

The buffer is the sender's memory, not a copy: a transport that sends it later than
``dumps`` returns must not see it change meanwhile (Ray copies it inside ``ray.put``).
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any, cast

import torch

from .. import _native
from .._core.locking import mark_read_only
from .._core.nodes import TD, TreeNode, _gc_paused
from .._core.tensor_bytes import _tensor_from_buffer
from ..memmap import MemoryMappedTensor, _LazyLeaf
from . import packed as _packed
from . import packed_description as _desc

if TYPE_CHECKING:
    from typing_extensions import Buffer as BufferProtocol

_CPU = torch.device("cpu")
LOCKED = 1  # the flags of a pickled tree


def _leaf_buffer(value: Any) -> _native.Buffer | None:
    if type(value) is _LazyLeaf:
        return value.buffer
    if type(value) is MemoryMappedTensor:
        return value._buffer
    return None


def _packable(plan: _packed.Plan) -> bool:
    """Whether every leaf goes into the packed buffer: CPU, no autograd, no nested tensor,
    no file behind it (those pickle by path)."""
    if plan.device != _CPU:
        return False
    buffer: _native.Buffer | None
    for _, _, value in plan.leaves:
        if type(value) is _LazyLeaf:
            buffer = value.buffer
        else:
            if value.requires_grad or value.is_nested:
                return False
            if type(value) is not MemoryMappedTensor:
                continue
            if value._filename is not None:
                return False
            buffer = value._buffer
            if buffer is None:
                continue
        if buffer.filename is not None or buffer.archive is not None:
            return False
    return True


def _in_place(plan: _packed.Plan) -> _native.Buffer | None:
    """A Buffer over the tree's bytes where they lie, when they lie in one arena (or one
    borrowed buffer) in the packed layout; None otherwise."""
    whole = plan.whole
    if whole is None or whole.device != _CPU or not plan.total:
        return None
    for _, _, value in plan.leaves:
        buffer = _leaf_buffer(value)
        if buffer is not None:
            return buffer.arena_span(whole.data_ptr(), plan.total)
    return None


@_gc_paused()
def reduce_ex(td: TD, protocol: int) -> Any:
    """``__reduce_ex__`` of a tree: protocol 5 gives one ``PickleBuffer`` and the description
    (see the module's docstring); lower protocols, and trees the packed layout does not hold,
    the per-leaf state (``processes.getstate``).

    >>> import pickle, torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(4.0), "b": {"c": torch.ones(4, 2)}}, [4])
    >>> buffers = []
    >>> data = pickle.dumps(td.consolidate(), protocol=5, buffer_callback=buffers.append)
    >>> len(buffers), buffers[0].raw().nbytes >= 4 * 4 + 8 * 4
    (1, True)
    >>> again = pickle.loads(data, buffers=buffers)
    >>> again["b", "c"].sum().item(), again.batch_size
    (8.0, torch.Size([4]))
    """
    if protocol < 5:
        return object.__reduce_ex__(td, protocol)
    plan = _plan_or_none(td)
    if plan is None or not _packable(plan):
        return object.__reduce_ex__(td, protocol)
    try:
        text = plan.description()
    except _native.InvalidTreeError:
        # a key the description reserves, or a non-JSON value: the per-leaf pickle takes it
        return object.__reduce_ex__(td, protocol)
    total = plan.total
    data: Any = None
    if total:
        buffer = _in_place(plan)
        if buffer is None:
            buffer, whole = _packed.arena(total)
            plan.pack_range(whole, 0, total)
            del whole
        # the buffer protocol of a pyo3 class is invisible to type checkers on 3.11
        data = pickle.PickleBuffer(cast("BufferProtocol", buffer))
    flags = LOCKED if td._is_locked else 0
    classes = _desc.node_classes(td)  # tensorclasses inside: their classes, pickled by name
    return (_rebuild, (type(td), text, total, data, flags, _orders(td), classes))


def _orders(td: TreeNode) -> list[list[int] | None] | None:
    """The key order of every node (depth first, in the description's sorted order): None for
    a node whose keys are sorted, else the sorted positions in insertion order; None when
    every node is sorted. The description lists keys sorted; the tree keeps its own order."""
    out: list[list[int] | None] = []

    def walk(node: TreeNode) -> None:
        items = node._tensordict
        keys = list(items)
        ordered = sorted(keys)
        if keys == ordered:
            out.append(None)
        else:
            rank = {key: i for i, key in enumerate(ordered)}
            out.append([rank[key] for key in keys])
        for key in ordered:
            value = items[key]
            if isinstance(value, TreeNode):
                walk(value)

    walk(td)
    return None if all(order is None for order in out) else out


def _reorder(td: TreeNode, orders: list[list[int] | None]) -> None:
    """Puts the keys of every node of a tree built from a description back in the order
    ``_orders`` recorded (the same dicts: the tree's copy plan is updated)."""
    at = iter(orders)

    def walk(node: TreeNode) -> None:
        items = node._tensordict
        ordered = list(items)  # built in sorted order
        order = next(at)
        if order is not None:
            if sorted(order) != list(range(len(ordered))):
                raise _native.InvalidTreeError("pickled tree: a key order does not fit its node")
            for i in order:
                key = ordered[i]
                items[key] = items.pop(key)
        for key in ordered:
            value = items[key]
            if isinstance(value, TreeNode):
                walk(value)

    walk(td)
    plan = _packed.plan_if_built(td)
    if plan is not None:
        plan.nodes = [(d, tuple(d), tuple(d.values())) for d, _, _ in plan.nodes]


def _frombuffer(buffer: _native.Buffer) -> torch.Tensor:
    """A uint8 tensor over the whole of ``buffer`` (read-only ones too, see ``memmap``)."""
    return _tensor_from_buffer(buffer, torch.uint8, (buffer.nbytes,))


@_gc_paused()
def _rebuild(
    cls: type[Any],
    text: bytes,
    total: int,
    data: Any,
    flags: int,
    orders: list[list[int] | None] | None = None,
    classes: list[type] | None = None,
) -> Any:
    """A tree from its description, its leaves views of ``data`` (any buffer: a PickleBuffer,
    bytes, an object store's read-only memory), which they keep alive."""
    if not total:
        td, _ = _packed.build(cls, text, 0)
        _packed.settle(td)
    else:
        if data is None:
            raise _native.InvalidTreeError(
                f"pickled tree: its leaves hold {total} bytes, but no buffer came with it"
            )
        buffer = _native.borrow_buffer(data)
        if buffer.nbytes < total:
            raise _native.InvalidTreeError(
                f"pickled tree: its leaves hold {total} bytes, more than the {buffer.nbytes} "
                "of the buffer it came with"
            )
        # lent read-only: the tree is read-only, even where it gets a copy below (the same
        # rule for every tree an object store gives, whatever its size)
        read_only = not buffer.writable and type(data) is not bytes
        tensor = _frombuffer(buffer)
        if type(data) is bytes or buffer.address % _packed.ALIGN:
            # an in-band buffer (the tree's own bytes, copied by the unpickler anyway), or
            # bytes placed where leaves cannot start (Ray aligns buffers under 2 KiB to 8
            # bytes only): into an arena of this tree's own (one copy)
            arena, whole = _packed.arena(total)
            whole.copy_(tensor[:total])
            buffer, tensor = arena, whole
        td, _ = _packed.build(cls, text, total, into=(buffer, tensor))
        _packed.settle(td)
        if read_only:
            mark_read_only(td)
            _packed.plan(td).writable = False
    if classes is not None:
        _desc.retype(td, classes)
    if orders is not None:
        _reorder(td, orders)
    if flags & LOCKED:
        td._lock_tree()
    return td


def _plan_or_none(td: TreeNode) -> _packed.Plan | None:
    """The packed plan of ``td``, or None for a tree one message cannot carry (a nested leaf:
    such trees are pickled and cloned leaf by leaf)."""
    try:
        return _packed.plan(td)
    except _native.InvalidTreeError:
        return None


def clone_whole(td: TD) -> TD | None:
    """A writable copy of an arena-backed tree whose leaves lie in one buffer (consolidated,
    received, ``ray.get``'s read-only trees): one copy of the whole buffer, the new leaves
    plain tensors viewing it. None for other trees (they are cloned leaf by leaf)."""
    plan = _plan_or_none(td)
    if plan is None:
        return None
    whole = plan.whole
    if whole is None or whole.device != _CPU or not plan.total or not _packable(plan):
        return None
    if not any(_leaf_buffer(value) is not None for _, _, value in plan.leaves):
        return None
    copy = torch.empty(plan.total, dtype=torch.uint8)
    copy.copy_(whole[: plan.total])
    out, _ = _packed.build(type(td), plan.description(), plan.total, views_of=copy)
    classes = _desc.node_classes(td)
    if classes is not None:
        _desc.retype(out, classes)
    return _packed.settle(out)  # type: ignore[no-any-return]


def is_read_only(td: TreeNode) -> bool:
    """True for a tree that views a buffer lent read-only (``ray.get``'s trees): its
    values cannot be written through this library; ``clone()`` gives a writable copy.

    >>> import torch; from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2)}, [2]).is_read_only
    False
    """
    return td._read_only
