"""What travels on the wire for ``distributed.py``: peers, tags, pieces and headers.

Point-to-point messages go straight to the ``ProcessGroup`` object (``group.send([t], rank,
tag)``, which is what ``dist.isend`` ends in), posted all at once and waited for together:
the same messages, tags and order as the reference's one-call-per-leaf loop, without paying
``torch.distributed``'s Python checks and a round trip per leaf.

A tree sent as one message travels in pieces of ``PIECE_BYTES`` (a function of its size only,
so both sides agree), piece ``i`` with tag ``init_tag + i``. The sender packs runs of pieces
of growing size (``packing_runs``), each while the ones before it are on the wire; the
receiver scatters the whole tree once every piece is in. Copying piece by piece as each goes
or arrives measured slower on 2 CPUs with both ranks on one machine (0.60 of one tensor's
speed, against 0.72 for packing and scattering whole), as each copy then wakes threads that
take the cores the transport's socket copies need.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import distributed as dist

from .. import _native
from . import packed as _packed

MAGIC = _native.MAGIC  # "tdrs02": a description message of this library (64-byte leaves)
PIECE_BYTES = _native.PIECE_BYTES
_CPU = torch.device("cpu")


def check_peer(
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


class Peer:
    """The other end of point-to-point messages: a process group and a rank in it."""

    def __init__(
        self, peer: int | None, group: Any, group_peer: int | None, name: str, group_name: str
    ) -> None:
        check_peer(peer, group_peer, group, name, group_name)
        self.member = group is not dist.GroupMember.NON_GROUP_MEMBER
        self.group: Any = dist.group.WORLD if group is None else group
        if not self.member:
            warnings.warn(
                f"this rank (global rank {dist.get_rank()}) does not belong to the given "
                "group: nothing is sent or received",
                stacklevel=3,
            )
            self.rank = -1
        elif group_peer is not None:
            self.rank = group_peer
        else:
            assert peer is not None
            self.rank = peer if group is None else dist.get_group_rank(group, peer)
        self.device = comm_device(group) if self.member else _CPU

    def send(self, tensors: Sequence[torch.Tensor], tags: Sequence[int]) -> list[Any]:
        """Posts one message per tensor; returns the pending works."""
        if not self.member:
            return []
        pg, rank = self.group, self.rank
        return [pg.send([t], rank, tag) for t, tag in zip(tensors, tags, strict=True)]

    def recv(self, tensors: Sequence[torch.Tensor], tags: Sequence[int]) -> list[Any]:
        """Posts one receive per tensor; returns the pending works."""
        if not self.member:
            return []
        pg, rank = self.group, self.rank
        return [pg.recv([t], rank, tag) for t, tag in zip(tensors, tags, strict=True)]


def wait_all(works: Sequence[Any]) -> None:
    for work in works:
        work.wait()


@functools.lru_cache(maxsize=64)
def tags(init_tag: int, count: int, pseudo_rand: bool) -> tuple[int, ...]:
    """The per-leaf tags: ``init_tag, init_tag + 1, ...`` or the reference's pseudo-random
    chain (each the next of the previous, numpy's ``default_rng``)."""
    if not pseudo_rand:
        return tuple(range(init_tag, init_tag + count))
    out, tag = [], init_tag - 1
    for _ in range(count):
        rng = np.random.default_rng(tag + 1)
        tag = int.from_bytes(rng.bytes(8), "big") % 10_000
        out.append(tag)
    return tuple(out)


def pieces(total: int) -> list[tuple[int, int]]:
    """The byte ranges a packed tree of ``total`` bytes travels in."""
    return [(lo, min(lo + PIECE_BYTES, total)) for lo in range(0, total, PIECE_BYTES)]


def comm_device(group: Any) -> torch.device:
    """Where messages travel: a CUDA device for NCCL, else the CPU."""
    try:
        backend = str(dist.get_backend(group))
    except ValueError:
        # a group made without the c10d registry (``dist.ProcessGroupGloo(store, rank, size,
        # timeout)``): point to point works on it with ``group_dst``/``group_src``
        backend = str(group.name()) if hasattr(group, "name") else "gloo"
    if "nccl" in backend and ":" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return _CPU


class Pending:
    """Receives still in flight; ``wait()`` waits for each, then runs its finishing step."""

    def __init__(self, steps: list[tuple[Any, Callable[[], None] | None]]) -> None:
        self._steps: list[tuple[Any, Callable[[], None] | None]] | None = steps
        self._next = 0  # the first step not done yet

    def wait(self, timeout: Any = None) -> bool:
        """Waits for the messages, then writes them into the leaves (once).

        A wait that raises (a timeout) leaves the steps not done yet to the next ``wait()``:
        the object is completed only once every message arrived and was written."""
        steps = self._steps
        if steps is None:
            return True
        while self._next < len(steps):
            work, finish = steps[self._next]
            if work is not None:
                work.wait() if timeout is None else work.wait(timeout)
                steps[self._next] = (None, finish)
            if finish is not None:
                finish()
            self._next += 1
        self._steps = None
        return True

    def is_completed(self) -> bool:
        """True once the messages arrived and the leaves are written."""
        return self._steps is None


def send_packed(
    plan: _packed.Plan, peer: Peer, tag: int, fresh: bool
) -> tuple[list[Any], torch.Tensor | None]:
    """Packs a tree and posts its pieces (no copy when its leaves lie in one buffer already);
    returns the works and the buffer they read (keep it alive until they are done)."""
    if not plan.total:
        return [], None
    spans = pieces(plan.total)
    if plan.device != peer.device or plan.whole is not None:  # packed at once (or not at all)
        buffer = to(plan.pack(fresh=fresh), peer.device)
        return peer.send([buffer[lo:hi] for lo, hi in spans], range(tag, tag + len(spans))), buffer
    buffer = plan.buffer(fresh)
    works: list[Any] = []
    runs = packing_runs(spans)
    for first, last in runs:
        plan.pack_range(buffer, spans[first][0], spans[last - 1][1], more=last < len(spans))
        chunk = range(first, last)
        works.extend(peer.send([buffer[slice(*spans[i])] for i in chunk], [tag + i for i in chunk]))
    return works, buffer


def packing_runs(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The runs of pieces ``[first, last)`` that a sender packs in one call, then posts.

    The first run is one piece; each next one holds about as many bytes as all those posted
    before it, so that it is packed while they are on the wire (packing runs faster than any
    transport here), in a few calls (the copy threads stay awake between them, and sleep after
    the last: on 2 CPUs, waking them for every piece measured slower than packing the whole
    tree first).
    """
    runs, first = [], 0
    while first < len(spans):
        posted = spans[first][0]
        last = first + 1
        while last < len(spans) and spans[last][1] - posted <= max(posted, PIECE_BYTES):
            last += 1
        runs.append((first, last))
        first = last
    return runs


def recv_packed(plan: _packed.Plan, peer: Peer, tag: int, fresh: bool) -> Pending:
    """Posts the receives of a packed tree's pieces; waiting scatters them into the leaves."""
    if not plan.total:
        return Pending([])
    spans = pieces(plan.total)
    target = plan.receive_buffer(fresh)
    buffer = (
        target if target.device == peer.device else torch.empty_like(target, device=peer.device)
    )
    works = peer.recv([buffer[lo:hi] for lo, hi in spans], [tag + i for i in range(len(spans))])
    if not works:
        return Pending([])

    def scatter() -> None:
        if buffer is not target:
            target.copy_(buffer)
        plan.unpack(target)

    return Pending([*((w, None) for w in works), (None, scatter)])


def recv_whole(buffer: torch.Tensor, peer: Peer, tag: int) -> Pending:
    """Posts the receives of a packed tree's pieces straight into ``buffer`` (staged through
    the peer's device when it lies elsewhere)."""
    spans = pieces(buffer.numel())
    if not spans:
        return Pending([])
    staged = buffer
    if buffer.device != peer.device:
        staged = torch.empty_like(buffer, device=peer.device)
    works = peer.recv([staged[lo:hi] for lo, hi in spans], [tag + i for i in range(len(spans))])
    if staged is buffer or not works:
        return Pending([(w, None) for w in works])

    def unstage() -> None:
        buffer.copy_(staged)

    return Pending([*((w, None) for w in works), (None, unstage)])


def header(description: bytes, total: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([MAGIC, len(description), total], dtype=torch.int64, device=device)


def describe(
    plan: _packed.Plan, device: torch.device
) -> tuple[bytes, torch.Tensor, Exception | None]:
    """The description of a first contact, its header, and the error that refuses it.

    A tree that cannot be described (a reserved key, a value that is not JSON) or whose
    description is longer than a receiver accepts gets a header saying so (description
    length ``REFUSED``): the sender posts it, then raises the error, and every receiver raises
    on reading it, so that no rank waits for messages that will never come and none is left
    over to be taken for the next exchange's.
    """
    try:
        description = plan.description()
    except Exception as error:  # raised by the sender once the refusal is posted
        return b"", refusal(device), error
    if len(description) > _packed.DESCRIPTION_LIMIT:
        refused = _native.TensorDictError(
            f"the tree's description is {len(description)} bytes, more than the "
            f"{_packed.DESCRIPTION_LIMIT} a receiving rank accepts: refused"
        )
        return b"", refusal(device), refused
    return description, header(description, plan.total, device), None


REFUSED = _native.REFUSED  # the description length of a header whose sender refused its own tree


def refusal(device: torch.device) -> torch.Tensor:
    """The header of a first contact that its sender refuses (see ``describe``)."""
    return torch.tensor([MAGIC, REFUSED, 0], dtype=torch.int64, device=device)


def check_header(received: torch.Tensor) -> tuple[int, int]:
    """(description length, data bytes) of a received header; refuses foreign senders."""
    magic, length, total = (int(x) for x in received.tolist())
    if magic != MAGIC:
        raise _native.TensorDictError(
            "the sender does not speak this library's description protocol (a tensordict "
            "rank pickles its metadata; use the per-leaf send/recv between the two packages)"
        )
    if length == REFUSED:
        raise _native.TensorDictError(
            "the sending rank could not send its tree's description (its own error says why): "
            "nothing more comes from it"
        )
    if not 0 <= length <= _packed.DESCRIPTION_LIMIT or total < 0:
        raise _native.TensorDictError(
            f"received a tree description of {length} bytes for {total} data bytes: refused"
        )
    return length, total


def bytes_tensor(data: bytes, device: torch.device) -> torch.Tensor:
    if not data:
        return torch.empty(0, dtype=torch.uint8, device=device)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return t if device == _CPU else t.to(device)


def text_bytes(received: torch.Tensor) -> bytes:
    """The bytes of a received uint8 tensor (a description)."""
    return bytes(received.cpu().numpy())


def to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t if t.device == device else t.to(device)
