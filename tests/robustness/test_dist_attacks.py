"""Adversarial cases for torch.distributed: what a hostile or careless user can do to a tree.

Trees changed behind a cached plan's back, first contacts that fail on one side (no rank may
wait forever; the 2-rank job is in ``_dist_attack_jobs.py``), and receivers whose leaves
require grad.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict_rs import TensorDict
from tensordict_rs.share import packed as _packed
from tensordict_rs.share import packed_description
from torch import distributed as dist

from ..share.test_distributed import run_job
from . import _dist_attack_jobs as jobs


def _leaf_bytes(plan: _packed.Plan, packed: torch.Tensor, i: int, n: int) -> torch.Tensor:
    return packed[plan.offsets[i] : plan.offsets[i] + n]


@pytest.mark.parametrize("how", ["data", "set_", "share_memory_"])
def test_a_leaf_given_new_storage_in_place_is_packed_and_received_as_it_is_now(how: str) -> None:
    # ``t.data = x``, ``t.set_(x)`` and ``t.share_memory_()`` keep the tensor object (the dict
    # entry a cached plan checks) but move its bytes: a plan made before must not read or write
    # the old address (``nn.Module.float()``/``share_memory()`` and ``vector_to_parameters``
    # do this to the parameters of a tree made from a module).
    td = TensorDict({"a": torch.ones(4), "b": torch.zeros(4)}, [4])
    before = _packed.plan(td)
    assert _packed.plan(td) is before
    a = td["a"]
    if how == "data":
        a.data = torch.full((4,), 7.0)
    elif how == "set_":
        a.set_(torch.full((4,), 7.0))
    else:
        a.share_memory_()
        a.fill_(7.0)
    plan = _packed.plan(td)
    packed = plan.pack()
    assert _leaf_bytes(plan, packed, 0, 16).view(torch.float32).tolist() == [7.0] * 4
    incoming = torch.zeros(plan.total, dtype=torch.uint8)
    _leaf_bytes(plan, incoming, 0, 16).view(torch.float32).fill_(3.0)
    _leaf_bytes(plan, incoming, 1, 16).view(torch.float32).fill_(4.0)
    plan.unpack(incoming)
    assert td["a"].tolist() == [3.0] * 4 and td["b"].tolist() == [4.0] * 4


def test_receiving_into_leaves_that_require_grad() -> None:
    # The native scatter writes a contiguous parameter's bytes as torch.distributed does; a
    # non-contiguous one goes through torch copies, which autograd must not refuse.
    weight = torch.nn.Parameter(torch.zeros(3, 4).t())  # non-contiguous
    bias = torch.nn.Parameter(torch.zeros(2))
    td = TensorDict({"w": weight, "b": bias}, [])
    src = TensorDict({"w": torch.arange(12.0).view(4, 3), "b": torch.ones(2)}, [])
    plan = _packed.plan(td)
    assert not plan.native
    plan.unpack(_packed.plan(src).pack())
    assert torch.equal(td["w"].detach(), src["w"]) and td["b"].tolist() == [1.0, 1.0]
    assert td["w"].requires_grad and td["w"] is weight
    back = TensorDict({"w": torch.zeros(4, 3), "b": torch.zeros(2)}, [])
    sent = _packed.plan(td).pack()  # and back: packing a parameter records no graph
    assert not sent.requires_grad
    _packed.plan(back).unpack(sent)
    assert torch.equal(back["w"], src["w"]) and torch.equal(back["b"], src["b"])


@pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch has no gloo backend"
)
def test_first_contacts_refused_on_one_side_fail_on_both(tmp_path: Path) -> None:
    run_job(jobs.refused_first_contacts, ["tensordict_rs"] * 2, tmp_path)


def _nested(depth: int, leaf: object) -> TensorDict:
    td = TensorDict({"x": leaf}, [])
    for _ in range(depth):
        td = TensorDict({"n": td}, [])
    return td


def test_a_tree_too_deep_for_a_receiver_is_refused_by_its_sender() -> None:
    # A receiver parses descriptions with serde_json (128 levels of nesting); the sender
    # refuses a deeper tree itself, instead of sending it to a rank that cannot read it.
    from tensordict_rs import InvalidTreeError, NonTensorData

    deepest = _nested(packed_description.JSON_DEPTH - 3, torch.ones(2))  # its shape list: level 127
    plan = _packed.plan(deepest)
    built, whole = _packed.build(TensorDict, _packed.describe(deepest), plan.total)
    whole.copy_(plan.pack())
    assert built[("n",) * (packed_description.JSON_DEPTH - 3) + ("x",)].tolist() == [1.0, 1.0]
    with pytest.raises(InvalidTreeError, match="nested too deep"):
        _packed.describe(_nested(packed_description.JSON_DEPTH - 2, torch.ones(2)))
    # a non-tensor value's own lists count too: [[1]] at level 3 of a 120-deep tree
    value = _nested(120, NonTensorData([[1]]))
    text = _packed.describe(value)
    assert _packed.build(TensorDict, text, 0)[0] is not None
    with pytest.raises(InvalidTreeError, match="nested too deep"):
        _packed.describe(_nested(120, NonTensorData([[[[[[1]]]]]])))


@pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch has no gloo backend"
)
def test_repeated_first_contacts_leak_no_descriptor_or_memory(tmp_path: Path) -> None:
    run_job(jobs.repeated_first_contacts, ["tensordict_rs"] * 2, tmp_path)


@pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch has no gloo backend"
)
def test_a_rank_outside_the_group_cannot_receive_a_tree_from_it(tmp_path: Path) -> None:
    run_job(jobs.non_member, ["tensordict_rs"] * 3, tmp_path)


@pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch has no gloo backend"
)
def test_non_contiguous_and_conjugated_leaves_per_leaf(tmp_path: Path) -> None:
    run_job(jobs.strided_leaves_per_leaf, ["tensordict_rs"] * 2, tmp_path)


def test_keys_named_like_non_tensor_fields_travel_in_descriptions() -> None:
    # "_metadata" and "_is_non_tensor" are fields of a non-tensor entry, not reserved keys of a
    # node (meta.json saves such leaves); a receiver dropped them silently: a leaf of no bytes
    # vanished, one with bytes made the totals disagree.
    from tensordict_rs import NonTensorData

    td = TensorDict(
        {
            "_metadata": torch.arange(3.0),
            "_is_non_tensor": {"empty": torch.zeros(0, 2), "_metadata": NonTensorData("v")},
            "z": torch.ones(2),
        },
        [],
    )
    plan = _packed.plan(td)
    built, whole = _packed.build(TensorDict, _packed.describe(td), plan.total)
    whole.copy_(plan.pack())
    keys = sorted(map(str, td.keys(include_nested=True, leaves_only=True)))
    assert sorted(map(str, built.keys(include_nested=True, leaves_only=True))) == keys
    assert built["_metadata"].tolist() == [0.0, 1.0, 2.0]
    assert built["_is_non_tensor", "empty"].shape == (0, 2)
    assert built.get(("_is_non_tensor", "_metadata")).data == "v"


def test_a_key_the_json_parser_keeps_for_itself_is_refused_by_the_sender() -> None:
    # serde_json (arbitrary_precision) names a number's text with this key: a receiver refused
    # the description after the sender had sent it; the sender refuses it now, naming the key.
    from tensordict_rs import InvalidTreeError

    td = TensorDict({"n": {"$serde_json::private::Number": torch.ones(2)}}, [])
    with pytest.raises(InvalidTreeError, match="private::Number"):
        _packed.describe(td)


def test_a_non_tensor_dict_that_the_json_parser_reads_as_a_number_is_refused(
    tmp_path: Path,
) -> None:
    # {"$serde_json::private::Number": "12"} came back as the int 12, through a description
    # and through memmap/load_memmap alike (the reference round-trips it): refused on writing.
    from tensordict_rs import InvalidTreeError, NonTensorData

    td = TensorDict({"v": NonTensorData([{"$serde_json::private::Number": "12"}])}, [])
    with pytest.raises(InvalidTreeError, match="private::Number"):
        _packed.describe(td)
    with pytest.raises(InvalidTreeError, match="private::Number"):
        td.memmap(tmp_path / "saved")
    assert not (tmp_path / "saved" / "meta.json").exists()


def test_a_pending_receive_whose_wait_fails_is_not_completed() -> None:
    # Pending.wait() dropped every step before waiting: after a wait that raised (a timeout),
    # is_completed() said True and a second wait() skipped the messages and the scatter.
    from tensordict_rs.share.wire import Pending

    class Flaky:
        def __init__(self) -> None:
            self.calls = 0

        def wait(self, timeout: object = None) -> bool:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("timed out")
            return True

    done: list[int] = []
    first, second = Flaky(), Flaky()
    pending = Pending([(first, None), (second, lambda: done.append(1))])
    with pytest.raises(RuntimeError, match="timed out"):
        pending.wait()
    assert not pending.is_completed() and not done
    with pytest.raises(RuntimeError, match="timed out"):  # the second work's first wait
        pending.wait()
    assert not pending.is_completed() and first.calls == 2
    assert pending.wait() and pending.is_completed() and done == [1]
    assert (first.calls, second.calls) == (2, 2)


def test_an_arena_leaf_given_new_storage_is_no_longer_received_in_place() -> None:
    # A memmap_() tree is received straight into its arena; once a leaf's bytes moved out of
    # it (``.data =``), the message must reach the new bytes, not the arena the plan knew.
    td = TensorDict({"a": torch.zeros(4), "b": torch.zeros(4)}, []).memmap_()
    assert _packed.plan(td).whole is not None
    a = td["a"]
    plan = _packed.plan(td)
    assert plan.receive_buffer() is plan.whole
    a.data = torch.zeros(4)
    plan = _packed.plan(td)
    assert plan.whole is None
    incoming = torch.zeros(plan.total, dtype=torch.uint8)
    _leaf_bytes(plan, incoming, 0, 16).view(torch.float32).fill_(3.0)
    target = plan.receive_buffer()
    target.copy_(incoming)
    plan.unpack(target)
    assert td["a"].tolist() == [3.0] * 4 and a.tolist() == [3.0] * 4
