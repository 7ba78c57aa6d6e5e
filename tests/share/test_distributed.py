"""torch.distributed with gloo on 127.0.0.1: 2 and 4 spawned ranks, bounded timeouts.

The cases live in ``_dist_jobs.py`` (grouped per spawned job: each process takes seconds to
import torch). The mixed job runs tensordict 0.15.3 on rank 0 and tensordict_rs on rank 1,
sending both ways through the reference's per-leaf protocol.
"""

from __future__ import annotations

import gc
import multiprocessing
import queue
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import distributed as dist

from . import _dist_jobs

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch has no gloo backend"
)

JOB_TIMEOUT = 150  # seconds for a whole job; a hung rank is killed and the test fails


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(job: str | Callable[..., None], packages: list[str], tmp: Path) -> None:
    """Runs ``job`` (a name in ``_dist_jobs``, or a job function of another tests module) with
    one spawned process per entry of ``packages``; fails on any error."""
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
    from tensordict_rs import InvalidTreeError, TensorDictError
    from tensordict_rs.share import packed as _packed

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
    from tensordict_rs import TensorDict
    from tensordict_rs.share import packed as _packed

    td = TensorDict({"a": torch.ones(4), "b": torch.zeros(4, 2)}, [4])
    first = _packed.plan(td)
    assert _packed.plan(td) is first  # unchanged tree: cached
    td["b"] = torch.full((4, 2), 2.0)
    second = _packed.plan(td)
    assert second is not first
    assert second.pack()[_packed.ALIGN :].view(torch.float32).tolist() == [2.0] * 8


def test_packed_table_releases_gil_and_copies_ranges() -> None:
    from array import array

    from tensordict_rs import _native

    from .._gil_probe import MIN_TURNS, probe_thread

    leaves = [torch.full((8 << 20,), float(i)) for i in range(8)]  # 256 MiB
    table = array("Q")
    for i, t in enumerate(leaves):
        table.extend((t.data_ptr(), i * t.nbytes, t.nbytes))
    total = 8 * leaves[0].nbytes
    packed = _native.PackedTable(table, total)
    buffer = torch.empty(total, dtype=torch.uint8)
    with probe_thread() as probe:
        probe.watch(packed.pack)(buffer.data_ptr(), buffer.numel())
    assert probe.turns >= MIN_TURNS, probe.turns
    for t in leaves:
        t.zero_()
    half = leaves[0].nbytes + 6  # a range that ends inside leaf 1
    packed.unpack(buffer.data_ptr(), buffer.numel(), 0, half)
    assert leaves[0].eq(0).all() and leaves[1][0].item() == 1.0 and leaves[1][1].item() == 0
    packed.unpack(buffer.data_ptr(), buffer.numel(), half)
    assert [t[-1].item() for t in leaves] == [float(i) for i in range(8)]
    assert leaves[1].eq(1).all()
    with pytest.raises(ValueError, match="cannot hold"):
        packed.pack(buffer.data_ptr(), total - 1)
    with pytest.raises(ValueError, match="shares memory"):
        packed.unpack(leaves[0].data_ptr() - leaves[0].nbytes, total)
    with pytest.raises(ValueError, match="overlap"):
        _native.PackedTable(array("Q", [1, 0, 32, 2, 16, 16]), 64)


def test_packed_padding_is_zeroed() -> None:
    """The alignment padding between packed leaves was left as ``torch.empty`` found it, so a
    consolidated send carried bytes of the sender's heap to the peer (found by an attack:
    pointer-like values in a mismatched receiver's rows). Packing zeroes it, whole or in
    ranges."""
    from tensordict_rs import TensorDict
    from tensordict_rs.share import packed as _packed

    for native in (True, False):
        td = TensorDict(
            {"a": torch.ones(3, dtype=torch.int8), "b": torch.full((5,), 2.0), "c": torch.ones(1)},
            [],
        )
        if not native:  # a non-contiguous leaf: packed by torch copies, leaf by leaf
            td["d"] = torch.ones(3, 2).t()
        _check_padding(_packed.plan(td), native)


