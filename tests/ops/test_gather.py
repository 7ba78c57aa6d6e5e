"""Batches in one native call: ``td[idx]`` and ``index_select(0, idx, out=)`` of CPU trees.

Every result is compared with tensordict 0.15.3 (or torch) on the same data; the native path
is checked to be taken (or not) by counting calls to ``_native.gather_rows``.
"""

from __future__ import annotations

import sys
from array import array
from pathlib import Path

import pytest
import tensordict
import torch
from tensordict_rs import TensorDict, _native
from tensordict_rs.ops import gather as _gather

from .._gil_probe import MIN_TURNS, probe_thread

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

    def gather_rows(*args, **kwargs):
        calls.append(args)
        return native(*args, **kwargs)

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
    ],
    ids=["requires_grad", "strided"],
)
def test_torch_path_where_native_does_not_apply(make, rows, counted) -> None:
    td = make()
    idx = torch.arange(rows).flip(0)
    out = td[idx]
    assert torch.equal(out["a"], td["a"][idx])
    assert counted == []
    if td["a"].requires_grad:
        assert out["a"].requires_grad


def test_crossover_bound(counted, monkeypatch) -> None:
    # Natively from one row on (MIN_BYTES is 0: measured faster at every size); below
    # MIN_BYTES, torch's per-leaf path, with the same result.
    td = TensorDict({"a": torch.arange(ROWS * 16.0).view(ROWS, 16)}, [ROWS])
    idx = torch.tensor([7])
    assert torch.equal(td[idx]["a"], td["a"][idx])
    assert len(counted) == 1
    monkeypatch.setattr(_gather, "MIN_BYTES", 64 * 2)
    assert torch.equal(td[idx]["a"], td["a"][idx])  # 64 bytes: torch's path
    assert len(counted) == 1
    assert torch.equal(td[torch.tensor([7, 9])]["a"], td["a"][[7, 9]])  # 128 bytes: native
    assert len(counted) == 2


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
    return 256 << 10  # rust/sys/gather.rs PARALLEL_MIN


# ---------------------------------------------------------------------------- the batch plan


def _rows(td: TensorDict, idx: torch.Tensor) -> dict:
    """Every leaf of ``td`` indexed by torch, by key (the expected batch)."""
    return {key: td[key][idx] for key in td.keys(include_nested=True, leaves_only=True)}


def _check(batch: TensorDict, expected: dict) -> None:
    assert sorted(map(str, batch.keys(include_nested=True, leaves_only=True))) == sorted(
        map(str, expected)
    )
    for key, value in expected.items():
        got = batch[key]
        assert got.dtype == value.dtype and got.shape == value.shape, key
        assert torch.equal(got, value), key


BIG = torch.randint(0, ROWS, (300,), generator=torch.Generator().manual_seed(3))


def test_plan_follows_changes_to_the_tree(counted) -> None:
    """A plan is kept between batches; every change to the tree is seen by the next one."""
    td = TensorDict(
        {"a": torch.rand(ROWS, 64), "n": {"b": torch.arange(ROWS * 2).view(ROWS, 2)}}, [ROWS]
    )
    _check(td[BIG], _rows(td, BIG))
    assert td.__dict__["_gather_plan"] is not None
    td["a"] = torch.rand(ROWS, 64)  # a new leaf object
    _check(td[BIG], _rows(td, BIG))
    td["c"] = torch.ones(ROWS, 3, dtype=torch.float64)  # a new key
    _check(td[BIG], _rows(td, BIG))
    del td["c"]
    _check(td[BIG], _rows(td, BIG))
    td["n", "b"] = torch.zeros(ROWS, 2, dtype=torch.int64)  # inside a nested node
    _check(td[BIG], _rows(td, BIG))
    td["n"] = TensorDict({"z": torch.rand(ROWS, 16)}, [ROWS])  # a new nested node
    _check(td[BIG], _rows(td, BIG))
    td["n"]._tensordict = {"y": torch.rand(ROWS, 8)}  # the node's dict replaced
    _check(td[BIG], _rows(td, BIG))
    assert len(counted) == 7


def test_plan_sees_in_place_changes_of_a_tensor_leaf(counted) -> None:
    """``set_``, ``resize_``, ``.data =`` and ``requires_grad_`` change a leaf without
    changing the object: the plan must notice (an old address would read freed memory)."""
    a = torch.rand(ROWS, 64)
    td = TensorDict({"a": a}, [ROWS])
    td[BIG]
    a.set_(torch.rand(ROWS, 64))  # new storage, same shape
    assert torch.equal(td[BIG]["a"], a[BIG])
    a.resize_(ROWS, 128).normal_()  # same object, new shape (bigger rows)
    assert torch.equal(td[BIG]["a"], a[BIG])
    a.data = torch.rand(ROWS, 128).double()  # new dtype
    out = td[BIG]
    assert out["a"].dtype == torch.float64 and torch.equal(out["a"], a[BIG])
    calls = len(counted)
    a.requires_grad_()  # torch's path now: the result must track the graph
    assert td[BIG]["a"].requires_grad
    assert len(counted) == calls


