"""A whole tree as one message: the packed layout, its copy plans, and the JSON description.

The packed layout lists the tensor leaves depth-first in sorted-key order (the order of the
reference's per-leaf protocol), each at an offset rounded up to ``ALIGN`` bytes so that every
dtype can be viewed in place. ``ALIGN`` is the alignment of the parts of an anonymous arena
(rust/sys/storage.rs ``ARENA_ALIGN``), and ``memmap_()`` without a prefix lays out a tree's small
leaves in packed order, so that such a tree already lies in its arena as its message does.

``Plan`` holds a tree's leaves in that order and a checked copy plan in the Rust core
(``_native.PackedTable``: leaf addresses, offsets, sizes), which packs the leaves into one
buffer or scatters one buffer into them, whole or a byte range at a time (GIL released,
parallel).

Plans are cached per tree and checked on every use against the tree's dicts (same keys,
same value objects, compared in Rust: a few ns per leaf). A plan keeps the storage of every
leaf referenced, so its addresses stay valid even if a tensor is swapped out of the tree. A
tree received as one message (``build``) lies in one buffer already: its plan sends and
receives that buffer as it is, with no copy; so does a tree whose leaves lie in one torch
storage or one anonymous arena (``memmap_()``) each at base + its packed offset.

The description is the JSON of ``meta.json`` (the same per-leaf entries and reserved keys),
with each nested TensorDict's own ``meta.json`` object inlined under its key, so that a rank
that knows nothing can build the receiving tree without pickle. The Rust core writes and
parses it (``_native.describe_tree``, ``_native.parse_description``) and maps the receiving
tree's one buffer; each leaf is a lazy slice of it.

A nested-tensor leaf travels as dense parts (``_nested.packed_parts``) ahead of the dense
leaves, described behind ``NESTED_MARK`` (``packed_description``); a receiver puts it in once
the data has arrived (``settle``), after checking the parts.
"""

from __future__ import annotations

import functools
import json
import warnings
import weakref
from array import array
from collections.abc import Callable
from typing import Any

import torch

from .. import _native
from .._core import nested as _nested
from .._core.dtypes import STR_TO_DTYPE
from .._core.nodes import NTD_TYPES, TD, NonTensorData, _gc_paused
from .._core.nontensor import NonTensorStack
from ..memmap import MemoryMappedTensor, _LazyLeaf, value_nbytes
from . import packed_description as _desc
from . import packed_watch as _watching

ALIGN = _native.ALIGN  # every leaf of a packed tree (and of an arena) starts at a multiple
DESCRIPTION_LIMIT = _native.DESCRIPTION_LIMIT  # the meta.json limit of the loader
_CPU = torch.device("cpu")
_STRIDED = torch.strided


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


# (the node holding it, its key, the stored value); the node is None for the root's own
# leaves, which ``Plan.node`` resolves through the plan's weak reference: a plan cached in
# ``_PLANS`` must not hold its tree, or the tree is never freed (its entry is dropped when
# the tree dies)
Leaf = tuple[Any, str, Any]
Node = tuple[dict[str, Any], tuple[str, ...], tuple[Any, ...]]  # (dict, keys, values)


