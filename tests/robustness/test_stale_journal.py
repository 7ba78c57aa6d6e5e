"""A journal never rolls back a tree written after it (issue 28, defect 2).

A save killed past its commit point leaves a journal. If another program then saves a newer
tree to the same prefix (tensordict 0.15.3 knows no journal; users move directories between
the two libraries on purpose), or a save (ours or the reference's) writes a sub-tree of it as
its own prefix, the next load here must keep what was written since: before the fix it
replayed the old journal over it, and the newer values rolled back and the keys it added
dropped out of meta.json.

Every case kills our save of version 2 after each number of commit steps in turn (so every
state of the commit is met: nothing moved yet, some files moved, every file moved and only
removals left), then writes version 3, then checks both loaders read version 3 where it was
written, and that the tree saves and loads normally afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ._attack_helpers import JOURNAL, assert_whole, killed_save, leftovers, tree, versions

STEPS = range(12)  # more than the commit of version 2 has: the last rounds finish unkilled


def reference_tree(version: int, keys: tuple[str, ...], extra: bool) -> Any:
    """The reference's version of ``tree`` (same paths, same fill), with ``sub/z`` and
    ``extra`` too when ``extra``."""
    import tensordict

    v = float(version)
    source: dict[str, Any] = {k: torch.full((4, 3), v) for k in keys}
    source["sub"] = {"x": torch.full((4, 2), v), "deep": {"y": torch.full((4, 5), v)}}
    if extra:
        source["extra"] = torch.full((4, 7), v)
        source["sub"]["z"] = torch.full((4, 1), v)
    td = tensordict.TensorDict(source, [4])
    td["note"] = str(version)
    return td


SHAPES = {
    # the reference's tree has the keys of version 1: its root meta.json is byte-identical
    # to the one the interrupted commit replaces
    "as-old": (("obs", "gone"), False),
    # ... of version 2: its root meta.json is byte-identical to the one the commit writes
    "as-new": (("obs",), False),
    # more keys than either
    "more": (("obs", "gone"), True),
}


def expected_keys(shape: str) -> set[str]:
    keys, extra = SHAPES[shape]
    out = set(keys) | {"sub/x", "sub/deep/y"}
    return out | {"extra", "sub/z"} if extra else out


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_reference_save_after_an_interrupted_commit_is_kept(tmp_path: Path, shape: str) -> None:
    killed = 0
    for step in STEPS:
        prefix = tmp_path / f"t{step}"
        tree(1).memmap(prefix)
        killed += killed_save(lambda p=prefix: tree(2, keys=("obs",)).memmap(p), step)
        keys, extra = SHAPES[shape]
        reference_tree(3, keys, extra).memmap(prefix, existsok=True)
        assert_whole(prefix, 3, expected_keys(shape))
        assert not (prefix / JOURNAL).exists()
        # and the tree goes on: our next save and load (of the reference's keys: a file the
        # reference left unlisted, as ``gone.memmap`` after "as-new", is not ours to replace)
        ours = tree(4, keys=keys)
        if extra:
            ours["extra"] = torch.full((4, 7), 4.0)
            ours["sub", "z"] = torch.full((4, 1), 4.0)
        ours.memmap(prefix)
        assert_whole(prefix, 4, expected_keys(shape))
        assert leftovers(prefix) == []
    assert killed >= 6, "most rounds should have been killed inside the commit"


@pytest.mark.parametrize("writer", ["reference", "ours"])
def test_nested_save_after_an_interrupted_commit_is_kept(tmp_path: Path, writer: str) -> None:
    """After the kill, ``prefix/sub`` is saved as its own prefix (version 3): loading the
    whole tree then gives the root of version 2 (the interrupted commit, finished) and the
    sub-tree of version 3, never version 2's sub-tree over version 3's."""
    import tensordict
    from tensordict_rs import TensorDict

    killed = 0
    for step in STEPS:
        prefix = tmp_path / f"t{step}"
        tree(1).memmap(prefix)
        killed += killed_save(lambda p=prefix: tree(2, keys=("obs",)).memmap(p), step)
        source = {"x": torch.full((4, 2), 3.0), "deep": {"y": torch.full((4, 5), 3.0)}}
        if writer == "reference":
            tensordict.TensorDict(source, [4]).memmap(prefix / "sub", existsok=True)
        else:
            TensorDict(source, [4]).memmap(prefix / "sub")
        for td in (TensorDict.load_memmap(prefix), tensordict.TensorDict.load_memmap(prefix)):
            seen = versions(td)
            assert {k: v for k, v in seen.items() if k.startswith("sub/")} == {
                "sub/x": 3.0,
                "sub/deep/y": 3.0,
            }, f"step {step}: {seen}"
            assert seen["obs"] == 2.0 and td["note"] == "2", f"step {step}: {seen}"
        tree(4).memmap(prefix)
        assert_whole(prefix, 4, {"obs", "gone", "sub/x", "sub/deep/y"})
        assert leftovers(prefix) == []
    assert killed >= 6
