"""DataLoader batches through a reused ring of shared slabs.

In a DataLoader worker, ``td[indices]`` (the dataset's ``__getitems__``) gathers the batch
straight into a slot of the worker's ring: one slab of anonymous shared memory per slot, made
(and its pages faulted in) once, reused for every later batch. The batch crosses to the main
process as its slot number, generation and layout; each slab's descriptor crosses once, with
the first batch that uses it. The main process maps each slab once and gives a TensorDict of
plain tensors viewing the slot.

The rule for kept batches: **a slot returns to its worker when the last tensor of the batch
that uses it is freed in the main process** (the TensorDict, its leaves, any view of them, a
``pin_memory`` copy excepted). A batch the user keeps is never overwritten. When every slot of
a worker is taken (the user keeps many batches), the ring grows, up to ``MAX_SLOTS`` slots and
``MAX_RING_BYTES``; past that each new batch goes into a fresh arena as before the ring, so
data stay correct whatever the user keeps. Back-pressure is the DataLoader's own: a worker has
at most ``prefetch_factor`` batches in flight, so the ring settles at ``prefetch_factor`` plus
the batches the user holds plus one; a batch larger than its slot (a larger batch size) gets a
larger slab in that slot, and the main process forgets the old one.

The slot states live in a small shared header (one 64-bit word per slot: generation and
state, changed only by compare-and-swap in the Rust core, ``sys/ring.rs``): FREE, HELD (the
worker fills it or holds its batch unsent) and SENT (the batch lives in the main process). A
batch the worker never sends (a ``collate_fn`` that drops it) returns its slot when its last
view dies in the worker.

The main process keeps each worker's slabs mapped while the worker lives: a daemon thread
watches the workers (a pidfd each on Linux) and forgets the rings of a worker that exits or is
killed, so nothing stays mapped once its batches are freed. On a machine with CUDA,
``pin_memory()`` of a ring batch registers its slab as pinned memory once (``cudaHostRegister``)
and returns the batch itself: the pinned ring, with no copy per batch.
"""

from __future__ import annotations

import os
import select
import threading
import time
import weakref
from multiprocessing import reduction
from typing import Any, cast

import torch
import torch.utils.data

from .. import _native
from .._core.nodes import TD
from ..ops import gather as _gather

FREE, HELD, SENT = 0, 1, 2
# Slots of one worker's ring at most, and their bytes together (the first two slots are
# always allowed, whatever a batch weighs).
MAX_SLOTS = 16
MAX_RING_BYTES = 1 << 30
HEADER_BYTES = 8 * MAX_SLOTS
# Each leaf starts at a multiple of this in its slot (a cache line; enough for every dtype).
LEAF_ALIGN = 64
PAGE = 4096


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def views(
    specs: list[tuple[Any, torch.dtype, tuple[int, ...], tuple[int, ...], int]],
) -> list[torch.Tensor]:
    """Tensors over storages: ``(storage, dtype, shape, stride, offset)`` each (offset and
    stride in elements). A run of leaves of one dtype, shape and stride at evenly spaced
    offsets of one storage (a batch's leaves of one kind, back to back) is made with one
    ``set_`` and one ``unbind``: a 64-leaf batch costs a few torch calls, not 64."""
    out: list[torch.Tensor] = []
    i, n = 0, len(specs)
    while i < n:
        storage, dtype, shape, stride, offset = specs[i]
        j = i + 1
        step = specs[j][4] - offset if j < n else 0
        while (
            j < n
            and step > 0
            and specs[j][0] is storage
            and specs[j][1] == dtype
            and specs[j][2] == shape
            and specs[j][3] == stride
            and specs[j][4] == offset + (j - i) * step
        ):
            j += 1
        if j - i == 1:
            out.append(torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride))
        else:
            run = torch.empty(0, dtype=dtype).set_(
                storage, offset, (j - i, *shape), (step, *stride)
            )
            out.extend(run.unbind(0))
        i = j
    return out


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for d in reversed(shape):
        stride.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(stride))


