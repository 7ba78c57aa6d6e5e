"""Shared machinery: scale, workload builders, interleaved timing, the machine-limit cases.

How a workload is measured (see ``interleave``): every case (the reference, tensordict_rs and
the limit) runs once per round, in a rotating order (ABC, BCA, CAB, ...), after one untimed
warm-up round. Each call gets its own untimed ``setup`` (a fresh shallow copy of the source
TensorDict, a fresh output directory, an ``os.sync()`` on ext4) and untimed ``cleanup``
(drop the result, delete its files, a young-generation ``gc.collect(1)``; a full collection
costs ~0.2 s with torch loaded, and nothing here is cyclic). Only the call itself is timed,
with ``time.perf_counter``. The per-round times of every case are kept in ``RESULTS`` and are
then handed to pytest-benchmark (``replay``), so its tables, ``--benchmark-json`` and
comparisons work as usual, while the ratios come from the same interleaved rounds.
"""

from __future__ import annotations

import gc
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _workloads import BY_ID

SCALE = float(os.environ.get("TDRS_BENCH_SCALE", "1"))
ROUNDS = int(os.environ.get("TDRS_BENCH_ROUNDS", "5"))
WARMUP = int(os.environ.get("TDRS_BENCH_WARMUP", "1"))
IMPORT_ROUNDS = int(os.environ.get("TDRS_BENCH_IMPORT_ROUNDS", "7" if SCALE >= 1 else "2"))

RUN_ID = f"tdrs-bench-{os.getpid()}"
SHM_BASE = Path("/dev/shm") / RUN_ID
TMP_BASE = Path("/tmp") / RUN_ID

# workload id -> {"amount": float, "cases": {case: {"times": [...], "error": str | None}}, ...}
RESULTS: dict[str, dict[str, Any]] = {}


# ---------------------------------------------------------------------------- sizes


def w1_rows() -> int:
    return max(1024, int(1_048_576 * SCALE))


def w3_last() -> int:
    """Leaves per second-level node: 100 at full scale (10 x 10 x 100 = 10,000 leaves)."""
    return max(1, round(100 * SCALE))


def w4_rows() -> int:
    return max(1024, int(200_000 * SCALE))


def w4_batches() -> int:
    """Batches per timed round (each of 256 random rows)."""
    return max(50, min(400, int(400 * SCALE**0.5)))


# ---------------------------------------------------------------------------- workloads


def build_w1() -> dict[str, torch.Tensor]:
    """W1: 4 float32 leaves of [rows, 64] (1 GiB at full scale), batch size [rows]."""
    gen = torch.Generator().manual_seed(0)
    return {f"f{i}": torch.rand(w1_rows(), 64, generator=gen) for i in range(4)}


def build_w3(last: int | None = None) -> dict[str, Any]:
    """W3: 10 x 10 x ``last`` leaves of 1 KiB (float32 [256], int64 [128], uint8 [1024])."""
    last = w3_last() if last is None else last
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {}
    n = 0
    for a in range(10):
        level_a: dict[str, Any] = {}
        for b in range(10):
            level_b: dict[str, Any] = {}
            for c in range(last):
                kind = n % 3
                if kind == 0:
                    t = torch.rand(256, generator=gen)
                elif kind == 1:
                    t = torch.randint(0, 1 << 30, (128,), generator=gen)
                else:
                    t = torch.randint(0, 256, (1024,), generator=gen, dtype=torch.uint8)
                level_b[f"leaf{c}"] = t
                n += 1
            level_a[f"b{b}"] = level_b
        out[f"a{a}"] = level_a
    return out


def build_w4(rows: int | None = None) -> dict[str, Any]:
    """W4: a replay-buffer dataset, 12,322 bytes per row (2.3 GiB at full scale)."""
    n = w4_rows() if rows is None else rows
    gen = torch.Generator().manual_seed(0)
    return {
        "obs": torch.rand(n, 3, 32, 32, generator=gen),
        "action": torch.rand(n, 6, generator=gen),
        "reward": torch.rand(n, 1, generator=gen),
        "done": torch.rand(n, 1, generator=gen) < 0.01,
        "next": {
            "reward": torch.rand(n, 1, generator=gen),
            "done": torch.rand(n, 1, generator=gen) < 0.01,
        },
    }


