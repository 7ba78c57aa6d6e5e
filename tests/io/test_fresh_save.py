"""Saves to a prefix that does not exist yet: built beside it, moved in with one rename.

Such a save builds the whole tree in a hidden sibling (``.tdrs%new-<hash>``) and renames it
to the prefix with ``RENAME_NOREPLACE`` (see ``rust/tree/save/fresh.rs``). Checked here:

* kill -9 at random instants of such saves (a server process forks each saving child, as in
  ``test_crash.py``): the prefix is then absent or holds the whole new tree, read the same by
  our loader and by the reference's; beside it there is at most the dead save's sibling, which
  the next save to that prefix removes;
* a directory the user creates at the prefix while the save runs is kept (the same inode, its
  files) and the tree is saved into it;
* a flat tree of many leaves saved this way round-trips through the reference.

``TDRS_FRESH_KILLS`` sets the number of kills (default 25).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

KILLS = int(os.environ.get("TDRS_FRESH_KILLS", "25"))
SIBLING = ".tdrs%new-"


def make(version: int) -> Any:
    import torch
    from tensordict_rs import TensorDict

    v = float(version % 97 + 1)
    td = TensorDict(
        {
            "big": torch.full((4, 250_000), v),
            "n": {"x": torch.full((4, 1000), v), "deep": {"y": torch.full((4, 3), v)}},
            **{f"s{i}": torch.full((4, 8), v) for i in range(300)},
        },
        [4],
    )
    td["version"] = str(version)
    return td


def check(prefix: Path, version: int) -> str:
    """'absent', 'new', or a description of what is wrong at ``prefix``."""
    import tensordict
    import torch
    from tensordict_rs import TensorDict

    if not prefix.exists():
        return "absent"
    ours = TensorDict.load_memmap(prefix)
    ref = tensordict.TensorDict.load_memmap(prefix)
    want = float(version % 97 + 1)
    for td, who in ((ours, "ours"), (ref, "reference")):
        if td["version"] != str(version):
            return f"{who}: version {td['version']}"
        leaves = [td["big"], td["n", "x"], td["n", "deep", "y"]] + [td[f"s{i}"] for i in range(300)]
        for leaf in leaves:
            lo, hi = (float(x) for x in torch.aminmax(leaf.flatten()))
            if lo != want or hi != want:
                return f"{who}: values {lo}..{hi}, want {want}"
    return "new"


def server(parent: Path, kills: int, seed: int) -> None:
    import torch

    torch.set_num_threads(1)
    rng = random.Random(seed)
    prefix = parent / "tree"
    source = make(0)
    spans = []
    for i in range(5):  # how long a fresh save lasts here, in a forked child as below
        shutil.rmtree(prefix, ignore_errors=True)
        source = make(i)
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            try:
                source.memmap_(prefix, num_threads=1)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        spans.append(time.perf_counter() - start)
    upper = 1.2 * statistics.median(spans)
    seen = set()
    for i in range(kills):
        if i >= kills // 2 and "new" not in seen:
            upper *= 1.5  # the machine got slower: reach past the rename too
        shutil.rmtree(prefix, ignore_errors=True)
        source = make(i)
        pid = os.fork()
        if pid == 0:
            try:
                source.memmap_(prefix, num_threads=1, durable=i % 5 == 4)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, upper))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        outcome = check(prefix, i)
        seen.add(outcome)
        beside = sorted(n for n in os.listdir(parent) if n != "tree")
        print(json.dumps({"i": i, "outcome": outcome, "beside": beside}), flush=True)
    shutil.rmtree(prefix, ignore_errors=True)
    make(kills).memmap_(prefix)
    print(json.dumps({"final": sorted(os.listdir(parent)), "check": check(prefix, kills)}))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the one-rename save is Linux's")
def test_kill_during_fresh_saves(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, __file__, os.fspath(tmp_path), str(KILLS), "20260612"],
        capture_output=True,
        text=True,
        timeout=max(180, 5 * KILLS),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(ln) for ln in result.stdout.splitlines() if ln.startswith("{")]
    records, final = lines[:-1], lines[-1]
    assert len(records) == KILLS, result.stderr[-3000:]
    for rec in records:
        assert rec["outcome"] in ("absent", "new"), rec
        # at most the killed save's own sibling, never anything else
        assert len(rec["beside"]) <= 1 and all(n.startswith(SIBLING) for n in rec["beside"]), rec
    outcomes = {rec["outcome"] for rec in records}
    if KILLS >= 20:
        assert outcomes == {"absent", "new"}, "kills should land both before and after the rename"
        assert any(rec["beside"] for rec in records), "some kill should land mid-build"
    # the next save to the prefix removed the dead save's sibling
    assert final == {"final": ["tree"], "check": "new"}, final


def test_prefix_created_during_the_save_is_kept(tmp_path: Path) -> None:
    import torch
    from tensordict_rs import TensorDict

    prefix = tmp_path / "tree"
    td = TensorDict({f"k{i}": torch.full((64,), float(i)) for i in range(3000)}, [])
    made: dict[str, Any] = {}

    def make_it() -> None:  # races the save: before, during or after its rename
        time.sleep(0.002)
        try:
            prefix.mkdir()
        except FileExistsError:
            made["late"] = True
            return
        (prefix / "mine.txt").write_text("mine")
        made["ino"] = prefix.stat().st_ino

    racer = threading.Thread(target=make_it)
    racer.start()
    td.memmap_(prefix)
    racer.join()
    if "ino" in made:  # the user's directory won: it is kept, with their file, the tree in it
        assert prefix.stat().st_ino == made["ino"]
        assert (prefix / "mine.txt").read_text() == "mine"
    loaded = TensorDict.load_memmap(prefix)
    assert float(loaded["k2999"][0]) == 2999.0
    assert sorted(os.listdir(tmp_path)) == ["tree"]


def test_flat_tree_round_trips_through_the_reference(tmp_path: Path) -> None:
    import tensordict
    import torch
    from tensordict_rs import TensorDict

    prefix = tmp_path / "a" / "b" / "flat"  # parents are created too
    src = {f"leaf{i}": torch.arange(i, i + 5, dtype=torch.int64) for i in range(2000)}
    saved = TensorDict(src, []).memmap_(prefix)
    assert saved["leaf7"].filename == os.fspath(prefix / "leaf7.memmap")
    ref = tensordict.TensorDict.load_memmap(prefix)
    assert all(torch.equal(ref[k], v) for k, v in src.items())
    assert sorted(os.listdir(prefix.parent)) == ["flat"]


if __name__ == "__main__":
    server(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
