"""TensorDict: construction, entries, batch indexing, devices, locking, memory maps, repr."""

from __future__ import annotations

import json
import multiprocessing
import pickle
import re
from pathlib import Path

import pytest
import torch
from tensordict_rs import MemoryMappedTensor, NonTensorData, TensorDict, TensorDictFuture

CPU = torch.device("cpu")
META = torch.device("meta")
LOCK_ERROR = (
    "Cannot modify locked TensorDict. For in-place modification, consider using the `set_()` "
    "method and make sure the key is present."
)


def locked_error():
    """``pytest.raises`` for the exact lock error of tensordict."""
    return pytest.raises(RuntimeError, match=f"^{re.escape(LOCK_ERROR)}$")


def make_td(device=None) -> TensorDict:
    """batch [4, 3]: a float leaf with an extra dim, a nested td with a deeper nested one that
    has an extra batch dim, and a string."""
    return TensorDict(
        {
            "a": torch.arange(24, dtype=torch.float32).reshape(4, 3, 2),
            "n": {
                "x": torch.arange(12).reshape(4, 3),
                "deep": TensorDict({"y": torch.arange(60.0).reshape(4, 3, 5)}, [4, 3, 5]),
            },
            "s": "text",
        },
        [4, 3],
        device=device,
    )


def file_floats(path: Path) -> list[float]:
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.float32).tolist()


# --------------------------------------------------------------------------------- constructor


def test_constructor_nested_dicts_become_tensordicts() -> None:
    td = make_td()
    assert td.batch_size == torch.Size([4, 3])
    assert td.device is None
    assert isinstance(td["n"], TensorDict)
    assert td["n"].batch_size == torch.Size([4, 3])
    assert td["n", "deep"].batch_size == torch.Size([4, 3, 5])
    assert torch.equal(td["n", "x"], torch.arange(12).reshape(4, 3))
    assert td["s"] == "text"
    assert td.shape == td.batch_size
    assert td.batch_dims == 2 and td.ndim == 2
    assert td.numel() == 12


@pytest.mark.parametrize("batch_size", [[3], (3,), torch.Size([3])])
def test_constructor_batch_size_forms(batch_size) -> None:
    td = TensorDict({"a": torch.zeros(3, 2)}, batch_size)
    assert td.batch_size == torch.Size([3])
    assert isinstance(td.batch_size, torch.Size)


def test_constructor_defaults() -> None:
    td = TensorDict({"a": torch.zeros(3, 2)})
    assert td.batch_size == torch.Size([])
    assert td.device is None
    assert not td.is_locked
    empty = TensorDict()
    assert empty.keys() == [] and empty.batch_size == torch.Size([])
    assert TensorDict(batch_size=[5]).batch_size == torch.Size([5])


@pytest.mark.parametrize(
    ("source", "batch_size", "key"),
    [
        ({"a": torch.zeros(3, 4)}, [4], "a"),
        ({"a": torch.zeros(3)}, [3, 1], "a"),
        ({"a": torch.zeros(3)}, [2], "a"),
        ({"ok": torch.zeros(2), "bad": torch.zeros(3)}, [2], "bad"),
        ({"n": {"b": torch.zeros(3, 4)}}, [4], "b"),
        ({"n": TensorDict({"b": torch.zeros(5)}, [5])}, [4], "n"),
    ],
)
def test_constructor_batch_size_mismatch(source, batch_size, key) -> None:
    with pytest.raises(RuntimeError, match=rf"batch dimension mismatch.*{key}"):
        TensorDict(source, batch_size)


def test_constructor_python_scalars_and_strings() -> None:
    td = TensorDict({"f": 1.5, "i": 3, "b": True, "s": "hello"}, [])
    assert torch.equal(td["f"], torch.tensor(1.5))
    assert td["f"].dtype == torch.float32
    assert torch.equal(td["i"], torch.tensor(3))
    assert td["i"].dtype == torch.int64
    assert torch.equal(td["b"], torch.tensor(True))
    assert td["s"] == "hello"
    assert TensorDict({"s": "hello"}, [4])["s"] == "hello"


def test_constructor_device_moves_entries(accel_device: torch.device) -> None:
    a = torch.rand(3, 2)
    td = TensorDict({"a": a, "n": {"x": torch.zeros(3)}}, [3], device=accel_device)
    assert td.device == accel_device
    assert td["a"].device == accel_device
    assert td["n"].device == accel_device
    assert td["n", "x"].device == accel_device
    assert a.device == CPU
    # Later entries move too, nested dicts included.
    td["b"] = torch.zeros(3)
    td["m"] = {"y": torch.zeros(3, 1)}
    td.set(("n", "z"), torch.ones(3))
    for key in ("b", ("m", "y"), ("n", "z")):
        assert td[key].device == accel_device
    assert td["m"].device == accel_device


def test_constructor_device_moves_tensordict_values(accel_device: torch.device) -> None:
    sub = TensorDict({"x": torch.zeros(3)}, [3])
    td = TensorDict({"sub": sub}, [3], device=accel_device)
    assert td["sub"].device == accel_device
    assert td["sub", "x"].device == accel_device
    assert sub.device is None and sub["x"].device == CPU


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("cpu", torch.device("cpu")),
        ("cpu:0", torch.device("cpu:0")),
        (torch.device("cpu"), torch.device("cpu")),
        ("meta", torch.device("meta")),
    ],
)
def test_constructor_device_normalized(given, expected) -> None:
    td = TensorDict({"a": torch.zeros(2)}, [2], device=given)
    assert td.device == expected
    assert isinstance(td.device, torch.device)


def test_constructor_invalid_device() -> None:
    with pytest.raises(RuntimeError, match="device type at start of device string: foo"):
        TensorDict({"a": torch.zeros(2)}, [2], device="foo")


def test_no_device_allows_mixed_devices() -> None:
    td = TensorDict({"a": torch.zeros(2), "m": torch.empty(2, device="meta")}, [2])
    assert td.device is None
    assert td["a"].device == CPU and td["m"].device == META
    td["c"] = torch.zeros(2)
    assert td.device is None


def test_constructor_lock_and_non_blocking() -> None:
    td = TensorDict({"a": torch.zeros(2)}, [2], lock=True, non_blocking=True)
    assert td.is_locked
    with locked_error():
        td["b"] = torch.zeros(2)


def test_device_is_read_only() -> None:
    td = TensorDict({"a": torch.zeros(2)}, [2], device="cpu")
    with pytest.raises(RuntimeError, match=r"^device cannot be set using tensordict\.device = "):
        td.device = "meta"
    assert td.device == CPU
    assert td["a"].device == CPU
    with pytest.raises(RuntimeError, match=r"use tensordict\.to"):
        TensorDict({}, []).device = None


def test_is_cpu_is_cuda(accel_device: torch.device) -> None:
    assert TensorDict({}, [], device="cpu").is_cpu
    assert not TensorDict({}, []).is_cpu
    on_accel = TensorDict({}, [], device=accel_device)
    assert on_accel.is_cuda == (accel_device.type == "cuda")
    assert not on_accel.is_cpu


# --------------------------------------------------------------------------------- keys


def test_getitem_keys() -> None:
    td = make_td()
    assert torch.equal(td["a"], torch.arange(24.0).reshape(4, 3, 2))
    assert td["n", "x"] is td["n"]["x"]
    assert torch.equal(td["n", "deep", "y"], torch.arange(60.0).reshape(4, 3, 5))
    assert td[("n", "deep")] is td["n"]["deep"]
    with pytest.raises(KeyError, match="missing"):
        td["missing"]
    with pytest.raises(KeyError):
        td["n", "missing"]
    with pytest.raises(KeyError):
        td["a", "x"]  # a leaf has no sub-keys