class Plan:
    """The packed layout of one tree and how to copy its leaves to and from one buffer."""

    def __init__(
        self,
        td: TD,
        whole: torch.Tensor | None = None,
        built: tuple[list[Node], list[Leaf] | None, int] | None = None,
    ) -> None:
        self.root = weakref.ref(td)
        self.keep: list[Any] = []
        self.table: Any = None
        self.device = _CPU
        self.native = True
        self.writable = True
        self._scratch: torch.Tensor | None = None
        self._tensors: list[torch.Tensor] | None = None
        self._staged: list[int] = []  # leaves sent and received through contiguous copies
        self._materialized: list[torch.Tensor] | None = None
        self._description: bytes | None = None
        self._leaves: list[Leaf] | None = None
        # The nested leaves, in packed order: (path to the key, description, parts by name).
        # Their parts lead the packed layout (see ``packed_description.NESTED_MARK``).
        self._groups: list[tuple[tuple[str, ...], dict[str, Any], dict[str, Any]]] = []
        # A tree ``build`` made whose nested leaves wait for the data (see ``settle``).
        self.pending: Callable[[], None] | None = None
        self._arena: _native.Buffer | None = None  # the native buffer of the first leaf, if any
        # Every leaf is a whole part of an arena (its own native buffer, all of it): what lies
        # between the leaves is then padding that no tensor views, which a message received
        # into the arena in place may overwrite.
        self._parts_whole = True
        # Whether ``recv`` writes the message into ``whole`` itself (see ``receive_buffer``).
        self.receive_in_place = built is not None
        # Made by ``build`` (or ``consolidate``): what ``is_consolidated()`` reports.
        self.consolidated = built is not None
        if built is not None:  # a tree made by ``build``: its layout is known, no walk
            self.nodes, self._leaves, self.total = built
            self.whole = whole
            if whole is not None:
                self.device = whole.device
            self._watch = _watching.Watch(td, self.nodes)
            return
        self.nodes = []
        self._leaves = []
        self._collect(td)
        self.total = self._layout()
        self._watch = _watching.Watch(td, self.nodes)
        self.whole = whole if whole is not None else self._one_buffer()
        if self.whole is not None:
            self.receive_in_place = self._nothing_between_leaves()

    def _collect(self, td: TD, nodes: bool = True) -> None:
        """Collects the leaves of ``td`` in packed order (and its nodes, with ``nodes``): the
        parts of its nested leaves first, then its dense leaves."""
        self._groups = []
        dense: list[Leaf] = []
        self._walk(td, nodes, (), dense)
        if not self._groups:
            self._leaves = dense
            return
        leaves: list[Leaf] = []
        for _, _, parts in self._groups:
            holder = _desc.Parts(parts)
            leaves.extend((holder, name, parts[name]) for name in sorted(parts))
        leaves.extend(dense)
        self._leaves = leaves

    def _walk(self, td: TD, nodes: bool, path: tuple[str, ...], leaves: list[Leaf]) -> None:
        items = td._tensordict
        if nodes:
            self.nodes.append((items, tuple(items), tuple(items.values())))
        for key in sorted(items):
            value = items[key]
            if type(value) is _LazyLeaf or isinstance(value, torch.Tensor):
                if isinstance(value, torch.Tensor) and value.is_nested:
                    self._groups.append(_desc.nested_parts(value, (*path, key)))
                    continue
                leaves.append((td if path else None, key, value))
            elif type(value) not in NTD_TYPES and type(value) is not NonTensorStack:
                self._walk(value, nodes, (*path, key), leaves)

    @property
    def groups(self) -> list[tuple[tuple[str, ...], dict[str, Any], dict[str, Any]]]:
        """The nested leaves: (path to the key, description, parts by name), packed order."""
        if self._leaves is None and self._groups:
            return self._groups  # kept by ``settle`` without the leaves
        self.leaves  # noqa: B018 (collected with the leaves)
        return self._groups

    def node(self, node: Any) -> Any:
        """The tree node of a leaf's first field (None: the root)."""
        if node is not None:
            return node
        root = self.root()
        if root is None:
            raise ReferenceError("the tree of this plan is gone")
        return root

    @property
    def leaves(self) -> list[Leaf]:
        """``(node, key, value)`` of every leaf, in packed order."""
        if self._leaves is None:
            root = self.root()
            if root is None:
                raise ReferenceError("the tree of this plan is gone")
            self._collect(root, nodes=False)
        assert self._leaves is not None
        return self._leaves

    def _layout(self) -> int:
        """Offsets, the copy table and the flags of the collected leaves; returns the total."""
        table = array("Q")
        self.offsets: list[int] = []
        offsets = self.offsets
        keep = self.keep
        total = 0
        data = 0
        whole_parts = True
        for _, _, value in self.leaves:
            total = (total + ALIGN - 1) & ~(ALIGN - 1)
            offsets.append(total)
            if type(value) is _LazyLeaf:
                buffer = value.buffer
                n = buffer.nbytes
                if n:
                    if not table:
                        self._arena = buffer
                    keep.append(buffer)
                    table.extend((buffer.address, total, n))
                self.writable = self.writable and buffer.writable
            else:
                n = value.nbytes
                if not value.is_cpu:
                    self.native = False
                    if self.device == _CPU:
                        self.device = value.device
                elif (
                    value.layout is not _STRIDED
                    or not value.is_contiguous()
                    or (value._is_view() and (value.is_conj() or value.is_neg()))
                ):
                    self.native = False
                elif n:
                    mapped = value._buffer if type(value) is MemoryMappedTensor else None
                    if mapped is not None and not table:
                        self._arena = mapped
                    whole_parts = whole_parts and (
                        mapped is not None
                        and mapped.nbytes == n
                        and mapped.address == value.data_ptr()
                    )
                    keep.append(value.untyped_storage())
                    table.extend((value.data_ptr(), total, n))
                if type(value) is MemoryMappedTensor and value._buffer is not None:
                    self.writable = self.writable and value._buffer.writable
            total += n
            data += n
        self._parts_whole = whole_parts
        self._padding = total - data
        if self.native and table:
            self.table = _native.PackedTable(table, total)
            self._addresses = table
        return total

    def _nothing_between_leaves(self) -> bool:
        """Whether no tensor can view the bytes between the leaves in their one buffer (each
        leaf a whole arena part, or no padding at all): a message may then land in place.
        Never for a tree with nested leaves: their offsets or shapes are checked against the
        message before anything is written (``check_nested``)."""
        return not self.groups and (self._parts_whole or self._padding == 0)

    def _one_buffer(self) -> torch.Tensor | None:
        """A uint8 view of the one storage, or the one anonymous arena (``memmap_()``), that
        already holds every leaf in packed layout: each leaf at base + its packed offset."""
        if not self.native or not self.keep or len(self.keep) * 3 != len(self._addresses):
            return None
        table = self._addresses
        base = table[0] - table[1]
        if any(table[i] - table[i + 1] != base for i in range(3, len(table), 3)):
            return None
        first = self.keep[0]
        if isinstance(first, torch.UntypedStorage):
            start = base - first.data_ptr()
            if (
                start >= 0
                and start + self.total <= first.nbytes()
                and all(s is first or s.data_ptr() == first.data_ptr() for s in self.keep)
            ):
                return torch.empty(0, dtype=torch.uint8).set_(first, start, (self.total,), (1,))
        if self._arena is None:
            return None
        # Every leaf's bytes are at base + offset and the whole range lies in the first leaf's
        # anonymous arena (checked natively): the leaves are parts of that arena, and what lies
        # between them is its padding. One buffer over the range keeps the arena alive.
        span = self._arena.arena_span(base, self.total)
        if span is None:
            return None
        if not span.writable:
            with warnings.catch_warnings():  # torch warns that it cannot write a read-only one
                warnings.simplefilter("ignore", UserWarning)
                return torch.frombuffer(span, dtype=torch.uint8)
        return torch.frombuffer(span, dtype=torch.uint8)

    def is_current(self) -> bool:
        """Whether the tree still has the keys and value objects this plan was made for, every
        node its batch size and device, and each tensor leaf its bytes where they were, its
        size and strides (``packed_watch.Watch``)."""
        return _native.same_entries(self.nodes) and self._watch.current()

    def pack(self, fresh: bool = False) -> torch.Tensor:
        """One uint8 tensor with every leaf at its offset (see ``pack_range``)."""
        if self.whole is not None:
            return self.whole
        out = self.buffer(fresh)
        self.pack_range(out, 0, self.total)
        return out

    def buffer(self, fresh: bool = False) -> torch.Tensor:
        """The buffer a message of this tree goes through: the leaves' own one buffer when
        they lie in one, else a scratch buffer that the next call reuses, or a new one with
        ``fresh`` (a message that may still be in flight when the next one starts)."""
        if self.whole is not None:
            return self.whole
        return self._staging(fresh)

    def _staging(self, fresh: bool) -> torch.Tensor:
        if fresh or self.device != _CPU:
            return torch.empty(self.total, dtype=torch.uint8, device=self.device)
        if self._scratch is None:
            self._scratch = torch.empty(self.total, dtype=torch.uint8)
        return self._scratch

    def receive_buffer(self, fresh: bool = False) -> torch.Tensor:
        """The buffer to receive one message into (refused for a read-only memory map)."""
        if not self.writable:
            raise RuntimeError("cannot receive into a read-only memory map")
        if self.whole is not None and self.receive_in_place:
            return self.whole
        # The leaves lie in one buffer, but with bytes between them that some other tensor
        # may view (leaves that are slices of one tensor, or of arena parts): a message
        # received in place would overwrite those with its padding, so it is scattered.
        return self._staging(fresh)

    def pack_range(self, out: torch.Tensor, start: int, end: int, more: bool = False) -> None:
        """Writes bytes ``start:end`` of the packed tree into ``out`` (a ``buffer()``).

        Pieces are packed in order; bytes past ``end`` may be written too (the next pieces').
        ``more``: the next range is packed right after (the copy threads stay awake for it).
        """
        if out is self.whole:
            return
        if self.native:
            if self.table is not None:
                self.table.pack(out.data_ptr(), out.numel(), start, end, more)
            return
        # torch copies, leaf by leaf: each leaf is written whole by the piece it starts in
        # (later pieces go out after it), so non-contiguous leaves need no byte views; no
        # graph is recorded (a parameter's bytes, as the native copy and torch.distributed);
        # the padding after each leaf is zeroed (as the native copy does: no bytes of this
        # process's memory go to the peer)
        following = [*self.offsets[1:], self.total]
        with torch.no_grad():
            for (td, key, value), off, after in zip(
                self.leaves, self.offsets, following, strict=True
            ):
                n = value_nbytes(value)
                if n and start <= off < end:
                    leaf = self.node(td)._get_str(key)
                    out[off : off + n].view(leaf.dtype).view(leaf.shape).copy_(leaf)
                    if off + n < after:
                        out[off + n : after].zero_()

    def unpack(self, buffer: torch.Tensor, start: int = 0, end: int | None = None) -> None:
        """Writes bytes ``start:end`` of ``buffer`` (a ``receive_buffer()``) into the leaves.

        Pieces are unpacked in order; bytes before ``start`` must already be in ``buffer``.
        """
        end = self.total if end is None else end
        if buffer is self.whole:
            return
        if not self.writable:
            raise RuntimeError("cannot receive into a read-only memory map")
        if self.groups:
            self.check_nested(lambda i: self._part_of(buffer, i))
        if self.native:
            if self.table is not None:
                self.table.unpack(buffer.data_ptr(), buffer.numel(), start, end)
            return
        # torch copies, leaf by leaf: each leaf is read whole once the piece it ends in has
        # arrived (pieces are waited for in order, so its earlier bytes are there too); a
        # leaf that requires grad is written as torch.distributed writes it (no autograd)
        with torch.no_grad():
            for (td, key, value), off in zip(self.leaves, self.offsets, strict=True):
                n = value_nbytes(value)
                if n and start < off + n <= end:
                    target = self.node(td)._get_str(key)
                    target.copy_(buffer[off : off + n].view(target.dtype).view(target.shape))

    def materialized(self) -> list[torch.Tensor]:
        """The leaves as tensors, in packed order (lazy leaves made into tensors once)."""
        if self._materialized is None:
            out = []
            lazy = False
            for td, key, value in self.leaves:
                if type(value) is _LazyLeaf:
                    value = self.node(td)._get_str(key)
                    lazy = True
                out.append(value)
            self._materialized = out
            if lazy:  # new dict values: the same views of the same bytes, the plan holds
                self.nodes = [(d, tuple(d), tuple(d.values())) for d, _, _ in self.nodes]
                self._watch.leaves(self.nodes)  # the new tensors, watched as the walk would
        return self._materialized

    def tensors(self) -> list[torch.Tensor]:
        """The leaves as the per-leaf protocol sends them (complex ones viewed as real).

        A view that no transport takes as it is (non-contiguous, conjugated, negated) goes as
        a contiguous copy of its values, made now: the same message as a contiguous leaf's.
        """
        out = self._wire()
        if self._staged:
            out = list(out)
            leaves = self.materialized()
            for i in self._staged:
                out[i] = _desc.real(leaves[i].resolve_conj().resolve_neg().contiguous())
        return out

    def receivers(self) -> tuple[list[torch.Tensor], Callable[[], None] | None]:
        """The tensors the per-leaf protocol receives into, and what copies the staged ones
        (views no transport writes, see ``tensors``) into their leaves once all arrived.

        A tree with nested leaves has every leaf staged, so that its nested leaves are
        checked (``check_nested``) before anything is written into it."""
        out = self._wire()
        nested = self._nested_leaves()
        if not self._staged and not nested:
            return out, None
        out = list(out)
        leaves = self.materialized()
        staged: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i in range(len(leaves)) if nested else self._staged:
            leaf = leaves[i]
            buffer = torch.empty(leaf.shape, dtype=leaf.dtype, device=leaf.device)
            staged[i] = (leaf, buffer)
            out[i] = _desc.real(buffer)

        def finish() -> None:
            if nested:
                self.check_nested(lambda i: staged[i][1])
            with torch.no_grad():
                for leaf, buffer in staged.values():
                    leaf.copy_(buffer)

        return out, finish

    def nested_sizes(self) -> list[int]:
        """The sizes a point-to-point message of a tree with nested leaves announces first
        (``distributed._prelude``): the packed total, then per nested leaf the bytes of its
        three part slots (a jagged leaf: lengths, offsets, values; a strided one: sizes, -,
        values), -1 for a part it lacks."""
        out = [self.total]
        for _, meta, parts in self.groups:
            if meta["layout"] == _nested.JAGGED:
                names: tuple[str, ...] = ("lengths", "offsets", "values")
            else:
                names = ("sizes", "", "values")
            out.extend(parts[n].nbytes if n in parts else -1 for n in names)
        return out

    def _nested_leaves(self) -> int:
        """How many leaves (at the front, in packed order) are parts of nested leaves."""
        return sum(len(parts) for _, _, parts in self.groups)

    def _part_of(self, buffer: torch.Tensor, i: int) -> torch.Tensor:
        """Leaf ``i``'s bytes in a packed ``buffer``, as a tensor shaped like the leaf."""
        _, _, value = self.leaves[i]
        off = self.offsets[i]
        return buffer[off : off + value.nbytes].view(value.dtype).view(value.shape)

    def check_nested(self, received: Callable[[int], torch.Tensor]) -> None:
        """Checks that a message for this tree (``received(i)``: its leaf ``i``) holds the
        offsets, lengths or tables of shapes of this tree's nested leaves: a tree receives
        into its nested leaves only the components it has (their values may differ).
        Raises ``InvalidTreeError`` naming the first key whose components differ."""
        i = 0
        for path, _, parts in self.groups:
            for name in sorted(parts):
                if name != "values" and not torch.equal(received(i), parts[name]):
                    raise _native.InvalidTreeError(
                        f"key {'.'.join(path)!r}: the nested leaf received has other "
                        f"components than this tree's ({name} differ): a tree receives into "
                        "a nested leaf only components of the same shapes; receive a new "
                        "tree instead (from_remote_init, broadcast without a template)"
                    )
                i += 1

    def _wire(self) -> list[torch.Tensor]:
        if self._tensors is None:
            wire, self._staged = [], []
            for i, t in enumerate(self.materialized()):
                if t.layout is _STRIDED and (
                    not t.is_contiguous() or t.is_conj() or (t._is_view() and t.is_neg())
                ):
                    self._staged.append(i)
                wire.append(t if self._staged and self._staged[-1] == i else _desc.real(t))
            self._tensors = wire
        return self._tensors

    def description(self) -> bytes:
        """The tree's structure as JSON bytes: meta.json entries, nested nodes inlined."""
        if self._description is None:
            root = self.root()
            if root is None:
                raise ReferenceError("the tree of this plan is gone")
            groups = self.groups
            if not groups:
                self._description = _native.describe_tree(_desc.spec(root, ()))
            else:
                self._description = _desc.nested_description(root, groups)
        return self._description


