"""Non-tensor entries (strings, NonTensorData, NonTensorStack) written by the in-place copies:
``copy_``, ``torch.stack(out=)``, ``torch.cat(out=)``, ``where(out=)``, side by side with
tensordict 0.15.3 (they were skipped: the destination kept its old strings next to the new
tensors, found by an attack); and ``apply`` over a strided nested-tensor leaf."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as ours
import torch

from .._trees import non_tensor_source as _source


def _dest(pkg: Any) -> Any:
    dst = pkg.TensorDict({"a": torch.zeros(3), "sub": {"b": torch.zeros(3)}}, [3])
    dst["s"] = ["a", "b", "c"]
    dst.set_non_tensor("one", "v")
    dst["sub", "t"] = ["x", "y", "z"]
    return dst


def _seen(td: Any) -> dict[str, Any]:
    return {
        "a": td["a"].tolist(),
        "b": td["sub", "b"].tolist(),
        "s": list(td.get("s").tolist()),
        "one": td.get_non_tensor("one"),
        "t": list(td.get(("sub", "t")).tolist()),
    }


WRITES: dict[str, Callable[[Any, Any], Any]] = {
    "copy_": lambda src, dst: dst.copy_(src),
    "stack_out": lambda src, dst: torch.stack(list(src.unbind(0)), out=dst),
    "cat_out": lambda src, dst: torch.cat([src[:1], src[1:]], out=dst),
    "where_out": lambda src, dst: src.where(torch.tensor([True, True, True]), src, out=dst),
}


@pytest.mark.parametrize("name", list(WRITES))
def test_in_place_copies_write_non_tensor_entries_as_tensordict(name: str) -> None:
    seen = {}
    for pkg in (ref, ours):
        dst = _dest(pkg)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = WRITES[name](_source(pkg), dst)
        assert got is dst
        seen[pkg.__name__] = _seen(dst)
    assert seen["tensordict_rs"]["one"] in ("w", ["w", "w", "w"])  # (stack: one per row)
    if name == "where_out":
        # tensordict 0.15.3's where(out=) writes the stacks but leaves a NonTensorData of out=
        # as it was ('v'): here it takes the result's value, as the stacks do
        del seen["tensordict"]["one"], seen["tensordict_rs"]["one"]
    assert seen["tensordict_rs"] == seen["tensordict"]
    assert seen["tensordict_rs"]["s"] == ["X", "Y", "Z"]
    assert seen["tensordict_rs"]["t"] == ["p", "q", "r"]


def test_stack_out_with_one_string_per_row_as_tensordict() -> None:
    seen = {}
    for pkg in (ref, ours):
        rows = [
            pkg.TensorDict({"a": torch.tensor(float(i)), "name": pkg.NonTensorData(f"r{i}")}, [])
            for i in range(3)
        ]
        out = pkg.TensorDict({"a": torch.zeros(3)}, [3])
        out.set_non_tensor("name", "old")
        torch.stack(rows, out=out)
        seen[pkg.__name__] = (out["a"].tolist(), list(out.get("name").tolist()))
    assert seen["tensordict_rs"] == seen["tensordict"] == ([0.0, 1.0, 2.0], ["r0", "r1", "r2"])


def test_copy_leaves_out_non_tensor_keys_the_destination_lacks_as_tensordict() -> None:
    seen = {}
    for pkg in (ref, ours):
        dst = pkg.TensorDict({"a": torch.zeros(3)}, [3])
        dst["s"] = ["a", "b", "c"]
        src = pkg.TensorDict({"a": torch.ones(3)}, [3])
        src["s"] = ["X", "Y", "Z"]
        src.set_non_tensor("extra", "e")
        dst.copy_(src)
        seen[pkg.__name__] = (sorted(dst.keys()), list(dst.get("s").tolist()))
    assert seen["tensordict_rs"] == seen["tensordict"]


def test_tensorclass_copy_writes_its_string_field_as_tensordict() -> None:
    seen = {}
    for pkg in (ref, ours):

        @pkg.tensorclass
        class Item:
            x: torch.Tensor
            name: str

        dst = Item(x=torch.zeros(3), name="old", batch_size=[3])
        dst.copy_(Item(x=torch.ones(3), name="new", batch_size=[3]))
        seen[pkg.__name__] = (dst.x.tolist(), dst.name)
    assert seen["tensordict_rs"] == seen["tensordict"] == ([1.0, 1.0, 1.0], "new")


def _nested(pkg: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's prototype warning for strided nested tensors
        nt = torch.nested.nested_tensor([torch.arange(2.0), torch.arange(1.0), torch.arange(0.0)])
    return pkg.TensorDict({"a": torch.arange(3.0), "nt": nt}, [3])


@pytest.mark.parametrize("kwargs", [{}, {"batch_size": [3]}], ids=["plain", "batch_size"])
def test_apply_over_a_strided_nested_leaf_as_tensordict(kwargs: dict[str, Any]) -> None:
    seen = {}
    for pkg in (ref, ours):
        out = _nested(pkg).apply(lambda x: x * 2, **kwargs)
        assert out["nt"].is_nested
        seen[pkg.__name__] = (out["a"].tolist(), [c.tolist() for c in out["nt"].unbind(0)])
    assert seen["tensordict_rs"] == seen["tensordict"]
    assert seen["tensordict_rs"][1] == [[0.0, 2.0], [0.0], []]


def test_copy_of_a_string_into_a_tensor_entry_is_refused_before_writing() -> None:
    """tensordict 0.15.3 skips such an entry silently (the tensor keeps its values next to the
    copied ones); here the copy is refused naming the key, before any entry is written."""
    dst = ours.TensorDict({"a": torch.zeros(3), "s": torch.zeros(3)}, [3])
    src = ours.TensorDict({"a": torch.ones(3)}, [3])
    src["s"] = ["X", "Y", "Z"]
    with pytest.raises(RuntimeError, match="'s'"):
        dst.copy_(src)
    assert dst["a"].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("how", ["update_", "set_"])
def test_stack_into_a_saved_non_tensor_data_by_update_or_set(how: str, tmp_path: Any) -> None:
    # update_/set_ of a stack into a loaded tree's NonTensorData made it a stack in memory
    # while its meta.json kept the one old value: lost on reload. Refused now (several
    # values), or written as the one value they all hold
    path = tmp_path / "t"
    rows = {"a": torch.zeros(3), "s": ours.NonTensorData("v", batch_size=[3])}
    ours.TensorDict(rows, [3]).memmap(path)
    loaded = ours.TensorDict.load_memmap(path)

    def write(value: Any) -> None:
        if how == "update_":
            loaded.update_({"s": value})
        else:
            loaded.set_("s", value)

    with pytest.raises(RuntimeError, match="'s'"):
        write(ours.NonTensorStack("x", "y", "z"))
    assert ours.TensorDict.load_memmap(path)["s"] == loaded["s"] == "v"
    write(ours.NonTensorStack("q", "q", "q"))
    assert ours.TensorDict.load_memmap(path)["s"] == loaded["s"] == "q"
    assert ref.TensorDict.load_memmap(path)["s"] == "q"
