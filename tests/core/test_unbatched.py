"""``UnbatchedTensor`` (issue 21), side by side with tensordict 0.15.3.

Each scenario is a function of the package (``ours`` or ``ref``) that builds the same input and
returns what it observes; ``observe`` turns an ``UnbatchedTensor`` into its type, payload shape,
batch size, values and whether it still views the input's data, so that "kept whole" is
checked, not only "same values". Saves and consolidation refuse it in both packages (the
formats have no record of one); the differences are tested as such at the end.
"""

from __future__ import annotations

import math
import operator
import pickle
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensordict as ref
import tensordict_rs as ours
import torch
from tensordict_rs.utils import _check_recursive_properties, _pass_through

DATA = torch.arange(5.0)
NESTED = torch.zeros(2)  # the nested entry's payload (shared too: stacks of it do not warn)


def observe(x: Any) -> Any:
    """A comparable description of a result (trees: every entry, unbatched ones in full)."""
    if type(x).__name__ == "UnbatchedTensor":
        return (
            "Unbatched",
            tuple(x.shape),
            tuple(x.batch_size),
            x.tolist(),
            x.data_ptr() == DATA.data_ptr(),
            str(x.dtype),
        )
    if isinstance(x, torch.Tensor):
        return ("Tensor", tuple(x.shape), str(x.dtype))
    if type(x).__name__ in ("TensorDict", "LazyStackedTensorDict"):  # (our stacks are dense)
        entries = {str(k): observe(x.get(k)) for k in x.keys(include_nested=True)}
        return ("tree", tuple(x.batch_size), entries)
    if isinstance(x, (list, tuple)):
        return [observe(v) for v in x]
    return x


def outcome(fn: Callable[[Any], Any], pkg: Any) -> Any:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            seen = observe(fn(pkg))
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as err:
            seen = ("raises", type(err).__name__, str(err))
        finally:
            DATA.copy_(torch.arange(5.0))  # scenarios that write the payload (zero_, rows)
            NESTED.zero_()
    return seen, sorted({str(w.message)[:40] for w in caught if w.category is UserWarning})


def same(fn: Callable[[Any], Any]) -> Any:
    mine, theirs = outcome(fn, ours), outcome(fn, ref)
    assert mine == theirs
    return mine


def tree(pkg: Any, batch: tuple[int, ...] = (3,), data: torch.Tensor = DATA) -> Any:
    return pkg.TensorDict(
        x=torch.zeros(*batch, 2),
        u=pkg.UnbatchedTensor(data),
        n={"u": pkg.UnbatchedTensor(NESTED if data is DATA else torch.zeros(2))}
        | {"y": torch.ones(*batch)},
        batch_size=list(batch),
    )


def wide(pkg: Any) -> Any:
    return tree(pkg, (2, 3))


MASK = torch.tensor([[True, False, True], [False, True, False]])

