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

from .._trees import non_tensor_source as _source

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
    """As in tensordict, strings of a tree loaded from a .tdz (copy-on-write) take writes in
    memory and leave the archive as it is: they raised NotADirectoryError (a meta.json
    rewritten inside the archive's path) after changing the value anyway. A tree mapped
    shared onto one (memmap_, also once sent to another process), whose tensor writes reach
    the file, refuses them naming the key and the archive, before changing anything (they
    were kept in memory only, silently: test_archive.py)."""
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
    with pytest.raises(ours.UnsupportedFormatError, match=r"'s'.*inplace\.tdz"):
        sent["s"][0] = "Z"
    assert sent["s"].tolist() == ["a", "b", "c"]
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


# ------------------------------------------------------------------------------------------
# In-place copies and row writes into the non-tensor entries of a saved tree


def _saved_pair(pkg: Any, path: Path) -> Any:
    """A tree with a stack, a NonTensorData and a nested stack, saved at ``path`` and loaded
    back (a loaded tree takes writes in place, which reach its files)."""
    td = pkg.TensorDict({"a": torch.zeros(3), "sub": {"b": torch.zeros(3)}}, [3])
    td["s"] = ["a", "b", "c"]
    td.set_non_tensor("one", "v")
    td["sub", "t"] = ["x", "y", "z"]
    td.memmap(path)
    return pkg.TensorDict.load_memmap(path)


def _values(td: Any) -> tuple[Any, ...]:
    return (
        td["a"].tolist(),
        td["sub", "b"].tolist(),
        list(td.get("s").tolist()),
        td.get_non_tensor("one"),
        list(td.get(("sub", "t")).tolist()),
    )


@pytest.mark.parametrize(
    "write",
    [
        lambda src, dst: dst.copy_(src),
        lambda src, dst: torch.stack(list(src.unbind(0)), out=dst),
        lambda src, dst: torch.cat([src[:1], src[1:]], out=dst),
        lambda src, dst: src.where(torch.tensor([True, True, True]), src, out=dst),
    ],
    ids=["copy_", "stack_out", "cat_out", "where_out"],
)
def test_in_place_copies_into_a_saved_tree_reach_its_non_tensor_files(
    tmp_path: Path, write: Any
) -> None:
    """copy_ / stack, cat, where(out=) wrote the tensors of a saved tree but left its strings
    as they were, in memory and on disk (found by an attack): a reload paired the new tensors
    with the old strings. tensordict 0.15.3 writes them in memory (and leaves its files)."""
    dst = _saved_pair(ours, tmp_path / "t")
    write(_source(ours), dst)
    want = ([1.0] * 3, [1.0] * 3, ["X", "Y", "Z"], "w", ["p", "q", "r"])
    got = _values(dst)
    assert got[:3] + got[4:] == want[:3] + want[4:]
    assert got[3] in ("w", ["w"] * 3)  # (a stack of one value per row after stack(out=))
    back = _values(TensorDict.load_memmap(tmp_path / "t"))
    assert back[:3] + back[4:] == want[:3] + want[4:]
    assert back[3] == "w"  # still one NonTensorData on disk
    theirs = _values(ref.TensorDict.load_memmap(tmp_path / "t"))
    assert theirs[:3] + theirs[4:] == want[:3] + want[4:]


def test_tensorclass_copy_into_a_saved_tree_reaches_its_string_field(tmp_path: Path) -> None:
    @ours.tensorclass
    class Item:
        x: torch.Tensor
        name: str

    Item(x=torch.zeros(3), name="old", batch_size=[3]).memmap(tmp_path / "c")
    loaded = Item.load_memmap(tmp_path / "c")
    loaded.copy_(Item(x=torch.ones(3), name="new", batch_size=[3]))
    back = Item.load_memmap(tmp_path / "c")
    assert (back.x.tolist(), back.name) == ([1.0, 1.0, 1.0], "new")


