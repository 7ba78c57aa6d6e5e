"""An obstacle met after the commit point leaves a loadable, saveable tree that keeps it
(issue 28, defect 3).

A save that adds a key (a sub-tree, a NonTensorData value, a leaf) is killed right after its
commit point; then something appears at the key's name: a user's directory (empty or not), a
file, a symlink, a FIFO, or another save's tree (ours or the reference's, with the name as its
own prefix). The next load finishes the commit. Before the fix every later load and save of the
prefix failed with "an interrupted save could not be finished ... will be finished by the next
save or load", which never happened (or, for a leaf's name, the user's file was silently
replaced).

Now: the obstacle stays exactly as it is; a directory without a meta.json receives the key's
files (as a save into an existing directory would); another save's tree there is kept and loads
as the key (the later save wins); anything else keeps the key out of the saved tree. Both loaders
read the rest as the new version, ``verify`` finds nothing, and the tree saves again.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import torch

from ._attack_helpers import JOURNAL, killed_save, leftovers, tree, versions

TARGETS = {"subtree": "fresh", "nontensor": "label", "leaf": "extra.memmap"}
KINDS = ["empty-dir", "dir-with-file", "file", "symlink", "fifo", "our-save", "reference-save"]
CASES = [
    (target, kind)
    for target in TARGETS
    for kind in KINDS
    if not (target == "leaf" and kind.endswith("save"))
]


def with_key(version: int, target: str) -> Any:
    td = tree(version, keys=("obs",))
    if target == "subtree":
        td["fresh"] = {"x": torch.full((4, 2), float(version)), "deep": {"y": torch.ones(4)}}
        td["fresh", "deep", "y"] = torch.full((4,), float(version))
    elif target == "nontensor":
        td["label"] = str(version)
    else:
        td["extra"] = torch.full((4, 3), float(version))
    return td


def plant(kind: str, at: Path, outside: Path) -> Any:
    """Makes the obstacle; returns what must still be there afterwards."""
    import tensordict
    from tensordict_rs import TensorDict

    nested = {"x": torch.full((4, 2), 5.0), "deep": {"y": torch.full((4,), 5.0)}}
    if kind in ("empty-dir", "dir-with-file"):
        at.mkdir()
        if kind == "dir-with-file":
            (at / "mine.txt").write_text("mine")
    elif kind == "file":
        at.write_bytes(b"user data")
    elif kind == "symlink":
        outside.mkdir(exist_ok=True)
        (outside / "precious").write_text("precious")
        at.symlink_to(outside)
    elif kind == "fifo":
        os.mkfifo(at)
    elif kind == "our-save":
        TensorDict(nested, [4]).memmap(at)
    else:
        tensordict.TensorDict(nested, [4]).memmap(at)
    return os.lstat(at)


def still_there(kind: str, at: Path, before: os.stat_result, outside: Path) -> None:
    now = os.lstat(at)
    assert now.st_ino == before.st_ino, f"{kind} at {at} was replaced"
    if kind == "dir-with-file":
        assert (at / "mine.txt").read_text() == "mine"
    elif kind == "file":
        assert at.read_bytes() == b"user data"
    elif kind == "symlink":
        assert at.is_symlink() and os.readlink(at) == os.fspath(outside)
        assert sorted(os.listdir(outside)) == ["precious"]
    elif kind == "fifo":
        assert stat.S_ISFIFO(now.st_mode)


def expected(target: str, kind: str) -> str:
    """'ours' (the key holds version 2), 'theirs' (the nested save's tree), or 'absent'."""
    if target != "leaf" and kind in ("empty-dir", "dir-with-file"):
        return "ours"
    if kind.endswith("save"):
        return "theirs"
    return "absent"


@pytest.mark.parametrize(("target", "kind"), CASES)
def test_obstacle_after_the_commit_point(tmp_path: Path, target: str, kind: str) -> None:
    import tensordict
    import tensordict_rs
    from tensordict_rs import TensorDict

    outside = tmp_path / "outside"
    # (a NonTensorData key's directory is made by the commit's first step: from step 1 on the
    # name is the commit's own)
    for step in (0,) if target == "nontensor" else (0, 1):
        prefix = tmp_path / f"t{step}"
        tree(1, keys=("obs",)).memmap(prefix)
        assert killed_save(lambda p=prefix: with_key(2, target).memmap(p), step)
        at = prefix / TARGETS[target]
        before = plant(kind, at, outside)

        ours = TensorDict.load_memmap(prefix)  # finishes the commit: must not be wedged
        assert not (prefix / JOURNAL).exists()
        still_there(kind, at, before, outside)
        assert tensordict_rs.verify(prefix) == []
        ref = tensordict.TensorDict.load_memmap(prefix)
        seen = versions(ours)
        assert versions(ref) == seen
        key = TARGETS[target].removesuffix(".memmap")
        rest = {k: v for k, v in seen.items() if not k.startswith(key)}
        assert rest == {"obs": 2.0, "sub/x": 2.0, "sub/deep/y": 2.0}, seen
        assert ours["note"] == "2"
        want = expected(target, kind)
        if want == "absent":
            assert key not in ours.keys(), f"{key} loads from a {kind} it does not own"
        elif target == "nontensor" and want == "ours":
            assert ours["label"] == "2"
        else:
            value = 2.0 if want == "ours" else 5.0
            assert {k: v for k, v in seen.items() if k.startswith(key)} == {
                f"{key}/x": value,
                f"{key}/deep/y": value,
            }, seen

        # saveable: a save with the key either goes through or names the obstacle ...
        if want == "absent":
            with pytest.raises(FileExistsError, match=key):
                with_key(3, target).memmap(prefix)
            still_there(kind, at, before, outside)
        else:
            with_key(3, target).memmap(prefix)
        # ... and one without it goes through, leaving the user's things where they are
        tree(4, keys=("obs",)).memmap(prefix)
        back = TensorDict.load_memmap(prefix)
        assert set(versions(back).values()) == {4.0} and key not in back.keys()
        if kind in ("file", "symlink", "fifo"):
            still_there(kind, at, before, outside)
        if kind == "dir-with-file":
            assert (at / "mine.txt").read_text() == "mine"
        assert leftovers(prefix) == []
