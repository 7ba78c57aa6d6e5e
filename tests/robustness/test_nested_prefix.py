"""A sub-tree saved as its own prefix never loads torn through its parent (issue 28, defect 4).

A tree's sub-directory can be saved on its own (``td["sub"].memmap(prefix / "sub")``): it then
has its own lock and journal. Before the fix, loading the parent checked only the parent's
journal: a save to ``prefix/sub`` killed inside its commit left the parent loading a sub-tree
that mixed versions, and ``verify(prefix)`` called it clean; while such saves ran, loads of the
parent returned torn sub-trees.

Checked at depth 2 (``prefix/sub``) and 3 (``prefix/sub/deep``): a nested save killed at each
step of its commit (the parent's load must finish it, or refuse; ``verify`` of the parent must
report it), and loads of the parent racing a process that saves the nested prefix over and
over (every loaded sub-tree must be one version).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ._attack_helpers import JOURNAL, killed_save, leftovers, reaped, versions

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NESTED = {2: ("sub",), 3: ("sub", "deep")}


def parent_tree(version: int) -> Any:
    from tensordict_rs import TensorDict

    v = float(version)
    return TensorDict(
        {
            "obs": torch.full((4, 3), v),
            "sub": {
                **{f"x{i}": torch.full((4, 2), v) for i in range(8)},
                "deep": {f"y{i}": torch.full((4, 5), v) for i in range(8)},
            },
        },
        [4],
    )


def nested_tree(version: int, depth: int) -> Any:
    """The sub-tree at ``NESTED[depth]`` of ``parent_tree(version)``."""
    td = parent_tree(version)
    return td.get(NESTED[depth])


def on_disk(prefix: Path) -> dict[str, Any]:
    """The leaves' versions read straight from the files (first float of each), with each
    meta.json's inode, for a failure message."""
    out: dict[str, Any] = {}
    for path in sorted(prefix.rglob("*")):
        rel = os.fspath(path.relative_to(prefix))
        try:
            if path.name.endswith(".memmap"):
                out[rel] = float(
                    torch.frombuffer(bytearray(path.read_bytes()[:4]), dtype=torch.float32)
                )
            elif path.name == "meta.json" or path.name.startswith(".tdrs"):
                out[rel] = path.lstat().st_ino
        except OSError as err:  # replaced meanwhile
            out[rel] = type(err).__name__
    return out


def nested_values(td: Any, depth: int) -> set[float]:
    path = "/".join(NESTED[depth]) + "/"
    return {v for k, v in versions(td).items() if k.startswith(path)}


@pytest.mark.parametrize("depth", sorted(NESTED))
def test_killed_nested_save_is_finished_or_refused_by_the_parent(
    tmp_path: Path, depth: int
) -> None:
    import tensordict_rs
    from tensordict_rs import TensorDict

    killed = 0
    for step in range(0, 24, 3):
        prefix = tmp_path / f"t{step}"
        parent_tree(1).memmap(prefix)
        nested = prefix.joinpath(*NESTED[depth])
        hit = killed_save(lambda n=nested: nested_tree(2, depth).memmap(n), step)
        killed += hit
        if hit:
            assert (nested / JOURNAL).exists()
            problems = tensordict_rs.verify(prefix)
            assert any(JOURNAL in p for p in problems), f"verify of the parent: {problems}"
        try:
            td = TensorDict.load_memmap(prefix)
        except tensordict_rs.TensorDictError as err:  # a refusal is allowed; a mix is not
            pytest.fail(f"step {step}: the parent refused to load: {err}")
        assert nested_values(td, depth) == {2.0}, f"step {step}: torn sub-tree {versions(td)}"
        assert versions(td)["obs"] == 1.0
        assert tensordict_rs.verify(prefix) == []
        assert leftovers(prefix) == []
    assert killed >= 4


WRITER = """
import sys, time, torch
sys.path.insert(0, sys.argv[4])
from tests.robustness.test_nested_prefix import nested_tree
nested, depth, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
torch.set_num_threads(1)
version, end = 2, time.monotonic() + seconds
print("started", flush=True)
while time.monotonic() < end:
    td = nested_tree(version, depth)
    if version % 2:
        td.memmap(nested)
    else:
        td.memmap_(nested)
    version += 1
print(version, flush=True)
"""


