"""The jobs that share/test_distributed.py runs in spawned processes, one process per rank
(share/test_dist_zero_copy.py and robustness/test_dist_attacks.py use its entry and checks).

Each job joins a gloo group on 127.0.0.1, runs its cases in order and reports to the parent
through a queue; a failed assertion on any rank fails the test with that rank's traceback.
Several cases share one job because a process that imports torch takes seconds to start.
"""

from __future__ import annotations

import datetime
import importlib
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import distributed as dist

TIMEOUT = datetime.timedelta(seconds=60)
P2P_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.complex128,
]  # fmt: skip


def entry(
    job: str | Callable[..., None],
    rank: int,
    world: int,
    port: int,
    packages: list[str],
    tmp: str,
    queue: Any,
) -> None:
    """Runs ``job`` (a name here, or a job function of another module) as ``rank`` of
    ``world`` with the package ``packages[rank]``."""
    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
        module = importlib.import_module(packages[rank])
        dist.init_process_group(
            "nccl" if job == "nccl" else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=TIMEOUT,
        )
        try:
            (job if callable(job) else globals()[job])(module, rank, world, Path(tmp))
            dist.barrier()
        finally:
            dist.destroy_process_group()
        queue.put((rank, None))
    except BaseException:
        queue.put((rank, traceback.format_exc()))


def _values(dtype: torch.dtype, shape: tuple[int, ...], fill: int) -> torch.Tensor:
    raw = torch.arange(int(torch.Size(shape).numel())).view(shape) + fill
    if dtype is torch.bool:
        return (raw % 2).bool()
    if dtype.is_complex:
        return torch.complex(raw.double(), -raw.double()).to(dtype)
    return (raw % 100).to(dtype)


def tree(module: Any, fill: int, *, text: bool = True) -> Any:
    """A nested tree with a leaf of every dtype that gloo sends (and a string)."""
    source: dict[str, Any] = {
        f"d{i:02d}": _values(d, (4, 3), fill + i) for i, d in enumerate(P2P_DTYPES)
    }
    source["nested"] = {
        "z": _values(torch.float32, (4, 2, 5), fill),
        "a": {"deep": _values(torch.int64, (4,), fill + 7)},
    }
    source["empty"] = torch.zeros(4, 0)
    if text:
        source["note"] = "hello"
    return module.TensorDict(source, batch_size=[4])


def same(a: Any, b: Any) -> None:
    keys = sorted(map(str, a.keys(include_nested=True, leaves_only=True)))
    assert keys == sorted(map(str, b.keys(include_nested=True, leaves_only=True))), keys
    for key in a.keys(include_nested=True, leaves_only=True):
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape, key
            assert torch.equal(x.as_subclass(torch.Tensor), y.as_subclass(torch.Tensor)), key
        else:
            assert x == y, key
    assert tuple(a.batch_size) == tuple(b.batch_size)


