"""DataLoader batches through a reused ring of shared slabs.

In a DataLoader worker, ``td[indices]`` (the dataset's ``__getitems__``) gathers the batch
straight into a slot of the worker's ring: one slab of anonymous shared memory per slot, made
(and its pages faulted in) once, reused for every later batch. The batch crosses to the main
process as its slot number, generation and layout; each slab's descriptor crosses once, with
the first batch that uses it. The main process maps each slab once and gives a TensorDict of
plain tensors viewing the slot.

The rule for kept batches: **a slot returns to its worker when the last tensor of the batch
that uses it is freed in the main process and in the worker** (the TensorDict, its leaves, any
view of them, a ``pin_memory`` copy excepted). A batch the user keeps is never overwritten, nor
one the worker keeps (a ``collate_fn`` that caches the batches it returns, running statistics,
a previous batch). When every slot of
a worker is taken (the user keeps many batches), the ring grows, up to ``MAX_SLOTS`` slots and
``MAX_RING_BYTES``; past that each new batch goes into a fresh arena as before the ring, so
data stay correct whatever the user keeps. Back-pressure is the DataLoader's own: a worker has
at most ``prefetch_factor`` batches in flight, so the ring settles at ``prefetch_factor`` plus
the batches the user holds plus one; a batch larger than its slot (a larger batch size) gets a
larger slab in that slot, and the main process forgets the old one.

A flat batch (every entry a leaf of the slot, in the order gathered) that reaches the pickler
unchanged (same entries, leaves of the same address and geometry, no flags) crosses as its
slot and the key of its kind (class, batch size, device, keys, leaf runs), the kind itself
only with the first batch of it that a worker sends (``reduce_batch``, ``rebuild_batch``);
anything else crosses through the general reducer (``processes.reduce_tensordict``). Where
the leaves of a kind of batch lie in a slot is worked out once per ring (``_Layout``), and the
copies of a flat batch into a slot once per slot (``_Prepared``: the native call's jobs), so
that a flat batch costs its views and one native call, with no Python loop over its leaves.

The slot states live in a small shared header (one 64-bit word per slot: generation and
state, changed only by compare-and-swap in the Rust core, ``sys/ring.rs``): FREE, HELD (the
worker's half: it fills the slot or holds its batch), SENT (the main process's half: the batch
lives there) and SHARED (both halves: the batch crossed and the worker still holds it, as it
does at least until the queue's feeder thread has pickled it). Sending moves HELD to SHARED;
each side, when its last view of the batch dies, clears its own half (the worker: HELD to FREE
or SHARED to SENT, ``WorkerRing.drop``; the main process: SENT to FREE or SHARED to HELD,
``ring_receive._release``), so the slot is free only once both have dropped it. A batch the
worker never sends (a ``collate_fn`` that drops it) returns its slot when its last view dies in
the worker. That costs one compare-and-swap per side in the usual case (the worker drops its
batch before the main process does), two at most otherwise, and no system call.

The main process's side (mapping slabs once, rebuilding batches, watching the workers)
is ``ring_receive``; the slot states and the views both sides make are ``ring_layout``.
"""

from __future__ import annotations

import atexit
import operator
import os
import threading
import weakref
from multiprocessing import reduction
from typing import Any, cast

import torch
import torch.utils.data

from .. import _native
from .._core.nodes import TD
from ..ops import gather as _gather
from .ring_layout import FREE, HEADER_BYTES, HELD, MAX_SLOTS, SENT, SHARED, run_views, runs
from .ring_receive import rebuild_batch

# Bytes of one worker's slots together (the first two slots are always allowed, whatever a
# batch weighs).
MAX_RING_BYTES = 1 << 30
# Kinds of batches (leaf shapes and dtypes; keys and class) a ring remembers at most.
MAX_LAYOUTS = 64
# The marker a flat ring batch carries in its ``__dict__`` (see ``reduce_batch``).
MARK = "_ring_batch"
# Each leaf starts at a multiple of this in its slot (a cache line; enough for every dtype).
LEAF_ALIGN = 64
PAGE = 4096
# How long a spawn worker's exit waits for the queue feeder threads (see ``join_feeders``)
FEEDER_GRACE = 0.5


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for d in reversed(shape):
        stride.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(stride))


# ---------------------------------------------------------------------------- the worker side


