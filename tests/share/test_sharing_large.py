"""Sharing trees whose large leaves fill several arenas (one memfd per writer thread, see
``rust/sys/anon/unix.rs``): they cross to spawn and forkserver children over a Queue and back from
DataLoader workers with one descriptor per arena, the data equal, writes seen both ways.

Every wait on another process has a timeout (``WAIT``), so that nothing here can hang CI.
"""

from __future__ import annotations

from typing import Any

import pytest
import tensordict
import torch
from tensordict_rs import TensorDict
from torch.utils.data import DataLoader

from .test_sharing import (
    RING_SPARE,
    WAIT,
    context,
    identity,
    memfds,
    regions,
    ring_batch,
    settles,
    steady,
)

MIB = 1 << 20
BIG = 48 * MIB // 4  # float32 elements of one big leaf: 4 of them are 3 arenas' worth
SMALL = 200


def big_tree() -> TensorDict:
    """4 big leaves (48 MiB each, leaf i holds arange + i) and 200 small ones (i everywhere)."""
    td = TensorDict({}, [])
    for i in range(4):
        td["big", f"b{i}"] = torch.arange(BIG, dtype=torch.float32) + i
    for i in range(SMALL):
        td["small", f"s{i}"] = torch.full((16,), float(i))
    return td


def arenas(td: Any) -> set[int]:
    """The arenas (mapped regions) that the leaves of ``td`` slice."""
    return {t._buffer.region_id for t in td.values(True, True)}


def matches_big_tree(td: Any) -> bool:
    """Whether ``td`` holds what ``big_tree`` made, leaf by leaf."""
    base = torch.arange(BIG, dtype=torch.float32)
    return all(torch.equal(td["big", f"b{i}"], base + i) for i in range(4)) and all(
        torch.equal(td["small", f"s{i}"], torch.full((16,), float(i))) for i in range(SMALL)
    )


def big_child(inbox: Any, outbox: Any) -> None:
    """Receives the tree over the Queue, checks and writes it, reads the parent's writes back."""
    start = memfds()
    td = inbox.get(timeout=WAIT)
    report = {
        "equal": matches_big_tree(td),
        "arenas": len(arenas(td)),
        "small_arenas": len(arenas(td["small"])),
        "new_memfds": memfds() - start,
        "memmap": td.is_memmap(),
        "locked": td.is_locked,
    }
    td["big", "b3"][-1] = -5.0  # the parent must see these
    td["small", "s7"][0] = -7.0
    outbox.put(report)
    assert inbox.get(timeout=WAIT) == "written"
    outbox.put((float(td["big", "b0"][5]), float(td["small", "s199"][15])))
    del td
    assert inbox.get(timeout=WAIT) is None


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_big_tree_crosses_as_one_fd_per_arena(method: str) -> None:
    ctx = context(method)
    before = steady(memfds)
    td = big_tree().memmap_(num_threads=3)
    # 192 MiB of big leaves, 3 writers: 3 arenas; the small leaves packed into one of them
    assert len(arenas(td)) == 3 and len(arenas(td["small"])) == 1
    assert settles(memfds, before + 3)
    assert matches_big_tree(td)
    ref = tensordict.TensorDict(big_tree().to_dict(), []).memmap_()
    for key in td.keys(True, True):
        assert torch.equal(td[key], ref[key]), key
    del ref
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=big_child, args=(inbox, outbox), daemon=True)
    child.start()
    try:
        inbox.put(td)
        report = outbox.get(timeout=WAIT)
        assert report == {
            "equal": True,
            "arenas": 3,
            "small_arenas": 1,
            "new_memfds": 3,  # one descriptor per arena, whatever the number of leaves
            "memmap": True,
            "locked": True,
        }
        # the child's writes, seen here
        assert float(td["big", "b3"][-1]) == -5.0 and float(td["small", "s7"][0]) == -7.0
        # ours, seen there
        td["big", "b0"][5] = 99.0
        td["small", "s199"][15] = 42.0
        inbox.put("written")
        assert outbox.get(timeout=WAIT) == (99.0, 42.0)
        inbox.put(None)
        child.join(WAIT)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
    del td
    assert settles(memfds, before)  # every arena freed with the tree


ROWS, BATCH = 8, 4
ROW = 8 * MIB // 4  # float32 elements per row of one leaf: a batch of 4 leaves is 128 MiB


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_workers_send_big_batches_as_a_few_fds(method: str) -> None:
    rows = torch.arange(ROWS * ROW, dtype=torch.float32).reshape(ROWS, ROW)
    data = TensorDict({f"k{i}": rows + i for i in range(4)}, [ROWS]).memmap_()
    source = data.clone()
    loader = DataLoader(
        data,
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        collate_fn=identity,
        multiprocessing_context=context(method),
        persistent_workers=False,
        timeout=WAIT,
    )
    before = steady(memfds)
    batches = list(loader)
    assert len(batches) == ROWS // BATCH
    per_batch = [len(regions(b)) for b in batches]
    # 128 MiB of big leaves per batch: one ring slot, or with the ring off at most one arena
    # per writer (2 at most at this size)
    assert all(1 <= n <= 2 for n in per_batch), per_batch
    held = set().union(*(regions(b) for b in batches))
    assert len(held) == sum(per_batch)
    spare = RING_SPARE if all(ring_batch(b) for b in batches) else 0
    assert settles(memfds, before + len(held), slack=spare)
    rows = []
    for b in batches:
        assert isinstance(b, TensorDict) and b.batch_size == (BATCH,)
        first = b["k0"][:, 0].long() // ROW  # which rows of the dataset this batch holds
        for i in range(4):
            assert torch.equal(b[f"k{i}"], source[f"k{i}"][first]), i
        rows.append(first)
    assert torch.equal(torch.cat(rows).sort().values, torch.arange(ROWS))
    del batches, b
    assert settles(memfds, before)


def test_one_writer_keeps_one_arena() -> None:
    td = big_tree().memmap_(num_threads=1)
    assert len(arenas(td)) == 1
    assert matches_big_tree(td)


def plain_child(td: Any, outbox: Any) -> None:
    """Reports whether the plain big leaves it was started with arrived whole, and in how many
    arenas."""
    base = torch.arange(BIG, dtype=torch.float32)
    equal = all(torch.equal(td[f"p{i}"], base * (i + 1)) for i in range(3))
    outbox.put((equal, len(arenas(td)), bool(td["tag"] == 7)))


def test_plain_big_leaves_reach_a_spawn_child_in_several_arenas() -> None:
    """Plain leaves are copied into new arenas when the tree is pickled: under spawn, every one
    of them must stay open until the child has its descriptor, not only the first."""
    ctx = context("spawn")
    base = torch.arange(BIG, dtype=torch.float32)
    td = TensorDict({f"p{i}": base * (i + 1) for i in range(3)}, [])
    td["tag"] = torch.tensor(7)
    outbox = ctx.Queue()
    child = ctx.Process(target=plain_child, args=(td, outbox), daemon=True)
    child.start()
    try:
        equal, count, tag = outbox.get(timeout=WAIT)
        child.join(WAIT)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
    assert equal and tag
    # 144 MiB of big leaves: 2 arenas where this process has 2 CPUs or more
    assert 1 <= count <= 2