def _check_padding(plan: Any, native: bool) -> None:
    assert plan.native == native
    sizes = [t.nbytes for t in plan.materialized()]
    gaps = [
        (offset + n, following)
        for offset, n, following in zip(
            plan.offsets, sizes, [*plan.offsets[1:], plan.total], strict=True
        )
        if offset + n < following
    ]
    assert gaps  # the leaves are 64-byte aligned: 3 and 20 bytes leave padding
    for ranges in ([(0, plan.total)], [(0, 30), (30, plan.total)]):
        buffer = torch.full((plan.total,), 0xAB, dtype=torch.uint8)
        for start, end in ranges:
            plan.pack_range(buffer, start, end)
        for lo, hi in gaps:
            assert buffer[lo:hi].eq(0).all(), (lo, hi, ranges)
        assert buffer[plan.offsets[0] : plan.offsets[0] + 3].eq(1).all()


def test_descriptions_of_odd_trees() -> None:
    from tensordict_rs import InvalidTreeError, TensorDict
    from tensordict_rs.share import packed as _packed

    # keys named like meta.json fields, non-ASCII and quoted keys, empty nodes and leaves
    src = TensorDict(
        {
            "dtype": {"is_nested": torch.ones(2, 3), "data": torch.arange(2)},
            'é"q': torch.zeros(2, 0),
            "empty": {},
            "z": torch.tensor([True, False]),
        },
        [2],
    )
    text = _packed.describe(src)
    plan = _packed.plan(src)
    built, whole = _packed.build(type(src), text, plan.total)
    whole.copy_(plan.pack())
    _dist_jobs.same(built, src)
    assert built["empty"].batch_size == torch.Size([2])
    with pytest.raises(InvalidTreeError, match="reserved"):
        _packed.describe(TensorDict({"n": {"shape": torch.ones(1)}}, []))
    bad_batch = text.replace(b'"shape": [2], "device"', b'"shape": [3], "device"', 1)
    with pytest.raises(InvalidTreeError, match="does not start"):
        _packed.build(type(src), bad_batch, plan.total)
    deep = b'{"a": ' * 300 + b"{}" + b"}" * 300
    with pytest.raises(InvalidTreeError, match=r"recursion limit|deeper"):
        _packed.build(type(src), deep, 0)
    with pytest.raises(InvalidTreeError, match="not a TensorDict"):
        _packed.build(type(src), b"[1, 2]", 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_trees_over_gloo(tmp_path: Path) -> None:
    run_job("cuda_gloo", ["tensordict_rs"] * 2, tmp_path)


@pytest.mark.skipif(
    torch.cuda.device_count() < 2 or not dist.is_nccl_available(), reason="needs 2 GPUs and NCCL"
)
def test_nccl_two_gpus(tmp_path: Path) -> None:
    run_job("nccl", ["tensordict_rs"] * 2, tmp_path)


def test_description_built_on_another_device() -> None:
    # The device branch of build (views of one device buffer, no map), on the meta device.
    from tensordict_rs.share import packed as _packed

    src = _dist_jobs.tree(__import__("tensordict_rs"), 2)
    plan = _packed.plan(src)
    seen = []
    built, whole = _packed.build(
        type(src), _packed.describe(src), plan.total, torch.device("meta"), on_buffer=seen.append
    )
    assert seen == [whole] and whole.device.type == "meta" and whole.numel() == plan.total
    for key in src.keys(include_nested=True, leaves_only=True):
        a, b = src[key], built[key]
        if isinstance(a, torch.Tensor):
            assert b.device.type == "meta" and (b.dtype, b.shape) == (a.dtype, a.shape), key
        else:
            assert a == b, key
    assert built.device.type == "meta"


def test_tree_built_into_an_arena_made_first() -> None:
    # from_remote_init's order: the arena exists (and the data arrives into it) before the
    # description is parsed; the leaves are slices of it, no new map.
    from tensordict_rs import InvalidTreeError, _native
    from tensordict_rs.memmap import _LazyLeaf
    from tensordict_rs.share import packed as _packed

    from .._gil_probe import MIN_TURNS, probe_thread

    src = _dist_jobs.tree(__import__("tensordict_rs"), 2)
    plan = _packed.plan(src)
    arena = _packed.arena(plan.total)
    assert arena[1].numel() == plan.total and arena[1].eq(0).all()
    arena[1].copy_(plan.pack())  # "the data arrived"
    built, whole = _packed.build(type(src), _packed.describe(src), plan.total, into=arena)
    assert whole.data_ptr() == arena[1].data_ptr()
    # the lazy leaves are out of the cyclic GC's lists (no full collection every few trees)
    lazy = [v for v in built._tensordict.values() if type(v) is _LazyLeaf]
    assert lazy and not any(gc.is_tracked(v) for v in lazy)
    _dist_jobs.same(built, src)
    assert built["nested", "z"].untyped_storage().data_ptr() >= arena[0].address
    assert _packed.plan(built).whole is not None  # later packed messages land in place
    small = _packed.arena(plan.total - 1)
    with pytest.raises(InvalidTreeError, match="more than the"):
        _packed.build(type(src), _packed.describe(src), plan.total, into=small)
    assert _packed.arena(0)[1].numel() == 0
    with probe_thread() as probe:
        probe.watch(_native.packed_arena)(256 << 20)  # memfd, reserve, fault in: GIL released
    assert probe.turns >= MIN_TURNS, probe.turns


@pytest.mark.parametrize("total", [1, 2 << 20, (2 << 20) + 1, 10 << 20, (64 << 20) + 5, 1 << 30])
def test_packing_runs_cover_every_piece_in_a_few_growing_runs(total: int) -> None:
    from tensordict_rs.share import wire as _dist_wire

    spans = _dist_wire.pieces(total)
    runs = _dist_wire.packing_runs(spans)
    assert runs[0] == (0, 1)  # the first piece goes as soon as it is packed
    assert [i for a, b in runs for i in range(a, b)] == list(range(len(spans)))
    for first, last in runs[1:]:
        posted = spans[first][0]
        assert spans[last - 1][1] - posted <= max(posted, _dist_wire.PIECE_BYTES)
    assert len(runs) <= 2 + len(spans).bit_length()  # doubling: a few calls, not one a piece


def test_scatter_on_one_process_as_the_reference(tmp_path: Path) -> None:
    # Side by side with tensordict 0.15.3 on a one-process group: the source gets a new tree
    # with its own tree's values (never the object it passed), on the CPU when asked.
    import tensordict
    import tensordict_rs

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        for device in (None, "cpu"):
            # (the reference's consolidate cannot view a complex128 leaf at an offset that
            # is not a multiple of 16: that leaf is left out of the comparison)
            ours_src = _dist_jobs.tree(tensordict_rs, 3).exclude("d11")
            ref_src = _dist_jobs.tree(tensordict, 3).exclude("d11")
            ours = tensordict_rs.TensorDict().scatter(0, [ours_src], device=device)
            ref = tensordict.TensorDict().scatter(0, [ref_src], device=device)
            assert ours is not ours_src and ref is not ref_src
            _dist_jobs.same(ours, ref)
            _dist_jobs.same(ours, ours_src)
            ours["d08"].add_(1)  # its own memory: the source's tree is untouched
            _dist_jobs.same(ours_src, ref_src)
        # the reference fails in gloo (RuntimeError) once its metadata is posted; ours refuses
        # a wrong count (RuntimeError too) before it sends anything but the refusal
        two = [tensordict_rs.TensorDict(), tensordict_rs.TensorDict()]
        with pytest.raises(RuntimeError, match=r"one tensordict per rank \(1\) on src, got 2"):
            tensordict_rs.TensorDict().scatter(0, two)
        with pytest.raises(RuntimeError, match="input list size"):
            tensordict.TensorDict().scatter(0, [tensordict.TensorDict()] * 2)
        same_after = tensordict_rs.TensorDict().scatter(0, [tensordict_rs.TensorDict({"a": 1}, [])])
        assert same_after["a"].item() == 1  # nothing left over from the refused call
    finally:
        dist.destroy_process_group()
