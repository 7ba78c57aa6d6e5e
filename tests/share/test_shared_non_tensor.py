"""Non-tensor values shared between processes (``share_memory_()``,
``memmap_(share_non_tensor=True)``) and written in place into saved trees, side by side with
tensordict 0.15.3: a value written in a child process is read in the parent exactly when
tensordict's is, and the saved meta.json follows every in-place write."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as ours
import torch
from tensordict_rs import NonTensorData, NonTensorStack, TensorDict

# JSON pairs of tensordict's own test (its fifth pair, a dict with an int key, is not JSON)
PAIRS = [
    ("something", "something else"),
    (0, 1),
    (0.0, 1.0),
    ([0, "something", 2], [9, "something else", 11]),
    ({"key1": 1, "k2": 3}, {"key1": 4, "k5": 6}),
]
LIBS = [ours, ref]


def _tree(pkg: Any) -> Any:
    return pkg.TensorDict(
        {f"v{i}": pkg.NonTensorData(data=a, batch_size=[]) for i, (a, _) in enumerate(PAIRS)}, []
    )


def _write_all(td: Any, how: str) -> None:
    """The child: every value replaced in place, through the entry's ``update_`` or
    ``update(inplace=True)`` (tensordict's two in-place paths)."""
    pkg = __import__(type(td).__module__.split(".")[0])
    for i, (_, b) in enumerate(PAIRS):
        entry = td.get(f"v{i}")
        if how == "update_":
            entry.update_(pkg.NonTensorData(data=b))
        else:
            entry.update(pkg.NonTensorData(data=b), inplace=True, non_blocking=False)


def _run(target: Any, td: Any, *args: Any) -> None:
    """``target(td, *args)`` in a child process: spawned for tensordict_rs (the tree crosses
    pickled, its shared cells as descriptors), forked for tensordict (whose shared values are
    multiprocessing objects of the default context, which a spawned child cannot take)."""
    method = "spawn" if type(td).__module__.startswith("tensordict_rs") else "fork"
    proc = mp.get_context(method).Process(target=target, args=(td, *args))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0


def _values(td: Any) -> list[Any]:
    return [td[f"v{i}"] for i in range(len(PAIRS))]


@pytest.mark.parametrize("pkg", LIBS, ids=["rs", "ref"])
@pytest.mark.parametrize("strategy", ["shared", "memmap-shared", "memmap"])
def test_child_writes_reach_the_parent_as_in_tensordict(
    pkg: Any, strategy: str, tmp_path: Path
) -> None:
    td = _tree(pkg)
    if strategy == "shared":
        td.share_memory_()
    else:
        td.memmap_(tmp_path, share_non_tensor=strategy == "memmap-shared")
    before = [a for a, _ in PAIRS]
    after = [b for _, b in PAIRS]
    assert _values(td) == before
    _run(_write_all, td, "update_" if strategy != "memmap" else "update")
    # shared values are seen by the parent; memmap without share_non_tensor is not shared
    # (each process has its own values), but the child rewrote the files
    assert _values(td) == (before if strategy == "memmap" else after)
    if strategy != "shared":
        loaded = pkg.TensorDict.load_memmap(tmp_path)
        assert _values(loaded) == after


def _write_rows(td: Any, value: int) -> None:
    pkg = __import__(type(td).__module__.split(".")[0])
    td[1::2] = pkg.TensorDict({"val": pkg.NonTensorData(data=value, batch_size=[5])}, [5])


@pytest.mark.parametrize("pkg", LIBS, ids=["rs", "ref"])
@pytest.mark.parametrize("strategy", ["shared", "memmap-shared", "memmap"])
def test_stack_rows_written_in_a_child(pkg: Any, strategy: str, tmp_path: Path) -> None:
    """tensordict's test_shared_stack: rows of a stack written by a child process."""
    td = pkg.TensorDict({"val": pkg.NonTensorData(data=0, batch_size=[10])}, [10])
    td[1::2] = pkg.TensorDict({"val": pkg.NonTensorData(data=1, batch_size=[5])}, [5])
    if strategy == "shared":
        td.share_memory_()
    else:
        td.memmap_(tmp_path, share_non_tensor=strategy == "memmap-shared")
    assert td.get("val").tolist() == [0, 1] * 5
    _write_rows(td, 2)  # in this process
    assert td.get("val").tolist() == [0, 2] * 5
    if strategy != "shared":
        assert pkg.TensorDict.load_memmap(tmp_path).get("val").tolist() == [0, 2] * 5
    _run(_write_rows, td, 3)
    assert td.get("val").tolist() == ([0, 2] if strategy == "memmap" else [0, 3]) * 5
    if strategy != "shared":
        assert pkg.TensorDict.load_memmap(tmp_path).get("val").tolist() == [0, 3] * 5


@pytest.mark.parametrize("pkg", LIBS, ids=["rs", "ref"])
@pytest.mark.parametrize("strategy", ["shared", "memmap"])
def test_in_place_updates_in_one_process(pkg: Any, strategy: str, tmp_path: Path) -> None:
    """tensordict's test_shared_memmap_single: update_ and update(inplace=True) write the
    value (and the saved file); update() without inplace is refused (the entry is locked)."""
    for i, (a, b) in enumerate(PAIRS):
        td = pkg.TensorDict({"val": pkg.NonTensorData(data=a, batch_size=[])}, [])
        path = tmp_path / str(i)
        td.share_memory_() if strategy == "shared" else td.memmap_(path)
        with pytest.raises(RuntimeError, match="lock"):
            td.get("val").update(pkg.NonTensorData(data="something else", batch_size=[]))
        td.get("val").update_(pkg.NonTensorData(data=b, batch_size=[]))
        assert td["val"] == b and td.get("val").data == b
        if strategy == "memmap":
            assert pkg.TensorDict.load_memmap(path)["val"] == b
        td.get("val").update(pkg.NonTensorData(data=a), inplace=True, non_blocking=False)
        assert td["val"] == a
        if strategy == "memmap":
            assert pkg.TensorDict.load_memmap(path)["val"] == a


@pytest.mark.parametrize("pkg", LIBS, ids=["rs", "ref"])
def test_set_into_a_memmapped_tree_rewrites_the_file(pkg: Any, tmp_path: Path) -> None:
    td = pkg.TensorDict({"a": torch.zeros(2), "name": "before"}, [2]).memmap_(tmp_path)
    td.set_("name", "after")
    assert td["name"] == "after"
    assert pkg.TensorDict.load_memmap(tmp_path)["name"] == "after"


def test_loaded_tree_writes_reach_its_file(tmp_path: Path) -> None:
    TensorDict({"name": "x", "rows": ["a", "b"]}, [2]).memmap(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    loaded.get("name").update_(NonTensorData("y"))
    loaded.get("rows")[1] = "c"
    again = ref.TensorDict.load_memmap(tmp_path)  # and tensordict reads what we rewrote
    assert again["name"] == "y" and again.get("rows").tolist() == ["a", "c"]


def _write_loaded(td: Any) -> None:
    td.get("rows")[1] = "child"
    td.get("name").update_(NonTensorData("child"))
    td.get("added").update_(NonTensorData("child"))
    td["a"][0] = 9.0


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_loaded_tree_sent_to_a_process_keeps_its_non_tensor_writes(
    method: str, tmp_path: Path
) -> None:
    """A tree loaded with load_memmap and sent to a spawned process: the child's in-place
    non-tensor writes rewrite the meta.json files as its tensor writes reach theirs (they
    were dropped: only a tree made by memmap_() was bound again in the child). A value set
    in memory after the load stays in memory, there as here."""
    TensorDict({"a": torch.zeros(2), "name": "x", "rows": ["a", "b"]}, [2]).memmap(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    loaded.set_non_tensor("added", "mine")  # not in the directory
    proc = mp.get_context(method).Process(target=_write_loaded, args=(loaded,))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    disk = TensorDict.load_memmap(tmp_path)
    assert disk["a"].tolist() == [9.0, 0.0]
    assert disk.get("rows").tolist() == ["a", "child"]
    assert disk["name"] == "child"
    assert "added" not in disk.keys()
    again = ref.TensorDict.load_memmap(tmp_path)
    assert again["name"] == "child" and again.get("rows").tolist() == ["a", "child"]


def _write_row(td: Any, row: int, rounds: int) -> None:
    for i in range(rounds):
        td.get("rows")[row] = f"{row}-{i}"


def test_concurrent_row_writes_are_all_kept() -> None:
    """Two processes writing different rows of one shared stack at the same time: each write
    is a read-modify-write of the cell, so neither overwrites the other's rows."""
    td = TensorDict({"rows": ["", "", ""]}, [3]).share_memory_()
    procs = [mp.get_context("spawn").Process(target=_write_row, args=(td, r, 100)) for r in (0, 2)]
    for p in procs:
        p.start()
    _write_row(td, 1, 100)
    for p in procs:
        p.join(600)
        assert p.exitcode == 0
    assert td.get("rows").tolist() == ["0-99", "1-99", "2-99"]


def _write_rows_forever(td: Any, ready: Any) -> None:
    ready.set()
    i = 0
    while True:
        td.get("rows")[i % 50] = f"busy{i}"
        i += 1


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_a_writer_killed_mid_write_leaves_the_stack_usable() -> None:
    """A process terminated while it writes rows of a shared stack (``pool.terminate()``, an
    abandoned ``map_iter``) held the cell's lock while Python computed the new value: the
    version stayed odd, and every later read or write, in every process, waited 10 s and
    raised TimeoutError (found by an attack, on the first of 10 kills). The lock is now held
    only inside the native store."""
    import time

    td = TensorDict({"rows": ["idle" * 20] * 50}, [50]).share_memory_()
    ctx = mp.get_context("fork")
    for trial in range(5):
        ready = ctx.Event()
        writer = ctx.Process(target=_write_rows_forever, args=(td, ready))
        writer.start()
        assert ready.wait(60)
        time.sleep(0.2)
        writer.terminate()
        writer.join(60)
        start = time.monotonic()
        td.get("rows")[0] = f"parent{trial}"
        assert td.get("rows").tolist()[0] == f"parent{trial}"
        assert time.monotonic() - start < 5, trial
        assert all(isinstance(v, str) for v in td.get("rows").tolist())


def test_a_value_larger_than_its_cell_is_refused_and_the_old_one_kept() -> None:
    td = TensorDict({"name": "short"}, []).share_memory_()
    cell = td.get("name")._shared
    with pytest.raises(ValueError, match="holds at most"):
        td.get("name").update_(NonTensorData("x" * (cell.capacity + 1)))
    assert td["name"] == "short"
    td.get("name").update_(NonTensorData("y" * (cell.capacity - 2)))  # two quotes: fits
    assert len(td["name"]) == cell.capacity - 2


def test_values_json_cannot_hold_stay_local() -> None:
    """A value that is not JSON is not put in shared memory (values are stored as JSON): it
    stays this process's own; the JSON values beside it are shared."""
    td = TensorDict({"obj": NonTensorData(object), "name": "a"}, []).share_memory_()
    assert not td.get("obj")._is_shared and td.get("name")._is_shared
    assert td["obj"] is object


@dataclasses.dataclass
class Custom:
    """A value JSON cannot hold (tensordict's test_shared_limitations)."""

    text: str


def _write_custom(td: Any) -> None:
    try:
        td.get("val").update_(type(td.get("val"))(Custom("b")))
    except NotImplementedError:
        raise SystemExit(3) from None


@pytest.mark.parametrize("pkg", LIBS, ids=["ours", "ref"])
def test_local_values_of_a_shared_tree_refuse_writes(pkg: Any) -> None:
    """Such a value, written in place, would reach no other process: refused, in this process
    and in one that received the tree, as tensordict refuses it; the tree is left as it was."""
    td = pkg.TensorDict({"val": pkg.NonTensorData(Custom("a"))}, []).share_memory_()
    other = pkg.TensorDict({"val": pkg.NonTensorData(Custom("b"))}, [])
    with pytest.warns(UserWarning, match=r"update_\(\) skipped the non-tensor entries \['val'\]"):
        td.update_(other)  # skipped, as tensordict 0.15.3 does
    with pytest.raises(NotImplementedError, match="Updating Custom within a shared/memmaped"):
        td.get("val").update(pkg.NonTensorData(Custom("b")), inplace=True)
    assert td["val"] == Custom("a")
    child = mp.get_context("fork").Process(target=_write_custom, args=(td,))
    child.start()
    child.join()
    assert child.exitcode == 3
    assert td["val"] == Custom("a")
    copy = td.clone()  # a clone is not shared: it takes writes
    copy.get("val").update_(pkg.NonTensorData(Custom("c")))
    assert copy["val"] == Custom("c")


def test_shared_values_read_back_fresh_copies() -> None:
    td = TensorDict({"v": NonTensorData([1, 2])}, []).share_memory_()
    got = td["v"]
    got.append(3)  # a copy, as a list read from tensordict's shared manager is
    assert td["v"] == [1, 2]


def test_shared_stack_views_and_pickles_by_value() -> None:
    import pickle

    td = TensorDict(batch_size=[4])
    td["s"] = ["a", "b", "c", "d"]
    td.share_memory_()
    stack = td.get("s")
    assert stack.is_shared() and stack[1:].is_shared()
    stack[1:][0] = "z"  # a view writes the shared cells
    assert td.get("s").tolist() == ["a", "z", "c", "d"]
    back = pickle.loads(pickle.dumps(stack))
    assert back.tolist() == ["a", "z", "c", "d"] and not back.is_shared()
    entry = pickle.loads(pickle.dumps(td.get(("s",))[0]))
    assert isinstance(entry, NonTensorData) and entry.data == "a"
    assert isinstance(stack, NonTensorStack)


@pytest.mark.parametrize("pkg", LIBS, ids=["rs", "ref"])
@pytest.mark.parametrize("strategy", ["plain", "shared", "memmap"])
def test_update_at_writes_non_tensor_rows(pkg: Any, strategy: str, tmp_path: Path) -> None:
    """``update_at_`` writes the rows of a non-tensor entry as ``td[idx] = ...`` does: a value
    that differs turns a NonTensorData into a stack, then rows of the stack are written."""
    td = pkg.TensorDict(
        {"val": pkg.NonTensorData(data=0, batch_size=[6]), "x": torch.zeros(6)}, [6]
    )
    td.update_at_(
        pkg.TensorDict({"val": pkg.NonTensorData(data=1, batch_size=[3])}, [3]), slice(1, None, 2)
    )
    assert td.get("val").tolist() == [0, 1] * 3
    if strategy == "shared":
        td.share_memory_()
    elif strategy == "memmap":
        td.memmap_(tmp_path)
    td.update_at_(
        pkg.TensorDict({"val": pkg.NonTensorData(data=2, batch_size=[2])}, [2]), slice(0, 2)
    )
    assert td.get("val").tolist() == [2, 2, 0, 1, 0, 1]
    if strategy == "memmap":
        assert pkg.TensorDict.load_memmap(tmp_path).get("val").tolist() == [2, 2, 0, 1, 0, 1]


@pytest.mark.parametrize("pkg", LIBS, ids=["rs", "ref"])
@pytest.mark.parametrize("batch", [[3], [2, 2]])
def test_set_of_a_stack_with_its_own_linked_list(pkg: Any, batch: list[int]) -> None:
    """``td.set_(key, td[key])``: the LinkedList ``td[key]`` gives is the values row by row
    (it once went into every row as one value)."""
    values: Any = ["a", "b", "c"] if batch == [3] else [["a", "b"], ["c", "d"]]
    td = pkg.TensorDict(batch_size=batch)
    td["s"] = values
    td.set_("s", td["s"])
    assert td.get("s").tolist() == values


def test_a_value_refused_for_its_cell_never_reaches_the_saved_tree(tmp_path: Path) -> None:
    # a saved tree whose values are shared: a value over the cell's capacity is refused with
    # the old one kept in memory and in the directory (the file was written before the check)
    td = TensorDict({"a": torch.zeros(3)}, [3])
    td["s"] = ["a", "b", "c"]
    td.set_non_tensor("note", "v")
    live = td.memmap_(tmp_path / "t", share_non_tensor=True)
    big = "x" * 300_000
    with pytest.raises(ValueError, match="holds at most"):
        live.get("s")[1] = big
    with pytest.raises(ValueError, match="holds at most"):
        live.get("note").update_(NonTensorData(big))
    disk = TensorDict.load_memmap(tmp_path / "t")
    assert live.get("s").tolist() == disk.get("s").tolist() == ["a", "b", "c"]
    assert live.get_non_tensor("note") == disk.get_non_tensor("note") == "v"
    live.get("s")[2] = "z"  # a later accepted write: the directory follows memory
    assert TensorDict.load_memmap(tmp_path / "t").get("s").tolist() == ["a", "b", "z"]