class _Layout:
    """Where the leaves of one kind of batch lie in a slot, worked out once per ring: their
    byte offsets, the bytes of the slot they take and the runs that make their views."""

    __slots__ = ("kept", "nbytes", "offsets", "runs", "shapes", "specs", "strides")

    def __init__(self, specs: list[tuple[tuple[int, ...], torch.dtype]]) -> None:
        self.specs = specs
        self.kept = False  # in the ring's table (then a batch of it may be described)
        offsets: list[int] = []
        planned = []
        end = 0
        for shape, dtype in specs:
            numel = 1
            for d in shape:
                numel *= d
            end = _round_up(end, LEAF_ALIGN)
            offsets.append(end)
            planned.append((dtype, shape, _contiguous(shape), end // dtype.itemsize))
            end += numel * dtype.itemsize
        self.offsets = offsets
        self.nbytes = max(end, 1)
        self.runs = runs(planned)
        self.shapes = [torch.Size(shape) for shape, _ in specs]
        self.strides = [spec[2] for spec in planned]


class _Prepared:
    """The copies of a flat batch into one slab, made once per slot (for one dataset plan
    and one layout): the native call's jobs and where the slot's leaves start."""

    __slots__ = ("jobs", "layout", "plan", "ptrs", "slab")

    def __init__(self, slab: _Slab, plan: Any, layout: _Layout) -> None:
        self.slab = slab
        self.plan = plan  # kept: it keeps the sources the jobs read from referenced
        self.layout = layout
        address = slab.buffer.address
        self.jobs = plan.jobs_into(layout.offsets, address)
        self.ptrs = [address + offset for offset in layout.offsets]


class _Sent:
    """What the main process keeps of one kind of flat batch, sent once per ring (its
    ``key`` with every later batch): the class, batch size, device, keys and leaf runs."""

    __slots__ = ("key", "layout", "sent", "state")

    def __init__(self, key: int, layout: _Layout, state: tuple[Any, ...]) -> None:
        self.key = key
        self.layout = layout
        self.state = state
        self.sent = False


class _Slab:
    """One slot's shared memory in the worker."""

    __slots__ = ("buffer", "capacity", "key", "sent")

    def __init__(self, key: int, capacity: int) -> None:
        self.key = key
        self.capacity = capacity
        self.buffer = _native.packed_arena(capacity, populate=True)
        self.sent = False  # whether the main process has had its descriptor


class WorkerRing:
    """The ring of one worker process: its header, its slabs, what the main process knows."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.token = os.urandom(8).hex()
        self.header = _native.packed_arena(HEADER_BYTES, populate=True)
        self.header_sent = False
        self.slabs: list[_Slab] = []
        self.retired: list[int] = []  # keys of slabs the main process should forget
        self.serial = 0
        # slab address -> (slot, generation) of the batch held there now
        self.held: dict[int, tuple[int, int]] = {}
        self.lock = threading.Lock()
        # the layouts of the batches met so far (the last one first), and the flat batch
        # descriptions, at most MAX_LAYOUTS each (past that, batches cross the general way)
        self.last: _Layout | None = None
        self.layouts: dict[tuple[Any, ...], _Layout] = {}
        self.described: dict[tuple[Any, ...], _Sent] = {}
        # slot -> the copies of the last flat batch gathered into it (``gather_flat``)
        self.prepared: dict[int, _Prepared] = {}

    def layout(self, specs: list[tuple[tuple[int, ...], torch.dtype]]) -> _Layout:
        """The layout of a batch of leaves ``(shape, dtype)``, made once."""
        last = self.last
        if last is not None and last.specs == specs:
            return last
        key = tuple(specs)
        got = self.layouts.get(key)
        if got is None:
            got = _Layout(specs)
            if len(self.layouts) < MAX_LAYOUTS:
                self.layouts[key] = got
                got.kept = True
        self.last = got
        return got

    def describe(self, layout: _Layout, td: TD, keys: tuple[str, ...]) -> _Sent | None:
        """The description of a flat batch of ``layout`` (made once); None past MAX_LAYOUTS."""
        if not layout.kept:
            return None
        key = (id(layout), type(td), keys, td._batch_size, td._device)  # kept: ids stay unique
        got = self.described.get(key)
        if got is None:
            if len(self.described) >= MAX_LAYOUTS:
                return None
            state = (type(td), tuple(td._batch_size), td._device, keys, layout.runs)
            got = self.described[key] = _Sent(len(self.described), layout, state)
        return got

    def prepare(self, slot: int, slab: _Slab, plan: Any, layout: _Layout) -> _Prepared:
        """The copies of a flat batch of ``plan`` and ``layout`` into slot ``slot``: made
        once, while the slot keeps its slab and the dataset its plan."""
        got = self.prepared.get(slot)
        if got is None or got.slab is not slab or got.plan is not plan or got.layout is not layout:
            got = self.prepared[slot] = _Prepared(slab, plan, layout)
        return got

    def _new_slab(self, nbytes: int) -> _Slab:
        self.serial += 1
        capacity = _round_up(max(nbytes + nbytes // 4, PAGE), PAGE)
        return _Slab(self.serial, capacity)

    def take(self, nbytes: int) -> tuple[int, int, _Slab] | None:
        """A slot of at least ``nbytes`` bytes, taken: ``(slot, generation, slab)``; None when
        the ring is dry and may not grow (the caller allocates as without a ring)."""
        with self.lock:
            got = _native.ring_acquire(self.header, len(self.slabs))
            if got is None:
                used = sum(s.capacity for s in self.slabs)
                if len(self.slabs) >= MAX_SLOTS or (
                    len(self.slabs) >= 2 and used + nbytes > MAX_RING_BYTES
                ):
                    return None
                self.slabs.append(self._new_slab(nbytes))
                got = _native.ring_acquire(self.header, len(self.slabs))
                if got is None:  # the main process cannot take slots: never dry right after growth
                    return None
            slot, generation = got
            slab = self.slabs[slot]
            if slab.capacity < nbytes:
                # the batch grew: a larger slab in this slot; the main process forgets the old
                self.held.pop(slab.buffer.address, None)
                if slab.sent:
                    self.retired.append(slab.key)
                slab = self.slabs[slot] = self._new_slab(nbytes)
            self.held[slab.buffer.address] = (slot, generation)
            return slot, generation, slab

    def drop(self, slot: int, generation: int) -> None:
        """The worker's last view of the batch in slot ``slot`` died: the worker's half of the
        slot is cleared. Unsent, or sent and freed by the main process already (HELD): the slot
        is free again; sent and still alive in the main process (SHARED): the main process's
        release frees it. Only the main process changes a SHARED slot meanwhile (to HELD, its
        own release), so a second try settles it."""
        transition = _native.ring_transition
        header = self.header
        for _ in range(2):
            if transition(header, slot, generation, HELD, FREE):
                return
            if transition(header, slot, generation, SHARED, SENT):
                return

    def lookup(self, storage_address: int) -> tuple[int, int] | None:
        """``(slot, generation)`` of the held batch whose slab starts at ``storage_address``."""
        return self.held.get(storage_address)

    def claim(self, slots: list[tuple[int, int]]) -> bool:
        """Marks the held slots of one message SHARED (sent, and still held by the worker,
        whose views are pickling it; all or none); False when one of them is not held by that
        batch alone any more (it was sent already)."""
        with self.lock:
            done: list[tuple[int, int]] = []
            for slot, generation in slots:
                if not _native.ring_transition(self.header, slot, generation, HELD, SHARED):
                    for s, g in done:
                        _native.ring_transition(self.header, s, g, SHARED, HELD)
                    return False
                done.append((slot, generation))
            return True

    def message(self, slot: int, generation: int) -> tuple[Any, ...]:
        """What the main process needs to view the claimed slot ``slot``: descriptors only for
        what it has not had yet, and the slabs it may forget."""
        with self.lock:
            slab = self.slabs[slot]
            header = None
            if not self.header_sent:
                header = reduction.DupFd(_fd(self.header))
                self.header_sent = True
            handle = None
            if not slab.sent:
                handle = reduction.DupFd(_fd(slab.buffer))
                slab.sent = True
            retired, self.retired = tuple(self.retired), []
            return (
                self.token,
                self.pid,
                header,
                slot,
                generation,
                slab.key,
                handle,
                slab.capacity,
                retired,
            )


def _fd(buffer: Any) -> int:
    handle = buffer.share_handle
    if handle is None:  # packed_arena maps a memfd or an unlinked file: never happens
        raise RuntimeError("a ring slab has no descriptor to send")
    return int(handle[0])


_worker_ring: WorkerRing | None = None


def local_ring() -> WorkerRing | None:
    """This process's worker ring, if it has one (the reducer looks ring batches up in it)."""
    ring = _worker_ring
    if ring is not None and ring.pid != os.getpid():
        return None
    return ring


def _ring() -> WorkerRing | None:
    global _worker_ring
    ring = local_ring()
    if ring is None:
        if not _enabled():
            return None
        ring = _worker_ring = WorkerRing()
        atexit.register(join_feeders)
    return ring


def join_feeders(grace: float = FEEDER_GRACE) -> int:
    """Waits at most ``grace`` seconds for each of this process's queue feeder threads to end;
    returns how many ended. Run at a worker's exit: torch's worker loop cancels the join of
    its data queue's feeder, so a spawn worker could shut Python down while that daemon
    thread was still pickling a batch inside a torch call that had released the GIL, and the
    C++ runtime aborted the worker ("terminate called without an active exception", seen once
    in ~40 runs at load 9.5). After the grace a feeder left blocked on a full pipe (the main
    process no longer reading) ends with the process, in a plain write, as before."""
    ended = 0
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and thread.daemon and thread.name.startswith("QueueFeederThread"):
            thread.join(grace)
            ended += not thread.is_alive()
    return ended


def _enabled() -> bool:
    return (
        hasattr(os, "memfd_create")
        and os.environ.get("TENSORDICT_RS_DATALOADER_RING", "1") != "0"
        and os.environ.get("TENSORDICT_RS_ANON_DIR") is None
    )


def in_worker() -> bool:
    """True in a DataLoader worker process."""
    return torch.utils.data.get_worker_info() is not None


def gather_batch(td: TD, index: torch.Tensor) -> TD | None:
    """The rows ``index`` of ``td`` gathered into a slot of this worker's ring (one native
    call); None when the ring cannot take them (the caller gathers as usual). A flat batch
    (every entry a leaf) is marked so that ``reduce_batch`` can send it as its slot and the
    key of its description."""
    ring = _ring()
    if ring is None:
        return None
    flat = _gather.flat_plan(td, index)
    if flat is not None:
        return gather_flat(ring, td, *flat)
    taken: list[Any] = []

    def alloc(specs: list[tuple[tuple[int, ...], torch.dtype]]) -> list[torch.Tensor] | None:
        layout = ring.layout(specs)
        got = ring.take(layout.nbytes)
        if got is None:
            return None
        slot, generation, slab = got
        view = memoryview(cast(Any, slab.buffer))  # this batch's own owner of the slab bytes
        weakref.finalize(view, ring.drop, slot, generation)
        storage = torch.frombuffer(view, dtype=torch.uint8).untyped_storage()
        leaves = run_views(storage, layout.runs)
        taken.extend((layout, slot, generation, slab.buffer.address, leaves))
        return leaves

    batch = _gather.gather(td, index, alloc=alloc)
    if batch is not None and taken:
        layout, slot, generation, address, leaves = taken
        items = batch._tensordict
        values = tuple(items.values())
        # flat: nothing but the leaves of the slot, in their order
        if len(values) == len(leaves) and all(map(operator.is_, values, leaves)):
            keys = tuple(items)
            sent = ring.describe(layout, batch, keys)
            if sent is not None:
                ptrs = [address + offset for offset in layout.offsets]
                batch.__dict__[MARK] = (sent, slot, generation, items, keys, values, ptrs)
    return batch


def gather_flat(
    ring: WorkerRing, td: TD, plan: Any, keys: tuple[str, ...], index: Any
) -> TD | None:
    """``gather_batch`` of a flat tree (``ops.gather.flat_plan``): the slot's copies are
    prepared once (``WorkerRing.prepare``), so a batch is its views and one native call."""
    n = index.numel()
    layout = ring.layout(plan.specs(n))
    got = ring.take(layout.nbytes)
    if got is None:
        return None
    slot, generation, slab = got
    prepared = ring.prepare(slot, slab, plan, layout)
    view = memoryview(cast(Any, slab.buffer))  # this batch's own owner of the slab bytes
    weakref.finalize(view, ring.drop, slot, generation)
    leaves = run_views(torch.frombuffer(view, dtype=torch.uint8).untyped_storage(), layout.runs)
    batch = type(td)._new_unchecked(torch.Size((n, *td._batch_size[1:])), td._device)
    items = batch._tensordict
    items.update(zip(keys, leaves, strict=True))
    _gather.copy_rows(plan, index, prepared.jobs)
    sent = ring.describe(layout, batch, keys)
    if sent is not None:
        batch.__dict__[MARK] = (sent, slot, generation, items, keys, tuple(leaves), prepared.ptrs)
    return batch


# What reduce_batch reads of every leaf (mapped over the leaves: no Python frame per leaf).
_data_ptr = torch.Tensor.data_ptr
_stride = torch.Tensor.stride
_shape = operator.attrgetter("shape")
_requires_grad = operator.attrgetter("requires_grad")


def reduce_batch(td: TD) -> tuple[Any, ...] | None:
    """The pickled form of a flat ring batch still as gathered (same entries, leaves of the
    same geometry, no flags set): its slot and the key of its description, the description
    itself only the first time; None for anything else (the general reducer sends it)."""
    mark = td.__dict__.get(MARK)
    ring = local_ring()
    if mark is None or ring is None:
        return None
    sent, slot, generation, items, keys, values, ptrs = mark
    layout = sent.layout
    if (
        td._tensordict is not items
        or td._is_locked
        or td._is_memmap
        or td._is_shared
        or td._memmap_prefix is not None
        or tuple(td._batch_size) != sent.state[1]
        or td._device != sent.state[2]
        or not _native.same_entries([(items, keys, values)])
        or list(map(_data_ptr, values)) != ptrs
        or list(map(_shape, values)) != layout.shapes
        or list(map(_stride, values)) != layout.strides
        or any(map(_requires_grad, values))
    ):
        return None
    if not ring.claim([(slot, generation)]):
        return None  # pickled twice: the general reducer copies it
    message = ring.message(slot, generation)
    with ring.lock:
        state = None
        if not sent.sent:
            state, sent.sent = sent.state, True
    return (rebuild_batch, (message, sent.key, state))