def p2p(T: Any, rank: int, world: int, tmp: Path) -> None:
    """send/recv, isend/irecv, consolidated, init_remote, into plain and memory-mapped trees."""
    peer = 1 - rank
    if rank == 0:
        src = tree(T, 1)
        assert src.send(dst=peer) is None
        src.send(dst=peer)  # into a memory-mapped receiver
        assert src.isend(dst=peer, init_tag=50, pseudo_rand=True) is not None
        works = src.isend(dst=peer, init_tag=500, return_early=True)
        for w in works:
            w.wait()
        src.send(dst=peer, consolidated=True)
        src.send(dst=peer, consolidated=True)  # into a memory-mapped receiver
        for w in src.isend(dst=peer, consolidated=True, return_early=True):
            w.wait()
        src.init_remote(dst=peer)
        for _step in range(3):
            src["nested", "z"].add_(1)
            src.send(dst=peer, consolidated=True)
        src.memmap_(tmp / "sender")  # leaves in maps, sent consolidated from there
        src.send(dst=peer, consolidated=True)
        group = dist.new_group([0, 1])
        src.send(group=group, group_dst=peer, init_tag=9)
        raw = _raw_pair_group(rank, tmp)
        src.send(group=raw, group_dst=peer, pseudo_rand=True)
        src.send(group=raw, group_dst=peer, consolidated=True)
        _pieces(T, rank, tmp)
        _two_rank_all_reduce(T, rank)
        _refused_first_contact(T, rank)
        return
    ref = tree(T, 1)
    out = tree(T, 0)
    assert out.recv(src=peer) == len(P2P_DTYPES) + 3 - 1  # the last tag: one per tensor
    same(out, ref)
    mapped = tree(T, 0).memmap_(tmp / "mapped")
    mapped.recv(src=peer)
    same(T.TensorDict.load_memmap(tmp / "mapped"), ref)  # written into the files
    out = tree(T, 0)
    out.irecv(src=peer, init_tag=50, pseudo_rand=True)
    same(out, ref)
    out = tree(T, 0)
    for w in out.irecv(src=peer, init_tag=500, return_premature=True):
        w.wait()
    same(out, ref)
    out = tree(T, 0)
    assert out.recv(src=peer, consolidated=True) is None
    same(out, ref)
    mapped = T.TensorDict.load_memmap(tmp / "mapped")
    mapped.apply(lambda t: t.zero_(), inplace=True)
    mapped.recv(src=peer, consolidated=True)
    same(T.TensorDict.load_memmap(tmp / "mapped"), ref)
    out = tree(T, 0)
    for w in out.irecv(src=peer, consolidated=True, return_premature=True):
        w.wait()
    same(out, ref)
    remote = T.TensorDict.from_remote_init(src=peer)
    same(remote, ref)
    for _step in range(3):
        remote.recv(src=peer, consolidated=True)
        ref["nested", "z"].add_(1)
        same(remote, ref)
    remote.recv(src=peer, consolidated=True)
    same(remote, ref)
    group = dist.new_group([0, 1])
    out = tree(T, 0)
    out.recv(group=group, group_src=peer, init_tag=9)
    same(out, ref)
    raw = _raw_pair_group(rank, tmp)  # a group outside the c10d registry
    out = tree(T, 0)
    out.recv(group=raw, group_src=peer, pseudo_rand=True)
    same(out, ref)
    out = tree(T, 0)
    out.recv(group=raw, group_src=peer, consolidated=True)
    same(out, ref)
    _pieces(T, rank, tmp)
    _two_rank_all_reduce(T, rank)
    _refused_first_contact(T, rank)


def _bad_first_contact(T: Any) -> tuple[list[torch.Tensor], Any]:
    """A first contact whose description names an unknown dtype: (header, text, data) as a
    sender would post them, and the tree they came from."""
    from tensordict_rs.share import packed as _packed
    from tensordict_rs.share import wire as _dist_wire

    src = tree(T, 7, text=False)
    plan = _packed.plan(src)
    text = plan.description().replace(b"torch.float32", b"torch.float99")
    cpu = torch.device("cpu")
    head = _dist_wire.header(text, plan.total, cpu)
    return [head, _dist_wire.bytes_tensor(text, cpu), plan.pack().clone()], src


def _refused_first_contact(T: Any, rank: int) -> None:
    """A refused description still takes its data message: the next first contact between
    the same ranks (same tags) gets the right tree."""
    from tensordict_rs import InvalidTreeError

    messages, src = _bad_first_contact(T)
    if rank == 0:
        for t in messages:
            dist.send(t, dst=1)
        src.init_remote(dst=1)
        return
    with pytest.raises(InvalidTreeError, match="float99"):
        T.TensorDict.from_remote_init(src=0)
    same(T.TensorDict.from_remote_init(src=0), src)


def _refused_broadcast(T: Any, rank: int) -> None:
    """The same for ``broadcast``: every other rank refuses, then the next one arrives whole."""
    from tensordict_rs import InvalidTreeError

    messages, src = _bad_first_contact(T)
    if rank == 1:
        for t in messages:
            dist.broadcast(t, src=1)
        assert src.broadcast(src=1) is src
        return
    with pytest.raises(InvalidTreeError, match="float99"):
        T.TensorDict().broadcast(src=1)
    same(T.TensorDict().broadcast(src=1), src)


def _raw_pair_group(rank: int, tmp: Path) -> Any:
    """A gloo group of both ranks made without the c10d registry (no ``new_group``): point to
    point reaches its ranks with ``group_dst``/``group_src`` only."""
    import datetime

    store = dist.PrefixStore("raw_pair", dist.FileStore(str(tmp / "raw_pair_store"), 2))
    return dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=60))


