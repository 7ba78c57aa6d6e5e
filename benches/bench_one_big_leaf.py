"""One big leaf (a dataset's observations): 1 GiB in one leaf plus a few small ones.

Where datasets live one leaf holds nearly all the bytes, so the save is one big file. Three
rows: a save to a new prefix on /dev/shm (tmpfs) and in the temp directory (ext4 here), and
a re-save over an existing tree in the temp directory (``memmap_(prefix, existsok=True)``,
the case that was 2x slower than the reference: a rename over the old 1 GiB file made ext4
write the new one back and TRIM the old one inside the save; see ``rust/sys/reclaim.rs``).

Beside each, the plain methods on the same file system, as cases of the same interleaved
rounds: ``write(2)`` from 1 thread and ``pwrite(2)`` from 2 threads at two offsets of one
file, each with and without ``fallocate`` first. The row's limit is the fastest of them (its
name is in the notes). Before every call the kernel's ``Dirty``/``Writeback`` counters and
the load average are recorded; the report prints their medians under the table.

On ext4 a case ``tensordict_rs, TDRS_PREALLOCATE=never`` runs our save without the
``fallocate`` it does there for big files (``rust/sys/prealloc.rs``), in the same rounds, so
the choice is measured, not assumed. Two more rows: the same tree saved as a ``.tdz`` archive
in the temp directory (``memmap(prefix.tdz)`` in both libraries), and the CRC-32 check of
that archive's 1 GiB entry (``verify``: ranges across the pool's threads, combined) beside
one thread's CRC (``refresh_archive_checksums(num_threads=1)`` of an unchanged archive) and
the plain read of every byte of the file (one thread, ``readinto``), its limit.

``TDRS_BENCH_BIG_GIB`` (default 1) sets the big leaf's size in GiB (``8`` for the issue's
second size: it needs 8 GiB of RAM for the source plus 8 GiB of /dev/shm, and 8 GiB free in
the temp directory: ext4 rows are skipped, with a message, when there is not that room).
``TDRS_BENCH_SCALE`` shrinks it like every workload.
"""

from __future__ import annotations

import gc
import os
import resource
import shutil
import statistics
import tempfile
import threading
from pathlib import Path

import pytest
import tensordict
import tensordict_rs
import torch
from _harness import (
    RESULTS,
    SCALE,
    SHM_BASE,
    Case,
    fresh_dir,
    measure,
    refill_free_memory,
    remove,
    replay,
    reported_mib,
)
from _workloads import LIMIT, REF, RS

try:
    from tensordict_rs._native import wait_freed
except ImportError:  # an older build: nothing is freed in the background there

    def wait_freed() -> int:
        return 0


GIB = float(os.environ.get("TDRS_BENCH_BIG_GIB", "1"))
TMP_BASE = Path(tempfile.gettempdir()) / f"tdrs-bench-big-{os.getpid()}"

# The plain methods (case names); the fastest is the row's limit.
PLAIN = ("write1", "write1_falloc", "pwrite2", "pwrite2_falloc")
# Our save without the fallocate it does for big files on disk file systems.
NO_PREALLOC = "tensordict_rs, TDRS_PREALLOCATE=never"


def big_rows() -> int:
    """Rows of the big float32 [rows, 64] leaf: 4,194,304 per GiB at full scale."""
    return max(1024, int(GIB * 4_194_304 * SCALE))


def build_big() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "obs": torch.rand(big_rows(), 64, generator=gen),
        "mean": torch.rand(64, generator=gen),
        "std": torch.rand(64, generator=gen),
        "step": torch.tensor([12345]),
    }


def dirty_mib() -> tuple[int, int]:
    """The kernel's Dirty and Writeback counters, in MiB."""
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            if key in ("Dirty", "Writeback"):
                out[key] = int(value.split()[0]) // 1024
    return out["Dirty"], out["Writeback"]


