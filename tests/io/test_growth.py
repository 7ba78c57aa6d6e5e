"""Growth in place along the first batch dim (issue 24): extend_, append_, resize_.

Every grown directory is loaded here and by the reference ``tensordict`` 0.15.3, which must see
the same rows; growths from several processes take turns and append after each other.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from pathlib import Path

import pytest
import tensordict
import tensordict_rs
import torch
from tensordict_rs import TensorDict


@tensordict_rs.tensorclass
class Step:
    """A row as torchrl-style code holds it."""

    obs: torch.Tensor
    act: torch.Tensor
    flag: torch.Tensor


def rows(start: int, stop: int) -> TensorDict:
    """Rows ``start:stop``, each holding its own index (so a torn or misplaced row shows)."""
    idx = torch.arange(start, stop)
    return TensorDict(
        {
            "obs": idx[:, None].float().expand(-1, 3).clone(),
            "act": (-idx).to(torch.int64),
            "flag": (idx % 2 == 0),
        },
        [stop - start],
    )


def check_rows(td: object, n: int) -> None:
    idx = torch.arange(n)
    assert td.batch_size == torch.Size([n])  # type: ignore[attr-defined]
    assert torch.equal(td["obs"], idx[:, None].float().expand(-1, 3))  # type: ignore[index]
    assert torch.equal(td["act"], -idx)  # type: ignore[index]
    assert torch.equal(td["flag"], idx % 2 == 0)  # type: ignore[index]


def test_extend_on_disk_loads_here_and_in_reference(tmp_path: Path) -> None:
    td = rows(0, 5).memmap(tmp_path / "buf")
    for start in range(5, 500, 37):
        td.extend_(rows(start, start + 37))
    n = 5 + 37 * len(range(5, 500, 37))
    check_rows(td, n)
    check_rows(TensorDict.load_memmap(tmp_path / "buf"), n)
    check_rows(tensordict.TensorDict.load_memmap(tmp_path / "buf"), n)
    assert tensordict_rs.verify(tmp_path / "buf") == []
    # the reservation lives in the same files: longer than the leaf, which both libraries
    # load (they map the first shape x itemsize bytes)
    assert os.path.getsize(tmp_path / "buf" / "obs.memmap") > n * 3 * 4


def test_append_and_mapping_rows(tmp_path: Path) -> None:
    td = rows(0, 0).memmap(tmp_path / "buf")  # no rows: no data files yet
    for i in range(20):
        td.append_(
            {
                "obs": torch.full((3,), float(i)),
                "act": torch.tensor(-i),
                "flag": torch.tensor(i % 2 == 0),
            }
        )
    check_rows(td, 20)
    check_rows(tensordict.TensorDict.load_memmap(tmp_path / "buf"), 20)
    td.extend_(
        {"obs": rows(20, 22)["obs"], "act": rows(20, 22)["act"], "flag": rows(20, 22)["flag"]}
    )
    check_rows(TensorDict.load_memmap(tmp_path / "buf"), 22)
    # rows as a tensorclass (a torchrl-style step), one and several (TypeError before)
    more = rows(22, 25)
    td.extend_(Step(obs=more["obs"], act=more["act"], flag=more["flag"], batch_size=[3]))
    one = rows(25, 26)[0]
    td.append_(Step(obs=one["obs"], act=one["act"], flag=one["flag"], batch_size=[]))
    check_rows(TensorDict.load_memmap(tmp_path / "buf"), 26)


def test_resize_shrinks_and_grows_with_zeros(tmp_path: Path) -> None:
    td = rows(0, 10).memmap(tmp_path / "buf")
    td.resize_(4)
    check_rows(td, 4)
    check_rows(tensordict.TensorDict.load_memmap(tmp_path / "buf"), 4)
    td.resize_(7)
    assert td.batch_size == torch.Size([7])
    assert td["obs"][4:].abs().sum() == 0 and td["act"][4:].abs().sum() == 0  # not the old rows
    loaded = tensordict.TensorDict.load_memmap(tmp_path / "buf")
    assert torch.equal(loaded["obs"], td["obs"])
    with pytest.raises(ValueError, match="negative"):
        td.resize_(-1)


def test_anonymous_growth(tmp_path: Path) -> None:
    td = rows(0, 3).memmap_()
    before = td["obs"]
    for start in range(3, 300, 9):
        td.extend_(rows(start, start + 9))
    check_rows(td, 300)
    assert td.is_memmap() and td.batch_size == torch.Size([300])
    assert before.shape == (3, 3) and torch.equal(before, rows(0, 3)["obs"])  # still valid


@pytest.mark.parametrize("where", ["anonymous", "disk"])
def test_threads_appending_to_one_tree_keep_every_row(tmp_path: Path, where: str) -> None:
    """Four threads appending to one tree: in anonymous memory each growth committed over the
    others' and rows were lost without an error (773 of 1,200, found by an attack); a
    directory's growths take its lock. Anonymous growths now take one lock per process."""
    import threading

    empty = TensorDict({"t": torch.zeros(0, dtype=torch.int64)}, [0])
    td = empty.memmap_() if where == "anonymous" else empty.memmap(tmp_path / "buf")

    def work(w: int) -> None:
        for i in range(150):
            td.append_({"t": torch.tensor(w * 1000 + i)})

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert td.batch_size == torch.Size([600])
    assert sorted(td["t"].tolist()) == sorted(w * 1000 + i for w in range(4) for i in range(150))


