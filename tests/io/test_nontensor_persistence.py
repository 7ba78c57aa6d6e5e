"""Strings per row on disk and across processes: NonTensorStack in memmap directories and .tdz
archives (both ways with tensordict 0.15.3), anonymous maps, sharing, DataLoader batches,
consolidate. Values are JSON; anything else is refused naming the key, never pickled."""

from __future__ import annotations

import json
import os
import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as ours
import torch
import torch.multiprocessing as mp
from tensordict_rs import NonTensorStack, TensorDict

STACK_TYPE = "<class 'tensordict.tensorclass.NonTensorStack'>"


def sample(pkg: Any) -> Any:
    """Strings per row (1-D, 2-D, nested), a mixed JSON stack, one value for all rows, tensors."""
    td = pkg.TensorDict({"x": torch.arange(6.0).reshape(3, 2)}, [3])
    td["text"] = ["first", "second", "third"]
    td["mixed"] = ["a", 1, None]
    td["json"] = pkg.NonTensorStack.from_list([{"k": [1, 2]}, 2.5, "é 日本 🙂"])
    td.set_non_tensor("one", ["one", "value"])
    td["sub"] = pkg.TensorDict({"tags": ["p", "q", "r"], "y": torch.zeros(3)}, [3])
    td["grid"] = pkg.NonTensorStack.from_list([["a", "b"], ["c", "d"], ["e", "f"]])
    return td


def observe(td: Any) -> dict[str, Any]:
    """What a user reads back: type, values, batch size of every entry."""
    out: dict[str, Any] = {"batch": tuple(td.batch_size)}
    for key in td.keys(include_nested=True, leaves_only=True):
        value = td.get(key)
        name = type(value).__name__
        if isinstance(value, torch.Tensor):
            out[str(key)] = (name.replace("MemoryMappedTensor", "Tensor"), value.tolist())
        elif name == "NonTensorStack":
            out[str(key)] = (name, value.tolist(), tuple(value.batch_size))
        else:
            out[str(key)] = (name, value.data, tuple(value.batch_size))
    return out


# ------------------------------------------------------------------------------------------
# Directories, both ways


def test_reference_directory_loads_here(tmp_path: Path) -> None:
    sample(ref).memmap(tmp_path / "ref")
    assert observe(TensorDict.load_memmap(tmp_path / "ref")) == observe(
        ref.TensorDict.load_memmap(tmp_path / "ref")
    )


def test_directory_written_here_loads_in_reference(tmp_path: Path) -> None:
    sample(ours).memmap(tmp_path / "ours")
    assert observe(ref.TensorDict.load_memmap(tmp_path / "ours")) == observe(
        sample(ref).memmap(tmp_path / "ref")
    )


def test_stack_meta_json_is_the_references(tmp_path: Path) -> None:
    """The stack's directory holds one compact meta.json, byte for byte the reference's
    (ASCII values; non-ASCII strings are written as UTF-8, which the reference reads)."""
    for pkg, name in ((ours, "ours"), (ref, "ref")):
        td = pkg.TensorDict({"x": torch.zeros(3)}, [3])
        td["text"] = ["a", "b", "c"]
        td["grid"] = torch.stack([pkg.NonTensorStack("a", "b", "c")] * 2, 1)
        td.memmap(tmp_path / name)
    for key in ("text", "grid"):
        mine = (tmp_path / "ours" / key / "meta.json").read_bytes()
        theirs = (tmp_path / "ref" / key / "meta.json").read_bytes()
        assert mine == theirs, key
        assert sorted(os.listdir(tmp_path / "ours" / key)) == ["meta.json"]
    parent = json.loads((tmp_path / "ours" / "meta.json").read_bytes())
    assert parent["text"] == {"type": "NonTensorStack"}


def test_stack_meta_json_layout(tmp_path: Path) -> None:
    td = TensorDict({"s": NonTensorStack("a", "b")}, [2], device="cpu")
    td.memmap(tmp_path / "d")
    raw = (tmp_path / "d" / "s" / "meta.json").read_bytes()
    assert raw == (
        b'{"_type":"' + STACK_TYPE.encode() + b'","_format_version":1,'
        b'"_class":"tensordict:NonTensorStack","stack_dim":0,"device":"cpu","data":["a","b"]}'
    )


def test_stack_of_lists_round_trips_here_and_reads_in_reference(tmp_path: Path) -> None:
    """A 1-D stack whose values are equal-length lists: its JSON is the same as a 2-D stack's.
    The reference reads both as 2-D; here the saved stack keeps its own batch size."""
    stack = ours.NonTensorStack(ours.NonTensorData([1, 2]), ours.NonTensorData([3, 4]))
    TensorDict({"s": stack}, [2]).memmap(tmp_path / "d")
    back = TensorDict.load_memmap(tmp_path / "d").get("s")
    assert back.batch_size == (2,) and back.tolist() == [[1, 2], [3, 4]]
    theirs = ref.TensorDict.load_memmap(tmp_path / "d").get("s")
    assert theirs.tolist() == [[1, 2], [3, 4]]


