"""DataLoader ring batches in the main process (the worker side is ``ring``).

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
from typing import Any, cast

import torch

from .. import _native
from .._core.nodes import TD, TreeNode
from .ring_layout import FREE, HEADER_BYTES, HELD, SENT, SHARED, run_views


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

    __slots__ = ("batches", "header", "pid", "slabs")

    def __init__(self, header: Any, pid: int) -> None:
        self.header = header
        self.pid = pid
        self.slabs: dict[int, _RemoteSlab] = {}
        # key -> (class, batch size, device, keys, leaf runs) of a kind of flat batch
        self.batches: dict[int, tuple[Any, ...]] = {}


_rings: dict[str, _RemoteRing] = {}
_rings_lock = threading.RLock()
# storage address of a received slot -> its slab (pin_memory finds its slab from a leaf)
_by_address: weakref.WeakValueDictionary[int, _RemoteSlab] = weakref.WeakValueDictionary()


def _release(header: Any, slab: _RemoteSlab, slot: int, generation: int) -> None:
    """The last view of a ring batch died in this process: the main process's half of its slot
    is cleared. The worker dropped its own views already (SENT, the usual case): the slot is
    free again; the worker still holds the batch (SHARED: a ``collate_fn`` that keeps what it
    returns): the slot stays the worker's until its views die (``WorkerRing.drop``). Only the
    worker changes a SHARED slot meanwhile (to SENT, its own drop), so a second try settles it."""
    del slab  # kept alive (and pinned) until every batch viewing it is freed
    transition = _native.ring_transition
    for _ in range(2):
        if transition(header, slot, generation, SENT, FREE):
            return
        if transition(header, slot, generation, SHARED, HELD):
            return


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
    return _receive(message)[1]


def rebuild_batch(message: tuple[Any, ...], key: int, state: tuple[Any, ...] | None) -> TreeNode:
    """A flat ring batch (see ``reduce_batch``): its description, kept per worker ring from
    the first batch that carries it, over the storage of its slot."""
    ring, storage = _receive(message)
    if state is None:
        state = ring.batches.get(key)
        if state is None:
            raise RuntimeError(
                f"a DataLoader batch names batch kind {key} of the ring of worker {ring.pid}, "
                "which this process has not had"
            )
    else:
        cls, batch_size, device, keys, planned = state
        state = ring.batches[key] = (cls, torch.Size(batch_size), device, keys, planned)
    cls, batch_size, device, keys, planned = state
    td = cls._new_unchecked(batch_size, device)
    td._tensordict.update(zip(keys, run_views(storage, planned), strict=True))
    return td


def _receive(message: tuple[Any, ...]) -> tuple[_RemoteRing, torch.UntypedStorage]:
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
    return ring, torch.frombuffer(view, dtype=torch.uint8).untyped_storage()


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
