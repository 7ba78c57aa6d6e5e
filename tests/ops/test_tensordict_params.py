"""``TensorDictParams``'s TensorDict methods that ``nn.Module`` also has (``apply``, ``to``,
``type``, ``float``..., ``state_dict``, ``load_state_dict``, ``zero_grad``), its copies
(``clone``, ``copy``) and in-place writes (``zero_``, ``fill_``...), side by side with
tensordict 0.15.3 (found by an attack: the module's methods won, and converted or returned the
live weights)."""

from __future__ import annotations

from typing import Any

import pytest
import tensordict as ref
import tensordict.nn as ref_nn
import tensordict_rs as rs
import tensordict_rs.nn as rs_nn
import torch
from torch import nn

PKGS = [(rs, rs_nn), (ref, ref_nn)]


def model_and_params(P: Any, N: Any) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    return model, N.TensorDictParams(P.TensorDict.from_module(model))


def test_apply_returns_a_new_tensordict() -> None:
    """``params.apply(fn)`` is TensorDict's (``nn.Module.apply`` ran ``fn`` on the module and
    returned the live parameters): a TensorDict of the results, the parameters unchanged. The
    target-parameters recipe ``apply(lambda x: Parameter(x.data.clone()))`` gets new storage."""
    seen = []
    for P, N in PKGS:
        model, params = model_and_params(P, N)
        weight = model[0].weight.detach().clone()
        doubled = params.apply(lambda x: x * 2)
        target = params.apply(
            lambda x: nn.Parameter(x.data.clone()) if x.is_floating_point() else x
        )
        named = params.named_apply(lambda key, x: x + 1)
        assert torch.equal(doubled["0", "weight"].detach(), weight * 2)
        assert torch.equal(model[0].weight.detach(), weight)
        seen.append(
            [
                type(doubled).__name__,
                doubled is params,
                type(target["0", "weight"]).__name__,
                target["0", "weight"].data_ptr() == model[0].weight.data_ptr(),
                type(named).__name__,
                torch.equal(named["0", "weight"].detach(), weight + 1),
            ]
        )
    assert seen[0] == seen[1]
    assert seen[0][:4] == ["TensorDict", False, "Parameter", False]


def test_to_returns_new_params_and_leaves_the_model() -> None:
    """``params.to(dtype)`` / ``cpu()`` return a new TensorDictParams (new leaf Parameters for a
    cast, the same ones when nothing moves); the source model and ``params`` keep their dtype
    (the module's ``to`` converted the model's Parameters in place and returned ``params``)."""
    seen = []
    for P, N in PKGS:
        model, params = model_and_params(P, N)
        f64 = params.to(torch.float64)
        i32 = params.to(torch.int32)
        on_cpu = params.cpu()
        w = f64["0", "weight"]
        seen.append(
            [
                type(f64).__name__,
                f64 is params,
                type(w).__name__,
                w.dtype,
                w.is_leaf,
                w.requires_grad,
                w.data_ptr() == model[0].weight.data_ptr(),
                model[0].weight.dtype,
                params["0", "weight"].dtype,
                sorted(name for name, _ in f64.named_parameters()),
                type(i32).__name__,
                i32["0", "weight"].dtype,
                len(list(i32.parameters())),
                type(on_cpu).__name__,
                on_cpu["0", "weight"] is params["0", "weight"],
            ]
        )
    assert seen[0] == seen[1]
    assert seen[0][:3] == ["TensorDictParams", False, "Parameter"]
    assert seen[0][7] == torch.float32


@pytest.mark.parametrize("cast", ["type", "float", "double", "half", "bfloat16"])
def test_casts_return_tensordicts(cast: str) -> None:
    """``type``/``float``/``double``/``half``/``bfloat16`` are TensorDict's casts: a new
    TensorDict, the model untouched (the module's converted the model in place)."""
    seen = []
    for P, N in PKGS:
        model, params = model_and_params(P, N)
        out = params.type(torch.float64) if cast == "type" else getattr(params, cast)()
        seen.append(
            [
                type(out).__name__,
                out["0", "weight"].dtype,
                out["1", "num_batches_tracked"].dtype,
                model[0].weight.dtype,
                model[1].num_batches_tracked.dtype,
                params["0", "weight"].dtype,
            ]
        )
    assert seen[0] == seen[1]
    assert seen[0][0] == "TensorDict" and seen[0][3] == torch.float32


def test_requires_grad_and_zero_grad_return_params() -> None:
    """``zero_grad`` and ``requires_grad_`` return the TensorDictParams (``zero_grad`` gave
    None); an integer buffer refuses ``requires_grad_()``, as in tensordict."""
    seen = []
    for P, N in PKGS:
        model, params = model_and_params(P, N)
        model(torch.ones(4, 3)).sum().backward()
        cleared = params.zero_grad()
        frozen = params.requires_grad_(False)
        row = [cleared is params, model[0].weight.grad, frozen is params]
        row.append(model[1].weight.requires_grad)
        with pytest.raises(RuntimeError, match="floating point"):
            params.requires_grad_(True)
        seen.append(row)
    assert seen[0] == seen[1] == [True, None, True, False]