def test_loaded_stack_is_writable_and_rewrites_its_file(tmp_path: Path) -> None:
    """Writing a row of a saved tree rewrites the stack's meta.json, as the reference does."""
    for pkg, name in ((ours, "ours"), (ref, "ref")):
        td = sample(pkg).memmap(tmp_path / name)
        row = td[1].clone()
        row["text"] = "CHANGED"
        td[1] = row
    for loader in (TensorDict.load_memmap, ref.TensorDict.load_memmap):
        assert loader(tmp_path / "ours")["text"] == ["first", "CHANGED", "third"]
    assert json.loads((tmp_path / "ours" / "text" / "meta.json").read_bytes()) == json.loads(
        (tmp_path / "ref" / "text" / "meta.json").read_bytes()
    )


def test_loaded_batch_carries_its_rows(tmp_path: Path) -> None:
    sample(ref).memmap(tmp_path / "d")
    loaded = TensorDict.load_memmap(tmp_path / "d")
    rows = torch.tensor([2, 0, 2])
    batch = loaded[rows]
    assert batch["text"] == ["third", "first", "third"]
    assert batch["sub", "tags"] == ["r", "p", "r"]
    assert batch["grid"] == [["e", "f"], ["a", "b"], ["e", "f"]]
    assert batch.get("one").data == ["one", "value"]
    assert loaded.__getitems__([1, 0])["text"] == ["second", "first"]


# ------------------------------------------------------------------------------------------
# .tdz archives, both ways


def test_reference_archive_loads_here(tmp_path: Path) -> None:
    sample(ref).memmap(tmp_path / "ref.tdz")
    assert observe(TensorDict.load_memmap(tmp_path / "ref.tdz")) == observe(
        ref.TensorDict.load_memmap(tmp_path / "ref.tdz")
    )


def test_archive_written_here_loads_in_reference(tmp_path: Path) -> None:
    sample(ours).memmap(tmp_path / "ours.tdz")
    assert observe(ref.TensorDict.load_memmap(tmp_path / "ours.tdz")) == observe(
        sample(ref).memmap(tmp_path / "ref.tdz")
    )
    assert ours.verify(tmp_path / "ours.tdz") == []


# ------------------------------------------------------------------------------------------
# Values that are not JSON


@pytest.mark.parametrize(
    "value", [object(), {1, 2}, float("nan"), b"bytes", {1: "int key"}], ids=repr
)
def test_non_json_value_is_refused_naming_the_key(tmp_path: Path, value: Any) -> None:
    td = TensorDict({"x": torch.zeros(2)}, [2])
    td["sub"] = TensorDict({"bad": NonTensorStack("ok", value)}, [2])
    with pytest.raises(ours.InvalidTreeError, match=r"""['"]bad['"]"""):
        td.memmap(tmp_path / "d")
    assert not (tmp_path / "d" / "sub" / "bad").exists()
    assert not list(tmp_path.rglob("*.pkl")) and not list(tmp_path.rglob("*.pickle"))


@pytest.mark.parametrize("how", ["saved", "saved and shared"])
@pytest.mark.parametrize(
    "write",
    [
        lambda td: td["s"].__setitem__(0, float("inf")),
        lambda td: td["s"].__setitem__(slice(0, 2), [object(), "ok"]),
        lambda td: td.update_({"s": NonTensorStack("ok", {1, 2}, "ok")}),
    ],
    ids=["row", "rows", "update_"],
)
def test_refused_write_into_a_saved_stack_changes_nothing(
    tmp_path: Path, how: str, write: Any
) -> None:
    """A write the directory refuses (a value that is not JSON) left the value in memory, the
    disk unchanged, and every later write to the stack refused for the bad value."""
    td = TensorDict({"x": torch.arange(3.0)}, [3])
    td["s"] = ["a", "b", "c"]
    m = td.memmap(tmp_path / "t", share_non_tensor=how == "saved and shared")
    with pytest.raises(ours.InvalidTreeError, match=r"""['"]s['"]"""):
        write(m)
    assert m["s"].tolist() == ["a", "b", "c"]
    assert TensorDict.load_memmap(tmp_path / "t")["s"].tolist() == ["a", "b", "c"]
    m["s"][1] = "valid"  # the stack still takes writes, and they reach the disk
    assert m["s"].tolist() == ["a", "valid", "c"]
    assert TensorDict.load_memmap(tmp_path / "t")["s"].tolist() == ["a", "valid", "c"]
    assert ref.TensorDict.load_memmap(tmp_path / "t")["s"].tolist() == ["a", "valid", "c"]


