"""Saves racing with loads.

* Live maps are never corrupted: a loaded TensorDict (in this process and in a second one)
  keeps seeing its values while other saves replace the directory, and writes through old
  maps never reach the new tree.
* Many readers, one or two writers: reader processes load and check a directory in a loop
  while writer processes save new versions into it; every load sees one whole version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensordict_rs
import torch
from tensordict_rs import TensorDict

READERS = 3
WRITE_SECONDS = float(os.environ.get("TDRS_RACE_SECONDS", "4"))


def make(v: float) -> TensorDict:
    """Version ``v``: every leaf filled with ``v`` (several dtypes, nested, empty, wide)."""
    td = TensorDict(
        {
            "f32": torch.full((8, 1000), v),
            "i64": torch.full((8, 300), int(v), dtype=torch.int64),
            "bf16": torch.full((8, 7), v, dtype=torch.bfloat16),
            "empty": torch.empty(8, 0),
            "nested": {
                "f64": torch.full((8, 2, 50), v, dtype=torch.float64),
                "deeper": {"i16": torch.full((8,), int(v), dtype=torch.int16)},
            },
        },
        [8],
    )
    td["version"] = torch.full((8,), int(v))
    return td


def leaves(td: TensorDict, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    out = []
    for key, value in td.items():
        if isinstance(value, TensorDict):
            out += leaves(value, f"{prefix}{key}/")
        elif isinstance(value, torch.Tensor):
            out.append((f"{prefix}{key}", value))
    return out


def versions_in(td: TensorDict) -> set[float]:
    """Every distinct value held by any non-empty leaf, and the version field."""
    seen: set[float] = set()
    for _, leaf in leaves(td):
        if leaf.numel():
            lo, hi = torch.aminmax(leaf.flatten().float())
            seen.update((float(lo), float(hi)))
    return seen


def assert_version(td: TensorDict, v: float) -> None:
    assert versions_in(td) == {float(v)}, f"expected only {v}, saw {sorted(versions_in(td))}"
    assert td["version"].shape == (8,) and bool((td["version"] == v).all())


# --------------------------------------------------------------------------- live maps


def test_memmap_like_reopens_the_files_it_finds(tmp_path: Path) -> None:
    """memmap_like onto a saved tree maps its files as they are (tensordict's documented way
    to reopen a buffer): old values kept, and every map of them stays one shared file."""
    prefix = tmp_path / "tree"
    writer = make(1).memmap_(prefix)
    early = TensorDict.load_memmap(prefix)
    again = make(2).memmap_like(prefix)
    assert_version(again, 1)
    early["f32"].fill_(5)
    assert bool((again["f32"] == 5).all()) and bool((writer["f32"] == 5).all())
    assert tensordict_rs.verify(prefix) == []


REPLACEMENTS = ["memmap", "memmap_", "memmap_like", "new_keys", "fewer_keys"]


def replace(prefix: Path, how: str, v: float) -> None:
    td = make(v)
    if how == "memmap":
        td.memmap(prefix)
    elif how == "memmap_":
        td.memmap_(prefix)
    elif how == "memmap_like":
        td.memmap_like(prefix)
    elif how == "new_keys":
        td["extra"] = torch.full((8, 3), v)
        td.memmap_(prefix)
    else:
        del td["nested"]
        td.memmap(prefix)


@pytest.mark.parametrize("how", [r for r in REPLACEMENTS if r != "memmap_like"])
def test_loaded_maps_keep_their_values(tmp_path: Path, how: str) -> None:
    prefix = tmp_path / "tree"
    writer = make(1).memmap_(prefix)  # the writer's own maps of version 1
    early = TensorDict.load_memmap(prefix)
    touched = early["f32"]  # one leaf made into a tensor before the replacement, others lazy
    assert float(touched[0, 0]) == 1
    replace(prefix, how, 2)
    replace(prefix, how, 3)
    assert_version(early, 1)
    assert_version(writer, 1)
    late = TensorDict.load_memmap(prefix)
    expected = 3
    assert versions_in(late) == {float(expected)}
    # writes through the old maps stay in the old files: the new tree does not change
    for _, leaf in leaves(early) + leaves(writer):
        leaf.fill_(9)
    assert versions_in(TensorDict.load_memmap(prefix)) == {float(expected)}
    assert versions_in(late) == {float(expected)}
    assert tensordict_rs.verify(prefix) == []


def test_in_place_resave_keeps_other_readers(tmp_path: Path) -> None:
    """memmap_ of an already saved TensorDict onto its own prefix, readers holding maps."""
    prefix = tmp_path / "tree"
    td = make(1)
    td.memmap_(prefix)
    reader = TensorDict.load_memmap(prefix)
    td.unlock_()
    td["f32"] = torch.full((8, 1000), 5.0)
    td.memmap_(prefix)
    assert_version(reader, 1)
    assert float(TensorDict.load_memmap(prefix)["f32"].min()) == 5


SECOND_PROCESS = r"""
import json, sys
import torch
from tensordict_rs import TensorDict
td = TensorDict.load_memmap(sys.argv[1])
first = float(td["f32"][0, 0])
print("ready", flush=True)
sys.stdin.readline()
seen = set()
def walk(t):
    for key, value in t.items():
        if isinstance(value, TensorDict):
            walk(value)
        elif isinstance(value, torch.Tensor) and value.numel():
            lo, hi = torch.aminmax(value.flatten().float())
            seen.update((float(lo), float(hi)))
