"""The rest of the TensorDict methods (issue 23), side by side with tensordict 0.15.3.

Each case is one call, written once and run on the same data in both packages; the results are
compared structurally (``compare``): TensorDicts by class-independent content (keys, batch size,
device, lock state, leaf dtypes, shapes and values), tensors by dtype and value, containers item
by item, and exceptions by type. A case that returns the TensorDict it was called on (the ``_``
forms) is checked for ``is self`` on both sides as well.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import tempfile
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest
import tensordict as ref
import tensordict_rs as rs
import torch

PKGS = {"rs": rs, "ref": ref}


# ---------------------------------------------------------------------------- data


def floats(pkg: Any, locked: bool = False) -> Any:
    """A float tree with values in (0.1, 0.9) (valid for acos, log, erf...), batch [3, 4]."""
    g = torch.Generator().manual_seed(0)
    td = pkg.TensorDict(
        {
            "a": torch.rand(3, 4, 2, generator=g) * 0.8 + 0.1,
            "b": torch.rand(3, 4, generator=g) * 0.8 + 0.1,
            "n": {"c": torch.rand(3, 4, 5, generator=g) * 0.8 + 0.1},
        },
        batch_size=[3, 4],
    )
    return td.lock_() if locked else td


def mixed(pkg: Any) -> Any:
    """Floats, ints and bools with a nested tree, batch [3, 4]."""
    return pkg.TensorDict(
        {
            "f": torch.arange(24, dtype=torch.float32).view(3, 4, 2),
            "i": torch.arange(12).view(3, 4),
            "m": torch.arange(12).view(3, 4) % 3 == 0,
            "n": {"d": torch.arange(36, dtype=torch.float64).view(3, 4, 3)},
        },
        batch_size=[3, 4],
    )


def ints(pkg: Any) -> Any:
    """Integer and bool leaves only (for bitwise and logical operations)."""
    return pkg.TensorDict(
        {"i": torch.arange(12).view(3, 4), "n": {"j": torch.arange(12).view(3, 4) % 5}},
        batch_size=[3, 4],
    )


def _texts(pkg: Any) -> Any:
    """A stack of strings and a non-tensor value beside a tensor, batch [3]."""
    return pkg.TensorDict(
        {
            "x": torch.arange(3).unsqueeze(-1),
            "s": pkg.NonTensorStack("a", "b", "c"),
            "n": {"d": pkg.NonTensorData("m", batch_size=[3])},
        },
        batch_size=[3],
    )


def with_nan(pkg: Any) -> Any:
    x = torch.arange(24, dtype=torch.float32).view(3, 4, 2)
    x[0, 1, 0] = float("nan")
    x[2, 3, 1] = float("inf")
    x[1, 0, 1] = -float("inf")
    return pkg.TensorDict({"x": x, "n": {"y": x[..., 0].clone()}}, batch_size=[3, 4])


# ---------------------------------------------------------------------------- comparison


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(torch.Tensor) if isinstance(t, torch.Tensor) else t


def compare(ours: Any, theirs: Any, where: str = "result") -> None:
    """Structural equality of two results, one from each package."""
    if isinstance(theirs, BaseException):
        assert isinstance(ours, BaseException), (
            f"{where}: reference raised {theirs!r}, ours gave {ours!r}"
        )
        assert type(ours).__name__ == type(theirs).__name__ or isinstance(ours, type(theirs)), (
            f"{where}: reference raised {theirs!r}, ours {ours!r}"
        )
        return
    assert not isinstance(ours, BaseException), (
        f"{where}: ours raised {ours!r}, reference gave a result"
    )
    if isinstance(theirs, ref.TensorDictBase):
        assert isinstance(ours, rs.TensorDict), f"{where}: {type(ours)} is not a TensorDict"
        assert ours.batch_size == theirs.batch_size, f"{where}: batch size"
        assert ours.device == theirs.device, f"{where}: device"
        assert ours.is_locked == theirs.is_locked, f"{where}: lock state"
        mine = dict(ours.items(include_nested=True, leaves_only=False))
        other = dict(theirs.items(include_nested=True, leaves_only=False))
        assert set(mine) == set(other), (
            f"{where}: keys {sorted(map(str, mine))} != {sorted(map(str, other))}"
        )
        for key, value in other.items():
            if isinstance(value, ref.TensorDictBase) and not hasattr(value, "data"):
                continue
            if isinstance(value, ref.TensorDictBase):
                assert mine[key].batch_size == value.batch_size, f"{where}[{key}]: batch size"
                continue
            compare(mine[key], value, f"{where}[{key!r}]")
        return
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{where}: {type(ours)} is not a tensor"
        assert ours.dtype == theirs.dtype, f"{where}: dtype {ours.dtype} != {theirs.dtype}"
        assert ours.shape == theirs.shape, f"{where}: shape {ours.shape} != {theirs.shape}"
        assert ours.requires_grad == theirs.requires_grad, f"{where}: requires_grad"
        if theirs.device.type != "meta":
            torch.testing.assert_close(
                _plain(ours).detach(),
                _plain(theirs).detach(),
                equal_nan=True,
                msg=where,
                rtol=1e-5,
                atol=1e-6,
            )
        return
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray) and ours.dtype == theirs.dtype, where
        np.testing.assert_array_equal(ours, theirs)
        return
    if isinstance(theirs, tuple) and hasattr(theirs, "_fields"):  # named tuples, return_types
        assert tuple(getattr(ours, "_fields", ())) == tuple(theirs._fields) or len(ours) == len(
            theirs
        ), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            compare(a, b, f"{where}.{theirs._fields[i] if i < len(theirs._fields) else i}")
        return
    if (
        isinstance(theirs, (torch.return_types.max, torch.return_types.min))
        or type(theirs).__module__ == "torch.return_types"
    ):
        assert type(ours) is type(theirs), f"{where}: {type(ours)} != {type(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            compare(a, b, f"{where}[{i}]")
        return
    if isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs), f"{where}: {type(ours)} != {type(theirs)}"
        assert len(ours) == len(theirs), f"{where}: length {len(ours)} != {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            compare(a, b, f"{where}[{i}]")
        return
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), f"{where}: {type(ours)} is not a dict"
        assert list(ours) == list(theirs), f"{where}: keys {list(ours)} != {list(theirs)}"
        for key in theirs:
            compare(ours[key], theirs[key], f"{where}[{key!r}]")
        return
    if isinstance(theirs, float) and math.isnan(theirs):
        assert isinstance(ours, float) and math.isnan(ours), where
        return
    if type(theirs).__module__.startswith("tensordict"):  # NonTensorData, ... by content
        compare(getattr(ours, "data", ours), getattr(theirs, "data", theirs), where)
        return
    assert type(ours) is type(theirs), f"{where}: {type(ours)} != {type(theirs)}"
    assert ours == theirs, f"{where}: {ours!r} != {theirs!r}"


def run(case: Callable[[Any], Any], pkg: Any) -> Any:
    try:
        return case(pkg)
    except Exception as err:  # compared by type with the other package's
        return err


def side_by_side(case: Callable[[Any], Any]) -> None:
    compare(run(case, rs), run(case, ref))


# ---------------------------------------------------------------------------- element-wise

UNARY = [
    "acos", "asin", "atan", "cos", "cosh", "erf", "erfc", "expm1", "frac", "lgamma", "log10",
    "log1p", "log2", "reciprocal", "sin", "sinh", "tan", "tanh", "trunc",
    # present already; their in-place forms are new
    "abs", "exp", "log", "sqrt", "sign", "sigmoid", "floor", "ceil", "round", "neg",
]  # fmt: skip
PREDICATES = ["isfinite", "isnan", "isneginf", "isposinf", "isreal"]


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("locked", [False, True])
def test_unary(name: str, locked: bool) -> None:
    side_by_side(lambda P: getattr(floats(P, locked), name)())


@pytest.mark.parametrize("name", UNARY)
def test_unary_inplace(name: str) -> None:
    def case(P: Any) -> Any:
        td = floats(P)
        out = getattr(td, name + "_")()
        assert out is td
        return td

    side_by_side(case)


def test_unary_inplace_writes_memmap(tmp_path: Any) -> None:
    """An in-place op on a memory-mapped TensorDict reaches the files (both packages)."""
    for P in PKGS.values():
        td = floats(P).memmap_(tmp_path / P.__name__)
        expected = td["a"].clone().sin()
        td.sin_()
        again = P.TensorDict.load_memmap(tmp_path / P.__name__)
        torch.testing.assert_close(
            again["a"].as_subclass(torch.Tensor), expected.as_subclass(torch.Tensor)
        )


@pytest.mark.parametrize("name", PREDICATES)
def test_predicates(name: str) -> None:
    side_by_side(lambda P: getattr(with_nan(P), name)())


def test_round_inplace() -> None:
    side_by_side(lambda P: (lambda td: (td.round_(), td)[1])(floats(P) * 10))


BINARY_CASES: dict[str, Callable[[Any], Any]] = {
    "addcdiv": lambda P: floats(P).addcdiv(floats(P) * 2, floats(P) + 1, value=0.5),
    "addcdiv_default": lambda P: floats(P).addcdiv(floats(P), floats(P) + 1),
    "addcmul": lambda P: floats(P).addcmul(floats(P), floats(P) + 1, value=2.0),
    "addcmul_tensor": lambda P: floats(P).addcmul(torch.full((3, 4), 2.0), floats(P)),
    "mod": lambda P: mixed(P).mod(3),
    "mod_td": lambda P: mixed(P).mod(mixed(P) + 5),
    "rsub": lambda P: floats(P).rsub(1.0),
    "rsub_alpha": lambda P: floats(P).rsub(floats(P), alpha=2),
    "bitwise_and": lambda P: ints(P).bitwise_and(ints(P) + 1),
    "bitwise_and_scalar": lambda P: ints(P).bitwise_and(6),
    "logical_and": lambda P: ints(P).logical_and(ints(P) % 2),
    "maximum_": lambda P: (lambda td: (td.maximum_(floats(P) * 0 + 0.5), td)[1])(floats(P)),
    "minimum_": lambda P: (lambda td: (td.minimum_(floats(P) * 0 + 0.5), td)[1])(floats(P)),
    "clamp_min_": lambda P: (lambda td: (td.clamp_min_(0.5), td)[1])(floats(P)),
    "clamp_max_": lambda P: (lambda td: (td.clamp_max_(0.5), td)[1])(floats(P)),
    "clamp_min_td": lambda P: (lambda td: (td.clamp_min_(floats(P) * 0 + 0.4), td)[1])(floats(P)),
    "lerp_": lambda P: (lambda td: (td.lerp_(floats(P) + 1, 0.25), td)[1])(floats(P)),
    "lerp_td_weight": lambda P: (lambda td: (td.lerp_(floats(P) + 1, floats(P)), td)[1])(floats(P)),
    "addcmul_": lambda P: (lambda td: (td.addcmul_(floats(P), floats(P), value=3), td)[1])(
        floats(P)
    ),
    "addcdiv_": lambda P: (lambda td: (td.addcdiv_(floats(P), floats(P) + 1, value=3), td)[1])(
        floats(P)
    ),
    "locked_addcmul": lambda P: floats(P, locked=True).addcmul(floats(P), floats(P)),
    "mismatched_keys": lambda P: floats(P).addcmul(floats(P).exclude("b"), floats(P)),
    # tensordict's default= of the arithmetic methods: None requires the same keys both ways
    "add_other_lacks_key": lambda P: floats(P).add(floats(P).exclude("b")),
    "add_other_has_extra_key": lambda P: floats(P).exclude("b").add(floats(P)),
    "operator_extra_key": lambda P: floats(P).exclude(("n", "c")) * floats(P),
    "inplace_ignores_extra_key": lambda P: floats(P).exclude("b").add_(floats(P)),
    "default_str_unknown": lambda P: floats(P).add(floats(P), default="union"),
    "clamp_min_positional_default": lambda P: (
        floats(P).exclude("a").clamp_min(floats(P).exclude("b") * 0 + 0.5, torch.tensor(0.3))
    ),
    "add_default_non_tensor": lambda P: P.TensorDict(a=1, b=1, s="x").add(
        P.TensorDict(b=2, c=2, s="x"), default=torch.zeros(())
    ),
}
# every method with tensordict's default=: a value for the leaf one side lacks, or the
# intersection of the keys (a locked source keeps the result locked where tensordict's does)
for _name in (
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "clamp_min", "clamp_max", "rsub",
):  # fmt: skip
    for _default in ("tensor", "intersection"):
        # a locked source with a tensor default: tensordict raises (its result, locked, is
        # then updated with the other side's keys); here the locked result: test below
        for _locked in (False, True) if _default == "intersection" else (False,):
            BINARY_CASES[f"{_name}_default_{_default}{'_locked' if _locked else ''}"] = (
                lambda P, n=_name, d=_default, lk=_locked: getattr(
                    floats(P).exclude("b").lock_() if lk else floats(P).exclude("b"), n
                )(floats(P).exclude("a") + 1, default=torch.tensor(0.5) if d == "tensor" else d)
            )
for _name in ("bitwise_and", "logical_and"):
    BINARY_CASES[f"{_name}_default"] = lambda P, n=_name: getattr(ints(P).exclude("i"), n)(
        ints(P), default=torch.tensor(3)
    )
# a tensor or a tree of another batch size broadcasts with the batch size as torch's shapes do
for _shape in ((4,), (1, 4), (2, 3, 4), (3, 1)):
    BINARY_CASES[f"mul_tensor_{_shape}"] = lambda P, s=_shape: floats(P) * torch.full(s, 2.0)
    BINARY_CASES[f"add_tree_{_shape}"] = lambda P, s=_shape: floats(P) + floats(P).new_ones(s)
    BINARY_CASES[f"clamp_max_tensor_{_shape}"] = lambda P, s=_shape: floats(P).clamp_max(
        torch.full(s, 0.5)
    )
    BINARY_CASES[f"lerp_tensor_{_shape}"] = lambda P, s=_shape: floats(P).lerp(
        torch.zeros(s), torch.full(s, 0.25)
    )
    BINARY_CASES[f"add_inplace_tensor_{_shape}"] = lambda P, s=_shape: floats(P).add_(
        torch.full(s, 1.0)
    )
BINARY_CASES["mul_tensor_not_broadcastable"] = lambda P: floats(P) * torch.ones(3)


@pytest.mark.parametrize("name", list(BINARY_CASES))
def test_binary(name: str) -> None:
    side_by_side(BINARY_CASES[name])


@pytest.mark.parametrize("name", ["add", "mul", "clamp_min", "rsub"])
def test_default_value_on_locked_tree(name: str) -> None:
    """tensordict raises "Cannot modify locked TensorDict" for a locked source with a tensor
    as default (a listed difference); here the result is the unlocked source's, locked."""
    other = floats(rs).exclude("a") + 1
    unlocked = getattr(floats(rs).exclude("b"), name)(other, default=torch.tensor(0.5))
    locked = getattr(floats(rs).exclude("b").lock_(), name)(other, default=torch.tensor(0.5))
    assert locked.is_locked and not unlocked.is_locked
    assert set(locked.keys(True, True)) == {"a", "b", ("n", "c")}
    assert (locked == unlocked).all()
    expected = getattr(torch, name)(torch.tensor(0.5), other["b"])
    assert torch.equal(locked["b"], expected)