@pytest.mark.parametrize(
    "write",
    [
        lambda td: td.__setitem__(1, TensorDict({"a": torch.tensor(1.0), "one": "w"}, [])),
        lambda td: td.__setitem__(
            slice(0, 2), TensorDict({"a": torch.ones(2), "one": ["w", "u"]}, [2])
        ),
        lambda td: td.update_at_(TensorDict({"a": torch.tensor(1.0), "one": "w"}, []), 1),
        lambda td: td.copy_(TensorDict({"a": torch.ones(3), "one": ["w", "v", "v"]}, [3])),
        lambda td: torch.stack(
            [TensorDict({"a": torch.tensor(1.0), "one": f"r{i}"}, []) for i in range(3)], out=td
        ),
    ],
    ids=["row", "rows", "update_at_", "copy_", "stack_out"],
)
def test_per_row_value_into_a_saved_non_tensor_data_is_refused_before_writing(
    tmp_path: Path, write: Any
) -> None:
    """A row with another value turned a saved NonTensorData into a stack in memory while its
    meta.json kept the one old value: the row's string reverted on reload while its tensors
    were saved (found by an attack). Its directory cannot become a stack in place, so the
    write is refused naming the key, before anything is written."""
    td = _saved_pair(ours, tmp_path / "t")
    with pytest.raises(RuntimeError, match=r"""['"]one['"]"""):
        write(td)
    assert td["a"].tolist() == [0.0, 0.0, 0.0] and td.get_non_tensor("one") == "v"
    back = TensorDict.load_memmap(tmp_path / "t")
    assert back["a"].tolist() == [0.0, 0.0, 0.0] and back.get_non_tensor("one") == "v"


def test_nested_per_row_value_into_a_saved_non_tensor_data_is_refused(tmp_path: Path) -> None:
    td = TensorDict({"a": torch.zeros(3), "sub": {"b": torch.zeros(3)}}, [3])
    td.set_non_tensor(("sub", "tag"), "v")
    td.memmap(tmp_path / "t")
    loaded = TensorDict.load_memmap(tmp_path / "t")
    row = TensorDict({"a": torch.tensor(1.0), "sub": {"b": torch.tensor(1.0), "tag": "w"}}, [])
    with pytest.raises(RuntimeError, match="tag"):
        loaded[1] = row
    assert loaded["a"].tolist() == [0.0, 0.0, 0.0]
    assert TensorDict.load_memmap(tmp_path / "t")["sub", "b"].tolist() == [0.0, 0.0, 0.0]


def test_same_value_rows_into_a_saved_non_tensor_data_are_written(tmp_path: Path) -> None:
    """A row with the entry's own value, or a stack of one value everywhere, keeps one value:
    written (the tensors reach the disk, the NonTensorData its meta.json)."""
    td = _saved_pair(ours, tmp_path / "t")
    td[1] = TensorDict({"a": torch.tensor(1.0), "one": "v"}, [])
    td.copy_(TensorDict({"a": torch.full((3,), 2.0), "one": ["w", "w", "w"]}, [3]))
    back = TensorDict.load_memmap(tmp_path / "t")
    assert back["a"].tolist() == [2.0, 2.0, 2.0] and back.get_non_tensor("one") == "w"
    assert ref.TensorDict.load_memmap(tmp_path / "t").get_non_tensor("one") == "w"


# ------------------------------------------------------------------------------------------
# Saved values: what the load reads back, and writes in place after a newer save


def test_stack_with_an_empty_leading_dim_loads_with_its_batch_size(tmp_path: Path) -> None:
    """A tree of batch size [0, 3] (a mask that selects no row of a 2-D batch) holding a
    NonTensorStack: its meta.json holds ``"data": []``, which nests as [0] only; the load gave
    the stack its tree's dims instead of refusing the whole directory."""
    td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3])
    td["s"] = NonTensorStack.from_list([["a", "b", "c"], ["d", "e", "f"]])
    empty = td[torch.zeros(2, dtype=torch.bool)]
    assert tuple(empty.get("s").batch_size) == (0, 3)
    empty.memmap(tmp_path / "x")
    back = TensorDict.load_memmap(tmp_path / "x")
    assert tuple(back.batch_size) == (0, 3)
    assert tuple(back.get("s").batch_size) == (0, 3) and back.get("s").tolist() == []
    assert ours.verify(tmp_path / "x") == []
    # as tensordict-rs wrote it before (and tensordict would): no "shape", data nested [[], []]
    td3 = TensorDict({"a": torch.zeros(2, 0, 3)}, [2, 0, 3])
    td3.memmap(tmp_path / "y")
    os.makedirs(tmp_path / "y" / "s")
    meta = json.loads((tmp_path / "y" / "meta.json").read_text())
    meta["s"] = {"type": "NonTensorStack"}
    (tmp_path / "y" / "meta.json").write_text(json.dumps(meta))
    stack = {"_type": STACK_TYPE, "stack_dim": 0, "device": None, "data": [[], []]}
    (tmp_path / "y" / "s" / "meta.json").write_text(json.dumps(stack))
    assert tuple(TensorDict.load_memmap(tmp_path / "y").get("s").batch_size) == (2, 0, 3)


