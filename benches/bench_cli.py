"""``tensordict-rs info`` of W3 (10,000 leaves in 100 sub-TensorDicts), whole command.

Fresh processes, interleaved, each timed from spawn to exit (output to a pipe, read whole):
ours is ``python -m tensordict_rs info DIR``; the reference has no command line, so its case
is what a user does without one (``python -c`` that loads the directory with tensordict and
prints it); the limit is the interpreter's own start-up (``python -c pass``), which this
environment's site hooks make ~60 ms of the 100 ms target.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

import pytest
import tensordict
from _harness import IMPORT_ROUNDS, RESULTS, SHM_BASE, WARMUP, build_w3, fresh_dir, remove, replay
from _workloads import CASES, LIMIT, REF, RS

WORKLOAD = "cli_info"


@pytest.fixture(scope="module")
def saved():
    path = fresh_dir(SHM_BASE)
    tensordict.TensorDict(build_w3(), []).memmap(path)
    yield path
    remove(path)


def _commands(path) -> dict[str, list[str]]:
    load = "import sys, tensordict; print(tensordict.TensorDict.load_memmap(sys.argv[1]))"
    return {
        LIMIT: [sys.executable, "-c", "pass"],
        REF: [sys.executable, "-c", load, str(path)],
        RS: [sys.executable, "-m", "tensordict_rs", "info", str(path)],
    }


def _measure(path) -> None:
    if WORKLOAD in RESULTS:
        return
    commands = _commands(path)
    names = list(commands)
    times: dict[str, list[float]] = {n: [] for n in names}
    errors: dict[str, str | None] = {n: None for n in names}
    # the children run in an empty directory: nothing there can shadow a package
    with tempfile.TemporaryDirectory(prefix="tdrs-bench-cwd-") as cwd:
        for r in range(WARMUP + IMPORT_ROUNDS):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                t0 = time.perf_counter()
                proc = subprocess.run(commands[name], cwd=cwd, capture_output=True, text=True)
                dt = time.perf_counter() - t0
                if proc.returncode != 0:
                    errors[name] = (proc.stderr.strip().splitlines() or ["?"])[-1][:300]
                elif name == RS and " tensors, " not in proc.stdout:
                    errors[name] = "info printed no totals"
                if r >= WARMUP:
                    times[name].append(dt)
    RESULTS[WORKLOAD] = {
        "amount": 1,
        "cases": {n: {"times": times[n], "error": errors[n]} for n in names},
        "commands": {n: " ".join(c[1:3]) for n, c in commands.items()},
    }


@pytest.mark.parametrize("case", CASES)
def test_cli_info(benchmark, case, saved):
    """Whole-command wall time of ``info`` on W3 (fresh processes, interleaved)."""
    _measure(saved)
    benchmark.extra_info["command"] = RESULTS[WORKLOAD]["commands"][case]
    replay(benchmark, WORKLOAD, case)