CASTS = [
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
    "complex64", "complex128", "uint16", "uint32", "uint64",
]  # fmt: skip


@pytest.mark.parametrize("name", CASTS)
def test_casts(name: str) -> None:
    side_by_side(lambda P: getattr(mixed(P), name)())


def test_cast_filter_and_type() -> None:
    side_by_side(lambda P: mixed(P).float16(cast_filter=lambda k, t: t.is_floating_point()))
    side_by_side(lambda P: mixed(P).type(torch.int32))
    side_by_side(
        lambda P: mixed(P).type(torch.float64, cast_filter=lambda k, t: t.dtype == torch.int64)
    )


# ---------------------------------------------------------------------------- reductions

REDUCTIONS = ["sum", "mean", "nansum", "nanmean", "prod", "std", "var"]
REDUCTION_ARGS: dict[str, Callable[[Any], Any]] = {
    "all": lambda td: {},
    "dim0": lambda td: {"dim": 0},
    "dim-1": lambda td: {"dim": -1},
    "dims": lambda td: {"dim": (0, 1)},
    "keepdim": lambda td: {"dim": 1, "keepdim": True},
    "reduce": lambda td: {"reduce": True},
    "reduce_dim": lambda td: {"dim": 0, "reduce": True},
    "feature": lambda td: {"dim": "feature"},
    "bad_dim": lambda td: {"dim": 5},
}


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("args", list(REDUCTION_ARGS))
def test_reductions(name: str, args: str) -> None:
    def case(P: Any) -> Any:
        td = floats(P) if not name.startswith("nan") else with_nan(P)
        return getattr(td, name)(**REDUCTION_ARGS[args](td))

    side_by_side(case)


def test_reduction_options() -> None:
    side_by_side(lambda P: floats(P).sum(dtype=torch.float64))
    side_by_side(lambda P: floats(P).mean(dim=0, dtype=torch.float64))
    side_by_side(lambda P: floats(P).std(correction=0))
    side_by_side(lambda P: floats(P).var(dim=1, correction=2))
    side_by_side(lambda P: floats(P).sum(key_transform=lambda k: k + "_sum"))
    side_by_side(lambda P: floats(P).mean(dim=0, key_transform=lambda k: "m_" + k))
    side_by_side(lambda P: mixed(P).sum())  # int and bool leaves
    side_by_side(lambda P: mixed(P).mean())  # mean of ints raises in torch


@pytest.mark.parametrize("name", ["max", "min", "amax", "amin"])
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"dim": 0}, {"dim": 1, "keepdim": True}, {"reduce": True}, {"dim": -1},
     {"dim": 0, "return_indices": False}],
    ids=["all", "dim0", "keepdim", "reduce", "dim-1", "no_indices"],
)  # fmt: skip
def test_extrema(name: str, kwargs: dict[str, Any]) -> None:
    if name.startswith("a") and "return_indices" in kwargs:
        kwargs = {"dim": 0}
    side_by_side(lambda P: getattr(floats(P), name)(**kwargs))