def test_get_default() -> None:
    td = make_td()
    assert td.get("a") is td["a"]
    assert td.get(("n", "x")) is td["n", "x"]
    assert td.get("missing", None) is None
    assert td.get(("n", "missing"), 7) == 7
    assert td.get(("missing", "x"), "d") == "d"
    with pytest.raises(KeyError):
        td.get("missing")


def test_keys_values_items() -> None:
    td = make_td()
    assert td.keys() == ["a", "n", "s"]
    # tensordict's order: a nested TensorDict comes after its own entries
    assert td.keys(include_nested=True) == [
        "a",
        ("n", "x"),
        ("n", "deep", "y"),
        ("n", "deep"),
        "n",
        "s",
    ]
    # as in tensordict, a non-tensor entry is not a leaf, and comes as its NonTensorData
    assert td.keys(include_nested=True, leaves_only=True) == [
        "a",
        ("n", "x"),
        ("n", "deep", "y"),
    ]
    assert td.keys(leaves_only=True) == ["a"]
    values = td.values(include_nested=True, leaves_only=True)
    assert len(values) == 3
    assert values[0] is td["a"] and values[1] is td["n", "x"] and values[2] is td["n", "deep", "y"]
    assert [v is td["n"] for v in td.values()] == [False, True, False]
    assert isinstance(td.values()[2], NonTensorData) and td.values()[2].data == "text"
    items = td.items(include_nested=True, leaves_only=True)
    assert [k for k, _ in items] == td.keys(include_nested=True, leaves_only=True)
    assert all(v is td[k] for k, v in items if k != "s")


def test_len_and_contains() -> None:
    td = make_td()
    assert len(td) == 4
    assert len(TensorDict({"a": torch.zeros(())}, [])) == 0
    assert len(TensorDict({}, [0])) == 0
    assert "a" in td and "n" in td and "s" in td
    assert ("n", "x") in td and ("n", "deep", "y") in td
    assert "x" not in td
    assert ("n", "missing") not in td
    assert ("missing", "x") not in td


def test_iteration_over_first_dim() -> None:
    td = make_td()
    rows = list(td)
    assert len(rows) == 4
    for i, row in enumerate(rows):
        assert row.batch_size == torch.Size([3])
        assert torch.equal(row["a"], td["a"][i])


def test_bool_of_comparison_is_refused() -> None:
    """``assert td1 == td2`` must not pass silently: reduce with all() or any()."""
    td = TensorDict({"a": torch.zeros(3)}, [3])
    other = TensorDict({"a": torch.ones(3)}, [3])
    with pytest.raises(RuntimeError):
        bool(td == other)


# --------------------------------------------------------------------------------- batch indexing

SOURCE_A = torch.arange(24, dtype=torch.float32).reshape(4, 3, 2)
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


# --------------------------------------------------------------------------------- set / update


def test_set_returns_self_and_creates_nested() -> None:
    td = TensorDict({"a": torch.zeros(3)}, [3])
    assert td.set("b", torch.ones(3, 2)) is td
    assert td.set(("n", "m", "c"), torch.ones(3)) is td
    assert isinstance(td["n"], TensorDict) and isinstance(td["n", "m"], TensorDict)
    assert td["n", "m"].batch_size == torch.Size([3])
    assert torch.equal(td["n", "m", "c"], torch.ones(3))
    # Replacing an entry (not in place) puts the new tensor there.
    new = torch.full((3,), 4.0)
    td["a"] = new
    assert td["a"] is new
    td["d"] = {"e": torch.zeros(3)}
    assert isinstance(td["d"], TensorDict)
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        td.set("bad", torch.zeros(4))
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        td["bad"] = torch.zeros(2, 3)
    assert "bad" not in td


def test_set_inplace() -> None:
    td = TensorDict({"a": torch.zeros(3)}, [3])
    a = td["a"]
    td.set("a", torch.tensor([1, 2, 3]), inplace=True)
    assert td["a"] is a
    assert a.tolist() == [1.0, 2.0, 3.0] and a.dtype == torch.float32
    # A missing key is simply set.
    td.set("b", torch.ones(3), inplace=True)
    assert torch.equal(td["b"], torch.ones(3))


def test_set_() -> None:
    td = TensorDict({"a": torch.zeros(3), "n": {"x": torch.zeros(3, 2)}}, [3])
    a, x = td["a"], td["n", "x"]
    assert td.set_("a", torch.tensor([1, 2, 3])) is td
    assert td["a"] is a and a.tolist() == [1.0, 2.0, 3.0]
    td.set_(("n", "x"), torch.ones(3, 2))
    assert td["n", "x"] is x and torch.equal(x, torch.ones(3, 2))
    with pytest.raises(KeyError, match="q"):
        td.set_("q", torch.zeros(3))
    with pytest.raises(KeyError):
        td.set_(("n", "q"), torch.zeros(3))
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        td.set_("a", torch.zeros(4))
    assert "q" not in td


def test_update() -> None:
    td = TensorDict({"a": torch.zeros(3), "n": {"x": torch.zeros(3), "y": torch.zeros(3)}}, [3])
    y = td["n", "y"]
    new_a = torch.ones(3)
    assert td.update({"a": new_a, "n": {"x": torch.full((3,), 2.0), "z": torch.ones(3)}}) is td
    assert td["a"] is new_a
    assert torch.equal(td["n", "x"], torch.full((3,), 2.0))
    assert td["n", "y"] is y  # untouched nested keys stay
    assert torch.equal(td["n", "z"], torch.ones(3))
    other = TensorDict({"b": torch.full((3,), 5.0)}, [3])
    td.update(other)
    assert td["b"] is other["b"]
    td.update(TensorDict({"c": torch.ones(3)}, [3]), clone=True)
    assert torch.equal(td["c"], torch.ones(3))
    src = torch.ones(3)
    td.update({"d": src}, clone=True)
    assert td["d"] is not src and torch.equal(td["d"], src)
    a = td["a"]
    td.update({"a": torch.full((3,), 9.0)}, inplace=True)
    assert td["a"] is a and torch.equal(a, torch.full((3,), 9.0))


def test_update_() -> None:
    td = TensorDict({"a": torch.zeros(3), "n": {"x": torch.zeros(3)}}, [3])
    a, x = td["a"], td["n", "x"]
    assert td.update_({"a": torch.ones(3), "n": {"x": torch.full((3,), 2.0)}}) is td
    assert td["a"] is a and torch.equal(a, torch.ones(3))
    assert td["n", "x"] is x and torch.equal(x, torch.full((3,), 2.0))
    td.update_(TensorDict({"a": torch.full((3,), 3.0)}, [3]))
    assert torch.equal(a, torch.full((3,), 3.0))
    with pytest.raises(KeyError):
        td.update_({"missing": torch.ones(3)})


def test_delitem_and_pop() -> None:
    td = make_td()
    del td["a"]
    assert "a" not in td
    del td["n", "x"]
    assert ("n", "x") not in td
    y = td["n", "deep", "y"]
    assert td.pop(("n", "deep", "y")) is y
    assert td.pop("missing", 3) == 3
    with pytest.raises(KeyError):
        td.pop("missing")


# --------------------------------------------------------------------------------- comparisons


def test_eq_ne() -> None:
    td = make_td()
    other = make_td()
    other["a"][1, 2, 0] = 100.0
    eq = td == other
    assert isinstance(eq, TensorDict)
    assert eq.batch_size == td.batch_size
    assert eq["a"].dtype == torch.bool and eq["n", "x"].dtype == torch.bool
    assert eq["n", "deep", "y"].dtype == torch.bool
    assert eq["a"].sum().item() == 23
    assert not eq.all()
    assert eq.any()
    ne = td != other
    assert ne["a"].sum().item() == 1
    assert ne.any() and not ne.all()
    assert (td == make_td()).all()
    assert not (td != make_td()).any()
    # Against a scalar.
    zeros = TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3, 2)}}, [3])
    assert (zeros == 0).all()
    assert not (zeros != 0).any()
    assert not (zeros == 1).any()