_PLANS: dict[int, tuple[weakref.ref[Any], Plan]] = {}


@_gc_paused()
def plan(td: Any) -> Plan:
    """The cached plan of ``td``, rebuilt when the tree changed since it was made."""
    entry = _PLANS.get(id(td))
    if entry is not None and entry[0]() is td and entry[1].is_current():
        return entry[1]
    hint = entry[1].whole if entry is not None and entry[0]() is td else None
    new = Plan(td)
    if hint is not None:
        if new.whole is None and _matches(new, hint):
            new.whole = hint
            new.receive_in_place = new._nothing_between_leaves()
        whole = new.whole  # still the built buffer (leaves made tensors): still consolidated
        same = whole is not None and (whole.data_ptr(), whole.numel()) == (
            hint.data_ptr(),
            hint.numel(),
        )
        if same:
            new.consolidated = entry[1].consolidated  # type: ignore[index]
    _remember(td, new)
    return new


def plan_if_built(td: Any) -> Plan | None:
    """The plan ``build`` remembered for ``td`` (None when there is none)."""
    entry = _PLANS.get(id(td))
    return entry[1] if entry is not None and entry[0]() is td else None


def _matches(new: Plan, whole: torch.Tensor) -> bool:
    """Whether ``new``'s leaves still lie at their offsets in ``whole`` (after materializing)."""
    if new.table is None or whole.numel() != new.total or whole.device != _CPU:
        return False
    base = whole.data_ptr()
    table = new._addresses
    return all(table[i] == base + table[i + 1] for i in range(0, len(table), 3))


