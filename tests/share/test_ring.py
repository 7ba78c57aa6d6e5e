"""DataLoader workers through a reused ring of shared slabs (``share/ring.py``): batches the user
keeps stay correct while the loader runs on, slots are reused, nothing leaks over 10,000
batches, a killed worker raises and leaves nothing mapped, with every start method."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import time
import weakref
from typing import Any, cast

import pytest
import tensordict_rs as rs
import torch
from tensordict_rs import _native
from tensordict_rs.share import ring as _ring
from tensordict_rs.share import ring_receive
from torch.utils.data import DataLoader

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="the ring needs memfds")

METHODS = [m for m in ("fork", "spawn", "forkserver") if m in mp.get_all_start_methods()]
ROWS = 1000


def identity(batch: Any) -> Any:
    """The collate_fn: ``__getitems__`` already returns the batch."""
    return batch


def _dataset(rows: int = ROWS, flat: bool = False) -> rs.TensorDict:
    """Rows whose every value names its row: batches are checked against the indices. A flat
    tree's batches cross as a slot and the key of their kind (``ring.reduce_batch``), a nested
    one's through the general reducer."""
    base = torch.arange(rows, dtype=torch.float32)
    c = (base * 2).view(rows, 1, 1).expand(rows, 2, 3).contiguous()
    return rs.TensorDict(
        {
            "a": base.view(rows, 1).expand(rows, 16).contiguous(),
            "b": torch.arange(rows, dtype=torch.int64) * 3,
            **({"c": c} if flat else {"nested": {"c": c}}),
        },
        batch_size=[rows],
    ).share_memory_()


def _check(batch: Any, rows: torch.Tensor) -> None:
    rows_f = rows.to(torch.float32)
    assert torch.equal(batch["a"], rows_f.view(-1, 1).expand(-1, 16))
    assert torch.equal(batch["b"], rows * 3)
    c = batch["c"] if "c" in batch.keys() else batch["nested", "c"]
    assert torch.equal(c, (rows_f * 2).view(-1, 1, 1).expand(-1, 2, 3))


def _kinds() -> int:
    """Kinds of flat batches the main process has had described by the rings it maps."""
    with ring_receive._rings_lock:
        return sum(len(r.batches) for r in ring_receive._rings.values())


def _order(seed: int, rows: int = ROWS) -> list[int]:
    return torch.randperm(rows, generator=torch.Generator().manual_seed(seed)).tolist()


def _loader(td: Any, order: list[int], batch: int, **kwargs: Any) -> DataLoader:
    kwargs.setdefault("num_workers", 2)
    return DataLoader(td, batch_size=batch, sampler=order, collate_fn=identity, **kwargs)


def _ring_batch(batch: Any) -> bool:
    """Whether ``batch`` views a worker's ring slab (mapped by this process)."""
    leaf = batch["a"]
    return leaf.untyped_storage().data_ptr() in ring_receive._by_address