def test_eq_with_memmap_and_loaded(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.rand(5), "b": {"c": torch.rand(5, 2)}}, [5])
    mm = td.memmap(tmp_prefix)
    assert (mm == td).all()
    loaded = TensorDict.load_memmap(tmp_prefix)
    assert (loaded == td).all()
    loaded["b", "c"][4, 1] += 1
    assert not (loaded == td).all()
    assert (loaded != td)["b", "c"][4].tolist() == [False, True]


# --------------------------------------------------------------------------------- apply / clone


def test_apply() -> None:
    td = make_td()
    out = td.apply(lambda t: t * 2)
    assert out is not td
    assert out.batch_size == td.batch_size
    assert torch.equal(out["a"], SOURCE_A * 2)
    assert torch.equal(out["n", "x"], torch.arange(12).reshape(4, 3) * 2)
    assert out["n", "deep"].batch_size == torch.Size([4, 3, 5])
    assert out["s"] == "text"
    assert torch.equal(td["a"], SOURCE_A)


def test_apply_with_others() -> None:
    td = TensorDict({"a": torch.ones(3), "n": {"b": torch.ones(3, 2)}}, [3])
    o1 = TensorDict({"a": torch.full((3,), 2.0), "n": {"b": torch.full((3, 2), 3.0)}}, [3])
    o2 = TensorDict({"a": torch.full((3,), 10.0), "n": {"b": torch.full((3, 2), 20.0)}}, [3])
    out = td.apply(lambda x, y, z: x + y * z, o1, o2)
    assert torch.equal(out["a"], torch.full((3,), 21.0))
    assert torch.equal(out["n", "b"], torch.full((3, 2), 61.0))


def test_apply_none_drops_and_batch_size_and_device() -> None:
    td = TensorDict({"a": torch.ones(3, 2), "b": torch.ones(3, 2, dtype=torch.int64)}, [3])
    out = td.apply(lambda t: t if t.is_floating_point() else None)
    assert out.keys() == ["a"]
    reduced = td.apply(lambda t: t.sum(0), batch_size=[2])
    assert reduced.batch_size == torch.Size([2])
    assert torch.equal(reduced["a"], torch.full((2,), 3.0))
    on_meta = td.apply(lambda t: t, device="meta")
    assert on_meta.device == META and on_meta["a"].device == META


def test_apply_inplace() -> None:
    td = TensorDict({"a": torch.ones(3), "n": {"b": torch.ones(3, 2)}}, [3])
    other = TensorDict({"a": torch.full((3,), 2.0), "n": {"b": torch.full((3, 2), 3.0)}}, [3])
    a, b = td["a"], td["n", "b"]
    assert td.apply(lambda x, y: x + y, other, inplace=True) is td
    assert td["a"] is a and torch.equal(a, torch.full((3,), 3.0))
    assert td["n", "b"] is b and torch.equal(b, torch.full((3, 2), 4.0))


def test_apply_inplace_on_locked_memmap(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.ones(3)}, [3]).memmap_(tmp_prefix)
    td.apply(lambda t: t * 5, inplace=True)
    td.flush()
    assert file_floats(tmp_prefix / "a.memmap") == [5.0, 5.0, 5.0]


def test_clone(tmp_prefix: Path) -> None:
    td = make_td(device="cpu")
    c = td.clone()
    assert c is not td
    assert c.batch_size == td.batch_size and c.device == td.device
    assert c.keys(include_nested=True) == td.keys(include_nested=True)
    for key in td.keys(include_nested=True, leaves_only=True):
        if key == "s":
            assert c[key] == "text"
            continue
        assert c[key] is not td[key]
        assert torch.equal(c[key], td[key])
        assert c[key].data_ptr() != td[key].data_ptr()
    c["a"].fill_(0)
    assert torch.equal(td["a"], SOURCE_A)
    shallow = td.clone(recurse=False)
    assert shallow is not td and shallow["a"] is td["a"]
    shallow["new"] = torch.zeros(4, 3)
    assert "new" not in td
    # A memory-mapped source gives plain, unlocked tensors.
    mm = td.memmap_(tmp_prefix)
    c = mm.clone()
    assert type(c["a"]) is torch.Tensor
    assert not c.is_locked and not c.is_memmap()
    assert torch.equal(c["a"], SOURCE_A)
    c["a"].fill_(0)
    assert torch.equal(mm["a"], SOURCE_A)


# --------------------------------------------------------------------------------- to / cpu / cuda


def test_to_same_device_returns_self() -> None:
    td = make_td(device="cpu")
    assert td.to("cpu") is td
    assert td.to(torch.device("cpu")) is td
    assert td.to(device="cpu") is td
    assert td.cpu() is td


def test_to_device(accel_device: torch.device) -> None:
    td = make_td(device="cpu")
    out = td.to(accel_device)
    assert out is not td
    assert out.device == accel_device
    for key in out.keys(include_nested=True, leaves_only=True):
        if key != "s":
            assert out[key].device == accel_device
            assert out[key].shape == td[key].shape and out[key].dtype == td[key].dtype
    assert out["n"].device == accel_device and out["n", "deep"].device == accel_device
    assert out["s"] == "text"
    assert td.device == CPU and td["a"].device == CPU  # unchanged
    assert out.to(accel_device) is out
    assert td.to(str(accel_device)).device == accel_device
    # A TensorDict without device gets one.
    no_device = make_td()
    assert no_device.to("cpu") is not no_device
    assert no_device.to("cpu").device == CPU
    assert no_device.device is None


def test_to_dtype() -> None:
    td = make_td(device="cpu")
    out = td.to(torch.float64)
    assert out is not td
    assert out.device == CPU
    assert out["a"].dtype == torch.float64 and out["n", "x"].dtype == torch.float64
    assert torch.equal(out["n", "x"], torch.arange(12.0, dtype=torch.float64).reshape(4, 3))
    assert td["n", "x"].dtype == torch.int64
    ints = td.to(torch.int32)
    assert ints["a"].dtype == torch.int32
    assert torch.equal(ints["a"], SOURCE_A.to(torch.int32))
    assert td.to(dtype=torch.float16)["a"].dtype == torch.float16


def test_to_device_and_dtype(accel_device: torch.device) -> None:
    td = make_td(device="cpu")
    out = td.to(accel_device, torch.float64)
    assert out.device == accel_device
    assert out["a"].device == accel_device and out["a"].dtype == torch.float64
    out = td.to("cpu", torch.int32)
    assert out is not td and out.device == CPU and out["a"].dtype == torch.int32
    out = td.to(device="cpu:1", dtype=torch.float64)
    assert out.device == torch.device("cpu:1")
    assert td.to("cpu:1").device == torch.device("cpu:1")


def test_to_tensor(accel_device: torch.device) -> None:
    td = make_td(device="cpu")
    out = td.to(torch.zeros(1, dtype=torch.int16, device=accel_device))
    assert out.device == accel_device
    assert out["a"].dtype == torch.int16 and out["n", "x"].dtype == torch.int16
    assert out["a"].device == accel_device


def test_to_other(accel_device: torch.device) -> None:
    td = make_td(device="cpu")
    single = TensorDict({"z": torch.zeros(2, dtype=torch.float64)}, [2], device=accel_device)
    out = td.to(other=single)
    assert out.device == accel_device
    assert out["a"].dtype == torch.float64 and out["n", "x"].dtype == torch.float64
    mixed = TensorDict(
        {"z": torch.zeros(2), "i": torch.zeros(2, dtype=torch.int64)}, [2], device=accel_device
    )
    out = td.to(other=mixed)
    assert out.device == accel_device
    assert out["a"].dtype == torch.float32 and out["n", "x"].dtype == torch.int64
    assert td.to(mixed).device == accel_device
    with pytest.raises(ValueError, match="other and device cannot be both passed"):
        td.to(other=mixed, device="cpu")


