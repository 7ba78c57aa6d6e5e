"""Growth in place and incremental checkpoints (issue 24).

Append: 1,000,000 rows (``obs`` float32 [64] + ``act`` int64: 264 bytes a row, 264 MB) appended
to a memory-mapped tree in batches of 1,000 with ``extend_``, against one preallocated write of
the same bytes (``memmap`` of the whole tree at once), in the same interleaved rounds (target:
at most 1.3x). For context, the reference's way, ``torch.cat([old, new]).memmap(new_dir)`` per
batch, rewrites everything each time (quadratic): it runs for the first ``REF_BATCHES`` batches
only, and the table gives its measured time and the time extrapolated to the whole workload
(sum over batches of the bytes rewritten, at the measured rate). Also for context, the same
rows appended in batches of 10,000 and 100,000 (``LARGER_BATCHES``): each ``extend_`` commits
once, so the commit's fixed cost is shared by more rows. And the way users grow nothing today
when they know the final size (torchrl's storages): the files made at full size with
``memmap_like`` (no bytes written), then the same batches written into their rows with
``td[a:b] = batch``, here and in the reference. And the floor of any growth in batches of 1,000
on this machine, without the library (``_floor``): the same batches made, their bytes
``pwrite``n into files reserved at full size, alone and with the cheapest crash-safe meta.json
replacement after each batch (what ``extend_`` commits per call).

Checkpoint: a memory-mapped buffer of ``TDRS_BENCH_CKPT_GIB`` GiB (default 4; 4 KiB rows) is
checkpointed once (which writes both generations), then 1% of its rows are written through
``td[idx] = ...`` and ``checkpoint(dest)`` is timed, each timed call starting from a clean
page cache (``os.sync()`` first, untimed), and its bytes written are read from the block
device's counter (sectors written, with an ``os.sync()`` after the call) beside ``/proc/self/io``
(``wchar``, and ``write_bytes``, which counts whole large folios on this kernel's ext4),
against ``memmap(full, copy_existing=True)`` of the same buffer (targets: at most 2% of the
bytes, at most 10% of the time). Then again after another 1% (steady state: the spare
generation is one checkpoint behind, so the rows of the last two intervals are copied), and the
cost of ``verify=True`` (every chunk hashed).

It needs about 4x the buffer's size free in the temp directory (the buffer, two generations, the
full copy): with less, set ``TDRS_BENCH_CKPT_GIB`` lower. ``TDRS_BENCH_SCALE`` shrinks both
workloads. The load average is printed beside every figure.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import tensordict
import tensordict_rs
import torch
from _harness import ROUNDS, SCALE, Case, interleave

ROWS = max(10_000, int(1_000_000 * SCALE))
BATCH = 1_000
LARGER_BATCHES = (10_000, 100_000)
REF_BATCHES = int(os.environ.get("TDRS_BENCH_REF_BATCHES", "30"))
CKPT_GIB = float(os.environ.get("TDRS_BENCH_CKPT_GIB", "4")) * min(1.0, SCALE)
BASE = Path(tempfile.gettempdir()) / f"tdrs-bench-growth-{os.getpid()}"


def _load() -> float:
    return os.getloadavg()[0]


def _io() -> dict[str, int]:
    out = {}
    with open("/proc/self/io") as f:
        for line in f:
            key, value = line.split(":")
            out[key] = int(value)
    return out


def _disk_written(path: Path) -> int:
    """Bytes the block device holding ``path`` has written since boot (its ``stat`` file's
    sectors written); 0 where there is no such file (tmpfs, not Linux)."""
    st = os.stat(path)
    stat = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat")
    try:
        return int(stat.read_text().split()[6]) * 512
    except (OSError, IndexError, ValueError):
        return 0


def _timed_io(path: Path, call) -> tuple[float, dict[str, int], int]:
    """``call()`` timed from a clean page cache (``os.sync()`` first, untimed, as the other
    disk benchmarks do, so that no earlier call's writeback is charged to this one), with
    its ``/proc/self/io`` counts and the bytes it made the disk write (``os.sync()`` after,
    untimed)."""
    os.sync()
    before, disk = _io(), _disk_written(path)
    t0 = time.perf_counter()
    call()
    dt = time.perf_counter() - t0
    after = _io()
    os.sync()
    counts = {k: after[k] - before[k] for k in ("write_bytes", "wchar")}
    return dt, counts, _disk_written(path) - disk


def _source() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "obs": torch.rand(ROWS, 64, generator=g),
        "act": torch.randint(0, 9, (ROWS,), generator=g),
    }


def _fresh(name: str) -> Path:
    path = BASE / f"{name}-{time.monotonic_ns()}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _append(src: dict[str, torch.Tensor], batch: int = BATCH) -> Path:
    path = _fresh("append")
    td = tensordict_rs.TensorDict({k: v[:0] for k, v in src.items()}, [0]).memmap(path)
    for start in range(0, ROWS, batch):
        stop = min(ROWS, start + batch)
        td.extend_(
            tensordict_rs.TensorDict({k: v[start:stop] for k, v in src.items()}, [stop - start])
        )
    assert td.batch_size[0] == ROWS
    return path


def _prealloc(src: dict[str, torch.Tensor]) -> Path:
    path = _fresh("prealloc")
    tensordict_rs.TensorDict(dict(src), [ROWS]).memmap(path)
    return path


def _prealloc_batches(lib: object, src: dict[str, torch.Tensor]) -> Path:
    """torchrl's way with a known ``max_size``: the files made at full size first (``memmap_like``:
    no bytes written), then each batch written into its rows (``td[a:b] = batch``)."""
    path = _fresh("prealloc-batches")
    make = lib.TensorDict  # type: ignore[attr-defined]
    empty = {k: torch.empty((ROWS, *v.shape[1:]), dtype=v.dtype) for k, v in src.items()}
    td = make(empty, [ROWS]).memmap_like(path)
    for start in range(0, ROWS, BATCH):
        stop = min(ROWS, start + BATCH)
        td[start:stop] = make({k: v[start:stop] for k, v in src.items()}, [stop - start])
    return path


def _renameat2() -> Any:
    """libc's ``renameat2`` (Linux, glibc 2.28+), or None."""
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None


