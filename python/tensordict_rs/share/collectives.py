"""The torch.distributed collectives of TensorDict: ``all_reduce``, ``reduce``, ``all_gather``,
``gather_and_stack``, ``scatter`` (``broadcast``, a first contact, is in ``distributed.py``).

The reduce family runs one collective per leaf (or per bucket of leaves of one device and
dtype); the gathering ones send each tree as this library's first contact does: the JSON
description of ``meta.json``, then the packed data, padded to the largest rank's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Self

import torch
from torch import distributed as dist

from .._core.nodes import TreeNode
from . import packed as _packed
from . import wire
from .wire import Pending

_CPU = torch.device("cpu")


def _bucketed(
    leaves: list[torch.Tensor],
    bucket_bytes: int,
    collective: Callable[[torch.Tensor], Any],
    copy_back: bool,
) -> list[tuple[Any, Callable[[], None] | None]]:
    """Runs ``collective`` once per bucket of same-device, same-dtype contiguous leaves;
    returns ``(work, finish)`` per bucket (``finish`` copies a bucket back into its leaves)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be a positive number of bytes, got {bucket_bytes}.")
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    buckets: list[list[torch.Tensor]] = []
    for leaf in leaves:
        if leaf.layout != torch.strided or not leaf.is_contiguous():
            buckets.append([leaf])
        else:
            groups.setdefault((leaf.device, leaf.dtype), []).append(leaf)
    for members in groups.values():
        bucket: list[torch.Tensor] = []
        size = 0
        for leaf in members:
            if bucket and size + leaf.nbytes > bucket_bytes:
                buckets.append(bucket)
                bucket, size = [], 0
            bucket.append(leaf)
            size += leaf.nbytes
        buckets.append(bucket)
    results: list[tuple[Any, Callable[[], None] | None]] = []
    for bucket in buckets:
        if len(bucket) == 1:
            results.append((collective(bucket[0]), None))
            continue
        with torch.no_grad():
            flat = torch.cat([t.reshape(-1) for t in bucket])
        work = collective(flat)

        def finish(flat: torch.Tensor = flat, bucket: list[torch.Tensor] = bucket) -> None:
            with torch.no_grad():
                chunks = flat.split([t.numel() for t in bucket])
                for t, chunk in zip(bucket, chunks, strict=True):
                    t.copy_(chunk.view(t.shape))

        results.append((work, finish if copy_back else None))
    return results


def _reduce_leaves(
    leaves: list[torch.Tensor],
    collective: Callable[[torch.Tensor], Any],
    bucket_bytes: int | None,
    async_op: bool,
    give_back: bool,
    copy_back: bool = True,
) -> list[Any] | None:
    """The reduce family: one collective per leaf or per bucket; the pending objects when
    ``give_back``, else waited for (``async_op``) and copied back into the leaves."""
    if bucket_bytes is None:
        steps: list[tuple[Any, Callable[[], None] | None]] = [(collective(t), None) for t in leaves]
    else:
        steps = _bucketed(leaves, bucket_bytes, collective, copy_back)
    if give_back:
        return [w if f is None else Pending([(w, f)]) for w, f in steps]
    for work, finish in steps:
        if async_op:
            work.wait()
        if finish is not None:
            finish()
    return None