@pytest.mark.parametrize("name", ["cummax", "cummin"])
@pytest.mark.parametrize(
    "kwargs",
    [{"dim": 0}, {"dim": 1}, {"dim": 0, "return_indices": False}, {"dim": 1, "reduce": True}],
)
def test_cumulative(name: str, kwargs: dict[str, Any]) -> None:
    side_by_side(lambda P: getattr(floats(P), name)(**kwargs))


REDUCTION_MISC: dict[str, Callable[[Any], Any]] = {
    # all/any along a batch dim (test_tensorclass.py::test_all_any: dim= was refused)
    "all_dim": lambda P: [(mixed(P) > 3).all(dim=d) for d in (0, 1, -1, -2)],
    "any_dim": lambda P: [(mixed(P) > 3).any(dim=d) for d in (0, 1, -1, -2)],
    "all_dim_out_of_range": lambda P: mixed(P).all(dim=2),
    "any_dim_nested_extra_dims": lambda P: P.TensorDict(
        a=torch.tensor([[True, False], [True, True]]),
        n=P.TensorDict(b=torch.arange(12).view(2, 2, 3) % 2 == 0, batch_size=[2, 2, 3]),
        batch_size=[2, 2],
    ).any(dim=1),
    "norm": lambda P: floats(P).norm(),
    "norm_dtype": lambda P: floats(P).norm(dtype=torch.float64),
    "norm_keys": lambda P: floats(P).norm(key_transform=lambda k: f"{k}_norm"),
    "logsumexp": lambda P: floats(P).logsumexp(),
    "logsumexp_dim": lambda P: floats(P).logsumexp(0),
    "logsumexp_keepdim": lambda P: floats(P).logsumexp(1, keepdim=True),
    "softmax0": lambda P: floats(P).softmax(0),
    "softmax-1": lambda P: floats(P).softmax(-1),
    "softmax_dtype": lambda P: floats(P).softmax(1, dtype=torch.float64),
    "quantile": lambda P: floats(P).quantile(0.5),
    "quantile_dim": lambda P: floats(P).quantile(0.25, dim=0),
    "quantile_interp": lambda P: floats(P).quantile(0.3, dim=1, interpolation="nearest"),
    "quantile_reduce": lambda P: floats(P).quantile(0.5, reduce=True),
}


@pytest.mark.parametrize("name", list(REDUCTION_MISC))
def test_reduction_misc(name: str) -> None:
    side_by_side(REDUCTION_MISC[name])


# ---------------------------------------------------------------------------- shape

SHAPE_CASES: dict[str, Callable[[Any], Any]] = {
    "atleast_1d_0d": lambda P: P.TensorDict({"a": torch.tensor(1.0)}, []).atleast_1d(),
    "atleast_1d": lambda P: mixed(P).atleast_1d(),
    "atleast_2d": lambda P: mixed(P)[0].atleast_2d(),
    "atleast_3d": lambda P: mixed(P).atleast_3d(),
    "broadcast_to": lambda P: mixed(P)[0:1].broadcast_to((2, 3, 4)),
    "broadcast_to_bad": lambda P: mixed(P).broadcast_to((2, 4)),
    "flip": lambda P: mixed(P).flip(0),
    "flip_dims": lambda P: mixed(P).flip((0, 1)),
    "fliplr": lambda P: mixed(P).fliplr(),
    "flipud": lambda P: mixed(P).flipud(),
    "roll": lambda P: mixed(P).roll(1, 0),
    "roll_multi": lambda P: mixed(P).roll((1, -1), (0, 1)),
    "roll_flat": lambda P: mixed(P).roll(2),
    "rot90": lambda P: mixed(P).rot90(),
    "rot90_k": lambda P: mixed(P).rot90(2, (1, 0)),
    "narrow": lambda P: mixed(P).narrow(1, 1, 2),
    "narrow_neg": lambda P: mixed(P).narrow(-1, 0, 3),
    "movedim": lambda P: mixed(P).movedim(0, 1),
    "moveaxis": lambda P: mixed(P).moveaxis(1, 0),
    "repeat": lambda P: mixed(P).repeat(2, 1),
    "repeat_new_dims": lambda P: mixed(P).repeat(2, 2, 1),
    "repeat_interleave": lambda P: mixed(P).repeat_interleave(2, dim=0),
    "repeat_interleave_tensor": lambda P: mixed(P).repeat_interleave(
        torch.tensor([1, 0, 2]), dim=0
    ),
    "tile": lambda P: mixed(P).tile((2, 1)),
    "tile_short": lambda P: mixed(P).tile((2,)),
    "tensor_split": lambda P: mixed(P).tensor_split(2, dim=1),
    "tensor_split_idx": lambda P: mixed(P).tensor_split([1, 2], dim=0),
    "gather": lambda P: mixed(P).gather(1, torch.tensor([[0, 1], [2, 3], [3, 3]])),
    "torch_gather": lambda P: torch.gather(mixed(P), 0, torch.tensor([[0, 1, 2, 0]])),
    "masked_select": lambda P: mixed(P).masked_select(torch.arange(12).view(3, 4) % 2 == 0),
    "masked_select_rows": lambda P: mixed(P).masked_select(torch.tensor([True, False, True])),
    "size": lambda P: mixed(P).size(),
    "size_dim": lambda P: mixed(P).size(1),
    "size_neg": lambda P: mixed(P).size(-1),
    "ndimension": lambda P: mixed(P).ndimension(),
    "pad": lambda P: mixed(P).pad([1, 0, 0, 2]),
    "pad_value": lambda P: mixed(P).pad([0, 1], value=-1.0),
    "pad_odd": lambda P: mixed(P).pad([1]),
    "pad_too_long": lambda P: mixed(P).pad([0, 0, 0, 0, 1, 1]),
    # non-tensor entries are padded with None (test_generic.py::test_pad_nontensor*: the
    # stack kept its 3 rows in a batch of 5)
    "pad_non_tensor": lambda P: [
        (p.batch_size, p.get("s").tolist(), p.get(("n", "d")).tolist(), p["x"])
        for p in (_texts(P).pad([0, 2]), _texts(P).pad([1, 1]), _texts(P).pad([-1, 1]))
    ],
    "pad_non_tensor_negative": lambda P: _texts(P).pad([-4, 0]),
    "pad_non_tensor_inplace": lambda P: (
        lambda td, s: (td.pad([0, 2], inplace=True) is td, td.get("s") is s, s.tolist(), td)
    )(*(lambda td: (td, td.get("s")))(_texts(P))),
    "pad_non_tensor_2d": lambda P: (
        P.TensorDict(
            {
                "s": P.NonTensorStack.from_list([[f"{i}{j}" for j in range(2)] for i in range(3)]),
                "x": torch.ones(3, 2),
            },
            batch_size=[3, 2],
        )
        .pad([0, 1, 1, 0])
        .get("s")
        .tolist()
    ),
    "pad_inplace": lambda P: (lambda td: (td.pad([0, 1], inplace=True) is td, td))(mixed(P)),
    "pad_inplace_locked": lambda P: mixed(P).lock_().pad([0, 1], inplace=True),
    "stack_classmethod": lambda P: P.TensorDict.stack([mixed(P), mixed(P)], 1),
    "stack_classmethod_keys_differ": lambda P: P.TensorDict.stack([mixed(P), floats(P)]),
    "cat_classmethod": lambda P: P.TensorDict.cat([mixed(P), mixed(P)], 1),
    "maybe_dense_stack": lambda P: P.TensorDict.maybe_dense_stack([mixed(P), mixed(P)]),
    "is_non_tensor": lambda P: (
        lambda td: (td.is_non_tensor("s"), td.is_non_tensor("f"), td.is_non_tensor(("n", "d")))
    )(mixed(P).set_non_tensor("s", "text")),
    "is_non_tensor_missing": lambda P: mixed(P).is_non_tensor("nope"),
    "densify": lambda P: (lambda td: td.densify() is td)(mixed(P)),
    # expand_as a TensorDict: each leaf as the other's leaf of its key (found by the
    # reference's test_generic.py::test_expand_as: the leaves' own dims were left unexpanded)
    "expand_as_tree": lambda P: P.TensorDict(
        {"a": torch.ones(3, 1, 4), "b": {"c": torch.arange(3.0).view(3, 1, 1, 1)}}, [3]
    ).expand_as(
        P.TensorDict({"a": torch.zeros(2, 3, 5, 4), "b": {"c": torch.zeros(2, 3, 2, 6, 4)}}, [2, 3])
    ),
    "expand_as_tensor": lambda P: mixed(P).expand_as(torch.zeros(2, 3, 4)),
    # pad_sequence pads each key to its own longest (test_pad_sequence_pad_dim1)
    "pad_sequence_per_key": lambda P: P.pad_sequence(
        [
            P.TensorDict({"a": torch.ones(6, 3, 8), ("b", "c"): torch.ones(6, 3)}, [6]),
            P.TensorDict({"a": torch.full((6, 5, 8), 2), ("b", "c"): torch.full((6, 7), 2)}, [6]),
        ],
        pad_dim=1,
        return_mask=True,
    ),
    "pad_sequence_per_key_left": lambda P: P.pad_sequence(
        [P.TensorDict({"a": torch.ones(n, 2), "b": torch.ones(n + 1)}, []) for n in (1, 3)],
        return_mask=True,
        padding_side="left",
    ),
}


@pytest.mark.parametrize("name", list(SHAPE_CASES))
def test_shape(name: str) -> None:
    side_by_side(SHAPE_CASES[name])