SHAPE_OPS: dict[str, Callable[[Any], Any]] = {
    "get": lambda pkg: tree(pkg).get("u"),
    "getitem_key": lambda pkg: tree(pkg)["u"],
    "index": lambda pkg: wide(pkg)[0],
    "slice": lambda pkg: wide(pkg)[:, :2],
    "mask": lambda pkg: wide(pkg)[MASK],
    "fancy": lambda pkg: tree(pkg)[torch.tensor([0, 2])],
    "reshape": lambda pkg: tree(pkg).reshape(1, 3),
    "view": lambda pkg: tree(pkg).view(3, 1),
    "unsqueeze": lambda pkg: tree(pkg).unsqueeze(0),
    "squeeze": lambda pkg: tree(pkg).unsqueeze(0).squeeze(),
    "transpose": lambda pkg: wide(pkg).transpose(0, 1),
    "permute": lambda pkg: wide(pkg).permute(1, 0),
    "flatten": lambda pkg: wide(pkg).flatten(0, 1),
    "unflatten": lambda pkg: tree(pkg).unflatten(0, (1, 3)),
    "expand": lambda pkg: tree(pkg).expand(2, 3),
    "unbind": lambda pkg: tree(pkg).unbind(0),
    "split": lambda pkg: wide(pkg).split(1, dim=0),
    "split_sizes": lambda pkg: tree(pkg).split((2, 1)),
    "chunk": lambda pkg: wide(pkg).chunk(2, dim=1),
    "gather": lambda pkg: wide(pkg).gather(0, torch.zeros(1, 3, dtype=torch.long)),
    "masked_select": lambda pkg: wide(pkg).masked_select(MASK),
    "torch_unbind": lambda pkg: torch.unbind(tree(pkg), 0),
    "torch_squeeze": lambda pkg: torch.squeeze(tree(pkg).unsqueeze(0)),
    "stack": lambda pkg: torch.stack([tree(pkg), tree(pkg)], 0),
    "stack_last": lambda pkg: torch.stack([wide(pkg)] * 3, -1),
    "cat": lambda pkg: torch.cat([tree(pkg), tree(pkg)], 0),
    # one tree (the batch size stays: the payload is not concatenated with itself), along a
    # later dim than the payload has (what ``map(dim=-1)`` joins its chunks with)
    "cat_one": lambda pkg: torch.cat([tree(pkg)], 0),
    "cat_one_last": lambda pkg: torch.cat([tree(pkg, (2, 1, 3, 1))], 3),
    "cat_different_data": lambda pkg: torch.cat([tree(pkg), tree(pkg, data=torch.ones(5))], 0),
    "lazy_stack": lambda pkg: pkg.lazy_stack([tree(pkg), tree(pkg)], 0),
    "sum": lambda pkg: tree(pkg).sum(),
}


@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_shape_operations_keep_the_payload_whole(name: str) -> None:
    seen, _ = same(SHAPE_OPS[name])
    assert "Unbatched" in repr(seen)


def _stack_out(pkg: Any, cat: bool) -> Any:
    items = [tree(pkg, (2,)) for _ in range(3)]
    batch = [6] if cat else [3, 2]
    out = pkg.TensorDict(  # out's own payloads: cat takes the inputs', stack keeps out's
        x=torch.empty(*batch, 2),
        u=pkg.UnbatchedTensor(torch.full((5,), 9.0)),
        n={"u": pkg.UnbatchedTensor(torch.full((2,), 9.0)), "y": torch.empty(*batch)},
        batch_size=batch,
    )
    result = torch.cat(items, 0, out=out) if cat else torch.stack(items, 0, out=out)
    assert result is out
    return result


def _stack_different(pkg: Any) -> Any:
    other = tree(pkg)
    other["u"] = pkg.UnbatchedTensor(torch.ones(5))
    return torch.stack([tree(pkg), other])


def _set_rows(pkg: Any) -> Any:
    td = tree(pkg)
    source = tree(pkg)[:2]
    source["u"] = pkg.UnbatchedTensor(torch.full((5,), 9.0))
    td[:2] = source
    return td


def _auto_batch_size(pkg: Any) -> Any:
    td = pkg.TensorDict(a=pkg.UnbatchedTensor(0), b=torch.randn(2, 3)).auto_batch_size_(
        batch_dims=2
    )
    # the entry's batch size: tensordict 0.15.3 leaves it at the old one, [] (see below)
    return tuple(td.batch_size), td["a"].tolist(), tuple(td["a"].batch_size)


def _apply_named(pkg: Any) -> Any:
    return tree(pkg).named_apply(lambda key, t: t + 1, nested_keys=True)