def _wait_for(condition: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        gc.collect()
        time.sleep(0.05)


@pytest.mark.parametrize("flat", [False, True], ids=["nested", "flat"])
@pytest.mark.parametrize("method", METHODS)
def test_kept_batches_stay_correct_while_the_loader_runs_on(method: str, flat: bool) -> None:
    td = _dataset(flat=flat)
    order = _order(0)
    batch = 32
    loader = _loader(td, order, batch, multiprocessing_context=method)
    kept = []
    ring_batches = 0
    for i, b in enumerate(loader):
        rows = torch.tensor(order[i * batch : (i + 1) * batch])
        _check(b, rows)
        ring_batches += _ring_batch(b)
        if i % 3 == 0:
            kept.append((b, rows))  # the others are freed: their slots are reused
    assert ring_batches == len(loader)  # every batch came through a ring
    for b, rows in kept:  # none of them was overwritten by a later batch
        _check(b, rows)
    # a kept leaf alone keeps its slot too
    leaf = kept[0][0]["b"]
    rows0 = kept[0][1]
    del kept, b
    for i, _b in enumerate(_loader(td, order, batch, multiprocessing_context=method)):
        if i > 10:
            break
    assert torch.equal(leaf, rows0 * 3)


@pytest.mark.parametrize("flat", [False, True], ids=["nested", "flat"])
def test_a_user_who_keeps_every_batch_gets_correct_data(flat: bool) -> None:
    td = _dataset(flat=flat)
    order = _order(1)
    batch = 8  # 125 batches: far more than a ring holds (fresh arenas once it is dry)
    batches = list(_loader(td, order, batch, persistent_workers=True))
    assert len(batches) == ROWS // batch
    for i, b in enumerate(batches):
        _check(b, torch.tensor(order[i * batch : (i + 1) * batch]))
    assert sum(map(_ring_batch, batches)) <= 2 * _ring.MAX_SLOTS  # the rest: fresh arenas


# What a collate_fn that keeps the batches it returns holds in its worker: (batch, its copy).
_kept_in_worker: list[tuple[Any, Any]] = []


def _changed_kept_batches() -> int:
    """Batches this worker kept whose data no longer match their copy."""
    return sum(
        any(not torch.equal(old[k], copy[k]) for k in ("a", "b")) for old, copy in _kept_in_worker
    )


def keep_every_batch(batch: Any) -> Any:
    """A collate_fn that keeps every batch it returns (a cache): the batch, and how many of the
    batches kept before it were found changed in the worker."""
    changed = _changed_kept_batches()
    _kept_in_worker.append((batch, batch.clone()))
    return batch, changed


def keep_the_last_batches(batch: Any) -> Any:
    """A collate_fn that keeps the last few batches it returned (a previous-batch logic)."""
    changed = _changed_kept_batches()
    _kept_in_worker.append((batch, batch.clone()))
    del _kept_in_worker[:-3]
    return batch, changed


@pytest.mark.parametrize("flat", [False, True], ids=["nested", "flat"])
@pytest.mark.parametrize("method", METHODS)
def test_batches_the_worker_keeps_are_not_overwritten(method: str, flat: bool) -> None:
    """A slot is free only once both the main process and the worker have dropped its batch:
    a batch the main process frees at once but the worker's collate_fn keeps is never
    overwritten by a later batch (an attack found 17 of 40 such batches overwritten)."""
    order = _order(11)
    batch = 25
    loader = DataLoader(
        _dataset(flat=flat),
        batch_size=batch,
        sampler=order,
        collate_fn=keep_every_batch,
        num_workers=2,
        multiprocessing_context=method,
    )
    ring_batches = 0
    for i, (b, changed) in enumerate(loader):
        assert changed == 0, f"batch {i}: {changed} batches kept in the worker were overwritten"
        _check(b, torch.tensor(order[i * batch : (i + 1) * batch]))
        ring_batches += _ring_batch(b)
        del b  # freed at once in the main process: only the worker holds it now
    assert ring_batches > 0


def test_a_slot_the_worker_kept_returns_once_both_sides_dropped_it() -> None:
    """The worker keeps its last three batches: each slot returns once the worker drops its
    batch too, so a few slots serve every batch and no kept batch changes."""
    order = _order(12)
    batch = 16
    loader = DataLoader(
        _dataset(flat=True),
        batch_size=batch,
        sampler=order,
        collate_fn=keep_the_last_batches,
        num_workers=2,
        persistent_workers=True,
    )
    addresses = set()
    for i, (b, changed) in enumerate(loader):
        assert changed == 0, f"batch {i}: {changed} batches kept in the worker were overwritten"
        _check(b, torch.tensor(order[i * batch : (i + 1) * batch]))
        assert _ring_batch(b)
        addresses.add(b["a"].untyped_storage().data_ptr())
        del b
    # two workers, each a ring of its kept batches plus a few, not one arena per batch (62)
    assert len(addresses) <= 2 * 9, len(addresses)


def test_slots_are_reused() -> None:
    td = _dataset()
    loader = _loader(td, _order(2), 16, persistent_workers=True)
    addresses = set()
    for b in loader:
        addresses.add(b["a"].untyped_storage().data_ptr())
        del b
    # two workers, each a ring of a few slots, not one arena per batch (62 batches)
    assert len(addresses) <= 2 * 6, len(addresses)


def test_persistent_workers_across_epochs_and_two_loaders_at_once() -> None:
    """With the default start method (``make test-forkserver`` runs it under forkserver)."""
    _wait_for(lambda: ring_receive.mapped_rings() == 0, "the rings of earlier loaders")
    td = _dataset()
    other = _dataset(300)
    first = _loader(td, _order(3), 50, persistent_workers=True)
    second = _loader(other, _order(4, 300), 7, persistent_workers=True)
    for _epoch in range(3):
        for i, (x, y) in enumerate(zip(first, second, strict=False)):
            _check(x, torch.tensor(_order(3)[i * 50 : (i + 1) * 50]))
            _check(y, torch.tensor(_order(4, 300)[i * 7 : (i + 1) * 7]))
            assert _ring_batch(x) and _ring_batch(y)
    assert ring_receive.mapped_rings() == 4  # one ring per worker, kept across epochs
    del first, second, x, y
    _wait_for(lambda: ring_receive.mapped_rings() == 0, "the rings of the exited workers")


@pytest.mark.parametrize("flat", [False, True], ids=["nested", "flat"])
def test_batches_that_grow_get_larger_slabs(flat: bool) -> None:
    td = _dataset(flat=flat)
    sizes = [4, 4, 64, 64, 200, 8, 300, 300]
    order = _order(5)
    batches, at = [], 0
    for n in sizes:
        batches.append(order[at : at + n])
        at += n
    loader = DataLoader(td, batch_sampler=batches, collate_fn=identity, num_workers=1)
    for rows, b in zip(batches, loader, strict=True):
        _check(b, torch.tensor(rows))
        assert _ring_batch(b)


def test_pin_memory_loader() -> None:
    td = _dataset()
    order = _order(6)
    with pytest.warns(UserWarning) if not torch.cuda.is_available() else _nothing():
        loader = _loader(td, order, 40, pin_memory=True)
        for i, b in enumerate(loader):
            _check(
                b.cpu() if torch.cuda.is_available() else b,
                torch.tensor(order[i * 40 : (i + 1) * 40]),
            )
            if torch.cuda.is_available():
                assert b["a"].is_pinned()


def test_flat_batches_cross_as_a_slot_and_a_kind() -> None:
    """A flat batch's description crosses once per worker and kind (the last, smaller batch
    of an epoch is a second kind); a nested batch's never."""
    _wait_for(lambda: ring_receive.mapped_rings() == 0, "the rings of earlier loaders")
    order = _order(9)
    loader = _loader(_dataset(flat=True), order, 64, persistent_workers=True)
    for _epoch in range(2):
        for i, b in enumerate(loader):
            _check(b, torch.tensor(order[i * 64 : (i + 1) * 64]))
            assert _ring_batch(b)
    # two workers; 1000 rows in batches of 64: full batches and one of 40 rows (one worker)
    assert _kinds() == 3
    del loader, b
    _wait_for(lambda: ring_receive.mapped_rings() == 0, "the rings of the exited workers")
    for _ in _loader(_dataset(), order, 64):
        pass
    assert _kinds() == 0


def test_a_flat_batch_copies_with_jobs_prepared_once_per_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker side of a flat batch, driven here: a slot's copies are prepared once and
    reused while the dataset keeps its plan and the batch its layout; a leaf replaced in the
    dataset or a new batch size prepares them again; a kept batch keeps its slot."""
    monkeypatch.setattr(_ring, "_worker_ring", None)  # this process's own ring, for this test
    base = torch.arange(ROWS, dtype=torch.float32)
    td = rs.TensorDict(
        {
            "a": base.view(ROWS, 1).expand(ROWS, 16).contiguous(),
            "b": torch.arange(ROWS, dtype=torch.int64) * 3,
            "c": (base * 2).view(ROWS, 1, 1).expand(ROWS, 2, 3).contiguous(),
        },
        batch_size=[ROWS],
    )
    rows = [torch.tensor(_order(seed)[:32]) for seed in range(3)]
    first = _ring.gather_batch(td, rows[0])
    assert first is not None
    _check(first, rows[0])
    ring = _ring.local_ring()
    assert ring is not None
    prepared = dict(ring.prepared)
    assert len(prepared) == 1
    del first  # its slot is free again: the next batch takes it, with the same copies
    again = _ring.gather_batch(td, rows[1])
    assert again is not None
    _check(again, rows[1])
    assert ring.prepared == prepared
    kept = again  # kept: the next batch goes into another slot, prepared for it
    other = _ring.gather_batch(td, rows[2])
    assert other is not None
    _check(other, rows[2])
    _check(kept, rows[1])
    assert len(ring.prepared) == 2
    del other
    # a leaf of the dataset replaced: a new plan, so the slot's copies are made again
    td["b"] = torch.arange(ROWS, dtype=torch.int64) * 5
    replaced = _ring.gather_batch(td, rows[2])
    assert replaced is not None
    assert torch.equal(replaced["b"], rows[2] * 5)
    slot = replaced.__dict__[_ring.MARK][1]
    assert ring.prepared[slot].plan is not prepared[0].plan
    del replaced
    td["b"] = torch.arange(ROWS, dtype=torch.int64) * 3
    # another batch size: another layout, its copies made for it
    fewer = _ring.gather_batch(td, rows[0][:5])
    assert fewer is not None
    _check(fewer, rows[0][:5])
    _check(kept, rows[1])
    # the ring and its shared memory go with the batches (later tests count descriptors)
    owner = weakref.ref(ring)
    del ring, kept, again, fewer
    _ring._worker_ring = None
    gc.collect()
    assert owner() is None


def unsqueeze_a(batch: Any) -> Any:
    """A collate_fn that changes a leaf's shape in place in the worker."""
    batch["a"].unsqueeze_(1)
    return batch


def add_d(batch: Any) -> Any:
    """A collate_fn that adds an entry in the worker."""
    batch["d"] = batch["b"] + 1
    return batch


@pytest.mark.parametrize("collate", [unsqueeze_a, add_d])
def test_a_batch_changed_in_the_worker_crosses_as_changed(collate: Any) -> None:
    """A flat ring batch changed after the gather (by a collate_fn) is not the kind it was
    described as: it crosses through the general reducer, changes included."""
    order = _order(10)
    loader = DataLoader(
        _dataset(flat=True), batch_size=50, sampler=order, collate_fn=collate, num_workers=2
    )
    for i, b in enumerate(loader):
        rows = torch.tensor(order[i * 50 : (i + 1) * 50])
        if collate is unsqueeze_a:
            assert b["a"].shape == (50, 1, 16)
            b["a"] = b["a"].squeeze(1)
        else:
            assert torch.equal(b["d"], rows * 3 + 1)
        _check(b, rows)
        assert _ring_batch(b)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: Any) -> None:
        return None


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")
def test_10000_batches_keep_descriptors_and_memory_flat() -> None:
    rows = 2048
    td = rs.TensorDict(
        {f"f{i}": torch.rand(rows, 64) for i in range(8)}, batch_size=[rows]
    ).share_memory_()
    batch = 16  # 32 KiB a batch: a leak of one batch each is 300 MiB over the run
    total = 10_000
    sampler = torch.randint(0, rows, (batch * total,), generator=torch.Generator().manual_seed(7))
    loader = DataLoader(
        td,
        batch_size=batch,
        sampler=sampler.tolist(),
        collate_fn=identity,
        num_workers=2,
        persistent_workers=True,
    )
    it = iter(loader)
    pids = [os.getpid()] + [w.pid for w in it._workers]  # type: ignore[attr-defined]
    before: dict[int, tuple[int, int]] = {}
    checked = 0
    for i in range(total):
        b = next(it)
        if i % 997 == 0:  # a few batches checked in full
            rows_i = sampler[i * batch : (i + 1) * batch]
            assert torch.equal(b["f3"], td["f3"][rows_i])
            checked += 1
        if i == 1000:  # warm: the rings are full size, every lazy import done
            gc.collect()
            before = {pid: (_fds(pid), _rss(pid)) for pid in pids}
        del b
    gc.collect()
    after = {pid: (_fds(pid), _rss(pid)) for pid in pids}
    for pid in pids:
        fds0, rss0 = before[pid]
        fds1, rss1 = after[pid]
        assert fds1 - fds0 <= 4, (pid, fds0, fds1)
        assert rss1 - rss0 <= 24 << 20, (pid, rss0, rss1)
    assert checked == 11
    del it, loader