def big_tree(T: Any, fill: int, *, strided: bool = False) -> Any:
    """A tree of several message pieces (``_dist_wire.PIECE_BYTES``), a leaf across a piece
    boundary, and with ``strided`` a non-contiguous leaf (torch's copies, not the Rust core)."""
    from tensordict_rs.share import wire as _dist_wire

    piece = _dist_wire.PIECE_BYTES
    gen = torch.Generator().manual_seed(fill)
    source: dict[str, Any] = {
        "a": torch.randint(0, 1 << 20, (3, piece // 12 + 5), generator=gen),  # past piece 0
        "b": {"c": torch.rand(3, piece // 8, generator=gen, dtype=torch.float64)},
        "d": torch.randint(0, 2, (3, 7), generator=gen).bool(),
    }
    if strided:
        source["t"] = torch.rand(100, 3, generator=gen).t()
    return T.TensorDict(source, batch_size=[3])


def _pieces(T: Any, rank: int, tmp: Path) -> None:
    """Trees of several pieces, consolidated: plain, memory-mapped, strided receivers."""
    peer = 1 - rank
    if rank == 0:
        src = big_tree(T, 1)
        src.send(dst=peer, consolidated=True, init_tag=3)
        src.send(dst=peer, consolidated=True)
        for w in src.isend(dst=peer, consolidated=True, return_early=True):
            w.wait()
        big_tree(T, 2, strided=True).send(dst=peer, consolidated=True)
        big_tree(T, 3).send(dst=peer, consolidated=True)
        big_tree(T, 4).init_remote(dst=peer)
        return
    out = big_tree(T, 0)
    out.recv(src=peer, consolidated=True, init_tag=3)
    same(out, big_tree(T, 1))
    mapped = big_tree(T, 0).memmap_(tmp / "big")
    mapped.recv(src=peer, consolidated=True)
    same(T.TensorDict.load_memmap(tmp / "big"), big_tree(T, 1))
    out = big_tree(T, 0)
    pending = out.irecv(src=peer, consolidated=True, return_premature=True)
    for w in pending:
        w.wait()
    same(out, big_tree(T, 1))
    out = big_tree(T, 0, strided=True)
    out.recv(src=peer, consolidated=True)
    same(out, big_tree(T, 2, strided=True))
    out = big_tree(T, 0)
    out.recv(src=peer, consolidated=True)
    same(out, big_tree(T, 3))
    same(T.TensorDict.from_remote_init(src=peer), big_tree(T, 4))


def _two_rank_all_reduce(T: Any, rank: int) -> None:
    td = T.TensorDict(
        {"f": torch.full((4, 2), rank + 1.0), "n": {"i": torch.full((4,), rank)}}, [4]
    )
    td.all_reduce()
    assert td["f"].eq(3).all() and td["n", "i"].eq(1).all()


def mixed(T: Any, rank: int, world: int, tmp: Path) -> None:
    """The per-leaf protocol between tensordict 0.15.3 (rank 0) and tensordict_rs (rank 1)."""
    peer = 1 - rank
    ref = tree(T, 3, text=False)
    for direction in (0, 1):  # 0: rank 0 sends; 1: rank 1 sends
        if rank == direction:
            tree(T, 3, text=False).send(dst=peer)
            tree(T, 3, text=False).send(dst=peer, init_tag=20, pseudo_rand=True)
            tree(T, 3, text=False).isend(dst=peer, init_tag=1000)
        else:
            out = tree(T, 0, text=False)
            out.recv(src=peer)
            same(out, ref)
            out = tree(T, 0, text=False)
            out.recv(src=peer, init_tag=20, pseudo_rand=True)
            same(out, ref)
            out = tree(T, 0, text=False)
            out.irecv(src=peer, init_tag=1000)
            same(out, ref)
    floats = T.TensorDict(
        {"b": torch.full((4, 2), float(rank + 1)), "a": {"c": torch.full((4,), rank + 1)}},
        batch_size=[4],
    )
    floats.all_reduce()
    assert floats["b"].eq(3).all() and floats["a", "c"].eq(3).all()
    floats.reduce(dst=0)
    if rank == 0:
        assert floats["b"].eq(6).all()


def collectives(T: Any, rank: int, world: int, tmp: Path) -> None:
    """broadcast, all_reduce, reduce, all_gather, gather_and_stack, scatter, init_remote by
    broadcast."""
    got = (tree(T, 5) if rank == 1 else T.TensorDict()).broadcast(src=1)
    same(got, tree(T, 5))
    _refused_broadcast(T, rank)
    if rank == 2:
        tree(T, 6).init_remote(use_broadcast=True)
    else:
        same(T.TensorDict.from_remote_init(src=2, use_broadcast=True), tree(T, 6))

    def numbers(fill: float) -> Any:
        return T.TensorDict(
            {
                "w": torch.full((4, 3), fill),
                "g": {"b": torch.full((4,), fill, dtype=torch.float64)},
            },
            batch_size=[4],
        )

    td = numbers(rank + 1.0)
    td.all_reduce()
    total = world * (world + 1) / 2
    assert td["w"].eq(total).all() and td["g", "b"].eq(total).all()
    td = numbers(rank + 1.0)
    for w in td.all_reduce(async_op=True, bucket_bytes=1 << 20):
        w.wait()
    assert td["w"].eq(total).all() and td["g", "b"].eq(total).all()
    td = numbers(rank + 1.0)
    td.all_reduce(op=dist.ReduceOp.MAX, bucket_bytes=16)
    assert td["w"].eq(world).all()
    td = numbers(rank + 1.0)
    td.reduce(dst=3)
    if rank == 3:
        assert td["w"].eq(total).all()
    td = numbers(1.0)
    td.reduce(dst=0, async_op=True, bucket_bytes=1 << 10)
    if rank == 0:
        assert td["g", "b"].eq(world).all()

    mine = T.TensorDict(
        {"r": torch.full((rank + 1, 2), float(rank)), "s": f"rank{rank}"}, [rank + 1]
    )
    everyone = mine.all_gather()
    assert len(everyone) == world
    for i, other in enumerate(everyone):
        assert other.batch_size == torch.Size([i + 1]) and other["r"].eq(i).all()
        assert other["s"] == f"rank{i}"

    if rank == 0:
        stack = T.TensorDict(
            {"x": torch.zeros(world - 1, 3), "y": {"z": torch.zeros(world - 1)}}, [world - 1]
        )
        assert stack.gather_and_stack(dst=0) is stack
        assert stack["x"][:, 0].tolist() == [float(r) for r in range(1, world)]
        assert stack["y", "z"].tolist() == [10.0 * r for r in range(1, world)]
    else:
        row = T.TensorDict(
            {"x": torch.full((3,), float(rank)), "y": {"z": torch.tensor(10.0 * rank)}}, []
        )
        assert row.gather_and_stack(dst=0) is None
    _gather_and_stack_refusals(T, rank, world)
    _scatter(T, rank, world)
    _ring(T, rank, world)
    sharded_dataset(T, rank, world, tmp)


def _gather_and_stack_refusals(T: Any, rank: int, world: int) -> None:
    """A destination with a row more than the other ranks, or rows of another shape, is
    refused by name before any row is written (the first rows were written, the others left,
    and a shape mismatch raised torch's error naming no key; found by an attack)."""
    import pytest

    row = T.TensorDict({"x": torch.full((3,), float(rank))}, [])
    for rows, match in (
        (T.TensorDict({"x": torch.zeros(world, 3)}, [world]), "first batch dimension"),
        (T.TensorDict({"x": torch.zeros(world - 1, 4)}, [world - 1]), "the key 'x' of shape"),
    ):
        if rank == 0:
            with pytest.raises(RuntimeError, match=match):
                rows.gather_and_stack(dst=0)
            assert rows["x"].eq(0).all()  # nothing written
        else:
            assert row.gather_and_stack(dst=0) is None


def _meant(T: Any, r: int) -> Any:
    """What ``scatter`` sends rank ``r``: trees of different structures (empty, one leaf,
    every dtype nested, nested one level deeper)."""
    if r == 0:
        return T.TensorDict()
    if r == 2:
        return T.TensorDict({"x": torch.tensor([2.0]), "s": "two"}, [])
    if r == 3:
        return T.TensorDict({"deeper": tree(T, 30), "y": torch.arange(3)}, [])
    return tree(T, 10 * r)


def _scatter(T: Any, rank: int, world: int) -> None:
    """scatter from rank 1: each rank gets its own tree (also on ``device="cpu"``); a wrong
    count or a reserved key on the source, and a damaged description at one receiver, fail
    where they should and leave nothing over for the next scatter."""
    from tensordict_rs import InvalidTreeError, TensorDictError
    from tensordict_rs.share.collectives import _scatter_source

    trees = [_meant(T, r) for r in range(world)] if rank == 1 else None
    got = T.TensorDict({"unused": torch.ones(2)}, []).scatter(1, trees)
    same(got, _meant(T, rank))
    if trees is not None:
        assert got is not trees[1]
    got = T.TensorDict().scatter(1, trees, device="cpu")
    same(got, _meant(T, rank))
    assert all(t.device.type == "cpu" for t in got.values(True, True) if torch.is_tensor(t))
    # the source refuses a wrong count, a tree it cannot describe or a value that is not a
    # tree; every other rank raises
    reserved = T.TensorDict({"shape": torch.ones(3)}, [])
    short = trees and trees[:-1]
    unwritable = trees and [*trees[:3], reserved]
    cases = [
        (short, RuntimeError, "one tensordict per rank"),
        (unwritable, InvalidTreeError, "reserved"),
        (trees and [*trees[:3], {"x": torch.ones(1)}], TypeError, r"tensordicts\[3\] is a dict"),
    ]
    for bad, kind, match in cases:
        if rank == 1:
            with pytest.raises(kind, match=match):
                T.TensorDict().scatter(1, bad)
        else:
            with pytest.raises(TensorDictError, match="could not send"):
                T.TensorDict().scatter(1)
    # a description that rank 2 refuses: it still takes its data, the others get theirs
    if rank == 1:
        assert trees is not None
        table, texts, payloads, error = _scatter_source(trees, world, torch.device("cpu"))
        assert error is None
        texts[2][:] = torch.frombuffer(bytearray(b"{" * texts[2].numel()), dtype=torch.uint8)
        dist.broadcast(table, src=1)
        mine = torch.empty_like(texts[1])
        dist.scatter(mine, texts, src=1)
        data = torch.empty_like(payloads[1])
        dist.scatter(data, payloads, src=1)
    elif rank == 2:
        with pytest.raises(InvalidTreeError):
            T.TensorDict().scatter(1)
    else:
        same(T.TensorDict().scatter(1), _meant(T, rank))
    same(T.TensorDict().scatter(1, trees), _meant(T, rank))


def _ring(T: Any, rank: int, world: int) -> None:
    """Every rank sends to the next and receives from the previous at once: per leaf with
    isend/irecv, then one packed message, then a first contact."""
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    out = tree(T, 0, text=False)
    pending = out.irecv(src=prev, init_tag=100, return_premature=True)
    works = tree(T, 10 + rank, text=False).isend(dst=nxt, init_tag=100, return_early=True)
    for w in [*pending, *works]:
        w.wait()
    same(out, tree(T, 10 + prev, text=False))
    out = tree(T, 0, text=False)
    pending = out.irecv(src=prev, consolidated=True, return_premature=True)
    src = tree(T, 20 + rank, text=False)
    works = src.isend(dst=nxt, consolidated=True, return_early=True)
    for w in [*pending, *works]:
        w.wait()
    same(out, tree(T, 20 + prev, text=False))
    if rank % 2 == 0:
        tree(T, 30 + rank).init_remote(dst=nxt)
        same(T.TensorDict.from_remote_init(src=prev), tree(T, 30 + prev))
    else:
        same(T.TensorDict.from_remote_init(src=prev), tree(T, 30 + prev))
        tree(T, 30 + rank).init_remote(dst=nxt)


def sharded_dataset(T: Any, rank: int, world: int, tmp: Path) -> None:
    """The README recipe: every rank maps one directory and reads its shard; rank 0 saves a
    new version, the others reload it after a barrier."""
    from torch.utils.data.distributed import DistributedSampler

    prefix = tmp / "dataset"
    rows = 103
    if rank == 0:
        T.TensorDict(
            {"obs": torch.arange(rows * 4.0).view(rows, 4), "label": torch.arange(rows)}, [rows]
        ).memmap_(prefix)
    dist.barrier()
    data = T.TensorDict.load_memmap(prefix)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(1)
    indices = list(sampler)
    shard = data.__getitems__(indices)  # what a DataLoader with this sampler calls
    assert shard["label"].tolist() == indices
    assert torch.equal(shard["obs"], data["obs"][torch.tensor(indices)])
    seen = torch.zeros(rows, dtype=torch.int64)
    seen[shard["label"]] += 1
    dist.all_reduce(seen)
    assert seen.min().item() >= 1  # every row is read by some rank

    dist.barrier()  # every rank is done with version 1
    if rank == 0:
        new = T.TensorDict(
            {"obs": torch.arange(rows * 4.0).view(rows, 4) + 1000, "label": torch.arange(rows)},
            [rows],
        )
        new.memmap_(prefix)
    dist.barrier()
    data = T.TensorDict.load_memmap(prefix)
    assert data["obs"][0, 0].item() == 1000.0


def cuda_gloo(T: Any, rank: int, world: int, tmp: Path) -> None:
    """CUDA trees over gloo (messages staged through the CPU): packed send from and into
    device trees, first contact from a device tree, broadcast and scatter onto a device (the
    tree built on the device). Needs CUDA. (``from_remote_init(device=...)`` is also the device the
    messages go through, as in the reference: a NCCL case, see ``nccl``.)"""
    peer = 1 - rank
    device = torch.device("cuda", 0)
    if rank == 0:
        tree(T, 1).to(device).send(dst=peer, consolidated=True)
        tree(T, 2).send(dst=peer, consolidated=True)
        tree(T, 3).to(device).init_remote(dst=peer)
        tree(T, 4).init_remote(dst=peer)
        tree(T, 5).to(device).send(dst=peer)  # per leaf, from the device
    else:
        out = tree(T, 0)
        out.recv(src=peer, consolidated=True)
        same(out, tree(T, 1))
        out = tree(T, 0).to(device)
        out.recv(src=peer, consolidated=True)
        same(out.cpu(), tree(T, 2))
        same(T.TensorDict.from_remote_init(src=peer).cpu(), tree(T, 3))
        same(T.TensorDict.from_remote_init(src=peer), tree(T, 4))
        out = tree(T, 0)
        out.recv(src=peer)
        same(out, tree(T, 5))
    got = (tree(T, 6) if rank == 0 else T.TensorDict()).broadcast(src=0, device=device)
    if rank == 1:
        assert all(t.is_cuda for t in got.values(True, True) if isinstance(t, torch.Tensor))
    same(got.cpu(), tree(T, 6))
    trees = [tree(T, 7 + r).to(device) for r in range(world)] if rank == 0 else None
    got = T.TensorDict().scatter(0, trees, device=device)  # from device trees onto the device
    assert all(t.is_cuda for t in got.values(True, True) if isinstance(t, torch.Tensor))
    same(got.cpu(), tree(T, 7 + rank))


def nccl(T: Any, rank: int, world: int, tmp: Path) -> None:
    """NCCL between two GPUs: per-leaf and packed send/recv, first contact, collectives."""
    peer = 1 - rank
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    numeric = tree(T, 1, text=False)
    if rank == 0:
        src = numeric.to(device)
        src.send(dst=peer)
        src.send(dst=peer, consolidated=True)
        src.init_remote(dst=peer)
    else:
        out = tree(T, 0, text=False).to(device)
        out.recv(src=peer)
        same(out.cpu(), numeric)
        out = tree(T, 0, text=False).to(device)
        out.recv(src=peer, consolidated=True)
        same(out.cpu(), numeric)
        same(T.TensorDict.from_remote_init(src=peer, device=device).cpu(), numeric)
    td = T.TensorDict({"w": torch.full((4, 3), rank + 1.0, device=device)}, [4])
    td.all_reduce()
    assert td["w"].eq(3).all()
    everyone = T.TensorDict({"r": torch.full((2,), float(rank), device=device)}, []).all_gather()
    assert [t["r"][0].item() for t in everyone] == [0.0, 1.0]