def test_archive_non_tensor_values_are_written_in_memory(tmp_path: Path) -> None:
    """As in tensordict, strings of a tree loaded from a .tdz (or sent to another process
    after memmap_ into one) take writes in memory and leave the archive as it is: they raised
    NotADirectoryError (a meta.json rewritten inside the archive's path) after changing the
    value anyway."""
    for pkg in (ours, ref):
        arc = tmp_path / f"{pkg.__name__}.tdz"
        td = pkg.TensorDict({"x": torch.arange(3.0)}, [3])
        td["s"] = pkg.NonTensorStack("a", "b", "c")
        td.set_non_tensor("one", "o")
        td.memmap(arc)
        loaded = pkg.TensorDict.load_memmap(arc)
        loaded["s"][1] = "Q"
        loaded.set_("one", "NEW")
        assert loaded["s"].tolist() == ["a", "Q", "c"] and loaded["one"] == "NEW", pkg
        again = TensorDict.load_memmap(arc)
        assert again["s"].tolist() == ["a", "b", "c"] and again["one"] == "o", pkg
    td = TensorDict({"x": torch.arange(3.0)}, [3])
    td["s"] = ["a", "b", "c"]
    td.memmap_(tmp_path / "inplace.tdz")
    sent = pickle.loads(bytes(ForkingPickler.dumps(td)))
    sent["s"][0] = "Z"
    assert sent["s"].tolist() == ["Z", "b", "c"]
    assert TensorDict.load_memmap(tmp_path / "inplace.tdz")["s"].tolist() == ["a", "b", "c"]


def test_pickled_reference_stack_is_refused(tmp_path: Path) -> None:
    """The reference pickles a stack it cannot write as JSON; that file is never unpickled."""
    td = ref.TensorDict({"s": ref.NonTensorStack(1 + 2j, 3 + 4j)}, [2])
    td.memmap(tmp_path / "d")
    assert (tmp_path / "d" / "s" / "pickle.pkl").exists()
    with pytest.raises(ours.UnsupportedFormatError, match="pickle"):
        TensorDict.load_memmap(tmp_path / "d")


# ------------------------------------------------------------------------------------------
# Anonymous maps, processes, DataLoader workers, consolidate


def test_anonymous_memmap_keeps_the_strings() -> None:
    td = sample(ours).memmap_()
    assert td.is_memmap() and td["text"] == ["first", "second", "third"]
    assert td[torch.tensor([1])]["grid"] == [["c", "d"]]


def _child_reads(queue: Any, back: Any) -> None:
    td = queue.get()
    back.put((td["text"], td[2]["sub", "tags"], td.get("one").data))


@pytest.mark.parametrize("how", ["anonymous", "directory"])
def test_process_receives_the_strings(tmp_path: Path, how: str) -> None:
    td = sample(ours)
    td = td.memmap_() if how == "anonymous" else td.memmap(tmp_path / "d")
    ctx = mp.get_context("spawn")
    queue, back = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_child_reads, args=(queue, back))
    child.start()
    queue.put(td)
    got = back.get(timeout=120)
    child.join(60)
    assert got == (["first", "second", "third"], "r", ["one", "value"])


def test_pickle_of_a_stack_round_trips() -> None:
    td = sample(ours)
    assert observe(pickle.loads(pickle.dumps(td))) == observe(td)


def test_dataloader_workers_get_batches_with_their_strings(tmp_path: Path) -> None:
    n = 64
    td = TensorDict({"i": torch.arange(n)}, [n])
    td["text"] = [f"row{i}" for i in range(n)]
    td = td.memmap(tmp_path / "d")
    loader = torch.utils.data.DataLoader(
        td, batch_size=8, shuffle=True, num_workers=2, collate_fn=lambda x: x
    )
    seen = 0
    for batch in loader:
        assert batch["text"] == [f"row{int(i)}" for i in batch["i"]]
        seen += len(batch["text"])
    assert seen == n


def test_consolidate_keeps_stacks_as_the_reference_does() -> None:
    """A consolidated tree keeps its stacks; sent to a process (ForkingPickler: its arena is
    anonymous memory, which plain pickle refuses here) it comes back with them."""
    mine, theirs = sample(ours).consolidate(), sample(ref).consolidate()
    assert mine.is_consolidated()
    assert observe(mine) == observe(theirs)
    assert observe(pickle.loads(ForkingPickler.dumps(mine))) == observe(theirs)


# ------------------------------------------------------------------------------------------
# The command line


def test_info_and_verify_report_stacks(tmp_path: Path) -> None:
    """``info`` names a stack's type and row count without importing torch; ``verify`` passes."""
    import subprocess
    import sys

    sample(ref).memmap(tmp_path / "d")
    assert ours.verify(tmp_path / "d") == []
    run = subprocess.run(
        [sys.executable, "-m", "tensordict_rs", "info", "--json", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    dumped = run.stdout
    assert "NonTensorStack" in dumped and "first" not in dumped  # the values are not dumped
    run = subprocess.run(
        [sys.executable, "-m", "tensordict_rs", "verify", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
