"""Strings per row: NonTensorData and NonTensorStack in memory, side by side with tensordict 0.15.3.

Every scenario is a function of the package (``ours`` or ``ref``) that builds the same input and
returns what it observes; the two results, normalised by ``norm`` (type names, values, batch
sizes), must be equal. The exceptions are compared by the built-in class they derive from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as ours
import torch

BUILTIN_ERRORS = (
    KeyError,
    IndexError,
    ValueError,
    TypeError,
    AttributeError,
    NotImplementedError,
    RuntimeError,
)


def norm(x: Any) -> Any:
    """A comparable description of what a call returned (the same for both packages)."""
    name = type(x).__name__
    if isinstance(x, torch.Size):
        return ("Size", tuple(x))
    if isinstance(x, torch.Tensor):
        return ("Tensor", str(x.dtype), tuple(x.shape), x.tolist())
    if name == "LinkedList":
        return ("LinkedList", [norm(v) for v in x])
    if name == "NonTensorData":
        return ("NonTensorData", norm(x.data), tuple(x.batch_size))
    if name == "NonTensorStack":
        return ("NonTensorStack", norm(x.tolist()), tuple(x.batch_size))
    if name == "TensorDict":
        return (
            "TensorDict",
            tuple(x.batch_size),
            {key: norm(x.get(key)) for key in x.keys()},
        )
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [norm(v) for v in x])
    if isinstance(x, dict):
        return {key: norm(value) for key, value in x.items()}
    return x


def outcome(fn: Callable[[Any], Any], pkg: Any) -> Any:
    try:
        return norm(fn(pkg))
    except BUILTIN_ERRORS as err:
        base = next(cls for cls in BUILTIN_ERRORS if isinstance(err, cls))
        return ("raises", base.__name__)


def same(fn: Callable[[Any], Any]) -> Any:
    mine, theirs = outcome(fn, ours), outcome(fn, ref)
    assert mine == theirs
    return mine


def strings(pkg: Any, n: int = 3) -> Any:
    td = pkg.TensorDict({"x": torch.arange(float(n))}, [n])
    td["text"] = [f"s{i}" for i in range(n)]
    return td


def steps(pkg: Any, n: int = 3, same_text: bool = False) -> list[Any]:
    return [
        pkg.TensorDict(
            {"obs": torch.full((2,), float(i)), "text": "same" if same_text else f"step{i}"}, []
        )
        for i in range(n)
    ]


# ------------------------------------------------------------------------------------------
# Construction and what td[key] / td.get(key) return

CONSTRUCTION: dict[str, Callable[[Any], Any]] = {
    "list_of_str_is_stack": lambda pkg: strings(pkg).get("text"),
    "getitem_is_linked_list": lambda pkg: strings(pkg)["text"],
    "list_of_mixed": lambda pkg: pkg.TensorDict({"m": ["a", 1, None]}, [3]).get("m"),
    "list_of_numbers_is_tensor": lambda pkg: pkg.TensorDict({"n": [1, 2, 3]}, [3]).get("n"),
    "list_wrong_length": lambda pkg: pkg.TensorDict({"w": ["a", "b"]}, [3]),
    "list_of_lists_is_2d_stack": lambda pkg: pkg.TensorDict({"l": [["a"], ["b"]]}, [2]).get("l"),
    "string_is_non_tensor_data": lambda pkg: pkg.TensorDict({"s": "hello"}, [2]).get("s"),
    "string_getitem": lambda pkg: pkg.TensorDict({"s": "hello"}, [2])["s"],
    "from_list": lambda pkg: pkg.NonTensorStack.from_list(["a", "b", "c"]),
    "from_list_2d": lambda pkg: pkg.NonTensorStack.from_list([["a", "b"], ["c", "d"]]),
    "from_list_tolist": lambda pkg: pkg.NonTensorStack.from_list([["a", "b"], ["c", "d"]]).tolist(),
    "varargs": lambda pkg: pkg.NonTensorStack("a", "b"),
    "varargs_of_data": lambda pkg: pkg.NonTensorStack(
        pkg.NonTensorData("a"), pkg.NonTensorData("b")
    ),
    "stack_batch_and_device": lambda pkg: (
        pkg.NonTensorStack("a", "b").batch_size,
        pkg.NonTensorStack("a", "b").device,
    ),
    "data_of_a_list": lambda pkg: pkg.NonTensorData(["a", "b"]),
    "data_tolist_batched": lambda pkg: pkg.NonTensorData("a", batch_size=[2, 1]).tolist(),
    "data_tolist_scalar": lambda pkg: pkg.NonTensorData("a").tolist(),
    "stack_data_when_equal": lambda pkg: pkg.NonTensorStack("a", "a").data,
    "stack_data_when_different": lambda pkg: pkg.NonTensorStack("a", "b").data,
    "stack_eq": lambda pkg: pkg.NonTensorStack("a", "b", "c") == pkg.NonTensorStack("a", "x", "c"),
    "data_eq": lambda pkg: (
        pkg.NonTensorData("a", batch_size=[2]) == pkg.NonTensorData("a", batch_size=[2])
    ),
    "linked_list_eq_list": lambda pkg: strings(pkg)["text"] == ["s0", "s1", "s2"],
    "to_dict": lambda pkg: strings(pkg).to_dict(),
    "unicode": lambda pkg: pkg.TensorDict({"u": ["é", "日本", "🙂"]}, [3])["u"],
    "varargs_with_batch_size": lambda pkg: pkg.NonTensorStack("a", "b", batch_size=[2]),
    "varargs_with_wrong_batch_size": lambda pkg: pkg.NonTensorStack("a", "b", batch_size=[3]),
    "empty_with_batch_size": lambda pkg: pkg.NonTensorStack(batch_size=[3]).batch_size,
    "linked_list_tolist_is_plain": lambda pkg: (
        type(strings(pkg)["text"].tolist()).__name__,
        strings(pkg)["text"].tolist(),
    ),
    "linked_list_tolist_2d": lambda pkg: [
        type(row).__name__
        for row in pkg.TensorDict({"n": [["a", "b"], ["c", "d"]]}, [2, 2])["n"].tolist()
    ],
    "linked_list_rebuilt_unlinked": lambda pkg: type(strings(pkg)["text"])(["p", "q"]),
}


@pytest.mark.parametrize("name", sorted(CONSTRUCTION))
def test_construction_matches_reference(name: str) -> None:
    same(CONSTRUCTION[name])


# ------------------------------------------------------------------------------------------
# The helpers around non-tensor entries


def _with_all(pkg: Any) -> Any:
    td = strings(pkg)
    td.set_non_tensor("one", ["a", "b", "c"])  # one value (a list) for every row
    td.set_non_tensor(("nested", "s"), "deep")
    return td


HELPERS: dict[str, Callable[[Any], Any]] = {
    "set_non_tensor_list_is_one_value": lambda pkg: _with_all(pkg).get("one"),
    "get_non_tensor_data": lambda pkg: _with_all(pkg).get_non_tensor("one"),
    "get_non_tensor_stack": lambda pkg: _with_all(pkg).get_non_tensor("text"),
    "get_non_tensor_nested": lambda pkg: _with_all(pkg).get_non_tensor(("nested", "s")),
    "get_non_tensor_of_tensor": lambda pkg: _with_all(pkg).get_non_tensor("x"),
    "get_non_tensor_missing_default": lambda pkg: _with_all(pkg).get_non_tensor("zz", "dflt"),
    "get_non_tensor_missing": lambda pkg: _with_all(pkg).get_non_tensor("zz"),
    "non_tensor_items": lambda pkg: sorted(
        (str(k), norm(v)) for k, v in _with_all(pkg).non_tensor_items()
    ),
    "non_tensor_items_nested": lambda pkg: sorted(
        (str(k), norm(v)) for k, v in _with_all(pkg).non_tensor_items(include_nested=True)
    ),
    "filter_non_tensor_data": lambda pkg: _with_all(pkg).filter_non_tensor_data(),
    "is_non_tensor": lambda pkg: (
        [pkg.is_non_tensor(v) for v in (_with_all(pkg).get("text"), _with_all(pkg).get("one"))]
        + [pkg.is_non_tensor(_with_all(pkg)), pkg.is_non_tensor(torch.zeros(1))]
    ),
}


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_helpers_match_reference(name: str) -> None:
    same(HELPERS[name])


def test_is_non_tensor_is_public_in_utils() -> None:
    """Code imports it from ``tensordict.utils`` (tensordict_rs.utils is issue 22's module)."""
    from tensordict.utils import is_non_tensor as theirs

    assert theirs(ref.NonTensorStack("a")) and ours.is_non_tensor(ours.NonTensorStack("a"))


# ------------------------------------------------------------------------------------------
# Rows: indexing a TensorDict and a stack

INDEXING: dict[str, Callable[[Any], Any]] = {
    "row_value": lambda pkg: strings(pkg)[1]["text"],
    "row_entry": lambda pkg: strings(pkg)[1].get("text"),
    "negative_row": lambda pkg: strings(pkg)[-1]["text"],
    "slice": lambda pkg: strings(pkg)[1:]["text"],
    "slice_entry": lambda pkg: strings(pkg)[1:].get("text"),
    "step_slice": lambda pkg: strings(pkg, 6)[::2]["text"],
    "tensor_index": lambda pkg: strings(pkg)[torch.tensor([2, 2, 0])]["text"],
    "list_index": lambda pkg: strings(pkg)[[2, 0]]["text"],
    "mask": lambda pkg: strings(pkg)[torch.tensor([True, False, True])]["text"],
    "empty_index": lambda pkg: strings(pkg)[torch.tensor([], dtype=torch.long)].get("text"),
    "out_of_range": lambda pkg: strings(pkg)[5],
    "stack_row": lambda pkg: pkg.NonTensorStack("a", "b", "c")[0],
    "stack_slice": lambda pkg: pkg.NonTensorStack("a", "b", "c")[1:],
    "stack_fancy": lambda pkg: pkg.NonTensorStack("a", "b", "c")[[2, 0]],
    "stack_mask": lambda pkg: pkg.NonTensorStack("a", "b", "c")[torch.tensor([True, False, True])],
    "stack_2d_cell": lambda pkg: pkg.NonTensorStack.from_list([["a", "b"], ["c", "d"]])[1, 0],
    "stack_2d_column": lambda pkg: pkg.NonTensorStack.from_list([["a", "b"], ["c", "d"]])[:, 1],
    "stack_2d_row": lambda pkg: pkg.NonTensorStack.from_list([["a", "b"], ["c", "d"]])[1],
    "data_row": lambda pkg: pkg.NonTensorData("q", batch_size=[3])[1],
    "data_slice": lambda pkg: pkg.NonTensorData("q", batch_size=[3])[1:],
    "unbind": lambda pkg: [td["text"] for td in strings(pkg).unbind(0)],
    "iterate": lambda pkg: [td["text"] for td in strings(pkg)],
}


@pytest.mark.parametrize("name", sorted(INDEXING))
def test_indexing_matches_reference(name: str) -> None:
    same(INDEXING[name])


def test_index_select_carries_the_strings() -> None:
    """``index_select`` gathers the rows' strings too (the reference raises AttributeError on a
    tree that holds a NonTensorStack)."""
    td = strings(ours, 4)
    picked = td.index_select(0, torch.tensor([3, 1]))
    assert picked["text"] == ["s3", "s1"] and picked["x"].tolist() == [3.0, 1.0]
    with pytest.raises(AttributeError):
        strings(ref, 4).index_select(0, torch.tensor([3, 1]))


def _set_row(pkg: Any) -> Any:
    td = strings(pkg)
    td[1] = pkg.TensorDict({"x": torch.tensor(9.0), "text": "B"}, [])
    return td


def _set_rows(pkg: Any) -> Any:
    td = strings(pkg)
    td[0:2] = pkg.TensorDict({"x": torch.ones(2), "text": ["P", "Q"]}, [2])
    return td


def _set_rows_fancy(pkg: Any) -> Any:
    td = strings(pkg)
    td[torch.tensor([2, 0])] = pkg.TensorDict({"x": torch.ones(2), "text": ["C", "A"]}, [2])
    return td


def _data_becomes_stack(pkg: Any) -> Any:
    td = pkg.TensorDict({"s": pkg.NonTensorData("q", batch_size=[3]), "x": torch.zeros(3)}, [3])
    td[1] = pkg.TensorDict({"s": "Z", "x": torch.ones(())}, [])
    return type(td.get("s")).__name__, td["s"]


def _data_stays_data(pkg: Any) -> Any:
    td = pkg.TensorDict({"s": pkg.NonTensorData("q", batch_size=[3]), "x": torch.zeros(3)}, [3])
    td[1] = pkg.TensorDict({"s": "q", "x": torch.ones(())}, [])
    return type(td.get("s")).__name__, td["s"]


def _preallocate(pkg: Any) -> Any:
    td = pkg.TensorDict({"x": torch.zeros(3)}, [3])
    for i in range(3):
        td[i] = pkg.TensorDict({"x": torch.tensor(float(i)), "text": f"t{i}"}, [])
    return td


def _stack_setitem(pkg: Any) -> Any:
    stack = pkg.NonTensorStack.from_list(["a", "b", "c"])
    stack[1] = "Z"
    stack[0:2] = ["P", "Q"]
    return stack


def _view_write_reaches_source(pkg: Any) -> Any:
    stack = pkg.NonTensorStack("a", "b", "c")
    view = stack[1:]
    view[0] = "Z"
    return stack.tolist(), view.tolist()


def _fancy_index_copies(pkg: Any) -> Any:
    stack = pkg.NonTensorStack("a", "b", "c")
    picked = stack[[1, 2]]
    picked[0] = "Z"
    return stack.tolist(), picked.tolist()


def _linked_list_writes_through(pkg: Any) -> Any:
    td = strings(pkg)
    td["text"][0] = "AA"
    return td["text"]


def _td_view_row_write(pkg: Any) -> Any:
    td = strings(pkg)
    view = td[1:]
    view[0] = pkg.TensorDict({"x": torch.tensor(5.0), "text": "Z"}, [])
    return td["text"], view["text"]


def _locked_set_row(pkg: Any) -> Any:
    td = strings(pkg).lock_()
    td[1] = pkg.TensorDict({"x": torch.tensor(9.0), "text": "B"}, [])
    return td["text"]


SETTING: dict[str, Callable[[Any], Any]] = {
    "set_row": _set_row,
    "set_rows": _set_rows,
    "set_rows_fancy": _set_rows_fancy,
    "data_becomes_stack": _data_becomes_stack,
    "data_stays_data": _data_stays_data,
    "preallocate": _preallocate,
    "stack_setitem": _stack_setitem,
    "view_write_reaches_source": _view_write_reaches_source,
    "fancy_index_copies": _fancy_index_copies,
    "linked_list_writes_through": _linked_list_writes_through,
    "td_view_row_write": _td_view_row_write,
    "locked_set_row": _locked_set_row,
}


@pytest.mark.parametrize("name", sorted(SETTING))
def test_setting_rows_matches_reference(name: str) -> None:
    same(SETTING[name])


# ------------------------------------------------------------------------------------------
# torch.stack / torch.cat and the shape operations

STACKING: dict[str, Callable[[Any], Any]] = {
    "stack_different": lambda pkg: torch.stack(steps(pkg)).get("text"),
    "stack_different_values": lambda pkg: torch.stack(steps(pkg))["text"],
    "stack_same": lambda pkg: torch.stack(steps(pkg, same_text=True)).get("text"),
    "stack_dim1": lambda pkg: torch.stack([strings(pkg), strings(pkg)], 1).get("text"),
    "stack_dim1_cell": lambda pkg: torch.stack([strings(pkg), strings(pkg)], 1)[0, 1]["text"],
    "stack_dim1_column": lambda pkg: torch.stack([strings(pkg), strings(pkg)], 1)[:, 1]["text"],
    "stack_of_stacks": lambda pkg: torch.stack(
        [pkg.NonTensorStack("a", "b"), pkg.NonTensorStack("c", "d")], 1
    ),
    "stack_twice": lambda pkg: torch.stack([torch.stack(steps(pkg))] * 2).get("text"),
    "cat_stacks": lambda pkg: torch.cat([strings(pkg), strings(pkg)]).get("text"),
    "cat_stack_and_data": lambda pkg: torch.cat(
        [
            pkg.TensorDict({"s": pkg.NonTensorStack("a", "b")}, [2]),
            pkg.TensorDict({"s": "q"}, [2]),
        ]
    ).get("s"),
    "cat_data_same": lambda pkg: torch.cat([pkg.TensorDict({"s": "v"}, [2])] * 2).get("s"),
    "cat_data_different": lambda pkg: torch.cat(
        [pkg.TensorDict({"s": "v"}, [2]), pkg.TensorDict({"s": "w"}, [2])]
    ).get("s"),
    "clone": lambda pkg: strings(pkg).clone().get("text"),
    "expand": lambda pkg: strings(pkg).expand(2, 3).get("text"),
    "reshape": lambda pkg: strings(pkg, 4).reshape(2, 2).get("text"),
    "view": lambda pkg: strings(pkg, 4).view(2, 2)["text"],
    "unsqueeze": lambda pkg: strings(pkg).unsqueeze(0).get("text"),
    "unsqueeze_last": lambda pkg: strings(pkg).unsqueeze(-1)["text"],
    "squeeze": lambda pkg: strings(pkg).unsqueeze(0).squeeze(0).get("text"),
    "permute": lambda pkg: torch.stack([strings(pkg), strings(pkg)], 1).permute(1, 0).get("text"),
    "transpose": lambda pkg: torch.stack([strings(pkg), strings(pkg)], 0).transpose(0, 1)["text"],
    "flatten": lambda pkg: torch.stack([strings(pkg), strings(pkg)], 0).flatten(0, 1).get("text"),
    "unflatten": lambda pkg: strings(pkg, 4).unflatten(0, (2, 2)).get("text"),
    "split": lambda pkg: [t["text"] for t in strings(pkg, 4).split(2)],
    "chunk": lambda pkg: [t["text"] for t in strings(pkg, 4).chunk(2)],
    "select_keeps": lambda pkg: strings(pkg).select("text").get("text"),
    "exclude_drops": lambda pkg: list(strings(pkg).exclude("text").keys()),
    "apply_skips_strings": lambda pkg: strings(pkg).apply(lambda x: x + 1).get("text"),
    "equality": lambda pkg: (strings(pkg) == strings(pkg)).get("text"),
    "to_cpu": lambda pkg: strings(pkg).to("cpu").get("text"),
    "where": lambda pkg: torch.where(
        torch.tensor([True, False, True]), strings(pkg), strings(pkg)
    ).get("x"),
}


@pytest.mark.parametrize("name", sorted(STACKING))
def test_stacking_and_shapes_match_reference(name: str) -> None:
    same(STACKING[name])


def test_repr_names_the_non_tensor_fields() -> None:
    """The compact repr lists a stack as ``NonTensorStack`` and a value by its type."""
    for pkg in (ours, ref):
        td = strings(pkg)
        td.set_non_tensor("one", ["a"])
        text = repr(td)
        assert "text: NonTensorStack" in text and "one: list" in text, (pkg.__name__, text)


def test_stack_of_1000_steps_is_one_stack() -> None:
    """torchrl's collectors stack per-step TensorDicts: the strings become one stack, in order."""
    mine = torch.stack(steps(ours, 1000))
    assert mine.get("text").tolist() == [f"step{i}" for i in range(1000)]
    assert mine[torch.tensor([999, 3])]["text"] == ["step999", "step3"]


def test_non_json_values_are_kept_in_memory() -> None:
    """Any Python object can sit in a stack in memory; only saving needs JSON."""
    marker = object()
    stack = ours.NonTensorStack(marker, "b")
    assert stack[0].data is marker and stack.tolist()[0] is marker


def test_linked_list_pickles_unlinked_as_the_reference_does() -> None:
    """``td[key]`` of a stack pickles (a worker sends it back) as a LinkedList of its values,
    no longer writing into the stack."""
    import pickle

    def run(pkg: Any) -> Any:
        td = pkg.TensorDict(batch_size=[2])
        td["s"] = pkg.NonTensorStack.from_list([["a", "b"], ["c", "d"]])
        back = pickle.loads(pickle.dumps(td["s"]))
        back[0] = "z"
        return back, td["s"]

    assert outcome(run, ours) == outcome(run, ref)


# ------------------------------------------------------------------------------------------
# A stack of entries keeps its members: selecting one gives it back (a NonTensorData)


def stacked_rows(pkg: Any, dim: int = 0, second: str = "B") -> Any:
    """``torch.stack`` of two TensorDicts of batch size [3] holding "A" and ``second``."""
    rows = [pkg.TensorDict({"name": value, "x": torch.zeros(3)}, [3]) for value in ("A", second)]
    return torch.stack(rows, dim)


def _member_write(pkg: Any) -> Any:
    td = stacked_rows(pkg)
    td[0].get("name").data = "Z"
    return td.get("name"), td[0].get("name")


def _element_write(pkg: Any) -> Any:
    td = stacked_rows(pkg)
    td.get("name")[0, 1] = "Q"
    return td.get("name"), td[0].get("name"), td[1].get("name")


MEMBERS: dict[str, Callable[[Any], Any]] = {
    "row_value": lambda pkg: stacked_rows(pkg)[0]["name"],
    "row_entry": lambda pkg: stacked_rows(pkg)[0].get("name"),
    "last_row": lambda pkg: stacked_rows(pkg)[-1].get("name"),
    "0-dim tensor row": lambda pkg: stacked_rows(pkg)[torch.tensor(1)].get("name"),
    "row_then_slice": lambda pkg: stacked_rows(pkg)[0, 1:].get("name"),
    "row_then_none": lambda pkg: stacked_rows(pkg)[0, None].get("name"),
    "none_then_row": lambda pkg: stacked_rows(pkg)[None][:, 0].get("name"),
    "none_row": lambda pkg: stacked_rows(pkg)[None][0].get("name"),
    "row_ellipsis": lambda pkg: stacked_rows(pkg)[0, ...].get("name"),
    "slice_of_rows": lambda pkg: stacked_rows(pkg)[0:1].get("name"),
    "slice_then_row": lambda pkg: stacked_rows(pkg)[1:][0].get("name"),
    "column": lambda pkg: stacked_rows(pkg)[:, 0].get("name"),
    "ellipsis_column": lambda pkg: stacked_rows(pkg)[..., 0].get("name"),
    "rows_by_tensor": lambda pkg: stacked_rows(pkg)[torch.tensor([1, 0])][0].get("name"),
    "rows_by_list": lambda pkg: stacked_rows(pkg)[[1, 0]][0].get("name"),
    "rows_by_mask": lambda pkg: stacked_rows(pkg)[torch.tensor([False, True])][0].get("name"),
    "columns_by_tensor": lambda pkg: stacked_rows(pkg)[:, torch.tensor([0, 1])][0].get("name"),
    "unbind": lambda pkg: [t.get("name") for t in stacked_rows(pkg).unbind(0)],
    "unbind_columns": lambda pkg: [t.get("name") for t in stacked_rows(pkg).unbind(1)],
    "iterate": lambda pkg: [t.get("name") for t in stacked_rows(pkg)],
    "clone_row": lambda pkg: stacked_rows(pkg).clone()[0].get("name"),
    "permute_column": lambda pkg: stacked_rows(pkg).permute(1, 0)[:, 0].get("name"),
    "transpose_column": lambda pkg: stacked_rows(pkg).transpose(1, 0)[:, 0].get("name"),
    "split_row": lambda pkg: stacked_rows(pkg).split(1, 0)[1][0].get("name"),
    "split_columns_row": lambda pkg: stacked_rows(pkg).split(2, 1)[1][0].get("name"),
    "view_same_shape_row": lambda pkg: stacked_rows(pkg).view(2, 3)[0].get("name"),
    "flip_row": lambda pkg: stacked_rows(pkg).flip(0)[0].get("name"),
    # a new dim (unsqueeze, expand) is a stacking dim, as in tensordict
    "unsqueeze_front_row": lambda pkg: stacked_rows(pkg).unsqueeze(0)[0].get("name"),
    "unsqueeze_front_column": lambda pkg: stacked_rows(pkg).unsqueeze(0)[:, 0].get("name"),
    "unsqueeze_middle_row": lambda pkg: stacked_rows(pkg).unsqueeze(1)[0].get("name"),
    "unsqueeze_middle_member": lambda pkg: stacked_rows(pkg).unsqueeze(1)[0, 0].get("name"),
    "unsqueeze_last_row": lambda pkg: stacked_rows(pkg).unsqueeze(2)[0].get("name"),
    "unsqueeze_squeeze_row": lambda pkg: stacked_rows(pkg).unsqueeze(0).squeeze(0)[0].get("name"),
    "stacked_on_dim_1_unsqueeze": lambda pkg: (
        stacked_rows(pkg, 1).unsqueeze(0)[0, :, 0].get("name")
    ),
    "expand_row": lambda pkg: stacked_rows(pkg).expand(4, 2, 3)[0].get("name"),
    "expand_member": lambda pkg: stacked_rows(pkg).expand(4, 2, 3)[0, 1].get("name"),
    "expand_column": lambda pkg: stacked_rows(pkg).expand(4, 2, 3)[0, :, 0].get("name"),
    "stack_row": lambda pkg: stacked_rows(pkg).get("name")[0],
    "stack_column": lambda pkg: stacked_rows(pkg).get("name")[:, 0],
    "stack_unbind": lambda pkg: list(stacked_rows(pkg).get("name").unbind(0)),
    "stack_iter": lambda pkg: list(stacked_rows(pkg).get("name")),
    "stacked_on_dim_1_row": lambda pkg: stacked_rows(pkg, 1)[0].get("name"),
    "stacked_on_dim_1_column": lambda pkg: stacked_rows(pkg, 1)[:, 0].get("name"),
    "stacked_on_dim_1_last": lambda pkg: stacked_rows(pkg, 1)[..., 1].get("name"),
    # equal values are not merged: a row is a member, a column a stack of two values
    "equal_values_row": lambda pkg: stacked_rows(pkg, second="A")[0].get("name"),
    "equal_values_column": lambda pkg: stacked_rows(pkg, second="A")[:, 0].get("name"),
    "equal_values_whole": lambda pkg: stacked_rows(pkg, second="A").get("name"),
    "nested_row": lambda pkg: torch.stack([stacked_rows(pkg), stacked_rows(pkg)])[0, 1].get("name"),
    "nested_outer_row": lambda pkg: torch.stack([stacked_rows(pkg), stacked_rows(pkg)])[0].get(
        "name"
    ),
    "nested_column_row": lambda pkg: torch.stack([stacked_rows(pkg), stacked_rows(pkg)])[:, 0][
        0
    ].get("name"),
    "nested_inner_column_row": lambda pkg: torch.stack([stacked_rows(pkg), stacked_rows(pkg)])[
        :, :, 0
    ][0].get("name"),
    "member_write": _member_write,
    "element_write": _element_write,
}


@pytest.mark.parametrize("name", list(MEMBERS))
def test_selecting_one_stacked_member_matches_reference(name: str) -> None:
    """``torch.stack`` of TensorDicts of batch size [3] holding a string each: an index that
    selects exactly one of them along the stacking dim gives that member (a NonTensorData of
    batch size [3] in tensordict; this library gave a stack of its three values), and
    anything that keeps several members gives a stack of values."""
    same(MEMBERS[name])


def test_stacked_members_are_not_kept_through_a_save(tmp_path: Any) -> None:
    """The saved format is the list of values: loaded, every element is its own member, as
    tensordict loads it too."""

    def run(pkg: Any) -> Any:
        td = stacked_rows(pkg)
        td.memmap(tmp_path / pkg.__name__)
        return pkg.TensorDict.load_memmap(tmp_path / pkg.__name__)[0].get("name")

    same(run)
