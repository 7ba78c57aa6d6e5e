"""Element-wise and in-place TensorDict operations, side by side with tensordict 0.15.3."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as rs
import torch


def make(pkg: Any, locked: bool = False) -> Any:
    """The same small tree in either package: float and int leaves, a nested TensorDict."""
    td = pkg.TensorDict(
        {
            "a": torch.arange(6, dtype=torch.float32).view(3, 2),
            "i": torch.arange(3),
            "n": {"b": torch.linspace(-1.0, 1.0, 3)},
        },
        batch_size=[3],
    )
    return td.lock_() if locked else td


def leaves(td: Any) -> dict[Any, torch.Tensor]:
    return {k: v for k, v in td.items(include_nested=True, leaves_only=True)}


def assert_same(ours: Any, theirs: Any) -> None:
    """Same keys, batch size, lock state, and leaves equal in dtype, shape and values."""
    assert ours.batch_size == theirs.batch_size
    assert ours.is_locked == theirs.is_locked
    mine, other = leaves(ours), leaves(theirs)
    assert set(mine) == set(other)
    for key, value in other.items():
        assert mine[key].dtype == value.dtype, key
        torch.testing.assert_close(
            mine[key].as_subclass(torch.Tensor),
            value.as_subclass(torch.Tensor),
            equal_nan=True,
            msg=str(key),
        )


BINARY_OPS: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("add", operator.add),
    ("sub", operator.sub),
    ("mul", operator.mul),
    ("truediv", operator.truediv),
    ("pow", operator.pow),
    ("mod", operator.mod),
    ("lt", operator.lt),
    ("le", operator.le),
    ("gt", operator.gt),
    ("ge", operator.ge),
    ("eq", operator.eq),
    ("ne", operator.ne),
]


@pytest.mark.parametrize(("name", "op"), BINARY_OPS)
@pytest.mark.parametrize("kind", ["scalar", "tensor", "tensordict"])
@pytest.mark.parametrize("locked", [False, True])
def test_binary_operators(
    name: str, op: Callable[[Any, Any], Any], kind: str, locked: bool
) -> None:
    def other(pkg: Any) -> Any:
        if kind == "scalar":
            return 2
        if kind == "tensor":
            return torch.tensor([1.0, 2.0, 3.0])  # broadcast over the batch dim
        return make(pkg) + 1

    assert_same(op(make(rs, locked), other(rs)), op(make(ref, locked), other(ref)))


@pytest.mark.parametrize("op", [operator.add, operator.sub, operator.mul, operator.truediv])
def test_reflected_operators(op: Callable[[Any, Any], Any]) -> None:
    assert_same(op(3, make(rs)), op(3, make(ref)))
    assert_same(
        op(torch.tensor([1.0, 2.0, 3.0]), make(rs)), op(torch.tensor([1.0, 2.0, 3.0]), make(ref))
    )


def test_bitwise_and_unary_operators() -> None:
    def run(pkg: Any) -> list[Any]:
        flags = pkg.TensorDict({"x": torch.tensor([True, False, True])}, [3])
        other = pkg.TensorDict({"x": torch.tensor([True, True, False])}, [3])
        td = make(pkg)
        return [flags & other, flags | other, flags ^ other, ~flags, -td, abs(-td)]

    for ours, theirs in zip(run(rs), run(ref), strict=True):
        assert_same(ours, theirs)


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("iadd", lambda td: operator.iadd(td, 1)),
        ("isub", lambda td: operator.isub(td, torch.tensor([1, 2, 3]))),
        ("imul", lambda td: operator.imul(td, 2)),
        ("add_", lambda td: td.add_(1, alpha=2)),
        ("sub_", lambda td: td.sub_(1)),
        ("mul_", lambda td: td.mul_(3)),
        ("zero_", lambda td: td.zero_()),
        ("fill_", lambda td: td.fill_("a", 7)),
        ("fill_nested", lambda td: td.fill_("n", -2)),
        ("masked_fill_", lambda td: td.masked_fill_(torch.tensor([True, False, True]), -1)),
        ("copy_", lambda td: td.copy_(td.clone() * 0 + 5)),
        ("update_at_", lambda td: td.update_at_({"a": torch.full((2,), 9.0)}, 1)),
        ("set_at_", lambda td: td.set_at_("a", torch.tensor([4.0, 4.0]), 0)),
        ("apply_", lambda td: td.apply_(lambda t: t * 2)),
    ],
)
@pytest.mark.parametrize("locked", [False, True])
def test_in_place(name: str, call: Callable[[Any], Any], locked: bool) -> None:
    def run(pkg: Any) -> Any:
        td = make(pkg, locked)
        a = td["a"]
        out = call(td)
        assert out is td  # in place: the same TensorDict ...
        assert td["a"] is a or name == "apply_"  # ... and the same tensors
        return td

    assert_same(run(rs), run(ref))


def test_in_place_writes_reach_memory_maps(tmp_path: Any) -> None:
    td = make(rs).memmap_(tmp_path / "mm")
    td += 1
    td.masked_fill_(torch.tensor([False, True, False]), 0)
    td.zero_()["i"].fill_(3)
    td.flush()
    loaded = rs.TensorDict.load_memmap(tmp_path / "mm")
    assert (loaded["a"] == 0).all() and (loaded["i"] == 3).all()


@pytest.mark.parametrize("cast", ["float", "double", "half", "bfloat16", "int", "bool"])
@pytest.mark.parametrize("locked", [False, True])
def test_casts(cast: str, locked: bool) -> None:
    assert_same(getattr(make(rs, locked), cast)(), getattr(make(ref, locked), cast)())


def test_cast_filter_and_long() -> None:
    keep = lambda key, t: key[-1] != "i"  # noqa: E731
    assert_same(make(rs).double(cast_filter=keep), make(ref).double(cast_filter=keep))
    assert make(rs).float().long()["a"].dtype == torch.int64
    with pytest.raises(RuntimeError, match="boolean value"):
        bool(make(rs))  # the cast method bool() does not make the truth value work


def test_masked_fill_and_views() -> None:
    mask = torch.tensor([True, False, True])
    for name in ("masked_fill",):
        assert_same(getattr(make(rs), name)(mask, 5), getattr(make(ref), name)(mask, 5))
    for locked in (False, True):
        for name in ("detach", "contiguous", "to_tensordict", "clone"):
            assert_same(getattr(make(rs, locked), name)(), getattr(make(ref, locked), name)())


def test_memmapped_copies(tmp_path: Any) -> None:
    def run(pkg: Any) -> list[Any]:
        td = make(pkg).memmap()
        return [td.contiguous(), td.to_tensordict(), td + 1, td.float(), td.detach()]

    for ours, theirs in zip(run(rs), run(ref), strict=True):
        assert_same(ours, theirs)
        assert ours.is_memmap() == theirs.is_memmap()
        assert type(ours["a"]).__name__ == type(theirs["a"]).__name__


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"filter_empty": False},
        {"batch_size": []},
        {"default": torch.zeros(())},
        {"propagate_lock": True},
        {"call_on_nested": True},
    ],
)
def test_apply_options(kwargs: dict[str, Any]) -> None:
    def run(pkg: Any) -> Any:
        td = make(pkg, locked=kwargs.get("propagate_lock", False))
        if "default" in kwargs:
            other = pkg.TensorDict({"a": torch.ones(3, 2), "i": torch.ones(3)}, [3])
            return td.apply(lambda x, y: x + y, other, **kwargs)
        if kwargs.get("call_on_nested"):
            return td.apply(lambda x: x.clone() * 2, **kwargs)
        # None for the nested leaf: its sub-TensorDict is left empty
        return td.apply(lambda x: None if x.dtype == torch.float32 and x.ndim == 1 else x, **kwargs)

    assert_same(run(rs), run(ref))
    assert set(run(rs).keys(True)) == set(run(ref).keys(True))


def test_apply_out_and_named_apply() -> None:
    def run(pkg: Any) -> tuple[Any, list[Any], Any]:
        td = make(pkg)
        out = td.clone().zero_()
        td.apply(lambda t: t + 1, out=out)
        seen: list[Any] = []
        named = td.named_apply(lambda k, v: seen.append(k) or v * 2, nested_keys=True)
        return out, seen, named

    (out_rs, seen_rs, named_rs), (out_ref, seen_ref, named_ref) = run(rs), run(ref)
    assert_same(out_rs, out_ref)
    assert seen_rs == seen_ref
    assert_same(named_rs, named_ref)
    only = make(rs).named_apply(lambda k, v: v if k == "b" else None)
    assert list(only.keys(True, True)) == [("n", "b")]


def test_to_with_batch_size_keeps_the_caller() -> None:
    for pkg in (rs, ref):
        td = make(pkg)
        if pkg is ref:  # tensordict warns that nested batch sizes will change in 0.17
            with pytest.warns(FutureWarning):
                out = td.to(torch.float64, batch_size=[])
        else:
            out = td.to(torch.float64, batch_size=[])
        assert out.batch_size == torch.Size([]) and out["a"].dtype == torch.float64
        assert td.batch_size == torch.Size([3]) and td["a"].dtype == torch.float32
        same = td.to(batch_size=[3])
        assert same is td


def test_preallocation_tutorial_idiom() -> None:
    """``TensorDict({}, [N, 3])[i] = step`` creates zero-filled keys (preallocation tutorial)."""

    def run(pkg: Any) -> Any:
        torch.manual_seed(0)
        td = pkg.TensorDict({}, batch_size=[10, 3])
        step = pkg.TensorDict(
            {"a": torch.rand(3), "b": torch.rand(3, 4), "n": {"c": torch.ones(3, 2)}}, [3]
        )
        td[0] = step
        assert (td[1:] == 0).all()
        assert (td[0] == step).all()
        a = td["a"]
        td[1] = step * 2
        assert td["a"] is a
        return td

    assert_same(run(rs), run(ref))


def test_preallocation_on_a_locked_tensordict_is_refused() -> None:
    td = rs.TensorDict({}, [4]).lock_()
    with pytest.raises(rs.LockedError):
        td[0] = rs.TensorDict({"a": torch.ones(2)}, [])
    with pytest.raises(RuntimeError):  # as in tensordict
        td[0] = rs.TensorDict({"a": torch.ones(2)}, [])


@pytest.mark.parametrize("inplace", [False, True])
def test_contiguous_canonical_as_tensordict(inplace: bool) -> None:
    # canonical=True copies a leaf whose strides are not row-major, even if is_contiguous()
    def run(pkg: Any) -> Any:
        odd = torch.empty_strided((1, 4, 5), (5, 5, 1))
        odd.copy_(torch.arange(20.0).view(1, 4, 5))
        td = pkg.TensorDict({"x": odd, "n": {"y": odd.clone()}, "z": torch.ones(2, 1)}, [])
        out = td.contiguous(canonical=True, inplace=inplace)
        plain = td.contiguous()
        return (
            out is td,
            {k: (v.stride(), v.tolist()) for k, v in out.items(True, True)},
            plain["z"].stride(),
        )

    assert run(rs) == run(ref)
