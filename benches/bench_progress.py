"""What ``progress=True`` costs on a big save: the same ``memmap_(prefix)`` with the bar off
and on, in interleaved rounds (see ``_harness.interleave``), medians and their ratio.

4 x 1 GiB float32 leaves at full scale (``TDRS_BENCH_SCALE=1``: 4 GiB, written to /dev/shm);
the issue's bound is a cost of at most 1%. The bar draws to a discarded stream, so only the
counter, the polling thread and tqdm's own work are measured, not a terminal. The process's CPU
time per call is printed too: on a loaded machine it is steadier than the wall clock.
"""

from __future__ import annotations

import gc
import io
import resource
import statistics

import pytest
import tensordict_rs
import torch
from _harness import SCALE, SHM_BASE, Case, _ReplayTimer, fresh_dir, interleave, remove

LEAVES = 4
ROWS = max(1024, int(4_194_304 * SCALE))  # x 64 float32 = 1 GiB per leaf at full scale


@pytest.fixture(scope="module")
def big():
    gen = torch.Generator().manual_seed(0)
    src = {f"f{i}": torch.rand(ROWS, 64, generator=gen) for i in range(LEAVES)}
    yield tensordict_rs.TensorDict(src, [ROWS])
    del src
    gc.collect()


RESULTS: dict[str, list[float]] = {}
CPU: dict[str, list[float]] = {"off": [], "on": []}  # CPU seconds of this process per call


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def _measure(td) -> dict[str, list[float]]:
    if RESULTS:
        return RESULTS
    import tqdm.auto

    quiet = io.StringIO()
    real = tqdm.auto.tqdm

    def bar(*args, **kwargs):  # the real tqdm, drawing into a buffer nobody reads
        return real(*args, file=quiet, **kwargs)

    def case(progress: bool) -> Case:
        def call(path):
            start = _cpu()
            td.clone(recurse=False).memmap_(path, progress=progress)
            CPU["on" if progress else "off"].append(_cpu() - start)

        return Case(setup=lambda: fresh_dir(SHM_BASE), call=call, cleanup=lambda p, _: remove(p))

    tqdm.auto.tqdm = bar
    try:
        out = interleave({"off": case(False), "on": case(True)})
    finally:
        tqdm.auto.tqdm = real
    for name, outcome in out.items():
        if outcome.error:
            pytest.fail(f"progress={name}: {outcome.error}")
        RESULTS[name] = outcome.times
    nbytes = LEAVES * ROWS * 64 * 4
    off, on = statistics.median(RESULTS["off"]), statistics.median(RESULTS["on"])
    print(
        f"\nmemmap_ of {nbytes / 2**30:.2f} GiB to /dev/shm: progress off {off:.3f} s "
        f"({nbytes / off / 1e9:.2f} GB/s), on {on:.3f} s ({nbytes / on / 1e9:.2f} GB/s); "
        f"cost {100 * (on / off - 1):+.2f}% (medians of {len(RESULTS['on'])} rounds); CPU time "
        f"off {statistics.median(CPU['off']):.3f} s, on {statistics.median(CPU['on']):.3f} s "
        f"({100 * (statistics.median(CPU['on']) / statistics.median(CPU['off']) - 1):+.2f}%, "
        "warm-up included)"
    )
    return RESULTS


@pytest.mark.parametrize("case", ["off", "on"])
def test_progress_cost(benchmark, case, big):
    times = _measure(big)[case]
    benchmark.group = "memmap_(prefix) with and without progress=True"
    benchmark.extra_info.update(case=case, scale=SCALE, nbytes=LEAVES * ROWS * 64 * 4)
    benchmark._timer = _ReplayTimer(times)  # the times were taken by ``interleave``
    benchmark.pedantic(lambda: None, rounds=len(times), iterations=1, warmup_rounds=0)
