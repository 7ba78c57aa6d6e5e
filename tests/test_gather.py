"""Batches in one native call: ``td[idx]`` and ``index_select(0, idx, out=)`` of CPU trees.

Every result is compared with tensordict 0.15.3 (or torch) on the same data; the native path
is checked to be taken (or not) by counting calls to ``_native.gather_rows``.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest
import tensordict
import torch
from tensordict_rs import TensorDict, _gather, _native
from test_gil import MIN_TURNS, probe_thread

ROWS = 1000
DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.complex64, torch.complex128,
]  # fmt: skip


def _leaf(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 250, shape, generator=gen, dtype=torch.int64)
    if dtype.is_complex:
        return torch.complex(raw.double(), -raw.double()).to(dtype)
    return raw.to(dtype)


def _tree() -> dict:
    leaves = {f"x{i}": _leaf(d, (ROWS, 3, 5), i) for i, d in enumerate(DTYPES)}
    return {
        **leaves,
        "obs": _leaf(torch.float32, (ROWS, 3, 32, 32), 99),
        "next": {
            "done": _leaf(torch.bool, (ROWS, 1), 7),
            "deep": {"r": _leaf(torch.int64, (ROWS,), 8)},
        },
        "empty": torch.zeros(ROWS, 0),
    }


@pytest.fixture
def counted(monkeypatch):
    calls = []
    native = _native.gather_rows

    def gather_rows(*args):
        calls.append(args)
        return native(*args)

    monkeypatch.setattr(_native, "gather_rows", gather_rows)
    return calls


def _same(ours: TensorDict, ref) -> None:
    keys = ref.keys(include_nested=True, leaves_only=True)
    assert sorted(map(str, ours.keys(include_nested=True, leaves_only=True))) == sorted(
        map(str, keys)
    )
    for key in keys:
        a, b = ours[key], ref[key]
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert torch.equal(
            a.view(torch.uint8) if a.dtype == torch.bool else a,
            b.view(torch.uint8) if b.dtype == torch.bool else b,
        ), key
    assert ours.batch_size == ref.batch_size


INDICES = {
    "random": torch.randint(0, ROWS, (256,), generator=torch.Generator().manual_seed(0)),
    "sorted_runs": torch.cat([torch.arange(10, 110), torch.arange(500, 600)]),
    "duplicates": torch.tensor([3, 3, 3, 999, 0, 0] * 40),
    "negative": torch.arange(-256, 0),
    "list": list(range(0, 512, 2)),
    "int32": torch.arange(300, dtype=torch.int32),
}


@pytest.mark.parametrize("memmapped", [False, True], ids=["plain", "memmap"])
@pytest.mark.parametrize("name", list(INDICES))
def test_matches_reference(name, memmapped, counted, tmp_path: Path) -> None:
    tree = _tree()
    ref = tensordict.TensorDict(tree, batch_size=[ROWS])
    ours = TensorDict(tree, [ROWS])
    if memmapped:
        ours.memmap_(tmp_path / "ours")
        ours = TensorDict.load_memmap(tmp_path / "ours")  # lazy leaves
    idx = INDICES[name]
    _same(ours[idx], ref[idx if not isinstance(idx, list) else torch.tensor(idx)])
    assert len(counted) == 1


def test_one_copy_per_run_of_rows() -> None:
    # The Rust unit tests count the copies; here: a contiguous index gives the same bytes.
    td = TensorDict({"a": torch.arange(ROWS * 4.0).view(ROWS, 4)}, [ROWS])
    out = td[torch.arange(100, 900)]
    assert torch.equal(out["a"], td["a"][100:900])


def test_into_out_allocates_nothing(counted) -> None:
    tree = _tree()
    ours = TensorDict(tree, [ROWS])
    idx = INDICES["random"]
    out = ours[idx]
    pointers = [t.data_ptr() for t in out.values(include_nested=True, leaves_only=True)]
    idx2 = torch.randint(0, ROWS, (256,), generator=torch.Generator().manual_seed(5))
    assert ours.index_select(0, idx2, out=out) is out
    assert [t.data_ptr() for t in out.values(include_nested=True, leaves_only=True)] == pointers
    _same(out, tensordict.TensorDict(tree, batch_size=[ROWS])[idx2])
    assert len(counted) == 2


def test_into_memory_mapped_out(tmp_path: Path) -> None:
    src = TensorDict({"a": torch.arange(ROWS * 8.0).view(ROWS, 8)}, [ROWS])
    out = TensorDict({"a": torch.zeros(600, 8)}, [600]).memmap_(tmp_path / "out")
    idx = torch.arange(600).flip(0)
    src.index_select(0, idx, out=out)
    assert torch.equal(TensorDict.load_memmap(tmp_path / "out")["a"], src["a"][idx])


def test_out_of_range_raises_and_writes_nothing() -> None:
    td = TensorDict({"a": torch.zeros(ROWS, 64)}, [ROWS])
    out = TensorDict({"a": torch.ones(300, 64)}, [300])
    with pytest.raises(
        IndexError, match="index 1000 is out of bounds for dimension 0 with size 1000"
    ):
        td.index_select(0, torch.tensor([0] * 299 + [ROWS]), out=out)
    assert out["a"].eq(1).all()
    with pytest.raises(IndexError):
        td[torch.full((300,), -ROWS - 1)]


def test_out_overlapping_the_source_is_refused() -> None:
    t = torch.zeros(ROWS, 64)
    td = TensorDict({"a": t}, [ROWS])
    out = TensorDict({"a": t[:300]}, [300])
    with pytest.raises(ValueError, match="shares memory"):
        td.index_select(0, torch.arange(300), out=out)


@pytest.mark.parametrize(
    ("make", "rows"),
    [
        (lambda: TensorDict({"a": torch.rand(ROWS, 64, requires_grad=True)}, [ROWS]), 300),
        (lambda: TensorDict({"a": torch.rand(64, ROWS).t()}, [ROWS]), 300),  # strided view
        (lambda: TensorDict({"a": torch.rand(ROWS, 64)}, [ROWS]), 2),  # tiny batch
    ],
    ids=["requires_grad", "strided", "tiny"],
)
def test_torch_path_where_native_does_not_apply(make, rows, counted) -> None:
    td = make()
    idx = torch.arange(rows).flip(0)
    out = td[idx]
    assert torch.equal(out["a"], td["a"][idx])
    assert counted == []
    if td["a"].requires_grad:
        assert out["a"].requires_grad


def test_crossover_bound() -> None:
    # A batch is gathered natively from MIN_BYTES on; below it, torch's per-leaf path.
    td = TensorDict({"a": torch.zeros(ROWS, 256)}, [ROWS])  # 1 KiB rows
    rows = _gather.MIN_BYTES // 1024
    assert _gather._worth_it(td, rows) and not _gather._worth_it(td, rows - 1)


def test_gather_releases_gil(monkeypatch) -> None:
    big = torch.ones(4096, 16384)  # 256 MiB of 64 KiB rows
    td = TensorDict({"a": big}, [4096])
    with probe_thread() as probe:
        monkeypatch.setattr(_native, "gather_rows", probe.watch(_native.gather_rows))
        out = td[torch.arange(4095, -1, -1)]
    assert probe.calls == 1
    assert probe.turns >= MIN_TURNS, probe.turns
    assert out["a"].shape == (4096, 16384)


def test_copy_packed_releases_gil_and_round_trips() -> None:
    leaves = [torch.full((8 << 20,), float(i)) for i in range(8)]  # 256 MiB
    table = array("Q")
    offset = 0
    for t in leaves:
        table.extend((t.data_ptr(), offset, t.nbytes))
        offset += t.nbytes
    buffer = torch.empty(offset, dtype=torch.uint8)
    with probe_thread() as probe:
        probe.watch(_native.copy_packed)(table, buffer.data_ptr(), buffer.numel(), True)
    assert probe.turns >= MIN_TURNS, probe.turns
    for t in leaves:
        t.zero_()
    _native.copy_packed(table, buffer.data_ptr(), buffer.numel(), False)
    assert [t[-1].item() for t in leaves] == [float(i) for i in range(8)]


def test_copy_packed_checks_the_table() -> None:
    buffer = torch.empty(16, dtype=torch.uint8)
    src = torch.ones(32, dtype=torch.uint8)
    with pytest.raises(ValueError, match="does not fit"):
        _native.copy_packed(array("Q", [src.data_ptr(), 0, 32]), buffer.data_ptr(), 16, True)
    with pytest.raises(ValueError, match="triples"):
        _native.copy_packed(array("Q", [1, 2]), buffer.data_ptr(), 16, True)
    with pytest.raises(ValueError, match="shares memory"):
        _native.copy_packed(array("Q", [buffer.data_ptr() + 4, 0, 8]), buffer.data_ptr(), 16, True)


def _gather_in_child(queue) -> None:  # module level: the fork child runs it
    torch.set_num_threads(1)  # as DataLoader workers do: torch's own pool is not fork-safe
    data = TensorDict({"x": torch.arange(4096 * 256, dtype=torch.float32).view(4096, 256)}, [4096])
    idx = torch.randint(0, 4096, (1024,))
    queue.put(bool((data[idx]["x"] == data["x"][idx]).all()))


def test_gather_in_a_forked_child_after_a_parallel_gather_in_the_parent() -> None:
    """rayon's threads do not survive fork: a DataLoader worker forked after the parent used
    the pool must still gather (on its own thread) instead of waiting forever."""
    import multiprocessing as mp

    data = TensorDict({"x": torch.ones(4096, 256)}, [4096])
    idx = torch.randint(0, 4096, (1024,))  # 1 MiB of rows: above the parallel threshold
    assert 1024 * 256 * 4 >= _native_parallel_min()
    assert bool((data[idx]["x"] == 1).all())  # the parent's pool now runs
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_gather_in_child, args=(queue,))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the gather in the forked child hung")
    assert child.exitcode == 0
    assert queue.get(timeout=10) is True


def _native_parallel_min() -> int:
    return 256 << 10  # rust/gather.rs PARALLEL_MIN
