"""Benchmark suite of tensordict_rs against tensordict 0.15.3 (pytest-benchmark).

Run everything (from the repository root):

    python -m pytest benches -p no:cacheprovider --benchmark-only

or ``python benches/report.py``, which runs the same and prints one markdown table.
``TDRS_BENCH_SCALE=0.02`` shrinks every workload for a quick run; ``TDRS_BENCH_ROUNDS``
(default 5), ``TDRS_BENCH_WARMUP`` (1) and ``TDRS_BENCH_IMPORT_ROUNDS`` (7, or 2 when scaled)
set the rounds. ``benches/pytest.ini`` makes pytest collect ``bench_*.py`` here; the default
``python -m pytest`` of the repository still collects only ``tests/``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time

import _harness
import pytest
import report as _report

_START: dict[str, float] = {}
_MACHINE: dict[str, object] = {}


def _busy_seconds() -> float:
    """CPU seconds spent by all CPUs outside idle/iowait since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _fs_type(path: str) -> str:
    best, kind = "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mount, fstype = parts[1], parts[2]
            if path.startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
    return kind


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def machine_info() -> dict[str, object]:
    """The machine line of the report (the end of the run is taken at the first call)."""
    if _MACHINE:
        return _MACHINE
    import platform
    from importlib.metadata import version

    import torch

    wall = time.monotonic() - _START.get("wall", time.monotonic())
    other = (
        (_busy_seconds() - _START["busy"]) - (_own_seconds() - _START["own"])
        if "busy" in _START
        else float("nan")
    )
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    _MACHINE.update(
        date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        cpus=os.cpu_count(),
        cpu_model=_cpu_model(),
        mem_gib=round(mem_kib / 2**20, 1),
        kernel=platform.release(),
        python=platform.python_version(),
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        numpy=version("numpy"),
        tensordict=version("tensordict"),
        tensordict_rs=version("tensordict-rs"),
        shm_fs=_fs_type(str(_harness.SHM_BASE)),
        tmp_fs=_fs_type(str(_harness.TMP_BASE)),
        scale=_harness.SCALE,
        rounds=_harness.ROUNDS,
        warmup=_harness.WARMUP,
        import_rounds=_harness.IMPORT_ROUNDS,
        loadavg_start=_START.get("loadavg"),
        loadavg_end=os.getloadavg()[0],
        wall_s=round(wall, 1),
        other_cpus=round(other / wall, 2) if wall > 0 else None,
        page_reporting=dict(_harness.PAGE_STATE),
    )
    return _MACHINE


_HELD: list[contextlib.ExitStack] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    for base in (_harness.SHM_BASE, _harness.TMP_BASE):
        base.mkdir(parents=True, exist_ok=True)
    stack = contextlib.ExitStack()
    stack.enter_context(_harness.held_free_pages())  # see _harness: page state
    _HELD.append(stack)
    _START.update(
        wall=time.monotonic(),
        busy=_busy_seconds(),
        own=_own_seconds(),
        loadavg=os.getloadavg()[0],
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    while _HELD:
        _HELD.pop().close()  # the kernel's own page reporting back
    for base in (_harness.SHM_BASE, _harness.TMP_BASE):
        shutil.rmtree(base, ignore_errors=True)


def pytest_benchmark_update_json(config, benchmarks, output_json) -> None:
    """Adds the interleaved rounds of every workload and the machine line to the JSON."""
    output_json["tdrs_bench"] = {"machine": machine_info(), "results": _harness.RESULTS}


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _harness.RESULTS:
        return
    terminalreporter.write_sep("=", "tensordict_rs vs tensordict 0.15.3 (medians, same run)")
    terminalreporter.write_line(
        _report.render({"machine": machine_info(), "results": _harness.RESULTS})
    )
