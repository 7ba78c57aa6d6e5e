"""A bounded fuzz of the loader (see fuzz_loader.py for the harness and its oracle).

* coverage-guided with atheris (libFuzzer) and structure-aware mutations, when atheris is
  installed; the same number of runs of the pure-Python driver otherwise;
* the seeded pure-Python mutation fuzzer, always.

Each runs in a child process, so that a crash (SIGBUS, SIGSEGV) fails the test instead of
ending pytest. ``TDRS_FUZZ_RUNS`` and ``TDRS_FUZZ_PURE_RUNS`` set the numbers of executions.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HARNESS = Path(__file__).with_name("fuzz_loader.py")
RUNS = int(os.environ.get("TDRS_FUZZ_RUNS", "20000"))
PURE_RUNS = int(os.environ.get("TDRS_FUZZ_PURE_RUNS", "5000"))
SEED = int(os.environ.get("TDRS_FUZZ_SEED", "1"))


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, os.fspath(HARNESS), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
    )
    # the harness's scratch tree (in /dev/shm): gone unless the child crashed
    for match in re.finditer(r"^scratch: (.+)$", result.stdout, re.MULTILINE):
        shutil.rmtree(match.group(1), ignore_errors=True)
    return result


def _explain(result: subprocess.CompletedProcess[str]) -> str:
    out = result.stdout + result.stderr
    lines = [ln for ln in out.splitlines() if not ln.startswith(("INFO: Instrumenting", "frame #"))]
    return f"exit status {result.returncode}\n" + "\n".join(lines[-60:])


def test_fuzz_loader_coverage_guided(tmp_path: Path) -> None:
    if importlib.util.find_spec("atheris") is None:
        # no atheris here: the pure driver stands in, with another seed
        result = _run(["--pure", str(RUNS), str(SEED + 1000)], tmp_path)
        assert result.returncode == 0, _explain(result)
        assert f"executions: {RUNS}" in result.stdout
        print(f"\natheris is not installed: ran the pure fuzzer instead, executions: {RUNS}")
        return
    corpus = tmp_path / "corpus"
    result = _run(
        [
            f"-runs={RUNS}",
            f"-seed={SEED}",
            f"-artifact_prefix={tmp_path}/",
            "-max_len=4096",
            "-timeout=30",
            os.fspath(corpus),
        ],
        tmp_path,
    )
    crashes = sorted(p.name for p in tmp_path.glob("crash-*"))
    assert result.returncode == 0 and not crashes, f"findings {crashes}:\n{_explain(result)}"
    done = re.search(r"Done (\d+) runs", result.stdout + result.stderr)
    assert done is not None, _explain(result)
    assert int(done.group(1)) == RUNS
    print(f"\natheris: executions: {done.group(1)}")


def test_fuzz_loader_seeded_mutations(tmp_path: Path) -> None:
    result = _run(["--pure", str(PURE_RUNS), str(SEED)], tmp_path)
    assert result.returncode == 0, _explain(result)
    assert f"executions: {PURE_RUNS}" in result.stdout
    loaded = re.search(r"loads that succeeded: (\d+)", result.stdout)
    assert loaded is not None
    # the mutations must leave some trees loadable, or the success half of the oracle is idle
    assert int(loaded.group(1)) > 0
    print(f"\npure fuzzer: executions: {PURE_RUNS}, loads that succeeded: {loaded.group(1)}")