_RESIZE_MEMORY = """
import resource, sys, torch
import tensordict_rs as rs
td = rs.TensorDict({"x": torch.ones(4, 1024)}, [4]).memmap(sys.argv[1])
td.resize_(2)  # the space of the rows shrunk away stays, with their ones
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
td.resize_(2 + (384 << 20) // 4096)  # 384 MiB of new rows
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(grown // 1024, float(td["x"][2:].sum()), float(td["x"][:2].sum()))
"""


def test_resize_on_disk_writes_zeros_without_making_them_in_memory(tmp_path: Path) -> None:
    """``resize_`` to many more rows made every new zero row in memory before writing it (a
    1 GB grow took 977 MB more, found by an attack): a buffer larger than RAM could not be
    sized up. The zeros are now written from one 1 MiB buffer; the rows a shrink left behind
    still read as zeros."""
    import subprocess

    script = tmp_path / "resize.py"
    script.write_text(_RESIZE_MEMORY)
    done = subprocess.run(
        [sys.executable, os.fspath(script), os.fspath(tmp_path / "buf")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    grown_mib, new_sum, kept_sum = done.stdout.split()
    assert int(grown_mib) < 128, grown_mib
    assert float(new_sum) == 0.0 and float(kept_sum) == 2 * 1024.0


def test_views_taken_before_a_growth_stay_valid_and_shared(tmp_path: Path) -> None:
    td = rows(0, 4).memmap(tmp_path / "buf")
    view = td["obs"]
    batch = td[1:3]
    for start in range(4, 4000, 100):  # well past any reservation: the file is mapped again
        td.extend_(rows(start, start + 100))
    view[0] = 42.0  # the old map and the new one are the same file
    assert td["obs"][0].tolist() == [42.0] * 3
    td["obs"][2] = -1.0
    assert batch["obs"][1].tolist() == [-1.0] * 3


def test_refused_trees(tmp_path: Path) -> None:
    nested = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}}, [2]).memmap(
        tmp_path / "n"
    )
    with pytest.raises(tensordict_rs.UnsupportedFormatError, match="'n'"):
        nested.extend_({"a": torch.zeros(1), "n": {"b": torch.zeros(1)}})
    with pytest.raises(RuntimeError, match="memmap_"):
        rows(0, 2).extend_(rows(2, 3))
    td = rows(0, 2).memmap(tmp_path / "k")
    for huge in (2**62, 2**70):  # torch's "int too big to convert" before (found by an attack)
        with pytest.raises(ValueError, match="more than any file or memory can hold"):
            td.resize_(huge)
    assert td.batch_size == torch.Size([2])
    with pytest.raises(KeyError, match="obs"):
        td.extend_(
            TensorDict(
                {
                    "act": torch.zeros(1, dtype=torch.int64),
                    "flag": torch.zeros(1, dtype=torch.bool),
                },
                [1],
            )
        )
    with pytest.raises(ValueError, match="batch size"):
        td.extend_(TensorDict({"obs": torch.zeros(1, 2, 3)}, [1, 2]))
    check_rows(TensorDict.load_memmap(tmp_path / "k"), 2)  # nothing changed


