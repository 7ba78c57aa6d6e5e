"""Batch indexing: reading and writing rows, views and copies, memory maps, index_select."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tensordict_rs import MemoryMappedTensor, TensorDict

from .._trees import SOURCE_A, file_floats, make_td

# --------------------------------------------------------------------------------- batch indexing

MASK = torch.tensor([True, False, True, True])
MASK2 = torch.tensor([[True, False, True]] * 2 + [[False, False, True]] * 2)

INDEX_CASES = [
    # (index over the batch dims, the same index on a leaf with one extra dim)
    (0, 0),
    (-1, -1),
    (slice(1, 3), slice(1, 3)),
    (slice(None, None, 2), slice(None, None, 2)),
    ((0, 1), (0, 1)),
    ((slice(None), 2), (slice(None), 2)),
    (torch.tensor([0, 2]), torch.tensor([0, 2])),
    (torch.tensor([3, 3, 0]), torch.tensor([3, 3, 0])),
    ([0, 2], torch.tensor([0, 2])),
    (Ellipsis, (slice(None), slice(None))),
    ((Ellipsis, 1), (slice(None), 1)),
    ((1, Ellipsis), (1, slice(None))),
    (None, None),
    ((None, 0), (None, 0)),
    ((0, None), (0, None)),
    (MASK, MASK),
    (MASK2, MASK2),
    ((1, torch.tensor([2, 0])), (1, torch.tensor([2, 0]))),
    (torch.tensor(2), torch.tensor(2)),
    (torch.tensor([[0, 1], [2, 3]]), torch.tensor([[0, 1], [2, 3]])),
    (([0, 2], 1), (torch.tensor([0, 2]), 1)),
    ([True, False, True, False], torch.tensor([True, False, True, False])),
    (torch.tensor([-1, -4]), torch.tensor([-1, -4])),
]


@pytest.mark.parametrize(("index", "leaf_index"), INDEX_CASES, ids=lambda x: repr(x)[:40])
def test_batch_indexing(index, leaf_index) -> None:
    td = make_td()
    out = td[index]
    expected_batch = torch.zeros(4, 3)[leaf_index].shape
    assert isinstance(out, TensorDict)
    assert out.batch_size == expected_batch
    assert torch.equal(out["a"], SOURCE_A[leaf_index])
    assert torch.equal(out["n", "x"], torch.arange(12).reshape(4, 3)[leaf_index])
    deep = torch.arange(60.0).reshape(4, 3, 5)
    assert out["n"].batch_size == expected_batch
    assert out["n", "deep"].batch_size == torch.Size([*expected_batch, 5])
    assert torch.equal(out["n", "deep", "y"], deep[leaf_index])
    assert out["s"] == "text"
    assert out.device == td.device
    assert out.keys(include_nested=True) == td.keys(include_nested=True)


@pytest.mark.parametrize(
    ("index", "leaf_index"),
    [
        (0, 0),
        (slice(1, 3), slice(1, 3)),
        ((1, 2), (1, 2)),
        ((Ellipsis, 0), (slice(None), 0)),
        (None, slice(None)),
    ],
    ids=lambda x: repr(x)[:20],
)
def test_basic_indexing_returns_views(index, leaf_index) -> None:
    td = make_td()
    out = td[index]
    out["a"].fill_(-1.0)
    out["n", "deep", "y"].fill_(-2.0)
    expected_a = SOURCE_A.clone()
    expected_a[leaf_index] = -1.0
    expected_y = torch.arange(60.0).reshape(4, 3, 5)
    expected_y[leaf_index] = -2.0
    assert torch.equal(td["a"], expected_a)
    assert torch.equal(td["n", "deep", "y"], expected_y)


def test_advanced_indexing_copies() -> None:
    td = make_td()
    out = td[torch.tensor([0, 1])]
    out["a"].fill_(-1.0)
    assert torch.equal(td["a"], SOURCE_A)


def test_indexing_without_batch_dims() -> None:
    td = TensorDict({"a": torch.arange(2.0), "n": {"b": torch.zeros(2, 3)}}, [])
    out = td[None]
    assert out.batch_size == torch.Size([1])
    assert out["a"].shape == (1, 2) and out["n", "b"].shape == (1, 2, 3)
    same = td[...]
    assert same.batch_size == torch.Size([])
    assert torch.equal(same["a"], td["a"])


def test_batch_indexing_errors() -> None:
    td = make_td()
    with pytest.raises(IndexError):
        td[0, 0, 0]
    with pytest.raises(IndexError):
        td[4]
    with pytest.raises(IndexError):
        TensorDict({"a": torch.zeros(2)}, [])[0]


def test_indexing_on_device(accel_device: torch.device) -> None:
    td = make_td(device=accel_device)
    for index in (0, slice(0, 2), torch.tensor([1, 3]), MASK):
        out = td[index]
        assert out.device == accel_device
        assert out["a"].device == accel_device
        assert out["a"].shape == SOURCE_A[index].shape


# --------------------------------------------------------------------------------- writing rows


@pytest.mark.parametrize(
    "index",
    [0, slice(1, 3), torch.tensor([3, 0]), [2], MASK, (1, 2), (slice(None), 0)],
    ids=lambda x: repr(x)[:30],
)
def test_setitem_rows(index) -> None:
    td = make_td()
    leaf_index = torch.tensor(index) if isinstance(index, list) else index
    shape = torch.zeros(4, 3)[leaf_index].shape
    value = TensorDict(
        {
            "a": torch.full((*shape, 2), -1.0),
            "n": {
                "x": torch.full(shape, -2),
                "deep": TensorDict({"y": torch.full((*shape, 5), -3.0)}, [*shape, 5]),
            },
        },
        shape,
    )
    a, x, y = td["a"], td["n", "x"], td["n", "deep", "y"]
    td[index] = value
    # In place: the same tensors, with the rows written.
    assert td["a"] is a and td["n", "x"] is x and td["n", "deep", "y"] is y
    expected_a = SOURCE_A.clone()
    expected_a[leaf_index] = -1.0
    expected_x = torch.arange(12).reshape(4, 3)
    expected_x[leaf_index] = -2
    expected_y = torch.arange(60.0).reshape(4, 3, 5)
    expected_y[leaf_index] = -3.0
    assert torch.equal(td["a"], expected_a)
    assert torch.equal(td["n", "x"], expected_x)
    assert torch.equal(td["n", "deep", "y"], expected_y)


def test_setitem_rows_from_dict_and_scalar() -> None:
    td = TensorDict({"a": torch.zeros(3, 2), "n": {"x": torch.zeros(3)}}, [3])
    td[1] = {"a": torch.tensor([1.0, 2.0]), "n": {"x": torch.tensor(5.0)}}
    assert td["a"].tolist() == [[0, 0], [1, 2], [0, 0]]
    assert td["n", "x"].tolist() == [0, 5, 0]
    td[2] = 7.0
    assert td["a"].tolist() == [[0, 0], [1, 2], [7, 7]]
    assert td["n", "x"].tolist() == [0, 5, 7]


def test_setitem_rows_into_memmap_like_buffer(tmp_prefix: Path) -> None:
    td = make_td()
    buffer = td.memmap_like(prefix=tmp_prefix)
    assert buffer.is_locked
    buffer[1:3] = td[1:3]
    buffer[torch.tensor([3])] = td[torch.tensor([3])]
    buffer.flush()
    expected = SOURCE_A.clone()
    expected[0] = 0
    assert torch.equal(buffer["a"], expected)
    assert torch.equal(buffer["n", "deep", "y"][1:], td["n", "deep", "y"][1:])
    assert torch.equal(buffer["n", "deep", "y"][0], torch.zeros(3, 5))
    # The rows reached the files.
    assert file_floats(tmp_prefix / "a.memmap") == expected.flatten().tolist()
    loaded = TensorDict.load_memmap(tmp_prefix)
    assert torch.equal(loaded["n", "x"][1:], td["n", "x"][1:])
    assert torch.equal(loaded["n", "x"][0], torch.zeros(3, dtype=torch.int64))


def test_setitem_rows_into_locked_memmap(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.zeros(4)}, [4]).memmap_(tmp_prefix)
    td[2] = TensorDict({"a": torch.tensor(5.0)}, [])
    td[torch.tensor([True, False, False, True])] = TensorDict({"a": torch.ones(2)}, [2])
    assert td["a"].tolist() == [1.0, 0.0, 5.0, 1.0]
    td.flush()
    assert file_floats(tmp_prefix / "a.memmap") == [1.0, 0.0, 5.0, 1.0]


# --------------------------------------------------------------------------------- indexing memmaps


def test_indexing_memmap_keeps_or_drops_memmap(tmp_prefix: Path) -> None:
    td = make_td().memmap_(tmp_prefix)
    # Rows are views of the maps, but not saved trees themselves: no is_memmap(), no
    # saved_path; locked from the first row, as tensordict's (td[0]; its td[1:] is not).
    for index in (0, slice(1, 3), (0, 1)):
        out = td[index]
        assert not out.is_memmap() and out.is_locked == (index != slice(1, 3))
        with pytest.raises(AttributeError):
            _ = out.saved_path
        assert isinstance(out["a"], MemoryMappedTensor)
        assert out["a"].filename == td["a"].filename
    for row in td.unbind(1):
        assert row.batch_size == torch.Size([4])
        assert not row.is_memmap() and isinstance(row["a"], MemoryMappedTensor)
    advanced = td[torch.tensor([0, 2])]
    assert not advanced.is_memmap()
    assert type(advanced["a"]) is torch.Tensor
    assert torch.equal(advanced["a"], SOURCE_A[[0, 2]])


# --------------------------------------------------------------------------------- index_select


def test_index_select() -> None:
    td = make_td()
    index = torch.tensor([3, 0, 3])
    out = td.index_select(0, index)
    assert out.batch_size == torch.Size([3, 3])
    assert torch.equal(out["a"], SOURCE_A[index])
    assert torch.equal(out["n", "deep", "y"], torch.arange(60.0).reshape(4, 3, 5)[index])
    assert out["n", "deep"].batch_size == torch.Size([3, 3, 5])
    assert out["s"] == "text"
    cols = td.index_select(1, torch.tensor([2], dtype=torch.int32))
    assert cols.batch_size == torch.Size([4, 1])
    assert torch.equal(cols["a"], SOURCE_A[:, [2]])
    last = td.index_select(-1, torch.tensor([0, 1]))
    assert last.batch_size == torch.Size([4, 2])
    assert torch.equal(last["n", "x"], torch.arange(12).reshape(4, 3)[:, :2])


def test_index_select_out(tmp_prefix: Path) -> None:
    td = make_td().memmap_(tmp_prefix)
    out = make_td()[:2].clone()
    a, y = out["a"], out["n", "deep", "y"]
    result = td.index_select(0, torch.tensor([3, 1]), out=out)
    assert result is out
    assert out["a"] is a and out["n", "deep", "y"] is y
    assert torch.equal(a, SOURCE_A[[3, 1]])
    assert torch.equal(y, torch.arange(60.0).reshape(4, 3, 5)[[3, 1]])
    assert torch.equal(out["n", "x"], torch.arange(12).reshape(4, 3)[[3, 1]])


def test_names_after_advanced_indexing_as_the_reference() -> None:
    """Names after index tensors follow torch's placement of their dims (in place when only
    ints lie between them, else first): as tensordict 0.15.3, and one name per batch dim
    always (two 1-d index tensors gave 4 names to a tree of 3 dims)."""
    import tensordict
    import tensordict_rs

    x = torch.zeros(4, 3, 2, 1)
    i2 = torch.tensor([[0, 1, 2], [1, 2, 0], [2, 0, 1]])
    i1 = torch.tensor([0, 1])
    m2 = torch.ones(4, 3, dtype=torch.bool)
    m1 = torch.tensor([True, False, True])
    cases = [
        (slice(None), i2), (0, i2), (..., i2, slice(None), slice(None)), (m2,),
        (slice(None), i1), (i1, i1), (i1, 0, i1), (slice(None), m1), (None, i1),
        (i1, None, i1), (i1, i1, 0, 0),
    ]  # fmt: skip
    for idx in cases:
        got = []
        for P in (tensordict, tensordict_rs):
            td = P.TensorDict({"x": x.clone()}, [4, 3, 2, 1], names=["a", "b", "c", "d"])
            out = td[idx]
            assert out.batch_size == x[idx].shape, idx
            got.append(out.names)
        assert got[0] == got[1], idx
    # index tensors apart: their broadcast dims go first, named as tensordict names the
    # dims of the advanced block (a dim along which only the index of "a" varies is "a")
    td = TensorDict({"x": x}, [4, 3, 2, 1], names=["a", "b", "c", "d"])
    assert td[i2[:2, :2], :, i1].names == ["a", None, "b", "d"]
    ref_td = tensordict.TensorDict({"x": x}, [4, 3, 2, 1], names=["a", "b", "c", "d"])
    assert ref_td[i2[:2, :2], :, i1].names == ["a", None, "b", "d"]


def test_first_class_dims_as_the_reference(tmp_prefix: Path) -> None:
    """A first-class dimension (``functorch.dim``) takes its batch dim out, names included, as
    tensordict 0.15.3 (the names were dropped); a memory-mapped tree takes it too, where
    tensordict raises ``ValueError``."""
    import tensordict
    import tensordict_rs
    from functorch import dim as ftdim

    x = torch.randn(4, 3, 2, 1)
    for pick in (
        lambda d: (d[0],),
        lambda d: (d[0], d[1]),
        lambda d: (d[0], d[1], d[2]),
        lambda d: (slice(None), d[0]),
    ):
        got = []
        for P in (tensordict, tensordict_rs):
            td = P.TensorDict({"x": x}, [4, 3, 2, 1], names=["a", "b", "c", "d"])
            dims = ftdim.dims(3)
            out = td[pick(dims)]
            got.append((out.batch_size, out.names, out["x"].shape))
        assert got[0] == got[1], got
    memmap = TensorDict({"x": x}, [4, 3, 2, 1]).memmap_(tmp_prefix)
    d0 = ftdim.dims(1)
    assert torch.equal(memmap[d0]["x"].order(d0), x)


def _names_after_index(pkg: object, index: object) -> tuple[object, object]:
    td = pkg.TensorDict({"a": torch.zeros(3, 4, 5)}, [3, 4, 5], names=["x", "y", "z"])  # type: ignore[attr-defined]
    out = td[index]
    return out.batch_size, out.names


@pytest.mark.parametrize(
    "index",
    [
        np.int64(1),
        (np.int32(1), slice(None)),
        (slice(None), np.array([0, 1])),
        np.array([True, False, True]),
        np.ones((3, 4), dtype=bool),
        (np.array([0, 1]), 1),
        (Ellipsis, np.array([0, 1])),
        np.array([[0, 1]]),
        torch.tensor([[0, 1]]),
        (torch.tensor([[0], [1]]), torch.tensor([[0, 1, 2]])),
        (torch.tensor([0, 1]), slice(None), torch.tensor([[1], [2]])),
    ],
)
def test_index_names_numpy_and_nd_as_tensordict(index: object) -> None:
    # numpy indices name dims as tensors do; an N-d index keeps its dim's name on one dim
    import tensordict as ref
    import tensordict_rs as ours

    assert _names_after_index(ours, index) == _names_after_index(ref, index)


@pytest.mark.parametrize("mode", ["plain", "shared", "memmap", "memmap unlocked"])
def test_views_of_locked_shared_and_memmap_trees_lock_as_tensordict(
    mode: str, tmp_path: Path
) -> None:
    # a key added to a view of a locked shared or memory-mapped tree reached no tree (the view
    # was unlocked); tensordict locks its views from the first row
    views = {
        "td[0]": lambda t: t[0],
        "unbind": lambda t: t.unbind(1)[0],
        "td[:2]": lambda t: t[:2],
        "td[1:]": lambda t: t[1:],
        "td[0, 1:]": lambda t: t[0, 1:],
        "split": lambda t: t.split(1, 0)[0],
    }

    def run(lib: Any, where: Path) -> dict[str, bool]:
        td = lib.TensorDict({"a": torch.zeros(3, 4), "n": {"b": torch.zeros(3, 4, 2)}}, [3, 4])
        td.lock_()
        if mode == "shared":
            td.share_memory_()
        elif mode.startswith("memmap"):
            td.memmap_(where)
            if mode.endswith("unlocked"):
                td.unlock_()
        out = {}
        for name, view in views.items():
            v = view(td)
            try:
                v["new"] = torch.zeros(v.shape)
                out[name] = "new" in td.keys()  # False: the key reached no tree
            except RuntimeError:
                out[name] = True  # refused
        return out

    import tensordict
    import tensordict_rs

    assert run(tensordict_rs, tmp_path / "mine") == run(tensordict, tmp_path / "ref")
