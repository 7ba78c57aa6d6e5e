"""torch.distributed over gloo on 127.0.0.1, two processes: this one sends, a spawned peer
(``_dist_peer.py``) receives and acknowledges each message (the ack is in the timed call, for
every case alike, so the receiver's work counts).

* W3 (10,000 x 1 KiB leaves) with ``send(consolidated=True)`` from a plain tree into a tree in
  one buffer (the tree ``from_remote_init`` returns), against the reference's
  ``send(consolidated=True)`` (it consolidates on every call; its receiver keeps a
  consolidated copy), limit: one tensor of the same bytes. Then the same into a plain tree
  (the receiver scatters; context).
* W3 memmap_()'d without a prefix on both sides (context): sent from the sender's arena and
  received into the receiver's with no pack or scatter; the reference's tree memmap_()'d under
  a prefix in /dev/shm, into its consolidated receiver; limit: one tensor of the same bytes.
* The default per-leaf protocol, W3 shrunk to 200 leaves (each message costs ~0.3-1 ms here).
* ``init_remote`` + ``from_remote_init`` of W3, limit: one later ``send(consolidated=True)``
  into the received tree; once with the same sender tree every round (its description
  cached, as for a tree initialized on several peers), once with a new tree every round.
"""

from __future__ import annotations

import multiprocessing
import socket

import pytest
import torch
from _dist_peer import (
    ONE_TENSOR,
    REF_CONS,
    REF_INIT,
    REF_LEAF,
    RS_AFTER_INIT,
    RS_CONS,
    RS_CONS_WHOLE,
    RS_INIT,
    RS_LEAF,
    RS_MEMMAP,
    STOP,
    serve,
)
from _harness import SHM_BASE, Case, build_w3, fresh_dir, measure, ref_td, replay, rs_td, w3_last
from _workloads import CASES, LIMIT, REF, RS
from torch import distributed as dist

LEAF_LAST = 2  # 10 x 10 x 2 = 200 leaves for the per-leaf protocol
REPS = 3  # messages per timed call


