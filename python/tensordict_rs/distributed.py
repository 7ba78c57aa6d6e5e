"""torch.distributed for TensorDict: the reference's methods, names, signatures and defaults.

Point to point (``send``, ``recv``, ``isend``, ``irecv``) speaks the reference's per-leaf
protocol by default: one message per tensor leaf, depth-first in sorted-key order, tags
``init_tag, init_tag + 1, ...`` (or the reference's pseudo-random chain), so that a
tensordict 0.15.3 rank and a tensordict-rs rank exchange trees. Receiving writes straight into
the receiver's leaves, and so into its memory maps when it is memory-mapped.

``consolidated=True`` sends the whole tree as one message: the Rust core gathers the leaves into
one buffer (GIL released, parallel; no copy when they already lie in one buffer) and the
receiver scatters it into its leaves. Any tree of the same keys, shapes and dtypes can receive
it; no ``consolidate()`` call is needed on either side.

First contact (``init_remote``/``from_remote_init``, ``broadcast``, ``all_gather``,
``gather_and_stack``) sends the structure as the JSON description of ``meta.json`` in a uint8
tensor, never a pickle, then the data as one message. This wire format is this library's
own: those calls work between tensordict-rs ranks (the reference pickles its metadata).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import torch
from torch import distributed as dist

from . import _native, _packed
from ._tree import NonTensorData, _LazyLeaf

if TYPE_CHECKING:
    pass

__all__ = ["Distributed"]

MAGIC = 0x7464_7273_3031  # "tdrs01": a description message of this library
_CPU = torch.device("cpu")


def _check_peer(
    peer: int | None, group_peer: int | None, group: Any, name: str, group_name: str
) -> None:
    """The reference's rule: the peer is a global rank or a rank in ``group``, never both."""
    if group_peer is not None:
        if group is None:
            raise ValueError(f"`{group_name}` requires `group` to be passed.")
        if peer is not None:
            raise ValueError(f"`{name}` and `{group_name}` are mutually exclusive.")
    elif peer is None:
        raise ValueError(f"Exactly one of `{name}` and `{group_name}` must be provided.")


def _next_tag(tag: int, pseudo_rand: bool) -> int:
    """The tag after ``tag``: +1, or the reference's pseudo-random chain (numpy's default_rng)."""
    if not pseudo_rand:
        return tag + 1
    rng = np.random.default_rng(tag + 1)
    return int.from_bytes(rng.bytes(8), "big") % 10_000


def _sorted_leaves(td: Any) -> Iterator[torch.Tensor]:
    """Every tensor leaf, depth-first in sorted-key order (the per-leaf protocol's order)."""
    items = td._tensordict
    for key in sorted(items):
        value = items[key]
        if type(value) is _LazyLeaf or isinstance(value, torch.Tensor):
            yield td._get_str(key)
        elif type(value) is not NonTensorData:
            yield from _sorted_leaves(value)


def _insertion_leaves(td: Any) -> Iterator[torch.Tensor]:
    """Every tensor leaf, depth-first in insertion order (the reference's ``_fast_apply``)."""
    for key in list(td._tensordict):
        value = td._get_str(key)
        if isinstance(value, torch.Tensor):
            yield value
        elif type(value) is not NonTensorData:
            yield from _insertion_leaves(value)


def _writable_leaf(leaf: torch.Tensor) -> torch.Tensor:
    buffer = getattr(leaf, "_buffer", None)
    if buffer is not None and not buffer.writable:
        raise RuntimeError("cannot receive into a read-only memory map")
    return leaf


def _comm_device(group: Any) -> torch.device:
    """Where control messages travel: a CUDA device for NCCL, else the CPU."""
    backend = str(dist.get_backend(group))
    if "nccl" in backend and ":" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return _CPU


def _send_tensor(t: torch.Tensor, dst: int | None, group: Any, group_dst: int | None) -> None:
    if group_dst is not None:
        group.send([t], group_dst, 0).wait()
    else:
        dist.send(t, dst=dst, group=group)


def _recv_tensor(t: torch.Tensor, src: int | None, group: Any, group_src: int | None) -> None:
    if group_src is not None:
        group.recv([t], group_src, 0).wait()
    else:
        dist.recv(t, src=src, group=group)