def test_to_batch_size() -> None:
    td = TensorDict({"a": torch.zeros(3, 4), "b": torch.zeros(3, 4, 2)}, [3])
    assert td.to(batch_size=[3, 4]) is td
    assert td.batch_size == torch.Size([3, 4])
    assert td[0].batch_size == torch.Size([4])
    nested = TensorDict({"a": torch.zeros(3, 4), "n": {"b": torch.zeros(3, 4, 2)}}, [3])
    assert nested.to(batch_size=[]) is nested
    assert nested.batch_size == torch.Size([])
    assert nested["n"].batch_size == torch.Size([3])
    with pytest.raises(RuntimeError):
        td.to(batch_size=[5])
    assert td.batch_size == torch.Size([3, 4])


def test_to_errors() -> None:
    td = make_td()
    with pytest.raises(TypeError):
        td.to()
    with pytest.raises(RuntimeError):
        td.to("foo")


def test_to_locked_and_memmap(tmp_prefix: Path, accel_device: torch.device) -> None:
    td = make_td().memmap_(tmp_prefix)
    out = td.to(accel_device)
    assert out.is_locked
    assert not out.is_memmap()
    assert out["a"].device == accel_device
    assert not isinstance(out["a"], MemoryMappedTensor)
    cast = td.to(torch.float64)
    assert cast.is_locked and not cast.is_memmap()
    assert type(cast["a"]) is torch.Tensor
    assert torch.equal(cast["a"], SOURCE_A.double())
    assert td.is_memmap() and td.to("cpu") is td


def test_to_inplace(accel_device: torch.device) -> None:
    td = make_td(device="cpu")
    n = td["n"]
    assert td.to(accel_device, inplace=True) is td
    assert td.device == accel_device
    assert td["n"] is n and n.device == accel_device
    assert td["a"].device == accel_device and td["n", "deep", "y"].device == accel_device
    locked = make_td(device="cpu").lock_()
    with locked_error():
        locked.to(torch.float64, inplace=True)
    assert locked.to("cpu", inplace=True) is locked


def test_cpu(accel_device: torch.device) -> None:
    td = make_td(device="cpu")
    assert td.cpu() is td
    if accel_device.type == "cuda":
        on_accel = td.to(accel_device)
        back = on_accel.cpu()
        assert back.device == CPU and torch.equal(back["a"], SOURCE_A)
    else:
        with pytest.raises(NotImplementedError):
            td.to(accel_device).cpu()
    assert make_td().cpu().device == CPU


def test_cuda() -> None:
    td = make_td()
    if torch.cuda.is_available():
        for out in (td.cuda(), td.cuda(0), td.cuda("cuda:0")):
            assert out.device == torch.device("cuda:0")
            assert out["a"].device == torch.device("cuda:0")
            assert torch.equal(out["a"].cpu(), SOURCE_A)
        assert td.to("cuda").device == torch.device("cuda:0")
        on_cuda = td.cuda()
        assert on_cuda.cuda() is on_cuda
        assert on_cuda.cpu().device == CPU
    else:
        with pytest.raises(Exception) as torch_error:
            torch.zeros(1).cuda()
        with pytest.raises(type(torch_error.value)) as error:
            td.cuda()
        assert str(error.value) == str(torch_error.value)
        with pytest.raises(type(torch_error.value)):
            td.to("cuda")


def test_clear_device_(accel_device: torch.device) -> None:
    td = make_td(device=accel_device)
    a = td["a"]
    assert td.clear_device_() is td
    assert td.device is None
    assert td["n"].device is None and td["n", "deep"].device is None
    assert td["a"] is a and a.device == accel_device  # no data moved
    td["c"] = torch.zeros(4, 3)
    assert td["c"].device == CPU
    td["n", "c"] = torch.zeros(4, 3)
    assert td["n", "c"].device == CPU


# --------------------------------------------------------------------------------- locking


def test_lock_unlock() -> None:
    td = make_td()
    assert not td.is_locked
    assert td.lock_() is td
    assert td.is_locked and td["n"].is_locked and td["n", "deep"].is_locked
    assert td.unlock_() is td
    assert not td.is_locked and not td["n"].is_locked and not td["n", "deep"].is_locked
    td.is_locked = True
    assert td.is_locked and td["n"].is_locked
    td.is_locked = False
    assert not td.is_locked and not td["n"].is_locked


def test_locked_writes() -> None:
    td = make_td().lock_()
    with locked_error():
        td["new"] = torch.zeros(4, 3)
    with locked_error():
        td.set("new", torch.zeros(4, 3))
    with locked_error():
        td["a"] = torch.zeros(4, 3, 2)  # existing key, not in place
    with locked_error():
        td.set("a", torch.zeros(4, 3, 2))
    with locked_error():
        td.set(("n", "new"), torch.zeros(4, 3))
    with locked_error():
        td["n", "x"] = torch.zeros(4, 3)
    with locked_error():
        td.update({"new": torch.zeros(4, 3)})
    with locked_error():
        td.update({"a": torch.zeros(4, 3, 2)})
    with locked_error():
        del td["a"]
    with locked_error():
        td.pop("a")
    with locked_error():
        td["n"]["new"] = torch.zeros(4, 3)
    with locked_error():
        td.set("new", torch.zeros(4, 3), inplace=True)
    with locked_error():
        td.update({"new": torch.zeros(4, 3)}, inplace=True)
    assert td.keys(include_nested=True) == make_td().keys(include_nested=True)
    assert torch.equal(td["a"], SOURCE_A)


def test_locked_new_nested_path_refused() -> None:
    td = make_td().lock_()
    with locked_error():
        td.set(("brand", "new"), torch.zeros(4, 3))
    assert "brand" not in td


def test_locked_in_place_writes_allowed() -> None:
    td = make_td().lock_()
    a = td["a"]
    td.set_("a", torch.ones(4, 3, 2))
    assert td["a"] is a and torch.equal(a, torch.ones(4, 3, 2))
    td.set_("a", torch.full((4, 3, 2), 2, dtype=torch.int64))  # cast to the existing dtype
    assert a.dtype == torch.float32 and torch.equal(a, torch.full((4, 3, 2), 2.0))
    td.set("a", torch.full((4, 3, 2), 3.0), inplace=True)
    assert torch.equal(a, torch.full((4, 3, 2), 3.0))
    td.update({"a": torch.full((4, 3, 2), 4.0)}, inplace=True)
    assert torch.equal(a, torch.full((4, 3, 2), 4.0))
    td.update_({"n": {"x": torch.zeros(4, 3, dtype=torch.int64)}})
    assert torch.equal(td["n", "x"], torch.zeros(4, 3, dtype=torch.int64))
    td["a"][:] = 5.0
    assert torch.equal(a, torch.full((4, 3, 2), 5.0))
    td[0] = td[1].clone()
    with pytest.raises(KeyError):
        td.set_("missing", torch.zeros(4, 3))
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        td.set_("a", torch.zeros(5, 3, 2))
    # Changing the batch size is allowed while locked.
    td.batch_size = [4]
    assert td.batch_size == torch.Size([4])


def test_lock_context_managers() -> None:
    td = make_td()
    with td.lock_() as same:
        assert same is td
        assert td.is_locked and td["n"].is_locked
    assert not td.is_locked and not td["n"].is_locked
    td.lock_()
    with td.unlock_():
        assert not td.is_locked
        td["added"] = torch.zeros(4, 3)
    assert td.is_locked and td["n"].is_locked
    assert "added" in td