OTHER_OPS: dict[str, Callable[[Any], Any]] = {
    "stack_out": lambda pkg: _stack_out(pkg, cat=False),
    "cat_out": lambda pkg: _stack_out(pkg, cat=True),
    "stack_different_data_warns": _stack_different,
    "int": lambda pkg: tree(pkg).int(),
    "to_dtype": lambda pkg: tree(pkg).to(torch.float64),
    "to_device": lambda pkg: tree(pkg).to("cpu"),
    "clone": lambda pkg: tree(pkg).clone(),
    "copy": lambda pkg: tree(pkg).copy(),
    "exp": lambda pkg: tree(pkg).exp(),
    "add": lambda pkg: tree(pkg) + 1,
    "ones_like": lambda pkg: torch.ones_like(tree(pkg)),
    "apply": lambda pkg: tree(pkg).apply(lambda t: t * 2),
    "apply_new_batch": lambda pkg: tree(pkg).apply(lambda t: t[0], batch_size=[]),
    "named_apply": _apply_named,
    "zero_": lambda pkg: tree(pkg).zero_(),
    "select": lambda pkg: tree(pkg).select("u"),
    "exclude": lambda pkg: tree(pkg).exclude("x"),
    "flatten_keys": lambda pkg: tree(pkg).flatten_keys(),
    "set_rows_from_tree": _set_rows,
    "pickle": lambda pkg: pickle.loads(pickle.dumps(tree(pkg))),
    "auto_batch_size": lambda pkg: _auto_batch_size(pkg)[:2],
    "set_any_shape": lambda pkg: tree(pkg).set("v", pkg.UnbatchedTensor(torch.zeros(7, 1))),
    "plain_tensor_checked": lambda pkg: tree(pkg).set("v", torch.zeros(7)),
}


@pytest.mark.parametrize("name", sorted(OTHER_OPS))
def test_other_operations(name: str) -> None:
    same(OTHER_OPS[name])


def test_stacking_the_same_data_does_not_warn() -> None:
    seen, warned = same(lambda pkg: torch.stack([tree(pkg), tree(pkg)]))
    assert warned == [] and seen[2]["u"][4]  # the input's data, no warning
    _, warned = same(_stack_different)
    assert warned == ["Stacking UnbatchedTensors with different"]


def test_every_node_agrees_with_its_parent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (stack_different_data_warns)
        checked = {**SHAPE_OPS, **OTHER_OPS}
        checked.pop("plain_tensor_checked")  # (raises, as it should)
        results = [fn(ours) for fn in checked.values()]
    for result in results:
        for td in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(td, ours.TensorDict):
                assert _check_recursive_properties(td)
    bad = tree(ours)
    bad._tensordict["x"] = torch.zeros(4)  # the checker can fail
    with pytest.raises(AssertionError, match="'x'"):
        _check_recursive_properties(bad)


# ------------------------------------------------------------------------------------------
# The tensor itself


CONVERSIONS: list[Callable[[Any], Any]] = [
    str,
    format,
    lambda x: format(x, ".2f"),
    bool,
    int,
    float,
    complex,
    operator.index,
    round,
    lambda x: round(x, 1),
    math.trunc,
    math.floor,
    math.ceil,
    lambda x: x.item(),
    lambda x: x.tolist(),
    repr,
    lambda x: np.asarray(x).tolist(),
    lambda x: np.asarray(x, dtype=np.float64).tolist(),
]


@pytest.mark.parametrize(
    "data",
    [torch.tensor(3), torch.tensor([[3]]), torch.tensor(1.25), torch.tensor(1 + 2j)]
    + [torch.tensor([1, 2]), torch.empty(0), torch.tensor(True)],
    ids=str,
)
def test_python_conversions(data: torch.Tensor) -> None:
    for fn in CONVERSIONS:

        def convert(pkg: Any, fn: Callable[[Any], Any] = fn) -> Any:
            value = fn(pkg.UnbatchedTensor(data))
            return type(value).__name__, value

        same(convert)


def test_tensor_identity_and_pass_through() -> None:
    def facts(pkg: Any) -> Any:
        ut = pkg.UnbatchedTensor(DATA, batch_size=[4])
        again = pkg.UnbatchedTensor(ut)
        return (
            isinstance(ut, torch.Tensor),
            ut.data_ptr() == DATA.data_ptr(),
            again is ut,
            tuple(ut.batch_size),
            tuple(pkg.UnbatchedTensor(DATA).batch_size),
            type(ut + 1).__name__,
            tuple((ut + 1).batch_size),
            [10, 20][pkg.UnbatchedTensor(torch.tensor(1))],
        )

    assert same(facts)[0][0] is True
    assert _pass_through(ours.UnbatchedTensor(DATA)) and _pass_through(ours.NonTensorData(1))
    assert not _pass_through(DATA)


def test_repr() -> None:
    same(lambda pkg: (repr(pkg.UnbatchedTensor(DATA)), repr(tree(pkg))))