def _floor(src: dict[str, torch.Tensor], commit: bool) -> Path:
    """The floor of any growth in batches of ``BATCH`` on this machine, without the library:
    each batch made as the other cases make it, its leaves' bytes ``pwrite``n at their offsets
    into files reserved at full size (``posix_fallocate``), and with ``commit`` a crash-safe
    replacement of a meta.json after every batch, in its cheapest form (a new file created and
    written beside it, exchanged with it by ``renameat2``, the old one unlinked), what
    ``extend_`` commits per call. Where there is no ``renameat2``, ``os.replace``."""
    path = _fresh("floor")
    path.mkdir()
    exchange = _renameat2()
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fds: dict[str, int] = {}
    try:
        for key, value in src.items():
            fds[key] = os.open(f"{key}.memmap", os.O_RDWR | os.O_CREAT, 0o644, dir_fd=dfd)
            os.posix_fallocate(fds[key], 0, value.nbytes)
        row = {key: value[0].nbytes for key, value in src.items()}
        meta = {k: {"shape": [0, *v.shape[1:]], "dtype": str(v.dtype)} for k, v in src.items()}
        for start in range(0, ROWS, BATCH):
            stop = min(ROWS, start + BATCH)
            batch = tensordict_rs.TensorDict(
                {k: v[start:stop] for k, v in src.items()}, [stop - start]
            )
            for key, fd in fds.items():
                os.pwrite(fd, batch[key].numpy(), start * row[key])
            if commit:
                for entry in meta.values():
                    entry["shape"][0] = stop
                temp = os.open(".meta.tmp", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
                os.write(temp, json.dumps({**meta, "shape": [stop]}).encode())
                os.close(temp)
                if exchange is not None:
                    if exchange(dfd, b".meta.tmp", dfd, b"meta.json", 2) != 0:  # RENAME_EXCHANGE
                        os.replace(".meta.tmp", "meta.json", src_dir_fd=dfd, dst_dir_fd=dfd)
                    else:
                        os.unlink(".meta.tmp", dir_fd=dfd)
                else:
                    os.replace(".meta.tmp", "meta.json", src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        for fd in fds.values():
            os.close(fd)
        os.close(dfd)
    return path


def _ref_cat(src: dict[str, torch.Tensor]) -> Path:
    path = _fresh("ref")
    td = tensordict.TensorDict({k: v[:BATCH] for k, v in src.items()}, [BATCH]).memmap(path / "0")
    for i in range(1, REF_BATCHES):
        new = tensordict.TensorDict(
            {k: v[i * BATCH : (i + 1) * BATCH] for k, v in src.items()}, [BATCH]
        )
        td = torch.cat([td, new]).memmap(path / str(i))
        shutil.rmtree(path / str(i - 1))
    return path


def _gone(_: object, path: object) -> None:
    if isinstance(path, Path):
        shutil.rmtree(path, ignore_errors=True)


def test_append_vs_preallocated_write() -> None:
    src = _source()
    row_bytes = sum(v[0].nbytes for v in src.values())
    cases = {
        "extend_": Case(lambda _: _append(src), cleanup=_gone),
        "one write": Case(lambda _: _prealloc(src), cleanup=_gone),
        "ref cat+memmap": Case(lambda _: _ref_cat(src), cleanup=_gone),
        # context: the size known in advance (torchrl's storages), here and in the reference
        "preallocated, batches": Case(
            lambda _: _prealloc_batches(tensordict_rs, src), cleanup=_gone
        ),
        "ref preallocated, batches": Case(
            lambda _: _prealloc_batches(tensordict, src), cleanup=_gone
        ),
        # context: the floor of any growth in batches of 1,000 here, without the library
        "floor: rows": Case(lambda _: _floor(src, False), cleanup=_gone),
        "floor: rows + commits": Case(lambda _: _floor(src, True), cleanup=_gone),
        # context: the same rows in larger batches (the commit's fixed cost shared by more rows)
        **{
            f"extend_ x{n:,}": Case(lambda _, n=n: _append(src, n), cleanup=_gone)
            for n in LARGER_BATCHES
        },
    }
    loads = [_load()]
    out = interleave(cases)
    loads.append(_load())
    med = {name: statistics.median(o.times) for name, o in out.items() if o.times}
    for name, o in out.items():
        assert o.error is None, (name, o.error)
    ratio = med["extend_"] / med["one write"]
    # the reference rewrites i batches at batch i: extrapolate its measured rate
    ref_bytes = sum(i * BATCH * row_bytes for i in range(1, REF_BATCHES + 1))
    full_bytes = sum(i * BATCH * row_bytes for i in range(1, ROWS // BATCH + 1))
    ref_extrapolated = med["ref cat+memmap"] * full_bytes / ref_bytes
    print(
        f"\nappend {ROWS:,} rows ({ROWS * row_bytes / 2**20:.0f} MiB) in batches of {BATCH}, "
        f"{ROUNDS} alternated rounds, medians, load {loads[0]:.1f}-{loads[1]:.1f}:\n"
        f"  extend_          {med['extend_']:.3f} s   ({ratio:.2f}x the one write)\n"
        f"  one write        {med['one write']:.3f} s\n"
        f"  files made at full size, then the same batches written in (torchrl's way when "
        f"the size is known): here {med['preallocated, batches']:.3f} s "
        f"({med['extend_'] / med['preallocated, batches']:.2f}x for extend_), reference "
        f"{med['ref preallocated, batches']:.3f} s "
        f"({med['extend_'] / med['ref preallocated, batches']:.2f}x for extend_)\n"
        f"  the floor without the library (the same batches made, pwritten into files "
        f"reserved at full size): {med['floor: rows']:.3f} s "
        f"({med['floor: rows'] / med['one write']:.2f}x the one write); with a crash-safe "
        f"meta.json replacement per batch (create, write, exchange, unlink): "
        f"{med['floor: rows + commits']:.3f} s "
        f"({med['floor: rows + commits'] / med['one write']:.2f}x)\n"
        f"  ref cat+memmap   {med['ref cat+memmap']:.3f} s for its first {REF_BATCHES} batches, "
        f"~{ref_extrapolated:.0f} s extrapolated to all {ROWS // BATCH} batches\n"
        + "".join(
            f"  extend_ in batches of {n:,}: {med[f'extend_ x{n:,}']:.3f} s   "
            f"({med[f'extend_ x{n:,}'] / med['one write']:.2f}x the one write)\n"
            for n in LARGER_BATCHES
        )
    )
    shutil.rmtree(BASE, ignore_errors=True)
    assert ratio <= 1.3, f"extend_ costs {ratio:.2f}x one preallocated write (target 1.3x)"


def test_checkpoint_after_one_percent() -> None:
    rows = max(1024, int(CKPT_GIB * 2**30) // 4096)
    base = _fresh("ckpt")
    try:
        td = tensordict_rs.TensorDict({"obs": torch.zeros(rows, 1024)}, [rows]).memmap(
            base / "live"
        )
        total = rows * 4096
        g = torch.Generator().manual_seed(1)
        td.checkpoint(base / "ckpt")  # the first: both generations, in full
        lines = []
        figures = {}
        for label in ("first incremental", "steady state"):
            idx = torch.randperm(rows, generator=g)[: rows // 100]
            td[idx] = tensordict_rs.TensorDict(
                {"obs": torch.rand(len(idx), 1024, generator=g)}, [len(idx)]
            )
            load = _load()
            result: dict = {}
            dt, io, disk = _timed_io(
                base, lambda out=result: out.update(td.checkpoint(base / "ckpt"))
            )
            figures[label] = (dt, disk, result["bytes_written"])
            lines.append(
                f"  checkpoint, {label:17s} {dt:.3f} s, disk {disk / total:.2%}, "
                f"wchar {io['wchar'] / total:.2%}, write_bytes {io['write_bytes'] / total:.2%} "
                f"of the buffer (load {load:.1f})"
            )
        load = _load()
        t0 = time.perf_counter()
        vstats = td.checkpoint(base / "ckpt", verify=True)
        verify_dt = time.perf_counter() - t0
        lines.append(
            f"  checkpoint(verify=True)      {verify_dt:.3f} s, "
            f"hashed {vstats['bytes_hashed'] / 2**30:.2f} GiB, "
            f"wrote {vstats['bytes_written'] / total:.2%} (load {load:.1f})"
        )
        full_times = []
        for i in range(max(1, min(ROUNDS, 3))):
            load = _load()
            dt, io, disk = _timed_io(
                base, lambda i=i: td.memmap(base / f"full{i}", copy_existing=True)
            )
            full_times.append(dt)
            shutil.rmtree(base / f"full{i}")
            lines.append(
                f"  memmap(copy_existing=True)   {dt:.3f} s, disk {disk / total:.2%}, "
                f"write_bytes {io['write_bytes'] / total:.2%} (load {load:.1f})"
            )
        full = statistics.median(full_times)
        print(
            f"\ncheckpoint of a {total / 2**30:.2f} GiB buffer ({rows:,} rows of 4 KiB), "
            "1% of rows written:"
        )
        print("\n".join(lines))
        dt, disk, written = figures["first incremental"]
        print(
            f"  first incremental: {dt / full:.1%} of the full copy's time; "
            f"steady state: {figures['steady state'][0] / full:.1%}"
        )
        # The disk's count (the journal and metadata included) decides: on this kernel ext4
        # keeps file data in large folios, and /proc/self/io's write_bytes counts a whole folio
        # as dirtied for a 4 KiB write into it (99.7% of the buffer for 1% of rows written
        # back as 1.0% by the disk), so it is printed, not checked.
        assert written <= 0.02 * total and disk <= 0.02 * total + (8 << 20)
        assert dt <= 0.10 * full, f"checkpoint {dt:.3f} s vs full copy {full:.3f} s"
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(BASE, ignore_errors=True)
