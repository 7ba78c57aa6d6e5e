"""torch.distributed for TensorDict: the reference's methods, names, signatures and defaults.

Point to point (``send``, ``recv``, ``isend``, ``irecv``) speaks the reference's per-leaf
protocol by default: one message per tensor leaf, depth-first in sorted-key order, tags
``init_tag, init_tag + 1, ...`` (or the reference's pseudo-random chain), so that a
tensordict 0.15.3 rank and a tensordict-rs rank exchange trees. The messages are posted all
at once and waited for together (``wire.Peer``). Receiving writes straight into the
receiver's leaves, and so into its memory maps when it is memory-mapped.

``consolidated=True`` sends the whole tree as one packed message (in pieces, see
``wire.py``): the Rust core gathers the leaves into one buffer (GIL released, parallel; no
copy when they already lie in one buffer) and the receiver scatters it into its leaves. Any
tree of the same keys, shapes and dtypes can receive it; no ``consolidate()`` call is needed.

First contact (``init_remote``/``from_remote_init``, ``broadcast``, ``all_gather``,
``gather_and_stack``, ``scatter``) sends the structure as the JSON description of
``meta.json`` in a uint8 tensor, never a pickle, then the data. This wire format is this
library's own: those calls work between tensordict-rs ranks (the reference pickles its
metadata). The collectives other than ``broadcast`` are in ``collectives.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Self

import torch
from torch import distributed as dist

from .. import _native
from ..memmap import value_nbytes
from . import packed as _packed
from . import wire
from .collectives import Collectives
from .wire import Peer, Pending

__all__ = ["Distributed"]

_CPU = torch.device("cpu")


# A tree with nested leaves goes point to point after a prelude of two int64 messages (tags
# ``init_tag`` and ``init_tag + 1``): the count of its nested leaves and the length of the
# next, then its ``Plan.nested_sizes()``; its data follows from ``init_tag + 2``. A receiving
# template whose sizes differ takes the data into scratch (so that the sender completes and
# no transport sees a message of an unexpected size, which gloo answers by aborting the
# process) and raises naming the key.
_PRELUDE = 2


def _post_prelude(plan: _packed.Plan, peer: Peer, init_tag: int) -> list[Any]:
    sizes = plan.nested_sizes()
    head = torch.tensor([len(plan.groups), len(sizes)], dtype=torch.int64, device=peer.device)
    body = torch.tensor(sizes, dtype=torch.int64, device=peer.device)
    return peer.send([head, body], [init_tag, init_tag + 1])


def _read_prelude(plan: _packed.Plan, peer: Peer, init_tag: int) -> list[int]:
    head = torch.empty(2, dtype=torch.int64, device=peer.device)
    wire.wait_all(peer.recv([head], [init_tag]))
    count, length = (int(x) for x in head.tolist())
    if count < 0 or length != 1 + 3 * count:
        raise _native.InvalidTreeError(
            "point-to-point message: its prelude of nested leaves is damaged "
            f"({count} leaves, {length} sizes)"
        )
    body = torch.empty(length, dtype=torch.int64, device=peer.device)
    wire.wait_all(peer.recv([body], [init_tag + 1]))
    return [int(x) for x in body.tolist()]


def _refuse_sizes(
    plan: _packed.Plan, theirs: list[int], peer: Peer, init_tag: int, pseudo: bool, whole: bool
) -> None:
    """Takes the sender's data (sizes ``theirs``) into scratch, then raises naming the first
    nested leaf whose sizes differ from this tree's."""
    mine = plan.nested_sizes()
    if theirs[0] < 0 or any(n < -1 for n in theirs):
        raise _native.InvalidTreeError("point-to-point message: negative sizes in its prelude")
    if whole:
        spans = wire.pieces(theirs[0])
        scratch = torch.empty(theirs[0], dtype=torch.uint8, device=peer.device)
        tags = range(init_tag + _PRELUDE, init_tag + _PRELUDE + len(spans))
        wire.wait_all(peer.recv([scratch[lo:hi] for lo, hi in spans], tags))
    else:
        nbytes = [n for n in theirs[1:] if n >= 0]
        nbytes += [value_nbytes(v) for _, _, v in plan.leaves[plan._nested_leaves() :]]
        bufs = [torch.empty(n, dtype=torch.uint8, device=peer.device) for n in nbytes]
        wire.wait_all(peer.recv(bufs, wire.tags(init_tag + _PRELUDE, len(bufs), pseudo)))
    groups = plan.groups
    if len(theirs) != len(mine):
        raise _native.InvalidTreeError(
            f"point-to-point message: the sender's tree has {(len(theirs) - 1) // 3} nested "
            f"leaves, this one {len(groups)} ({', '.join('.'.join(p) for p, _, _ in groups)})"
        )
    for i, (path, _, _) in enumerate(groups):
        if theirs[1 + 3 * i : 4 + 3 * i] != mine[1 + 3 * i : 4 + 3 * i]:
            raise _native.InvalidTreeError(
                f"key {'.'.join(path)!r}: the nested leaf received has other lengths than this "
                "tree's (its parts take other sizes): a tree receives into a nested leaf only "
                "components of the same shapes; receive a new tree instead (from_remote_init, "
                "broadcast without a template)"
            )
    raise _native.InvalidTreeError(
        f"point-to-point message: {theirs[0]} bytes, this tree's {mine[0]}: another tree"
    )


