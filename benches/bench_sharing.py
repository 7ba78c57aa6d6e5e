"""Sharing across processes: DataLoader batches from workers, and a spawned child receiving a
10,000-leaf anonymous tree.

DataLoader: a dataset of 64 float32 [rows, 16] leaves (64 B per leaf and row; 100,000 rows,
400 MiB at full scale) saved by the reference under /dev/shm and loaded by both libraries;
``DataLoader(td, batch_size=256, sampler=RandomSampler(...), collate_fn=identity,
num_workers=W, persistent_workers=True)`` with the default start method. The loaders are made
once and their workers started in the untimed warm-up round; a timed round iterates one epoch
of ``dl_batches()`` random batches and touches every leaf of every batch.

Spawn: one spawned child per library waits on a Queue; a timed round puts a 10,000-leaf
anonymous tree (float32 [4] leaves, made by ``memmap_()``) on it and waits for the child's
answer, sent after it has unpickled the tree and counted its descriptors. The new descriptors
(count while holding the tree minus the count before, the largest over the rounds) go beside
the times.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
from typing import Any

import pytest
import tensordict
import tensordict_rs
import torch
from _harness import RESULTS, SCALE, SHM_BASE, Case, fresh_dir, measure, remove, replay, td_leaves
from _workloads import REF, RS
from torch.utils.data import DataLoader, RandomSampler

BATCH = 256
LEAVES = 64
CASES_2 = (REF, RS)
WAIT = 300


def dl_rows() -> int:
    return max(4096, int(100_000 * SCALE))


def dl_batches() -> int:
    # the reference takes 0.3-1 s per batch without workers here: keep its rounds bounded
    return max(10, min(50, int(50 * SCALE**0.5)))


def identity(batch: Any) -> Any:
    """The collate_fn: the dataset's ``__getitems__`` already returns the batch."""
    return batch


@pytest.fixture(scope="module")
def dataset_path():
    path = fresh_dir(SHM_BASE)
    gen = torch.Generator().manual_seed(0)
    rows = dl_rows()
    src = {f"f{i}": torch.rand(rows, 16, generator=gen) for i in range(LEAVES)}
    tensordict.TensorDict(src, batch_size=[rows]).memmap_(path)
    del src
    gc.collect()
    yield path
    remove(path)


def _consume(batch: Any) -> int:
    return sum(t.shape[0] for t in td_leaves(batch))


def _loader_cases(path, workers: int) -> dict[str, Case]:
    datasets = {
        REF: tensordict.TensorDict.load_memmap(path),
        RS: tensordict_rs.TensorDict.load_memmap(path),
    }
    cases = {}
    for name, td in datasets.items():
        sampler = RandomSampler(
            td, num_samples=BATCH * dl_batches(), generator=torch.Generator().manual_seed(1)
        )
        loader = DataLoader(
            td,
            batch_size=BATCH,
            sampler=sampler,
            collate_fn=identity,
            num_workers=workers,
            persistent_workers=workers > 0,
            timeout=WAIT if workers else 0,
        )

        def call(_, loader=loader):
            n = 0
            for batch in loader:
                n += _consume(batch)
            assert n == BATCH * dl_batches() * LEAVES

        cases[name] = Case(call=call)
    return cases


@pytest.mark.parametrize("case", CASES_2)
@pytest.mark.parametrize("workers", [0, 2, 4])
def test_dataloader_batches(benchmark, case, workers, dataset_path):
    workload = f"dl_w{workers}"
    measure(
        workload,
        dl_batches(),
        lambda: _loader_cases(dataset_path, workers),
        batch=BATCH,
        dataset_rows=dl_rows(),
    )
    replay(benchmark, workload, case)


# ---------------------------------------------------------------------------- spawn


def child_receiver(inbox: Any, outbox: Any) -> None:
    """Answers every tree it gets with (new fds while holding it, leaves) until None."""
    while True:
        before = len(os.listdir("/proc/self/fd"))
        item = inbox.get()
        if item is None:
            return
        outbox.put((len(os.listdir("/proc/self/fd")) - before, len(item.keys(True, True))))
        del item


def _tree(lib: Any) -> Any:
    src = {f"a{a}": {f"k{k}": torch.full((4,), float(k)) for k in range(1000)} for a in range(10)}
    return lib.TensorDict(src, batch_size=[4]).memmap_()


_SPAWN: dict[str, Any] = {"children": [], "fds": {}}


def _spawn_case(name: str, lib: Any) -> Case:
    """A child for ``lib`` and its case; a library that cannot make the tree gets a case that
    raises (recorded as its error)."""
    try:
        tree = _tree(lib)
    except OSError as err:
        message = f"memmap_() of 10,000 anonymous leaves failed: {type(err).__name__}: {err}"

        def fail(_):
            raise RuntimeError(message)

        return Case(call=fail)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=child_receiver, args=(inbox, outbox), daemon=True)
    child.start()
    _SPAWN["children"].append((child, inbox))
    fds = _SPAWN["fds"]

    def call(_):
        inbox.put(tree)
        new_fds, leaves = outbox.get(timeout=WAIT)
        assert leaves == 10_000
        fds[name] = max(fds.get(name, 0), new_fds)

    return Case(call=call)


def _spawn_cases() -> dict[str, Case]:
    return {REF: _spawn_case(REF, tensordict), RS: _spawn_case(RS, tensordict_rs)}


@pytest.mark.parametrize("case", CASES_2)
def test_spawn_child_receives_10k_leaves(benchmark, case):
    if "spawn_10k" not in RESULTS:
        try:
            measure("spawn_10k", 1, _spawn_cases)
        finally:
            for child, inbox in _SPAWN["children"]:
                inbox.put(None)
                child.join(30)
                if child.is_alive():
                    child.kill()
            _SPAWN["children"].clear()
        RESULTS["spawn_10k"]["fds"] = dict(_SPAWN["fds"])
    error = RESULTS["spawn_10k"]["cases"][case]["error"]
    if case == REF and error is not None and "Errno 24" in error:
        # The reference keeps 2 descriptors per anonymous leaf: past the fd limit it fails,
        # which is the outcome this row records (ours must still work: no xfail for it).
        pytest.xfail(f"tensordict fails past the fd limit: {error}")
    replay(benchmark, "spawn_10k", case)