def _grow_in_child(prefix: str, start: int, count: int) -> None:
    td = TensorDict.load_memmap(prefix)
    td.extend_(rows(start, start + count))


def test_growth_from_several_processes_in_turn(tmp_path: Path) -> None:
    prefix = tmp_path / "buf"
    td = rows(0, 10).memmap(prefix)
    ctx = mp.get_context("spawn")
    n = 10
    for _ in range(3):
        p = ctx.Process(target=_grow_in_child, args=(os.fspath(prefix), n, 25))
        p.start()
        p.join(120)
        assert p.exitcode == 0
        n += 25
        # this process's view is stale; a growth here appends after the others' rows
        td.extend_(rows(n, n + 5))
        n += 5
    check_rows(td, n)
    check_rows(TensorDict.load_memmap(prefix), n)
    check_rows(tensordict.TensorDict.load_memmap(prefix), n)


def test_memmap_refresh_sees_new_rows(tmp_path: Path) -> None:
    a = rows(0, 4).memmap(tmp_path / "buf")
    b = rows(0, 4).memmap(tmp_path / "buf", existsok=True, copy_existing=True)
    c = TensorDict.load_memmap(tmp_path / "buf")
    a = TensorDict.load_memmap(tmp_path / "buf")
    a.extend_(rows(4, 9))
    assert b.batch_size == torch.Size([4]) and c.batch_size == torch.Size([4])
    check_rows(b.memmap_refresh_(), 9)  # a memory-mapped tree: refreshed from its directory
    check_rows(c.load_memmap_(tmp_path / "buf"), 9)  # a loaded one: loaded again in place
    ref = tensordict.TensorDict.load_memmap(tmp_path / "buf")
    check_rows(ref, 9)


def _snapshot(prefix: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(prefix.iterdir()) if p.is_file()}


def _same_tree(prefix: Path, before: dict[str, bytes]) -> None:
    """The files of ``before`` hold the same bytes (a data file may have grown a reservation
    past them, never changed), and no file came or went."""
    after = _snapshot(prefix)
    assert sorted(after) == sorted(before)
    for name, data in before.items():
        assert after[name][: len(data)] == data, name
        if not name.endswith(".memmap"):
            assert after[name] == data, name


@pytest.mark.parametrize(
    "other",
    [
        pytest.param({"extra": torch.full((4, 2), 7.0)}, id="a key more"),
        pytest.param({"obs": torch.ones(4, 5)}, id="other trailing dims"),
        pytest.param({"obs": torch.ones(4, 3, 2)}, id="more dims"),
    ],
)
def test_a_growth_never_writes_into_another_tree(tmp_path: Path, other: dict) -> None:
    """Another program saved another tree with as many rows at the prefix since this tree was
    loaded: the growth commits nothing and says why; the directory still loads as that tree
    here and in the reference (before, a key more got rows it never had: the reference loaded
    zeros and this library refused the tree; rows of other dims were written over its rows)."""
    prefix = tmp_path / "buf"
    td = TensorDict({"obs": torch.zeros(4, 3)}, [4]).memmap(prefix)
    fields = {"obs": torch.ones(4, 3), **other}
    TensorDict(fields, [4]).memmap(prefix, existsok=True)
    before = _snapshot(prefix)
    with pytest.raises((KeyError, ValueError), match=r"obs|extra"):
        td.extend_(TensorDict({"obs": torch.full((2, 3), 5.0)}, [2]))
    _same_tree(prefix, before)
    for lib in (tensordict_rs, tensordict):
        loaded = lib.TensorDict.load_memmap(prefix)
        assert loaded.batch_size == torch.Size([4])
        assert sorted(loaded.keys()) == sorted(fields)
        for key, value in fields.items():
            assert torch.equal(loaded[key], value)


def test_a_growth_after_another_save_of_another_dtype(tmp_path: Path) -> None:
    """The same keys and dims saved since in another dtype: the growth appends the rows in the
    directory's dtype (as ``copy_`` converts), after the rows the directory holds (before, the
    rows were written at the old dtype's offsets, over the new tree's rows)."""
    prefix = tmp_path / "buf"
    td = TensorDict({"obs": torch.zeros(4, 3)}, [4]).memmap(prefix)
    TensorDict({"obs": torch.ones(4, 3, dtype=torch.float64)}, [4]).memmap(prefix, existsok=True)
    td.extend_(TensorDict({"obs": torch.full((2, 3), 5.0)}, [2]))
    want = torch.cat([torch.ones(4, 3), torch.full((2, 3), 5.0)]).double()
    for loaded in (
        td,
        tensordict_rs.TensorDict.load_memmap(prefix),
        tensordict.TensorDict.load_memmap(prefix),
    ):
        assert loaded["obs"].dtype == torch.float64
        assert torch.equal(loaded["obs"], want)


