"""Incremental checkpoints of writes made in a spawn or forkserver child through a view of a
memory-mapped tree sent to it (issue 24): ``td.checkpoint(dest)``.

A row slice (``buf[4:12]``), a row (``buf[5]``), ``select``/``exclude``, a sub-tree
(``td["sub"]``) and a sub-directory loaded on its own with ``load_memmap`` wrote the files from
the child without stamping the tree's dirty map: the child stamped no map, or the wrong rows, or
a map of the sub-directory that no checkpoint reads, so the next two checkpoints copied nothing
and kept stale rows, silently (found by an attack). The whole tree sent the same way, and fork,
worked. After each child's write, both generations of the checkpoint must load equal to the
live tree, here and in tensordict.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict_rs import TensorDict

from ._checkpoints import assert_checkpoint_is

N = 16
WIDTH = 1024  # 4 KiB rows: one row per block of the dirty map
WAIT = 120  # seconds a child may take (a spawn child imports torch)
METHODS = ["spawn", "forkserver"]


def make_live(prefix: Path) -> TensorDict:
    """A saved tree with a leaf and a sub-tree, both checkpoint generations in sync."""
    return TensorDict({"a": torch.zeros(N, WIDTH), "s": {"b": torch.zeros(N, WIDTH)}}, [N]).memmap(
        prefix
    )


def _row(key: str, value: float) -> TensorDict:
    return TensorDict({key: torch.full((WIDTH,), value)}, [])


# the children: each writes one row of the tree through what it was sent


def write_slice(view: TensorDict) -> None:
    view[1] = TensorDict({"a": torch.full((WIDTH,), 7.0), "s": _row("b", 7.0)}, [])


def write_row(view: TensorDict) -> None:
    view.update_(TensorDict({"a": torch.full((WIDTH,), 7.0), "s": _row("b", 7.0)}, []))


def write_a(view: TensorDict) -> None:
    view[6] = _row("a", 8.0)


def write_s(view: TensorDict) -> None:
    view[5] = TensorDict({"s": _row("b", 6.0)}, [])


def write_sub(view: TensorDict) -> None:
    view[5] = _row("b", 7.0)


def write_sub_of_slice(view: TensorDict) -> None:
    view[1] = _row("b", 5.0)


def write_loaded_sub(path: str) -> None:
    view = TensorDict.load_memmap(path)
    view[7] = _row("b", 9.0)


# (what the child is sent, the child, the row and key it writes)
CASES: dict[str, tuple[Callable[[TensorDict, Path], Any], Callable[[Any], None], Any]] = {
    "slice": (lambda live, _: live[4:12], write_slice, (5, "a")),
    "slice_of_slice": (lambda live, _: live[2:14][2:10], write_slice, (5, "a")),
    "row": (lambda live, _: live[5], write_row, (5, "a")),
    "select": (lambda live, _: live.select("a"), write_a, (6, "a")),
    "exclude": (lambda live, _: live.exclude("a"), write_s, (5, ("s", "b"))),
    "sub": (lambda live, _: live["s"], write_sub, (5, ("s", "b"))),
    "sub_of_slice": (lambda live, _: live[4:12]["s"], write_sub_of_slice, (5, ("s", "b"))),
    "loaded_sub": (lambda _, prefix: os.fspath(prefix / "s"), write_loaded_sub, (7, ("s", "b"))),
}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", list(CASES))
def test_child_writes_through_a_sent_view_are_checkpointed(
    tmp_path: Path, method: str, case: str
) -> None:
    prefix = tmp_path / "live"
    live = make_live(prefix)
    dest = tmp_path / "ckpt"
    live.checkpoint(dest)
    live.checkpoint(dest)  # both generations hold the zeros
    sent, child, (row, key) = CASES[case]
    p = mp.get_context(method).Process(target=child, args=(sent(live, prefix),))
    p.start()
    p.join(WAIT)
    assert p.exitcode == 0
    assert live[key][row, 0] != 0  # the child wrote the files
    for _ in range(2):  # each generation in turn
        stats = live.checkpoint(dest)
        assert stats["bytes_written"] > 0
        assert_checkpoint_is(live, dest)


def test_loaded_sub_directory_writes_are_checkpointed_here(tmp_path: Path) -> None:
    """A sub-directory loaded on its own in the same process stamps the map of the tree
    holding it, whose checkpoint copies the rows (its own directory's map was never read)."""
    prefix = tmp_path / "live"
    live = make_live(prefix)
    dest = tmp_path / "ckpt"
    live.checkpoint(dest)
    live.checkpoint(dest)
    sub = TensorDict.load_memmap(prefix / "s")
    sub[3] = _row("b", 4.0)
    for _ in range(2):
        live.checkpoint(dest)
        assert_checkpoint_is(live, dest)


@pytest.mark.parametrize("protocol", [4, 5])
def test_views_through_plain_pickles_are_checkpointed(tmp_path: Path, protocol: int) -> None:
    """A row slice and a sub-tree through ``pickle`` (file-backed leaves go by path, as to Ray)
    stamp the rows of the tree they view."""
    prefix = tmp_path / "live"
    live = make_live(prefix)
    dest = tmp_path / "ckpt"
    live.checkpoint(dest)
    live.checkpoint(dest)
    view = pickle.loads(pickle.dumps(live[4:12], protocol=protocol))
    write_slice(view)
    sub = pickle.loads(pickle.dumps(live["s"], protocol=protocol))
    sub[9] = _row("b", 2.0)
    for _ in range(2):
        live.checkpoint(dest)
        assert_checkpoint_is(live, dest)