def test_non_tensor_data_past_64_mib_loads(tmp_path: Path) -> None:
    """A NonTensorData whose meta.json is past the 64 MiB bound of a TensorDict's saved and
    never loaded again (tensordict loads it): a value directory's meta.json is read up to the
    bound a stack's has, and saved over again."""
    td = TensorDict({"obs": torch.arange(4.0)}, [4])
    big = "x" * (65 << 20)
    td.set_non_tensor("bank", big)
    td.memmap(tmp_path / "x")
    for pkg in (ours, ref):
        back = pkg.TensorDict.load_memmap(tmp_path / "x")
        assert back["obs"].tolist() == [0.0, 1.0, 2.0, 3.0]
        assert len(back.get_non_tensor("bank")) == len(big), pkg
    td.memmap(tmp_path / "x", existsok=True)  # the old value directory is this tree's own
    assert len(TensorDict.load_memmap(tmp_path / "x").get_non_tensor("bank")) == len(big)
    td.memmap(tmp_path / "x.tdz")  # an archive reads it as a directory does
    assert len(TensorDict.load_memmap(tmp_path / "x.tdz").get_non_tensor("bank")) == len(big)
    assert ours.verify(tmp_path / "x") == [] and ours.verify(tmp_path / "x.tdz") == []


def test_rewrite_refuses_a_meta_json_saved_again_since(tmp_path: Path) -> None:
    """A tree loaded before the directory was saved again (by either library) writes a value
    in place with the token of the meta.json it loaded: the newer save's meta.json is refused,
    naming it, and kept; with the token in place the write goes through and gives the next."""
    native = ours._native
    for saver in (ours, ref):
        p = tmp_path / saver.__name__
        old = TensorDict({"a": torch.zeros(3)}, [3])
        old["s"] = ["old0", "old1", "old2"]
        old.set_non_tensor("note", "old")
        old.memmap(p)
        node, _ = native.load_tree(os.fspath(p), tokens=True)
        entries = {e[1]: e for e in node[2]}
        stack_token, note_token = entries["s"][6], entries["note"][3]
        assert isinstance(stack_token, int) and isinstance(note_token, int)
        assert native.value_meta_token(os.fspath(p), "s") == stack_token
        new = saver.TensorDict({"a": torch.ones(3)}, [3])
        new["s"] = ["new0", "new1", "new2"]
        new.set_non_tensor("note", "new")
        new.memmap(p, existsok=True)
        data = json.dumps(["old0", "R", "old2"]).encode()
        with pytest.raises(ours.InvalidTreeError, match=r"meta\.json"):
            native.rewrite_stack(os.fspath(p), "s", 0, None, data, None, expected=stack_token)
        with pytest.raises(ours.InvalidTreeError, match="saved again"):
            native.rewrite_non_tensor(os.fspath(p), "note", b'"reader"', expected=note_token)
        back = TensorDict.load_memmap(p)
        assert back.get("s").tolist() == ["new0", "new1", "new2"], saver
        assert back.get_non_tensor("note") == "new"
        current = native.value_meta_token(os.fspath(p), "s")
        data = json.dumps(["new0", "R", "new2"]).encode()
        nxt = native.rewrite_stack(os.fspath(p), "s", 0, None, data, None, expected=current)
        assert native.value_meta_token(os.fspath(p), "s") == nxt
        assert TensorDict.load_memmap(p).get("s").tolist() == ["new0", "R", "new2"]
        # no token: not checked, as before
        native.rewrite_non_tensor(os.fspath(p), "note", b'"any"')
        assert TensorDict.load_memmap(p).get_non_tensor("note") == "any"


def test_a_saved_copy_does_not_share_its_stacks_with_the_source(tmp_path: Path) -> None:
    # memmap(prefix) is a copy: a row written into either tree reached the other (the copy
    # took the source's NonTensorStack), and the source's writes rewrote the copy's directory
    for lib in (ours, ref):
        src = lib.TensorDict({"x": torch.zeros(2), "s": lib.NonTensorStack("a", "b")}, [2])
        copy = src.memmap(tmp_path / lib.__name__ / "c")
        copy[0] = lib.TensorDict({"x": torch.tensor(1.0), "s": "p"}, [])
        assert src["s"] == ["a", "b"], lib
        src[1] = lib.TensorDict({"x": torch.tensor(5.0), "s": "q"}, [])
        assert copy["s"] == ["p", "b"], lib
        assert ours.TensorDict.load_memmap(tmp_path / lib.__name__ / "c")["s"] == ["p", "b"]