def _remember(td: TD, new: Plan) -> None:
    key = id(td)

    def forget(_: Any, key: int = key, plans: dict[int, Any] = _PLANS) -> None:
        plans.pop(key, None)  # ``plans`` bound here: the module may be gone at shutdown

    _PLANS[key] = (weakref.ref(td, forget), new)


def describe(td: Any) -> bytes:
    """The tree's structure as JSON bytes: meta.json entries, nested nodes inlined."""
    return plan(td).description()


# ---------------------------------------------------------------------------- receiving


@_gc_paused()
def build(
    cls: type[Any],
    text: bytes,
    total: int,
    device: torch.device | None = None,
    capacity: int | None = None,
    on_buffer: Callable[[torch.Tensor], Any] | None = None,
    into: tuple[_native.Buffer, torch.Tensor] | None = None,
    views_of: torch.Tensor | None = None,
    shared: bool = False,
) -> tuple[Any, torch.Tensor]:
    """A new tree from a description, and the one buffer to receive its ``total`` bytes into.

    ``on_buffer(buffer)`` is called with that buffer as soon as it exists, before the tree is
    built, with the description already validated (so that a receive can run meanwhile).

    On the CPU the leaves are lazy slices of one anonymous map (no tensor is made per leaf
    until it is used); on another device, views of one device buffer. ``capacity`` makes the
    buffer that long (a padded collective), the leaves still in its first ``total`` bytes.
    ``into``, an ``arena(total)`` made before the description arrived (the data may be arriving
    into it already), is that buffer instead of a new one (CPU only). ``views_of``, a uint8
    tensor of at least ``total`` bytes holding the message, makes the leaves plain tensor views
    of it (a copy of a tree: ``TensorDict.clone``). ``shared``: the CPU leaves answer
    ``is_shared()`` True (``consolidate(share_memory=True)``, as tensordict's leaves answer).

    A tree with nested leaves (a description that starts with ``NESTED_MARK``) comes without
    them: ``settle(td)``, called once the data is in the buffer, checks their parts and puts
    them in. Every caller calls it (a no-op for other trees).
    """
    index = None
    if text.startswith(_desc.NESTED_MARK):
        index, text = _desc.nested_index(text)
    target = None if device is None or device == _CPU else device
    device_buffer: list[torch.Tensor] = []  # the device case: made once ``capacity`` is known
    if views_of is not None:
        device_buffer.append(views_of)

    def make_node(batch: list[int], named: str | None) -> tuple[Any, dict[str, Any]]:
        if not node_device:  # the root: every node on ``device``, or on the CPU when the
            node_device.append(target or (_CPU if named else None))  # sender's root had one
        td = cls._new_unchecked(torch.Size(batch), node_device[0])
        return td, td._tensordict

    def make_view(offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> Any:
        return device_buffer[0][offset : offset + nbytes].view(dtype).view(shape)

    def make_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=target)

    def make_value(text: Any, *stack: Any) -> Any:
        if stack:  # a NonTensorStack: (cells, shape, device, stack_dim)
            return NonTensorStack._from_loaded(text, *stack)
        return NonTensorData(json.loads(text))

    node_device: list[torch.device | None] = []
    if target is not None and views_of is None:
        device_buffer.append(torch.empty(capacity or total, dtype=torch.uint8, device=target))
    arena = target is None and views_of is None
    early: list[torch.Tensor] = []

    def arrived(arena: Any, end: int) -> None:
        early.append(torch.frombuffer(arena, dtype=torch.uint8))
        if on_buffer is not None and end == total:
            on_buffer(early[0])

    if into is not None:
        if target is not None:
            raise ValueError("a packed arena lies in CPU memory")
        early.append(into[1])
    td, end, _, nodes = _native.build_packed_tree(
        text,
        capacity,
        arena,
        STR_TO_DTYPE,
        make_node,
        (functools.partial(_LazyLeaf, shared=True) if shared else _LazyLeaf)
        if arena
        else make_view,
        make_empty,
        make_value,
        None if not arena or into is not None else arrived,
        None if into is None else into[0],
        untrack_leaves=True,  # _LazyLeaf: a buffer, a dtype, a tuple of ints (no cycles)
    )
    if end != total:
        raise _desc.bad(f"the leaves hold {end} bytes, but the message holds {total}")
    if device_buffer:
        early.append(device_buffer[0])
        if on_buffer is not None:
            on_buffer(early[0])
    if early:
        whole = early[0]
    else:
        whole = torch.empty(0, dtype=torch.uint8)
    built = Plan(td, whole=whole[:total], built=(nodes, None, total))
    if index is not None:
        td, built.pending = _desc.unwrap(td, index)
        built.root = weakref.ref(td)
    _remember(td, built)
    return td, whole