def _send(
    td: Any, peer: Peer, init_tag: int, pseudo_rand: bool, consolidated: bool, fresh: bool
) -> tuple[list[Any], int | None]:
    """Posts every message of ``td`` to ``peer``; returns the works and the last tag."""
    plan = _packed.plan(td)
    prelude: list[Any] = []
    if plan.groups:
        prelude = _post_prelude(plan, peer, init_tag)
        init_tag += _PRELUDE
    if consolidated:
        works, _ = wire.send_packed(plan, peer, init_tag, fresh)
        return prelude + works, None
    tensors = plan.tensors()
    tags = wire.tags(init_tag, len(tensors), pseudo_rand)
    return prelude + peer.send(tensors, tags), tags[-1] if tags else init_tag - 1


def _recv(
    td: Any, peer: Peer, init_tag: int, pseudo_rand: bool, consolidated: bool, fresh: bool
) -> tuple[list[Any], int | None]:
    """Posts every receive into ``td`` from ``peer``; returns the pending and the last tag."""
    plan = _packed.plan(td)
    if not plan.writable:
        raise RuntimeError("cannot receive into a read-only memory map")
    if plan.groups and peer.member:
        theirs = _read_prelude(plan, peer, init_tag)
        if theirs != plan.nested_sizes():
            _refuse_sizes(plan, theirs, peer, init_tag, pseudo_rand, consolidated)
        init_tag += _PRELUDE
    if consolidated:
        return [wire.recv_packed(plan, peer, init_tag, fresh)], None
    tensors, finish = plan.receivers()
    tags = wire.tags(init_tag, len(tensors), pseudo_rand)
    works = peer.recv(tensors, tags)
    if finish is not None and works:  # views received through copies: written after the rest
        works.append(Pending([(None, finish)]))
    return works, tags[-1] if tags else init_tag - 1


def _post_first_contact(
    td: Any, comm: torch.device, post: Callable[[torch.Tensor], Any]
) -> tuple[_packed.Plan, list[Any]]:
    """The sending side of a first contact: header and description posted at once (the
    caller posts the data right after); returns the tree's plan and the works.

    A tree that cannot be described is refused after its refusal header is sent, so that
    the receivers raise too instead of waiting (``wire.describe``)."""
    plan = _packed.plan(td)
    description, head, error = wire.describe(plan, comm)
    first = post(head)
    if error is not None:
        first.wait()  # the receivers read this header, raise, and wait for nothing more
        raise error
    return plan, [first, post(wire.bytes_tensor(description, comm))]


