"""CPU time per DataLoader batch, per process and thread, tensordict-rs with 0 and 2 workers.

    python benches/dataloader_ring_cpu.py [--width 16] [--batches 1000] [--rounds 2]

The workload of ``benches/dataloader_ring.py`` (20,000 rows of 64 float32 leaves of ``--width``
values, random 256-row batches, spawn workers, torch at 1 thread), measured in CPU seconds
rather than batches per second: on a shared machine the wall ratio of 2 workers to 0 moves with
other load (3 processes get more of a loaded machine than 1), CPU time per batch much less.
Each round prints the main process's CPU per batch, each worker's, and the split by thread
(``/proc/<pid>/task``: the main thread, multiprocessing's queue feeder threads, the ring's
watcher), in microseconds per batch of the whole loader. On 2 CPUs, 2 workers can reach the
0-worker rate only while main + workers CPU per batch stays under twice the 0-worker figure.

Each round also prints the scheduler's view (``/proc/<pid>/task/*/schedstat``), per batch:
each process's time waiting in a run queue (runnable, not running), and the CPU time nobody
used (``--cpus`` x wall less what every process ran). Time that processes spend waiting in a
run queue while a CPU stays idle is lost to placement, not to work: the 2-worker gap of the
4 KiB workload on the 2-CPU VM is that (see the performance page). Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

import tensordict_rs
import torch
from dataloader_ring import LEAVES, ROWS, _loader

TICK = os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[tuple[str, str], float]:
    """CPU seconds of each thread of ``pid``: (tid, name) -> user + system time."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[(tid, name)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def _queued(pid: int) -> float:
    """Seconds the threads of ``pid`` have waited in a run queue (runnable, not running)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (FileNotFoundError, IndexError):
            continue
    return total / 1e9


def _consume(batch: Any) -> int:
    return sum(batch.get(k).shape[0] for k in batch.keys(include_nested=True, leaves_only=True))


def run(width: int, batches: int, rounds: int, cpus: int) -> None:
    torch.set_num_threads(1)
    path = tempfile.mkdtemp(prefix="tdrs-ring-cpu-", dir="/dev/shm")
    try:
        gen = torch.Generator().manual_seed(0)
        src = {f"f{i}": torch.rand(ROWS, width, generator=gen) for i in range(LEAVES)}
        tensordict_rs.TensorDict(src, batch_size=[ROWS]).memmap_(path)
        for workers in (0, 2):
            td = tensordict_rs.TensorDict.load_memmap(path)
            loader = _loader(td, workers, batches, pin=False)
            for b in loader:  # warm: workers started, rings full size
                _consume(b)
            pids = [os.getpid()]
            if workers:
                pids += [w.pid for w in loader._iterator._workers]  # type: ignore[union-attr]
            for _ in range(rounds):
                load = os.getloadavg()[0]
                before = [_threads(pid) for pid in pids]
                queued = [_queued(pid) for pid in pids]
                t0 = time.perf_counter()
                for b in loader:
                    _consume(b)
                wall = time.perf_counter() - t0
                after = [_threads(pid) for pid in pids]
                queued = [_queued(pid) - q for pid, q in zip(pids, queued, strict=True)]
                per = [
                    {k: (v - b0.get(k, 0.0)) / batches * 1e6 for k, v in b1.items()}
                    for b0, b1 in zip(before, after, strict=True)
                ]
                procs = " ".join(f"{sum(p.values()):.0f}" for p in per)
                split = " | ".join(
                    " ".join(f"{k[1]}:{v:.0f}" for k, v in sorted(p.items()) if v > 0) for p in per
                )
                used = sum(sum(p.values()) for p in per)
                idle = cpus * wall / batches * 1e6 - used
                waits = " ".join(f"{q / batches * 1e6:.0f}" for q in queued)
                print(
                    f"workers={workers} width={width} load={load:.2f} "
                    f"batches/s={batches / wall:.0f} cpu us/batch (main, workers)={procs} "
                    f"[{split}] run-queue wait us/batch={waits} idle cpu us/batch={idle:.0f}",
                    flush=True,
                )
            del loader
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    run(args.width, args.batches, args.rounds, args.cpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
