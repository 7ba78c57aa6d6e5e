"""``TensorDict.map`` and ``map_iter`` (issue 23), side by side with tensordict 0.15.3.

Worker functions live at module level: pool workers import them by name (spawn, forkserver).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as rs
import torch

PKGS = [rs, ref]
METHODS = [m for m in ("fork", "spawn", "forkserver") if m in mp.get_all_start_methods()]
FAST = "fork" if "fork" in METHODS else "spawn"  # the quickest start where it exists


def add_one(td: Any) -> Any:
    return td.apply(lambda t: t + 1)


def select_a(td: Any) -> Any:
    return td.select("a")


def doubled(td: Any) -> Any:
    return td.empty().set("y", td["x"] * 2)


def write_pid(td: Any) -> Any:
    return type(td)({"pid": os.getpid()}, []).expand(td.shape)


def fail_on_seven(td: Any) -> Any:
    if (td["a"] == 7).any():
        raise ZeroDivisionError("seven")
    return td


def fail_from_ten(td: Any) -> Any:
    first = int(td["a"][0])
    if first >= 10:
        raise ValueError(f"from {first}")
    return td


def not_pointwise(td: Any) -> Any:
    return td @ 1


def returns_none(td: Any) -> None:
    return None


def leaf_kinds(td: Any) -> Any:
    """Records how each leaf reached the worker (memory map or plain tensor)."""
    kind = torch.tensor([type(td["a"]).__name__ == "MemoryMappedTensor"]).expand(td.shape)
    return td.empty().set("is_memmap", kind)


def rand_draw(td: Any) -> Any:
    return td.empty().set("r", torch.randint(0, 1_000_000, ()).expand(td.shape).clone())


def np_draw(td: Any) -> Any:
    import numpy as np

    return td.empty().set("r", torch.tensor(np.random.randint(0, 1_000_000)).expand(td.shape))


def make(P: Any, n: int = 20) -> Any:
    return P.TensorDict(
        {"a": torch.arange(n), "b": {"c": torch.arange(n, 2 * n).float()}}, batch_size=[n]
    )


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.fixture(scope="module")
def pool() -> Any:
    with mp.get_context("spawn").Pool(2) as p:
        yield p


def same(a: Any, b: Any) -> None:
    assert a.batch_size == b.batch_size
    ka = list(a.keys(include_nested=True, leaves_only=True))
    assert ka == list(b.keys(include_nested=True, leaves_only=True))
    for key in ka:
        assert torch.equal(a[key].as_subclass(torch.Tensor), b[key].as_subclass(torch.Tensor)), key


@pytest.mark.parametrize(
    ("chunksize", "num_chunks"), [(None, None), (None, 3), (4, None), (0, None), (7, None)]
)
def test_map_results(pool: Any, chunksize: int | None, num_chunks: int | None) -> None:
    ours = make(rs).map(add_one, pool=pool, chunksize=chunksize, num_chunks=num_chunks)
    theirs = make(ref).map(add_one, pool=pool, chunksize=chunksize, num_chunks=num_chunks)
    same(ours, theirs)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_map_dim(pool: Any, dim: int) -> None:
    def build(P: Any) -> Any:
        return P.TensorDict(
            {"a": torch.arange(24).view(4, 6), "n": {"b": torch.ones(4, 6, 2)}}, [4, 6]
        )

    same(build(rs).map(add_one, dim=dim, pool=pool), build(ref).map(add_one, dim=dim, pool=pool))


def test_map_chunk_counts(pool: Any) -> None:
    for chunksize, num_chunks, expected in [(4, None, 5), (None, 3, 3)]:
        pids = make(rs).map(write_pid, pool=pool, chunksize=chunksize, num_chunks=num_chunks)
        assert pids["pid"].shape == (20,)
        # one pid per chunk: consecutive equal runs
        runs = 1 + int((pids["pid"][1:] != pids["pid"][:-1]).sum())
        assert runs <= expected


def test_map_argument_errors(pool: Any) -> None:
    for P in PKGS:
        with pytest.raises(ValueError, match="but not both"):
            make(P).map(add_one, pool=pool, chunksize=2, num_chunks=2)
        with pytest.raises(RuntimeError):
            list(make(P).map_iter(add_one, pool=pool, shuffle=True, index_with_generator=False))


def test_map_exception_reaches_caller_with_chunk(pool: Any) -> None:
    with pytest.raises(ZeroDivisionError, match="seven") as info:
        make(rs).map(fail_on_seven, pool=pool, chunksize=5)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "chunk 1" in notes and "5:10" in notes, notes
    with pytest.raises(ZeroDivisionError, match="seven"):
        make(ref).map(fail_on_seven, pool=pool, chunksize=5)


def test_map_type_error(pool: Any) -> None:
    for P in PKGS:
        with pytest.raises(TypeError, match="unsupported operand"):
            make(P).map(not_pointwise, pool=pool)


def test_map_returns_none(pool: Any) -> None:
    assert make(rs).map(returns_none, pool=pool) is None
    assert make(ref).map(returns_none, pool=pool) is None


@pytest.mark.parametrize("chunksize", [0, 5])
@pytest.mark.parametrize("mmap", [True, False])
def test_map_with_out(tmp_path: Path, pool: Any, chunksize: int, mmap: bool) -> None:
    for P in PKGS:
        src = P.TensorDict({"a": torch.arange(10), "b": torch.arange(10)}, [10])
        out = P.TensorDict({"a": torch.zeros(10, dtype=torch.long)}, [10])
        if mmap:
            src.memmap_(tmp_path / P.__name__ / "in")
            out.memmap_(tmp_path / P.__name__ / "out")
        res = src.map(select_a, out=out, chunksize=chunksize, pool=pool)
        assert res is out
        assert (out["a"] == torch.arange(10)).all()


def test_map_memmap_like_output_written_by_workers(tmp_path: Path, pool: Any) -> None:
    """The documented preprocessing recipe: ``out = example.expand(N).memmap_like(dest)``."""
    n = 64
    data = rs.TensorDict({"x": torch.arange(n * 3.0).view(n, 3)}, [n]).memmap_(tmp_path / "src")
    example = doubled(data[:1])[0]
    out = example.expand(n).memmap_like(tmp_path / "dest")
    data.map(doubled, dim=0, num_workers=2, chunksize=16, out=out, generator=gen())
    again = rs.TensorDict.load_memmap(tmp_path / "dest")
    assert torch.equal(again["y"].as_subclass(torch.Tensor), torch.arange(n * 3.0).view(n, 3) * 2)


def test_map_chunks_cross_as_memory_maps(tmp_path: Path, pool: Any) -> None:
    """A chunk of a memory-mapped tree reaches the worker as a memory map (no copy)."""
    for kind in ("file", "anonymous"):
        td = make(rs)
        td = td.memmap_(tmp_path / kind) if kind == "file" else td.share_memory_()
        res = td.map(leaf_kinds, pool=pool, chunksize=5)
        assert res["is_memmap"].all(), kind


@pytest.mark.parametrize("start_method", METHODS)
def test_map_start_methods(start_method: str) -> None:
    ours = make(rs).map(add_one, num_workers=2, mp_start_method=start_method, generator=gen())
    same(ours, make(rs).apply(lambda t: t + 1))


def test_map_default_start_method_and_generator_warning() -> None:
    with pytest.warns(FutureWarning):
        ours = make(rs).map(add_one, num_workers=2)
    with pytest.warns(FutureWarning):
        theirs = make(ref).map(add_one, num_workers=2)
    same(ours, theirs)


def test_map_seeds_reproducible() -> None:
    """One worker seeded from the same generator draws the same numbers; a generator with
    another seed gives others. (With several workers, which worker takes which chunk varies.)"""
    runs = [
        make(rs).map(rand_draw, num_workers=1, chunksize=5, generator=gen())["r"] for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])
    other = make(rs).map(
        rand_draw, num_workers=1, chunksize=5, generator=torch.Generator().manual_seed(1)
    )["r"]
    assert not torch.equal(runs[0], other)


@pytest.mark.parametrize("method", METHODS)
def test_map_seeds_numpy_as_the_reference(method: str) -> None:
    """NumPy's global generator in a worker is seeded as tensordict 0.15.3 seeds it (the
    DataLoader rule), whatever the start method, and with numpy.random preloaded in the
    parent for fork pools."""
    draws = [
        P.TensorDict({"a": torch.arange(10)}, [10]).map(
            np_draw, num_workers=1, chunksize=5, generator=gen(), mp_start_method=method
        )["r"]
        for P in PKGS
    ]
    assert torch.equal(draws[0], draws[1])


def test_fork_pools_start_with_numpy_random_imported(tmp_path: Path) -> None:
    """A pool forked by ``map`` finds numpy.random already imported (the parent imports it
    once), so no worker pays its import (~10 ms) at every call's start."""
    import subprocess
    import sys

    script = tmp_path / "probe.py"
    script.write_text(
        "import sys, torch, tensordict_rs as rs\n"
        "def np_draw(td):\n"
        "    import numpy as np\n"
        "    return td.empty().set('r', torch.tensor(np.random.randint(9)).expand(td.shape))\n"
        "assert 'numpy.random' not in sys.modules, 'imported before map'\n"
        "td = rs.TensorDict({'a': torch.arange(4)}, [4])\n"
        "td.map(np_draw, num_workers=1, chunksize=2, generator=torch.Generator(),\n"
        "       mp_start_method='fork')\n"
        "print('numpy.random' in sys.modules)\n"
    )
    got = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "True"