def test_lock_context_managers_keep_an_unchanged_state(tmp_prefix: Path) -> None:
    """``with td.lock_()`` on a locked TensorDict (or ``unlock_`` on an unlocked one) changes
    nothing, so leaving the block must not change anything either."""
    td = make_td().memmap_(tmp_prefix)
    with td.lock_():
        assert td.is_locked
    assert td.is_locked and td.is_memmap()
    free = make_td()
    with free.unlock_():
        assert not free.is_locked
    assert not free.is_locked
    free["added"] = torch.zeros(4, 3)


def test_nested_lock_rule() -> None:
    td = make_td().lock_()
    with pytest.raises(RuntimeError, match="Cannot unlock a tensordict that is part of a locked"):
        td["n"].unlock_()
    with pytest.raises(RuntimeError, match="Unlock the root tensordict first"):
        td["n", "deep"].unlock_()
    assert td["n"].is_locked and td["n", "deep"].is_locked
    td.unlock_()
    assert not td["n"].is_locked
    # A sub-TensorDict held by two locked parents stays locked until both let go.
    sub = TensorDict({"x": torch.zeros(3)}, [3])
    p1 = TensorDict({"s": sub}, [3])
    p2 = TensorDict({"s": sub}, [3])
    p1.lock_()
    p2.lock_()
    p1.unlock_()
    assert sub.is_locked
    with pytest.raises(RuntimeError, match="part of a locked graph"):
        sub.unlock_()
    p2.unlock_()
    assert not sub.is_locked
    # A nested TensorDict locked on its own can be unlocked on its own.
    free = make_td()
    free["n"].lock_()
    assert free["n"].is_locked and not free.is_locked
    free["n"].unlock_()
    assert not free["n"].is_locked


def test_unlock_ends_memmap(tmp_prefix: Path) -> None:
    td = make_td().memmap_(tmp_prefix)
    assert td.is_memmap() and td["n"].is_memmap()
    td.unlock_()
    assert not td.is_memmap() and not td["n"].is_memmap()
    with pytest.raises(AttributeError, match="no saved path"):
        _ = td.saved_path
    td.lock_()
    assert not td.is_memmap()  # relocking does not restore it
    with td.unlock_():
        pass
    assert td.is_locked and not td.is_memmap()


# --------------------------------------------------------------------------------- memmap_


def test_memmap_anonymous() -> None:
    td = make_td()
    assert td.memmap_() is td
    assert td.is_memmap() and td.is_locked
    assert td.device == CPU
    assert td.saved_path is None
    for key in td.keys(include_nested=True, leaves_only=True):
        if key != "s":
            assert isinstance(td[key], MemoryMappedTensor)
            assert td[key]._filename is None
    assert torch.equal(td["a"], SOURCE_A)
    assert td["n"].is_memmap() and td["n", "deep"].is_memmap() and td["n", "deep"].is_locked
    # A second call is a no-op that keeps the same leaves.
    a = td["a"]
    assert td.memmap_() is td
    assert td["a"] is a and td.is_locked


def test_memmap_prefix(tmp_prefix: Path) -> None:
    td = make_td()
    td.memmap_(tmp_prefix)
    assert td.saved_path == tmp_prefix
    assert isinstance(td.saved_path, Path)
    assert td["n"].saved_path == tmp_prefix / "n"
    assert td["a"].filename == str(tmp_prefix / "a.memmap")
    assert td["n", "deep", "y"].filename == str(tmp_prefix / "n" / "deep" / "y.memmap")
    assert sorted(str(p.relative_to(tmp_prefix)) for p in tmp_prefix.rglob("*")) == [
        "a.memmap",
        "meta.json",
        "n",
        "n/deep",
        "n/deep/meta.json",
        "n/deep/y.memmap",
        "n/meta.json",
        "n/x.memmap",
        "s",
        "s/meta.json",
    ]
    meta = json.loads((tmp_prefix / "meta.json").read_text())
    assert meta["shape"] == [4, 3]
    assert meta["device"] == "cpu"
    assert meta["a"] == {
        "device": "cpu",
        "shape": [4, 3, 2],
        "dtype": "torch.float32",
        "is_nested": False,
    }
    assert meta["n"] == {"type": "TensorDict"}
    assert meta["s"] == {"type": "NonTensorData"}
    assert json.loads((tmp_prefix / "n" / "deep" / "meta.json").read_text())["shape"] == [4, 3, 5]
    assert json.loads((tmp_prefix / "s" / "meta.json").read_text())["data"] == "text"
    assert (tmp_prefix / "a.memmap").read_bytes() == SOURCE_A.numpy().tobytes()
    # Writes through the leaves reach the files.
    td["a"][0, 0, 0] = 99.0
    td.flush()
    assert file_floats(tmp_prefix / "a.memmap")[0] == 99.0


def test_memmap_locked_tensordict(tmp_prefix: Path) -> None:
    td = make_td().lock_()
    assert td.memmap_(tmp_prefix) is td
    assert td.is_locked and td.is_memmap()
    assert isinstance(td["n", "x"], MemoryMappedTensor)


def test_memmap_creates_missing_parents(tmp_prefix: Path) -> None:
    target = tmp_prefix / "deeper" / "still"
    TensorDict({"a": torch.arange(3.0)}, [3]).memmap_(target)
    assert file_floats(target / "a.memmap") == [0.0, 1.0, 2.0]
    assert (target / "meta.json").is_file()


def test_memmap_odd_keys(tmp_prefix: Path) -> None:
    td = TensorDict({"odd/key with space": torch.arange(3.0), "a.b": torch.ones(3)}, [3])
    td.memmap_(tmp_prefix)
    assert (tmp_prefix / "odd%2Fkey%20with%20space.memmap").is_file()
    assert (tmp_prefix / "a.b.memmap").is_file()
    loaded = TensorDict.load_memmap(tmp_prefix)
    assert sorted(loaded.keys()) == ["a.b", "odd/key with space"]
    assert loaded["odd/key with space"].tolist() == [0.0, 1.0, 2.0]


def test_memmap_prefix_as_str_and_device_reset(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.zeros(2)}, [2])
    assert td.device is None
    td.memmap_(str(tmp_prefix))
    assert td.saved_path == tmp_prefix
    assert td.device == CPU


def test_memmap_from_device(tmp_prefix: Path) -> None:
    if torch.cuda.is_available():
        td = TensorDict({"a": torch.arange(3.0)}, [3], device="cuda:0")
        td.memmap_(tmp_prefix)
        assert td.device == CPU and isinstance(td["a"], MemoryMappedTensor)
        assert td["a"].tolist() == [0.0, 1.0, 2.0]
    else:
        td = TensorDict({"a": torch.empty(3)}, [3], device="meta")
        with pytest.raises(NotImplementedError):
            td.memmap_(tmp_prefix)
        assert td.device == META and not td.is_memmap() and not td.is_locked


def test_memmap_same_prefix_again_keeps_leaves(tmp_prefix: Path) -> None:
    """Saving again to the same directory: earlier references to the leaves still reach it."""
    td = TensorDict({"a": torch.zeros(3)}, [3])
    td.memmap_(tmp_prefix)
    a = td["a"]
    td.memmap_(tmp_prefix)
    assert td.is_locked and td.is_memmap()
    a.fill_(4.0)
    td.flush()
    assert td["a"].tolist() == [4.0, 4.0, 4.0]
    assert file_floats(tmp_prefix / "a.memmap") == [4.0, 4.0, 4.0]


def test_memmap_after_unlock_adds_key(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.arange(3.0)}, [3]).memmap_(tmp_prefix)
    td.unlock_()
    td["b"] = torch.ones(3)
    td.memmap_()
    assert td.is_locked and td.is_memmap()
    assert td.saved_path == tmp_prefix
    assert td["b"].filename == str(tmp_prefix / "b.memmap")
    assert file_floats(tmp_prefix / "b.memmap") == [1.0, 1.0, 1.0]
    assert file_floats(tmp_prefix / "a.memmap") == [0.0, 1.0, 2.0]
    loaded = TensorDict.load_memmap(tmp_prefix)
    assert loaded.keys() == ["a", "b"]


