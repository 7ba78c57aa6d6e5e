"""A killed save's hidden sibling never outlives the next save (issue 28, defect 6).

A save to a prefix that does not exist builds the tree in a hidden sibling, ``.tdrs%new-*``
(a full copy of the data), and renames it into place. Killed before that rename, it leaves the
sibling behind. The next save to the same prefix removed it only when the prefix was still
absent: if the prefix existed by then (a user's ``mkdir``, or a save to ``prefix/sub``, which
creates ``prefix``), no later save or load removed it.

Now a save to a prefix removes its dead sibling whether the prefix exists or not, and a save of
a tree removes the dead siblings inside it (left by killed saves to its sub-directories); a
sibling whose save is alive (its lock held) is never touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

SIBLING = ".tdrs%new-"


def big(version: float) -> Any:
    from tensordict_rs import TensorDict

    td = TensorDict({f"k{i}": torch.full((256,), version) for i in range(1500)}, [])
    td["big"] = torch.full((16 << 20,), version)
    return td


def small(version: float) -> Any:
    from tensordict_rs import TensorDict

    return TensorDict({"a": torch.full((3,), version), "n": {"b": torch.ones(2)}}, [])


def siblings(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith(SIBLING))


def killed_fresh_save(prefix: Path) -> str:
    """Kills saves of a big tree to the absent ``prefix`` until one dies mid-build; returns
    the sibling it left."""
    source = big(1.0)
    delay = 0.02
    for _ in range(40):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                source.memmap(prefix, num_threads=1)
            finally:
                os._exit(0)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        left = siblings(prefix.parent)
        if left and not prefix.exists():
            return left[0]
        if prefix.exists():  # too late: the save finished
            import shutil

            shutil.rmtree(prefix)
            delay /= 2
        else:  # too early: nothing built yet
            delay *= 1.5
    pytest.fail("no kill landed inside the build")


def test_users_mkdir_then_save(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    killed_fresh_save(prefix)
    prefix.mkdir()
    small(2.0).memmap(prefix)
    assert siblings(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["tree"]


def test_nested_save_makes_the_prefix_then_save(tmp_path: Path) -> None:
    from tensordict_rs import TensorDict

    prefix = tmp_path / "tree"
    killed_fresh_save(prefix)
    small(2.0).memmap(prefix / "sub")  # creates ``tree`` on the way
    assert prefix.is_dir()
    td = small(3.0)
    td["sub"] = small(2.0)
    td.memmap(prefix)
    assert siblings(tmp_path) == []
    assert float(TensorDict.load_memmap(prefix)["sub", "a"][0]) == 2.0


@pytest.mark.parametrize("then", ["mkdir-and-save-sub", "save-parent"])
def test_killed_nested_fresh_save(tmp_path: Path, then: str) -> None:
    """The sibling of ``prefix/sub`` is inside ``prefix``: the next save to ``prefix/sub`` (which
    a user's mkdir made exist) or of ``prefix`` itself removes it."""
    prefix = tmp_path / "tree"
    small(1.0).memmap(prefix)
    killed_fresh_save(prefix / "sub")
    assert siblings(prefix)
    if then == "mkdir-and-save-sub":
        (prefix / "sub").mkdir()
        small(2.0).memmap(prefix / "sub")
    else:
        small(2.0).memmap(prefix)
    assert siblings(prefix) == []


def test_live_sibling_is_left_alone(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    name = killed_fresh_save(prefix)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.readline()",
            os.fspath(tmp_path / name),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    prefix.mkdir()
    small(2.0).memmap(prefix)
    assert siblings(tmp_path) == [name]  # a live save's: kept
    holder.communicate("done\n", timeout=30)
    small(3.0).memmap(prefix)
    assert siblings(tmp_path) == []