@pytest.mark.parametrize("flat", [False, True], ids=["nested", "flat"])
def test_a_killed_worker_raises_and_leaves_nothing_mapped(flat: bool) -> None:
    _wait_for(lambda: ring_receive.mapped_rings() == 0, "the rings of earlier loaders")
    gc.collect()
    regions = _native.shared_regions()
    td = _dataset(flat=flat)
    base = _native.shared_regions()
    loader = _loader(td, _order(8), 10, persistent_workers=True, timeout=60)
    it = iter(loader)
    got = [next(it) for _ in range(4)]
    assert all(map(_ring_batch, got))
    assert _native.shared_regions() > base
    victim = it._workers[0].pid  # type: ignore[attr-defined]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=f"worker.*{victim}|{victim}.*exited"):
        for _ in range(200):
            got.append(next(it))
    for i, b in enumerate(got[:4]):  # batches received before the death are intact
        _check(b, torch.tensor(_order(8)[i * 10 : (i + 1) * 10]))
    del got, b, it, loader
    _wait_for(lambda: ring_receive.mapped_rings() == 0, "the dead worker's ring to be forgotten")
    _wait_for(lambda: _native.shared_regions() <= base, "every slab to be unmapped")
    del td
    gc.collect()
    assert _native.shared_regions() <= regions


