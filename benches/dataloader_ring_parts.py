"""CPU per DataLoader ring batch, part by part, in one process (no DataLoader, no workers).

    python benches/dataloader_ring_parts.py [--width 16] [--reps 9]

The workload of ``benches/dataloader_ring.py`` (20,000 rows of 64 float32 leaves of ``--width``
values, random 256-row batches, torch at 1 thread). Each part is what one batch costs a worker
or the main process in our code, timed with the thread's CPU clock (best of ``--reps`` runs of
200 batches, microseconds per batch), so that a part can be compared before and after a change
on a loaded machine, where wall figures of 3 processes on 2 CPUs swing by 2x:

- ``0 workers``: ``td[rows]``, the batch a 0-worker loader makes (one native gather);
- ``worker``: the gather into a ring slot (what ``__getitems__`` does in a worker), then
  pickling for the data queue;
- ``main``: unpickling the batch (``rebuild_batch``) and freeing it (its slot goes back);
- ``copy``: the native gather of the rows alone, into a ring slot (the copy limit of a batch).

torch's DataLoader adds its own queues, threads and sampler to each side (see
``benches/dataloader_ring_cpu.py`` for the whole, per process and thread).
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing import reduction
from typing import Any

import tensordict_rs
import torch
from dataloader_ring import BATCH, LEAVES, ROWS
from tensordict_rs import _native
from tensordict_rs.share import ring

N = 200
TURN = 8  # batches sent before the main side frees them (a ring holds at most 16 slots)


def _best(fn: Callable[[], Any], reps: int) -> float:
    """Microseconds of thread CPU per call of ``fn``: the best of ``reps`` runs of N calls."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time()
        for _ in range(N):
            fn()
        best = min(best, time.thread_time() - t0)
    return best / N * 1e6


def run(width: int, reps: int) -> dict[str, float]:
    """The parts' microseconds of CPU per batch."""
    torch.set_num_threads(1)
    path = tempfile.mkdtemp(prefix="tdrs-ring-parts-", dir="/dev/shm")
    try:
        gen = torch.Generator().manual_seed(0)
        src = {f"f{i}": torch.rand(ROWS, width, generator=gen) for i in range(LEAVES)}
        tensordict_rs.TensorDict(src, batch_size=[ROWS]).memmap_(path)
        td = tensordict_rs.TensorDict.load_memmap(path)
        indices = [torch.randint(0, ROWS, (BATCH,), generator=gen) for _ in range(N)]
        turn = iter(range(1 << 62))

        def rows() -> torch.Tensor:
            return indices[next(turn) % N]

        def worker() -> bytes:
            batch = ring.gather_batch(td, rows())
            return bytes(reduction.ForkingPickler.dumps((0, batch)))

        pickle.loads(worker())  # this process maps the ring once (the batch is freed)
        sides = {"worker": float("inf"), "main": float("inf")}
        for _ in range(reps):
            spent = {"worker": 0.0, "main": 0.0}
            for _ in range(N // TURN):
                t0 = time.thread_time()
                sent = [worker() for _ in range(TURN)]
                t1 = time.thread_time()
                for message in sent:
                    pickle.loads(message)  # rebuilt, then freed: its slot goes back
                spent["worker"] += t1 - t0
                spent["main"] += time.thread_time() - t1
            sides = {k: min(v, spent[k] / N * 1e6) for k, v in sides.items()}
        batch = ring.gather_batch(td, rows())
        owner = ring.local_ring()
        assert batch is not None and owner is not None
        jobs = owner.prepared[batch.__dict__[ring.MARK][1]].jobs
        return {
            "0 workers: td[rows]": _best(lambda: td[rows()], reps),
            "worker: gather into the ring + pickle": sides["worker"],
            "main: unpickle (rebuild) + free": sides["main"],
            "copy: the native gather alone": _best(
                lambda: _native.gather_rows(rows().data_ptr(), BATCH, jobs, False), reps
            ),
        }
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    for name, us in run(args.width, args.reps).items():
        print(f"{name:40s} {us:7.1f} us/batch")
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