def test_gather_out_and_inplace() -> None:
    def case(P: Any) -> Any:
        td = mixed(P)
        index = torch.tensor([[0, 1], [2, 3], [3, 3]])
        out = td.gather(1, index).zero_()
        res = td.gather(1, index, out=out)
        assert res is out
        return res

    side_by_side(case)


# ---------------------------------------------------------------------------- factories

FACTORY_CASES: dict[str, Callable[[Any], Any]] = {
    "new_zeros": lambda P: mixed(P).new_zeros(2, 5),
    "new_zeros_tuple": lambda P: mixed(P).new_zeros((2,)),
    "new_ones": lambda P: mixed(P).new_ones(5),
    "new_ones_dtype": lambda P: mixed(P).new_ones(2, dtype=torch.float16),
    "new_full": lambda P: mixed(P).new_full((2, 3), 7),
    "new_empty_shape": lambda P: mixed(P).new_empty(2, 3).apply(lambda t: torch.zeros_like(t)),
    "new_tensor": lambda P: mixed(P).new_tensor([0, 1, 2, 3, 4]),  # a tensor: torch warns
    "new_tensor_td": lambda P: mixed(P).new_tensor(mixed(P) * 2),
    "new_zeros_requires_grad": lambda P: floats(P).new_zeros(2, requires_grad=True),
    # the package's module-level forms of the TensorDict constructors
    "module_from_any_list": lambda P: P.from_any([[1.0, 2.0], [3.0, 4.0]]),
    "module_from_any_ragged": lambda P: P.from_any([[1, 2], [3]]).tolist(),
    "module_from_any_dict": lambda P: P.from_any({"a": torch.zeros(3), "b": (torch.ones(3),)}),
    "module_from_dict": lambda P: P.from_dict({"a": torch.zeros(3, 2)}, auto_batch_size=True),
    "module_from_tuple": lambda P: P.from_tuple((torch.zeros(3), torch.ones(3))),
    "module_fromkeys": lambda P: P.fromkeys(["a", ("b", "c")], 0),
    "module_from_module": lambda P: P.from_module(torch.nn.Linear(2, 3, bias=False)).data.zero_(),
    "module_maybe_dense_stack": lambda P: P.maybe_dense_stack([mixed(P), mixed(P)]),
    "module_unravel_key_to_tuple": lambda P: [
        P.unravel_key_to_tuple(("a", ("b", ("c",)))),
        P.unravel_key_to_tuple(("a", 1)),
        P.unravel_key_to_tuple(1),
    ],
    "module_dtype_predicates": lambda P: [
        f(t)
        for f in (P.is_bool, P.is_floating, P.is_integer, P.is_inexact)
        for t in (
            torch.zeros(1),
            torch.zeros(1, dtype=torch.bool),
            torch.zeros(1, dtype=torch.int8),
        )
    ],
    "module_assert_close": lambda P: P.assert_close(floats(P), floats(P).clone()),
    "module_assert_close_fails": lambda P: P.assert_allclose_td(floats(P), floats(P) + 1),
    "module_assert_close_keys": lambda P: P.assert_close(floats(P), floats(P).exclude("a")),
    "module_assert_close_intersection": lambda P: P.assert_close(
        floats(P), floats(P).exclude("a"), intersection=True
    ),
    "make_tensordict": lambda P: P.make_tensordict(
        {"a": torch.zeros(3), "b": {"c": torch.zeros(3, 4)}}, a=torch.ones(2), d=torch.ones(3)
    ),
    "make_tensordict_auto": lambda P: P.make_tensordict(
        {"a": torch.zeros(3), "b": {"c": torch.zeros(3, 4)}}, auto_batch_size=True
    ),
    "make_tensordict_batch": lambda P: P.make_tensordict(a=torch.zeros(3, 2), batch_size=[3]),
    "from_schema": lambda P: P.TensorDict.from_schema(
        {"a": ([3], torch.float32), ("n", "b"): ([2, 2], torch.int64)}, batch_size=[4]
    ),
    "copy": lambda P: mixed(P).copy(),
}


@pytest.mark.parametrize("name", list(FACTORY_CASES))
def test_factories(name: str) -> None:
    side_by_side(FACTORY_CASES[name])


def test_copy_is_shallow() -> None:
    for P in PKGS.values():
        td = mixed(P)
        c = td.copy()
        assert c is not td and c["n"] is not td["n"] and c["i"] is td["i"]
        c["new"] = torch.zeros(3, 4)
        assert "new" not in td.keys()


# ---------------------------------------------------------------------------- entries