@pytest.fixture(scope="module")
def peer():
    """The process group with the receiving rank; stopped after the module."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    big = build_w3()
    total = sum(t.nbytes for t in _leaves(big))
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=serve, args=(port, w3_last(), LEAF_LAST, total), daemon=True)
    proc.start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
    try:
        yield big, total
    finally:
        dist.send(torch.tensor([STOP, 0]), dst=1)
        dist.destroy_process_group()
        proc.join(30)
        if proc.is_alive():
            proc.kill()


def _leaves(tree):
    for value in tree.values():
        if isinstance(value, dict):
            yield from _leaves(value)
        else:
            yield value


def _case(code: int, reps: int, send) -> Case:
    ack = torch.empty(1)

    def setup():
        dist.send(torch.tensor([code, reps]), dst=1)

    def call(_):
        for _ in range(reps):
            send()
            dist.recv(ack, src=1)

    return Case(call=call, setup=setup)


def _consolidated_cases(big, total, into=RS_CONS_WHOLE):
    ref, rs = ref_td(big, []), rs_td(big, [])
    one = torch.zeros(total, dtype=torch.uint8)
    return {
        REF: _case(REF_CONS, REPS, lambda: ref.send(dst=1, consolidated=True)),
        RS: _case(into, REPS, lambda: rs.send(dst=1, consolidated=True)),
        LIMIT: _case(ONE_TENSOR, REPS, lambda: dist.send(one, dst=1)),
    }


def _memmap_cases(big, total):
    # the reference's anonymous memmap_() opens 2 files per leaf (past the fd limit for W3):
    # its tree is mapped under a prefix in /dev/shm instead
    ref = ref_td(big, []).memmap_(fresh_dir(SHM_BASE))
    rs = rs_td(big, []).memmap_()
    one = torch.zeros(total, dtype=torch.uint8)
    return {
        REF: _case(REF_CONS, REPS, lambda: ref.send(dst=1, consolidated=True)),
        RS: _case(RS_MEMMAP, REPS, lambda: rs.send(dst=1, consolidated=True)),
        LIMIT: _case(ONE_TENSOR, REPS, lambda: dist.send(one, dst=1)),
    }


def _per_leaf_cases():
    small = build_w3(LEAF_LAST)
    ref, rs = ref_td(small, []), rs_td(small, [])
    one = torch.zeros(sum(t.nbytes for t in _leaves(small)), dtype=torch.uint8)
    return {
        REF: _case(REF_LEAF, 1, lambda: ref.send(dst=1)),
        RS: _case(RS_LEAF, 1, lambda: rs.send(dst=1)),
        LIMIT: _case(ONE_TENSOR, 1, lambda: dist.send(one, dst=1)),
    }


def _init_cases(big):
    ref, rs = ref_td(big, []), rs_td(big, [])
    started = {"done": False}

    def after_init():
        rs.send(dst=1, consolidated=True)

    limit = _case(RS_AFTER_INIT, 1, after_init)
    first = _case(RS_INIT, 1, lambda: rs.init_remote(dst=1))
    plain_setup = limit.setup

    def limit_setup():
        if not started["done"]:  # the peer needs a received tree to send into
            first.setup()
            first.call(None)
            started["done"] = True
        plain_setup()

    return {
        REF: _case(REF_INIT, 1, lambda: ref.init_remote(dst=1)),
        RS: first,
        LIMIT: Case(call=limit.call, setup=limit_setup),
    }


def _fresh_init_cases(big):
    """init_remote of a tree never sent before (a new structure each round: the walk, the
    copy plan and the description are all made in the timed call)."""
    cases = _init_cases(big)
    ack = torch.empty(1)

    def setup():
        dist.send(torch.tensor([RS_INIT, 1]), dst=1)
        return rs_td(big, [])  # new nodes: nothing cached

    def call(tree):
        tree.init_remote(dst=1)
        dist.recv(ack, src=1)

    cases[RS] = Case(call=call, setup=setup)
    return cases


@pytest.mark.parametrize("case", CASES)
def test_send_consolidated(benchmark, case, peer):
    big, total = peer
    leaves = len(list(_leaves(big)))
    measure("dist_consolidated", leaves * REPS, lambda: _consolidated_cases(big, total))
    replay(benchmark, "dist_consolidated", case)


@pytest.mark.parametrize("case", CASES)
def test_send_consolidated_into_plain_tree(benchmark, case, peer):
    big, total = peer
    leaves = len(list(_leaves(big)))
    cases = lambda: _consolidated_cases(big, total, into=RS_CONS)  # noqa: E731
    measure("dist_consolidated_plain", leaves * REPS, cases)
    replay(benchmark, "dist_consolidated_plain", case)


@pytest.mark.parametrize("case", CASES)
def test_send_consolidated_memmap(benchmark, case, peer):
    big, total = peer
    leaves = len(list(_leaves(big)))
    measure("dist_memmap", leaves * REPS, lambda: _memmap_cases(big, total))
    replay(benchmark, "dist_memmap", case)


@pytest.mark.parametrize("case", CASES)
def test_send_per_leaf(benchmark, case, peer):
    measure("dist_per_leaf", 100 * LEAF_LAST, _per_leaf_cases)
    replay(benchmark, "dist_per_leaf", case)


@pytest.mark.parametrize("case", CASES)
def test_init_remote(benchmark, case, peer):
    big, _ = peer
    measure("dist_init_remote", len(list(_leaves(big))), lambda: _init_cases(big))
    replay(benchmark, "dist_init_remote", case)


@pytest.mark.parametrize("case", CASES)
def test_init_remote_fresh_tree(benchmark, case, peer):
    big, _ = peer
    measure("dist_init_fresh", len(list(_leaves(big))), lambda: _fresh_init_cases(big))
    replay(benchmark, "dist_init_fresh", case)