def test_plan_sees_a_conjugate_bit_set_through_data() -> None:
    a = torch.complex(torch.rand(ROWS, 64), torch.rand(ROWS, 64))
    td = TensorDict({"a": a}, [ROWS])
    td[BIG]
    a.data = a.conj()  # same address, shape, dtype: only the bit differs
    assert a.is_conj()
    assert torch.equal(td[BIG]["a"], a[BIG])


def test_plan_sees_a_leaf_turned_into_a_strided_view(counted) -> None:
    a = torch.rand(ROWS, 64)
    td = TensorDict({"a": a}, [ROWS])
    td[BIG]
    a.transpose_(0, 1).transpose_(0, 1)  # contiguous again: still native
    assert torch.equal(td[BIG]["a"], a[BIG])
    a.as_strided_((ROWS, 32), (64, 2))  # strided: torch's path
    calls = len(counted)
    assert torch.equal(td[BIG]["a"], a[BIG])
    assert len(counted) == calls


def test_plan_does_not_keep_the_tree_alive() -> None:
    import gc
    import weakref

    gc.disable()
    try:
        td = TensorDict({"a": torch.rand(ROWS, 64), "n": {"b": torch.rand(ROWS, 8)}}, [ROWS])
        td[BIG]
        alive = weakref.ref(td)
        leaf = weakref.ref(td["a"])
        del td
        assert alive() is None and leaf() is None, "freed without the cycle collector"
    finally:
        gc.enable()


@pytest.mark.parametrize(
    "index",
    [
        torch.rand(ROWS) < 0.4,  # bool mask
        [5, 5, 7, 1, 999] * 60,  # list with duplicates
        torch.arange(0, ROWS, 3),  # sorted, strided
        torch.arange(200, 500),  # one contiguous run
        torch.tensor([], dtype=torch.int64),
    ],
    ids=["mask", "list", "sorted", "run", "empty"],
)
def test_index_kinds_match_reference(index) -> None:
    tree = _tree()
    ref = tensordict.TensorDict(tree, batch_size=[ROWS])
    ours = TensorDict(tree, [ROWS])
    ref_index = torch.tensor(index) if isinstance(index, list) else index
    _same(ours[index], ref[ref_index])


def test_concurrent_batches_from_threads() -> None:
    """Two threads gather big batches of one tree at once (the GIL is released during the
    copies, so their jobs meet in the helper threads): every batch is right."""
    import threading

    data = torch.arange(ROWS * 4096, dtype=torch.int32).view(ROWS, 4096)  # 16 KiB rows
    td = TensorDict({"x": data, "n": {"y": data[:, :7].clone()}}, [ROWS])
    errors: list[str] = []

    def work(seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(30):
            idx = torch.randint(0, ROWS, (256,), generator=gen)
            out = td[idx]
            if not (torch.equal(out["x"], data[idx]) and torch.equal(out["n", "y"], data[idx, :7])):
                errors.append(f"thread {seed}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_batch_results_are_ordinary_tensors() -> None:
    """Batch leaves own their memory: resizable, shareable, independent of later batches."""
    td = TensorDict({"a": torch.rand(ROWS, 256)}, [ROWS])
    first = td[BIG]
    view = first["a"][10:20]
    array = first["a"].numpy()
    kept = view.clone()
    for seed in range(20):
        td[torch.randint(0, ROWS, (300,), generator=torch.Generator().manual_seed(seed))]
    assert torch.equal(view, kept) and torch.equal(torch.from_numpy(array)[10:20], kept)
    grown = td[BIG]["a"]
    grown.resize_(600, 256)  # a fresh torch tensor can grow (one shared with NumPy cannot)
    assert grown.shape == (600, 256)
    assert td[BIG]["a"].share_memory_().is_shared()


def test_one_thread_where_torch_uses_one(counted) -> None:
    """As in DataLoader workers (torch.set_num_threads(1)): copied on the calling thread."""
    td = TensorDict({"a": torch.rand(ROWS, 1024)}, [ROWS])  # 4 KiB rows: parallel otherwise
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(td[BIG]["a"], td["a"][BIG])
        assert counted[-1][3] is False
    finally:
        torch.set_num_threads(before)
    assert torch.equal(td[BIG]["a"], td["a"][BIG])
    assert counted[-1][3] is (before > 1)


def test_same_entries_sees_every_kind_of_change() -> None:
    """The plan check compares key and value objects, in order, without taking references."""
    a, b = torch.ones(2), torch.zeros(2)
    d = {"a": a, "b": b}
    snapshot = [(d, tuple(d), tuple(d.values()))]
    assert _native.same_entries(snapshot)
    assert _native.same_entries([])
    d["a"] = torch.ones(2)  # an equal value, another object
    assert not _native.same_entries(snapshot)
    d["a"] = a
    assert _native.same_entries(snapshot)
    d["c"] = a  # a new key
    assert not _native.same_entries(snapshot)
    del d["c"]
    del d["a"]
    d["a"] = a  # the same entries in another order
    assert not _native.same_entries(snapshot)
    other = {"a": a}
    assert not _native.same_entries([(other, ("a",), (b,))])
    assert not _native.same_entries([(other, ("b",), (a,))])
    assert not _native.same_entries([(other, ("a", "b"), (a, b))])
    refs = sys.getrefcount(a)
    for _ in range(1000):
        _native.same_entries([(other, ("a",), (a,))])
    assert sys.getrefcount(a) == refs  # borrowed references only