def _seq(*steps: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Runs the steps on the same fresh ``mixed`` tree; returns every step's result and the tree."""

    def case(P: Any) -> Any:
        td = mixed(P)
        return [step(td) for step in steps], td

    return case


def _emptied_depth(P: Any) -> Any:
    td = P.TensorDict({"a": {"b": {"c": {"d": 0}, "e": 0}, "f": 0}, "g": 0})
    depths = [td.depth]
    del td["a", "b", "c", "d"]  # an empty tree left at a.b.c: no level
    depths.append(td.depth)
    del td["a", "b", "e"]
    return [*depths, td.depth, P.TensorDict({"a": {"s": "x"}}).depth]


def _set_empty(P: Any) -> Any:
    td = P.TensorDict()
    td["l"] = []  # (an empty tuple is a float64 tensor in both, with a FutureWarning there)
    return td


def _pad_inplace_keeps_nested(P: Any) -> Any:
    td = P.TensorDict(
        {"a": torch.ones(3, 4), "n": {"c": torch.ones(3, 4, 2), "d": {"e": torch.ones(3, 4)}}},
        [3, 4],
    )
    nested, deeper = td["n"], td["n", "d"]
    td.pad([0, 1, 0, 2], inplace=True)
    return [td["n"] is nested, td["n", "d"] is deeper, nested.batch_size, deeper["e"].shape]


def _copy_at_non_tensor(P: Any, fast: bool) -> Any:
    td = P.TensorDict({"val": P.NonTensorData(data=0, batch_size=[10])}, [10])
    rows = P.TensorDict({"val": P.NonTensorData(data=1, batch_size=[5])}, [5])
    td.copy_at_(rows, slice(1, None, 2), fast=fast)
    return td.get("val").tolist()


def _copy_at_mixed(P: Any) -> Any:
    td = P.TensorDict({"val": P.NonTensorData(data=0, batch_size=[4]), "x": torch.zeros(4)}, [4])
    rows = P.TensorDict({"val": P.NonTensorData(data=1, batch_size=[2]), "x": torch.ones(2)}, [2])
    with pytest.warns(FutureWarning, match="skipped its non-tensor entries"):
        td.copy_at_(rows, slice(0, 2))
    return [td.get("val").tolist(), td["x"]]


ENTRY_CASES: dict[str, Callable[[Any], Any]] = {
    # copy_at_ with non-tensor entries: fast=False writes them (it wrote nothing), fast=True
    # refuses a source of non-tensors only and warns for a mixed one
    "copy_at_non_tensor_slow": lambda P: _copy_at_non_tensor(P, False),
    "copy_at_non_tensor_fast": lambda P: _copy_at_non_tensor(P, True),
    "copy_at_mixed_fast": _copy_at_mixed,
    "copy_at_fast_none": lambda P: P.TensorDict({"a": torch.zeros(2)}, [2]).copy_at_(
        P.TensorDict({"a": torch.ones(1)}, [1]), slice(0, 1), fast=None
    ),
    "depth_counts_levels_to_leaves": _emptied_depth,
    "set_empty_list": _set_empty,
    "pad_inplace_keeps_nested_trees": _pad_inplace_keeps_nested,
    "unflatten_keys_joined_key_under_a_leaf": lambda P: P.TensorDict(
        {"a.b.c.d": torch.zeros(3), "a": {"b": {"c": torch.zeros(3)}}}
    ).unflatten_keys("."),
    "clear": _seq(lambda td: td.clear() is td),
    "clear_locked": _seq(lambda td: td.lock_().clear()),
    "popitem": _seq(lambda td: td.popitem(), lambda td: td.popitem()),
    "popitem_empty": lambda P: P.TensorDict().popitem(),
    "setdefault_new": _seq(lambda td: td.setdefault("z", torch.ones(3, 4))),
    "setdefault_existing": _seq(lambda td: td.setdefault("i", torch.ones(3, 4))),
    "setdefault_nested": _seq(lambda td: td.setdefault(("n", "e"), torch.ones(3, 4))),
    "del_": _seq(lambda td: td.del_("i") is td),
    "del_nested": _seq(lambda td: td.del_(("n", "d")) is td),
    "del_missing": _seq(lambda td: td.del_("zz")),
    "create_nested": _seq(
        lambda td: td.create_nested("x") is td, lambda td: td.create_nested(("n", "y")) is td
    ),
    "separates": _seq(lambda td: td.separates("i", ("n", "d"))),
    "separates_default": _seq(lambda td: td.separates("zz", default=None, strict=False)),
    "split_keys": _seq(lambda td: td.split_keys(["i"], ["f"])),
    "split_keys_inplace": _seq(lambda td: td.split_keys(["i"], inplace=True)),
    "rename_keys": _seq(lambda td: td.rename_keys({"i": "j", ("n", "d"): ("n", "e")})),
    "rename_keys_missing": _seq(lambda td: td.rename_keys({"zz": "j"})),
    "rename_keys_nonstrict": _seq(lambda td: td.rename_keys({"zz": "j", "i": "k"}, strict=False)),
    "replace": _seq(lambda td: td.replace(i=torch.zeros(3, 4, dtype=torch.long))),
    "replace_mapping": _seq(lambda td: td.replace({"f": torch.zeros(3, 4, 2)})),
    "get_at": _seq(
        lambda td: td.get_at("i", 1), lambda td: td.get_at(("n", "d"), (slice(None), 2))
    ),
    "get_at_default": _seq(lambda td: td.get_at("zz", 0, default=None)),
    "get_item_shape": _seq(lambda td: td.get_item_shape("f"), lambda td: td.get_item_shape("n")),
    "entry_class": _seq(
        lambda td: td.entry_class("f").__name__, lambda td: td.entry_class("n").__name__
    ),
    "filter_empty_": lambda P: (lambda td: (td.filter_empty_(), td)[1])(
        P.TensorDict({"a": torch.zeros(2), "e": {}, "f": {"g": {}}}, [2])
    ),
    "depth": lambda P: (
        mixed(P).depth,
        P.TensorDict(a={"b": {"c": 1}}).depth,
        P.TensorDict().depth,
    ),
    "numel_after_clear": _seq(lambda td: td.clear().numel()),
    # a joined key never overwrites an entry (test_generic.py::test_flatten_keys_collision:
    # one of the two values was silently dropped), in either order; joined keys merge into a
    # sub-tree that exists and new sub-trees come last
    "unflatten_collision": lambda P: P.TensorDict(
        {"a.b": torch.zeros(3), "a": {"b": torch.ones(3)}}, []
    ).unflatten_keys("."),
    "unflatten_collision_after": lambda P: P.TensorDict(
        {"a": {"b": torch.ones(3)}, "a.b": torch.zeros(3)}, []
    ).unflatten_keys("."),
    "unflatten_collision_deep": lambda P: P.TensorDict(
        {"a/b/c": torch.zeros(3), "a": {"b": {"c": torch.ones(3), "d": torch.ones(3)}}}, []
    ).unflatten_keys("/"),
    "unflatten_merge": lambda P: (lambda td: (list(td.keys(True, True)), td))(
        P.TensorDict(
            {
                "a": {"x": torch.ones(1)},
                "c": torch.ones(1),
                "a.y": torch.zeros(1),
                "q.r": torch.ones(2),
            },
            [],
        ).unflatten_keys(".")
    ),
    # nested tuple keys are unravelled everywhere a key is taken (test_generic.py's
    # test_pad_sequence masks and test_split_keys: one helper, _core/index.key_path)
    "nested_tuple_keys": lambda P: (
        lambda td: (
            td[("m", "n"), "a"],
            td.get((("m",), ("n", "a"))),
            td.set((("m", "n"), "b"), torch.zeros(1))["m", "n", "b"],
            td.split_keys([(("m",), "n")]),
            (("m", "n"), "a") in td.keys(True),
        )
    )(P.TensorDict({"m": {"n": {"a": torch.ones(1)}}, "c": torch.zeros(1)}, [])),
    # the constructor: batch_size as an int; a mapping and keyword entries, not both
    # (test_generic.py::test_set_list_* and test_construct_from_kwargs)
    "batch_size_int": lambda P: (
        P.TensorDict(a=torch.ones(2), batch_size=2),
        P.TensorDict({"a": torch.ones(2, 3)}, 2),
        P.TensorDict(a=["x", "y"], batch_size=2)[1]["a"],
    ),
    "source_and_kwargs": lambda P: P.TensorDict({"b": torch.ones(1)}, [], a=torch.ones(1)),
    # keys/values/items(sort=, is_leaf=) (test_generic.py::test_sorted_keys)
    "keys_sorted": lambda P: (
        lambda td: (
            list(td.keys(sort=True)),
            list(td.keys(True, sort=True)),
            list(td.keys(True, True, sort=True)),
            [k for k, _ in td.items(True, True, sort=True)],
            list(td.values(True, True, sort=True)),
        )
    )(P.TensorDict({"e": {"g": {"i": 5, "h": 4}, "f": 3}, "d": 2, "a": {"c": 1, "b": 0}})),
    "keys_non_tensor_as_leaves": lambda P: (
        lambda td: (
            list(
                td.keys(
                    True, True, is_leaf=lambda c: issubclass(c, (torch.Tensor, P.NonTensorData))
                )
            ),
            list(td.keys(True, False, is_leaf=lambda c: issubclass(c, P.NonTensorData), sort=True)),
        )
    )(mixed(P).set_non_tensor(("n", "s"), "text")),
}


@pytest.mark.parametrize("name", list(ENTRY_CASES))
def test_entries(name: str) -> None:
    side_by_side(ENTRY_CASES[name])


# ---------------------------------------------------------------------------- introspection

INTROSPECTION: dict[str, Callable[[Any], Any]] = {
    "dtype_mixed": lambda P: mixed(P).dtype,
    "dtype_floats": lambda P: floats(P).dtype,
    "dtype_empty": lambda P: P.TensorDict().dtype,
    "is_contiguous": lambda P: (floats(P).is_contiguous(), floats(P).permute(1, 0).is_contiguous()),
    "is_floating_point": lambda P: (floats(P).is_floating_point(), mixed(P).is_floating_point()),
    "is_meta": lambda P: (floats(P).is_meta, floats(P).to("meta").is_meta),
    "requires_grad": lambda P: (floats(P).requires_grad, floats(P).requires_grad_().requires_grad),
    "param_count": lambda P: (mixed(P).param_count(), mixed(P).param_count(count_duplicates=False)),
    "param_count_dup": lambda P: (lambda x: P.TensorDict(a=x, b=x, c=torch.zeros(2, 3)))(
        torch.zeros(6)
    ).param_count(count_duplicates=False),
    "bytes": lambda P: (mixed(P).bytes(), mixed(P).bytes(count_duplicates=False)),
    "bytes_dup": lambda P: (lambda x: P.TensorDict(a=x, b=x, c=torch.zeros(2, 3)))(
        torch.zeros(6)
    ).bytes(count_duplicates=False),
    "data_ptr_keys": lambda P: list(mixed(P).data_ptr().keys(True, True)),
    "ndimension": lambda P: floats(P).ndimension(),
}


@pytest.mark.parametrize("name", list(INTROSPECTION))
def test_introspection(name: str) -> None:
    side_by_side(INTROSPECTION[name])


def test_data_ptr_values() -> None:
    td = mixed(rs)
    ptrs = td.data_ptr()
    assert ptrs["f"] == td["f"].data_ptr() and ptrs["n", "d"] == td["n", "d"].data_ptr()


# ---------------------------------------------------------------------------- autograd


def _grad_tree(P: Any) -> Any:
    td = floats(P).requires_grad_()
    (td["a"].sum() + 2 * td["n", "c"].sum()).backward()
    return td


AUTOGRAD: dict[str, Callable[[Any], Any]] = {
    "grad": lambda P: _grad_tree(P).grad,
    "grad_none": lambda P: floats(P).grad,
    "zero_grad": lambda P: (lambda td: (td.zero_grad(), td.grad)[1])(_grad_tree(P)),
    "zero_grad_keep": lambda P: (lambda td: (td.zero_grad(set_to_none=False), td.grad)[1])(
        _grad_tree(P)
    ),
    "data": lambda P: _grad_tree(P).data,
    "requires_grad_false": lambda P: floats(P).requires_grad_().requires_grad_(False).requires_grad,
}


@pytest.mark.parametrize("name", list(AUTOGRAD))
def test_autograd(name: str) -> None:
    side_by_side(AUTOGRAD[name])


def test_backward_on_scalar_tree() -> None:
    def case(P: Any) -> Any:
        leaf = torch.ones(3, requires_grad=True)
        td = P.TensorDict(loss=(leaf * 2).sum())
        td.backward()
        return leaf.grad

    side_by_side(case)


def test_data_shares_storage() -> None:
    td = _grad_tree(rs)
    data = td.data
    assert not data["a"].requires_grad and data["a"].data_ptr() == td["a"].data_ptr()


# ---------------------------------------------------------------------------- conversions


class Point(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


@dataclasses.dataclass
class Sample:
    obs: torch.Tensor
    reward: torch.Tensor
    info: str = "none"


CONVERSIONS: dict[str, Callable[[Any], Any]] = {
    "numpy": lambda P: mixed(P).numpy(),
    "tolist": lambda P: mixed(P).tolist(),
    "tolist_0d": lambda P: mixed(P)[0, 0].tolist(),
    # a LinkedList whose item writes reach the tree's rows (refused here before)
    "tolist_linked": lambda P: (
        lambda td: (
            lambda values: (
                type(values).__name__,
                values.__setitem__(1, P.TensorDict(a=torch.tensor(9.0))),
                td["a"],
                list(values)[1],
            )
        )(td.tolist(as_linked_list=True))
    )(P.TensorDict(a=torch.arange(3.0), batch_size=[3])),
    "tolist_convert_tensors": lambda P: mixed(P)[:2, :2].tolist(convert_tensors=True),
    "tolist_no_nodes": lambda P: mixed(P)[:2, :2].tolist(convert_nodes=False).__class__.__name__,
    "to_namedtuple": lambda P: tuple(mixed(P).to_namedtuple()),
    "to_namedtuple_fields": lambda P: mixed(P).to_namedtuple()._fields,
    "to_namedtuple_nested": lambda P: tuple(mixed(P).to_namedtuple().n),
    "from_namedtuple": lambda P: P.TensorDict.from_namedtuple(
        Point(torch.zeros(3), torch.ones(3, 2))
    ),
    "from_namedtuple_auto": lambda P: P.TensorDict.from_namedtuple(
        Point(torch.zeros(3), torch.ones(3, 2)), auto_batch_size=True
    ),
    "namedtuple_roundtrip": lambda P: P.TensorDict.from_namedtuple(
        mixed(P).to_namedtuple(), batch_size=[3, 4]
    ),
    "from_dataclass": lambda P: P.TensorDict.from_dataclass(
        Sample(torch.zeros(4, 2), torch.ones(4))
    ),
    "from_dataclass_auto": lambda P: P.TensorDict.from_dataclass(
        Sample(torch.zeros(4, 2), torch.ones(4)), auto_batch_size=True
    ),
    "from_tuple": lambda P: P.TensorDict.from_tuple(
        (torch.zeros(3), (torch.ones(3), torch.ones(3, 1)))
    ),
    "from_pytree_dict": lambda P: P.TensorDict.from_pytree(
        {"a": torch.zeros(3), "b": [torch.ones(3), torch.ones(3)]}
    ),
    "pytree_roundtrip": lambda P: P.TensorDict.from_pytree(
        {"a": torch.zeros(3), "b": (torch.ones(3), {"c": torch.ones(2)})}
    ).to_pytree(),
    "to_pytree": lambda P: mixed(P).to_pytree(),
    "from_struct_array": lambda P: P.TensorDict.from_struct_array(
        np.array([(1, 2.0), (3, 4.0)], dtype=[("a", np.int64), ("b", np.float32)])
    ),
    "to_struct_array": lambda P: P.TensorDict(
        {"a": torch.arange(3), "b": torch.ones(3)}, [3]
    ).to_struct_array(),
    "from_list": lambda P: P.TensorDict.from_list([{"a": torch.zeros(2)}, {"a": torch.ones(2)}]),
    "from_dict_instance": lambda P: mixed(P).from_dict_instance(
        {"f": torch.zeros(2, 2), "i": torch.zeros(2, dtype=torch.long)}, batch_size=[2]
    ),
    "from_any_dict": lambda P: P.TensorDict.from_any(
        {"a": torch.zeros(3), "b": {"c": torch.ones(3)}}
    ),
    "from_any_namedtuple": lambda P: P.TensorDict.from_any(Point(torch.zeros(3), torch.ones(3))),
    "as_tensor": lambda P: mixed(P).as_tensor(),
    "cat_tensors": lambda P: (lambda td: td.cat_tensors("f", ("n", "d"), out_key="x", dim=-1))(
        mixed(P).float()
    ),
    "stack_tensors": lambda P: (lambda td: td.stack_tensors("i", ("n", "j"), out_key="s", dim=-1))(
        ints(P)
    ),
    "stack_tensors_keep": lambda P: (
        lambda td: td.stack_tensors("i", ("n", "j"), out_key="s", dim=2, keep_entries=True)
    )(ints(P)),
    "stack_tensors_bad_dim": lambda P: ints(P).stack_tensors("i", ("n", "j"), out_key="s"),
    "cat_from_tensordict": lambda P: floats(P).exclude("b").cat_from_tensordict(dim=-1),
    "cat_from_tensordict_sorted": lambda P: (
        floats(P).exclude("b").cat_from_tensordict(dim=-1, sorted=True)
    ),
    "cat_from_tensordict_ndim": lambda P: floats(P).cat_from_tensordict(dim=-1),
    "stack_from_tensordict": lambda P: floats(P).select("b").stack_from_tensordict(),
}


@pytest.mark.parametrize("name", list(CONVERSIONS))
def test_conversions(name: str) -> None:
    side_by_side(CONVERSIONS[name])


# ---------------------------------------------------------------------------- persistence


def test_make_memmap(tmp_path: Any) -> None:
    def case(P: Any) -> Any:
        td = P.TensorDict({"a": torch.zeros(3)}, [3]).memmap_(tmp_path / (P.__name__ + "m"))
        made = td.make_memmap(("n", "b"), (3, 2), dtype=torch.float64)
        made.fill_(2.0)
        from_tensor = td.make_memmap_from_tensor("c", torch.arange(3))
        again = P.TensorDict.load_memmap(tmp_path / (P.__name__ + "m"))
        return made.shape, made.dtype, from_tensor.tolist(), again

    side_by_side(case)


def test_make_memmap_needs_memmap_td() -> None:
    side_by_side(lambda P: P.TensorDict({"a": torch.zeros(3)}, [3]).make_memmap("b", (3,)))


def test_make_memmap_from_storage(tmp_path: Any) -> None:
    def case(P: Any) -> Any:
        td = P.TensorDict({"a": torch.zeros(3)}, [3]).memmap_(tmp_path / (P.__name__ + "s"))
        made = td.make_memmap("b", (3, 2))
        other = td.make_memmap_from_storage(
            "c", made.untyped_storage(), (3, 2), dtype=torch.float32
        )
        made.fill_(5.0)
        return other

    side_by_side(case)


@pytest.mark.parametrize("robust_key", [True, None, False])
def test_memmap_robust_key(tmp_path: Any, robust_key: bool | None) -> None:
    def case(P: Any) -> Any:
        td = P.TensorDict({"a": torch.zeros(3), "s": "text"}, [3])
        td.memmap_(tmp_path / P.__name__, robust_key=robust_key)
        return P.TensorDict.load_memmap(tmp_path / P.__name__)

    side_by_side(case)


def test_consolidate_filename(tmp_path: Any) -> None:
    def case(P: Any) -> Any:
        td = mixed(P).consolidate(filename=tmp_path / f"{P.__name__}.bin")
        back = P.TensorDict.from_consolidated(tmp_path / f"{P.__name__}.bin")
        return td, back

    side_by_side(case)


@pytest.mark.parametrize(("writer", "reader"), [("rs", "ref"), ("ref", "rs"), ("rs", "rs")])
def test_consolidate_filename_non_tensor_stacks(tmp_path: Any, writer: str, reader: str) -> None:
    """NonTensorStacks (1-D and 2-D, string and list values, nested) in the single-file layout,
    both ways with tensordict 0.15.3 (the writer raised a KeyError here; found by tensordict's
    test_pickle_consolidate)."""

    def tree(P: Any) -> Any:
        return P.TensorDict(
            s=P.NonTensorStack.from_list([["a", "b"], ["c", "d"], ["e", "f"]]),
            x=torch.arange(6.0).view(3, 2),
            batch_size=[3, 2],
        )

    W, R = PKGS[writer], PKGS[reader]
    path = tmp_path / "t.bin"
    written = tree(W).consolidate(filename=path)
    back = R.TensorDict.from_consolidated(path)
    assert back["s"] == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert written["s"] == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert torch.equal(back["x"], torch.arange(6.0).view(3, 2))
    lists = W.TensorDict(
        n=W.TensorDict(v=W.NonTensorStack([1, 2], [3], ["x"]), batch_size=[3]), batch_size=[3]
    )
    lists.consolidate(filename=tmp_path / "l.bin")
    again = R.TensorDict.from_consolidated(tmp_path / "l.bin")
    assert again["n", "v"] == [[1, 2], [3], ["x"]] and again["n"].batch_size == (3,)


def test_to_non_blocking_pin() -> None:
    """``non_blocking_pin`` pins before an asynchronous copy to an accelerator. Without one,
    the reference fails in ``pin_memory`` even for a CPU target; here a CPU target needs no
    pinning and works (a deliberate difference)."""
    if torch.cuda.is_available():
        side_by_side(lambda P: mixed(P).to("cuda", non_blocking_pin=True).cpu())
    else:
        compare(mixed(rs).to("cpu", non_blocking_pin=True), mixed(ref).to("cpu"))


def test_pin_memory_inplace() -> None:
    if not torch.cuda.is_available():
        side_by_side(lambda P: type(mixed(P).pin_memory_).__name__)
        return
    side_by_side(lambda P: (lambda td: (td.pin_memory_() is td, td["f"].is_pinned()))(mixed(P)))


def test_load_(tmp_path: Any) -> None:
    def case(P: Any) -> Any:
        mixed(P).memmap(tmp_path / P.__name__)
        td = mixed(P).zero_()
        return td.load_(tmp_path / P.__name__)

    side_by_side(case)


def test_h5_roundtrip(tmp_path: Any) -> None:
    pytest.importorskip("h5py")

    def case(P: Any) -> Any:
        path = tmp_path / f"{P.__name__}.h5"
        written = mixed(P).to_h5(path)
        again = P.TensorDict.from_h5(path)
        return written.to_tensordict(), again.to_tensordict()

    side_by_side(case)


def test_h5_cross_package(tmp_path: Any) -> None:
    """A file written by either package reads in the other."""
    pytest.importorskip("h5py")
    mixed(ref).to_h5(tmp_path / "ref.h5").close()
    mixed(rs).to_h5(tmp_path / "rs.h5")
    compare(
        rs.TensorDict.from_h5(tmp_path / "ref.h5"),
        ref.TensorDict.from_h5(tmp_path / "ref.h5").to_tensordict(),
    )
    back = ref.TensorDict.from_h5(tmp_path / "rs.h5")
    compare(rs.TensorDict.from_h5(tmp_path / "rs.h5"), back.to_tensordict())
    back.close()


def test_h5_contiguous_datasets_are_file_views(tmp_path: Any) -> None:
    """A contiguous dataset is a view of the mapped file (mode r+: writes reach it)."""
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "x.h5"
    rs.TensorDict({"a": torch.zeros(4, 3)}, [4]).to_h5(path)
    td = rs.TensorDict.from_h5(path, mode="r+")
    td["a"][1] = 7.0
    del td
    with h5py.File(path) as f:
        assert f["a"][1].tolist() == [7.0, 7.0, 7.0]


# ---------------------------------------------------------------------------- names

_SCRATCH = tempfile.TemporaryDirectory()  # removed at exit: the saves of the NAMES cases


def _scratch() -> str:
    return tempfile.mkdtemp(dir=_SCRATCH.name)


def _named4(P: Any) -> Any:
    return P.TensorDict(
        {"x": torch.zeros(3, 4, 1, 6), "n": {"y": torch.zeros(3, 4, 1, 6, 2)}},
        batch_size=[3, 4, 1, 6],
        names=["a", "b", "c", "d"],
    )


def _adopts_names(P: Any) -> Any:
    td = P.TensorDict({"x": torch.zeros(3)}, [3])
    td["a"] = P.TensorDict({}, [3, 4], names=["a", "b"])
    return [td.names, td["a"].names]


NAMES: dict[str, Callable[[Any], Any]] = {
    # names carried by flatten/unflatten (the merged or split dims unnamed), select, all/any(dim),
    # the memory-mapped copies, and taken from a named sub-tree (they were all dropped)
    "flatten_names": lambda P: [_named4(P).flatten(1, 3).names, _named4(P).flatten(0, 1).names],
    "unflatten_names": lambda P: _named4(P).flatten(1, 3).unflatten(1, (4, 1, 6)).names,
    "select_names": lambda P: [_named4(P).select("x").names, _named4(P).select("n")["n"].names],
    "all_any_dim_names": lambda P: [_named4(P).all(2).names, _named4(P).any(0).names],
    "memmap_like_names": lambda P: _named4(P).memmap_like(_scratch()).names,
    "memmap_names": lambda P: _named4(P).memmap(_scratch())["n"].names,
    "adopts_sub_tree_names": _adopts_names,
    "names_default": lambda P: mixed(P).names,
    "construct_names": lambda P: (
        P.TensorDict({"a": torch.zeros(3, 4)}, [3, 4], names=["x", "y"]).names
    ),
    "refine_names": lambda P: mixed(P).refine_names("x", "y").names,
    "refine_names_ellipsis": lambda P: mixed(P).refine_names(..., "y").names,
    "refine_names_conflict": lambda P: mixed(P).refine_names("x", "y").refine_names("z", "y"),
    "rename": lambda P: mixed(P).refine_names("x", "y").rename("u", "v").names,
    "rename_map": lambda P: mixed(P).refine_names("x", "y").rename(x="t").names,
    "rename_keeps_source": lambda P: (lambda td: (td.rename("a", "b"), td.names)[1])(
        mixed(P).refine_names("x", "y")
    ),
    "rename_": lambda P: (lambda td: (td.rename_("a", "b") is td, td.names))(mixed(P)),
    "names_set": lambda P: (lambda td: (setattr(td, "names", ["p", "q"]), td.names)[1])(mixed(P)),
    "names_through_index": lambda P: mixed(P).refine_names("x", "y")[0].names,
    "names_through_permute": lambda P: mixed(P).refine_names("x", "y").permute(1, 0).names,
    "names_through_unsqueeze": lambda P: mixed(P).refine_names("x", "y").unsqueeze(0).names,
    "names_through_clone": lambda P: mixed(P).refine_names("x", "y").clone().names,
    "names_nested": lambda P: mixed(P).refine_names("x", "y")["n"].names,
    "names_bad_length": lambda P: mixed(P).refine_names("x"),
}


@pytest.mark.parametrize("name", list(NAMES))
def test_names(name: str) -> None:
    side_by_side(NAMES[name])


# ---------------------------------------------------------------------------- the method count


def test_method_count() -> None:
    """At least 300 of the reference's public TensorDict methods exist here (issue 23)."""
    theirs = {n for n in dir(ref.TensorDict) if not n.startswith("_")}
    ours = {n for n in dir(rs.TensorDict) if not n.startswith("_")}
    assert len(theirs & ours) >= 300, sorted(theirs - ours)


def test_state_dict_matches_module_convention() -> None:
    sd_keys = {P.__name__: list(mixed(P).state_dict()) for P in PKGS.values()}
    assert sd_keys["tensordict_rs"] == sd_keys["tensordict"]
    compare(
        collections.OrderedDict(mixed(rs).state_dict()),
        collections.OrderedDict(mixed(ref).state_dict()),
    )


def _contexts(P: Any) -> Any:
    """Shape operations used as a context write their result's entries back on exit."""
    td = P.TensorDict({"x": torch.ones(3, 4, 5)}, [3, 4])
    with td.view(-1) as v:
        v["y"] = torch.zeros(12, 2)
        v["x"] *= 0
    with td.permute(1, 0) as v:
        v["p"] = torch.arange(12.0).view(4, 3)
    with td.unsqueeze(0) as v:
        v["z"] = torch.zeros(1, 3, 4)
    with td.flatten(0, 1) as v:
        v["f"] = torch.arange(12)
    sub = td[:, :1]
    with sub.squeeze(1) as v:
        v["s"] = torch.ones(3)
    with td.transpose(0, 1) as v:
        v["t"] = torch.zeros(4, 3)
    with td.unflatten(1, (2, 2)) as v:
        v["u"] = torch.zeros(3, 2, 2)
    with td.movedim(0, 1) as v:
        v["m"] = torch.arange(12).view(4, 3)
    with td.flip(0) as v:
        v["fl"] = torch.arange(3).expand(4, 3).T.contiguous()
    with td.roll(1, 0) as v:
        v["r"] = torch.arange(3).repeat_interleave(4).view(3, 4)
    with td.atleast_3d() as v:
        v["a3"] = torch.zeros(1, 3, 4)
    with td.flatten_keys() as v:
        v["n.a"] = torch.zeros(3, 4)
    locked = td.clone().lock_()
    with locked.view(-1) as v:
        v["x"] += 1  # a locked source takes the values in place
    try:
        with td.view(-1) as v:
            v["err"] = torch.zeros(12)
            raise ValueError
    except ValueError:
        pass
    return [td, sub, locked]


def test_shape_operations_as_context() -> None:
    """(The result's new entries were never written back.)"""
    side_by_side(_contexts)


def test_context_write_back_makes_no_cycle() -> None:
    """A view never used as a context holds no reference to itself: freed without the
    garbage collector, as before."""
    import gc
    import weakref

    gc.disable()
    try:
        td = rs.TensorDict({"x": torch.ones(3, 4)}, [3, 4])
        v = td.view(-1)
        ref = weakref.ref(v)
        del v
        assert ref() is None
    finally:
        gc.enable()


def test_module_level_save_and_load(tmp_path: Any) -> None:
    """``save``/``load_memmap``/``load`` (and ``functional.memmap``: the package's ``memmap`` is
    its module, as tensordict's) and the safetensors pair, as functions of the package; each
    package reads what the other's functions wrote."""
    for writer in (rs, ref):
        path = tmp_path / writer.__name__
        if writer is rs:
            rs.functional.memmap(floats(rs), path)
        else:
            floats(ref).memmap(path)
        compare(rs.load_memmap(path), ref.load_memmap(path))
        writer.save(floats(writer), path / "again")
        compare(rs.load(path / "again"), ref.load(path / "again"))
    rs.to_safetensors(floats(rs), tmp_path / "t.safetensors")
    loaded = rs.from_safetensors(tmp_path / "t.safetensors", device="cpu")
    assert (loaded == floats(rs)).all()


def _apply_cases(P: Any) -> Any:
    td = P.TensorDict({"a": torch.zeros(2), "s": "x", "n": {"b": torch.ones(2)}, "e": {}}, [2])
    plain = P.TensorDict({"a": torch.zeros(2), "n": {"b": torch.ones(2)}}, [2])
    with_text = P.TensorDict({"a": torch.zeros(2), "s": "x", "n": {"b": torch.ones(2)}}, [2])
    return [
        P.TensorDict({"e": {}, "b": torch.zeros(2)}, [2]).apply(lambda x: None),  # e: kept
        plain.apply(lambda x: None),  # every call None: None, as tensordict
        plain.apply(lambda x: None, filter_empty=False),
        P.TensorDict(batch_size=[3]).apply(lambda x: x),  # fn never called: the empty tree
        with_text.apply(lambda x: None, filter_empty=True, is_leaf=P.is_leaf_nontensor),
        td.apply(lambda x: x, is_leaf=P.is_leaf_nontensor),
        td.apply(lambda x: x * 2),
        td.named_apply(lambda k, x: x + len(k), nested_keys=True),
        td._fast_apply(lambda x: x * 2, num_threads=2, checked=False),
        [P.is_leaf_nontensor(c) for c in (torch.Tensor, P.NonTensorData, P.TensorDict)],
        [P.default_is_leaf(c) for c in (torch.Tensor, P.NonTensorData, P.TensorDict)],
    ]


def test_apply_options() -> None:
    """``is_leaf``, ``_fast_apply(num_threads=)`` (refused before) and the None result of
    tensordict's ``apply`` (an empty tree was returned)."""
    side_by_side(_apply_cases)


def _comparisons_with_text(P: Any) -> Any:
    td = P.TensorDict(
        {"a": torch.zeros(2), "data": {"s": P.NonTensorData("x", batch_size=[2])}}, [2]
    )
    return [
        (td == 0).all(),  # the non-tensor entry against a number: passed over (it was False)
        (td != 1).all(),
        (td == torch.zeros(())).all(),
        td == "z",  # not a number, tensor, mapping or tree: False, and True for !=
        td != "z",
        td == None,  # noqa: E711
        (td == td.clone()).all(),
        td == {"a": torch.zeros(2), "data": {"s": "x"}},
    ]


def test_comparisons_with_non_tensor_entries() -> None:
    side_by_side(_comparisons_with_text)


def _small_gaps(P: Any) -> Any:
    td = P.TensorDict({"a": torch.zeros(4, 3)}, [4, 3])
    td.set("k", np.ones((4, 3, 2)))
    td.set_("k", np.zeros((4, 3, 2)))  # an array written in place (fill_ refused it)
    flat = P.TensorDict({"a": torch.zeros(3)}, [])
    wide = P.TensorDict({"a": torch.zeros(2, 3)}, [2])
    return [
        td["k"],
        td.reshape(size=td.shape),  # torch's keyword (refused)
        td.view(size=(12,)),
        flat == wide,  # batch sizes broadcast (expand raised)
        P.TensorDict({"a": torch.zeros(4, 3), "s": "x"}, [4, 3])._has_non_tensor,
        td._has_non_tensor,
    ]


def test_small_gaps_of_test_methods() -> None:
    """Found by tensordict's ``test/tensordict/test_methods.py`` through the alias."""
    side_by_side(_small_gaps)


def _apply_out(P: Any) -> Any:
    td = P.TensorDict({"c": torch.arange(3), "n": {"d": torch.arange(3)}}, [3])
    c = td["c"]
    out = td.apply(lambda x: x.float() + 0.5, out=td)  # out= takes the results as entries
    kept = P.TensorDict({"c": torch.arange(3)}, [3])
    before = kept["c"]
    kept.apply_(lambda x: x.float() + 0.5)  # apply_ writes into the leaves (dtype kept)
    return [out is td, td["c"], td["n", "d"], td["c"] is c, kept["c"], kept["c"] is before]


def test_apply_out_sets_entries() -> None:
    """(``out=`` copied into the existing leaves, so their dtype stayed.)"""
    side_by_side(_apply_out)


def _pad_cases(P: Any) -> Any:
    d1 = P.TensorDict({"a": torch.tensor([1, 1]), "b": "asd", "n": {"c": "x"}})
    d2 = P.TensorDict({"a": torch.tensor([2]), "b": "efg", "n": {"c": "x"}})
    e1 = P.TensorDict({"a": torch.ones(2), "s": P.NonTensorStack("p", "q")}, [2])
    e2 = P.TensorDict({"a": torch.ones(3), "s": P.NonTensorStack("r", "s", "t")}, [3])
    stack = P.NonTensorStack("a", "b")
    padded = P.pad(stack, [1, 1])
    same = P.pad(stack, [0, 1], inplace=True) is stack
    td = P.TensorDict({"a": torch.arange(12.0).view(3, 4)}, [3, 4])
    reshaped = td.reshape((12,), inplace=True)
    return [
        P.pad_sequence([d1, d2]),  # non-tensor entries kept (KeyError before)
        list(P.pad_sequence([d1])["b"]),
        P.pad_sequence([e1, e2]).get("s").tolist(),  # a stack padded with None (batch dim)
        padded.tolist(),  # pad of a stack itself (refused)
        same,
        stack.tolist(),
        reshaped is td,  # reshape(inplace=) (refused)
        td["a"],
        td._check_batch_size(),
    ]


def test_pad_and_reshape_gaps() -> None:
    side_by_side(_pad_cases)


def _struct_and_update(P: Any) -> Any:
    x = np.array(
        [("Rex", 9, 81.0), ("Fido", 3, 27.0)],
        dtype=[("name", "U10"), ("age", "i4"), ("weight", "f4")],
    )
    td = P.TensorDict.from_struct_array(x)  # a string field (TypeError before)
    back = td.to_struct_array()
    data = P.TensorDict({"a": {"b": {"c": {}}}, "d": 1}, [])
    data.load_state_dict(P.TensorDict({"d": 0}, []).state_dict(), strict=True)
    target = P.TensorDict({"a": torch.zeros(3), "n": {"x": torch.zeros(3)}}, [3])
    errors = []
    for call in (
        lambda: target.update_(b=torch.ones(3)),
        lambda: target.update_({"n": {"y": torch.ones(3)}}),
    ):
        try:
            call()
        except KeyError as err:
            errors.append(str(err))
    return [back, back.dtype.descr, bool((back == x).all()), data["d"], errors]


def test_struct_arrays_state_dicts_update_() -> None:
    """String fields of structured arrays; strict ``load_state_dict`` past empty nested trees
    (it raised for a tree holding only empty trees); ``update_``'s missing-key message."""
    side_by_side(_struct_and_update)


def _rebatching(P: Any) -> Any:
    td = P.TensorDict({"a": torch.zeros(4, 3)}, [4, 3])
    inner = torch.arange(12.0).view(4, 3, 1)
    tdin = P.TensorDict({"inner": inner, "n": {"x": torch.zeros(4, 3)}}, [])
    td["inner_td"] = tdin  # a tree of no batch dims: taken as a copy of td's batch size
    out = [td, tdin.batch_size, tdin["n"].batch_size, td["inner_td"] is tdin]
    try:
        td["bad"] = P.TensorDict({"x": torch.zeros(5)}, [])
    except RuntimeError:
        out.append("bad refused")
    out.append(sorted(td.keys()))
    v = P.TensorDict({"n": {"x": torch.zeros(4, 3)}, "y": torch.zeros(4, 3)}, [])
    v.batch_size = [4, 3]  # the nested tree of fewer dims takes the new ones too
    out += [v, v["n"].batch_size]
    w = P.TensorDict({"n": {"x": torch.zeros(4, 3)}, "y": torch.zeros(4)}, [])
    try:
        w.batch_size = [4, 3]
    except RuntimeError:
        out.append("w refused")
    out.append(w.batch_size)
    return out


def test_trees_of_fewer_batch_dims_take_the_batch_size() -> None:
    """``td[key] = tree`` of another batch size and ``batch_size = ...`` over nested trees of
    fewer dims, as tensordict (both raised here)."""
    side_by_side(_rebatching)


def _numpy_writes(P: Any) -> Any:
    td = P.TensorDict({"a": torch.zeros(4, 3)}, [4])
    td.set("k", np.arange(20.0).reshape(4, 5))
    td.set_at_("k", np.full((5,), 42.0), 2)  # a NumPy row (TypeError before)
    td.set_at_("a", np.ones(3, dtype=np.float32), slice(0, 2))
    td.set_("a", np.full((4, 3), 7.0, dtype=np.float32))
    return td


def test_numpy_values_in_place() -> None:
    side_by_side(_numpy_writes)


def _nested_tuple_keys_to_update(P: Any) -> Any:
    t = lambda v: torch.full((2,), v)  # noqa: E731
    td = P.TensorDict({"My": {"father": {"was": t(0.0), "a": t(0.0)}}}, [2])
    other = P.TensorDict({"My": {"father": {"was": t(1.0), "a": t(1.0)}, "r": t(1.0)}}, [2])
    td.update(other, keys_to_update=(("My", ("father",), "was"),))  # a nested tuple in a key
    return td


def test_keys_to_update_unravels_nested_tuples() -> None:
    side_by_side(_nested_tuple_keys_to_update)


def _reductions_into_out(P: Any) -> Any:
    td = floats(P)
    complete = td.logsumexp(dim=1)
    leaves_before = [complete["a"], complete["n", "c"]]
    got = td.logsumexp(dim=1, out=complete)
    empty = td.logsumexp(dim=(0, 1), keepdim=True).empty()
    got_empty = td.logsumexp(dim=(0, 1), keepdim=True, out=empty)
    norms = td.norm()
    norm_leaf = norms["b"]
    td.norm(out=norms)
    return [
        got is complete,
        got["a"] is leaves_before[0] and got["n", "c"] is leaves_before[1],
        got,
        got_empty is empty,
        got_empty,
        norms["b"] is norm_leaf,
    ]


def test_reductions_write_into_out() -> None:
    """``out=`` of ``logsumexp`` writes into ``out``'s own tensors (they were replaced by new
    ones); ``norm``'s replaces them, as tensordict's."""
    side_by_side(_reductions_into_out)