walk(td)
print(json.dumps({"first": first, "seen": sorted(seen)}), flush=True)
"""


def test_loaded_maps_in_a_second_process(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    make(1).memmap(prefix)
    child = subprocess.Popen(
        [sys.executable, "-c", SECOND_PROCESS, os.fspath(prefix)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        assert line.strip() == "ready", line + (child.stderr.read() if child.stderr else "")
        for v, how in enumerate(REPLACEMENTS, start=2):
            replace(prefix, how, v)
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {"first": 1.0, "seen": [1.0]}, report


# --------------------------------------------------------------------------- many readers


def reader(prefix: Path, ready: Path, dones: list[Path]) -> None:
    loads, versions, violations, errors = 0, set(), [], []
    ready.touch()
    finished = False
    while not finished:
        finished = all(d.exists() for d in dones)  # one more full load after the writers stopped
        try:
            td = TensorDict.load_memmap(prefix)
        except Exception as err:
            errors.append(f"{type(err).__name__}: {err}")
            continue
        loads += 1
        seen = versions_in(td)
        version = {float(x) for x in td["version"].unique().tolist()}
        if len(seen) != 1 or seen != version:
            violations.append({"values": sorted(seen), "version": sorted(version)})
        versions |= seen
        del td
    print(
        json.dumps(
            {
                "loads": loads,
                "versions": len(versions),
                "violations": violations[:10],
                "n_violations": len(violations),
                "errors": errors[:10],
                "n_errors": len(errors),
            }
        ),
        flush=True,
    )


def writer(prefix: Path, readies: list[Path], done: Path, seconds: float, offset: int) -> None:
    deadline = time.monotonic() + 60
    while not all(r.exists() for r in readies):
        if time.monotonic() > deadline:
            raise SystemExit("the readers never started")
        time.sleep(0.01)
    v, end = 1, time.monotonic() + seconds
    while time.monotonic() < end:
        v += 1
        td = make((2 * v + offset) % 250)  # the writers' versions differ
        if v % 2:
            td.memmap_(prefix)
        else:
            td.memmap(prefix)
    done.touch()
    print(json.dumps({"saves": v - 1}), flush=True)


@pytest.mark.parametrize("writers", [1, 2])
def test_many_readers_and_writers(tmp_path: Path, writers: int) -> None:
    prefix = tmp_path / "tree"
    make(1).memmap(prefix)
    dones = [tmp_path / f"done{w}" for w in range(writers)]
    readies = [tmp_path / f"ready{i}" for i in range(READERS)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "reader",
                os.fspath(prefix),
                os.fspath(r),
                os.pathsep.join(map(os.fspath, dones)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in readies
    ]
    procs += [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "writer",
                os.fspath(prefix),
                os.fspath(done),
                str(WRITE_SECONDS),
                str(w),
                *map(os.fspath, readies),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w, done in enumerate(dones)
    ]
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    reports, writer_reports = outputs[:READERS], outputs[READERS:]
    print(f"\nwriters: {writer_reports}; readers: {reports}")
    for writer_report in writer_reports:
        assert writer_report["saves"] >= 10, writer_report
    for report in reports:
        assert report["n_violations"] == 0, report
        assert report["n_errors"] == 0, report
        assert report["loads"] >= 20, report
    # the readers really raced with the writer: they saw several versions
    assert sum(r["versions"] for r in reports) > 2 * READERS, reports
    assert tensordict_rs.verify(prefix) == []
    leftovers = [n for n in os.listdir(tmp_path) if ".tdrs" in n] + [
        n for n in os.listdir(prefix) if n.startswith(".tdrs")
    ]
    assert leftovers == []


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "reader":
        reader(Path(args[0]), Path(args[1]), [Path(d) for d in args[2].split(os.pathsep)])
    else:
        readies = [Path(a) for a in args[4:]]
        writer(Path(args[0]), readies, Path(args[1]), float(args[2]), int(args[3]))