def _learn(
    cls: type[Any],
    comm: torch.device,
    post: Callable[[torch.Tensor], Any],
    post_data: Callable[[torch.Tensor], Pending],
    device: Any,
) -> Any:
    """The receiving side of a first contact: the header, then the description and the data
    received together; returns the new tree.

    On the CPU the arena is mapped and the data posted into it before the description is
    parsed, so that the data arrives while the tree is built; on a device, the data is posted
    as soon as the device buffer exists (``_packed.build``'s ``on_buffer``). ``post(t)``
    receives one message into ``t`` and returns something to ``wait()`` on; ``post_data``
    receives the data into a buffer (staged through ``comm`` when needed).
    """
    head = torch.empty(3, dtype=torch.int64, device=comm)
    post(head).wait()
    length, total = wire.check_header(head)
    text = torch.empty(length, dtype=torch.uint8, device=comm)
    text_work = post(text)
    target = None if device is None else torch.device(device)
    if target is not None and target != _CPU:  # views of one device buffer
        pending: list[Pending] = []

        def receive(whole: torch.Tensor) -> None:
            pending.append(post_data(whole))

        text_work.wait()
        td, _ = _packed.build(cls, wire.text_bytes(text), total, target, on_buffer=receive)
        for p in pending:
            p.wait()
        return _packed.settle(td)
    arena = _packed.arena(total)
    data = post_data(arena[1])
    try:
        text_work.wait()
        td, _ = _packed.build(cls, wire.text_bytes(text), total, into=arena)
    except BaseException:
        with contextlib.suppress(Exception):  # the data message is due all the same: take it
            data.wait()
        raise
    data.wait()
    return _packed.settle(td)