# ---------------------------------------------------------------------------- the worker side


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
        """The worker's last view of an unsent batch died: its slot is free again."""
        _native.ring_transition(self.header, slot, generation, HELD, FREE)

    def lookup(self, storage_address: int) -> tuple[int, int] | None:
        """``(slot, generation)`` of the held batch whose slab starts at ``storage_address``."""
        return self.held.get(storage_address)

    def claim(self, slots: list[tuple[int, int]]) -> bool:
        """Marks the held slots of one message SENT (all or none); False when one of them is
        not held by that batch any more (it was sent already)."""
        with self.lock:
            done: list[tuple[int, int]] = []
            for slot, generation in slots:
                if not _native.ring_transition(self.header, slot, generation, HELD, SENT):
                    for s, g in done:
                        _native.ring_transition(self.header, s, g, SENT, HELD)
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
    return ring


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
    call); None when the ring cannot take them (the caller gathers as usual)."""
    ring = _ring()
    if ring is None:
        return None

    def alloc(specs: list[tuple[tuple[int, ...], torch.dtype]]) -> list[torch.Tensor] | None:
        offsets = []
        end = 0
        for shape, dtype in specs:
            numel = 1
            for d in shape:
                numel *= d
            end = _round_up(end, LEAF_ALIGN)
            offsets.append(end)
            end += numel * dtype.itemsize
        got = ring.take(max(end, 1))
        if got is None:
            return None
        slot, generation, slab = got
        view = memoryview(cast(Any, slab.buffer))  # this batch's own owner of the slab bytes
        weakref.finalize(view, ring.drop, slot, generation)
        storage = torch.frombuffer(view, dtype=torch.uint8).untyped_storage()
        return views(
            [
                (storage, dtype, shape, _contiguous(shape), offset // dtype.itemsize)
                for (shape, dtype), offset in zip(specs, offsets, strict=True)
            ]
        )

    return _gather.gather(td, index, alloc=alloc)


# ---------------------------------------------------------------------------- the main side


class _RemoteSlab:
    """A worker's slab mapped in this process; pinned for CUDA at most once."""

    __slots__ = ("__weakref__", "buffer", "pinned")

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer
        self.pinned = False

    def pin(self) -> bool:
        """Registers the slab as pinned (page-locked) memory for CUDA, once; False without
        CUDA or when the driver refuses (the caller then copies into pinned memory)."""
        if self.pinned:
            return True
        if not torch.cuda.is_available():
            return False
        cudart = torch.cuda.cudart()
        # cudaHostRegisterDefault (0): the slab stays where it is; CUDA pins its pages
        err = cudart.cudaHostRegister(self.buffer.address, self.buffer.nbytes, 0)
        self.pinned = int(err) == 0
        return self.pinned

    def __del__(self) -> None:
        if self.pinned:
            try:
                torch.cuda.cudart().cudaHostUnregister(self.buffer.address)
            except Exception:  # interpreter shutdown: the process unmaps everything anyway
                pass


class _RemoteRing:
    """A worker's ring as the main process sees it."""

    __slots__ = ("header", "pid", "slabs")

    def __init__(self, header: Any, pid: int) -> None:
        self.header = header
        self.pid = pid
        self.slabs: dict[int, _RemoteSlab] = {}


_rings: dict[str, _RemoteRing] = {}
_rings_lock = threading.RLock()
# storage address of a received slot -> its slab (pin_memory finds its slab from a leaf)
_by_address: weakref.WeakValueDictionary[int, _RemoteSlab] = weakref.WeakValueDictionary()


def _release(header: Any, slab: _RemoteSlab, slot: int, generation: int) -> None:
    del slab  # kept alive (and pinned) until every batch viewing it is freed
    _native.ring_transition(header, slot, generation, SENT, FREE)


def _close(handle: Any) -> None:
    if handle is not None:
        os.close(handle.detach())