def test_tensorclass_field() -> None:
    def build(pkg: Any) -> Any:
        @pkg.tensorclass
        class Holder:
            config: torch.Tensor
            value: torch.Tensor

        tc = Holder(config=pkg.UnbatchedTensor(DATA), value=torch.randn(3), batch_size=[3])
        return tc.config, tc.get("config"), tc[0].config

    same(build)


# ------------------------------------------------------------------------------------------
# vmap


def _vmap_tree(pkg: Any) -> Any:
    td = wide(pkg)
    out = torch.vmap(lambda x: x)(td)
    return out, out.get("u")


VMAPS: dict[str, Callable[[Any], Any]] = {
    "tree": _vmap_tree,
    "return_entry": lambda pkg: torch.vmap(lambda x: x["u"])(wide(pkg)),
    "inside_batch": lambda pkg: (
        torch.vmap(lambda x: x["u"].batch_size, out_dims=None)(wide(pkg))
        if pkg is ours
        else torch.Size([3])
    ),
    "direct": lambda pkg: torch.vmap(lambda x: x)(pkg.UnbatchedTensor(DATA, batch_size=[4])),
    "direct_scalar": lambda pkg: torch.vmap(lambda x: x)(
        pkg.UnbatchedTensor(torch.tensor(1.0), batch_size=[2])
    ),
    "arithmetic_inside": lambda pkg: torch.vmap(lambda x: x["x"] + x["u"].sum())(wide(pkg)),
}


@pytest.mark.parametrize("name", sorted(VMAPS))
def test_vmap(name: str) -> None:
    same(VMAPS[name])


def test_vmap_without_unbatched_is_torch_own() -> None:
    x = torch.randn(4, 3)
    assert torch.equal(torch.vmap(lambda t: t * 2)(x), x * 2)
    with pytest.raises(ValueError, match="same size in the mapped dimension"):
        torch.vmap(torch.add)(torch.zeros(2), torch.zeros(3))


# ------------------------------------------------------------------------------------------
# Saving, consolidation, sharing: the formats have no record of an UnbatchedTensor


def _save(how: str, tmp: Path) -> Callable[[Any], Any]:
    def save(pkg: Any) -> Any:
        td = tree(pkg)
        target = tmp / pkg.__name__
        if how == "memmap":
            return td.memmap(target)
        if how == "memmap_":
            return td.memmap_()
        if how == "save":
            return td.save(target)
        if how == "nested":
            return td.exclude("u").memmap(target)
        return td.consolidate()

    return save


@pytest.mark.parametrize("how", ["memmap", "memmap_", "save", "nested", "consolidate"])
def test_saves_refuse_naming_the_key(how: str, tmp_path: Path) -> None:
    mine, theirs = outcome(_save(how, tmp_path), ours), outcome(_save(how, tmp_path), ref)
    assert mine[0][:2] == theirs[0][:2] == ("raises", "NotImplementedError")
    if how == "nested":  # tensordict names the key inside the nested tree, we the full key
        assert "('n', 'u')" in mine[0][2] and "'u'" in theirs[0][2]
    else:
        assert mine == theirs
    assert not (tmp_path / "tensordict_rs").exists() or not any(
        (tmp_path / "tensordict_rs").iterdir()
    )


@pytest.mark.parametrize("how", ["like", "archive"])
def test_like_and_archives_refuse(how: str, tmp_path: Path) -> None:
    # tensordict fails later there, with the batch-size error of a plain tensor (after a
    # warning for archives); both are RuntimeErrors
    def save(pkg: Any) -> Any:
        td = tree(pkg)
        name = tmp_path / (pkg.__name__ + (".tdz" if how == "archive" else ""))
        return td.memmap_like(name) if how == "like" else td.memmap(name)

    mine, theirs = outcome(save, ours), outcome(save, ref)
    assert mine[0][0] == theirs[0][0] == "raises"
    assert "UnbatchedTensor entries cannot be memory-mapped yet, but 'u' is one" in mine[0][2]
    assert "batch dimension mismatch" in theirs[0][2]


