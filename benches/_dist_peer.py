"""The other rank of bench_distributed.py: receives what each case sends, then acknowledges.

Commands arrive as int64 [case, repetitions] before each timed call (untimed on the sender's
side: they are sent in the case's setup); case 0 ends the process. A tree received by a first
contact (either package's) is freed after the ack, as the harness drops every result outside
the timed call.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
from torch import distributed as dist

STOP, REF_CONS, RS_CONS, ONE_TENSOR, REF_LEAF, RS_LEAF, REF_INIT, RS_INIT, RS_AFTER_INIT = range(9)
RS_CONS_WHOLE = 9
RS_MEMMAP = 10  # into a tree memory-mapped without a prefix (received into its arena)


def serve(port: int, leaves_last: int, leaf_last: int, total_bytes: int) -> None:
    """Rank 1: builds the receiving trees, then serves commands until STOP."""
    import tensordict
    import tensordict_rs
    from _harness import build_w3, ref_td, rs_td

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=1,
        world_size=2,
        timeout=datetime.timedelta(seconds=600),
    )
    big = build_w3(leaves_last)
    small = build_w3(leaf_last)
    ref_cons = ref_td(big, []).consolidate(metadata=True)
    rs_plain = rs_td(big, [])
    rs_whole = _one_buffer_tree(rs_plain)
    rs_mapped = rs_td(big, []).memmap_()
    ref_small, rs_small = ref_td(small, []), rs_td(small, [])
    one = torch.empty(total_bytes, dtype=torch.uint8)
    remote: Any = None
    ack = torch.ones(1)
    command = torch.empty(2, dtype=torch.int64)
    while True:
        dist.recv(command, src=0)
        case, reps = command.tolist()
        if case == STOP:
            break
        for _ in range(reps):
            made: Any = None  # a received tree: freed after the ack, outside the timed call
            if case == REF_CONS:
                ref_cons.recv(src=0, consolidated=True)
            elif case == RS_CONS:
                rs_plain.recv(src=0, consolidated=True)
            elif case == RS_CONS_WHOLE:
                rs_whole.recv(src=0, consolidated=True)
            elif case == ONE_TENSOR:
                dist.recv(one, src=0)
            elif case == REF_LEAF:
                ref_small.recv(src=0)
            elif case == RS_LEAF:
                rs_small.recv(src=0)
            elif case == REF_INIT:
                made = tensordict.TensorDict.from_remote_init(src=0)
            elif case == RS_INIT:
                made = tensordict_rs.TensorDict.from_remote_init(src=0)
            elif case == RS_AFTER_INIT:
                remote.recv(src=0, consolidated=True)
            elif case == RS_MEMMAP:
                rs_mapped.recv(src=0, consolidated=True)
            dist.send(ack, dst=0)
            if case == RS_INIT:
                remote = made  # the previous tree goes now
            del made
    dist.destroy_process_group()


def _one_buffer_tree(like: Any) -> Any:
    """A tree of ``like``'s structure with every leaf in one buffer, as ``from_remote_init``
    builds it (made here from the description, without a first contact)."""
    from tensordict_rs.share import packed as _packed

    plan = _packed.plan(like)
    td, _ = _packed.build(type(like), plan.description(), plan.total)
    return td
