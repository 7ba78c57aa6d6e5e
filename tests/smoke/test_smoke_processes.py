"""Sharing with a spawned and a forkserver process, and a DataLoader with 2 workers.

The children are functions of this module: spawn and forkserver children import it by name
(pytest puts this directory on ``sys.path``).
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import torch
from tensordict_rs import TensorDict
from torch.utils.data import DataLoader

WAIT = 180  # seconds any wait on a child may take (a spawn child imports torch)


def child(inbox: Any, outbox: Any) -> None:
    """Receives a tree, reports what it sees, writes into it, reads the parent's write."""
    td = inbox.get(timeout=WAIT)
    outbox.put((tuple(td.batch_size), td.is_memmap(), float(td["n", "x"].sum())))
    td["n", "x"][3] = -1.0  # the parent must see this
    assert inbox.get(timeout=WAIT) == "written"
    outbox.put(float(td["a"][0]))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_tree_shared_with_a_child(method: str) -> None:
    ctx = mp.get_context(method)
    td = TensorDict({"a": torch.zeros(8), "n": {"x": torch.arange(8.0)}}, [8]).memmap_()
    inbox, outbox = ctx.Queue(), ctx.Queue()
    process = ctx.Process(target=child, args=(inbox, outbox), daemon=True)
    process.start()
    try:
        inbox.put(td)
        assert outbox.get(timeout=WAIT) == ((8,), True, 28.0)
        td["a"][0] = 42.0  # the child must see this
        inbox.put("written")
        assert outbox.get(timeout=WAIT) == 42.0
        assert float(td["n", "x"][3]) == -1.0
        process.join(WAIT)
        assert process.exitcode == 0
    finally:
        if process.is_alive():
            process.kill()


def identity(batch: Any) -> Any:
    return batch


@pytest.mark.parametrize("context", [None, "forkserver"])
def test_dataloader_with_two_workers(context: str | None) -> None:
    """The process's default start method (fork before 3.14 on Linux), as most programs run,
    and forkserver (3.14's default there)."""
    rows = 64
    data = TensorDict(
        {"obs": torch.arange(rows * 4.0).reshape(rows, 4), "n": {"i": torch.arange(rows)}},
        [rows],
    ).memmap_()
    loader = DataLoader(
        data,
        batch_size=8,
        shuffle=True,
        num_workers=2,
        collate_fn=identity,
        multiprocessing_context=context,
        timeout=WAIT,
    )
    batches = list(loader)
    assert len(batches) == rows // 8
    for batch in batches:
        assert isinstance(batch, TensorDict) and batch.batch_size == (8,)
        assert torch.equal(batch["obs"], data["obs"][batch["n", "i"]])
    seen = torch.cat([b["n", "i"] for b in batches]).sort().values
    assert torch.equal(seen, torch.arange(rows))
