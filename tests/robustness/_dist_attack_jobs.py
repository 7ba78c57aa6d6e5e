"""The rank side of robustness/test_dist_attacks.py: first contacts that fail on one side.

Each case runs in a group whose gloo timeout is a few seconds, so that a rank left waiting
for a message that never comes fails the job quickly instead of hanging it.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import torch
from torch import distributed as dist

from ..share._dist_jobs import same

SHORT = datetime.timedelta(seconds=10)
LIMIT = 4096  # the description limit both ranks use here (the real one is 64 MiB)


def _raises(kind: type[BaseException], call: Any) -> BaseException:
    try:
        call()
    except kind as e:
        return e
    raise AssertionError(f"{call} did not raise {kind.__name__}")


def _good(T: Any, fill: int) -> Any:
    return T.TensorDict({"a": torch.arange(5) + fill, "n": {"b": torch.ones(2, 3) * fill}}, [])


def refused_first_contacts(T: Any, rank: int, world: int, tmp: Path) -> None:
    """A tree whose description is too long, or cannot be written at all (a reserved key),
    fails on both ranks, none waits forever, and the next exchange is not confused by
    messages left over from the failed one."""
    from tensordict_rs import NonTensorData, TensorDictError
    from tensordict_rs.share import packed as _packed
    from tensordict_rs.share import packed_description

    _packed.DESCRIPTION_LIMIT = LIMIT
    group = dist.new_group(timeout=SHORT)
    long = T.TensorDict({"a": torch.ones(3), "text": NonTensorData("x" * 2 * LIMIT)}, [])
    reserved = T.TensorDict({"shape": torch.ones(3), "a": torch.zeros(2)}, [])
    deep = T.TensorDict({"x": torch.ones(2)}, [])
    for _ in range(packed_description.JSON_DEPTH):  # deeper than a receiver parses
        deep = T.TensorDict({"n": deep}, [])
    # point to point: too long, a reserved key, too deep, then a good tree
    for bad in (long, reserved, deep):
        if rank == 0:
            _raises(TensorDictError, lambda bad=bad: bad.init_remote(dst=1, group=group))
        else:
            _raises(TensorDictError, lambda: T.TensorDict.from_remote_init(src=0, group=group))
    if rank == 0:
        _good(T, 3).init_remote(dst=1, group=group)
    else:
        same(T.TensorDict.from_remote_init(src=0, group=group), _good(T, 3))
    # broadcast: rank 0's tree too long, then a good one
    mine = long if rank == 0 else T.TensorDict()
    _raises(TensorDictError, lambda: mine.broadcast(0, group=group))
    got = (_good(T, 4) if rank == 0 else T.TensorDict()).broadcast(0, group=group)
    same(got, _good(T, 4))
    # all_gather: rank 1's tree has a reserved key; every rank raises, then a good one
    mine = reserved if rank == 1 else _good(T, rank)
    _raises(TensorDictError, lambda: mine.all_gather(group=group))
    for r, td in enumerate(_good(T, rank).all_gather(group=group)):
        same(td, _good(T, r))
    # gather_and_stack: a non-destination rank's tree too long
    rows = T.TensorDict({"a": torch.zeros(world - 1, 5, dtype=torch.int64)}, [world - 1])
    row = T.TensorDict({"a": torch.arange(5) + rank, "text": NonTensorData("y" * 2 * LIMIT)}, [])
    _raises(TensorDictError, lambda: (rows if rank == 0 else row).gather_and_stack(0, group))
    dist.barrier(group=group)


def _open_fds() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def repeated_first_contacts(T: Any, rank: int, world: int, tmp: Path) -> None:
    """200 first contacts and consolidated sends into the received trees: the receiver's
    open descriptors and memory stay flat (every received tree's arena is unmapped when the
    tree goes)."""
    import gc

    rounds = 200
    src = T.TensorDict(
        {f"k{i}": torch.full((64 + i,), float(i)) for i in range(20)}
        | {"n": {"x": torch.arange(1 << 16, dtype=torch.int32)}},  # 256 KiB
        [],
    )
    fds = rss = 0
    for i in range(rounds):
        if i == 20:  # after the first rounds warmed every cache up
            gc.collect()
            fds, rss = _open_fds(), _rss_bytes()
        if rank == 0:
            src.init_remote(dst=1)
            src.send(1, consolidated=True)
        else:
            got = T.TensorDict.from_remote_init(src=0)
            got.recv(0, consolidated=True)
            assert got["n", "x"][-1].item() == (1 << 16) - 1
            del got
    gc.collect()
    if rank == 1:
        assert _open_fds() <= fds, (fds, _open_fds())
        grown, kept = _rss_bytes() - rss, (rounds - 20) * src["n", "x"].nbytes
        assert grown < kept // 4, f"{grown} bytes more after {rounds - 20} trees"


def non_member(T: Any, rank: int, world: int, tmp: Path) -> None:
    """A rank outside a group that calls ``from_remote_init`` on it gets a clear error (it
    cannot receive a tree from that group), and the members exchange as usual."""
    sub = dist.new_group([0, 1], timeout=SHORT)
    if rank == 0:
        _good(T, 1).init_remote(dst=1, group=sub)
    elif rank == 1:
        same(T.TensorDict.from_remote_init(src=0, group=sub), _good(T, 1))
    else:
        error = _raises(ValueError, lambda: T.TensorDict.from_remote_init(src=0, group=sub))
        assert "not in" in str(error), error


def _strided(T: Any, fill: float) -> Any:
    """A tree of views no transport takes as they are: a transposed, a strided, a conjugated
    and a negated view (the last two of real-valued bytes that torch keeps lazily)."""
    base = torch.arange(24.0).view(4, 6) + fill
    z = torch.complex(torch.arange(3.0) + fill, torch.ones(3))
    return T.TensorDict(
        {"t": base.t(), "s": base[:, ::2], "c": z.conj(), "n": {"z": torch.zeros(3), "k": base[1]}},
        [],
    )


def strided_leaves_per_leaf(T: Any, rank: int, world: int, tmp: Path) -> None:
    """The per-leaf protocol with non-contiguous and conjugated leaves on both sides: sent as
    their values (a contiguous copy) and received into the views, with the same messages as
    contiguous leaves (so a tensordict rank interoperates); consolidated too."""
    group = dist.new_group(timeout=SHORT)
    for consolidated in (False, True):
        if rank == 0:
            _strided(T, 1.0).send(1, group=group, consolidated=consolidated)
        else:
            out = _strided(T, 0.0)
            out.recv(0, group=group, consolidated=consolidated)
            want = _strided(T, 1.0)
            for key in want.keys(include_nested=True, leaves_only=True):
                assert torch.equal(out[key].resolve_conj(), want[key].resolve_conj()), key
            assert out["t"]._base is not None and out["c"].is_conj()  # still the views
