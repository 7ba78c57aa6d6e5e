"""W4, a replay-buffer dataset (200,000 rows x 12,322 bytes = 2.3 GiB at full scale).

Random batches of 256 rows, ``td[idx]``, from a memory-mapped copy in /dev/shm.
"""

from __future__ import annotations

import gc
import threading

import pytest
import tensordict
import tensordict_rs
import torch
from _harness import (
    SCALE,
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


def b50k_rows() -> int:
    return max(1024, int(50_000 * SCALE))


@pytest.fixture(scope="module")
def b50k_saved():
    """A 50,000-row dataset of W4's layout, saved by the reference under /dev/shm."""
    path = fresh_dir(SHM_BASE)
    ref_td(build_w4(b50k_rows()), [b50k_rows()]).memmap_(path)
    gc.collect()
    yield path
    remove(path)


def _two_thread_copy(pairs: list, idx: torch.Tensor) -> None:
    """The plain parallel copy of the batch's rows: 2 threads, half the rows each."""
    half = idx.numel() // 2
    parts = ((idx[:half], 0, half), (idx[half:], half, idx.numel()))

    def work(part):
        rows, lo, hi = part
        for leaf, out in pairs:
            torch.index_select(leaf, 0, rows, out=out[lo:hi])

    other = threading.Thread(target=work, args=(parts[1],))
    other.start()
    work(parts[0])
    other.join()


def _b50k_cases(path) -> dict[str, Case]:
    ref = tensordict.TensorDict.load_memmap(path)
    rs = tensordict_rs.TensorDict.load_memmap(path)
    third = tensordict.TensorDict.load_memmap(path)  # the limit's own mapping
    plain = [t.as_subclass(torch.Tensor) for t in td_leaves(third)]
    for leaves in (td_leaves(ref), td_leaves(rs), plain):
        read_all(leaves)
    gen = torch.Generator().manual_seed(0)
    indices = [torch.randint(0, b50k_rows(), (BATCH,), generator=gen) for _ in range(w4_batches())]
    pairs = [(t, torch.empty((BATCH, *t.shape[1:]), dtype=t.dtype)) for t in plain]

    def batches(td):
        def call(_):
            for idx in indices:
                td[idx]

        return call

    def limit(_):
        for idx in indices:
            _two_thread_copy(pairs, idx)

    return {REF: Case(call=batches(ref)), RS: Case(call=batches(rs)), LIMIT: Case(call=limit)}


@pytest.mark.parametrize("case", CASES)
def test_b50k_random_batches(benchmark, case, b50k_saved):
    rows = BATCH * w4_batches()
    measure(
        "b50k_batches", rows, lambda: _b50k_cases(b50k_saved), batch=BATCH, dataset_rows=b50k_rows()
    )
    replay(benchmark, "b50k_batches", case)


def test_w4_batch_sanity(w4_saved):
    """Both libraries gather the same rows (not timed)."""
    ref = tensordict.TensorDict.load_memmap(w4_saved)
    rs = tensordict_rs.TensorDict.load_memmap(w4_saved)
    idx = torch.randint(0, w4_rows(), (BATCH,), generator=torch.Generator().manual_seed(1))
    a, b = ref[idx], rs[idx]
    for key in ("obs", "action", "reward", "done", ("next", "reward"), ("next", "done")):
        assert torch.equal(a[key], b[key]), key
