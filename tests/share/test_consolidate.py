"""``consolidate`` and ``is_consolidated``, side by side with tensordict 0.15.3."""

from __future__ import annotations

import pytest
import tensordict
import tensordict_rs
import torch
from tensordict_rs import TensorDict
from tensordict_rs.share import packed as _packed

from . import _dist_jobs


def _source(module: object) -> object:
    return _dist_jobs.tree(module, 3)  # nested, every dtype, a non-tensor value


def _plain(module: object) -> object:
    td = module.TensorDict(  # type: ignore[attr-defined]
        {
            "a": torch.arange(12.0).view(4, 3),
            "n": {"b": torch.arange(4, dtype=torch.int64), "c": torch.ones(4, 2, dtype=torch.bool)},
            "d": torch.full((4, 5), 0.5, dtype=torch.float64),
        },
        [4],
    )
    return td


def test_consolidated_copy_holds_the_same_values_as_the_reference() -> None:
    ours, ref = _plain(tensordict_rs), _plain(tensordict)
    c, r = ours.consolidate(), ref.consolidate(metadata=True)
    _dist_jobs.same(c, ours)
    assert (c.is_consolidated(), ours.is_consolidated()) == (True, False)
    assert (r.is_consolidated(), ref.is_consolidated()) == (True, False)
    assert c.is_locked and r.is_locked
    assert c.consolidate() is c and r.consolidate() is r
    keys = sorted(c.keys(include_nested=True, leaves_only=True), key=str)
    assert keys == sorted(r.keys(include_nested=True, leaves_only=True), key=str)
    for key in keys:
        assert torch.equal(torch.as_tensor(c.get(key)), r.get(key)), key


@pytest.mark.parametrize("share_memory", [False, True])
def test_leaves_answer_is_shared_as_the_reference(share_memory: bool) -> None:
    """``consolidate(share_memory=True)`` gives leaves that answer ``is_shared()`` True, as
    tensordict's (they answered False, though the arena is shared memory either way); the
    tree itself answers False in both libraries."""
    for module in (tensordict_rs, tensordict):
        c = _plain(module).consolidate(share_memory=share_memory)
        leaves = [c.get(k) for k in c.keys(include_nested=True, leaves_only=True)]
        assert [t.is_shared() for t in leaves] == [share_memory] * 4, module.__name__
        assert not c.is_shared(), module.__name__


@pytest.mark.parametrize(
    "change", ["batch_size", "nested batch_size", "unsqueeze_", "t_", "resize_"]
)
def test_a_tree_changed_in_place_is_not_sent_as_it_was(change: str) -> None:
    """A tree's packing plan is cached (consolidate, pickles of protocol 5, ``ray.put``,
    ``broadcast``, ``init_remote``, consolidated ``send``) and was reused while the entries
    were the same objects at the same addresses: a batch size set since, or a leaf reshaped
    or transposed in place, went out with the old shapes or layout, silently (found by an
    attack; tensordict packs the tree as it is)."""
    import pickle

    expected_batch = {"batch_size": [4, 4], "nested batch_size": [4]}.get(change, [4])
    for first in (lambda t: t.consolidate(), lambda t: pickle.dumps(t, protocol=5)):
        td = TensorDict({"a": torch.arange(16.0).view(4, 4), "n": {"b": torch.ones(4, 4)}}, [4])
        first(td)  # the plan is made and cached
        if change == "batch_size":
            td.batch_size = [4, 4]
        elif change == "nested batch_size":
            td["n"].batch_size = [4, 4]
        elif change == "unsqueeze_":
            td["a"].unsqueeze_(1)
        elif change == "t_":
            td["a"].t_()  # square: the same shape, transposed
        else:
            td["a"].resize_(4, 2)
        for again in (td.consolidate(), pickle.loads(pickle.dumps(td, protocol=5))):
            assert again.batch_size == torch.Size(expected_batch), change
            assert again["n"].batch_size == td["n"].batch_size, change
            assert again["a"].shape == td["a"].shape, change
            assert torch.equal(again["a"], td["a"]), change


def test_every_dtype_and_non_tensor_values_where_the_reference_fails() -> None:
    # tensordict 0.15.3 packs leaves unaligned: a complex128 leaf after 504 bytes of others
    # cannot be viewed back ("storage_offset() must be divisible by 16"); ours aligns to 64
    with pytest.raises(RuntimeError, match="divisible"):
        _source(tensordict).consolidate()
    c = _source(tensordict_rs).consolidate()
    _dist_jobs.same(c, _source(tensordict_rs))
    assert c.is_consolidated()


def test_leaves_are_views_of_one_buffer_sent_without_a_copy() -> None:
    c = _source(tensordict_rs).consolidate()
    plan = _packed.plan(c)
    assert plan.whole is not None and plan.receive_in_place
    assert plan.pack() is plan.whole  # nothing to pack
    c["nested", "z"].add_(1)  # in-place writes keep it consolidated
    assert c.is_consolidated()
    assert _packed.plan(c).whole.data_ptr() == plan.whole.data_ptr()


def test_a_changed_tree_is_no_longer_consolidated() -> None:
    c = TensorDict({"a": torch.zeros(3), "b": torch.ones(3)}, [3]).consolidate()
    c.unlock_()
    c["a"] = torch.zeros(3)  # a new tensor, outside the buffer
    assert not c.is_consolidated()
    assert c.consolidate().is_consolidated()


