"""Gaps found by the reference's test_nontensor.py (issue 21), side by side with tensordict 0.15.3.

Each scenario is a function of the package (``ours`` or ``ref``) that builds the same input and
returns what it observes, compared with ``same`` (see test_nontensor_stack.py): the shape
operations that turn a ``NonTensorData`` into a ``NonTensorStack`` (expand, unsqueeze), rows
written into a locked TensorDict, ``NonTensorStack.where``, stacks assigned to tensorclass
fields, elements of a stack that read and write the stack, ``NonTensorData.__setitem__`` and
``__dict__``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as ours
import torch

from .test_nontensor_stack import same


def batched(pkg: Any) -> Any:
    return pkg.TensorDict(foo=pkg.NonTensorData(3, batch_size=[2]), batch_size=[2])


def wide(pkg: Any) -> Any:
    return pkg.TensorDict(foo=pkg.NonTensorData(3, batch_size=[1, 2]), batch_size=[1, 2])


def scalar(pkg: Any) -> Any:
    return pkg.TensorDict(foo=pkg.NonTensorData(3))


def entry(td: Any) -> Any:
    return td.get("foo"), td["foo"]


# ------------------------------------------------------------------------------------------
# Shape operations: expand and unsqueeze make a stack; reshape, view, squeeze, flatten, permute,
# transpose, indexing keep a NonTensorData (td["foo"] is a list in the first case)

SHAPES: dict[str, Callable[[Any], Any]] = {
    "unsqueeze0": lambda pkg: entry(batched(pkg).unsqueeze(0)),
    "unsqueeze_last": lambda pkg: entry(batched(pkg).unsqueeze(-1)),
    "unsqueeze_scalar": lambda pkg: entry(scalar(pkg).unsqueeze(0)),
    "unsqueeze_squeeze_scalar": lambda pkg: entry(scalar(pkg).unsqueeze(0).squeeze()),
    "unsqueeze_squeeze0_scalar": lambda pkg: entry(scalar(pkg).unsqueeze(0).squeeze(0)),
    "expand": lambda pkg: entry(batched(pkg).expand(3, 2)),
    "expand_scalar": lambda pkg: entry(scalar(pkg).expand(3)),
    "flatten": lambda pkg: entry(batched(pkg).unsqueeze(0).flatten(0, 1)),
    "permute": lambda pkg: entry(batched(pkg).unsqueeze(0).permute(1, 0)),
    "transpose": lambda pkg: entry(batched(pkg).unsqueeze(0).transpose(1, 0)),
    "flatten_data": lambda pkg: entry(wide(pkg).flatten(0, 1)),
    "permute_data": lambda pkg: entry(wide(pkg).permute(1, 0)),
    "transpose_data": lambda pkg: entry(wide(pkg).transpose(0, 1)),
    "unsqueeze_middle": lambda pkg: entry(wide(pkg).unsqueeze(1)),
    "expand_wide": lambda pkg: entry(wide(pkg).expand(2, 1, 2)),
    "reshape": lambda pkg: entry(batched(pkg).reshape(2, 1)),
    "view": lambda pkg: entry(batched(pkg).view(2, 1)),
    "unflatten": lambda pkg: entry(batched(pkg).unflatten(0, (1, 2))),
    "index": lambda pkg: entry(batched(pkg)[0]),
    "slice": lambda pkg: entry(batched(pkg)[:1]),
    "none_index": lambda pkg: entry(batched(pkg)[None]),
    "data_unsqueeze": lambda pkg: pkg.NonTensorData(3, batch_size=[2]).unsqueeze(0),
    "data_flatten": lambda pkg: pkg.NonTensorData(3, batch_size=[1, 2]).flatten(0, 1),
    "data_permute": lambda pkg: pkg.NonTensorData(3, batch_size=[1, 2]).permute(1, 0),
    "data_transpose": lambda pkg: pkg.NonTensorData(3, batch_size=[1, 2]).transpose(0, 1),
    "data_reshape": lambda pkg: pkg.NonTensorData(3, batch_size=[2]).reshape(2, 1),
    "data_squeeze": lambda pkg: pkg.NonTensorData(3, batch_size=[1, 2]).squeeze(0),
    "stacked_rows_write": lambda pkg: _write_row_of_unsqueezed(pkg),
}


def _write_row_of_unsqueezed(pkg: Any) -> Any:
    td = batched(pkg).unsqueeze(0)
    td[0, 1] = pkg.TensorDict(foo="z")
    return td["foo"]


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shape_operations_match_reference(name: str) -> None:
    same(SHAPES[name])


# ------------------------------------------------------------------------------------------
# Rows written into a locked TensorDict: a non-tensor entry becomes a stack, as in tensordict;
# shared or memory-mapped entries refuse (both packages raise)


def _locked_rows(pkg: Any, mode: str, path: Path) -> Any:
    td = pkg.TensorDict({"a": {"b": "1"}, "x": torch.zeros(3)}, batch_size=[3])
    if mode == "lock":
        td.lock_()
    elif mode == "share":
        td.share_memory_()
    else:
        td.memmap_(path / pkg.__name__)
    td[0] = pkg.TensorDict({"a": {"b": "0"}, "x": torch.ones(())}, [])
    return td.get(("a", "b")), td["a", "b"], td.is_locked, td["a"].is_locked, td["x"]


@pytest.mark.parametrize("mode", ["lock", "share", "memmap"])
def test_rows_of_a_locked_tree_match_reference(mode: str, tmp_path: Path) -> None:
    result = same(lambda pkg: _locked_rows(pkg, mode, tmp_path))
    assert (result[0] == "raises") == (mode != "lock")  # ("tuple", [...]) when it worked


def test_same_value_into_locked_rows_matches_reference() -> None:
    def scenario(pkg: Any) -> Any:
        td = pkg.TensorDict({"b": "1"}, batch_size=[3])
        td.lock_()
        td[1:] = pkg.TensorDict({"b": "1"}, [2])
        return td.get("b"), td.is_locked

    same(scenario)


# ------------------------------------------------------------------------------------------
# NonTensorStack.where as a method (out=, pad=) and torch.where of stacks

COND = torch.tensor([True, False])

WHERE: dict[str, Callable[[Any], Any]] = {
    "method": lambda pkg: pkg.NonTensorStack("a", "b").where(COND, pkg.NonTensorStack("c", "d")),
    "method_keywords": lambda pkg: pkg.NonTensorStack("a", "b").where(
        condition=COND, other=pkg.NonTensorStack("c", "d"), pad=0
    ),
    "torch_where": lambda pkg: torch.where(
        COND, pkg.NonTensorStack("a", "b"), pkg.NonTensorStack("c", "d")
    ),
    "out": lambda pkg: _where_out(pkg),
    "list_values": lambda pkg: _where_lists(pkg),
    "td_where": lambda pkg: pkg.TensorDict(t=pkg.NonTensorStack("a", "b"), batch_size=[2]).where(
        COND, pkg.TensorDict(t=pkg.NonTensorStack("c", "d"), batch_size=[2])
    ),
}


def _where_out(pkg: Any) -> Any:
    out = pkg.NonTensorStack("x", "y")
    result = pkg.NonTensorStack("a", "b").where(COND, pkg.NonTensorStack("c", "d"), out=out)
    return result is out, out


def _where_lists(pkg: Any) -> Any:
    def stack(value: str) -> Any:
        return pkg.NonTensorStack(
            pkg.NonTensorData([value]), pkg.NonTensorData([value]), batch_size=(2,)
        )

    out = stack("none")
    return stack("a").where(condition=COND, other=stack("b"), out=out, pad=0), out


@pytest.mark.parametrize("name", sorted(WHERE))
def test_where_matches_reference(name: str) -> None:
    same(WHERE[name])


# ------------------------------------------------------------------------------------------
# A NonTensorStack assigned to a tensorclass field stays a stack (one value per row)


def _tensorclass_field(pkg: Any, how: str) -> Any:
    class X(pkg.TensorClass):  # type: ignore[misc,name-defined]
        text: str = None  # type: ignore[assignment]

    if how == "assign":
        x = X(batch_size=3)
        x.text = pkg.NonTensorStack.from_list(["a", "b", "c"])
    else:
        x = X(text=pkg.NonTensorStack("a", "b", "c"), batch_size=3)
    x.text[2] = "z"  # the field's LinkedList writes into the stack
    return x[0].text, x[1].text, x[1:].text, x.text, x.get("text")


@pytest.mark.parametrize("how", ["assign", "construct"])
def test_tensorclass_stack_field_matches_reference(how: str) -> None:
    result = same(lambda pkg: _tensorclass_field(pkg, how))
    assert result[1][:2] == ["a", "b"]  # ("tuple", [x[0].text, x[1].text, ...])


# ------------------------------------------------------------------------------------------
# Elements of a stack are live: reads see the stack's writes, writes reach the stack


def _row_scenario(pkg: Any, name: str) -> Any:
    ns, nd, td_cls = pkg.NonTensorStack, pkg.NonTensorData, pkg.TensorDict
    s = ns("a", "b")
    if name == "read_after_stack_write":
        row = s[0]
        s[0] = "z"
        return row.data, row
    if name == "data_setter":
        s[0].data = "z"
    elif name == "update_":
        s[0].update_(nd("z"))
    elif name == "update_inplace":
        s[0].update(nd("z"), inplace=True)
    elif name == "unbind":
        s.unbind(0)[1].data = "z"
    elif name == "tensor_index":
        s[torch.tensor(1)].data = "z"
    elif name == "setitem_true":
        s[0][True] = ns("q")
    elif name == "setitem_true_data":
        s[1][True] = nd("q")
    elif name == "two_dims":
        s = ns(ns("a", "b"), ns("c", "d"))
        s[1, 0].data = "z"
    elif name == "two_dims_chained":
        s = ns(ns("a", "b"), ns("c", "d"))
        s[1][0].data = "z"
    elif name == "td_get_row":
        td = td_cls(t=ns("a", "b"), batch_size=[2])
        td.get("t")[0].data = "z"
        return td["t"]
    elif name == "td_row_get":
        td = td_cls(t=ns("a", "b"), batch_size=[2])
        td[0].get("t").data = "z"
        return td["t"]
    elif name == "clone_is_a_copy":
        s[0].clone().data = "z"
    elif name == "setitem_part_of_data":
        nd("a", batch_size=[2])[0] = "b"
    return s.tolist()


ROWS = (
    "read_after_stack_write",
    "data_setter",
    "update_",
    "update_inplace",
    "unbind",
    "tensor_index",
    "setitem_true",
    "setitem_true_data",
    "two_dims",
    "two_dims_chained",
    "td_get_row",
    "td_row_get",
    "clone_is_a_copy",
    "setitem_part_of_data",
)


@pytest.mark.parametrize("name", ROWS)
def test_elements_of_a_stack_match_reference(name: str) -> None:
    same(lambda pkg: _row_scenario(pkg, name))


def test_element_of_a_memory_mapped_stack_writes_the_file(tmp_path: Path) -> None:
    """Here a write into an element of a saved stack reaches the stack and its meta.json (the
    reference refuses it: 'Cannot update a leaf NonTensorDataBase from a memmaped parent'),
    as a write into the stack itself does in both; update() without inplace=True refuses in
    both (the stack is locked)."""
    stack = ours.NonTensorStack("a", "b").memmap_(tmp_path / "s")
    with pytest.raises(RuntimeError, match="locked"):
        stack[0].update(ours.NonTensorData("z"))
    stack[0].update(ours.NonTensorData("z"), inplace=True)
    stack[1].data = "y"
    assert stack.tolist() == ["z", "y"]
    assert ours.TensorDict.load_memmap(tmp_path / "s").tolist() == ["z", "y"]
    assert ref.TensorDict.load_memmap(tmp_path / "s").tolist() == ["z", "y"]
    theirs = ref.NonTensorStack("a", "b").memmap_(tmp_path / "r")
    with pytest.raises(RuntimeError, match="memmaped parent"):
        theirs[0].update(ref.NonTensorData("z"), inplace=True)


# ------------------------------------------------------------------------------------------
# NonTensorData.__dict__: the value is not an attribute named "data"; no attribute is added


def test_dict_has_no_data_key_like_reference() -> None:
    for pkg in (ours, ref):
        entry = pkg.NonTensorData("a")
        assert "data" not in entry.__dict__
        assert "data" not in vars(entry)
        assert entry.data == "a"
    td = ours.TensorDict({"val": ours.NonTensorData("x")}, [])
    td.share_memory_()
    assert "data" not in td.get("val").__dict__
    assert td.get("val").data == "x"
    # the reference refuses new attributes on a NonTensorData; here too (slots)
    outcomes = []
    for pkg in (ours, ref):
        with pytest.raises(AttributeError):
            pkg.NonTensorData("a").foo = 1
        outcomes.append(True)
    assert outcomes == [True, True]


# ------------------------------------------------------------------------------------------
# new_zeros / new_empty / new_ones / new_full of a tree holding a stack: a stack of the new
# batch size (its first value everywhere, as tensordict's new_zeros(..., empty_lazy=True)),
# whose rows then take writes (a boolean mask among them); contiguous() of a stack is itself


def _nested_stack(pkg: Any) -> Any:
    inner = pkg.TensorDict(b=pkg.NonTensorStack("a", "b", "c").unsqueeze(-1), batch_size=(3,))
    return pkg.TensorDict(a=inner, batch_size=(3,))


FACTORIES: dict[str, Callable[[Any], Any]] = {
    "new_zeros_lazy": lambda pkg: _nested_stack(pkg).new_zeros((4,), empty_lazy=True),
    "new_empty_lazy": lambda pkg: _nested_stack(pkg).new_empty((4,), empty_lazy=True),
    "new_ones_lazy": lambda pkg: _nested_stack(pkg).new_ones((2,), empty_lazy=True),
    "new_full_lazy": lambda pkg: _nested_stack(pkg).new_full((2,), 0, empty_lazy=True),
    "new_zeros_of_data": lambda pkg: pkg.TensorDict(
        s=pkg.NonTensorData("x", batch_size=[3]), batch_size=[3]
    ).new_zeros((4,)),
    "masked_rows_into_new_zeros": lambda pkg: _masked_rows(pkg),
    "stack_contiguous_is_itself": lambda pkg: [
        (s.contiguous(canonical=c) is s) for s in [pkg.NonTensorStack("a", "b")] for c in (0, 1)
    ],
}


def _masked_rows(pkg: Any) -> Any:
    td = _nested_stack(pkg)
    out = td.new_zeros((4,), empty_lazy=True)
    out[torch.tensor([True, True, False, True])] = td
    return out


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factories_of_stacks_match_reference(name: str) -> None:
    same(FACTORIES[name])


def test_new_zeros_of_a_stack_has_the_new_batch_size() -> None:
    """tensordict without ``empty_lazy`` gives an empty TensorDict in place of the stack (its
    dense form of a stack); here the result is the same as with ``empty_lazy=True``."""
    zeros = _nested_stack(ours).new_zeros((4,))
    assert zeros.get(("a", "b")).batch_size == torch.Size([4, 1])
    assert zeros["a", "b"] == [["a"]] * 4


# ------------------------------------------------------------------------------------------
# The private flags tensordict's tests read on a NonTensorData (_is_shared, _is_memmap, and
# those of its inner _tensordict), and the shared cell behind _non_tensordict["data"]


def _flags(pkg: Any, how: str, tmp: Path) -> Any:
    td = pkg.TensorDict({"val": pkg.NonTensorData("a")}, [])
    if how == "shared":
        td.share_memory_()
    elif how == "memmap":
        td.memmap_(tmp / pkg.__name__)
    elif how == "memmap_shared":
        td.memmap_(tmp / pkg.__name__, share_non_tensor=True)
    entry = td.get("val")
    inner = entry._tensordict
    seen = [entry._is_shared, entry._is_memmap, inner._is_shared, inner._is_memmap]
    if how.startswith("memmap"):
        loaded = pkg.TensorDict.load_memmap(tmp / pkg.__name__, allow_pickle=True)
        entry.update_(pkg.NonTensorData("b"))  # rewrites meta.json
        seen.append(pkg.TensorDict.load_memmap(tmp / pkg.__name__)["val"])
        # (a loaded entry: _is_memmap here, where its in-place writes rewrite meta.json too;
        # tensordict says False)
        seen.append(loaded["val"])
    return seen


@pytest.mark.parametrize("how", ["plain", "shared", "memmap", "memmap_shared"])
def test_private_flags_of_an_entry(how: str, tmp_path: Path) -> None:
    mine = _flags(ours, how, tmp_path / "ours")
    theirs = _flags(ref, how, tmp_path / "ref")
    if how == "memmap_shared":  # tensordict says _is_shared False there; the value is shared
        assert mine[0] is True and theirs[0] is False
        mine[0] = mine[2] = theirs[0]
    assert mine == theirs
    assert any(mine) or how == "plain"


def _write_in_child(td: Any) -> None:
    td.get("val").update_(type(td.get("val"))("written"))


@pytest.mark.parametrize(
    ("pkg", "method"),
    # (tensordict's shared value holds a lock of the default context: spawn refuses it)
    [(ours, "spawn"), (ours, "fork"), (ref, "fork")],
    ids=["ours-spawn", "ours-fork", "ref-fork"],
)
def test_shared_cell_read_back(pkg: Any, method: str) -> None:
    import importlib

    import torch.multiprocessing as mp

    module = importlib.import_module(f"{pkg.__name__}.tensorclass")
    from_shared = module._from_shared_nontensor
    td = pkg.TensorDict({"val": pkg.NonTensorData("a")}, []).share_memory_()
    child = mp.get_context(method).Process(target=_write_in_child, args=(td,))
    child.start()
    child.join()
    assert child.exitcode == 0
    assert from_shared(td.get("val")._non_tensordict["data"]) == "written"
    assert td["val"] == "written"


def _from_above(pkg: Any, tmp: Path) -> Any:
    stack = torch.stack([pkg.NonTensorData(data=0), pkg.NonTensorData(data=1)], 0)
    stack = torch.stack([stack] * 3).clone()
    before = stack[0, 0]._is_memmaped_from_above()
    stack.memmap_(tmp / pkg.__name__)
    return before, stack[0, 0]._is_memmaped_from_above(), stack[1, 1]._is_memmaped_from_above()


def test_elements_of_a_memory_mapped_stack(tmp_path: Path) -> None:
    assert _from_above(ours, tmp_path) == _from_above(ref, tmp_path) == (False, True, True)


def _through_lazystack(pkg: Any) -> Any:
    td = pkg.TensorDict(
        a=pkg.TensorDict(b=pkg.NonTensorStack("a", "b", "c").unsqueeze(-1), batch_size=(3,)),
        x=torch.zeros(3, 2),
        batch_size=(3,),
    )
    lazy = td.to_lazystack(0)
    lazy[1]["x"] += 1  # writes reach td (tensordict's stack is one of views)
    zeros = lazy.new_zeros((4,), empty_lazy=True)
    zeros[torch.tensor([True, True, False, True])] = lazy
    return td["x"].tolist(), lazy.get(("a", "b")).tolist(), zeros.get(("a", "b")).tolist()


def test_to_lazystack() -> None:
    """tensordict gives a LazyStackedTensorDict; here a dense TensorDict of the same leaves."""
    assert _through_lazystack(ours) == _through_lazystack(ref)
    with pytest.raises(IndexError):
        ours.TensorDict(a=torch.zeros(3), batch_size=[3]).to_lazystack(1)
