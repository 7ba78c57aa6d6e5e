"""Model weights (issue 23): from_module/from_modules, to_module (and as a context manager),
state_dict/load_state_dict, and memory-mapped checkpoints, side by side with tensordict 0.15.3."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as rs
import torch
from torch import nn

PKGS = [rs, ref]


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(3, 4),
        nn.ReLU(),
        nn.BatchNorm1d(4),  # buffers: running_mean, running_var, num_batches_tracked
        nn.Sequential(nn.Linear(4, 2, bias=False)),
    )


def keys(td: Any) -> list[Any]:
    return list(td.keys(include_nested=True, leaves_only=True))


def same_tree(a: Any, b: Any) -> None:
    assert keys(a) == keys(b)
    assert a.batch_size == b.batch_size
    for key in keys(b):
        x, y = a.get(key), b.get(key)
        assert type(x).__name__ == type(y).__name__, key
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert x.requires_grad == y.requires_grad, key
        torch.testing.assert_close(
            x.detach().as_subclass(torch.Tensor), y.detach().as_subclass(torch.Tensor)
        )


# ---------------------------------------------------------------------------- from_module


@pytest.mark.parametrize("use_state_dict", [False, True])
def test_from_module(use_state_dict: bool) -> None:
    model = small_model()
    ours = rs.TensorDict.from_module(model, use_state_dict=use_state_dict)
    theirs = ref.TensorDict.from_module(model, use_state_dict=use_state_dict)
    same_tree(ours, theirs)
    assert ours.is_locked == theirs.is_locked
    if not use_state_dict:
        assert ours["0", "weight"] is model[0].weight  # the parameters themselves
        assert ours["2", "running_mean"] is model[2].running_mean
    else:
        assert not ours["0", "weight"].requires_grad


def test_from_module_filter_empty_and_lock() -> None:
    model = small_model()
    for P in PKGS:
        td = P.TensorDict.from_module(model, filter_empty=False, lock=True)
        assert "1" in td.keys() and td["1"].is_empty() and td.is_locked


def test_from_modules() -> None:
    models = [small_model(i) for i in range(3)]
    ours = rs.TensorDict.from_modules(*models)
    theirs = ref.TensorDict.from_modules(*models)
    same_tree(ours, theirs)
    assert ours.batch_size == torch.Size([3])
    assert isinstance(ours["0", "weight"], nn.Parameter)
    assert not isinstance(ours["2", "running_mean"], nn.Parameter)
    assert ours.is_locked == theirs.is_locked


def test_from_modules_expand_identical() -> None:
    shared = nn.Linear(2, 2)
    models = [nn.Sequential(shared, nn.Linear(2, 1)) for _ in range(2)]
    ours = rs.TensorDict.from_modules(*models, expand_identical=True)
    theirs = ref.TensorDict.from_modules(*models, expand_identical=True)
    same_tree(ours, theirs)
    assert ours["0", "weight"].stride(0) == 0  # expanded, not stacked


def test_from_modules_mismatch() -> None:
    for P in PKGS:
        with pytest.raises((RuntimeError, ValueError, KeyError)):
            P.TensorDict.from_modules(nn.Linear(2, 2), nn.Linear(2, 3))


@pytest.mark.parametrize("as_module", [False, True])
def test_from_module_as_module(as_module: bool) -> None:
    model = small_model()
    ours = rs.TensorDict.from_module(model, as_module=as_module)
    theirs = ref.TensorDict.from_module(model, as_module=as_module)
    assert isinstance(ours, nn.Module) == isinstance(theirs, nn.Module)
    if as_module:
        names_ours = sorted(n for n, _ in ours.named_parameters())
        names_theirs = sorted(n for n, _ in theirs.named_parameters())
        assert len(names_ours) == len(names_theirs)
        assert sum(p.numel() for p in ours.parameters()) == sum(
            p.numel() for p in theirs.parameters()
        )
        holder = nn.Module()
        holder.params = ours  # a submodule: its parameters reach an optimizer
        assert len(list(holder.parameters())) == len(list(model.parameters()))


# ---------------------------------------------------------------------------- to_module


@pytest.mark.parametrize("inplace", [None, True])
def test_to_module_swap(inplace: bool | None) -> None:
    results = []
    for P in PKGS:
        model = small_model()
        zeros = P.TensorDict.from_module(model).data.clone().zero_()
        weight = model[0].weight
        old = zeros.to_module(model, inplace=inplace)
        assert (model[0].weight == 0).all()
        assert (model[0].weight is weight) == bool(inplace)
        assert isinstance(model[0].weight, nn.Parameter)
        results.append(old)
        back = old.to_module(model, inplace=inplace)
        assert (model[0].weight != 0).any()
        assert (back["0", "weight"] == 0).all()
    same_tree(results[0], results[1])


def test_to_module_context_manager_restores() -> None:
    x = torch.ones(5, 3)
    for P in PKGS:
        model = small_model().eval()
        before = model(x)
        weight = model[0].weight
        zeros = P.TensorDict.from_module(model).data.clone().zero_()
        with zeros.to_module(model):
            y = model(x)
            assert (model[0].weight == 0).all()
        assert model[0].weight is weight
        torch.testing.assert_close(model(x), before)
        with pytest.raises(ValueError, match="stop"), zeros.to_module(model):
            raise ValueError("stop")
        assert model[0].weight is weight
        assert y.abs().sum() < before.abs().sum()


def test_to_module_return_swap_false_and_swap_dest() -> None:
    for P in PKGS:
        model = small_model()
        params = P.TensorDict.from_module(model).data.clone()
        assert params.to_module(model, return_swap=False) is None
        dest = P.TensorDict.from_module(model).data.clone().zero_()
        out = params.apply(lambda t: t + 1).to_module(model, swap_dest=dest)
        assert out is dest
        torch.testing.assert_close(dest["0", "weight"], params["0", "weight"])


def test_to_module_use_state_dict() -> None:
    for P in PKGS:
        model = small_model()
        params = P.TensorDict.from_module(model, use_state_dict=True).clone().zero_()
        params.to_module(model, use_state_dict=True)
        assert (model[0].weight == 0).all() and isinstance(model[0].weight, nn.Parameter)
        with pytest.raises(RuntimeError):
            params.to_module(model, use_state_dict=True, inplace=True)


def test_functional_call_with_vmap() -> None:
    """The ensemble recipe: stacked parameters, a meta module, vmap over to_module."""
    models = [nn.Linear(3, 4) for _ in range(2)]
    x = torch.randn(3)
    outs = []
    for P in PKGS:
        params = P.TensorDict.from_modules(*models)
        empty = nn.Linear(3, 4, device="meta")

        def call(p: Any, x: torch.Tensor, empty: nn.Module = empty) -> torch.Tensor:
            with p.to_module(empty):
                return empty(x)

        outs.append(torch.vmap(call, (0, None))(params, x))
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(outs[0][0], models[0](x))


def test_to_module_grads_flow() -> None:
    for P in PKGS:
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        params = P.TensorDict.from_module(model).data.clone().requires_grad_()
        with params.to_module(model):
            model(torch.ones(5, 3)).sum().backward()
        assert params["0", "weight"].grad is not None
        assert model[0].weight.grad is None


# ---------------------------------------------------------------------------- state_dict


def test_state_dict_side_by_side() -> None:
    for flatten in (True, False):
        ours = rs.TensorDict({"1": 1, "2": 2, "3": {"3": 3}}, []).state_dict(flatten=flatten)
        theirs = ref.TensorDict({"1": 1, "2": 2, "3": {"3": 3}}, []).state_dict(flatten=flatten)
        assert isinstance(ours, collections.OrderedDict)
        assert list(ours) == list(theirs)
        assert dict(ours._metadata) == dict(theirs._metadata)


def test_state_dict_prefix_keep_vars() -> None:
    for P in PKGS:
        td = P.TensorDict({"a": torch.ones(2, requires_grad=True)}, [2])
        assert not td.state_dict()["a"].requires_grad
        assert td.state_dict(keep_vars=True)["a"] is td["a"]
        assert list(td.state_dict(prefix="p.")) == ["p.a"]


@pytest.mark.parametrize("assign", [False, True])
def test_load_state_dict(assign: bool) -> None:
    for P in PKGS:
        src = P.TensorDict({"a": torch.arange(3.0), "n": {"b": torch.ones(3, 2)}}, [3])
        dst = P.TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3, 2)}}, [3])
        a = dst["a"]
        out = dst.load_state_dict(src.state_dict(), assign=assign)
        assert out is dst
        assert (dst["a"] == torch.arange(3.0)).all()
        assert (dst["a"] is a) is not assign


def test_load_state_dict_strict() -> None:
    for P in PKGS:
        src = P.TensorDict({"a": torch.arange(3.0)}, [3])
        dst = P.TensorDict({"a": torch.zeros(3), "b": torch.zeros(3)}, [3])
        with pytest.raises(RuntimeError):
            dst.load_state_dict(src.state_dict())
        dst.load_state_dict(src.state_dict(), strict=False)
        assert (dst["a"] == torch.arange(3.0)).all() and (dst["b"] == 0).all()


def test_load_state_dict_cross_package() -> None:
    """A state dict written by either package loads in the other."""
    ours = rs.TensorDict({"a": torch.arange(3.0), "n": {"b": torch.ones(3, 2)}}, [3])
    theirs = ref.TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3, 2)}}, [3])
    theirs.load_state_dict(ours.state_dict())
    assert (theirs["a"] == torch.arange(3.0)).all()
    ours.zero_().load_state_dict(
        ref.TensorDict({"a": torch.ones(3), "n": {"b": torch.ones(3, 2)}}, [3]).state_dict()
    )
    assert (ours["a"] == 1).all()


def _with_strings(P: Any, fill: float, word: str) -> Any:
    with P.set_list_to_stack(True):
        return P.TensorDict(
            {"a": torch.full((2,), fill), "s": word, "n": {"b": torch.ones(2), "t": word}},
            [2],
        )


@pytest.mark.parametrize("flatten", [True, False])
def test_state_dict_non_tensor_entries(flatten: bool) -> None:
    """As tensordict: a non-tensor entry is no state dict key (torch modules take tensors) but
    a record in the ``_metadata`` of its level, and ``load_state_dict`` sets it back, within
    each package and across them. (Here they were plain values among the tensors, and
    loading them back raised AttributeError.)"""
    sds = {P: _with_strings(P, 1.0, "x").state_dict(flatten=flatten) for P in PKGS}
    assert list(sds[rs]) == list(sds[ref])
    assert dict(sds[rs]._metadata) == dict(sds[ref]._metadata)
    if not flatten:
        assert dict(sds[rs]["s"]._metadata) == dict(sds[ref]["s"]._metadata)
    for writer in PKGS:
        for reader in PKGS:
            dst = _with_strings(reader, 0.0, "q")
            dst.load_state_dict(_with_strings(writer, 1.0, "x").state_dict(flatten=flatten))
            assert (dst["a"] == 1).all(), (writer, reader)
            assert dst["s"] == "x" and dst["n", "t"] == "x", (writer, reader)


def test_state_dict_non_tensor_stack_round_trip() -> None:
    """A ``NonTensorStack``'s values go into its record too, and come back here (tensordict
    records and restores none: its loader keeps the old values)."""
    with rs.set_list_to_stack(True):
        src = rs.TensorDict({"a": torch.ones(2), "s": ["x", "y"]}, [2])
        dst = rs.TensorDict({"a": torch.zeros(2), "s": ["p", "q"]}, [2])
    assert "s" not in src.state_dict()
    dst.load_state_dict(src.state_dict())
    assert dst["s"] == ["x", "y"] and (dst["a"] == 1).all()


def test_module_state_dict_into_tensordict() -> None:
    """torchrl's pattern: a module's state_dict loads into a tensordict of its parameters."""
    model = small_model()
    for P in PKGS:
        td = P.TensorDict.from_module(small_model(1)).data.clone()
        td.load_state_dict(model.state_dict(), from_flatten=True)
        torch.testing.assert_close(td["0", "weight"], model[0].weight.data)


# ---------------------------------------------------------------------------- checkpoints


def test_memmap_checkpoint_bit_identical(tmp_path: Path) -> None:
    """``from_module(model).memmap(dir)`` then ``load_memmap(dir).to_module(fresh)``."""
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8)).double()
    x = torch.randn(10, 16, dtype=torch.float64)
    expected = model(x)
    rs.TensorDict.from_module(model).memmap(tmp_path / "ckpt")
    fresh = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8)).double()
    rs.TensorDict.load_memmap(tmp_path / "ckpt").to_module(fresh)
    assert torch.equal(fresh(x), expected)
    # and the reference loads our checkpoint into a third model, bit-identical too
    third = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8)).double()
    ref.TensorDict.load_memmap(tmp_path / "ckpt").to_module(third)
    assert torch.equal(third(x), expected)


def test_reference_checkpoint_loads_here(tmp_path: Path) -> None:
    model = small_model().eval()
    x = torch.randn(5, 3)
    ref.TensorDict.from_module(model).memmap(tmp_path / "ckpt")
    fresh = small_model(7).eval()
    rs.TensorDict.load_memmap(tmp_path / "ckpt").to_module(fresh)
    assert torch.equal(fresh(x), model(x))


def test_requires_grad_integer_leaf_raises() -> None:
    for P in PKGS:
        params = P.TensorDict.from_module(small_model()).data.clone()
        with pytest.raises(RuntimeError, match="floating point"):
            params.requires_grad_()


def test_requires_grad_zero_grad_param_count() -> None:
    model = small_model()
    for P in PKGS:
        params = P.TensorDict.from_module(model)
        assert params.param_count() == sum(p.numel() for p in model.parameters()) + sum(
            b.numel() for b in model.buffers()
        )
        assert params.bytes() >= params.param_count()
        model(torch.ones(5, 3)).sum().backward()
        assert params.grad is not None
        params.zero_grad()
        assert model[0].weight.grad is None


def test_tensordict_params_operators_side_by_side() -> None:
    """TensorDictParams takes the TensorDict operators (``params + 1``, ``-params``,
    ``params == td`` and ``td == params``), giving TensorDicts, and stays hashable as a module
    (``params + 1`` raised TypeError, and ``td == params`` compared with the module object)."""
    seen = []
    for P in PKGS:
        params = P.TensorDictParams(
            P.TensorDict({"a": torch.ones(2), "n": {"b": torch.zeros(2)}}, [2])
        )
        td = P.TensorDict({"a": torch.ones(2), "n": {"b": torch.zeros(2)}}, [2])
        model = nn.Module()
        model.p = params
        seen.append(
            [
                bool((td == params).all()),
                bool((params == td).all()),
                (params + 1)["a"].tolist(),
                (2 * params)["a"].tolist(),
                (-params)["n", "b"].tolist(),
                bool((params != 0).any()),
                type(params - 1).__name__,
                {params: 1}[params],
                len(list(model.named_modules())),
            ]
        )
    assert seen[0] == seen[1]


def test_from_modules_as_module_under_vmap() -> None:
    """tensordict's ensembling recipe with ``as_module=True``: the TensorDictParams goes
    through ``torch.vmap`` (a pytree node; vmap refused it) and gradients reach its
    parameters; the outputs equal tensordict's."""
    outs = []
    for P in PKGS:
        torch.manual_seed(0)
        modules = [nn.Linear(3, 4) for _ in range(3)]
        empty = nn.Linear(3, 4, device="meta")
        params = P.TensorDict.from_modules(*modules, as_module=True)

        def run(p: Any, x: torch.Tensor, empty: nn.Module = empty) -> torch.Tensor:
            with p.to_module(empty, preserve_module_state=False):
                return empty(x)

        y = torch.vmap(run, (0, None))(params, torch.ones(3))
        y.sum().backward()
        assert all(p.grad is not None for p in params.parameters())
        outs.append(y.detach())
    torch.testing.assert_close(outs[0], outs[1])


def test_tensordict_params_in_place_methods_return_it() -> None:
    """An in-place TensorDict method called on a TensorDictParams returns the module itself, as
    tensordict's (the wrapped TensorDict came back)."""
    for P in PKGS:
        params = P.TensorDictParams(P.TensorDict({"a": torch.ones(2), "b": torch.ones(2)}, [2]))
        assert params.select("a", inplace=True) is params
        with torch.no_grad():
            assert params.apply_(lambda t: t * 0) is params
        assert sorted(params.keys()) == ["a"] and (params["a"] == 0).all()
        params.lock_()
        with params.unlock_():  # a context through the module, as through its TensorDict
            assert not params.is_locked
            params["c"] = torch.ones(2)
            params["d"] = torch.ones(2)
            assert params.del_("a") is params
            del params["d"]
        assert params.is_locked
        assert sorted(name for name, _ in params.named_parameters()) == ["c"]