def test_memmap_copy_existing(tmp_path: Path) -> None:
    td = TensorDict({"a": torch.arange(3.0), "n": {"b": torch.ones(3)}}, [3])
    td.memmap_(tmp_path / "first")
    with pytest.raises(RuntimeError, match=r"A filename was provided.*copy_existing=True"):
        td.memmap_(tmp_path / "second")
    assert td.saved_path == tmp_path / "first"
    assert td.is_locked and td.is_memmap()
    assert td.memmap_(tmp_path / "second", copy_existing=True) is td
    assert td.saved_path == tmp_path / "second"
    assert td["a"].filename == str(tmp_path / "second" / "a.memmap")
    assert td["n", "b"].filename == str(tmp_path / "second" / "n" / "b.memmap")
    assert td["a"].tolist() == [0.0, 1.0, 2.0]
    # The two directories are independent.
    td["a"].fill_(7.0)
    td.flush()
    assert file_floats(tmp_path / "first" / "a.memmap") == [0.0, 1.0, 2.0]
    assert file_floats(tmp_path / "second" / "a.memmap") == [7.0, 7.0, 7.0]


def test_memmap_existsok(tmp_prefix: Path) -> None:
    TensorDict({"a": torch.zeros(3)}, [3]).memmap_(tmp_prefix)
    td = TensorDict({"a": torch.ones(3)}, [3])
    with pytest.raises(FileExistsError):
        td.memmap_(tmp_prefix, existsok=False)
    # A failed save leaves the TensorDict as it was.
    assert not td.is_memmap() and not td.is_locked
    assert type(td["a"]) is torch.Tensor
    assert file_floats(tmp_prefix / "a.memmap") == [0.0, 0.0, 0.0]
    # existsok=True (the default) overwrites.
    td.memmap_(tmp_prefix)
    assert file_floats(tmp_prefix / "a.memmap") == [1.0, 1.0, 1.0]
    fresh = TensorDict({"a": torch.ones(3)}, [3])
    fresh.memmap_(tmp_prefix.parent / "fresh", existsok=False)
    assert fresh.is_memmap()


@pytest.mark.parametrize("num_threads", [0, 1, 2, 4])
def test_memmap_num_threads(tmp_path: Path, num_threads: int) -> None:
    leaves = {f"k{i}": torch.randn(8, i + 1) for i in range(20)}
    td = TensorDict({**leaves, "n": {"x": torch.arange(8)}}, [8])
    expected = td.clone()
    td.memmap_(tmp_path / "a", num_threads=num_threads)
    assert (td == expected).all()
    assert (TensorDict.load_memmap(tmp_path / "a") == expected).all()
    copy = expected.memmap(tmp_path / "b", num_threads=num_threads)
    assert (copy == expected).all()
    anonymous = expected.clone().memmap_(num_threads=num_threads)
    assert (anonymous == expected).all()


def test_memmap_return_early(tmp_prefix: Path) -> None:
    """As tensordict: a TensorDictFuture with num_threads > 1, else the finished TensorDict."""
    td = make_td()
    future = td.memmap_(tmp_prefix, num_threads=2, return_early=True)
    assert isinstance(future, TensorDictFuture)
    assert future.result() is td
    assert td.is_memmap() and td.is_locked
    assert torch.equal(td["a"], SOURCE_A)
    copy_future = make_td().memmap(num_threads=2, return_early=True)
    assert isinstance(copy_future, TensorDictFuture)
    copy = copy_future.result()
    assert isinstance(copy, TensorDict) and copy.is_memmap()
    assert torch.equal(copy["a"], SOURCE_A)
    like = make_td().memmap_like(return_early=True)  # one thread: done on return
    assert isinstance(like, TensorDict) and torch.equal(like["a"], torch.zeros_like(SOURCE_A))
    # Errors arrive through the future.
    failing = TensorDict({"a": torch.zeros(3)}, [3]).memmap_(
        tmp_prefix, existsok=False, return_early=True, num_threads=2
    )
    with pytest.raises(FileExistsError):
        failing.result()


def test_memmap_durable(tmp_prefix: Path) -> None:
    td = make_td()
    td.memmap_(tmp_prefix, durable=True)
    assert (TensorDict.load_memmap(tmp_prefix) == make_td()).all()
    copy = make_td().memmap(tmp_prefix.parent / "copy", durable=True)
    assert copy.saved_path == tmp_prefix.parent / "copy"


def test_memmap_requires_grad_leaf() -> None:
    td = TensorDict({"a": torch.ones(3, requires_grad=True)}, [3])
    td.memmap_()
    assert isinstance(td["a"], MemoryMappedTensor)
    assert not td["a"].requires_grad
    assert torch.equal(td["a"], torch.ones(3))


def test_memmap_empty_leaf(tmp_prefix: Path) -> None:
    td = TensorDict({"e": torch.zeros(3, 0), "a": torch.ones(3)}, [3]).memmap_(tmp_prefix)
    assert td["e"].shape == (3, 0)
    assert not (tmp_prefix / "e.memmap").exists()
    loaded = TensorDict.load_memmap(tmp_prefix)
    assert loaded["e"].shape == (3, 0) and loaded["e"].dtype == torch.float32


# ----------------------------------------------------------------------------- memmap / memmap_like


def test_memmap_returns_new(tmp_prefix: Path) -> None:
    td = make_td()
    out = td.memmap(tmp_prefix)
    assert out is not td
    assert out.is_memmap() and out.is_locked and out.device == CPU
    assert out.saved_path == tmp_prefix
    assert not td.is_memmap() and not td.is_locked
    assert type(td["a"]) is torch.Tensor
    assert isinstance(out["a"], MemoryMappedTensor)
    assert out["a"].data_ptr() != td["a"].data_ptr()
    assert (out == td).all()
    assert out["s"] == "text"
    out["a"].fill_(0)
    assert torch.equal(td["a"], SOURCE_A)
    anonymous = td.memmap()
    assert anonymous.saved_path is None and anonymous.is_memmap()


def test_memmap_like(tmp_prefix: Path) -> None:
    td = make_td()
    like = td.memmap_like(tmp_prefix)
    assert like is not td
    assert like.is_memmap() and like.is_locked and like.device == CPU
    assert like.saved_path == tmp_prefix
    assert not td.is_locked and not td.is_memmap()
    assert like.keys(include_nested=True) == td.keys(include_nested=True)
    for key in td.keys(include_nested=True, leaves_only=True):
        if key == "s":
            assert like[key] == "text"
            continue
        assert isinstance(like[key], MemoryMappedTensor)
        assert like[key].shape == td[key].shape and like[key].dtype == td[key].dtype
        assert not like[key].any()
        assert like[key].data_ptr() != td[key].data_ptr()
    assert like["n", "deep"].batch_size == torch.Size([4, 3, 5])
    assert (tmp_prefix / "a.memmap").stat().st_size == SOURCE_A.numel() * 4
    anonymous = td.memmap_like()
    assert anonymous.saved_path is None and not anonymous["a"].any()


def test_memmap_like_from_meta_and_expanded() -> None:
    meta = TensorDict({"a": torch.empty(1000, 3, device="meta")}, [1000])
    like = meta.memmap_like()
    assert like.device == CPU
    assert like["a"].device == CPU and like["a"].shape == (1000, 3)
    assert not like["a"].any()
    expanded = TensorDict({"a": torch.zeros(()).expand(100_000)}, [100_000]).memmap_like()
    assert expanded["a"].shape == (100_000,) and expanded["a"].is_contiguous()


# --------------------------------------------------------------------------------- load_memmap