class Collectives(TreeNode):
    """The collectives of TensorDict (mixed into the class through ``Distributed``)."""

    def all_reduce(
        self,
        op: Any = None,
        *,
        group: Any = None,
        async_op: bool = False,
        bucket_bytes: int | None = None,
    ) -> list[Any] | None:
        """Reduces every leaf over all ranks in place (``op`` defaults to SUM).

        Leaves go in insertion order, as the reference's. ``bucket_bytes`` packs leaves of
        one device and dtype into buckets of at most that size (one reduction per bucket).
        With ``async_op`` the pending objects are returned.

        >>> import tempfile, torch, torch.distributed as dist
        >>> from tensordict_rs import TensorDict
        >>> store = tempfile.NamedTemporaryFile(delete=False).name
        >>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        >>> td = TensorDict({"w": torch.ones(3), "b": {"c": torch.zeros(1)}}, [])
        >>> td.all_reduce()  # sums every leaf over the ranks (here one), in place
        >>> td["w"]
        tensor([1., 1., 1.])
        >>> dist.destroy_process_group()
        """
        op = dist.ReduceOp.SUM if op is None else op

        def reduce(t: torch.Tensor) -> Any:
            return dist.all_reduce(t, op=op, group=group, async_op=async_op)

        leaves = list(_insertion_leaves(self))
        return _reduce_leaves(leaves, reduce, bucket_bytes, async_op, give_back=async_op)

    def reduce(
        self,
        dst: int,
        op: Any = None,
        async_op: bool = False,
        return_premature: bool = False,
        group: Any = None,
        *,
        bucket_bytes: int | None = None,
    ) -> list[Any] | None:
        """Reduces every leaf over all ranks into rank ``dst``'s tree (sorted-key order).

        Other ranks' values are undefined afterwards. With ``async_op`` and
        ``return_premature`` the pending objects are returned.

        >>> import tempfile, torch, torch.distributed as dist
        >>> from tensordict_rs import TensorDict
        >>> store = tempfile.NamedTemporaryFile(delete=False).name
        >>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        >>> td = TensorDict({"w": torch.ones(3), "b": {"c": torch.zeros(1)}}, [])
        >>> td.reduce(0)  # the sum over the ranks (here one), into rank 0's tree
        >>> td["w"]
        tensor([1., 1., 1.])
        >>> dist.destroy_process_group()
        """
        op = dist.ReduceOp.SUM if op is None else op

        def reduce(t: torch.Tensor) -> Any:
            return dist.reduce(t, dst=dst, op=op, group=group, async_op=async_op)

        leaves = _packed.plan(self).materialized()
        give_back = async_op and return_premature
        mine = dist.get_rank() == dst
        return _reduce_leaves(leaves, reduce, bucket_bytes, async_op, give_back, mine)

    def all_gather(self, *, group: Any = None) -> list[Any]:
        """Every rank's tree, on every rank, in rank order (the trees may differ).

        >>> import tempfile, torch, torch.distributed as dist
        >>> from tensordict_rs import TensorDict
        >>> store = tempfile.NamedTemporaryFile(delete=False).name
        >>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        >>> td = TensorDict({"w": torch.ones(3), "b": {"c": torch.zeros(1)}}, [])
        >>> [t["w"].sum().item() for t in td.all_gather()]  # one tree per rank: here one
        [3.0]
        >>> dist.destroy_process_group()
        """
        comm = wire.comm_device(group)
        world = dist.get_world_size(group=group)
        plan = _packed.plan(self)
        description, mine, error = wire.describe(plan, comm)
        headers = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(headers, mine, group=group)
        if error is not None:  # the others raise on this rank's refusal header
            raise error
        sizes = [wire.check_header(h) for h in headers]
        max_len = max(n for n, _ in sizes)
        max_total = max(t for _, t in sizes)
        text = torch.zeros(max_len, dtype=torch.uint8, device=comm)
        text[: len(description)] = wire.bytes_tensor(description, comm)
        texts = [torch.empty_like(text) for _ in range(world)]
        dist.all_gather(texts, text, group=group)
        data = torch.zeros(max_total, dtype=torch.uint8, device=comm)
        if plan.total:
            data[: plan.total] = wire.to(plan.pack(), comm)
        out, buffers = [], []
        for (length, total), received in zip(sizes, texts, strict=True):
            raw = received[:length].cpu().numpy().tobytes()
            td, whole = _packed.build(type(self), raw, total, None, capacity=max_total)
            out.append(td)
            buffers.append(whole)
        if max_total == 0:
            return [_packed.settle(td) for td in out]
        if comm == _CPU:
            dist.all_gather(buffers, data, group=group)
        else:
            staged = [torch.empty_like(data) for _ in range(world)]
            dist.all_gather(staged, data, group=group)
            for whole, s in zip(buffers, staged, strict=True):
                whole.copy_(s)
        return [_packed.settle(td) for td in out]

    def gather_and_stack(self, dst: int, group: Any = None) -> Self | None:
        """Writes the other ranks' trees into rows ``0 .. world_size - 2`` of rank ``dst``'s.

        Every rank calls it; rank ``dst``'s tree has one row per other rank. Returns
        ``self`` on ``dst``, None elsewhere.

        >>> import tempfile, torch, torch.distributed as dist
        >>> from tensordict_rs import TensorDict
        >>> store = tempfile.NamedTemporaryFile(delete=False).name
        >>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        >>> rows = TensorDict({"w": torch.zeros(0, 3)}, [0])  # one row per other rank: none
        >>> rows.gather_and_stack(0) is rows
        True
        >>> dist.destroy_process_group()
        """
        comm = wire.comm_device(group)
        world = dist.get_world_size(group=group)
        rank = dist.get_rank(group=group)
        payload = torch.empty(0, dtype=torch.uint8)
        if rank == dst:
            description, mine, error = b"", wire.header(b"", 0, comm), None
        else:
            plan = _packed.plan(self)
            description, mine, error = wire.describe(plan, comm)
            if error is None:
                payload = plan.pack()
        headers = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(headers, mine, group=group)
        if error is not None:  # the others raise on this rank's refusal header
            raise error
        sizes = [wire.check_header(h) for h in headers]
        width = max(_packed._aligned(n) + t for n, t in sizes)
        buffer = torch.zeros(width, dtype=torch.uint8)
        buffer[: len(description)] = wire.bytes_tensor(description, _CPU)
        start = _packed._aligned(len(description))
        buffer[start : start + payload.numel()] = wire.to(payload, _CPU)
        buffer = wire.to(buffer, comm)
        gathered = [torch.empty_like(buffer) for _ in range(world)] if rank == dst else None
        dist.gather(buffer, gathered, dst=dst, group=group)
        if rank != dst:
            return None
        assert gathered is not None
        rows: list[tuple[int, Any]] = []
        for i, ((length, total), received) in enumerate(zip(sizes, gathered, strict=True)):
            if i == dst:
                continue
            raw = received[:length].cpu().numpy().tobytes()
            td, whole = _packed.build(type(self), raw, total)
            start = _packed._aligned(length)
            whole.copy_(received[start : start + total].cpu())
            rows.append((i, _packed.settle(td)))
        # checked before any row is written (every rank is past the collective): a tree
        # with more rows than ranks had its first rows written and the rest left as they
        # were, and a leaf of another shape failed with torch's error, naming no key
        if not self.batch_size or self.batch_size[0] != world - 1:
            raise RuntimeError(
                f"gather_and_stack() on rank {dst}: the tree has batch size "
                f"{self.batch_size}, but {world - 1} other ranks sent one row each: its "
                f"first batch dimension must be {world - 1}"
            )
        for i, td in rows:
            for key in td.keys(include_nested=True, leaves_only=True):
                value, entry = td.get(key), self.get(key, None)
                if not (isinstance(value, torch.Tensor) and isinstance(entry, torch.Tensor)):
                    continue
                if value.is_nested or entry.is_nested:
                    continue  # ragged rows: their lengths are checked when written
                shape, into = value.shape, entry.shape
                if tuple(into[1:]) != tuple(shape):
                    raise RuntimeError(
                        f"gather_and_stack() on rank {dst}: rank {i} sent the key {key!r} "
                        f"of shape {shape}, but its rows here have shape "
                        f"{torch.Size(into[1:])}: nothing was written"
                    )
        for row, (_, td) in enumerate(rows):
            self[row] = td
        return self

    def scatter(
        self,
        src: int,
        tensordicts: Sequence[Any] | None = None,
        *,
        group: Any = None,
        device: Any = None,
    ) -> Self:
        """Sends ``tensordicts[r]`` from rank ``src`` to rank ``r``; returns this rank's tree.

        Every rank calls it; on ``src``, ``tensordicts`` holds one tree per rank (they may
        differ), elsewhere it is not read, nor is the tree the method is called on. Each rank,
        ``src`` included, gets a new tree (leaves in one buffer; on ``device`` when given).
        On ``src``, a list of the wrong length (``RuntimeError``, as the reference), a value
        that is not a tree (``TypeError``) or a tree that cannot be described raises after a
        refusal is sent, so that every other rank raises too (``TensorDictError``) instead of
        waiting.

        >>> import tempfile, torch, torch.distributed as dist
        >>> from tensordict_rs import TensorDict
        >>> store = tempfile.NamedTemporaryFile(delete=False).name
        >>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        >>> trees = [TensorDict({"w": torch.arange(3.0), "b": {"c": torch.ones(1)}}, [])]
        >>> mine = TensorDict().scatter(0, trees)  # one tree per rank: here one
        >>> mine["w"].tolist(), mine is trees[0]
        ([0.0, 1.0, 2.0], False)
        >>> dist.destroy_process_group()
        """
        comm = wire.comm_device(group)
        world = dist.get_world_size(group=group)
        rank = dist.get_rank(group=group)
        table = torch.empty(world, 3, dtype=torch.int64, device=comm)
        texts: list[torch.Tensor] | None = None
        payloads: list[torch.Tensor] = []
        error: Exception | None = None
        if rank == src:
            table, texts, payloads, error = _scatter_source(tensordicts, world, comm)
        dist.broadcast(table, src=src, group=group)  # every rank's header: the widths
        if error is not None:  # the others raise on the refusal headers
            raise error
        length, total = wire.check_header(table[rank])
        max_len, max_total = (int(x) for x in table[:, 1:].max(dim=0).values.tolist())
        text = torch.empty(max_len, dtype=torch.uint8, device=comm)
        if max_len:
            dist.scatter(text, texts, src=src, group=group)
        target = None if device is None else torch.device(device)
        try:
            td, whole = _packed.build(
                type(self), wire.text_bytes(text[:length]), total, target, capacity=max_total
            )
        except BaseException:
            if max_total:  # the data scatter is due all the same: take it
                with contextlib.suppress(Exception):
                    scratch = torch.empty(max_total, dtype=torch.uint8, device=comm)
                    dist.scatter(scratch, payloads or None, src=src, group=group)
            raise
        if not max_total:
            return _packed.settle(td)  # type: ignore[no-any-return]
        staged = whole if whole.device == comm else torch.empty_like(whole, device=comm)
        dist.scatter(staged, payloads or None, src=src, group=group)
        if staged is not whole:
            whole.copy_(staged)
        return _packed.settle(td)  # type: ignore[no-any-return]


