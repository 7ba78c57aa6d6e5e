"""Nested leaves (strided and jagged) on the one-message path: ``consolidate()``, pickling of a
consolidated tree, the torch.distributed calls (a 2-rank gloo job on loopback, in
``_dist_nested_jobs.py``), side by side with tensordict 0.15.3 where it has the case, and
hostile descriptions or data refused naming the key, never built as wrong data."""

from __future__ import annotations

import gc
import json
import pickle
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tensordict
import tensordict_rs
import torch
from tensordict_rs import TensorDict
from tensordict_rs.share import packed as _packed
from tensordict_rs.share.packed_description import NESTED_MARK

from . import _dist_nested_jobs as jobs
from .test_distributed import run_job

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")


@pytest.fixture(autouse=True)
def _collected() -> Iterator[None]:
    """Collects each test's garbage, so that this module's arenas are unmapped before later
    tests count descriptors (tests/share/test_sharing.py)."""
    yield
    gc.collect()


def _buffer_of(td: Any) -> tuple[int, int]:
    whole = _packed.plan(td).whole
    assert whole is not None
    return whole.data_ptr(), whole.numel()


def _inside(t: torch.Tensor, span: tuple[int, int]) -> bool:
    return span[0] <= t.data_ptr() and t.data_ptr() + t.nbytes <= span[0] + span[1]


def _jagged_only(T: Any, fill: int) -> Any:
    """The jagged leaves of ``nested_tree`` (the reference consolidates no strided one)."""
    td = jobs.nested_tree(T, fill)
    del td["sub", "table"]
    return td


def test_consolidate_keeps_nested_leaves_as_views_of_the_buffer() -> None:
    td = jobs.nested_tree(tensordict_rs, 3)
    c = td.consolidate()
    assert c.is_consolidated() and c.is_locked and not td.is_consolidated()
    jobs.same_nested(c, td)
    span = _buffer_of(c)
    for key in ("seq", ("sub", "wide"), ("sub", "holes")):
        njt: Any = c.get(key)
        assert _inside(njt.values(), span) and _inside(njt.offsets(), span), key
    assert _inside(c["sub", "holes"].lengths(), span)
    # strided nested: its components are views of the buffer (torch keeps its own copy of
    # the table of shapes; the buffer holds one too, which the plan of the tree finds)
    assert _inside(c["sub", "table"].values(), span)
    assert c["sub", "wide"]._ragged_idx == 2  # pytorch/tensordict#1676: kept here
    assert c.consolidate() is c


def test_consolidate_jagged_side_by_side_with_the_reference() -> None:
    ours = _jagged_only(tensordict_rs, 4).consolidate()
    ref = _jagged_only(tensordict, 4).consolidate()
    jobs.same_nested(ours, ref)
    assert ours.is_consolidated() and ref.is_consolidated()


def test_a_consolidated_tree_with_nested_leaves_is_freed() -> None:
    """Its plan (kept per tree) does not keep it alive, nor its nested leaves and buffer."""
    c = jobs.nested_tree(tensordict_rs, 1).consolidate()
    assert c.is_consolidated()
    tree, seq = weakref.ref(c), weakref.ref(c["seq"])
    del c
    gc.collect()
    assert tree() is None and seq() is None


def test_the_reference_refuses_strided_nested_leaves_which_we_consolidate() -> None:
    table = torch.nested.nested_tensor([torch.ones(2, 3), torch.zeros(1, 3)])
    with pytest.raises(NotImplementedError, match="NST is not supported"):
        tensordict.TensorDict({"t": table}, [2]).consolidate()
    c = TensorDict({"t": table}, [2]).consolidate()
    assert all(torch.equal(a, b) for a, b in zip(c["t"].unbind(), table.unbind(), strict=True))


def test_pickle_to_clone_and_inplace_of_a_consolidated_tree() -> None:
    td = jobs.nested_tree(tensordict_rs, 5)
    c = td.consolidate()
    for protocol in (2, 5):  # a tree not consolidated: per leaf (2) or one buffer (5)
        jobs.same_nested(pickle.loads(pickle.dumps(td, protocol=protocol)), td)
    back = pickle.loads(pickle.dumps(c, protocol=5))  # a consolidated one: protocol 5 only
    assert back.is_consolidated() and back["sub", "wide"]._ragged_idx == 2
    ref = pickle.loads(pickle.dumps(_jagged_only(tensordict, 5).consolidate()))
    jobs.same_nested(_jagged_only(tensordict_rs, 5), ref)  # ragged dims too (#1676)
    mine = _jagged_only(tensordict_rs, 5).consolidate()
    jobs.same_nested(pickle.loads(pickle.dumps(mine, protocol=5)), ref)
    jobs.same_nested(c.to("cpu"), td)
    jobs.same_nested(c.clone(), td)
    jobs.same_nested(td.clone(), td)
    inplace = td.clone()
    assert inplace.consolidate(inplace=True) is inplace and inplace.is_consolidated()
    jobs.same_nested(inplace, td)


def test_a_jagged_leaf_under_two_batch_dims() -> None:
    """A jagged leaf ragged along dim 2 under a batch size of 2 dims, as tensordict takes it."""
    wide = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(2, 5)], layout=torch.jagged)
    ours = TensorDict({"w": wide}, [2, 2]).consolidate()
    ref = tensordict.TensorDict({"w": wide}, [2, 2]).consolidate()
    jobs.same_nested(ours, ref)
    assert ours.batch_size == ref.batch_size == (2, 2)


