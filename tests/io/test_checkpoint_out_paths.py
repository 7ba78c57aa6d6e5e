"""Incremental checkpoints of writes through ``out=`` (issue 24): ``td.checkpoint(dest)``.

``td.where(cond, other, out=live)``, ``torch.where(cond, a, b, out=live)``,
``src.index_select(dim, idx, out=live[2:4])`` and ``td.logsumexp(dim, out=live)`` wrote into the
files of a memory-mapped tree without stamping the rows in its dirty map, so the next
checkpoint did not copy them: stale checkpoint data, silently (found by an attack). After each
write, the checkpoint must load equal to the live tree, here and in tensordict.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tensordict_rs import TensorDict

from ._checkpoints import assert_checkpoint_is

N = 8


def tree(batch: list[int], fill: float, extra: tuple[int, ...] = (16,)) -> TensorDict:
    """A tree of ``fill`` with a nested entry, batch size ``batch``."""
    shape = (*batch, *extra)
    return TensorDict(
        {"x": torch.full(shape, fill), "nested": {"y": torch.full(shape, fill)}}, batch
    )


def td_where(live: TensorDict) -> None:
    live.where(torch.zeros(N, dtype=torch.bool), tree([N], 1.0), out=live)


def torch_where(live: TensorDict) -> None:
    torch.where(torch.zeros(N, dtype=torch.bool), live, tree([N], 1.0), out=live)


def index_select_rows(live: TensorDict) -> None:
    # dim 0 of a CPU tree: the native gather writes into rows 2 and 3 of the tree
    tree([N], 1.0).index_select(0, torch.tensor([0, 1]), out=live[2:4])


def index_select_dim1(live: TensorDict) -> None:
    # another batch dim: torch.index_select(out=) on every leaf
    tree([N, 4], 1.0, ()).index_select(1, torch.tensor([0, 1]), out=live[:, 1:3])


def logsumexp(live: TensorDict) -> None:
    tree([N, 3], 1.0).logsumexp(dim=1, out=live)


@pytest.mark.parametrize(
    ("write", "batch", "extra"),
    [
        (td_where, [N], (16,)),
        (torch_where, [N], (16,)),
        (index_select_rows, [N], (16,)),
        (index_select_dim1, [N, 4], ()),
        (logsumexp, [N], (16,)),
    ],
    ids=["td.where", "torch.where", "index_select-rows", "index_select-dim1", "logsumexp"],
)
def test_a_write_through_out_is_checkpointed(
    tmp_path: Path,
    write: Callable[[TensorDict], None],
    batch: list[int],
    extra: tuple[int, ...],
) -> None:
    live = tree(batch, 0.0, extra).memmap(tmp_path / "live")
    dest = tmp_path / "ckpt"
    live.checkpoint(dest)
    write(live)
    assert bool((live["x"] != 0).any()) and bool((live["nested", "y"] != 0).any())
    live.checkpoint(dest)
    assert_checkpoint_is(live, dest)
    live.checkpoint(dest)  # the other generation catches up too
    assert_checkpoint_is(live, dest)