def _scatter_source(
    tensordicts: Sequence[Any] | None, world: int, comm: torch.device
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], Exception | None]:
    """What rank ``src`` of ``scatter`` posts: the header table (one row per rank), the
    descriptions and the packed trees, each padded to the largest; or a table of refusals
    and the error to raise once it is posted."""
    refused = torch.stack([wire.refusal(comm)] * world)
    trees = None if tensordicts is None else list(tensordicts)
    if trees is None or len(trees) != world:
        count = "none" if trees is None else len(trees)
        error: Exception | None = RuntimeError(
            f"scatter needs one tensordict per rank ({world}) on src, got {count}"
        )
        return refused, [], [], error
    for i, td in enumerate(trees):
        if not isinstance(td, Collectives):
            kind = type(td).__name__
            return refused, [], [], TypeError(f"scatter: tensordicts[{i}] is a {kind}, not a tree")
    plans = [_packed.plan(td) for td in trees]
    described = [wire.describe(plan, comm) for plan in plans]
    for _, _, error in described:
        if error is not None:
            return refused, [], [], error
    table = torch.stack([head for _, head, _ in described])
    max_len = max(len(text) for text, _, _ in described)
    max_total = max(plan.total for plan in plans)
    texts = []
    for text, _, _ in described:
        padded = torch.zeros(max_len, dtype=torch.uint8, device=comm)
        padded[: len(text)] = wire.bytes_tensor(text, comm)
        texts.append(padded)
    payloads = []
    for plan in plans if max_total else []:
        packed = wire.to(plan.pack(), comm) if plan.total else None
        if packed is not None and plan.total == max_total:
            payloads.append(packed)
            continue
        padded = torch.zeros(max_total, dtype=torch.uint8, device=comm)
        if packed is not None:
            padded[: plan.total] = packed
        payloads.append(padded)
    return table, texts, payloads, None


def _insertion_leaves(td: Any) -> Any:
    """Every tensor leaf, depth-first in insertion order (the reference's ``_fast_apply``)."""
    for key in list(td._tensordict):
        value = td._get_str(key)
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, TreeNode):
            yield from _insertion_leaves(value)
