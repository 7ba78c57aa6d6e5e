"""CPU time of ``extend_`` by part, on the append workload of ``bench_growth.py``.

    python benches/growth_cpu.py [--rounds 5]

1,000,000 rows (``obs`` float32 [64] + ``act`` int64, 264 B a row) appended in batches of
1,000, measured in CPU seconds of the process (``time.process_time``) rather than wall time:
on a shared machine the wall time of a 0.1 s workload moves with other load, CPU time much
less. The cases run in alternated rounds (one untimed warm-up round); each prints its median
in ms per 1,000 calls, i.e. in µs per call:

- ``extend_``: the whole call, as the bench times it (the batch's ``TensorDict`` built in the
  loop included);
- ``extend_, commit without rows``: the same calls with the native growth given no rows to
  write (lock, checks, ``meta.json`` replaced): the commit and the Python around it;
- ``extend_, Python only``: the native growth not called at all (nothing is committed);
- ``batch construction``: building the 1,000 batches alone;
- ``raw pwrite``: the rows' bytes written by ``os.pwrite``, one call per leaf and batch, into
  two files (what the native growth's data write costs at least);
- ``one write``: ``memmap`` of the whole tree at once (the bench's reference point).

So rows written = ``extend_`` - ``commit without rows``; commit = ``commit without rows`` -
``Python only``; Python = ``Python only`` - ``batch construction``. Linux or macOS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tensordict_rs
import torch
from tensordict_rs import _native
from tensordict_rs.io import growth

ROWS = 1_000_000
BATCH = 1_000


class _Native:
    """``_native`` as the growth module sees it, with ``grow_rows`` cut short by ``mode``."""

    def __init__(self) -> None:
        self.mode = "all"

    def grow_rows(self, prefix: str, expect: int, rows: int, leaves: Any, writes: Any, **kw: Any):
        if self.mode == "python":
            return None
        if self.mode == "commit":
            writes = []
        return _native.grow_rows(prefix, expect, rows, leaves, writes, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(_native, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    src = {
        "obs": torch.rand(ROWS, 64, generator=g),
        "act": torch.randint(0, 9, (ROWS,), generator=g),
    }
    native = _Native()
    growth._native = native  # type: ignore[assignment]

    def batches() -> Any:
        for s in range(0, ROWS, BATCH):
            yield tensordict_rs.TensorDict({k: v[s : s + BATCH] for k, v in src.items()}, [BATCH])

    def extend(mode: str) -> Callable[[Path], None]:
        def run(path: Path) -> None:
            native.mode = mode
            td = tensordict_rs.TensorDict({k: v[:0] for k, v in src.items()}, [0]).memmap(path)
            for batch in batches():
                td.extend_(batch)

        return run

    def construct(_: Path) -> None:
        for _batch in batches():
            pass

    def raw_pwrite(path: Path) -> None:
        path.mkdir()
        fds = [os.open(path / f"{k}.memmap", os.O_RDWR | os.O_CREAT, 0o644) for k in src]
        views = [v.view(ROWS, -1).view(torch.uint8).numpy() for v in src.values()]
        for s in range(0, ROWS, BATCH):
            for fd, view in zip(fds, views, strict=True):
                os.pwrite(fd, view[s : s + BATCH], s * view.shape[1])
        for fd in fds:
            os.close(fd)

    def one_write(path: Path) -> None:
        tensordict_rs.TensorDict(dict(src), [ROWS]).memmap(path)

    cases: dict[str, Callable[[Path], None]] = {
        "extend_": extend("all"),
        "extend_, commit without rows": extend("commit"),
        "extend_, Python only": extend("python"),
        "batch construction": construct,
        "raw pwrite": raw_pwrite,
        "one write": one_write,
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    base = Path(tempfile.mkdtemp(prefix="tdrs-growth-cpu-"))
    loads = [os.getloadavg()[0]]
    try:
        for r in range(args.rounds + 1):
            names = list(cases)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                path = base / f"{r}-{len(times[name])}"
                t0 = time.process_time()
                cases[name](path)
                dt = time.process_time() - t0
                shutil.rmtree(path, ignore_errors=True)
                if r:  # round 0 warms up
                    times[name].append(dt)
    finally:
        growth._native = _native  # type: ignore[assignment]
        shutil.rmtree(base, ignore_errors=True)
    loads.append(os.getloadavg()[0])
    print(
        f"CPU ms per 1,000 extend_ calls of {BATCH} rows (= us per call), {args.rounds} "
        f"alternated rounds, medians, load {loads[0]:.1f}-{loads[1]:.1f}:"
    )
    for name, values in times.items():
        each = ", ".join(f"{v * 1e3:.0f}" for v in values)
        print(f"  {name:30s} {statistics.median(values) * 1e3:6.1f}   ({each})")


if __name__ == "__main__":
    main()
