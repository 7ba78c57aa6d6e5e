"""torch functions on TensorDicts (``__torch_function__``), side by side with tensordict 0.15.3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as ours
import torch
from tensordict_rs import MemoryMappedTensor, TensorDict


def build(pkg: Any, offset: float = 0.0, lock: bool = False) -> Any:
    """batch [3, 2]: a float leaf with an extra dim, an int leaf, a nested td, a string."""
    td = pkg.TensorDict(
        {
            "a": torch.arange(12, dtype=torch.float32).reshape(3, 2, 2) + offset,
            "i": torch.arange(6).reshape(3, 2) + int(offset),
            "n": {"y": torch.ones(3, 2, 4) * offset},
        },
        [3, 2],
    )
    return td.lock_() if lock else td


def assert_same(mine: Any, theirs: Any) -> None:
    """Same structure, batch sizes, lock, keys, dtypes, shapes and values."""
    if isinstance(theirs, (tuple, list)):
        assert len(mine) == len(theirs)
        for m, t in zip(mine, theirs, strict=True):
            assert_same(m, t)
        return
    assert isinstance(mine, TensorDict), type(mine)
    assert mine.batch_size == theirs.batch_size
    assert mine.is_locked == theirs.is_locked
    assert mine.device == theirs.device
    keys = list(theirs.keys(include_nested=True, leaves_only=True))
    assert mine.keys(include_nested=True, leaves_only=True) == keys
    for key in keys:
        m, t = mine[key], theirs[key]
        assert (m.dtype, m.shape, m.device) == (t.dtype, t.shape, t.device), key
        if m.device.type != "meta":
            assert torch.equal(m, t), key


def pair(pkg: Any, lock: bool = False) -> tuple[Any, Any]:
    return build(pkg, 0.0, lock), build(pkg, 100.0, lock)


CALLS = {
    "stack": lambda a, b: torch.stack([a, b]),
    "stack_dim1": lambda a, b: torch.stack([a, b], 1),
    "stack_dim2": lambda a, b: torch.stack([a, b], dim=2),
    "stack_neg": lambda a, b: torch.stack([a, b], -1),
    "stack_three": lambda a, b: torch.stack([a, b, a]),
    "cat": lambda a, b: torch.cat([a, b]),
    "cat_dim1": lambda a, b: torch.cat([a, b], dim=1),
    "cat_neg": lambda a, b: torch.cat((a, b, b), -1),
    "unbind": lambda a, b: torch.unbind(a, 0),
    "unbind1": lambda a, b: torch.unbind(a, 1),
    "split": lambda a, b: torch.split(a, 2),
    "split_list_dim1": lambda a, b: torch.split(a, [1, 1], 1),
    "chunk": lambda a, b: torch.chunk(a, 2),
    "clone": lambda a, b: torch.clone(a),
    "zeros_like": lambda a, b: torch.zeros_like(a),
    "ones_like": lambda a, b: torch.ones_like(a),
    "ones_like_dtype": lambda a, b: torch.ones_like(a, dtype=torch.float64),
    "full_like": lambda a, b: torch.full_like(a, 7),
    "empty_like_shape": lambda a, b: torch.zeros_like(torch.empty_like(a)),
    "where_td": lambda a, b: torch.where(torch.tensor([True, False, True]).unsqueeze(1), a, b),
    "where_full_mask": lambda a, b: torch.where(torch.rand(3, 2) > 2, a, b),
    "where_scalar": lambda a, b: torch.where(torch.tensor([[True, False]] * 3), a, 0),
    "where_scalar_first": lambda a, b: torch.where(torch.tensor([[True, False]] * 3), -1, a),
    "where_method": lambda a, b: a.where(torch.tensor([False, True, True]).unsqueeze(1), b),
    "squeeze": lambda a, b: torch.squeeze(a.unsqueeze(0), 0),
    "unsqueeze": lambda a, b: torch.unsqueeze(a, 1),
    "permute": lambda a, b: torch.permute(a, (1, 0)),
    "transpose": lambda a, b: torch.transpose(a, 0, 1),
    "reshape": lambda a, b: torch.reshape(a, (6,)),
    "flatten": lambda a, b: torch.flatten(a, 0, 1),
    "unflatten": lambda a, b: torch.unflatten(a, 1, (2, 1)),
}


@pytest.mark.parametrize("lock", [False, True], ids=["unlocked", "locked"])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_torch_function_matches_reference(name: str, lock: bool) -> None:
    call = CALLS[name]
    assert_same(call(*pair(ours, lock)), call(*pair(ref, lock)))


def test_stack_and_cat_results_are_dense_tensordicts() -> None:
    # tensordict 0.15 stacks densely by default (no LazyStackedTensorDict); so do we
    theirs = torch.stack(list(pair(ref)))
    assert type(theirs) is ref.TensorDict
    mine = torch.stack(list(pair(ours)))
    assert type(mine) is TensorDict
    mine["a"][0, 0, 0, 0] = -1.0  # a dense copy: the inputs are not changed
    assert build(ours)["a"][0, 0, 0] == 0.0


def test_non_tensor_values_stack_and_cat_as_in_reference() -> None:
    """As tensordict 0.15: stacking gives one value per element (a NonTensorStack, equal values
    too); concatenating equal values keeps one NonTensorData, different ones give a stack."""
    for same in (True, False):
        results = []
        for pkg in (ours, ref):
            a, b = pair(pkg)
            a["s"] = "same"
            b["s"] = "same" if same else "other"
            stacked, joined = torch.stack([a, b]).get("s"), torch.cat([a, b]).get("s")
            results.append(
                (
                    type(stacked).__name__,
                    stacked.tolist(),
                    type(joined).__name__,
                    joined.tolist(),
                )
            )
        assert results[0] == results[1]


ERRORS = {
    "stack_empty": lambda a, b: torch.stack([]),
    "stack_batch_mismatch": lambda a, b: torch.stack([a, b[:2]]),
    "stack_keys_mismatch": lambda a, b: torch.stack([a, b.exclude("i")]),
    "cat_dim_out_of_range": lambda a, b: torch.cat([a, b], 2),
    "cat_keys_mismatch": lambda a, b: torch.cat([a, b.exclude("i")]),
    "logdet_not_handled": lambda a, b: torch.logdet(a),
    "where_tensordict_condition": lambda a, b: a.where(b, 0.0),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_torch_function_errors_match_reference(name: str) -> None:
    call = ERRORS[name]
    with pytest.raises(Exception) as theirs:
        call(*pair(ref))
    with pytest.raises(type(theirs.value)):
        call(*pair(ours))


def test_equal_and_allclose() -> None:
    # tensordict 0.15.3 raises TypeError for both; we answer like torch does for tensors.
    a, b = pair(ours)
    with pytest.raises(TypeError):
        torch.equal(*pair(ref))
    assert torch.equal(a, a.clone()) and not torch.equal(a, b)
    assert not torch.equal(a, a.exclude("i")) and not torch.equal(a, a[:2])
    close = a.clone()
    close["a"] *= 1 + 1e-6
    assert torch.allclose(a, close) and not torch.equal(a, close)
    assert not torch.allclose(a, b)
    assert torch.allclose(a, b, atol=1000)


@pytest.mark.parametrize("op", ["stack", "cat"])
def test_into_memory_mapped_out(tmp_path: Path, op: str) -> None:
    a, b = pair(ours)
    like = torch.stack([a, b]) if op == "stack" else torch.cat([a, b])
    out = torch.zeros_like(like).memmap_(tmp_path / "out")
    assert out.is_locked
    fn = torch.stack if op == "stack" else torch.cat
    result = fn([a, b], out=out)
    assert result is out
    assert isinstance(out["a"], MemoryMappedTensor) and out.is_memmap()
    theirs = fn(list(pair(ref)))
    for key in theirs.keys(include_nested=True, leaves_only=True):
        assert torch.equal(out[key], theirs[key])
    # the values went into the files
    loaded = TensorDict.load_memmap(tmp_path / "out")
    for key in theirs.keys(include_nested=True, leaves_only=True):
        assert torch.equal(loaded[key], theirs[key])


def test_into_plain_out_matches_reference() -> None:
    mine_out = torch.zeros_like(torch.cat(list(pair(ours))))
    ref_out = torch.zeros_like(torch.cat(list(pair(ref))))
    assert torch.cat(list(pair(ours)), out=mine_out) is mine_out
    assert torch.cat(list(pair(ref)), out=ref_out) is ref_out
    assert_same(mine_out, ref_out)


def test_out_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    a, b = pair(ours)
    out = torch.zeros_like(torch.cat([a, b, b])).memmap_(tmp_path / "out")
    with pytest.raises(RuntimeError, match="batch size"):
        torch.cat([a, b], out=out)
    wrong = torch.cat([a, b])
    wrong.set("a", torch.zeros(6, 2, 3))
    with pytest.raises(RuntimeError, match="shape"):
        torch.stack([a, b], out=torch.zeros_like(torch.stack([a, b])).set("a", wrong["a"][:2]))


def test_preallocated_buffer_idiom(tmp_path: Path) -> None:
    """The documented replay-buffer idioms: expand + memmap_like, then stack/cat into it."""
    step = TensorDict({"obs": torch.zeros(4), "reward": torch.zeros(())}, [])
    buffer = step.expand(6).memmap_like(tmp_path / "buf")
    steps = [
        TensorDict({"obs": torch.full((4,), float(i)), "reward": torch.tensor(i * 0.5)}, [])
        for i in range(6)
    ]
    torch.stack(steps, out=buffer)
    reopened = TensorDict.load_memmap(tmp_path / "buf")
    assert torch.equal(reopened["obs"][:, 0], torch.arange(6.0))
    assert torch.equal(reopened["reward"], torch.arange(6.0) * 0.5)
    grown = torch.cat([reopened, torch.stack(steps[:2])]).memmap_(tmp_path / "grown")
    assert grown.batch_size == torch.Size([8])


def test_device_of_results(accel_device: torch.device) -> None:
    a, b = pair(ours)
    moved = torch.zeros_like(a, device=accel_device)
    assert moved.device == accel_device and moved["a"].device == accel_device
    on_device = a.to(accel_device)
    assert torch.stack([on_device, b.to(accel_device)]).device == accel_device
    assert torch.cat([on_device.clear_device_(), b.to(accel_device)]).device is None


@pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8")
def test_uint8_index_get_at_and_where_pad_like_the_reference(tmp_path: Path) -> None:
    """Three differences an attack found, each silent or a crash where tensordict runs:
    a uint8 index tensor read rows as integers (torch and tensordict take it as a mask, as
    writes here did); get_at of a missing key raised KeyError (tensordict: None); where(pad=)
    promoted the leaves (a bool leaf padded with 5 became int64)."""
    idx = torch.tensor([1, 0, 1, 0], dtype=torch.uint8)
    for pkg in (ours, ref):
        for saved in (False, True):
            td = pkg.TensorDict({"x": torch.arange(4.0)}, [4])
            if saved:
                td = td.memmap_(tmp_path / f"{pkg.__name__}-{saved}")
            assert td[idx]["x"].tolist() == [0.0, 2.0], pkg
        td = pkg.TensorDict({"x": torch.arange(3), "n": {"y": torch.zeros(3)}}, [3])
        assert td.get_at("missing", 1) is None and td.get_at(("n", "z"), 1) is None, pkg
        assert td.get_at("missing", 1, default=-1) == -1, pkg
        leaves = {
            "done": torch.zeros(4, dtype=torch.bool),
            "i": torch.zeros(4, dtype=torch.int32),
            "f": torch.zeros(4),
        }
        td = pkg.TensorDict(leaves, [4])
        other = pkg.TensorDict({"f": torch.ones(4)}, [4])
        cond = torch.tensor([True, False, True, False])
        for pad, ints in ((5, [0, 5] * 2), (0.5, [0] * 4)):
            out = td.where(cond, other, pad=pad)
            assert out["done"].dtype == torch.bool, pkg
            assert out["done"].tolist() == [False, True] * 2, pkg
            assert out["i"].dtype == torch.int32 and out["i"].tolist() == ints, pkg


def test_stack_and_cat_into_an_out_with_more_keys(tmp_path: Path) -> None:
    """torch.stack/cat(out=buffer) with steps that carry fewer keys than the buffer raised
    KeyError; as tensordict, the steps' keys are written and the buffer's others left alone."""
    for pkg in (ours, ref):
        for saved in (False, True):
            buf = pkg.TensorDict({"obs": torch.zeros(4, 2), "info": torch.full((4,), 7.0)}, [4])
            if saved:
                buf = buf.memmap_(tmp_path / f"{pkg.__name__}-{saved}")
            steps = [pkg.TensorDict({"obs": torch.full((2,), float(i))}, []) for i in (1, 2)]
            torch.stack(steps, out=buf[0:2])
            assert buf["obs"][:, 0].tolist() == [1.0, 2.0, 0.0, 0.0], pkg
            torch.cat([pkg.TensorDict({"obs": torch.ones(4, 2)}, [4])], 0, out=buf)
            assert buf["obs"].eq(1).all() and buf["info"].eq(7).all(), pkg
    # a key of the steps that the buffer lacks is refused here (tensordict drops it silently:
    # docs/reference/differences.md)
    more = [TensorDict({"obs": torch.zeros(2), "new": torch.zeros(1)}, [])] * 4
    with pytest.raises(KeyError, match="new"):
        torch.stack(more, out=TensorDict({"obs": torch.zeros(4, 2)}, [4]))


def test_stack_and_where_names_as_tensordict() -> None:
    # stack keeps the names only when all the TensorDicts have the same; where keeps td's
    def run(pkg: Any) -> Any:
        def make(names: Any) -> Any:
            return pkg.TensorDict(
                {"a": torch.zeros(3, 4), "n": {"b": torch.ones(3, 4)}}, [3, 4], names=names
            )

        xy, xz, none = make(["x", "y"]), make(["x", "z"]), make(None)
        cond = torch.tensor([[True, False, True, False]] * 3)
        return (
            torch.stack([xy, xz]).names,
            torch.stack([xy, none]).names,
            torch.stack([none, xy], 1).names,
            torch.stack([xy, make(["x", "y"])], 1).names,
            torch.stack([xy, make(["x", "y"])])["n"].names,
            xy.where(cond, xz).names,
            xy.where(cond, xz)["n"].names,
            none.where(cond, xy).names,
        )

    assert run(ours) == run(ref)