def _bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def plain_write(path: Path, data: memoryview, threads: int, falloc: bool) -> None:
    """One new file: write(2) from 1 thread, or pwrite(2) from 2 threads at two page-aligned
    offsets; with ``falloc``, ``posix_fallocate`` of the whole size first."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        n = data.nbytes
        if falloc and n:
            os.posix_fallocate(fd, 0, n)
        if threads == 1:
            view = data
            while view.nbytes:
                view = view[os.write(fd, view) :]
            return
        half = (n // 2) & ~4095
        spans = [(0, half), (half, n)]

        def put(start: int, end: int) -> None:
            view, at = data[start:end], start
            while view.nbytes:
                k = os.pwrite(fd, view, at)
                view, at = view[k:], at + k

        workers = [threading.Thread(target=put, args=span) for span in spans]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        os.close(fd)


def _free_gib(path: Path) -> float:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize / 2**30


def _cases(
    src: dict, base: Path, resave: bool, archive: bool = False
) -> tuple[dict[str, Case], dict[str, list]]:
    ext4 = base != SHM_BASE
    rs_src = tensordict_rs.TensorDict(dict(src), [])
    ref_src = tensordict.TensorDict(dict(src), batch_size=[])
    data = _bytes(src["obs"])
    state: dict[str, list] = {"dirty": [], "load": [], "cpu": [], "reported": []}

    def cpu_timed(case: str, call):
        """``call`` with this process's CPU time (all threads) recorded: under load the
        wall time is mostly waiting for a CPU, the CPU time much less so."""

        def timed(s):
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            m0 = reported_mib()
            try:
                return call(s)
            finally:
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                m1 = reported_mib()
                used = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
                state["cpu"].append((case, used))
                if m0 is not None and m1 is not None:
                    state["reported"].append((case, m1 - m0))

        return timed

    def note(case: str) -> None:
        if ext4:
            os.sync()  # every call starts with no dirty pages of an earlier one
        # the call's new pages come from memory the guest holds, not from what it reported
        refill_free_memory(int(data.nbytes * 1.25))
        d, wb = dirty_mib()
        state["dirty"].append((case, d, wb))
        state["load"].append(os.getloadavg()[0])

    kept = {REF: base / "ref-kept", RS: base / "rs-kept"}
    if resave:
        # Each library re-saves over its own tree, made once here.
        ref_src.copy().memmap_(kept[REF])
        rs_src.clone(recurse=False).memmap_(kept[RS])

    def lib_case(case: str) -> Case:
        lib = REF if case == REF else RS
        env = {"TDRS_PREALLOCATE": "never"} if case == NO_PREALLOC else {}

        def setup():
            td = ref_src.copy() if lib == REF else rs_src.clone(recurse=False)
            path = kept[lib] if resave else fresh_dir(base)
            if archive:
                path.mkdir()
            note(case)
            return td, path

        def call(s):
            td, path = s
            os.environ.update(env)
            try:
                if archive:
                    return td.memmap(path / "td.tdz")
                return td.memmap_(path, existsok=True) if resave else td.memmap_(path)
            finally:
                for key in env:
                    del os.environ[key]

        def cleanup(s, result):
            if lib == RS:
                wait_freed()  # what the save freed in the background: not the next case's time
            if s is not None and not resave:
                remove(s[1])

        return Case(setup=setup, call=cpu_timed(case, call), cleanup=cleanup)

    def plain_case(name: str) -> Case:
        threads = 2 if name.startswith("pwrite2") else 1
        falloc = name.endswith("falloc")

        def setup():
            path = fresh_dir(base)
            path.mkdir()
            note(name)
            return path

        return Case(
            setup=setup,
            call=cpu_timed(
                name, lambda path: plain_write(path / "obs.memmap", data, threads, falloc)
            ),
            cleanup=lambda path, _: remove(path),
        )

    cases = {REF: lib_case(REF), RS: lib_case(RS)}
    if ext4:
        cases[NO_PREALLOC] = lib_case(NO_PREALLOC)
    cases.update({name: plain_case(name) for name in PLAIN})
    state["kept"] = list(kept.values()) if resave else []
    return cases, state


def _measure(workload: str, src: dict, base: Path, resave: bool, archive: bool = False) -> None:
    if workload in RESULTS:
        return
    made: dict[str, dict] = {}

    def make():
        cases, made["state"] = _cases(src, base, resave, archive)
        return cases

    nbytes = sum(t.numel() * t.element_size() for t in src.values())
    try:
        entry = measure(workload, nbytes, make)
    finally:
        for path in made.get("state", {}).get("kept", []):
            shutil.rmtree(path, ignore_errors=True)
    state = made["state"]
    # The row's limit: the fastest plain method (by median), named in the notes.
    plain = {
        name: statistics.median(entry["cases"][name]["times"])
        for name in PLAIN
        if entry["cases"][name]["times"] and not entry["cases"][name]["error"]
    }
    if plain:
        best = min(plain, key=lambda k: plain[k])
        entry["cases"]["limit"] = dict(entry["cases"][best])
        entry["limit_method"] = best
    entry["plain"] = plain
    entry["resized"] = GIB != 1  # the report's row title then says the size of this run
    entry["variants"] = {
        name: statistics.median(entry["cases"][name]["times"])
        for name in (NO_PREALLOC,)
        if name in entry["cases"] and entry["cases"][name]["times"]
    }
    entry["dirty"] = {
        case: [statistics.median(d for c, d, _ in state["dirty"] if c == case)]
        + [statistics.median(w for c, _, w in state["dirty"] if c == case)]
        for case in {c for c, _, _ in state["dirty"]}
    }
    entry["load"] = [min(state["load"]), statistics.median(state["load"]), max(state["load"])]
    # CPU seconds of each case (medians over its rounds, the warm-up included)
    entry["cpu"] = {
        case: statistics.median(t for c, t in state["cpu"] if c == case)
        for case in {c for c, _ in state["cpu"]}
    }
    # MiB the guest reported to its host during each case's calls (the most of its rounds)
    entry["reported"] = {
        case: round(max(m for c, m in state["reported"] if c == case))
        for case in {c for c, _ in state["reported"]}
    }


@pytest.fixture(scope="module")
def big():
    src = build_big()
    yield src
    del src
    gc.collect()


@pytest.fixture(scope="module")
def tmp_base(big):
    TMP_BASE.mkdir(parents=True, exist_ok=True)
    yield TMP_BASE
    shutil.rmtree(TMP_BASE, ignore_errors=True)


def _room(base: Path, src: dict, copies: float) -> None:
    need = copies * sum(t.numel() * t.element_size() for t in src.values()) / 2**30 + 0.5
    if _free_gib(base) < need:
        pytest.skip(f"{base} has {_free_gib(base):.1f} GiB free; this row needs {need:.1f} GiB")


CASES = (REF, RS, "limit")


@pytest.mark.parametrize("case", CASES)
def test_big1_save_shm(benchmark, case, big):
    SHM_BASE.mkdir(parents=True, exist_ok=True)
    _room(SHM_BASE, big, 1)
    _measure("big1_save_shm", big, SHM_BASE, resave=False)
    replay(benchmark, "big1_save_shm", case)


@pytest.mark.parametrize("case", CASES)
def test_big1_save_tmp(benchmark, case, big, tmp_base):
    _room(tmp_base, big, 1)
    _measure("big1_save_tmp", big, tmp_base, resave=False)
    replay(benchmark, "big1_save_tmp", case)


@pytest.mark.parametrize("case", CASES)
def test_big1_resave_tmp(benchmark, case, big, tmp_base):
    # two kept trees, one new file beside the old during a re-save, one plain file
    _room(tmp_base, big, 4)
    _measure("big1_resave_tmp", big, tmp_base, resave=True)
    replay(benchmark, "big1_resave_tmp", case)


@pytest.mark.parametrize("case", CASES)
def test_big1_tdz_tmp(benchmark, case, big, tmp_base):
    _room(tmp_base, big, 2)
    _measure("big1_tdz_tmp", big, tmp_base, resave=False, archive=True)
    replay(benchmark, "big1_tdz_tmp", case)


ONE_THREAD = "tensordict_rs, 1 thread"


def _crc_cases(path: Path) -> dict[str, Case]:
    """``verify`` of the archive (every CRC, big entries in ranges across the threads), one
    thread's CRCs of the same entries, and the plain read of every byte (the limit)."""
    buf = bytearray(16 << 20)

    def read_all_bytes(_):
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass

    def verify(_):
        problems = tensordict_rs.verify(path)
        assert not problems, problems

    def one_thread(_):
        changed = tensordict_rs._native.refresh_archive_checksums(os.fspath(path), num_threads=1)
        assert not changed, changed

    return {
        RS: Case(setup=lambda: None, call=verify),
        ONE_THREAD: Case(setup=lambda: None, call=one_thread),
        LIMIT: Case(setup=lambda: None, call=read_all_bytes),
    }


