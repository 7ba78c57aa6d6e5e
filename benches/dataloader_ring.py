"""DataLoader batches per second, tensordict-rs against tensordict 0.15.3, 0 and 2 workers.

    python benches/dataloader_ring.py [--rounds 3] [--batches 400] [--json out.json]

The workloads (issue 26): a memory-mapped dataset of 20,000 rows in 64 float32 leaves, saved
by the reference under /dev/shm and loaded by each library, read in random 256-row batches
(``DataLoader(td, batch_size=256, sampler=RandomSampler, collate_fn=identity)``) with spawn
workers and torch at 1 thread: rows of 4 KiB (64 x [16]) and of 12 KiB (64 x [48]). With
workers, the batches come back through each worker's ring of shared slabs
(``share/ring.py``, ``share/ring_receive.py``); the reference sends one descriptor per leaf.
Each loader is made once with ``persistent_workers=True`` and warmed by one untimed epoch; a
timed round is one epoch of ``--batches`` batches that touches every leaf of every batch. The
cases run in alternated rounds; the figures are medians. The copy limit beside them is one thread's
``torch.index_select`` of the same rows into preallocated tensors (what a batch must cost at
least on one core).

With CUDA, a third block times ``pin_memory=True`` loaders whose batches go to the GPU
(``.to("cuda", non_blocking=True)``): there tensordict-rs registers each ring slab as pinned
memory once instead of copying every batch into new pinned memory.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

import tensordict
import tensordict_rs
import torch
from torch.utils.data import DataLoader, RandomSampler

ROWS = 20_000
LEAVES = 64
BATCH = 256


def identity(batch: Any) -> Any:
    """The collate_fn: ``__getitems__`` already returns the batch."""
    return batch


def _consume(batch: Any, device: str | None) -> int:
    n = 0
    for key in batch.keys(include_nested=True, leaves_only=True):
        leaf = batch.get(key)
        if device is not None:
            leaf = leaf.to(device, non_blocking=True)
        n += leaf.shape[0]
    return n


def _save(path: str, width: int) -> None:
    gen = torch.Generator().manual_seed(0)
    src = {f"f{i}": torch.rand(ROWS, width, generator=gen) for i in range(LEAVES)}
    tensordict.TensorDict(src, batch_size=[ROWS]).memmap_(path)


def _loader(td: Any, workers: int, batches: int, pin: bool) -> DataLoader:
    sampler = RandomSampler(
        td, num_samples=BATCH * batches, generator=torch.Generator().manual_seed(1)
    )
    return DataLoader(
        td,
        batch_size=BATCH,
        sampler=sampler,
        collate_fn=identity,
        num_workers=workers,
        persistent_workers=workers > 0,
        multiprocessing_context="spawn" if workers else None,
        pin_memory=pin,
        timeout=600 if workers else 0,
    )


def _epoch(loader: DataLoader, device: str | None) -> float:
    t0 = time.perf_counter()
    n = 0
    for batch in loader:
        n += _consume(batch, device)
    if device is not None:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _limit(path: str, batches: int) -> float:
    td = tensordict.TensorDict.load_memmap(path)
    plain = [t.as_subclass(torch.Tensor) for t in td.values()]
    outs = [torch.empty((BATCH, *t.shape[1:]), dtype=t.dtype) for t in plain]
    gen = torch.Generator().manual_seed(1)
    idx = [torch.randint(0, ROWS, (BATCH,), generator=gen) for _ in range(batches)]
    t0 = time.perf_counter()
    for i in idx:
        for leaf, out in zip(plain, outs, strict=True):
            torch.index_select(leaf, 0, i, out=out)
    return time.perf_counter() - t0


def run(rounds: int, batches: int) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    results = []
    blocks = [(None, False)]
    if torch.cuda.is_available():
        blocks.append(("cuda", True))
    for width in (16, 48):
        path = tempfile.mkdtemp(prefix="tdrs-ring-bench-", dir="/dev/shm")
        try:  # removed on errors, Ctrl-C and SIGTERM too (main() turns it into SystemExit)
            _save(path, width)
            for device, pin in blocks:
                cases = {}
                for workers in (0, 2):
                    for lib in (tensordict, tensordict_rs):
                        td = lib.TensorDict.load_memmap(path)
                        loader = _loader(td, workers, batches, pin)
                        _epoch(loader, device)  # warm: workers started, pages mapped
                        cases[(lib.__name__, workers)] = loader
                times: dict[Any, list[float]] = {key: [] for key in cases}
                times["limit"] = []
                for _ in range(rounds):
                    for key, loader in cases.items():
                        times[key].append(_epoch(loader, device))
                    times["limit"].append(_limit(path, batches))
                load = os.getloadavg()[0]
                row: dict[str, Any] = {
                    "rows": ROWS,
                    "row_bytes": LEAVES * width * 4,
                    "device": device,
                    "load": round(load, 2),
                }
                for key, ts in times.items():
                    name = key if isinstance(key, str) else f"{key[0]}_w{key[1]}"
                    row[name] = round(batches / statistics.median(ts), 1)
                results.append(row)
                for loader in cases.values():
                    del loader
                del cases
                gc.collect()
        finally:
            shutil.rmtree(path, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    # killed with SIGTERM: exit through the finally blocks, which remove the saved dataset
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    results = run(args.rounds, args.batches)
    print(
        "| rows x bytes | device | load | ref w0 | rs w0 | ref w2 | rs w2 | rs w2 / ref w2 | "
        "rs w2 / rs w0 | copy limit (1 thread) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['rows']} x {r['row_bytes']} | {r['device'] or 'cpu'} | {r['load']} "
            f"| {r['tensordict_w0']} | {r['tensordict_rs_w0']} | {r['tensordict_w2']} "
            f"| {r['tensordict_rs_w2']} | {r['tensordict_rs_w2'] / r['tensordict_w2']:.1f}x "
            f"| {r['tensordict_rs_w2'] / r['tensordict_rs_w0']:.2f}x | {r['limit']} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