class Distributed(Collectives):
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
        ``consolidated=True`` the whole tree is one packed message (leaves gathered by the
        Rust core, no ``consolidate()`` needed); the receiver passes ``consolidated=True``
        too. ``group_dst`` is a rank in ``group`` instead of a global rank.

        Not run here: a point-to-point call needs a second rank (the README's torch.distributed
        recipe runs one).

        >>> td = TensorDict(w=torch.ones(3), b={"c": torch.zeros(1)})  # doctest: +SKIP
        >>> td.send(1)  # on rank 0; rank 1 calls out.recv(0)  # doctest: +SKIP
        >>> td.send(1, consolidated=True)  # rank 1: recv(0, consolidated=True)  # doctest: +SKIP
        """
        peer = Peer(dst, group, group_dst, "dst", "group_dst")
        works, _ = _send(self, peer, init_tag, pseudo_rand, consolidated, fresh=False)
        wire.wait_all(works)

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

        Not run here: a point-to-point call needs a second rank (the README's torch.distributed
        recipe runs one).

        >>> out = TensorDict(w=torch.zeros(3), b={"c": torch.zeros(1)})  # doctest: +SKIP
        >>> out.recv(0)  # on rank 1, while rank 0 calls td.send(1)  # doctest: +SKIP
        1
        >>> out["w"]  # doctest: +SKIP
        tensor([1., 1., 1.])
        """
        peer = Peer(src, group, group_src, "src", "group_src")
        works, tag = _recv(self, peer, init_tag, pseudo_rand, consolidated, fresh=False)
        wire.wait_all(works)
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

        Not run here: a point-to-point call needs a second rank (the README's torch.distributed
        recipe runs one).

        >>> td = TensorDict(w=torch.ones(3), b={"c": torch.zeros(1)})  # doctest: +SKIP
        >>> works = td.isend(1, return_early=True)  # rank 1: out.irecv(0)  # doctest: +SKIP
        >>> for work in works: work.wait()  # doctest: +SKIP
        """
        peer = Peer(dst, group, group_dst, "dst", "group_dst")
        works, tag = _send(self, peer, init_tag, pseudo_rand, consolidated, fresh=return_early)
        if return_early:
            return works
        wire.wait_all(works)
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

        Not run here: a point-to-point call needs a second rank (the README's torch.distributed
        recipe runs one).

        >>> out = TensorDict(w=torch.zeros(3), b={"c": torch.zeros(1)})  # doctest: +SKIP
        >>> pending = out.irecv(0, return_premature=True)  # rank 0: td.isend(1)  # doctest: +SKIP
        >>> for p in pending: p.wait()  # doctest: +SKIP
        >>> out["w"]  # doctest: +SKIP
        tensor([1., 1., 1.])
        """
        peer = Peer(src, group, group_src, "src", "group_src")
        fresh = return_premature
        works, _ = _recv(self, peer, init_tag, pseudo_rand, consolidated, fresh=fresh)
        if return_premature:
            return works
        wire.wait_all(works)
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
        as one packed message. Later batches go with ``send(consolidated=True)`` into the
        tree that ``from_remote_init`` returned. ``use_broadcast=True`` calls ``broadcast``.

        Not run here: a point-to-point call needs a second rank (the README's torch.distributed
        recipe runs one).

        >>> td = TensorDict(w=torch.ones(3), b={"c": torch.zeros(1)})  # doctest: +SKIP
        >>> td.init_remote(dst=1)  # rank 1: TensorDict.from_remote_init(src=0)  # doctest: +SKIP
        >>> td.send(1, consolidated=True)  # later batches, into that tree  # doctest: +SKIP
        """
        if use_broadcast:
            self.broadcast(src=dist.get_rank(group=group), group=group, device=device)
            return
        if dst is None:
            raise ValueError("init_remote needs `dst` (or use_broadcast=True).")
        peer = Peer(dst, group, None, "dst", "group_dst")
        if device is not None:
            peer.device = torch.device(device)

        # header, description and data posted at once: the receiver parses the description
        # while the data arrives (the same messages and tags as one blocking send each)
        def post(t: torch.Tensor) -> Pending:
            return Pending([(w, None) for w in peer.send([t], [0])])

        plan, works = _post_first_contact(self, peer.device, post)
        data, _ = wire.send_packed(plan, peer, 0, fresh=False)
        wire.wait_all(works + data)

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

        Not run here: a point-to-point call needs a second rank (the README's torch.distributed
        recipe runs one).

        >>> out = TensorDict.from_remote_init(src=0)  # rank 0: init_remote(1)  # doctest: +SKIP
        >>> out["w"]  # slices of one anonymous map  # doctest: +SKIP
        MemoryMappedTensor([1., 1., 1.])
        >>> out.recv(0, consolidated=True)  # the next batches, no copy  # doctest: +SKIP
        """
        if use_broadcast:
            return cls().broadcast(src=src, group=group, device=device)
        peer = Peer(src, group, None, "src", "group_src")
        if not peer.member:  # nothing would arrive: no tree to return
            raise ValueError(
                f"from_remote_init: this rank (global rank {dist.get_rank()}) is not in "
                "`group`, so no tree can be received from it"
            )
        if device is not None:
            peer.device = torch.device(device)

        def post(t: torch.Tensor) -> Pending:
            return Pending([(w, None) for w in peer.recv([t], [0])])

        def post_data(whole: torch.Tensor) -> Pending:
            return wire.recv_whole(whole, peer, 0)

        return _learn(cls, peer.device, post, post_data, device)

    # ------------------------------------------------------------------ broadcast (the other
    # collectives, in ``collectives.Collectives``, are mixed in through the base class)

    def broadcast(self, src: int, *, group: Any = None, device: Any = None) -> Self:
        """Sends rank ``src``'s tree to every rank of the group; returns it on each rank.

        Every rank calls it; the others need not know the structure. Rank ``src`` gets
        ``self`` back, the others a new tree (leaves in one buffer).
        """
        comm = wire.comm_device(group)

        def post(t: torch.Tensor) -> Any:
            return dist.broadcast(t, src=src, group=group, async_op=True)

        if dist.get_rank(group=group) == src:
            # header, description and data at once, as ``init_remote`` posts them
            plan, works = _post_first_contact(self, comm, post)
            if plan.total:
                works.append(post(wire.to(plan.pack(), comm)))
            wire.wait_all(works)
            return self

        def post_data(whole: torch.Tensor) -> Pending:
            if not whole.numel():
                return Pending([])
            if whole.device == comm:
                return Pending([(post(whole), None)])
            staged = torch.empty_like(whole, device=comm)

            def unstage() -> None:
                whole.copy_(staged)

            return Pending([(post(staged), None), (None, unstage)])

        return _learn(type(self), comm, post, post_data, device)