def test_state_dict_and_load_state_dict() -> None:
    """``params.load_state_dict(td.state_dict())`` loads the "."-joined keys into the model's
    weights (it raised: unexpected keys), nested and flat."""
    seen = []
    for P, N in PKGS:
        model, params = model_and_params(P, N)
        threes = P.TensorDict.from_module(model).apply(lambda x: torch.full_like(x, 3))
        out = params.load_state_dict(threes.state_dict())
        row = [out is params, model[0].weight.detach().sum().item(), model[1].running_mean.tolist()]
        params.load_state_dict(threes.apply(lambda x: x * 0).state_dict(flatten=False))
        row += [model[0].weight.detach().sum().item(), list(params.state_dict(flatten=False))]
        with pytest.raises(RuntimeError):
            params.load_state_dict({"0.weight": torch.ones(2, 3)})
        params.load_state_dict({"0.weight": torch.ones(2, 3)}, strict=False)
        row.append(model[0].weight.detach().sum().item())
        seen.append(row)
    assert seen[0] == seen[1]
    assert seen[0][:2] == [True, 18.0]


def test_module_holding_params_loads_its_state_dict() -> None:
    """A module holding a TensorDictParams of a nested model loads its own state dict back
    (the nested names, ``params.0.weight``, were unexpected keys), also with ``assign=True``;
    an extra key still raises."""
    seen = []
    for P, N in PKGS:
        _, params = model_and_params(P, N)
        with torch.no_grad():
            params.apply_(lambda x: x.fill_(3))
        holder = nn.Module()
        holder.params = params
        state = holder.state_dict()
        other_model, other = model_and_params(P, N)
        other_holder = nn.Module()
        other_holder.params = other
        other_holder.load_state_dict(state)
        row = [list(state), other_model[0].weight.detach().sum().item()]
        bumped = {key: value + 1 for key, value in state.items()}
        other_holder.load_state_dict(bumped, assign=True)  # copied in, as tensordict's
        row += [other_model[0].weight.detach().sum().item(), type(other["0", "weight"]).__name__]
        extra = dict(state, **{"params.extra": torch.zeros(1)})
        with pytest.raises(RuntimeError, match="extra"):
            other_holder.load_state_dict(extra)
        seen.append(row)
    assert seen[0] == seen[1]
    assert seen[0][1:4] == [18.0, 24.0, "Parameter"]


def test_clone_gives_fresh_leaf_parameters() -> None:
    """``clone()`` is a TensorDictParams of new leaf Parameters (it was a TensorDict of
    non-leaf tensors through which gradients reached the original weights); a tied parameter
    stays tied. ``copy()`` is a TensorDictParams sharing the Parameters."""
    seen = []
    for P, N in PKGS:
        model, params = model_and_params(P, N)
        cloned = params.clone()
        w = cloned["0", "weight"]
        w.sum().backward()
        copied = params.copy()
        tied = N.TensorDictParams(P.TensorDict({"a": nn.Parameter(torch.ones(2))}, []))
        tied["b"] = tied["a"]
        tied_clone = tied.clone()
        seen.append(
            [
                type(cloned).__name__,
                type(w).__name__,
                w.is_leaf,
                w.requires_grad,
                w.data_ptr() == model[0].weight.data_ptr(),
                len(list(cloned.parameters())),
                len(list(cloned.buffers())),
                model[0].weight.grad,
                type(copied).__name__,
                copied["0", "weight"] is params["0", "weight"],
                len(list(copied.parameters())),
                tied_clone["a"] is tied_clone["b"],
                type(params.clone(recurse=False)).__name__,
            ]
        )
    assert seen[0] == seen[1]
    assert seen[0][:4] == ["TensorDictParams", "Parameter", True, True]


def test_in_place_writes_go_through_data() -> None:
    """``zero_``, ``fill_``, ``set_``, ``update_``, ``copy_`` and ``apply_`` write into the
    model's weights and return the TensorDictParams (a leaf that requires grad refused them)."""
    seen = []
    for P, N in PKGS:
        model, params = model_and_params(P, N)
        row: list[Any] = [params.zero_() is params, model[0].weight.detach().abs().sum().item()]
        row += [params.fill_(("0", "bias"), 3.0) is params, model[0].bias.detach().tolist()]
        row += [
            params.set_(("0", "bias"), torch.full((2,), 4.0)) is params,
            model[0].bias.detach().tolist(),
        ]
        params.update_({"0": {"bias": torch.full((2,), 5.0)}})
        row.append(model[0].bias.detach().tolist())
        params.copy_(params.data.apply(lambda x: x + 1))
        row.append(model[0].bias.detach().tolist())
        row += [params.apply_(lambda x: x * 2) is params, model[0].bias.detach().tolist()]
        row.append(model[0].weight.requires_grad and model[0].weight.is_leaf)
        seen.append(row)
    assert seen[0] == seen[1]


def test_torch_functions_take_params() -> None:
    """``torch.stack([params, params])``, ``torch.zeros_like(params)``: the TensorDict
    functions over the wrapped TensorDicts (``stack`` raised AttributeError)."""
    seen = []
    for P, N in PKGS:
        _, params = model_and_params(P, N)
        stacked = torch.stack([params, params])
        zeros = torch.zeros_like(params)
        seen.append(
            [
                type(stacked).__name__,
                stacked.batch_size,
                stacked["0", "weight"].shape,
                type(zeros).__name__,
                zeros["0", "weight"].detach().abs().sum().item(),
            ]
        )
    assert seen[0] == seen[1]