def test_load_memmap(tmp_prefix: Path) -> None:
    td = make_td()
    td.memmap_(tmp_prefix)
    loaded = TensorDict.load_memmap(tmp_prefix)
    assert loaded.batch_size == td.batch_size
    assert loaded.device == CPU
    assert loaded.keys(include_nested=True) == td.keys(include_nested=True)
    assert loaded["n", "deep"].batch_size == torch.Size([4, 3, 5])
    assert (loaded == td).all()
    assert loaded["s"] == "text"
    assert not loaded.is_locked and not loaded.is_memmap()
    with pytest.raises(AttributeError, match="no saved path"):
        _ = loaded.saved_path
    for key in ("a", ("n", "x"), ("n", "deep", "y")):
        assert isinstance(loaded[key], MemoryMappedTensor)
        assert loaded[key].filename == td[key].filename
        assert loaded[key] is loaded[key]
    # Writes go both ways through the files.
    loaded["n", "x"][0, 0] = -3
    assert td["n", "x"][0, 0].item() == -3
    # Not locked: keys can be added (in memory).
    loaded["new"] = torch.zeros(4, 3)
    # memmap_() on it locks and marks it.
    again = TensorDict.load_memmap(tmp_prefix)
    again.memmap_()
    assert again.is_locked and again.is_memmap()
    assert TensorDict.load(tmp_prefix).keys() == td.keys()


def test_load_then_memmap_keeps_sharing_the_files(tmp_prefix: Path) -> None:
    """``load_memmap(p).memmap_()`` marks the loaded TensorDict; it still maps the same files."""
    td = TensorDict({"a": torch.zeros(3)}, [3]).memmap_(tmp_prefix)
    again = TensorDict.load_memmap(tmp_prefix)
    again.memmap_()
    assert again.saved_path == tmp_prefix
    td["a"][0] = 5.0
    again["a"][1] = 6.0
    assert again["a"].tolist() == [5.0, 6.0, 0.0]
    assert td["a"].tolist() == [5.0, 6.0, 0.0]
    td.flush()
    again.flush()
    assert file_floats(tmp_prefix / "a.memmap") == [5.0, 6.0, 0.0]


def test_load_memmap_str_and_subdirectory(tmp_prefix: Path) -> None:
    td = make_td().memmap_(tmp_prefix)
    loaded = TensorDict.load_memmap(str(tmp_prefix))
    assert (loaded == td).all()
    sub = TensorDict.load_memmap(tmp_prefix / "n")
    assert sub.batch_size == torch.Size([4, 3])
    assert sub.keys(include_nested=True) == ["x", ("deep", "y"), "deep"]
    assert torch.equal(sub["x"], torch.arange(12).reshape(4, 3))


def test_load_memmap_device(tmp_prefix: Path, accel_device: torch.device) -> None:
    make_td().memmap_(tmp_prefix)
    on_cpu = TensorDict.load_memmap(tmp_prefix, device="cpu")
    assert on_cpu.device == CPU and isinstance(on_cpu["a"], MemoryMappedTensor)
    moved = TensorDict.load_memmap(tmp_prefix, device=accel_device)
    assert moved.device == accel_device
    assert moved["n"].device == accel_device
    for key in ("a", ("n", "x"), ("n", "deep", "y")):
        assert moved[key].device == accel_device
        assert not isinstance(moved[key], MemoryMappedTensor)
    assert moved["a"].shape == SOURCE_A.shape
    if accel_device.type == "cuda":
        assert torch.equal(moved["a"].cpu(), SOURCE_A)


def test_load_memmap_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        TensorDict.load_memmap(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"meta\.json"):
        TensorDict.load_memmap(tmp_path / "empty")


def test_load_memmap_in_another_process(tmp_prefix: Path, run_python) -> None:
    td = make_td().memmap_(tmp_prefix)
    child = run_python(
        """
        import sys
        from tensordict_rs import TensorDict

        loaded = TensorDict.load_memmap(sys.argv[1])
        print(loaded["n", "x"].sum().item(), loaded["s"])
        loaded["a"].fill_(1.0)
        loaded.flush()
        """,
        str(tmp_prefix),
    )
    assert child.stdout.split() == [str(sum(range(12))), "text"]
    assert torch.equal(td["a"], torch.ones(4, 3, 2))


def test_flush(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3)}}, [3]).memmap_(tmp_prefix)
    td["a"][1] = 2.0
    td["n", "b"][2] = 3.0
    assert td.flush() is None
    assert file_floats(tmp_prefix / "a.memmap") == [0.0, 2.0, 0.0]
    assert file_floats(tmp_prefix / "n" / "b.memmap") == [0.0, 0.0, 3.0]
    # Anonymous and plain TensorDicts flush without error.
    TensorDict({"a": torch.zeros(3)}, [3]).memmap_().flush()
    TensorDict({"a": torch.zeros(3)}, [3]).flush()


# --------------------------------------------------------------------------------- indexing memmaps


def test_indexing_memmap_keeps_or_drops_memmap(tmp_prefix: Path) -> None:
    td = make_td().memmap_(tmp_prefix)
    # Rows are views of the maps, but not saved trees themselves: unlocked, no is_memmap(),
    # no saved_path (tensordict's td[1:] is neither locked nor memory-mapped).
    for index in (0, slice(1, 3), (0, 1)):
        out = td[index]
        assert not out.is_memmap() and not out.is_locked
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


# --------------------------------------------------------------------------------- pickling


def test_pickle_plain_tensordict() -> None:
    td = make_td(device="cpu").lock_()
    u = pickle.loads(pickle.dumps(td))
    assert (u == td).all()
    assert u.batch_size == td.batch_size and u.device == CPU
    assert u.is_locked and u["n"].is_locked
    assert u["s"] == "text"
    assert u["n", "deep"].batch_size == torch.Size([4, 3, 5])


def test_pickle_file_backed_tensordict(tmp_prefix: Path) -> None:
    td = make_td().memmap_(tmp_prefix)
    data = pickle.dumps(td)
    assert len(data) < 8192
    u = pickle.loads(data)
    assert u.is_memmap() and u.is_locked
    assert u.saved_path == tmp_prefix
    assert u["a"].filename == td["a"].filename
    assert (u == td).all()
    td["a"][0, 0, 0] = 50.0
    assert u["a"][0, 0, 0].item() == 50.0
    view = td[1:3]
    u_view = pickle.loads(pickle.dumps(view))
    assert u_view.batch_size == torch.Size([2, 3])
    assert isinstance(u_view["a"], MemoryMappedTensor)
    assert torch.equal(u_view["a"], td["a"][1:3])
    td["a"][2, 0, 1] = -8.0
    assert u_view["a"][1, 0, 1].item() == -8.0


def test_pickle_loaded_tensordict(tmp_prefix: Path) -> None:
    make_td().memmap_(tmp_prefix)
    loaded = TensorDict.load_memmap(tmp_prefix)  # leaves not touched before pickling
    u = pickle.loads(pickle.dumps(loaded))
    assert (u == make_td()).all()
    assert u["a"].filename == str(tmp_prefix / "a.memmap")
    assert not u.is_locked and not u.is_memmap()


def test_pickle_anonymous_tensordict_raises() -> None:
    td = make_td().memmap_()
    with pytest.raises(RuntimeError, match="anonymous MemoryMappedTensor cannot be pickled"):
        pickle.dumps(td)


def _spawn_child(td, to_parent, to_child) -> None:
    to_parent.put(
        (
            type(td).__name__,
            td.is_locked,
            td.is_memmap(),
            type(td["a"]).__name__,
            td["a"].tolist(),
            td["s"],
        )
    )
    assert to_child.get(timeout=60) == "written"
    to_parent.put(td["a"][0].tolist())
    td["n", "x"][1] = -5
    td.flush()


