"""Batch-shape operations, side by side with tensordict 0.15.3 (same input, both packages)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as ours
import torch
from tensordict_rs import MemoryMappedTensor, TensorDict


def build(pkg: Any, lock: bool = False) -> Any:
    """batch [4, 3]: a leaf with an extra dim, a nested td with an extra batch dim, a string."""
    td = pkg.TensorDict(
        {
            "a": torch.arange(24, dtype=torch.float32).reshape(4, 3, 2),
            "n": pkg.TensorDict(
                {"x": torch.arange(12).view(4, 3), "deep": {"y": torch.arange(60).view(4, 3, 5)}},
                [4, 3],
            ),
        },
        [4, 3],
    )
    return td.lock_() if lock else td


def assert_same(mine: Any, theirs: Any) -> None:
    """Same type kind, batch size, keys (in order), dtypes, shapes and values."""
    if isinstance(theirs, (tuple, list)):
        assert type(mine) is type(theirs) and len(mine) == len(theirs)
        for m, t in zip(mine, theirs, strict=True):
            assert_same(m, t)
        return
    assert isinstance(mine, TensorDict)
    assert mine.batch_size == theirs.batch_size
    assert mine.is_locked == theirs.is_locked
    keys = list(theirs.keys(include_nested=True, leaves_only=True))
    assert mine.keys(include_nested=True, leaves_only=True) == keys
    for key in keys:
        m, t = mine[key], theirs[key]
        assert m.dtype == t.dtype and m.shape == t.shape
        assert torch.equal(m, t), key
    for key in theirs.keys(include_nested=True):
        if isinstance(theirs[key], ref.TensorDict):
            assert mine[key].batch_size == theirs[key].batch_size, key


SHAPE_OPS = {
    "expand": lambda td: td.expand(2, 4, 3),
    "expand_size": lambda td: td.expand(torch.Size([5, 4, 3])),
    "expand_minus_one": lambda td: td.expand(2, -1, -1),
    "reshape": lambda td: td.reshape(12),
    "reshape_minus_one": lambda td: td.reshape(-1, 2),
    "reshape_tuple": lambda td: td.reshape((3, 4)),
    "view": lambda td: td.view(2, 6),
    "view_minus_one": lambda td: td.view(-1),
    "squeeze_none": lambda td: td.unsqueeze(1).squeeze(),
    "squeeze_dim": lambda td: td.unsqueeze(0).squeeze(0),
    "squeeze_not_one": lambda td: td.squeeze(1),
    "unsqueeze0": lambda td: td.unsqueeze(0),
    "unsqueeze_last": lambda td: td.unsqueeze(-1),
    "unsqueeze_mid": lambda td: td.unsqueeze(1),
    "permute": lambda td: td.permute(1, 0),
    "permute_list": lambda td: td.permute([-1, 0]),
    "transpose": lambda td: td.transpose(0, 1),
    "transpose_neg": lambda td: td.transpose(-1, -2),
    "flatten": lambda td: td.flatten(0, 1),
    "flatten_default": lambda td: td.flatten(),
    "unflatten": lambda td: td.unflatten(0, (2, 2)),
    "unflatten_minus_one": lambda td: td.unflatten(1, (-1, 1)),
    "split": lambda td: td.split(3),
    "split_list": lambda td: td.split([1, 3]),
    "split_dim1": lambda td: td.split(2, 1),
    "split_neg_dim": lambda td: td.split([1, 2], -1),
    "chunk": lambda td: td.chunk(3),
    "chunk_dim1": lambda td: td.chunk(2, dim=1),
    "unbind0": lambda td: td.unbind(0),
    "unbind1": lambda td: td.unbind(1),
    "iter": lambda td: tuple(td),
    "index_then_expand": lambda td: td[0].expand(7, 3),
    "swapaxes": lambda td: td.swapaxes(0, 1),
    "flatten_0d": lambda td: td[0, 0].flatten(),
    "view_dtype": lambda td: td.view(torch.uint8, batch_size=[]),
    "flatten_inplace": lambda td: td.unlock_().flatten(0, 1, inplace=True),
    "unflatten_inplace": lambda td: td.unlock_().unflatten(0, (2, 2), inplace=True),
}


@pytest.mark.parametrize("lock", [False, True], ids=["unlocked", "locked"])
@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_shape_op_matches_reference(name: str, lock: bool) -> None:
    op = SHAPE_OPS[name]
    assert_same(op(build(ours, lock)), op(build(ref, lock)))


SHAPE_ERRORS = {
    "expand_fewer_dims": lambda td: td.expand(3),
    "expand_bad_size": lambda td: td.expand(5, 3),
    "reshape_bad": lambda td: td.reshape(5),
    "view_bad": lambda td: td.view(7),
    "unsqueeze_out_of_range": lambda td: td.unsqueeze(3),
    "squeeze_out_of_range": lambda td: td.squeeze(2),
    "transpose_out_of_range": lambda td: td.transpose(0, 2),
    "split_bad_sizes": lambda td: td.split([1, 2]),
    "split_negative": lambda td: td.split(-1),
    "split_type": lambda td: td.split("a"),
    "chunk_zero": lambda td: td.chunk(0),
    "unbind_out_of_range": lambda td: td.unbind(2),
    "unflatten_bad": lambda td: td.unflatten(0, (3, 3)),
    "permute_repeated": lambda td: td.permute(1, 1),
    "permute_too_many": lambda td: td.permute(2, 1, 0),
    "flatten_inplace_locked": lambda td: td.lock_().flatten(0, 1, inplace=True),
}


@pytest.mark.parametrize("name", sorted(SHAPE_ERRORS))
def test_shape_errors_match_reference(name: str) -> None:
    op = SHAPE_ERRORS[name]
    with pytest.raises(Exception) as theirs:
        op(build(ref))
    with pytest.raises(type(theirs.value)):
        op(build(ours))


def test_views_share_memory() -> None:
    td = build(ours)
    for view in (td.expand(2, 4, 3), td.view(12), td.permute(1, 0), td.unsqueeze(0)):
        assert view["a"].untyped_storage().data_ptr() == td["a"].untyped_storage().data_ptr()
    td.view(12)["a"][0, 0] = -1.0
    assert td["a"][0, 0, 0] == -1.0
    td.split(2)[1]["n", "x"][0, 0] = -5
    assert td["n", "x"][2, 0] == -5


def test_views_of_memory_maps_stay_maps(tmp_path: Path) -> None:
    td = build(ours).memmap_(tmp_path / "td")
    for piece in (*td.split(2), *td.chunk(2), td.unbind(0)[1], next(iter(td))):
        assert isinstance(piece["a"], MemoryMappedTensor)
        assert piece["a"].filename == td["a"].filename
        # A view of a saved tree is not itself a saved tree.
        assert not piece.is_memmap()
    td.view(12)["a"][5] = 7.0
    loaded = TensorDict.load_memmap(tmp_path / "td")
    assert torch.equal(loaded["a"].view(12, 2)[5], torch.tensor([7.0, 7.0]))


def test_slices_of_locked_and_memmap_trees_are_plain(tmp_path: Path) -> None:
    mine = build(ours).memmap_(tmp_path / "mine")
    theirs = build(ref).memmap_(tmp_path / "theirs")
    for index in (slice(1, None), torch.tensor([0, 2]), torch.tensor([True, False, True, True])):
        m, t = mine[index], theirs[index]
        assert m.is_locked == t.is_locked is False
        assert m.is_memmap() == t.is_memmap() is False
        with pytest.raises(AttributeError):
            _ = m.saved_path
        assert_same(m, t)
    locked_mine, locked_theirs = build(ours, lock=True), build(ref, lock=True)
    for index in (0, slice(1, None), (slice(None), 1)):
        assert locked_mine[index].is_locked == locked_theirs[index].is_locked is False


def test_dim_ndim_names() -> None:
    mine, theirs = build(ours), build(ref)
    assert mine.dim() == theirs.dim() == 2
    assert mine.ndim == theirs.ndim == 2
    assert mine.names == theirs.names == [None, None]
    mine.names = None
    mine.names = [None, None]
    mine.names = ["time", None]  # named dims (issue 23), as the reference
    theirs.names = ["time", None]
    assert mine.names == theirs.names == ["time", None]


def test_iterating_a_0d_tensordict_raises_like_the_reference() -> None:
    with pytest.raises(TypeError):
        iter(ref.TensorDict({"a": torch.zeros(())}, []))
    with pytest.raises(TypeError):
        iter(ours.TensorDict({"a": torch.zeros(())}, []))


def test_inplace_flatten_is_the_same_object() -> None:
    td = build(ours)
    assert td.flatten(0, 1, inplace=True) is td and td.batch_size == torch.Size([12])
    assert td.unflatten(0, (3, 4), inplace=True) is td and td["n", "x"].shape == (3, 4)


@pytest.mark.parametrize("mask_key", [None, "mask", ("n", "mask")])
def test_to_padded_tensor_ragged_batch_as_tensordict(mask_key: Any) -> None:
    # a -1 batch dim gets its size from the padded leaves; mask_key writes the valid elements
    import warnings

    def run(pkg: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nested = torch.nested.nested_tensor([torch.ones(3, 4, 5), torch.ones(3, 6, 5)])
            td = pkg.TensorDict({"nested": nested}, batch_size=[2, 3, -1])
            out = td.to_padded_tensor(padding=0, mask_key=mask_key)
        leaves = {k: (v.shape, v.tolist()) for k, v in out.items(True, True)}
        return out.batch_size, out.names, leaves

    assert run(ours) == run(ref)


@pytest.mark.parametrize("dims", [(0, 1, 5), (0, 1, -4), (3, 1, 0), (0, 0, 1), (2, 2, 2)])
def test_permute_invalid_permutation_is_value_error_as_tensordict(dims: Any) -> None:
    """A permutation with a dim out of range (or repeated) raised IndexError here; tensordict
    raises ValueError for any invalid permutation: TensorDict, tensorclass and a stack of
    strings alike."""

    @ours.tensorclass
    class Mine:
        x: torch.Tensor

    @ref.tensorclass
    class Theirs:
        x: torch.Tensor

    for pkg, cls in ((ours, Mine), (ref, Theirs)):
        td = pkg.TensorDict({"a": torch.zeros(2, 3, 4)}, [2, 3, 4])
        with pytest.raises(ValueError):
            td.permute(*dims)
        with pytest.raises(ValueError):
            td.permute(dims)
        tc = cls(x=torch.zeros(2, 3, 4), batch_size=[2, 3, 4])
        with pytest.raises(ValueError):
            tc.permute(*dims)
    stack = ours.NonTensorStack.from_list([[["a"] * 4] * 3] * 2)
    with pytest.raises(ValueError):
        stack.permute(*dims)
    assert stack.permute(2, 0, 1).batch_size == torch.Size([4, 2, 3])


@pytest.mark.parametrize(("dim", "sizes"), [(0, (3, 1)), (1, (2, 2)), (2, (5,)), (-1, (1, 5, 1))])
def test_unflatten_names_as_tensordict(dim: int, sizes: tuple[int, ...]) -> None:
    def make(lib: Any) -> Any:
        td = lib.TensorDict({"x": torch.zeros(3, 4, 5)}, [3, 4, 5])
        td.names = ["first", "second", "third"]
        return td.unflatten(dim, sizes)

    got, want = make(ours), make(ref)
    assert got.batch_size == want.batch_size
    assert got.names == want.names
