"""NonTensorStack and nested leaves on the one-message path (consolidate, torch.distributed
descriptions) and through share_memory_: kept exactly, and a hostile description of a stack
refused naming the key, never built as wrong data."""

from __future__ import annotations

import json
from typing import Any

import pytest
import tensordict_rs as ours
import torch
from tensordict_rs import NonTensorStack, TensorDict
from tensordict_rs.share import packed as _packed


def tree() -> Any:
    """A 1-D stack, a mixed JSON stack, a stack of equal-length lists (a 1-D stack that the
    format needs its "shape" for), a 2-D stack built by torch.stack along dim 1, a NonTensorData,
    a nested node with a stack, tensors."""
    td = TensorDict({"x": torch.arange(6.0).reshape(3, 2)}, [3])
    td["text"] = ["first", "second", "é 日本 🙂"]
    td["mixed"] = ["a", 1, None]
    td["pairs"] = NonTensorStack.from_list([[1, 2], [3, 4], [5, 6]])
    td.set_non_tensor("one", "same for all")
    td["sub"] = TensorDict({"tags": ["u", "v", "w"], "y": torch.zeros(3)}, [3])
    rows = [TensorDict({"s": f"r{i}", "z": torch.zeros(2)}, [2]) for i in range(3)]
    td["grid"] = torch.stack(rows, 0)
    return td


def seen(td: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"batch": tuple(td.batch_size)}
    for key in td.keys(include_nested=True, leaves_only=True):
        value = td.get(key)
        if isinstance(value, torch.Tensor):
            out[str(key)] = ("tensor", value.tolist())
        elif isinstance(value, NonTensorStack):
            out[str(key)] = ("stack", tuple(value.batch_size), value.stack_dim, value.tolist())
        else:
            out[str(key)] = (type(value).__name__, value.data)
    return out


def sent(td: Any) -> Any:
    """``td`` through its description and one packed buffer, as a torch.distributed receiver
    builds it."""
    plan = _packed.plan(td)
    built, whole = _packed.build(type(td), _packed.describe(td), plan.total)
    whole.copy_(plan.pack())
    return built


def test_description_keeps_stacks() -> None:
    td = tree()
    assert seen(sent(td)) == seen(td)


def test_description_keeps_a_stack_along_dim_1() -> None:
    rows = [TensorDict({"s": NonTensorStack(f"a{i}", f"b{i}")}, [2]) for i in range(3)]
    td = torch.stack(rows, 1)
    assert td.get("s").stack_dim == 1 and td.batch_size == (2, 3)
    assert seen(sent(td)) == seen(td)


def test_consolidate_and_share_memory_keep_stacks() -> None:
    td = tree()
    c = td.consolidate()
    assert c.is_consolidated() and seen(c) == seen(td)
    s = tree().share_memory_()
    assert s.is_shared() and seen(s) == seen(td)


def test_share_memory_keeps_nested_leaves() -> None:
    nt = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(0.0)], layout=torch.jagged)
    td = TensorDict({"seq": nt, "x": torch.zeros(2)}, [2]).share_memory_()
    assert td.is_shared() and td["seq"].layout == torch.jagged
    assert torch.equal(td["seq"].offsets(), nt.offsets())


def _edited(td: Any, key: str, change: Any) -> bytes:
    """The description of ``td`` with the stack entry ``key`` (top level) changed."""
    meta = json.loads(_packed.describe(td))
    change(meta[key])
    return json.dumps(meta).encode()


HOSTILE = {
    "rows_disagree_with_batch": lambda m: m.update(data=m["data"][:2]),
    "data_not_a_list": lambda m: m.update(data="pickle.pkl"),
    "stack_dim_not_an_int": lambda m: m.update(stack_dim="0"),
    "stack_dim_out_of_range": lambda m: m.update(stack_dim=5),
    "shape_disagrees_with_data": lambda m: m.update(shape=[4]),
    "device_not_a_string": lambda m: m.update(device=3),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_stack_description_is_refused(name: str) -> None:
    td = tree()
    plan = _packed.plan(td)
    text = _edited(td, "text", HOSTILE[name])
    with pytest.raises(ours.InvalidTreeError, match="text"):
        _packed.build(type(td), text, plan.total)