def test_pickle_to_spawned_process(tmp_prefix: Path) -> None:
    td = TensorDict(
        {"a": torch.arange(6.0).reshape(3, 2), "n": {"x": torch.arange(3)}, "s": "text"}, [3]
    ).memmap_(tmp_prefix)
    ctx = multiprocessing.get_context("spawn")
    to_parent, to_child = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_spawn_child, args=(td, to_parent, to_child))
    proc.start()
    try:
        first = to_parent.get(timeout=120)
        assert first == (
            "TensorDict",
            True,
            True,
            "MemoryMappedTensor",
            [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]],
            "text",
        )
        td["a"][0] = torch.tensor([10.0, 11.0])
        to_child.put("written")
        assert to_parent.get(timeout=60) == [10.0, 11.0]
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert td["n", "x"].tolist() == [0, -5, 2]


# --------------------------------------------------------------------------------- repr


@pytest.mark.parametrize(
    ("td", "expected"),
    [
        (TensorDict({}, []), "TensorDict(batch_size=[], fields={})"),
        (
            TensorDict({}, [2, 3], device="cpu"),
            "TensorDict(batch_size=[2,3], device=cpu, fields={})",
        ),
        (
            TensorDict({"a": torch.zeros(3, 4)}, [3]),
            "TensorDict(batch_size=[3], fields={a: f32[4]})",
        ),
        (
            TensorDict({"b": torch.zeros(3), "a": torch.zeros(3, 2, 5)}, [3], device="cpu"),
            "TensorDict(batch_size=[3], device=cpu, fields={a: f32[2,5], b: f32[]})",
        ),
        (
            TensorDict(
                {
                    "f64": torch.zeros(2, dtype=torch.float64),
                    "f16": torch.zeros(2, dtype=torch.float16),
                    "bf": torch.zeros(2, dtype=torch.bfloat16),
                },
                [2],
            ),
            "TensorDict(batch_size=[2], fields={bf: bf16[], f16: f16[], f64: f64[]})",
        ),
        (
            TensorDict(
                {"i32": torch.zeros(2, dtype=torch.int32), "i8": torch.zeros(2, dtype=torch.int8)},
                [2],
            ),
            "TensorDict(batch_size=[2], fields={i32: i32[], i8: i8[]})",
        ),
        (
            TensorDict(
                {
                    "u8": torch.zeros(2, dtype=torch.uint8),
                    "ok": torch.zeros(2, dtype=torch.bool),
                    "c": torch.zeros(2, dtype=torch.complex64),
                    "i": torch.zeros(2, dtype=torch.int64),
                },
                [2],
            ),
            "TensorDict(batch_size=[2], fields={c: c64[], i: i64[], ok: bool[], u8: u8[]})",
        ),
        (
            TensorDict({"n": TensorDict({"x": torch.zeros(3, 4, 2)}, [3, 4])}, [3]),
            "TensorDict(batch_size=[3], fields={n: [4]{x: f32[2]}})",
        ),
        (
            TensorDict({"n": {"m": {"x": torch.zeros(3, dtype=torch.int64)}}}, [3]),
            "TensorDict(batch_size=[3], fields={n: {m: {x: i64[]}}})",
        ),
        (
            TensorDict({"s": "hello", "a": torch.zeros(2)}, [2]),
            "TensorDict(batch_size=[2], fields={a: f32[], s: str})",
        ),
        (
            TensorDict({"x": torch.zeros(2), "m": torch.zeros(2, 2, device="meta")}, [2]),
            "TensorDict(batch_size=[2], fields={m: f32[2]@meta, x: f32[]})",
        ),
        (
            TensorDict({"m": torch.zeros(2, 2, device="meta")}, [2], device="meta"),
            "TensorDict(batch_size=[2], device=meta, fields={m: f32[2]})",
        ),
        (
            TensorDict({"n": TensorDict({"m": torch.zeros(2, device="meta")}, [2])}, [2]),
            "TensorDict(batch_size=[2], fields={n: {m: f32[]@meta}})",
        ),
    ],
    ids=lambda x: "" if isinstance(x, str) else None,
)
def test_repr(td: TensorDict, expected: str) -> None:
    assert repr(td) == expected
    assert str(td) == expected


def test_repr_multiline() -> None:
    td = TensorDict(
        {"a": torch.zeros(3, 2), "n": {"x": torch.zeros(3, dtype=torch.int64)}, "s": "str"},
        [3],
        device="cpu",
    )
    assert repr(td) == (
        "TensorDict(batch_size=[3], device=cpu, fields={\n"
        "    a: f32[2],\n"
        "    n: {x: i64[]},\n"
        "    s: str})"
    )


def test_repr_multiline_nested() -> None:
    td = TensorDict(
        {
            "observation_pixels": torch.zeros(2, 84, 84, 3, dtype=torch.uint8),
            "action": torch.zeros(2, 6),
            "next": {
                "observation_pixels": torch.zeros(2, 84, 84, 3, dtype=torch.uint8),
                "reward": torch.zeros(2, 1),
                "done": torch.zeros(2, 1, dtype=torch.bool),
                "truncated": torch.zeros(2, 1, dtype=torch.bool),
            },
        },
        [2],
    )
    assert repr(td) == (
        "TensorDict(batch_size=[2], fields={\n"
        "    action: f32[6],\n"
        "    next: {\n"
        "        done: bool[1],\n"
        "        observation_pixels: u8[84,84,3],\n"
        "        reward: f32[1],\n"
        "        truncated: bool[1]},\n"
        "    observation_pixels: u8[84,84,3]})"
    )


def test_repr_width_boundary() -> None:
    head = "TensorDict(batch_size=[3], fields={"
    # One line is at most 80 columns: "<head><key>: f32[]})".
    fits = "k" * (80 - len(head) - len(": f32[]})"))
    one_line = repr(TensorDict({fits: torch.zeros(3)}, [3]))
    assert one_line == f"{head}{fits}: f32[]}})"
    assert len(one_line) == 80
    too_long = fits + "k"
    assert repr(TensorDict({too_long: torch.zeros(3)}, [3])) == (
        f"TensorDict(batch_size=[3], fields={{\n    {too_long}: f32[]}})"
    )


def test_repr_memmap_and_loaded(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.zeros(10), "b": {"c": torch.zeros(10)}}, [10])
    expected = "TensorDict(batch_size=[10], device=cpu, fields={a: f32[], b: {c: f32[]}})"
    assert repr(td.memmap(tmp_prefix)) == expected
    assert repr(TensorDict.load_memmap(tmp_prefix)) == expected
    assert repr(td.memmap_like()) == expected
    assert repr(td) == "TensorDict(batch_size=[10], fields={a: f32[], b: {c: f32[]}})"


def test_memmap_copy_existing_applies_to_the_new_tensordict(tmp_path):
    source = TensorDict({"a": torch.arange(4.0)}, [4]).memmap_(tmp_path / "first")
    with pytest.raises(RuntimeError, match="copy_existing=True"):
        source.memmap(tmp_path / "second")
    copy = source.memmap(tmp_path / "second", copy_existing=True)
    assert copy["a"].filename == str(tmp_path / "second" / "a.memmap")
    assert torch.equal(copy["a"], torch.arange(4.0))
    assert source["a"].filename == str(tmp_path / "first" / "a.memmap")


def test_flush_of_a_loaded_tree_reaches_the_files(tmp_path):
    TensorDict({"a": torch.zeros(4), "n": {"b": torch.zeros(4, 2)}}, [4]).memmap_(tmp_path / "t")
    loaded = TensorDict.load_memmap(tmp_path / "t", non_blocking=True)
    loaded["n", "b"][1] = 7.0
    loaded.flush()
    # flushing reads the buffers of untouched leaves without making tensors of them
    assert type(loaded._tensordict["a"]).__name__ == "_LazyLeaf"
    raw = torch.frombuffer(
        bytearray((tmp_path / "t" / "n" / "b.memmap").read_bytes()), dtype=torch.float32
    )
    assert raw.view(4, 2)[1].tolist() == [7.0, 7.0]