def test_consolidate_to_a_file_refuses_nested_leaves_naming_the_key(tmp_path: Path) -> None:
    td = jobs.nested_tree(tensordict_rs, 0)
    with pytest.raises(tensordict_rs.InvalidTreeError, match="'seq'"):
        td.consolidate(filename=tmp_path / "c.bin")
    assert not (tmp_path / "c.bin").exists()


def test_a_receiver_builds_the_tree_from_its_description() -> None:
    td = jobs.nested_tree(tensordict_rs, 2)
    plan = _packed.plan(td)
    built, whole = _packed.build(TensorDict, plan.description(), plan.total)
    whole.copy_(plan.pack())
    jobs.same_nested(_packed.settle(built), td)
    assert built.is_consolidated()


def _received(td: Any, edit_index: Any = None, edit_data: Any = None) -> Any:
    """``td`` as a receiver builds it, its list of nested leaves or its data edited first."""
    plan = _packed.plan(td)
    text = plan.description()
    if edit_index is not None:
        head, _, rest = text[len(NESTED_MARK) :].partition(b"\n")
        index = json.loads(head)
        edit_index(index)
        text = NESTED_MARK + json.dumps(index).encode() + b"\n" + rest
    built, whole = _packed.build(TensorDict, text, plan.total)
    whole.copy_(plan.pack())
    if edit_data is not None:
        edit_data(plan, whole)
    return _packed.settle(built)


def _part(plan: Any, key: str, name: str, whole: torch.Tensor) -> torch.Tensor:
    """The bytes of part ``name`` of the nested leaf ``key`` in a packed buffer, typed."""
    i = 0
    for path, _, parts in plan.groups:
        for part in sorted(parts):
            if ".".join(path) == key and part == name:
                return plan._part_of(whole, i)
            i += 1
    raise KeyError(key)


def _set(key: str, name: str, at: int, value: int) -> Any:
    def edit(plan: Any, whole: torch.Tensor) -> None:
        _part(plan, key, name, whole)[at] = value

    return edit


HOSTILE_DATA = {
    "offsets_past_the_values": ("seq", _set("seq", "offsets", -1, 99)),
    "offsets_not_from_zero": ("seq", _set("seq", "offsets", 0, 1)),
    "offsets_falling": ("seq", _set("seq", "offsets", 1, 7)),
    "offsets_negative": ("sub.holes", _set("sub.holes", "offsets", 0, -3)),
    "lengths_past_the_values": ("sub.holes", _set("sub.holes", "lengths", 2, 40)),
    "lengths_negative": ("sub.holes", _set("sub.holes", "lengths", 0, -1)),
    "table_shorter_than_the_values": ("sub.table", _set("sub.table", "sizes", 0, 1)),
    "table_longer_than_the_values": ("sub.table", _set("sub.table", "sizes", 0, 9)),
    "table_negative": ("sub.table", _set("sub.table", "sizes", 1, -2)),
    "table_overflowing": ("sub.table", _set("sub.table", "sizes", 0, 2**62)),
    "lengths_overflowing": ("sub.holes", _set("sub.holes", "lengths", 0, 2**62)),
    "offsets_overflowing": ("sub.holes", _set("sub.holes", "offsets", 1, 2**62)),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_DATA))
def test_hostile_nested_data_is_refused_naming_the_key(name: str) -> None:
    key, edit = HOSTILE_DATA[name]
    with pytest.raises(tensordict_rs.InvalidTreeError, match=f"'{key}'"):
        _received(jobs.nested_tree(tensordict_rs, 1), edit_data=edit)


def _entry(which: list[str], **change: Any) -> Any:
    def edit(index: list[dict[str, Any]]) -> None:
        for e in index:
            if e["key"] == which:
                e.update(change)

    return edit


HOSTILE_INDEX = {
    "ragged_dim_out_of_range": ("seq", _entry(["seq"], ragged_idx=3)),
    "ragged_dim_not_an_int": ("seq", _entry(["seq"], ragged_idx="1")),
    "strided_said_jagged": ("sub.table", _entry(["sub", "table"], layout="jagged")),
    "unknown_layout": ("seq", _entry(["seq"], layout="torch.sparse_coo")),
    "key_taken_by_a_leaf": ("x", _entry(["seq"], key=["x"])),
    "path_through_a_leaf": ("x.y", _entry(["seq"], key=["x", "y"])),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_INDEX))
def test_hostile_nested_description_is_refused_naming_the_key(name: str) -> None:
    key, edit = HOSTILE_INDEX[name]
    with pytest.raises(tensordict_rs.InvalidTreeError, match=f"'{key}'"):
        _received(jobs.nested_tree(tensordict_rs, 1), edit_index=edit)


def test_a_broken_list_of_nested_leaves_is_refused() -> None:
    td = jobs.nested_tree(tensordict_rs, 1)
    text = _packed.plan(td).description()
    for bad in (NESTED_MARK + b"{}\n", NESTED_MARK + b'[{"key": []}]\n'):
        with pytest.raises(tensordict_rs.InvalidTreeError, match="nested leaves"):
            _packed.build(TensorDict, bad + text.partition(b"\n")[2].partition(b"\n")[2], 0)
    # a description without its mark (a receiver that predates it): the Rust parser refuses
    with pytest.raises(tensordict_rs.InvalidTreeError, match="not valid JSON"):
        _packed.build(TensorDict, text[len(NESTED_MARK) :], _packed.plan(td).total)


def test_torch_distributed_carries_nested_leaves(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # spawned ranks inherit it: loopback only
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    run_job(jobs.nested, ["tensordict_rs"] * 2, tmp_path)
