"""Crash consistency: a saving process killed with SIGKILL at many instants of a save.

A server process (this file run as a script, so torch is imported once) keeps a saved tree at
``prefix`` holding version ``v`` (every leaf filled with ``value(v)``, several dtypes, a nested
sub-TensorDict, many small leaves and a non-tensor ``version``). For each kill it builds
version ``v + 1``, forks a child that saves it over ``prefix`` (alternating ``memmap`` and
``memmap_``, ``durable`` off and on), sleeps a delay drawn uniformly over the measured save
duration (and a little past it), and kills the child with SIGKILL. Then it loads ``prefix``:
every leaf must hold the old version or every leaf the new one (never a mix, never wrong
sizes), or the load must fail cleanly with a tensordict_rs exception or an OSError.

Every outcome is read twice: by our loader (which first finishes a commit that a kill
interrupted) and then by the reference ``tensordict``, which must see the same version.

Kills by timer rarely land inside the commit itself (a few renames, well under a millisecond),
so a second test lands them there on purpose: ``TENSORDICT_RS_KILL_AT_STEP=K`` makes the saving
process SIGKILL itself after ``K`` steps of its commit; then several loading processes are
killed the same way inside the recovery they run; then the tree must load as the new version
(the commit point was passed), by both loaders. A third test repeats the timed kills on a tree
that spans two mounts (a tmpfs mounted inside it, as root in a private mount namespace), where
each mount gets its own staging directory.

``TDRS_CRASH_KILLS`` sets the number of timed kills (default 200), ``TDRS_CRASH_COMMIT_ROUNDS``
the rounds of commit and recovery kills (default 25).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

KILLS = int(os.environ.get("TDRS_CRASH_KILLS", "200"))
COMMIT_ROUNDS = int(os.environ.get("TDRS_CRASH_COMMIT_ROUNDS", "25"))
STEP = "TENSORDICT_RS_KILL_AT_STEP"
SEED = int(os.environ.get("TDRS_CRASH_SEED", "20240607"))


def value(version: int) -> int:
    """The fill value of a version: consecutive versions differ; exact in every dtype used."""
    return version % 97 + 1


def make(version: int) -> Any:
    import torch
    from tensordict_rs import TensorDict

    v = value(version)
    td = TensorDict(
        {
            "a": torch.full((4, 1_000_000), float(v)),
            "b": torch.full((4, 250_000), v, dtype=torch.int64),
            "c": torch.full((4, 1000), v, dtype=torch.bfloat16),
            "n": {
                "x": torch.full((4, 250_000), float(v), dtype=torch.float64),
                "deep": {"y": torch.full((4, 5), v, dtype=torch.int32)},
                "small": {f"s{i}": torch.full((4, 16), v, dtype=torch.int16) for i in range(24)},
            },
        },
        [4],
    )
    td["version"] = str(version)
    return td


def refill(td: Any, version: int) -> None:
    """Turns the unsaved tree ``td`` into ``version`` (faster than building a new one)."""
    for _, leaf in _leaves(td):
        leaf.fill_(value(version))
    td["version"] = str(version)


def classify(prefix: Path, old: int, new: int) -> tuple[str, str]:
    """('old'|'new'|'clean-failure'|'MIXED'|'BAD', detail) for the tree now at ``prefix``."""
    import tensordict_rs
    import torch
    from tensordict_rs import TensorDict

    try:
        td = TensorDict.load_memmap(prefix)
    except (tensordict_rs.TensorDictError, OSError) as err:
        return "clean-failure", f"{type(err).__name__}: {err}"
    except Exception as err:
        return "BAD", f"unclean failure {type(err).__name__}: {err}"
    seen: dict[str, str] = {}
    expected_shapes = SHAPES
    for key, leaf in _leaves(td):
        if tuple(leaf.shape) != expected_shapes.get(key):
            return "BAD", f"{key}: shape {tuple(leaf.shape)}"
        lo, hi = (float(x) for x in torch.aminmax(leaf.flatten()))
        if lo == hi == value(old):
            seen[key] = "old"
        elif lo == hi == value(new):
            seen[key] = "new"
        else:
            return "MIXED", f"{key}: values of neither version: min {lo}, max {hi}"
    if set(seen) != set(expected_shapes):
        return "BAD", f"keys {sorted(seen)}"
    version = td["version"]
    seen["version"] = {str(old): "old", str(new): "new"}.get(version, f"?{version}")
    kinds = set(seen.values())
    if len(kinds) != 1:
        return "MIXED", json.dumps(seen)
    problems = tensordict_rs.verify(prefix)
    if problems:
        return "BAD", f"loads but verify() says {problems}"
    outcome = kinds.pop()
    ref = reference_version(prefix)
    if ref != (old if outcome == "old" else new):
        return "MIXED", f"our loader saw {outcome}, the reference loader saw {ref}"
    return outcome, ""


def reference_version(prefix: Path) -> Any:
    """The version the reference tensordict reads at ``prefix`` (or a description of a mix)."""
    import tensordict
    import torch

    td = tensordict.TensorDict.load_memmap(prefix)
    values = set()
    for key in SHAPES:
        leaf = td.get(tuple(key.split("/")))
        lo, hi = (float(x) for x in torch.aminmax(leaf.flatten().float()))
        values.update((lo, hi))
    version = int(td["version"])
    if values != {float(value(version))}:
        return f"mix: version {version}, values {sorted(values)}"
    return version


def staging_entries(prefix: Path) -> list[str]:
    """What saves leave inside the tree (staging directories, a journal), at any depth."""
    found = []
    for dirpath, dirnames, filenames in os.walk(prefix):
        found += [os.path.join(dirpath, n) for n in dirnames + filenames if n.startswith(".tdrs%")]
    return found


SHAPES: dict[str, tuple[int, ...]] = {}  # leaf -> shape, filled by the server


def _leaves(td: Any, prefix: str = "") -> Any:
    import torch
    from tensordict_rs import TensorDict

    for key, val in td.items():
        if isinstance(val, TensorDict):
            yield from _leaves(val, f"{prefix}{key}/")
        elif isinstance(val, torch.Tensor):
            yield f"{prefix}{key}", val


def save(td: Any, prefix: Path, i: int) -> None:
    """Kill ``i`` saves with ``memmap`` or ``memmap_`` (in place), every fourth one durable."""
    durable = i % 4 == 3
    if i % 2 == 0:
        td.memmap(prefix, durable=durable, num_threads=1)
    else:
        td.memmap_(prefix, durable=durable, num_threads=1)


def server(prefix: Path, kills: int, seed: int) -> None:
    import torch

    torch.set_num_threads(1)  # no thread pool in the parent: forking stays safe
    rng = random.Random(seed)
    parent, base = prefix.parent, prefix.name
    source = make(0)
    SHAPES.update({key: tuple(leaf.shape) for key, leaf in _leaves(source)})

    # calibration: how long each kind of save takes here (with an old tree to replace),
    # timed as the kills see it: from the fork to the child's end, since the delay below
    # starts at the fork (under load a fork of this process costs as much as a small save)
    durations: dict[bool, list[float]] = {False: [], True: []}
    for i in range(8):
        refill(source, i)
        forked = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                source.memmap(prefix, durable=i % 4 == 3, num_threads=1)
            except BaseException:
                status = 3
            os._exit(status)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"calibration save {i}"
        durations[i % 4 == 3].append(time.perf_counter() - forked)
    recent = {durable: list(d) for durable, d in durations.items()}
    current = 7
    print(json.dumps({"calibration": durations}), flush=True)

    for i in range(kills):
        new = current + 1
        refill(source, new)
        # uniform over the save as it currently lasts (recent saves that were not killed)
        delay = rng.uniform(0.0, 1.15 * statistics.median(recent[i % 4 == 3]))
        r, w = os.pipe()
        forked = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the child: save, and say when it started and finished
            os.close(r)
            status = 0
            try:
                os.write(w, b"S")
                save(source, prefix, i)
                # the span from the fork (the clock is the system's monotonic one)
                os.write(w, b"E" + struct.pack("d", time.perf_counter() - forked))
            except BaseException:
                status = 3
            os._exit(status)
        os.close(w)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        marks = b""
        while chunk := os.read(r, 16):
            marks += chunk
        os.close(r)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        if marks.startswith(b"SE") and len(marks) == 10:  # finished: learn how long it took
            recent[i % 4 == 3] = [*recent[i % 4 == 3][-9:], struct.unpack("d", marks[2:])[0]]
        journal = (prefix / ".tdrs%journal").exists()  # killed inside the commit
        outcome, detail = classify(prefix, current, new)
        if outcome == "new":
            current = new
        # staging left by a save killed before its commit point: the next save removes it
        leftovers = staging_entries(prefix)
        beside = [n for n in os.listdir(parent) if n != base]
        if beside:
            outcome, detail = "BAD", f"a save wrote beside the target: {beside}"
        print(
            json.dumps(
                {
                    "i": i,
                    "delay": delay,
                    "killed": killed,
                    "exit": None if killed else os.WEXITSTATUS(status),
                    "mid_save": killed and marks == b"S",
                    "span": statistics.median(recent[i % 4 == 3]),
                    "before_start": killed and marks == b"",
                    "outcome": outcome,
                    "detail": detail,
                    "leftovers": len(leftovers),
                    "journal": journal,
                }
            ),
            flush=True,
        )
        if not prefix.exists():  # a clean failure that lost the tree: start again
            refill(source, current)
            source.memmap(prefix)
    refill(source, current + 1)
    source.memmap(prefix)  # a save after all those kills leaves nothing of theirs behind
    print(json.dumps({"final_leftovers": staging_entries(prefix)}), flush=True)


def commit_server(prefix: Path, rounds: int, seed: int) -> None:
    """Kills inside the commit (by step), then inside the recoveries of several loaders."""
    import tensordict_rs
    import torch

    torch.set_num_threads(1)
    rng = random.Random(seed)
    source = make(0)
    SHAPES.update({key: tuple(leaf.shape) for key, leaf in _leaves(source)})
    source.memmap(prefix)
    current = 0

    def killed_child(step: int, work: Any) -> bool:
        pid = os.fork()
        if pid == 0:
            os.environ[STEP] = str(step)
            try:
                work()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL

    for i in range(rounds):
        new = current + 1
        refill(source, new)
        step = rng.randrange(0, 40)
        died = killed_child(step, lambda i=i: save(source, prefix, i))
        journal = (prefix / ".tdrs%journal").exists()
        recovery_kills = 0
        for _ in range(3 if journal else 0):
            recovery_kills += killed_child(
                rng.randrange(0, 30), lambda: tensordict_rs.TensorDict.load_memmap(prefix)
            )
        outcome, detail = classify(prefix, current, new)
        if outcome == "new":
            current = new
        print(
            json.dumps(
                {
                    "i": i,
                    "step": step,
                    "died": died,
                    "journal": journal,
                    "recovery_kills": recovery_kills,
                    "outcome": outcome,
                    "detail": detail,
                    "leftovers": staging_entries(prefix),
                }
            ),
            flush=True,
        )


def mount_server(prefix: Path, kills: int, seed: int) -> None:
    """The timed kills on a tree whose sub-TensorDict ``n`` is a tmpfs of its own."""
    (prefix / "n").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", prefix / "n"], check=True)
    server(prefix, kills, seed)


def run_timed_kills(prefix: Path, kills: int, mode: str, wrap: list[str]) -> None:
    started = time.perf_counter()
    result = subprocess.run(
        [*wrap, sys.executable, __file__, mode, os.fspath(prefix), str(kills), str(SEED)],
        capture_output=True,
        text=True,
        timeout=max(180, 2 * kills),
    )
    elapsed = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(ln) for ln in result.stdout.splitlines() if ln.startswith("{")]
    records = lines[1:-1]
    assert len(records) == kills, result.stderr[-3000:]
    assert lines[-1] == {"final_leftovers": []}, lines[-1]
    check_timed_kills(records, kills, elapsed, mode)


def test_kill_during_save(tmp_path: Path) -> None:
    run_timed_kills(tmp_path / "tree", KILLS, "timed", [])


def test_kill_during_save_across_mounts(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount a tmpfs inside the tree")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr!r}")
    run_timed_kills(tmp_path / "tree", max(30, KILLS // 8), "mount", ["unshare", "-m"])


def test_kill_inside_commit_and_recovery(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, __file__, "commit", os.fspath(tmp_path / "tree"), str(COMMIT_ROUNDS)]
        + [str(SEED)],
        capture_output=True,
        text=True,
        timeout=max(120, 3 * COMMIT_ROUNDS),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(ln) for ln in result.stdout.splitlines() if ln.startswith("{")]
    assert len(records) == COMMIT_ROUNDS, result.stderr[-3000:]
    bad = [r for r in records if r["outcome"] not in ("old", "new") or r["leftovers"]]
    assert not bad, "\n".join(json.dumps(r) for r in bad[:10])
    # past the commit point the new version must come out, however often recovery is killed
    lost = [r for r in records if r["journal"] and r["outcome"] != "new"]
    assert not lost, "\n".join(json.dumps(r) for r in lost[:10])
    in_commit = sum(r["journal"] for r in records)
    recovery_kills = sum(r["recovery_kills"] for r in records)
    print(
        f"\ncommit kills: {in_commit} of {COMMIT_ROUNDS} saves killed inside their commit, "
        f"{recovery_kills} recoveries killed; all {COMMIT_ROUNDS} rounds loaded whole "
        f"(new: {sum(r['outcome'] == 'new' for r in records)}) by both loaders"
    )
    assert in_commit >= COMMIT_ROUNDS // 2 and recovery_kills >= COMMIT_ROUNDS // 2


def check_timed_kills(records: list[dict[str, Any]], kills: int, elapsed: float, mode: str) -> None:
    outcomes = [r["outcome"] for r in records]
    survived = sum(o in ("old", "new") for o in outcomes)
    clean = outcomes.count("clean-failure")
    mid = sum(r["mid_save"] for r in records)
    spans = [r["span"] for r in records]
    mid_new = sum(r["mid_save"] and r["outcome"] == "new" for r in records)
    summary = (
        f"kills survived: {survived} out of {kills} (clean failures: {clean}); "
        f"{mid} kills landed mid-save, {sum(r['before_start'] for r in records)} before it "
        f"started, {sum(not r['killed'] for r in records)} after it finished; "
        f"outcomes old={outcomes.count('old')} new={outcomes.count('new')} "
        f"(mid-save kills that left the new version: {mid_new}); "
        f"a save took ~{statistics.median(spans) * 1000:.0f} ms (median; "
        f"{min(spans) * 1000:.0f}-{max(spans) * 1000:.0f}); "
        f"{sum(r['journal'] for r in records)} killed inside the commit; "
        f"[{mode}] {elapsed:.1f} s in all"
    )
    print("\n" + summary)
    bad = [r for r in records if r["outcome"] not in ("old", "new")]
    assert not bad, "\n".join(json.dumps(r) for r in bad[:10])
    errors = [r for r in records if not r["killed"] and r["exit"] != 0]
    assert not errors, f"the saving child failed on its own: {errors[:5]}"
    # the kills must really have been spread over the save, not all before or after it
    assert mid >= kills // 3, summary
    assert outcomes.count("old") > 0 and outcomes.count("new") > 0, summary


if __name__ == "__main__":
    servers = {"timed": server, "commit": commit_server, "mount": mount_server}
    servers[sys.argv[1]](Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