def test_outside_workers_nothing_changes() -> None:
    td = _dataset()
    rows = torch.tensor([5, 1, 7])
    b = td.__getitems__(rows.tolist())
    _check(b, rows)
    assert not _ring_batch(b)
    assert _ring.local_ring() is None


def test_the_slot_words_refuse_stale_generations() -> None:
    header = _native.packed_arena(64)
    slot, generation = _native.ring_acquire(header, 2)  # type: ignore[misc]
    assert (slot, generation) == (0, 1)
    assert _native.ring_transition(header, 0, 1, _ring.HELD, _ring.SENT)
    assert _native.ring_transition(header, 0, 1, _ring.SENT, _ring.FREE)
    assert _native.ring_acquire(header, 2) == (0, 2)
    assert not _native.ring_transition(header, 0, 1, _ring.SENT, _ring.FREE)
    assert _native.ring_state(header, 0) == (2, _ring.HELD)
    with pytest.raises(ValueError, match="slots do not fit"):
        _native.ring_acquire(header, 9)


def test_a_sent_slot_is_free_only_once_both_sides_dropped_it() -> None:
    ring = _ring.WorkerRing()
    for worker_first in (True, False):
        got = ring.take(100)
        assert got is not None
        slot, generation, _slab = got
        assert ring.claim([(slot, generation)])
        assert _native.ring_state(ring.header, slot) == (generation, _ring.SHARED)
        assert not ring.claim([(slot, generation)])  # sent already: pickled twice, copied
        if worker_first:
            ring.drop(slot, generation)
            assert _native.ring_state(ring.header, slot) == (generation, _ring.SENT)
            ring_receive._release(ring.header, cast(Any, None), slot, generation)
        else:
            ring_receive._release(ring.header, cast(Any, None), slot, generation)
            assert _native.ring_state(ring.header, slot) == (generation, _ring.HELD)
            assert _native.ring_acquire(ring.header, len(ring.slabs)) is None  # the worker's
            ring.drop(slot, generation)
        assert _native.ring_state(ring.header, slot) == (generation, _ring.FREE)