def test_inplace_replaces_the_leaves_and_returns_self() -> None:
    src = _source(tensordict_rs)
    before = src.clone()
    out = src.consolidate(inplace=True)
    assert out is src and src.is_consolidated() and src.is_locked
    _dist_jobs.same(src, before)


def test_plain_and_memory_mapped_trees_are_not_consolidated() -> None:
    one = TensorDict({"a": torch.zeros(3)}, [3])
    assert not one.is_consolidated()  # a single leaf in its own storage (the reference: same)
    assert not tensordict.TensorDict({"a": torch.zeros(3)}, [3]).is_consolidated()
    assert not TensorDict({"a": torch.zeros(3)}, [3]).memmap_().is_consolidated()


def test_a_device_other_than_the_tree_is_honoured() -> None:
    c = _source(tensordict_rs).consolidate(device="cpu")
    assert c.is_consolidated()
    _dist_jobs.same(c, _source(tensordict_rs))


@pytest.mark.parametrize(
    "kwargs",
    [{"return_early": True}, {"use_buffer": True}, {"pin_memory": True}],  # filename: issue 23
)
def test_unsupported_options_are_refused_by_name(kwargs: dict[str, object]) -> None:
    td = TensorDict({"a": torch.zeros(3)}, [3])
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        td.consolidate(**kwargs)  # type: ignore[arg-type]
    assert not td.is_consolidated() and not td.is_locked  # nothing changed


@pytest.mark.parametrize("send", ["consolidate", "pickle", "describe"])
def test_a_tree_whose_plan_is_cached_is_freed(send: str) -> None:
    """The plan cached per tree (``packed._PLANS``) does not keep the tree alive: it held
    the root through the root's own leaves, so a consolidated, pickled or described source
    was never freed (its entry stayed in the cache too)."""
    import gc
    import pickle
    import weakref

    packed = _packed

    td = TensorDict({"a": torch.arange(3.0), "n": {"b": torch.ones(3)}}, [3])
    if send == "consolidate":
        out = td.consolidate()
        assert torch.equal(out["a"], td["a"]) and out.is_consolidated()
    elif send == "pickle":
        out = pickle.loads(pickle.dumps(td.consolidate(), protocol=5))
        assert torch.equal(out["n", "b"], td["n", "b"])
    else:
        assert b'"a"' in packed.describe(td)
    key = id(td)
    assert key in packed._PLANS
    tree = weakref.ref(td)
    del td
    gc.collect()
    assert tree() is None
    assert key not in packed._PLANS


@tensordict_rs.tensorclass
class _Step:
    """A tensorclass at module level (picklable by name), for the tests below."""

    obs: torch.Tensor
    text: str


@tensordict.tensorclass
class _RefStep:
    obs: torch.Tensor
    text: str


def _with_tensorclasses(lib: object, cls: type) -> object:
    step = cls(obs=torch.arange(3.0), text="a", batch_size=[])
    return lib.TensorDict(  # type: ignore[attr-defined]
        steps=torch.stack([step, step.clone()]),
        n={"m": torch.stack([step, step])},
        batch_size=[2],
    )


def _view(td: object) -> list[object]:
    return [
        type(td["steps"]).__name__.lstrip("_").replace("RefStep", "Step"),  # type: ignore[index]
        type(td["n", "m"]).__name__.lstrip("_").replace("RefStep", "Step"),  # type: ignore[index]
        td["steps"].obs.tolist(),  # type: ignore[index]
        list(td["n", "m"].text),  # type: ignore[index]
    ]


@pytest.mark.parametrize("how", ["consolidate", "pickle5", "clone_consolidated", "file"])
def test_tensorclasses_inside_keep_their_class(tmp_path: object, how: str) -> None:
    """A tensorclass inside a tree is a node of its own class, which the packed description
    does not carry: consolidate, protocol-5 pickles (Ray) and the copy of a consolidated tree
    gave a plain TensorDict there (found by tensordict's test_pickle_consolidate); they keep the
    class now, as tensordict 0.15.3."""
    import pickle

    def run(lib: object, cls: type) -> list[object]:
        td = _with_tensorclasses(lib, cls)
        if how == "consolidate":
            out = td.consolidate()  # type: ignore[attr-defined]
        elif how == "pickle5":
            out = pickle.loads(pickle.dumps(td.consolidate(), protocol=5))  # type: ignore[attr-defined]
        elif how == "clone_consolidated":
            out = td.consolidate().clone()  # type: ignore[attr-defined]
        else:
            out = td.consolidate(filename=f"{tmp_path}/{lib.__name__}.bin")  # type: ignore[attr-defined]
        return _view(out)

    assert run(tensordict_rs, _Step) == run(tensordict, _RefStep)


def test_stack_of_tensorclasses_without_batch_dims() -> None:
    """``torch.stack`` of tensorclasses with no batch dims gave the inner TensorDict (the first
    tensorclass was looked up with ``or``, and such a tensorclass was falsy); ``bool()`` of a
    tensorclass now raises, as in tensordict."""
    for cls in (_Step, _RefStep):
        step = cls(obs=torch.arange(3.0), text="a", batch_size=[])
        stacked = torch.stack([step, step])
        assert type(stacked) is cls and stacked.batch_size == (2,)
        assert type(stacked.consolidate()) is cls
        with pytest.raises(RuntimeError, match="boolean value is not permitted"):
            bool(step)