@pytest.mark.parametrize("case", (RS, LIMIT))
def test_big1_verify_tdz(benchmark, case, big, tmp_base):
    _room(tmp_base, big, 1)
    if "big1_verify_tdz" not in RESULTS:
        path = tmp_base / "verify" / "td.tdz"
        path.parent.mkdir(exist_ok=True)
        tensordict_rs.TensorDict(dict(big), []).memmap(path)
        try:
            entry = measure("big1_verify_tdz", path.stat().st_size, lambda: _crc_cases(path))
        finally:
            remove(path.parent)
        times = entry["cases"][ONE_THREAD]["times"]
        entry["variants"] = {ONE_THREAD: statistics.median(times)} if times else {}
        entry["load"] = [os.getloadavg()[0]] * 3  # one reading, after the rounds
    replay(benchmark, "big1_verify_tdz", case)


def test_big1_roundtrip_sanity(big, tmp_base):
    """Both libraries read back what they saved (not timed)."""
    for lib, td in (
        (tensordict, tensordict.TensorDict(dict(big), batch_size=[])),
        (tensordict_rs, tensordict_rs.TensorDict(dict(big), [])),
    ):
        path = tmp_base / f"sanity-{lib.__name__}"
        td.memmap_(path)
        back = lib.TensorDict.load_memmap(path)
        for key, value in big.items():
            assert torch.equal(back[key], value), (lib.__name__, key)
        del back, td
        gc.collect()
        remove(path)