def _header(description: bytes, total: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([MAGIC, len(description), total], dtype=torch.int64, device=device)


def _check_header(header: torch.Tensor) -> tuple[int, int]:
    magic, length, total = (int(x) for x in header.tolist())
    if magic != MAGIC:
        raise _native.TensorDictError(
            "the sender does not speak this library's description protocol (a tensordict "
            "rank pickles its metadata; use the per-leaf send/recv between the two packages)"
        )
    if not 0 <= length <= _packed.DESCRIPTION_LIMIT or total < 0:
        raise _native.TensorDictError(
            f"received a tree description of {length} bytes for {total} data bytes: refused"
        )
    return length, total


def _bytes_tensor(data: bytes, device: torch.device) -> torch.Tensor:
    if not data:
        return torch.empty(0, dtype=torch.uint8, device=device)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return t if device == _CPU else t.to(device)


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t if t.device == device else t.to(device)


class _ScatterWork:
    """A receive still in flight; ``wait()`` waits for it, then writes the leaves."""

    def __init__(self, work: Any, finish: Callable[[], None]) -> None:
        self._work = work
        self._finish: Callable[[], None] | None = finish

    def wait(self, timeout: Any = None) -> bool:
        """Waits for the message, then scatters it into the leaves (once)."""
        done = self._work.wait() if timeout is None else self._work.wait(timeout)
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        return bool(done) if done is not None else True

    def is_completed(self) -> bool:
        """True once the message arrived and the leaves are written."""
        return self._finish is None


def _bucketed(
    leaves: list[torch.Tensor],
    bucket_bytes: int,
    collective: Callable[[torch.Tensor], Any],
    async_op: bool,
    copy_back: bool = True,
) -> list[Any]:
    """Runs ``collective`` once per bucket of same-device, same-dtype contiguous leaves."""
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
    results: list[Any] = []
    for bucket in buckets:
        if len(bucket) == 1:
            results.append(collective(bucket[0]) if async_op else (collective(bucket[0]), None))
            continue
        with torch.no_grad():
            flat = torch.cat([t.reshape(-1) for t in bucket])
        work = collective(flat)

        def finish(flat: torch.Tensor = flat, bucket: list[torch.Tensor] = bucket) -> None:
            if copy_back:
                with torch.no_grad():
                    chunks = flat.split([t.numel() for t in bucket])
                    for t, chunk in zip(bucket, chunks, strict=True):
                        t.copy_(chunk.view(t.shape))

        results.append(_ScatterWork(work, finish) if async_op else (work, finish))
    return results


def _finish_sync(results: list[Any]) -> None:
    for _, finish in results:
        if finish is not None:
            finish()


class Distributed:
    """The torch.distributed methods of TensorDict (mixed into the class).

    Every rank calls the collective; here a one-process group shows the calls:

    >>> import tempfile, torch, torch.distributed as dist
    >>> from tensordict_rs import TensorDict
    >>> store = tempfile.NamedTemporaryFile(delete=False).name
    >>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    >>> td = TensorDict({"w": torch.ones(3), "b": {"c": torch.zeros(1)}}, [])
    >>> td.all_reduce()  # sums every leaf over the ranks, in place
    >>> td.broadcast(0)["w"]
    tensor([1., 1., 1.])
    >>> [t["w"].sum().item() for t in td.all_gather()]
    [3.0]
    >>> dist.destroy_process_group()
    """

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...

    # ------------------------------------------------------------------ point to point

    def send(
        self,
        dst: int | None = None,
        *,
        group: Any = None,
        group_dst: int | None = None,
        init_tag: int = 0,
        pseudo_rand: bool = False,
        consolidated: bool = False,
    ) -> None:
        """Sends every leaf to rank ``dst`` (one message per leaf, tags from ``init_tag``).

        The receiver calls ``recv`` on a tree of the same keys, shapes and dtypes. With
        ``consolidated=True`` the whole tree is one message (leaves gathered by the Rust
        core, no ``consolidate()`` needed); the receiver passes ``consolidated=True`` too.
        ``group_dst`` is a rank in ``group`` instead of a global rank.
        """
        _check_peer(dst, group_dst, group, "dst", "group_dst")
        if consolidated:
            plan = _packed.plan(self)
            if plan.total:  # both sides know an empty tree: nothing travels
                _send_tensor(plan.pack(), dst, group, group_dst)
            return
        tag = init_tag - 1
        for leaf in _sorted_leaves(self):
            tag = _next_tag(tag, pseudo_rand)
            if group_dst is not None:
                group.send([leaf], group_dst, tag).wait()
            else:
                dist.send(leaf, dst=dst, tag=tag, group=group)

    def recv(
        self,
        src: int | None = None,
        *,
        group: Any = None,
        group_src: int | None = None,
        init_tag: int = 0,
        pseudo_rand: bool = False,
        consolidated: bool = False,
    ) -> int | None:
        """Receives what ``send`` sends, written into this tree's leaves (and memory maps).

        Returns the tag of the last leaf, or None with ``consolidated=True``.
        """
        _check_peer(src, group_src, group, "src", "group_src")
        if consolidated:
            plan = _packed.plan(self)
            if plan.total:
                buffer = plan.receive_buffer()
                _recv_tensor(buffer, src, group, group_src)
                plan.unpack(buffer)
            return None
        tag = init_tag - 1
        for leaf in _sorted_leaves(self):
            tag = _next_tag(tag, pseudo_rand)
            _writable_leaf(leaf)
            if group_src is not None:
                group.recv([leaf], group_src, tag).wait()
            else:
                dist.recv(leaf, src=src, tag=tag, group=group)
        return tag

    def isend(
        self,
        dst: int | None = None,
        *,
        group: Any = None,
        group_dst: int | None = None,
        init_tag: int = 0,
        pseudo_rand: bool = False,
        return_early: bool = False,
        consolidated: bool = False,
    ) -> int | list[Any] | None:
        """As ``send``, with every transfer running at once.

        Waits for them unless ``return_early`` (then returns the ``Work`` objects: wait on
        each before changing the tree). Returns the last tag, or None with ``consolidated``.
        """
        _check_peer(dst, group_dst, group, "dst", "group_dst")
        if consolidated:
            buffer = _packed.plan(self).pack(fresh=return_early)
            if group_dst is not None:
                work = group.send([buffer], group_dst, 0)
            else:
                work = dist.isend(buffer, dst=dst, group=group)
            if return_early:
                return [work]
            work.wait()
            return None
        tag = init_tag - 1
        works = []
        for leaf in _sorted_leaves(self):
            tag = _next_tag(tag, pseudo_rand)
            if group_dst is not None:
                works.append(group.send([leaf], group_dst, tag))
            else:
                works.append(dist.isend(leaf, dst=dst, tag=tag, group=group))
        if return_early:
            return works
        for work in works:
            work.wait()
        return tag

    def irecv(
        self,
        src: int | None = None,
        *,
        group: Any = None,
        group_src: int | None = None,
        return_premature: bool = False,
        init_tag: int = 0,
        pseudo_rand: bool = False,
        consolidated: bool = False,
    ) -> list[Any] | None:
        """As ``recv``, with every transfer running at once.

        Waits for them unless ``return_premature`` (then returns objects to ``wait()`` on
        before reading the tree).
        """
        _check_peer(src, group_src, group, "src", "group_src")
        if consolidated:
            plan = _packed.plan(self)
            buffer = plan.receive_buffer(fresh=return_premature)
            if group_src is not None:
                work = group.recv([buffer], group_src, 0)
            else:
                work = dist.irecv(buffer, src=src, group=group)
            pending = _ScatterWork(work, lambda: plan.unpack(buffer))
            if return_premature:
                return [pending]
            pending.wait()
            return None
        tag = init_tag - 1
        works = []
        for leaf in _sorted_leaves(self):
            tag = _next_tag(tag, pseudo_rand)
            _writable_leaf(leaf)
            if group_src is not None:
                works.append(group.recv([leaf], group_src, tag))
            else:
                works.append(dist.irecv(leaf, src=src, tag=tag, group=group))
        if return_premature:
            return works
        for work in works:
            work.wait()
        return None

    # ------------------------------------------------------------------ first contact

    def init_remote(
        self,
        dst: int | None = None,
        group: Any = None,
        device: torch.device | None = None,
        use_broadcast: bool = False,
    ) -> None:
        """Sends structure and values to a rank that knows neither (``from_remote_init``).

        The structure travels as the JSON description of meta.json (no pickle), the values
        as one message. Later batches go with ``send(consolidated=True)`` into the tree that
        ``from_remote_init`` returned. ``use_broadcast=True`` calls ``broadcast`` instead.
        """
        if use_broadcast:
            self.broadcast(src=dist.get_rank(group=group), group=group, device=device)
            return
        if dst is None:
            raise ValueError("init_remote needs `dst` (or use_broadcast=True).")
        comm = torch.device(device) if device is not None else _comm_device(group)
        description = _packed.describe(self)
        plan = _packed.plan(self)
        dist.send(_header(description, plan.total, comm), dst=dst, group=group)
        dist.send(_bytes_tensor(description, comm), dst=dst, group=group)
        if plan.total:
            dist.send(_to(plan.pack(), comm), dst=dst, group=group)

    @classmethod
    def from_remote_init(
        cls,
        src: int,
        group: Any = None,
        device: torch.device | None = None,
        use_broadcast: bool = False,
    ) -> Self:
        """Receives what ``init_remote`` sends and returns the new tree.

        Its leaves lie in one buffer (lazy slices of one anonymous map on the CPU), so
        ``recv(consolidated=True)`` into it writes that buffer directly, with no copy.
        """
        if use_broadcast:
            return cls().broadcast(src=src, group=group, device=device)  # type: ignore[no-any-return]
        comm = torch.device(device) if device is not None else _comm_device(group)
        header = torch.empty(3, dtype=torch.int64, device=comm)
        dist.recv(header, src=src, group=group)
        length, total = _check_header(header)
        text = torch.empty(length, dtype=torch.uint8, device=comm)
        dist.recv(text, src=src, group=group)
        td, whole = _packed.build(cls, text.cpu().numpy().tobytes(), total, _target(device))
        _receive(whole, comm, lambda t: dist.recv(t, src=src, group=group))
        return td  # type: ignore[return-value]

    # ------------------------------------------------------------------ collectives

    def broadcast(self, src: int, *, group: Any = None, device: Any = None) -> Self:
        """Sends rank ``src``'s tree to every rank of the group; returns it on each rank.

        Every rank calls it; the others need not know the structure. Rank ``src`` gets
        ``self`` back, the others a new tree (leaves in one buffer).
        """
        comm = _comm_device(group)
        if dist.get_rank(group=group) == src:
            description = _packed.describe(self)
            plan = _packed.plan(self)
            dist.broadcast(_header(description, plan.total, comm), src=src, group=group)
            dist.broadcast(_bytes_tensor(description, comm), src=src, group=group)
            if plan.total:
                dist.broadcast(_to(plan.pack(), comm), src=src, group=group)
            return self
        header = torch.empty(3, dtype=torch.int64, device=comm)
        dist.broadcast(header, src=src, group=group)
        length, total = _check_header(header)
        text = torch.empty(length, dtype=torch.uint8, device=comm)
        dist.broadcast(text, src=src, group=group)
        target = _target(None if device is None else torch.device(device))
        td, whole = _packed.build(type(self), text.cpu().numpy().tobytes(), total, target)
        _receive(whole, comm, lambda t: dist.broadcast(t, src=src, group=group))
        return td  # type: ignore[return-value]

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
        """
        op = dist.ReduceOp.SUM if op is None else op
        leaves = list(_insertion_leaves(self))

        def reduce(t: torch.Tensor) -> Any:
            return dist.all_reduce(t, op=op, group=group, async_op=async_op)

        if bucket_bytes is None:
            works = [reduce(t) for t in leaves]
            return works if async_op else None
        results = _bucketed(leaves, bucket_bytes, reduce, async_op)
        if async_op:
            return results
        _finish_sync(results)
        return None

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
        """
        op = dist.ReduceOp.SUM if op is None else op
        leaves = list(_sorted_leaves(self))

        def reduce(t: torch.Tensor) -> Any:
            return dist.reduce(t, dst=dst, op=op, group=group, async_op=async_op)

        if bucket_bytes is None:
            results: list[Any] = [reduce(t) for t in leaves]
            if async_op and return_premature:
                return results
            if async_op:
                for work in results:
                    work.wait()
            return None
        results = _bucketed(
            leaves, bucket_bytes, reduce, async_op, copy_back=dist.get_rank() == dst
        )
        if async_op and return_premature:
            return results
        if async_op:
            for work in results:
                work.wait()
        else:
            _finish_sync(results)
        return None

    def all_gather(self, *, group: Any = None) -> list[Any]:
        """Every rank's tree, on every rank, in rank order (the trees may differ)."""
        comm = _comm_device(group)
        world = dist.get_world_size(group=group)
        description = _packed.describe(self)
        plan = _packed.plan(self)
        header = _header(description, plan.total, comm)
        headers = [torch.empty_like(header) for _ in range(world)]
        dist.all_gather(headers, header, group=group)
        sizes = [_check_header(h) for h in headers]
        max_len = max(n for n, _ in sizes)
        max_total = max(t for _, t in sizes)
        text = torch.zeros(max_len, dtype=torch.uint8, device=comm)
        text[: len(description)] = _bytes_tensor(description, comm)
        texts = [torch.empty_like(text) for _ in range(world)]
        dist.all_gather(texts, text, group=group)
        data = torch.zeros(max_total, dtype=torch.uint8, device=comm)
        if plan.total:
            data[: plan.total] = _to(plan.pack(), comm)
        out, buffers = [], []
        for (length, total), received in zip(sizes, texts, strict=True):
            raw = received[:length].cpu().numpy().tobytes()
            td, whole = _packed.build(type(self), raw, total, None, capacity=max_total)
            out.append(td)
            buffers.append(whole)
        if max_total == 0:
            return out
        if comm == _CPU:
            dist.all_gather(buffers, data, group=group)
        else:
            staged = [torch.empty_like(data) for _ in range(world)]
            dist.all_gather(staged, data, group=group)
            for whole, s in zip(buffers, staged, strict=True):
                whole.copy_(s)
        return out

    def gather_and_stack(self, dst: int, group: Any = None) -> Self | None:
        """Writes the other ranks' trees into rows ``0 .. world_size - 2`` of rank ``dst``'s.

        Every rank calls it; rank ``dst``'s tree has one row per other rank. Returns
        ``self`` on ``dst``, None elsewhere.
        """
        comm = _comm_device(group)
        world = dist.get_world_size(group=group)
        rank = dist.get_rank(group=group)
        if rank == dst:
            description, payload = b"", torch.empty(0, dtype=torch.uint8)
        else:
            description = _packed.describe(self)
            payload = _packed.plan(self).pack()
        header = _header(description, payload.numel(), comm)
        headers = [torch.empty_like(header) for _ in range(world)]
        dist.all_gather(headers, header, group=group)
        sizes = [_check_header(h) for h in headers]
        width = max(_packed._aligned(n) + t for n, t in sizes)
        buffer = torch.zeros(width, dtype=torch.uint8)
        buffer[: len(description)] = _bytes_tensor(description, _CPU)
        start = _packed._aligned(len(description))
        buffer[start : start + payload.numel()] = _to(payload, _CPU)
        buffer = _to(buffer, comm)
        gathered = [torch.empty_like(buffer) for _ in range(world)] if rank == dst else None
        dist.gather(buffer, gathered, dst=dst, group=group)
        if rank != dst:
            return None
        assert gathered is not None
        row = 0
        for i, ((length, total), received) in enumerate(zip(sizes, gathered, strict=True)):
            if i == dst:
                continue
            raw = received[:length].cpu().numpy().tobytes()
            td, whole = _packed.build(type(self), raw, total)
            start = _packed._aligned(length)
            whole.copy_(received[start : start + total].cpu())
            self[row] = td
            row += 1
        return self


def _target(device: torch.device | str | None) -> torch.device | None:
    return None if device is None else torch.device(device)


def _receive(
    whole: torch.Tensor, comm: torch.device, receive: Callable[[torch.Tensor], Any]
) -> None:
    """Receives one message into ``whole``, staged through ``comm`` when it lies elsewhere."""
    if whole.numel() == 0:
        return
    if whole.device == comm:
        receive(whole)
        return
    staged = torch.empty_like(whole, device=comm)
    receive(staged)
    whole.copy_(staged)