def test_a_growth_after_another_save_of_the_same_layout(tmp_path: Path) -> None:
    """Another program saved the same layout at the prefix (new files): the growth appends to
    the files in the directory, and the tree shows the rows it appended, not the old files'
    reservation it still mapped."""
    prefix = tmp_path / "buf"
    td = rows(0, 4).memmap(prefix)
    td.extend_(rows(4, 6))  # the files now have a reservation this tree maps
    rows(0, 6).memmap(prefix, existsok=True)  # same rows, same keys: new files
    td.extend_(rows(6, 9))
    check_rows(td, 9)
    for lib in (tensordict_rs, tensordict):
        check_rows(lib.TensorDict.load_memmap(prefix), 9)


def test_rows_that_do_not_fit_are_refused_naming_the_key(tmp_path: Path) -> None:
    td = rows(0, 4).memmap(tmp_path / "buf")
    bad = rows(4, 6)
    bad["obs"] = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="'obs'"):
        td.extend_(bad)
    check_rows(TensorDict.load_memmap(tmp_path / "buf"), 4)
    ok = rows(4, 6)
    ok["obs"] = torch.arange(4, 6)[:, None].float()  # broadcast along the row, as copy_ takes it
    td.extend_(ok)
    check_rows(td, 6)


def test_a_growth_after_the_tree_changed_in_this_process(tmp_path: Path) -> None:
    """A growth keeps what it learnt of the tree (its leaves, their maps) for the next one,
    and must see that the tree changed in between: here a key more, loaded in place over the
    same tree object; the next growth appends every key after the rows the tree holds."""
    prefix = tmp_path / "buf"
    td = rows(0, 4).memmap(prefix)
    td.extend_(rows(4, 6))
    more = rows(0, 6)
    more["extra"] = torch.arange(6.0)
    more.memmap(prefix, existsok=True)
    td.load_memmap_(prefix)
    grown = rows(6, 9)
    grown["extra"] = torch.arange(6.0, 9.0)
    td.extend_(grown)
    td.extend_(rows(9, 10).update({"extra": torch.tensor([9.0])}))
    for loaded in (
        td,
        tensordict_rs.TensorDict.load_memmap(prefix),
        tensordict.TensorDict.load_memmap(prefix),
    ):
        check_rows(loaded.exclude("extra"), 10)
        assert torch.equal(loaded["extra"], torch.arange(10.0))


def test_a_leaf_set_in_memory_after_a_load_is_refused_not_dropped(tmp_path: Path) -> None:
    """A loaded tree is not locked: a leaf can be set to a tensor in ordinary memory. A
    growth writes into the leaf's file and then shows the file's rows, so it would drop the
    values set in memory: it refuses, naming the key, and writes nothing (found by an attack:
    the values set were silently replaced by the file's). A leaf mapped from its own file by
    another path (a relative one, then a chdir; a link to the directory) still grows."""
    prefix = tmp_path / "buf"
    rows(0, 4).memmap(prefix)
    td = TensorDict.load_memmap(prefix)
    mine = torch.full((4, 3), 7.0)
    td["obs"] = mine
    with pytest.raises(RuntimeError, match=r"extend_: key 'obs' is not memory-mapped in"):
        td.extend_(rows(4, 6))
    assert torch.equal(td["obs"], mine) and td.batch_size == torch.Size([4])
    check_rows(TensorDict.load_memmap(prefix), 4)
    check_rows(tensordict.TensorDict.load_memmap(prefix), 4)
    # after memmap_() writes it there, the growth goes on from the values set
    td.memmap_(prefix, existsok=True)
    td.extend_(rows(4, 6))
    assert torch.equal(td["obs"][:4], mine)
    assert torch.equal(TensorDict.load_memmap(prefix)["obs"][4:], rows(4, 6)["obs"])
    # a memory-mapped leaf from another directory is not the leaf's file either
    other = TensorDict.load_memmap(prefix)
    other["obs"] = rows(0, 6).memmap(tmp_path / "elsewhere")["obs"]
    with pytest.raises(RuntimeError, match="key 'obs' is not memory-mapped"):
        other.resize_(8)
    # the same files by other paths
    link = tmp_path / "link"
    link.symlink_to(prefix)
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        by_relative = TensorDict.load_memmap("buf")
    finally:
        os.chdir(here)
    by_relative.extend_(rows(6, 7).update({"obs": torch.zeros(1, 3)}))
    by_link = TensorDict.load_memmap(link)
    by_link.extend_(rows(7, 8).update({"obs": torch.zeros(1, 3)}))
    assert TensorDict.load_memmap(prefix).batch_size == torch.Size([8])


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_between_growths_nothing_keeps_a_map_alive(tmp_path: Path) -> None:
    """What a growth keeps for the next one holds no map: once the tree shows another
    directory, the old one's files are mapped no more (deleting them frees their space)."""
    td = rows(0, 4).memmap(tmp_path / "old")
    td.extend_(rows(4, 6))
    assert os.fspath(tmp_path / "old") in Path("/proc/self/maps").read_text()
    rows(0, 2).memmap(tmp_path / "new")
    td.load_memmap_(tmp_path / "new")
    assert os.fspath(tmp_path / "old") not in Path("/proc/self/maps").read_text()
    td.extend_(rows(2, 3))
    check_rows(td, 3)
    check_rows(tensordict.TensorDict.load_memmap(tmp_path / "new"), 3)