def test_map_index_with_generator(pool: Any) -> None:
    for chunksize, num_chunks in [(0, None), (3, None), (None, 4)]:
        a = make(rs).map(
            add_one,
            pool=pool,
            chunksize=chunksize,
            num_chunks=num_chunks,
            index_with_generator=True,
        )
        b = make(ref).map(
            add_one,
            pool=pool,
            chunksize=chunksize,
            num_chunks=num_chunks,
            index_with_generator=True,
        )
        same(a, b)


def test_map_unbind_stacks(pool: Any) -> None:
    """``chunksize=0`` passes elements one by one and stacks the results."""
    same(
        make(rs).map(add_one, pool=pool, chunksize=0),
        make(ref).map(add_one, pool=pool, chunksize=0),
    )


def test_map_tensor_result(pool: Any) -> None:
    ours = make(rs).map(_sum_a, pool=pool, chunksize=5)
    theirs = make(ref).map(_sum_a, pool=pool, chunksize=5)
    assert torch.equal(ours, theirs)


def _sum_a(td: Any) -> torch.Tensor:
    return td["a"] * 3


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(("chunksize", "num_chunks"), [(0, None), (6, None), (None, 4)])
def test_map_iter(pool: Any, shuffle: bool, chunksize: int | None, num_chunks: int | None) -> None:
    seen: list[int] = []
    count = 0
    for item in make(rs, 30).map_iter(
        add_one, pool=pool, shuffle=shuffle, chunksize=chunksize, num_chunks=num_chunks
    ):
        seen.extend(item["a"].reshape(-1).tolist())
        count += 1
    assert sorted(seen) == list(range(1, 31))
    expected = {0: 30, 6: 5}.get(chunksize, num_chunks)  # type: ignore[arg-type]
    assert count == expected
    if not shuffle:
        assert seen == list(range(1, 31))


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_map_batches_leave_a_short_tail(workers: int) -> None:
    """Each worker gets its share of the chunks in at least 16 messages (or one per chunk), so a
    slowed worker is left with a short tail; and never over 64 chunks in one message."""
    from tensordict_rs.share.map import _batch

    for chunks in (1, 2, 15, 64, 100, 1_000, 100_000):
        batch = _batch(chunks, workers)
        messages = -(chunks // -batch)
        assert 1 <= batch <= 64, (chunks, batch)
        assert messages >= min(chunks, 16 * workers), (chunks, workers, batch)


def _children() -> set[int]:
    return {p.pid for p in mp.active_children()}


def _wait_for_children(allowed: set[int], seconds: float = 60.0) -> set[int]:
    import time

    deadline = time.monotonic() + seconds
    while (left := _children() - allowed) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_map_workers_end_after_it_returns(tmp_path: Path, monkeypatch: Any) -> None:
    """A pool made by ``map`` is joined in the background: the result is complete when ``map``
    returns (written into ``out`` by the workers), and every worker ends and is reaped."""
    import threading

    started: list[threading.Thread] = []

    class Recorded(threading.Thread):
        def start(self) -> None:
            started.append(self)
            super().start()

    monkeypatch.setattr(threading, "Thread", Recorded)
    before = _children()
    data = make(rs, 40).memmap_(tmp_path / "src")
    out = add_one(data[:1])[0].expand(40).memmap_like(tmp_path / "out")
    result = data.map(add_one, num_workers=2, chunksize=4, out=out, generator=gen())
    assert result is out
    assert out["a"].tolist() == list(range(1, 41))
    assert out["b", "c"].tolist() == [float(v) for v in range(41, 81)]
    # the joining thread is one the interpreter's exit waits for: a daemon one could end
    # during shutdown and free the pool while Python finalized, which aborted the process
    # ("terminate called without an active exception", one run in four of a map script)
    joins = [t for t in started if t.name == "tensordict_rs map: pool join"]
    assert len(joins) == 1 and not joins[0].daemon, joins
    assert _wait_for_children(before) == set()


def test_map_waits_for_its_workers_after_an_exception() -> None:
    before = _children()
    with pytest.raises(ZeroDivisionError, match="seven"):
        make(rs).map(fail_on_seven, num_workers=2, chunksize=5, generator=gen())
    assert _children() <= before


def test_map_iter_stops_early_and_cleans_up() -> None:
    before = {p.pid for p in mp.active_children()}
    it = make(rs, 40).map_iter(add_one, num_workers=2, chunksize=2, generator=gen())
    first = next(it)
    assert first["a"].tolist() == [1, 2]
    it.close()  # closes the pool it made
    assert {p.pid for p in mp.active_children()} <= before


def preprocess(td: Any) -> Any:
    """The recipe's ``fn``: a new entry computed from a chunk of the memory-mapped source, and
    where the chunk's leaf came from (a memory map of the source file, not a pickled copy)."""
    x = td["x"]
    mapped = type(x).__name__ == "MemoryMappedTensor" and str(
        getattr(x, "filename", None) or getattr(x, "_filename", "")
    ).endswith("x.memmap")
    return (
        td.empty()
        .set("y", (x * 2 + 1).float().sum(-1))
        .set("mapped", torch.tensor(mapped).expand(td.shape))
    )


@pytest.mark.parametrize("start_method", [m for m in ("fork", "spawn") if m in METHODS])
def test_preprocessing_recipe_matches_reference(tmp_path: Path, start_method: str) -> None:
    """Workflow 1 of issue 23, side by side: ``out = example.expand(N).memmap_like(dest)``,
    then ``data.map(fn, dim=0, num_workers=2, chunksize=C, out=out)``; the workers read
    chunks of the source from its files and write into the output's files."""
    n, width = 512, 256
    source = torch.arange(n * width, dtype=torch.int32).view(n, width)
    results = {}
    for P in PKGS:
        root = tmp_path / P.__name__
        data = P.TensorDict({"x": source.clone()}, [n]).memmap_(root / "src")
        example = preprocess(data[:1])[0]
        out = example.expand(n).memmap_like(root / "dest")
        res = data.map(
            preprocess,
            dim=0,
            num_workers=2,
            chunksize=64,
            out=out,
            generator=gen(),
            # the reference's result does not depend on the start method: fork keeps it short
            mp_start_method=start_method if P is rs else "fork",
        )
        assert res is out
        results[P.__name__] = P.TensorDict.load_memmap(root / "dest")
    ours, theirs = results["tensordict_rs"], results["tensordict"]
    expected = (source * 2 + 1).float().sum(-1)
    for td in (ours, theirs):
        assert torch.equal(td["y"].as_subclass(torch.Tensor), expected)
    # every chunk reached our workers as a memory map of the source file (the reference
    # sends them the same way, as memory-mapped tensors)
    assert ours["mapped"].all()


def test_map_chunk_crosses_without_its_data(tmp_path: Path) -> None:
    """What crosses to a worker for a chunk of a 32 MiB memory-mapped source: its file path
    and view geometry (a few hundred bytes), never the data."""
    from multiprocessing.reduction import ForkingPickler

    n = 8192
    data = rs.TensorDict({"x": torch.ones(n, 1024)}, [n]).memmap_(tmp_path / "src")
    whole = len(ForkingPickler.dumps(data))
    chunk = len(ForkingPickler.dumps(data[1024:2048]))
    assert whole < 4096 and chunk < 4096, (whole, chunk)
    assert data.numel() * 1024 * 4 > 1000 * whole


def test_chunks_written_through_the_files_of_a_memmap_out(tmp_path: Path) -> None:
    """A worker writes a chunk's result into a memory-mapped ``out`` with one positioned write
    per leaf (no page faults through the map): the files and the tree show it; a result that
    does not fit that way (another dtype, a key more, an anonymous ``out``, a file replaced
    since) writes nothing and is left to ``update_``."""
    from tensordict_rs.share.map_worker import _write_through_files

    out = rs.TensorDict({"a": torch.zeros(8, 4), "b": torch.zeros(8, dtype=torch.int64)}, [8])
    out = out.memmap(tmp_path / "out")
    rows = rs.TensorDict({"a": torch.ones(3, 4), "b": torch.arange(3)}, [3])
    assert _write_through_files(out[2:5], rows)
    for tree in (out, rs.TensorDict.load_memmap(tmp_path / "out")):
        assert tree["a"][:, 0].tolist() == [0, 0, 1, 1, 1, 0, 0, 0]
        assert tree["b"].tolist() == [0, 0, 0, 1, 2, 0, 0, 0]
    unfit = [
        rs.TensorDict({"a": torch.ones(3, 4, dtype=torch.float64), "b": torch.arange(3)}, [3]),
        rs.TensorDict({"a": torch.ones(3, 4), "b": torch.arange(3), "c": torch.ones(3)}, [3]),
        rs.TensorDict({"a": torch.ones(4, 3).t(), "b": torch.arange(3)}, [3]),  # not contiguous
    ]
    for bad in unfit:
        assert not _write_through_files(out[5:8], bad)
    assert not _write_through_files(out.clone().share_memory_()[5:8], rows)
    assert out["b"][5:].tolist() == [0, 0, 0]
    (tmp_path / "out" / "a.memmap").rename(tmp_path / "old")
    (tmp_path / "out" / "a.memmap").write_bytes(bytes(128))
    assert not _write_through_files(out[5:8], rows)
    assert (tmp_path / "out" / "a.memmap").read_bytes() == bytes(128)


def _memmap_pair(P: Any, root: Path, fn: Any, n: int = 20) -> tuple[Any, Any]:
    """A memory-mapped source of ``n`` rows and ``fn``'s ``memmap_like`` output for it."""
    src = P.TensorDict({"a": torch.arange(n)}, [n]).memmap_(root / "src")
    return src, fn(src[:1])[0].expand(n).memmap_like(root / "out")


def test_map_workers_claim_chunks_seeded_as_the_reference(tmp_path: Path) -> None:
    """Into a memory-mapped ``out`` with a pool made by ``map``, the workers claim the chunks
    from a shared counter instead of receiving them: one worker draws what the reference's one
    worker draws (same worker id, same seed, chunks in order), and two workers write every
    chunk once."""
    draws = {}
    for P in PKGS:
        src, out = _memmap_pair(P, tmp_path / P.__name__, rand_draw)
        kwargs = {"out": out, "generator": gen(), "mp_start_method": FAST}
        res = src.map(rand_draw, num_workers=1, chunksize=5, **kwargs)
        assert res is out
        draws[P.__name__] = out["r"].tolist()
    assert draws["tensordict_rs"] == draws["tensordict"]
    assert len(set(draws["tensordict"])) == 4  # one draw per chunk
    src, out = _memmap_pair(rs, tmp_path / "two", add_one, n=103)
    src.map(add_one, num_workers=2, chunksize=4, out=out, generator=gen())
    assert out["a"].tolist() == list(range(1, 104))
    out["a"].zero_()  # one claiming message per worker: max_tasks_per_child=1 is enough
    src.map(add_one, num_workers=2, chunksize=4, out=out, generator=gen(), max_tasks_per_child=1)
    assert out["a"].tolist() == list(range(1, 104))
    # anonymous shared memory in and out (written through the workers' maps of it)
    src = make(rs, 50).share_memory_()
    out = add_one(src[:1])[0].expand(50).clone().share_memory_()
    assert src.map(add_one, num_workers=2, num_chunks=7, out=out, generator=gen()) is out
    assert out["a"].tolist() == list(range(1, 51))
    assert out["b", "c"].tolist() == [float(v) for v in range(51, 101)]


def test_map_claiming_workers_raise_the_first_failing_chunk(tmp_path: Path) -> None:
    """An exception of ``fn`` in a claiming worker stops the others' claiming and reaches the
    caller with its type and the note of its chunk; of several failing chunks, the lowest."""
    for P in PKGS:
        src, out = _memmap_pair(P, tmp_path / P.__name__, fail_from_ten)
        with pytest.raises(ValueError, match="from 10") as info:
            kwargs = {"out": out, "generator": gen(), "mp_start_method": FAST}
            src.map(fail_from_ten, num_workers=2, chunksize=5, **kwargs)
        if P is rs:
            assert any("chunk 2 (elements 10:15" in note for note in info.value.__notes__)
            assert out["a"][:10].tolist() == list(range(10))  # the chunks before it are written


def test_counters_hand_out_ids_and_chunks_once() -> None:
    from tensordict_rs.share.map_worker import _Counters

    counters = _Counters(mp.get_context(FAST))
    assert [counters.get(timeout=1) for _ in range(3)] == [0, 1, 2]
    assert [counters.claim(3) for _ in range(4)] == [0, 1, 2, None]
    again = _Counters(mp.get_context())
    assert again.claim(5) == 0
    again.stop()
    assert again.claim(5) is None


_REPLACED_WORKERS = """
import torch, tensordict_rs as rs
def add_one(td):
    return td.apply(lambda x: x + 1)
if __name__ == "__main__":
    td = rs.TensorDict({"a": torch.arange(64.0), "b": {"c": torch.ones(64, 2)}}, [64])
    for method in METHODS:
        out = td.map(add_one, num_workers=2, chunksize=4, max_tasks_per_child=1,
                     generator=torch.Generator(), mp_start_method=method)
        assert out["a"].tolist() == [float(v) for v in range(1, 65)], method
        assert out["b", "c"].eq(2).all(), method
    print("done")
"""


def test_map_returns_results_of_workers_that_max_tasks_per_child_ends(tmp_path: Path) -> None:
    """Results through pool messages, each worker replaced after one task: every result
    arrives (they crossed as shared memory the parent fetched from the sending worker, which
    had exited by then: map waited forever). In a child process with a timeout, so a hang fails."""
    import subprocess
    import sys

    script = tmp_path / "replaced.py"
    script.write_text(_REPLACED_WORKERS.replace("METHODS", repr([FAST])))
    done = subprocess.run(
        [sys.executable, os.fspath(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]


_KILLED_WORKER = """
import multiprocessing as mp, os, signal, time, torch, tensordict_rs as rs
def die_on_forty(td):
    if int(td["x"][0]) == 40:
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
    return td.empty().set("y", td["x"] * 2)
def expect_death(call, what):
    t0 = time.monotonic()
    try:
        call()
    except RuntimeError as err:  # DataLoader's type for a worker that died
        assert type(err) is rs.WorkerDiedError and isinstance(err, rs.TensorDictError), repr(err)
        assert str(err).startswith(what + ": worker process "), err
        assert "killed by signal SIGKILL" in str(err), err
    else:
        raise AssertionError(what + " returned")
    assert time.monotonic() - t0 < 30, what
if __name__ == "__main__":
    n = 100
    for method in METHODS:
        data = rs.TensorDict({"x": torch.arange(n)}, [n]).memmap_()
        out = die_on_forty(data[:1])[0].expand(n).memmap_like()
        kw = dict(chunksize=10, generator=torch.Generator(), mp_start_method=method)
        # the workers claim chunks and write into out / results through pool messages
        expect_death(lambda: data.map(die_on_forty, 0, 2, out=out, **kw), "map")
        expect_death(lambda: data.map(die_on_forty, 0, 2, **kw), "map")
        expect_death(lambda: list(data.map_iter(die_on_forty, 0, 2, **kw)), "map_iter")
        with mp.get_context(method).Pool(2) as pool:  # the caller's pool
            expect_death(lambda: data.map(die_on_forty, 0, chunksize=10, pool=pool), "map")
        # every pool made here was ended: no worker is left
        deadline = time.monotonic() + 30
        while mp.active_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not mp.active_children(), mp.active_children()
        # workers that max_tasks_per_child ends (exit 0) are not deaths
        done = data.map(die_on_forty, 0, 2, num_chunks=4, max_tasks_per_child=1,
                        generator=torch.Generator(), mp_start_method=method)
        assert done is not None
    print("done")
"""


@pytest.mark.parametrize("method", [FAST, "spawn"] if FAST != "spawn" else ["spawn"])
def test_a_killed_worker_raises_instead_of_hanging(tmp_path: Path, method: str) -> None:
    """A worker killed mid-chunk (SIGKILL, as the OOM killer) takes its chunk with it; the pool
    starts another worker and would wait for that chunk forever (tensordict 0.15.3's ``map``
    does): ``map`` and ``map_iter`` raise ``RuntimeError`` naming the worker and the signal,
    with the workers claiming chunks, with results through pool messages, and with the
    caller's pool, and end the pools they made. In a child process with a timeout, so a hang
    fails."""
    import subprocess
    import sys

    script = tmp_path / "killed.py"
    script.write_text(_KILLED_WORKER.replace("METHODS", repr([method])))
    done = subprocess.run(
        [sys.executable, os.fspath(script)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-3000:]


@pytest.mark.parametrize("shuffle", [False, True])
def test_map_and_map_iter_with_several_chunks_per_message(shuffle: bool) -> None:
    """200 chunks of one element on 2 workers go 6 to a pool message: every result, in order
    (``map_iter`` with ``shuffle``: every result once). (The pool's own batched ``imap`` is a
    generator, which the worker watch could not wait on: map_iter raised AttributeError.)"""
    td = make(rs, 200)
    out = td.map(add_one, num_workers=2, chunksize=0, generator=gen())
    assert out["a"].tolist() == list(range(1, 201))
    got = [
        int(r["a"])
        for r in td.map_iter(add_one, num_workers=2, chunksize=0, shuffle=shuffle, generator=gen())
    ]
    assert (sorted(got) if shuffle else got) == list(range(1, 201))


_KILLED_REPLACEMENT = """
import multiprocessing as mp, os, signal, time, torch, tensordict_rs as rs
def die_from_four(td):
    if int(td["x"][0]) >= 4:  # from the 5th chunk on: always in a worker started as a replacement
        os.kill(os.getpid(), signal.SIGKILL)
    return td.empty().set("y", td["x"] * 2)
def expect_death(call, what):
    t0 = time.monotonic()
    try:
        call()
    except rs.WorkerDiedError as err:
        assert str(err).startswith(what + ": worker process "), err
        assert "killed by signal SIGKILL" in str(err), err
    else:
        raise AssertionError(what + " returned")
    assert time.monotonic() - t0 < 20, (what, time.monotonic() - t0)
if __name__ == "__main__":
    data = rs.TensorDict({"x": torch.arange(8)}, [8])
    kw = dict(chunksize=1, max_tasks_per_child=1, generator=torch.Generator(),
              mp_start_method="fork")
    for _ in range(3):
        expect_death(lambda: data.map(die_from_four, 0, 2, **kw), "map")
        expect_death(lambda: list(data.map_iter(die_from_four, 0, 2, **kw)), "map_iter")
        with mp.get_context("fork").Pool(2, maxtasksperchild=1) as pool:  # the caller's pool
            expect_death(lambda: data.map(die_from_four, 0, chunksize=1, pool=pool), "map")
    # workers that max_tasks_per_child retires (exit 0) are not deaths
    done = data[:4].map(die_from_four, 0, 2, **kw)
    assert done["y"].tolist() == [0, 2, 4, 6], done["y"]
    print("done")
"""


@pytest.mark.skipif("fork" not in METHODS, reason="needs fork")
def test_a_killed_replacement_worker_raises_instead_of_hanging(tmp_path: Path) -> None:
    """With ``max_tasks_per_child=1``, a worker that the pool starts in place of a retired one
    and that dies on its first chunk was missed: the watch looked at the pool's workers every
    ``POLL_S`` and the pool had started, lost and replaced it between two looks, so ``map``
    waited for its chunk forever (found by an attack). The pool now hands every worker it drops
    to the watches. In a child process with a timeout, so a hang fails."""
    import subprocess
    import sys

    script = tmp_path / "replacement.py"
    script.write_text(_KILLED_REPLACEMENT)
    done = subprocess.run(
        [sys.executable, os.fspath(script)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-3000:]


def odd_doubled(td: Any) -> Any:
    return td.empty().set("x", td["x"] * 2 + 1)


def test_a_full_file_system_raises_its_os_error_in_the_caller(tmp_path: Path) -> None:
    """A worker's positioned write into a memory-mapped ``out`` (``reserve=False``: sparse
    files) on a full file system fails with ENOSPC: it was taken for a file replaced since
    mapped and retried through the map, which faulted (SIGBUS), so the caller got
    ``WorkerDiedError`` instead of the error naming the file (found by an attack). ENOSPC now
    reaches the caller with the chunk's note; a file removed since still falls back to the map
    (a 1 MiB tmpfs, root only)."""
    import errno
    import subprocess

    from tensordict_rs.share.map_worker import _write_through_files

    out = rs.TensorDict({"x": torch.zeros(8)}, [8]).memmap(tmp_path / "gone")
    (tmp_path / "gone" / "x.memmap").unlink()  # removed: the map still takes the write
    assert not _write_through_files(out[2:5], rs.TensorDict({"x": torch.ones(3)}, [3]))
    if os.geteuid() != 0:
        pytest.skip("mounting a tiny tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", os.fspath(mnt)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        n = 64 * 1024  # 256 KiB of float32, more than is left once the filler is written
        td = rs.TensorDict({"x": torch.arange(float(n))}, [n])
        target = odd_doubled(td[:1])[0].expand(n).memmap_like(mnt / "out", reserve=False)
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\1" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC, err
        finally:
            os.close(fd)
        with pytest.raises(OSError) as info:
            td.map(
                odd_doubled,
                num_workers=2,
                chunksize=8192,
                out=target,
                generator=gen(),
                mp_start_method=FAST,
            )
        assert info.value.errno == errno.ENOSPC, repr(info.value)
        assert not isinstance(info.value, rs.WorkerDiedError), repr(info.value)
        assert "x.memmap" in str(info.value), info.value
        assert any("map: fn raised on chunk" in note for note in info.value.__notes__)
        del target
    finally:
        subprocess.run(["umount", "-l", os.fspath(mnt)], check=True)