def settle(td: Any) -> Any:
    """Puts the nested leaves into a tree ``build`` made, now that its data has arrived
    (checked: offsets in range, shapes that fill the values); returns ``td``. The tree's
    plan then views the same buffer, so the tree is still consolidated. A no-op for a tree
    without nested leaves."""
    built = plan_if_built(td)
    if built is None or built.pending is None:
        return td
    finish, built.pending = built.pending, None
    finish()
    new = Plan(td, whole=built.whole)
    new.consolidated = built.consolidated
    # the leaves name their nodes, and so would keep the tree alive from ``_PLANS``: dropped
    # (collected again when needed), as a built tree's plan starts without them
    new._leaves = None
    _remember(td, new)
    return td


def arena(total: int) -> tuple[_native.Buffer, torch.Tensor]:
    """A new anonymous shared map of ``total`` bytes (memory reserved, pages not yet mapped)
    for ``build(into=)``.

    The pages are mapped as the message arrives, by the transport's receiving thread, while
    this one parses the description: mapping them first (``MADV_POPULATE_WRITE``, 2.2 ms for
    10 MiB here) put that time before the parse, on the first contact's critical path.
    """
    buffer = _native.packed_arena(total, False)
    if not total:
        return buffer, torch.empty(0, dtype=torch.uint8)
    return buffer, torch.frombuffer(buffer, dtype=torch.uint8)