def flat_leaves(tree: Mapping[str, Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for value in tree.values():
        if isinstance(value, Mapping):
            out.extend(flat_leaves(value))
        else:
            out.append(value)
    return out


def nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def ref_td(tree: Mapping[str, Any], batch: list[int]) -> Any:
    import tensordict

    return tensordict.TensorDict(dict(tree), batch_size=batch)


def rs_td(tree: Mapping[str, Any], batch: list[int]) -> Any:
    import tensordict_rs

    return tensordict_rs.TensorDict(dict(tree), batch)


def ref_copy(td: Any) -> Any:
    """A fresh shallow copy (same tensors, new structure): memmap_ works in place."""
    return td.copy()


def rs_copy(td: Any) -> Any:
    return td.clone(recurse=False)


def td_leaves(td: Any) -> list[torch.Tensor]:
    """Every tensor leaf of a reference or tensordict_rs TensorDict (materialised)."""
    return list(td.values(include_nested=True, leaves_only=True))


# ---------------------------------------------------------------------------- directories


def fresh_dir(base: Path) -> Path:
    """A new, not yet existing path under ``base`` (the library creates it)."""
    return base / uuid.uuid4().hex[:12]


def remove(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def leaf_files(root: Path) -> list[tuple[str, int]]:
    out = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".memmap"):
                p = os.path.join(dirpath, name)
                out.append((p, os.path.getsize(p)))
    return out


# ---------------------------------------------------------------------------- limit cases


def byte_views(tensors: Iterable[torch.Tensor]) -> list[np.ndarray]:
    """Flat uint8 numpy views of contiguous CPU tensors (no copy)."""
    out = []
    for t in tensors:
        t = t.detach().as_subclass(torch.Tensor)
        assert t.is_contiguous()
        out.append(t.reshape(-1).view(torch.uint8).numpy())
    return out


def split_two(buffers: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Two groups of about equal size, keeping the leaf order within each."""
    groups: list[list[np.ndarray]] = [[], []]
    sizes = [0, 0]
    order = sorted(range(len(buffers)), key=lambda i: -buffers[i].nbytes)
    chosen: list[int] = [0] * len(buffers)
    for i in order:
        k = 0 if sizes[0] <= sizes[1] else 1
        chosen[i] = k
        sizes[k] += buffers[i].nbytes
    for i, buf in enumerate(buffers):
        groups[chosen[i]].append(buf)
    return groups


def _write_all(fd: int, buffers: list[np.ndarray]) -> None:
    for buf in buffers:
        view = memoryview(buf).cast("B")
        while view.nbytes:
            n = os.write(fd, view)
            view = view[n:]


def write_two(groups: list[list[np.ndarray]], directory: Path | None) -> list[int]:
    """The save limit: 2 threads, each write(2)-ing its group of leaves into its own file.

    ``directory=None`` writes into 2 memfds (anonymous shared memory) instead; their fds are
    returned open (closing them frees the memory) and must be closed by the caller.
    """
    fds: list[int] = []
    for k in range(2):
        if directory is None:
            fds.append(os.memfd_create(f"tdrs-bench-{k}"))
        else:
            if k == 0:
                directory.mkdir()
            fds.append(os.open(directory / f"part{k}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    threads = [threading.Thread(target=_write_all, args=(fds[k], groups[k])) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if directory is not None:
        for fd in fds:
            os.close(fd)
        return []
    return fds


def copy_two(pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """np.copyto with 2 threads, each copying half of every buffer (numpy releases the GIL)."""

    def work(k: int) -> None:
        for dst, src in pairs:
            half = src.shape[0] // 2
            sl = slice(0, half) if k == 0 else slice(half, None)
            np.copyto(dst[sl], src[sl])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def read_files(files: list[tuple[str, int]]) -> int:
    """The load floor for many leaves: open + read(2) + close of every leaf file."""
    total = 0
    for path, size in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            total += len(os.read(fd, size))
        finally:
            os.close(fd)
    return total


def read_all(tensors: Iterable[torch.Tensor]) -> int:
    """Reads every byte: sums each leaf as int64 words (uint8.sum() would measure the ALU)."""
    total = 0
    for t in tensors:
        flat = t.detach().as_subclass(torch.Tensor).reshape(-1).view(torch.uint8)
        n8 = flat.numel() // 8 * 8
        if n8:
            total += int(flat[:n8].view(torch.int64).sum())
        if n8 < flat.numel():
            total += int(flat[n8:].sum())
    return total


# ---------------------------------------------------------------------------- page state

# Free page reporting (a VM's guest hands free memory back to its host, docs/reference/
# performance.md): a write into memory that was reported costs ~3 s of CPU per GiB to fault in
# again, one into memory freed a moment ago ~0.25 s, so a case's time depended on what the case
# before it freed and how long ago. Where the guest kernel has the knobs (this project's VM:
# ``page_reporting.min_free_ms``, how long a free block must stay free before it is reported,
# and ``max_waiting_mib``, how much free memory may wait before reporting is forced: with the
# default 1,024, freeing 3 GiB reported 1,152 MiB within 4 s whatever min_free_ms said), the
# suite holds freed memory in the guest for the run and puts the old values back after: every
# case then gets memory the way it would on a machine without reporting (the pages the earlier
# rounds freed). ``TDRS_BENCH_PAGE_REPORTING=keep`` leaves the kernel as it is.
_REPORTING = Path("/sys/module/page_reporting/parameters")
HOLD = {
    "min_free_ms": 300_000,  # 5 minutes: the most this kernel takes (600,000 is refused)
    "max_waiting_mib": 1 << 20,  # 1 TiB: more than any machine this runs on
}

# what the run did with the knobs, for the report's machine line
PAGE_STATE: dict[str, Any] = {}


def reported_mib() -> float | None:
    """MiB the guest has reported to its host since boot (None without page reporting)."""
    try:
        return int((_REPORTING / "reported_kib").read_text()) / 1024
    except (OSError, ValueError):
        return None


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def refill_free_memory(nbytes: int) -> None:
    """Untimed, before a big call: touches and frees ``nbytes`` of anonymous memory (at most
    the available memory less 1 GiB), so that the pages the call allocates next are ones the
    guest holds rather than ones it reported to its host earlier in a long run (at 8 GiB a
    run frees far more than the held knobs keep: each ext4 case's page cache is freed when its
    file is deleted, and memory freed more than ``min_free_ms`` ago is reported all the same).
    Freshly freed pages are taken first by the next allocations, and with the knobs held they
    stay unreported. Does nothing where the knobs are not held."""
    if PAGE_STATE.get("held") is None:
        return
    size = min(int(nbytes), _available_bytes() - (1 << 30)) & ~0xFFFFF
    if size > 0:
        block = np.empty(size, dtype=np.uint8)  # mapped, not yet backed by pages
        block[::4096] = 1  # one write per page faults every page in
        del block


@contextmanager
def held_free_pages() -> Iterator[dict[str, Any]]:
    """Holds freed memory in the guest while the block runs (see above); records in
    ``PAGE_STATE`` what was done and how much memory was reported meanwhile."""
    before_mib = reported_mib()
    old: dict[str, str] = {}
    try:
        if os.environ.get("TDRS_BENCH_PAGE_REPORTING", "hold") != "keep":
            try:
                for name, value in HOLD.items():
                    knob = _REPORTING / name
                    was = knob.read_text().strip()
                    knob.write_text(str(value))
                    old[name] = was
            except OSError as err:  # no such kernel, or not root: measured as the machine is
                PAGE_STATE["note"] = f"free page reporting not held ({type(err).__name__})"
        if old and "note" not in PAGE_STATE:
            PAGE_STATE["held"] = ", ".join(f"{k} {old[k]} -> {HOLD[k]}" for k in old)
        elif before_mib is None:
            PAGE_STATE.setdefault("note", "no free page reporting")
        yield PAGE_STATE
    finally:
        for name, was in old.items():
            (_REPORTING / name).write_text(was)
        after_mib = reported_mib()
        if before_mib is not None and after_mib is not None:
            PAGE_STATE["reported_mib"] = round(after_mib - before_mib)


# ---------------------------------------------------------------------------- timing


@dataclass
class Case:
    """One thing to time: ``call(setup())`` is timed; setup and cleanup are not."""

    call: Callable[[Any], Any]
    setup: Callable[[], Any] = lambda: None
    cleanup: Callable[[Any, Any], None] | None = None


@dataclass
class Outcome:
    times: list[float] = field(default_factory=list)
    error: str | None = None


def interleave(
    cases: dict[str, Case], rounds: int = ROUNDS, warmup: int = WARMUP
) -> dict[str, Outcome]:
    """Runs every case once per round in a rotating order; returns the timed rounds.

    A case that raises is recorded with its error and left out of the later rounds; the
    other cases go on.
    """
    names = list(cases)
    out = {name: Outcome() for name in names}
    for r in range(warmup + rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if out[name].error is not None:
                continue
            case = cases[name]
            state = result = None
            try:
                state = case.setup()
                gc.collect(1)  # young generations only: a full pass costs ~0.2 s with torch
                t0 = time.perf_counter()
                result = case.call(state)
                dt = time.perf_counter() - t0
            except Exception as err:  # recorded; the test of this case reports it
                out[name].error = f"{type(err).__name__}: {err}"[:300]
                dt = None
            finally:
                if case.cleanup is not None:
                    try:
                        case.cleanup(state, result)
                    except Exception:
                        pass
                del state, result  # nothing here is cyclic: refcounting frees maps and files
                gc.collect(1)
            if dt is not None and r >= warmup:
                out[name].times.append(dt)
    return out


def measure(
    workload: str, amount: float, make_cases: Callable[[], dict[str, Case]], **extra: Any
) -> dict[str, Any]:
    """Measures ``workload`` once per session (the first of its tests does it) and caches it."""
    if workload not in RESULTS:
        cases = make_cases()
        gc.collect()
        try:
            outcomes = interleave(cases)
        finally:
            del cases
            gc.collect()
        RESULTS[workload] = {
            "amount": amount,
            "cases": {name: {"times": o.times, "error": o.error} for name, o in outcomes.items()},
            **extra,
        }
    return RESULTS[workload]


class _ReplayTimer:
    """A timer for pytest-benchmark that reports already measured durations, in order."""

    __name__ = "perf_counter_interleaved"
    __module__ = "time"

    def __init__(self, durations: list[float]) -> None:
        self._durations = list(durations)
        self._now = 0.0
        self._ticks = 0

    def __call__(self) -> float:
        if self._ticks % 2:
            self._now += self._durations[self._ticks // 2]
        self._ticks += 1
        return self._now


def replay(benchmark: Any, workload: str, case: str) -> None:
    """Hands the interleaved times of ``case`` to pytest-benchmark; fails on a case error."""
    import pytest

    entry = RESULTS[workload]
    outcome = entry["cases"][case]
    wl = BY_ID[workload]
    benchmark.group = wl.title
    benchmark.extra_info.update(
        workload=workload, case=case, unit=wl.unit, amount=entry["amount"], scale=SCALE
    )
    if outcome["error"] is not None:
        benchmark.extra_info["error"] = outcome["error"]
        pytest.fail(f"{case} failed on {workload}: {outcome['error']}")
    times = outcome["times"]
    benchmark._timer = _ReplayTimer(times)  # the times were taken by ``interleave``
    benchmark.pedantic(lambda: None, rounds=len(times), iterations=1, warmup_rounds=0)
