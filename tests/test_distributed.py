"""torch.distributed with gloo on 127.0.0.1: 2 and 4 spawned ranks, bounded timeouts.

The cases live in ``_dist_jobs.py`` (grouped per spawned job: each process takes seconds to
import torch). The mixed job runs tensordict 0.15.3 on rank 0 and tensordict_rs on rank 1,
sending both ways through the reference's per-leaf protocol.
"""

from __future__ import annotations

import multiprocessing
import queue
import socket
from pathlib import Path

import _dist_jobs
import pytest
import torch
from torch import distributed as dist

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch has no gloo backend"
)

JOB_TIMEOUT = 150  # seconds for a whole job; a hung rank is killed and the test fails


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(job: str, packages: list[str], tmp: Path) -> None:
    """Runs ``job`` with one spawned process per entry of ``packages``; fails on any error."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    world = len(packages)
    procs = [
        ctx.Process(
            target=_dist_jobs.entry,
            args=(job, rank, world, port, packages, str(tmp), results),
            daemon=True,
        )
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    errors = {}
    try:
        for _ in range(world):
            rank, error = results.get(timeout=JOB_TIMEOUT)
            if error is not None:
                errors[rank] = error
                break  # the other ranks may now wait forever on this one
    except queue.Empty:
        errors[-1] = f"job {job!r} timed out after {JOB_TIMEOUT} s"
    finally:
        for p in procs:
            p.join(5 if not errors else 0.5)
            if p.is_alive():
                p.kill()
                p.join(5)
    assert not errors, "\n".join(f"rank {r}:\n{e}" for r, e in errors.items())


def test_point_to_point_two_ranks(tmp_path: Path) -> None:
    run_job("p2p", ["tensordict_rs"] * 2, tmp_path)


def test_collectives_and_sharded_dataset_four_ranks(tmp_path: Path) -> None:
    run_job("collectives", ["tensordict_rs"] * 4, tmp_path)


def test_mixed_with_the_reference_both_ways(tmp_path: Path) -> None:
    run_job("mixed", ["tensordict", "tensordict_rs"], tmp_path)


def test_description_round_trip_without_a_group() -> None:
    # The JSON description alone: built back into the same structure, refused when damaged.
    from tensordict_rs import InvalidTreeError, TensorDictError, _packed

    src = _dist_jobs.tree(__import__("tensordict_rs"), 2)
    text = _packed.describe(src)
    plan = _packed.plan(src)
    built, whole = _packed.build(type(src), text, plan.total)
    whole.copy_(plan.pack())
    _dist_jobs.same(built, src)
    assert isinstance(InvalidTreeError("x"), TensorDictError)
    with pytest.raises(InvalidTreeError, match="holds"):
        _packed.build(type(src), text, plan.total + 1)
    with pytest.raises(InvalidTreeError, match="not valid JSON"):
        _packed.build(type(src), text[:-3], plan.total)
    with pytest.raises(InvalidTreeError, match="unknown dtype"):
        _packed.build(type(src), text.replace(b"torch.float32", b"torch.float99"), plan.total)


def test_plans_follow_changes_of_the_tree() -> None:
    from tensordict_rs import TensorDict, _packed

    td = TensorDict({"a": torch.ones(4), "b": torch.zeros(4, 2)}, [4])
    first = _packed.plan(td)
    assert _packed.plan(td) is first  # unchanged tree: cached
    td["b"] = torch.full((4, 2), 2.0)
    second = _packed.plan(td)
    assert second is not first
    assert second.pack()[16:].view(torch.float32).tolist() == [2.0] * 8
