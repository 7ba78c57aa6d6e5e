"""Fresh-process costs: import time after torch, and anonymous memmap_ under a 1,024-fd limit."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time

import pytest
from _harness import IMPORT_ROUNDS, RESULTS, WARMUP, replay
from _workloads import CASES, LIMIT, REF, RS

# Each child also prints how long the library's import took inside it, after torch: the
# in-process figure is free of process start-up noise; the paired difference of whole-process
# wall times (against ``import torch`` alone, same round) includes exit costs too.
_TIMED = "import time, torch; t = time.perf_counter(); import {}; print(time.perf_counter() - t)"
IMPORTS = {
    LIMIT: "import torch",
    REF: _TIMED.format("tensordict"),
    RS: _TIMED.format("tensordict_rs"),
}


@pytest.fixture(scope="module")
def cwd():
    """Where the children run: never where a file could shadow a package (python/tensordict_rs
    has a tensordict.py, and ``python -c`` puts the working directory first on sys.path)."""
    with tempfile.TemporaryDirectory(prefix="tdrs-bench-cwd-") as path:
        yield path


def _measure_imports(cwd: str) -> None:
    if "import" in RESULTS:
        return
    names = list(IMPORTS)
    times: dict[str, list[float]] = {n: [] for n in names}
    net: dict[str, list[float]] = {REF: [], RS: []}
    inproc: dict[str, list[float]] = {REF: [], RS: []}
    errors: dict[str, str | None] = {n: None for n in names}
    for r in range(WARMUP + IMPORT_ROUNDS):
        k = r % len(names)
        this_round: dict[str, float] = {}
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-c", IMPORTS[name]], cwd=cwd, capture_output=True, text=True
            )
            dt = time.perf_counter() - t0
            if proc.returncode != 0:
                errors[name] = (proc.stderr.strip().splitlines() or ["?"])[-1][:300]
            elif name in inproc and r >= WARMUP:
                inproc[name].append(float(proc.stdout.split()[-1]))
            this_round[name] = dt
        if r >= WARMUP:
            for name in names:
                times[name].append(this_round[name])
            for name in (REF, RS):
                net[name].append(this_round[name] - this_round[LIMIT])
    RESULTS["import"] = {
        "amount": 1,
        "cases": {n: {"times": times[n], "error": errors[n]} for n in names},
        "net": net,
        "inproc": inproc,
        "commands": IMPORTS,
    }


@pytest.mark.parametrize("case", CASES)
def test_import_after_torch(benchmark, case, cwd):
    """Wall time of ``python -c "import torch[, lib]"``, interleaved; net = paired difference."""
    _measure_imports(cwd)
    entry = RESULTS["import"]
    if entry["net"].get(case):
        benchmark.extra_info["net_median_s"] = statistics.median(entry["net"][case])
    if entry["inproc"].get(case):
        benchmark.extra_info["inprocess_median_s"] = statistics.median(entry["inproc"][case])
    benchmark.extra_info["command"] = IMPORTS[case]
    replay(benchmark, "import", case)


_FD_CHILD = r"""
import json, os, resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
import torch
lib = __import__(sys.argv[1])
gen = torch.Generator().manual_seed(0)
tree = {}
n = 0
for a in range(10):
    tree[f"a{a}"] = {}
    for b in range(10):
        node = tree[f"a{a}"][f"b{b}"] = {}
        for c in range(100):
            node[f"leaf{c}"] = torch.rand(256, generator=gen) if n % 2 else torch.randint(
                0, 256, (1024,), generator=gen, dtype=torch.uint8)
            n += 1
td = lib.TensorDict(tree, [])
out = {"leaves": n, "ok": False, "error": None, "seconds": None}
t0 = time.perf_counter()
try:
    td.memmap_()
    out["seconds"] = time.perf_counter() - t0
    out["ok"] = all(
        torch.equal(td[a, b, c], tree[a][b][c])
        for a in ("a0", "a9") for b in ("b0", "b9") for c in ("leaf0", "leaf99")
    ) and bool(td.is_memmap())
    if not out["ok"]:
        out["error"] = "memmap_ returned but the values differ"
except Exception as err:
    out["seconds"] = time.perf_counter() - t0
    out["error"] = f"{type(err).__name__}: {err}"[:300]
out["open_fds"] = len(os.listdir("/proc/self/fd"))
print(json.dumps(out))
"""


def _run_fd_child(module: str, cwd: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _FD_CHILD, module],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        error = f"child exited {proc.returncode}: {tail}"[:300]
        return {"ok": False, "error": error, "seconds": None}
    return json.loads(lines[-1])


def _measure_fd_limit(cwd: str) -> None:
    if "fd_limit" in RESULTS:
        return
    outcomes = {REF: _run_fd_child("tensordict", cwd), RS: _run_fd_child("tensordict_rs", cwd)}
    RESULTS["fd_limit"] = {
        "amount": 10_000,
        # Not an error of the suite: a failed memmap_ is the measured outcome.
        "cases": {
            name: {"times": [o["seconds"]] if o.get("seconds") is not None else [], "error": None}
            for name, o in outcomes.items()
        },
        "outcomes": outcomes,
    }


@pytest.mark.parametrize("case", [REF, RS])
def test_fd_limit_anonymous_memmap(benchmark, case, cwd):
    """A child with RLIMIT_NOFILE = 1,024 memmap_()s 10,000 leaves anonymously.

    Records the outcome (and the time of the memmap_ call); tensordict_rs must succeed.
    The reference keeps 2 fds per leaf and is expected to fail with EMFILE.
    """
    _measure_fd_limit(cwd)
    outcome = RESULTS["fd_limit"]["outcomes"][case]
    benchmark.extra_info.update(outcome={k: v for k, v in outcome.items() if k != "seconds"})
    if RESULTS["fd_limit"]["cases"][case]["times"]:
        replay(benchmark, "fd_limit", case)
    else:
        benchmark.extra_info["error"] = outcome["error"]
        benchmark.group = "fd_limit"
        benchmark.pedantic(lambda: None, rounds=1)  # nothing timed: the child did not start
    if case == RS:
        assert outcome["ok"], outcome["error"]