class _LostHandle:
    """A descriptor handle whose worker is gone: fetching it fails as resource_sharer does."""

    def detach(self) -> int:
        raise ConnectionResetError(104, "Connection reset by peer")


def test_a_descriptor_lost_with_its_killed_worker_is_torchs_worker_error() -> None:
    """A worker killed after it queued a batch cannot hand over the batch's slab: the fetch of
    the descriptor fails, which must read as torch's "worker exited unexpectedly" once the
    worker is gone (a zombie too), and stay the connection error while the worker lives."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(ConnectionResetError):
            ring_receive._detach(_LostHandle(), child.pid, wait=0.2)
        child.kill()  # not reaped yet: a zombie
        with pytest.raises(RuntimeError, match=f"worker \\(pid {child.pid}\\) exited unexpectedly"):
            ring_receive._detach(_LostHandle(), child.pid, wait=10.0)
        child.wait()  # reaped: the pid is gone
        with pytest.raises(RuntimeError, match="exited unexpectedly"):
            ring_receive._detach(_LostHandle(), child.pid, wait=10.0)
    finally:
        child.kill()
        child.wait()


class _SlowToPickle:
    """Takes ``seconds`` to pickle (in the queue's feeder thread)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __reduce__(self) -> tuple[Any, ...]:
        time.sleep(self.seconds)
        return (_SlowToPickle, (self.seconds,))


def test_a_worker_exit_waits_for_the_queue_feeder_then_goes_on() -> None:
    """``join_feeders`` (registered at a worker's exit with its ring) lets a feeder that is
    still pickling finish before Python shuts down, and does not wait past its grace for one
    that never ends (a feeder idle on an open queue, or blocked on a full pipe)."""
    closed: mp.Queue = mp.get_context("spawn").Queue()
    closed.put(_SlowToPickle(0.3))
    closed.close()  # the feeder ends once it has pickled and written the item
    t0 = time.monotonic()
    assert _ring.join_feeders(grace=5.0) == 1  # waited for the pickling, then it ended
    assert time.monotonic() - t0 < 4.0
    left_open: mp.Queue = mp.get_context("spawn").Queue()
    left_open.put(1)  # its feeder then waits for more, forever
    assert left_open.get(timeout=5) == 1
    t0 = time.monotonic()
    assert _ring.join_feeders(grace=0.2) == 0
    assert time.monotonic() - t0 >= 0.2
    left_open.close()
    left_open.join_thread()