@pytest.mark.parametrize("depth", sorted(NESTED))
def test_loads_racing_nested_saves_are_never_torn(tmp_path: Path, depth: int) -> None:
    import tensordict_rs
    from tensordict_rs import TensorDict

    prefix = tmp_path / "tree"
    parent_tree(1).memmap(prefix)
    nested = prefix.joinpath(*NESTED[depth])
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, os.fspath(nested), str(depth), "4", ROOT_DIR],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    loads, torn, refused, seen = 0, [], 0, set()
    with reaped(writer):
        assert writer.stdout is not None and writer.stdout.readline().strip() == "started"
        while writer.poll() is None:
            try:
                td = TensorDict.load_memmap(prefix)
            except tensordict_rs.TensorDictError:
                refused += 1
                continue
            loads += 1
            values = nested_values(td, depth)
            seen |= values
            if len(values) != 1:
                torn.append(sorted(values))
        _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err[-3000:]
    summary = json.dumps({"loads": loads, "torn": len(torn), "refused": refused})
    assert not torn, f"{summary}: {torn[:5]}"
    assert loads >= 20 and len(seen) >= 3, summary  # the race really ran
    assert refused <= loads // 10, summary


@pytest.mark.parametrize("then", ["load-sub", "save-sub"])
def test_parent_commit_is_finished_before_a_sub_tree_is_used(tmp_path: Path, then: str) -> None:
    """The other direction: a save of the parent killed in its commit leaves ``sub`` half
    moved. A load of ``prefix/sub`` (as its own prefix) must not return that mix, and a save
    to it must not find the parent's new files "in the way": both finish the parent's commit
    first."""
    from tensordict_rs import TensorDict

    killed = 0
    for step in range(0, 24, 3):
        prefix = tmp_path / f"t{step}"
        parent_tree(1).memmap(prefix)
        newer = parent_tree(2)
        newer["sub", "new"] = torch.full((4, 2), 2.0)  # a key the old sub-tree lacks
        killed += killed_save(lambda p=prefix, t=newer: t.memmap(p), step)
        if then == "load-sub":
            sub = TensorDict.load_memmap(prefix / "sub")
            assert set(versions(sub).values()) == {2.0}, f"step {step}: {versions(sub)}"
            assert "new" in sub.keys()
        else:
            mine = nested_tree(3, 2)
            mine["new"] = torch.full((4, 2), 3.0)
            mine.memmap(prefix / "sub")
            td = TensorDict.load_memmap(prefix)
            assert nested_values(td, 2) == {3.0} and versions(td)["obs"] == 2.0, versions(td)
        assert leftovers(prefix / "sub") == []
    assert killed >= 4


SAVER = """
import sys, time, torch
sys.path.insert(0, sys.argv[4])
from tests.robustness.test_nested_prefix import nested_tree, parent_tree
target, depth, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
torch.set_num_threads(1)
version, end = (10 if depth else 1_000), time.monotonic() + seconds
print("started", flush=True)
while time.monotonic() < end:
    td = nested_tree(version, 2) if depth else parent_tree(version)
    (td.memmap_ if version % 2 else td.memmap)(target)
    version += 1
print(version, flush=True)
"""


def test_saves_of_a_tree_and_of_its_sub_tree_at_once(tmp_path: Path) -> None:
    """One process saves ``prefix`` over and over, another ``prefix/sub``: they run one after
    the other (the nested save holds the tree's lock, shared), neither fails, and every load
    sees each saved unit whole."""
    import tensordict_rs
    from tensordict_rs import TensorDict

    prefix = tmp_path / "tree"
    parent_tree(1).memmap(prefix)
    savers = [
        subprocess.Popen(
            [sys.executable, "-c", SAVER, os.fspath(target), str(depth), "4", ROOT_DIR],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for target, depth in ((prefix, 0), (prefix / "sub", 2))
    ]
    loads, torn, errs = 0, [], []
    with reaped(*savers):
        for saver in savers:
            assert saver.stdout is not None and saver.stdout.readline().strip() == "started"
        while any(s.poll() is None for s in savers):
            try:
                td = TensorDict.load_memmap(prefix)
            except tensordict_rs.TensorDictError:
                continue
            loads += 1
            if len(nested_values(td, 2)) != 1:
                # what the directory holds right after (a torn tree on disk, or a torn read?)
                torn.append({"loaded": versions(td), "then": on_disk(prefix)})
        errs = [saver.communicate(timeout=60)[1] for saver in savers]
    for saver, err in zip(savers, errs, strict=True):
        assert saver.returncode == 0, err[-3000:]
    assert not torn, f"{len(torn)} of {loads} loads torn: {torn[:2]}"
    assert loads >= 20