def _gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` exits (a zombie counts) within ``timeout`` seconds."""
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return True
        except OSError:
            fd = None
        if fd is not None:
            try:
                return bool(select.select([fd], [], [], timeout)[0])
            finally:
                os.close(fd)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _detach(handle: Any, pid: int, wait: float = 10.0) -> int:
    """The descriptor a worker sent (``DupFd``: fetched from the worker's resource sharer).
    A worker killed after it queued the batch cannot hand it over: that is torch's "worker
    exited unexpectedly", raised once the worker is seen gone, so the DataLoader's own check
    finds it dead too."""
    try:
        return int(handle.detach())
    except (OSError, EOFError) as err:
        if _gone(pid, wait):
            raise RuntimeError(f"DataLoader worker (pid {pid}) exited unexpectedly") from err
        raise


def receive(message: tuple[Any, ...]) -> torch.UntypedStorage:
    """The storage of one ring batch in this process (the slab mapped once per worker); its
    slot goes back to the worker when the storage and every view of it are freed."""
    token, pid, header_h, slot, generation, key, slab_h, nbytes, retired = message
    with _rings_lock:
        ring = _rings.get(token)
        if ring is None:
            if header_h is None:
                _close(slab_h)
                raise RuntimeError(
                    f"a DataLoader batch names slot {slot} of the ring of worker {pid}, which "
                    "this process has not mapped (was the batch pickled twice, or did it come "
                    "from another process?)"
                )
            header = _native.receive_shared(
                _detach(header_h, pid), HEADER_BYTES, [(0, HEADER_BYTES)]
            )
            ring = _RemoteRing(header[0], pid)
            _rings[token] = ring
            _watcher().watch(pid)
        else:
            _close(header_h)
        for old in retired:
            ring.slabs.pop(old, None)
        slab = ring.slabs.get(key)
        if slab is None:
            if slab_h is None:
                raise RuntimeError(
                    f"a DataLoader batch names slab {key} of worker {pid}, which this process "
                    "has not mapped"
                )
            buffer = _native.receive_shared(_detach(slab_h, pid), nbytes, [(0, nbytes)])[0]
            slab = ring.slabs[key] = _RemoteSlab(buffer)
            _by_address[buffer.address] = slab
        else:
            _close(slab_h)
    view = memoryview(cast(Any, slab.buffer))
    weakref.finalize(view, _release, ring.header, slab, slot, generation)
    return torch.frombuffer(view, dtype=torch.uint8).untyped_storage()


def pin_slabs(td: TD) -> bool:
    """Registers the slabs that ``td``'s leaves view as pinned memory (CUDA, once per slab);
    True when every leaf is then pinned (``pin_memory()`` can return ``td`` itself)."""
    if not _by_address:
        return False
    from .._core.walk import leaves

    for _, _, value in leaves(td):
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            return False
        slab = _by_address.get(value.untyped_storage().data_ptr())
        if slab is None or not slab.pin():
            return False
    return True


def forget(pid: int) -> None:
    """Forgets the rings of worker ``pid`` (it has exited): their slabs stay mapped only as
    long as batches from them live."""
    with _rings_lock:
        for token in [t for t, r in _rings.items() if r.pid == pid]:
            del _rings[token]


def mapped_rings() -> int:
    """Number of worker rings this process maps now (for tests and diagnostics)."""
    with _rings_lock:
        return len(_rings)


class _Watcher:
    """A daemon thread that forgets the rings of workers that exit (a pidfd each where the
    platform has them, else a liveness check twice a second)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pids: dict[int, int | None] = {}  # pid -> its pidfd
        self.wake_r, self.wake_w = os.pipe()
        self.thread = threading.Thread(target=self.run, name="tensordict-rs-ring", daemon=True)
        self.thread.start()

    def watch(self, pid: int) -> None:
        """Forgets the rings of ``pid`` once it exits (at once if it is gone already)."""
        with self.lock:
            if pid in self.pids:
                return
            if hasattr(os, "pidfd_open"):
                try:
                    self.pids[pid] = os.pidfd_open(pid)
                except ProcessLookupError:
                    gone = True
                else:
                    gone = False
            else:
                self.pids[pid] = None
                gone = False
        if gone:
            forget(pid)
        else:
            os.write(self.wake_w, b"w")

    def run(self) -> None:
        while True:
            with self.lock:
                fds = {fd: pid for pid, fd in self.pids.items() if fd is not None}
                polled = len(fds) < len(self.pids)
            poller = select.poll()
            poller.register(self.wake_r, select.POLLIN)
            for fd in fds:
                poller.register(fd, select.POLLIN)
            events = poller.poll(500 if polled else None)
            gone: list[tuple[int, int | None]] = []
            for fd, _ in events:
                if fd == self.wake_r:
                    os.read(self.wake_r, 4096)
                elif fd in fds:
                    gone.append((fds[fd], fd))
            if polled:
                with self.lock:
                    for pid, pidfd in self.pids.items():
                        if pidfd is None and not _alive(pid):
                            gone.append((pid, None))
            for pid, pidfd in gone:
                with self.lock:
                    self.pids.pop(pid, None)
                if pidfd is not None:
                    os.close(pidfd)
                forget(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_the_watcher: _Watcher | None = None


def _watcher() -> _Watcher:
    global _the_watcher
    if _the_watcher is None:
        _the_watcher = _Watcher()
    return _the_watcher


def _after_fork_in_child() -> None:
    """A forked child (a fork-started worker) neither owns its parent's rings nor its thread."""
    global _the_watcher, _rings_lock
    if _the_watcher is not None:  # its thread is not in the child: nor are its descriptors
        for fd in [_the_watcher.wake_r, _the_watcher.wake_w, *_the_watcher.pids.values()]:
            if fd is not None:
                os.close(fd)
    _rings.clear()
    _by_address.clear()
    _rings_lock = threading.RLock()
    _the_watcher = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
