"""W4, a replay-buffer dataset (200,000 rows x 12,322 bytes = 2.3 GiB at full scale).

Random batches of 256 rows, ``td[idx]``, from a memory-mapped copy in /dev/shm.
"""

from __future__ import annotations

import gc

import pytest
import tensordict
import tensordict_rs
import torch
from _harness import (
    SHM_BASE,
    Case,
    build_w4,
    fresh_dir,
    measure,
    read_all,
    ref_td,
    remove,
    replay,
    td_leaves,
    w4_batches,
    w4_rows,
)
from _workloads import CASES, LIMIT, REF, RS

BATCH = 256


@pytest.fixture(scope="module")
def w4_saved():
    """W4 built, saved by the reference under /dev/shm, and the source freed again."""
    path = fresh_dir(SHM_BASE)
    src = build_w4()
    ref_td(src, [w4_rows()]).memmap_(path)
    del src
    gc.collect()
    yield path
    remove(path)


def _batch_cases(path, into_buffer: bool = False) -> dict[str, Case]:
    ref = tensordict.TensorDict.load_memmap(path)
    rs = tensordict_rs.TensorDict.load_memmap(path)
    third = tensordict.TensorDict.load_memmap(path)  # the limit's own mapping
    plain = [t.as_subclass(torch.Tensor) for t in td_leaves(third)]
    for leaves in (td_leaves(ref), td_leaves(rs), plain):
        read_all(leaves)  # fault every page in once, untimed: each mapping starts warm
    gen = torch.Generator().manual_seed(0)
    indices = [torch.randint(0, w4_rows(), (BATCH,), generator=gen) for _ in range(w4_batches())]
    outs = [torch.empty((BATCH, *t.shape[1:]), dtype=t.dtype) for t in plain]
    pairs = list(zip(plain, outs, strict=True))

    def batches(td):
        def call(_):
            for idx in indices:
                td[idx]

        return call

    def limit(_):
        for idx in indices:
            for leaf, out in pairs:
                torch.index_select(leaf, 0, idx, out=out)

    def gather_into(td):
        buf = td[indices[0]]  # the reusable batch, allocated once (untimed)

        def call(_):
            for idx in indices:
                td.index_select(0, idx, out=buf)

        return call

    ours = gather_into(rs) if into_buffer else batches(rs)
    return {REF: Case(call=batches(ref)), RS: Case(call=ours), LIMIT: Case(call=limit)}


@pytest.mark.parametrize("case", CASES)
def test_w4_random_batches(benchmark, case, w4_saved):
    rows = BATCH * w4_batches()
    measure("w4_batches", rows, lambda: _batch_cases(w4_saved), batch=BATCH, dataset_rows=w4_rows())
    replay(benchmark, "w4_batches", case)


@pytest.mark.parametrize("case", CASES)
def test_w4_random_batches_into_buffer(benchmark, case, w4_saved):
    rows = BATCH * w4_batches()
    measure(
        "w4_batches_out",
        rows,
        lambda: _batch_cases(w4_saved, into_buffer=True),
        batch=BATCH,
        dataset_rows=w4_rows(),
    )
    replay(benchmark, "w4_batches_out", case)


def test_w4_batch_sanity(w4_saved):
    """Both libraries gather the same rows (not timed)."""
    ref = tensordict.TensorDict.load_memmap(w4_saved)
    rs = tensordict_rs.TensorDict.load_memmap(w4_saved)
    idx = torch.randint(0, w4_rows(), (BATCH,), generator=torch.Generator().manual_seed(1))
    a, b = ref[idx], rs[idx]
    for key in ("obs", "action", "reward", "done", ("next", "reward"), ("next", "done")):
        assert torch.equal(a[key], b[key]), key
