"""The 2-rank gloo job of ``test_nested_packed.py``: nested leaves through every torch.distributed
call that carries one message (first contact, broadcast, all_gather, scatter, point to point
into a template, per leaf and consolidated)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import distributed as dist

warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")


def nested_tree(T: Any, fill: int, lengths: tuple[int, ...] = (3, 0, 5)) -> Any:
    """Jagged (ragged dim 1 and 2, a view with holes), strided nested and dense leaves; values
    depend on ``fill``."""
    n = len(lengths)
    seq = torch.nested.nested_tensor(
        [torch.arange(k, dtype=torch.float32) + fill for k in lengths], layout=torch.jagged
    )
    wide = torch.nested.nested_tensor(
        [torch.full((2, k + 1), float(fill)) for k in lengths], layout=torch.jagged
    )
    base = torch.arange(4.0 * n).view(n, 4) + fill
    holes = torch.nested.narrow(
        base, 1, torch.arange(n) % 2, torch.full((n,), 2), layout=torch.jagged
    )
    table = torch.nested.nested_tensor(
        [torch.full((k + 1, 2), float(fill), dtype=torch.float64) for k in lengths]
    )
    return T.TensorDict(
        {
            "seq": seq,
            "x": torch.arange(n * 2).view(n, 2) + fill,
            "sub": {"wide": wide, "holes": holes, "table": table},
        },
        [n],
    )


def same_nested(a: Any, b: Any) -> None:
    """Every leaf of ``a`` equals ``b``'s: components, layout, offsets, lengths, ragged dim."""
    keys = sorted(a.keys(include_nested=True, leaves_only=True), key=str)
    assert keys == sorted(b.keys(include_nested=True, leaves_only=True), key=str)
    for key in keys:
        x, y = a.get(key), b.get(key)
        assert x.is_nested == y.is_nested and x.layout == y.layout, key
        if not x.is_nested:
            assert torch.equal(x, y), key
            continue
        assert len(x.unbind()) == len(y.unbind())
        for u, v in zip(x.unbind(), y.unbind(), strict=True):
            assert torch.equal(u, v), key
        if x.layout == torch.jagged:
            assert x._ragged_idx == y._ragged_idx, key
            assert torch.equal(x.offsets(), y.offsets()), key
            lx, ly = x.lengths(), y.lengths()
            assert (lx is None) == (ly is None) and (lx is None or torch.equal(lx, ly)), key


def nested(T: Any, rank: int, world: int, tmp: Path) -> None:
    assert world == 2
    # pinned to loopback by the parent: the group's store and gloo's device both
    assert os.environ.get("GLOO_SOCKET_IFNAME") == "lo"
    assert os.environ.get("MASTER_ADDR", "127.0.0.1") == "127.0.0.1"
    assert dist.get_backend() == "gloo"
    mine = nested_tree(T, 10 * rank, (3, 0, 5) if rank == 0 else (1, 4, 2))
    theirs = nested_tree(T, 10 * (1 - rank), (1, 4, 2) if rank == 0 else (3, 0, 5))

    # first contact: structure and values, lengths unknown to the receiver
    if rank == 0:
        mine.init_remote(dst=1)
    else:
        got = T.TensorDict.from_remote_init(src=0)
        same_nested(got, theirs)
        assert got.is_consolidated()
        # the next batch, same lengths, new values: into that tree, in place
        nxt = T.TensorDict.from_remote_init(src=0)
        same_nested(nxt, nested_tree(T, 7, (3, 0, 5)))
        got.recv(0, consolidated=True)
        same_nested(got, nested_tree(T, 7, (3, 0, 5)))
    if rank == 0:
        again = nested_tree(T, 7, (3, 0, 5))
        again.init_remote(dst=1)
        again.send(1, consolidated=True)

    # broadcast and all_gather: each rank's own lengths
    out = mine.broadcast(src=0) if rank == 0 else T.TensorDict().broadcast(src=0)
    same_nested(out, mine if rank == 0 else theirs)
    trees = mine.all_gather()
    same_nested(trees[rank], mine)
    same_nested(trees[1 - rank], theirs)

    # scatter from rank 1: one tree per rank
    parts = [nested_tree(T, 30 + r, (r + 1, 2)) for r in range(world)] if rank == 1 else None
    got = T.TensorDict().scatter(1, parts)
    same_nested(got, nested_tree(T, 30 + rank, (rank + 1, 2)))

    # point to point into a template of the same lengths: per leaf and consolidated
    for consolidated in (False, True):
        if rank == 0:
            nested_tree(T, 5, (3, 0, 5)).send(1, consolidated=consolidated)
        else:
            template = nested_tree(T, 0, (3, 0, 5))
            template.recv(0, consolidated=consolidated)
            same_nested(template, nested_tree(T, 5, (3, 0, 5)))

    # a template whose lengths differ, with the same number of values or another: refused
    # naming the key, nothing written into the template, the sender done (the receiver takes
    # the data aside: gloo would abort a process that receives a message of another size)
    for consolidated, other in [(c, o) for o in ((0, 5, 3), (1, 1, 1)) for c in (False, True)]:
        if rank == 0:
            nested_tree(T, 6, (3, 0, 5)).send(1, consolidated=consolidated)
        else:
            template = nested_tree(T, 0, other)
            try:
                template.recv(0, consolidated=consolidated)
            except T.InvalidTreeError as e:
                assert "'seq'" in str(e) or "'sub." in str(e), e
            else:
                raise AssertionError("a template of other lengths received a nested leaf")
            same_nested(template, nested_tree(T, 0, other))
    for consolidated in (True, False):  # the next message between the two arrives whole
        if rank == 0:
            nested_tree(T, 8, (1, 1, 1)).isend(1, consolidated=consolidated, init_tag=50)
        else:
            template = nested_tree(T, 0, (1, 1, 1))
            template.irecv(0, consolidated=consolidated, init_tag=50)
            same_nested(template, nested_tree(T, 8, (1, 1, 1)))

    # gather_and_stack: rank 0's tree has one row per other rank, and a row of a nested leaf
    # is written in place where its length is the row's (rank 1 sends its tree's row 0)
    def one_row(fill: int, k: int) -> Any:
        seq = torch.nested.nested_tensor(
            [torch.arange(k, dtype=torch.float32) + fill], layout=torch.jagged
        )
        return T.TensorDict({"seq": seq, "x": torch.full((1, 2), fill)}, [1])

    if rank == 0:
        rows = one_row(0, 3)
        assert rows.gather_and_stack(0) is rows
        same_nested(rows, one_row(9, 3))
    else:
        assert one_row(9, 3)[0].gather_and_stack(0) is None
