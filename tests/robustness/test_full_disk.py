"""Saves onto a full file system: a 1 MiB tmpfs mounted for the test (root only).

For directory saves (``memmap_(prefix)``, ``memmap(prefix)``, ``memmap_like(prefix)``, also
replacing an existing tree) and anonymous saves (``memmap_()``/``memmap_like()`` with
``TENSORDICT_RS_ANON_DIR`` on the tiny file system), over a sweep of tree sizes around the
capacity, every save either succeeds (and then its values read back and its maps can be
written everywhere, with no SIGBUS) or raises ``OSError`` with errno ENOSPC naming a path on
the tiny file system, leaving:

* the source TensorDict intact (not locked, not memory-mapped, same objects, same values);
* no partial directory (no staging ``.NAME.tdrs-*``, no target) and all the space given back;
* an existing tree at the target byte-for-byte as it was.

The saves run in a child process so that a SIGBUS would show as its exit status and so that
the environment variable applies from the start. The whole sweep runs twice: as it comes
(tmpfs files are never preallocated) and with ``TDRS_PREALLOCATE=always``, where every new
data file gets its blocks with ``fallocate`` before its bytes are written (what big files on
disk file systems get: ``rust/sys/prealloc.rs``), so a full disk fails there.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

MODES = ["dir", "dir_replace", "memmap", "like", "anon", "like_anon"]
SIZE = 1 << 20


# --------------------------------------------------------------------------- the child


def _free(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return st.f_bfree * st.f_frsize


def _configs() -> Iterator[tuple[str, dict[str, Any]]]:
    """Trees from well below to well above 1 MiB: one big leaf, many small, nested, long keys."""
    for kib in (256, 700, 900, 960, 1000, 1016, 1020, 1024, 1100, 1600, 4096):
        yield f"one-leaf-{kib}KiB", {"big": kib * 1024}
    for n in (60, 120, 240, 250, 254, 256, 300):
        yield f"{n}-leaves-4KiB", {f"k{i}": 4096 for i in range(n)}
    for kib in (500, 1000, 1008, 1020):
        yield f"nested-{kib}KiB", {"a": kib * 512, "sub/b": kib * 256, "sub/deeper/c": kib * 256}
    long = "k" * 200
    yield "long-keys", {f"{long}{i}": 3900 for i in range(255)}


def _build(spec: dict[str, int]) -> Any:
    import torch
    from tensordict_rs import TensorDict

    td = TensorDict({}, [4])
    for i, (name, nbytes) in enumerate(spec.items()):
        key = tuple(name.split("/"))
        td[key] = torch.full((4, max(nbytes // 16, 0)), float(i + 1))
    td["empty"] = torch.empty(4, 0)
    td["sub_empty"] = {"e": torch.empty(4, 0, dtype=torch.int64)}
    td["note"] = "text"
    return td


def _walk(td: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    from tensordict_rs import TensorDict

    for key, value in td.items():
        yield (*prefix, key), value
        if isinstance(value, TensorDict):
            yield from _walk(value, (*prefix, key))


def _snapshot_td(td: Any) -> list[tuple[tuple[str, ...], Any, Any]]:
    import torch

    return [(k, v, v.clone() if isinstance(v, torch.Tensor) else None) for k, v in _walk(td)]


def _td_problems(td: Any, before: list[tuple[tuple[str, ...], Any, Any]]) -> list[str]:
    import torch
    from tensordict_rs import MemoryMappedTensor, TensorDict

    problems = []
    after = list(_walk(td))
    if [k for k, _ in after] != [k for k, _, _ in before]:
        return ["the keys of the source changed"]
    for (key, obj, copy), (_, now) in zip(before, after, strict=True):
        if now is not obj:
            problems.append(f"{key}: replaced by another object")
        elif isinstance(obj, TensorDict) and (obj.is_locked or obj.is_memmap()):
            problems.append(f"{key}: sub-TensorDict left locked or memory-mapped")
        elif isinstance(obj, torch.Tensor):
            if isinstance(now, MemoryMappedTensor) or type(now) is not torch.Tensor:
                problems.append(f"{key}: became a {type(now).__name__}")
            elif not torch.equal(now, copy):
                problems.append(f"{key}: values changed")
    if td.is_locked or td.is_memmap():
        problems.append("the source was left locked or memory-mapped")
    return problems


def _tree_bytes(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            out[os.fspath(p.relative_to(root))] = (p.stat().st_ino, p.read_bytes())
    return out


def _check_values(result: Any, source_before: list[Any], like: bool, fill: bool) -> list[str]:
    """A successful save: values read back; with ``fill`` every map is written everywhere
    (a SIGBUS there means a map was not backed by reserved space)."""
    import torch

    problems = []
    values = dict(_walk(result))
    for key, _, copy in source_before:
        if copy is None:
            continue
        got = values.get(key)
        expect = torch.zeros_like(copy) if like else copy
        if got is None or not torch.equal(got, expect):
            problems.append(f"{key}: wrong values after a successful save")
        elif fill:
            got.fill_(7)
    return problems


def child(mnt: Path, modes: list[str]) -> None:
    """Runs every mode over every config; prints one JSON line per mode."""
    from tensordict_rs import TensorDict

    for mode in modes:
        report: dict[str, Any] = {"mode": mode, "enospc": 0, "ok": 0, "problems": []}
        target = mnt / "td"
        for name, spec in _configs():
            if mode == "dir_replace":
                old = TensorDict({}, [4])
                old["old"] = _build({"x": 96 * 1024})["x"]
                old.memmap_(target)
                del old
                old_bytes = _tree_bytes(target)
            free_before = _free(mnt)
            source = _build(spec)
            before = _snapshot_td(source)
            like = mode.startswith("like")
            try:
                if mode in ("dir", "dir_replace"):
                    result = source.memmap_(target)
                elif mode == "memmap":
                    result = source.memmap(target)
                elif mode == "like":
                    result = source.memmap_like(target)
                elif mode == "anon":
                    result = source.memmap_()
                else:
                    result = source.memmap_like()
            except OSError as err:
                report["enospc"] += 1
                problems = []
                if err.errno != errno.ENOSPC:
                    problems.append(f"errno {err.errno} ({err}), not ENOSPC")
                if not (err.filename or "").startswith(os.fspath(mnt)) or err.filename not in str(
                    err
                ):
                    problems.append(f"the error does not name the path: {err!r} {err.filename!r}")
                problems += _td_problems(source, before)
                del err
                left = sorted(os.listdir(mnt))
                if mode == "dir_replace":
                    if left != ["td"] or _tree_bytes(target) != old_bytes:
                        problems.append(f"the existing tree changed: {left}")
                elif left:
                    problems.append(f"left behind on the file system: {left}")
                if _free(mnt) != free_before:
                    problems.append(f"space not given back: {free_before} -> {_free(mnt)}")
                report["problems"] += [f"{name}: {p}" for p in problems]
            else:
                report["ok"] += 1
                problems = _check_values(result, before, like, fill=False)
                if mode.startswith("dir") or mode in ("memmap", "like"):
                    loaded = TensorDict.load_memmap(target)
                    problems += [f"reload: {p}" for p in _check_values(loaded, before, like, False)]
                    del loaded
                problems += _check_values(result, before, like, fill=True)
                report["problems"] += [f"{name}: {p}" for p in problems]
                del result
            del source, before
            if target.exists():
                shutil.rmtree(target)
            leftovers = os.listdir(mnt)
            if leftovers:
                report["problems"].append(f"{name}: could not clean up: {leftovers}")
                for entry in leftovers:
                    shutil.rmtree(mnt / entry, ignore_errors=True)
        print(json.dumps(report), flush=True)


# --------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module", params=["auto", "always"])
def full_disk_run(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> dict[str, Any]:
    """Mounts a 1 MiB tmpfs, runs every mode in one child process, unmounts."""
    mnt = tmp_path_factory.mktemp("tiny") / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tiny tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", os.fspath(mnt)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        env = {
            **os.environ,
            "TENSORDICT_RS_ANON_DIR": os.fspath(mnt),
            "PYTHONWARNINGS": "error",
            "TDRS_PREALLOCATE": request.param,
        }
        result = subprocess.run(
            [sys.executable, __file__, os.fspath(mnt), *MODES],
            capture_output=True,
            text=True,
            timeout=150,
            env=env,
        )
    finally:
        subprocess.run(["umount", os.fspath(mnt)], check=True)
    reports = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            report = json.loads(line)
            reports[report["mode"]] = report
    return {"rc": result.returncode, "stderr": result.stderr, "reports": reports}


@pytest.mark.parametrize("mode", MODES)
def test_full_disk(full_disk_run: dict[str, Any], mode: str) -> None:
    rc, stderr, reports = full_disk_run["rc"], full_disk_run["stderr"], full_disk_run["reports"]
    if mode not in reports:
        died = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"status {rc}"
        pytest.fail(f"the child died ({died}) during mode {mode!r}:\n{stderr[-3000:]}")
    report = reports[mode]
    assert report["problems"] == [], "\n".join(report["problems"])
    # the sweep must really have hit the full disk, and must not have failed everything
    assert report["enospc"] >= 3, report
    assert report["ok"] >= 3, report


def test_child_exited_cleanly(full_disk_run: dict[str, Any]) -> None:
    rc = full_disk_run["rc"]
    assert rc != -signal.SIGBUS, "SIGBUS: a map was touched beyond the space that backs it"
    assert rc == 0, full_disk_run["stderr"][-3000:]


if __name__ == "__main__":
    child(Path(sys.argv[1]), sys.argv[2:])