def test_a_first_file_made_by_another_growth_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leaf saved with no rows has no file until its first growth, which makes it without
    the lock: a growth that finds it made meanwhile by another (another thread's tree of the
    same directory, another process) reserves that file and goes on (it raised
    FileExistsError, seen once in a full run of the threads test below)."""
    prefix = tmp_path / "buf"
    TensorDict({"i": torch.zeros(0, 2, dtype=torch.int64)}, [0]).memmap(prefix)
    first, second = TensorDict.load_memmap(prefix), TensorDict.load_memmap(prefix)
    first.extend_(TensorDict({"i": torch.full((3, 2), 1)}, [3]))
    assert (prefix / "i.memmap").exists()
    import tensordict_rs.io.growth as growth

    real = growth.os.path.lexists
    # the second growth looked before the first made the file
    monkeypatch.setattr(
        growth.os.path, "lexists", lambda p: False if str(p).endswith("i.memmap") else real(p)
    )
    second.extend_(TensorDict({"i": torch.full((2, 2), 2)}, [2]))
    monkeypatch.undo()
    rows = TensorDict.load_memmap(prefix)["i"]
    assert rows[:, 0].tolist() == [1, 1, 1, 2, 2]


def test_growths_from_several_threads_each_with_its_tree(tmp_path: Path) -> None:
    """Threads each growing their own tree of one directory take turns at its lock; each
    growth after another's finds its kept state stale, reloads and appends after the rows
    the directory holds: every row lands exactly once, untorn, and each tree shows rows the
    directory holds."""
    import threading

    prefix = tmp_path / "buf"
    TensorDict({"i": torch.zeros(0, 2, dtype=torch.int64)}, [0]).memmap(prefix)
    trees = [TensorDict.load_memmap(prefix) for _ in range(4)]
    errors: list[BaseException] = []

    def grow(tag: int) -> None:
        try:
            for k in range(40):
                value = tag * 1000 + k
                trees[tag].extend_(TensorDict({"i": torch.full((3, 2), value)}, [3]))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=grow, args=(t,)) for t in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switch inside a growth's Python steps too
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    disk = TensorDict.load_memmap(prefix)["i"]
    for td in trees:
        assert len(td) >= 3 * 40 and torch.equal(td["i"], disk[: len(td)])
    for loaded in (TensorDict.load_memmap(prefix), tensordict.TensorDict.load_memmap(prefix)):
        values = loaded["i"]
        assert values.shape == (4 * 40 * 3, 2)
        runs = values[:, 0].reshape(-1, 3)  # each extend_ wrote 3 equal rows, never torn
        assert bool((runs == runs[:, :1]).all()) and bool((values[:, 1] == values[:, 0]).all())
        assert sorted(runs[:, 0].tolist()) == sorted(
            t * 1000 + k for t in range(4) for k in range(40)
        )