def _share_and_write(td: Any) -> None:
    td["u"].fill_(7.0)
    td["n", "u"].add_(1.0)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_shared_payload_is_written_by_a_child(method: str) -> None:
    import torch.multiprocessing as mp

    seen = []
    for pkg in (ours, ref):
        td = tree(pkg, data=torch.arange(5.0)).share_memory_()
        child = mp.get_context(method).Process(target=_share_and_write, args=(td,))
        child.start()
        child.join()
        assert child.exitcode == 0
        seen.append((observe(td["u"])[:4], td["n", "u"].tolist(), td["u"].is_shared()))
    assert seen[0] == seen[1]
    assert seen[0][0][3] == [7.0] * 5 and seen[0][1] == [1.0, 1.0]


# ------------------------------------------------------------------------------------------
# Differences


def test_rows_of_a_value_leave_the_payload_alone() -> None:
    """``td[rows] = number`` writes every leaf's rows; an UnbatchedTensor has no rows, so it is
    left as it is (tensordict's documented rule). tensordict 0.15.3 indexes the payload with
    the batch index instead."""
    mine, theirs = tree(ours), tree(ref)
    mine[:2] = 0.0
    theirs[:2] = 0.0
    assert mine["u"].tolist() == DATA.tolist()
    assert theirs["u"].tolist() == [0.0, 0.0, *DATA.tolist()[2:]]
    assert torch.equal(mine["x"], theirs["x"])


def test_auto_batch_size_sets_the_entry_batch_size() -> None:
    """After ``auto_batch_size_`` the entry's ``batch_size`` is the tree's here; tensordict
    0.15.3 leaves the one it had before (``[]``), which its own checker would refuse."""
    assert _auto_batch_size(ours)[2] == (2, 3)
    assert _auto_batch_size(ref)[2] == ()


# ------------------------------------------------------------------------------------------
# safetensors files: the payload is the tensor, its name in this library's metadata


def test_safetensors_round_trip(tmp_path: Path) -> None:
    import safetensors.torch

    path = tmp_path / "u.safetensors"
    tree(ours).to_safetensors(path)
    back = ours.TensorDict.from_safetensors(path)
    # the same tree (a copy of the payload: "False", it is not DATA's memory)
    expected = observe(tree(ours, data=DATA.clone()))
    assert observe(back) == expected
    assert type(back["n", "u"]) is ours.UnbatchedTensor
    assert sorted(safetensors.torch.load_file(path)) == ["n.u", "n.y", "u", "x"]
    with pytest.raises(ValueError, match="reserved"):
        reserved = {"tensordict_rs.unbatched": "[]"}
        tree(ours).to_safetensors(tmp_path / "r.safetensors", metadata=reserved)


@pytest.mark.parametrize("bad", ['["missing"]', '"u"', "[1]", "{"])
def test_safetensors_damaged_unbatched_names_are_refused(tmp_path: Path, bad: str) -> None:
    import safetensors.torch

    path = tmp_path / "bad.safetensors"
    safetensors.torch.save_file(
        {"u": torch.zeros(5)}, path, metadata={"tensordict_rs.unbatched": bad}
    )
    with pytest.raises(ours.InvalidDirectoryError, match=r"tensordict_rs\.unbatched"):
        ours.TensorDict.from_safetensors(path)


@pytest.mark.parametrize("name", ["min", "max", "cummin", "cummax"])
def test_reductions_with_indices_leave_the_payload_out_of_the_indices(name: str) -> None:
    """``min``/``max``/``cummax``... over a batch dim of a tree holding an UnbatchedTensor:
    the values keep it, the indices have one entry per batched leaf (StopIteration before;
    tensordict 0.15.3 files the payload's values in the indices under an empty key)."""
    payload = torch.rand(7, 2)
    td = ours.TensorDict(
        {"a": torch.rand(4, 3), "n": {"b": torch.rand(4)}, "u": ours.UnbatchedTensor(payload)},
        [4],
    )
    got = getattr(td, name)(dim=0)
    assert set(got.indices.keys(include_nested=True, leaves_only=True)) == {"a", ("n", "b")}
    for key in ("a", ("n", "b")):
        want = getattr(torch, name)(td[key], dim=0)
        assert torch.equal(got.values[key], want.values)
        assert torch.equal(got.indices[key], want.indices)
    assert torch.equal(got.values["u"], payload)
