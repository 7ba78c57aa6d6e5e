"""Keys, construction and non-tensor entries, side by side with tensordict 0.15.3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensordict as ref
import tensordict_rs as ours
import torch
from tensordict_rs import NonTensorData, TensorDict


def build(pkg: Any, lock: bool = False) -> Any:
    td = pkg.TensorDict(
        {
            "a": torch.arange(6.0).reshape(3, 2),
            "s": "text",
            "n": {"x": torch.ones(3, 4), "m": {"z": torch.zeros(3, dtype=torch.int32)}},
        },
        [3],
    )
    return td.lock_() if lock else td


def assert_same(mine: Any, theirs: Any) -> None:
    """Same batch size, lock, keys in order (nested too), dtypes, shapes, values."""
    assert isinstance(mine, TensorDict)
    assert mine.batch_size == theirs.batch_size
    assert mine.is_locked == theirs.is_locked
    assert mine.device == theirs.device
    assert mine.keys(include_nested=True) == list(theirs.keys(include_nested=True))
    for key in theirs.keys(include_nested=True):
        t, m = theirs[key], mine[key]
        if isinstance(t, torch.Tensor):
            assert (m.dtype, m.shape) == (t.dtype, t.shape), key
            assert torch.equal(m, t), key
        elif isinstance(t, ref.TensorDict):
            assert m.batch_size == t.batch_size, key
        else:
            assert m == t, key


OPS = {
    "select": lambda td: td.select("a", ("n", "x")),
    "select_list": lambda td: td.select(*["a", "s"]),
    "select_nested_whole": lambda td: td.select("n"),
    "select_deep": lambda td: td.select(("n", "m", "z")),
    "select_not_strict": lambda td: td.select("a", "zz", strict=False),
    "exclude": lambda td: td.exclude("a", ("n", "x")),
    "exclude_missing": lambda td: td.exclude("zz", ("n", "qq")),
    "exclude_nested_whole": lambda td: td.exclude("n"),
    "flatten_keys": lambda td: td.flatten_keys(),
    "flatten_keys_sep": lambda td: td.flatten_keys("/"),
    "unflatten_keys": lambda td: td.flatten_keys().unflatten_keys(),
    "unflatten_keys_sep": lambda td: td.flatten_keys("|").unflatten_keys("|"),
    "empty": lambda td: td.empty(),
    "empty_recurse": lambda td: td.empty(recurse=True),
    "clone_then_rename": lambda td: td.clone().rename_key_("a", "b"),
    "rename_nested": lambda td: td.clone().rename_key_(("n", "x"), ("n", "y")),
    "rename_across": lambda td: td.clone().rename_key_(("n", "x"), "top"),
}


@pytest.mark.parametrize("lock", [False, True], ids=["unlocked", "locked"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_key_op_matches_reference(name: str, lock: bool) -> None:
    op = OPS[name]
    assert_same(op(build(ours, lock)), op(build(ref, lock)))


ERRORS = {
    "select_missing": lambda td: td.select("zz"),
    "select_missing_nested": lambda td: td.select(("n", "zz")),
    "rename_exists": lambda td: td.rename_key_("a", "s", safe=True),
    "rename_missing": lambda td: td.rename_key_("zz", "q"),
    "rename_locked": lambda td: td.lock_().rename_key_("a", "b"),
    "select_inplace_locked": lambda td: td.lock_().select("a", inplace=True),
    "exclude_inplace_locked": lambda td: td.lock_().exclude("a", inplace=True),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_key_errors_match_reference(name: str) -> None:
    op = ERRORS[name]
    with pytest.raises(Exception) as theirs:
        op(build(ref))
    with pytest.raises(type(theirs.value)):
        op(build(ours))


def test_inplace_select_and_exclude() -> None:
    for pkg in (ours, ref):
        td = build(pkg)
        assert td.select("a", "n", inplace=True) is td
        assert sorted(td.keys()) == ["a", "n"]
        assert td.exclude(("n", "x"), inplace=True) is td
        assert list(td.keys(include_nested=True, leaves_only=True)) == ["a", ("n", "m", "z")]


def test_select_and_exclude_share_tensors() -> None:
    td = build(ours)
    assert td.select("a")["a"] is td["a"]
    assert td.exclude("s")["n", "x"] is td["n", "x"]
    assert td.flatten_keys()["n.x"] is td["n", "x"]


def test_select_keeps_lazy_leaves_lazy(tmp_path: Path) -> None:
    build(ours).memmap_(tmp_path / "td")
    loaded = TensorDict.load_memmap(tmp_path / "td")
    picked = loaded.select("a")
    assert type(picked._tensordict["a"]).__name__ == "_LazyLeaf"
    assert torch.equal(picked["a"], torch.arange(6.0).reshape(3, 2))


def test_to_dict_and_from_dict() -> None:
    mine, theirs = build(ours), build(ref)
    d_mine, d_theirs = mine.to_dict(), theirs.to_dict()
    assert list(d_mine) == list(d_theirs)
    assert d_mine["s"] == d_theirs["s"] == "text"
    assert torch.equal(d_mine["n"]["m"]["z"], d_theirs["n"]["m"]["z"])
    assert mine.to_dict(convert_tensors=True)["a"] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    source = {"a": torch.zeros(3, 4), "b": {"c": torch.zeros(3, 4, 5)}, "s": "x"}
    for kwargs in ({}, {"batch_size": [3]}, {"auto_batch_size": True}, {"batch_dims": 1}):
        assert_same(
            TensorDict.from_dict(source, **kwargs), ref.TensorDict.from_dict(source, **kwargs)
        )
    uneven = {"a": torch.zeros(3, 4), "b": {"c": torch.zeros(3, 5)}}
    assert_same(
        TensorDict.from_dict(uneven, auto_batch_size=True),
        ref.TensorDict.from_dict(uneven, auto_batch_size=True),
    )
    scalars = {"a": [1, 2, 3], "x": 1.5}
    mine_s = TensorDict.from_dict(scalars, batch_size=[3])
    theirs_s = ref.TensorDict.from_dict(scalars, batch_size=[3])
    assert torch.equal(mine_s["a"], theirs_s["a"]) and mine_s["x"] == theirs_s["x"] == 1.5
    with pytest.raises(ValueError):
        TensorDict.from_dict(source, batch_size=[3], batch_dims=1)


def test_fromkeys() -> None:
    for args in ((["a", "b"],), (["a", ("b", "c")], 1.0)):
        assert_same(TensorDict.fromkeys(*args), ref.TensorDict.fromkeys(*args))


def test_is_empty() -> None:
    mine, theirs = build(ours), build(ref)
    for op in (lambda t: t, lambda t: t.empty(), lambda t: t.empty(recurse=True)):
        assert op(mine).is_empty() == op(theirs).is_empty()
    nested_only = {"n": {"m": {}}}
    assert TensorDict(nested_only, []).is_empty() == ref.TensorDict(nested_only, []).is_empty()


def test_empty_keeps_batch_size_and_device(accel_device: torch.device) -> None:
    td = TensorDict({"a": torch.zeros(3, device=accel_device)}, [3], device=accel_device)
    out = td.empty()
    assert out.batch_size == torch.Size([3]) and out.device == accel_device and not out.keys()


# ----------------------------------------------------------------------------- construction


CONSTRUCT = {
    "keywords": lambda pkg: pkg.TensorDict(
        a=torch.zeros(3), b={"c": torch.ones(3)}, batch_size=[3]
    ),
    "tuple_keys": lambda pkg: pkg.TensorDict({("a", "b"): torch.zeros(3), "c": torch.ones(3)}, [3]),
    "tuple_keys_shared": lambda pkg: pkg.TensorDict(
        {("a", "b"): torch.zeros(3), ("a", "c"): torch.ones(3)}, [3]
    ),
    "list_ints": lambda pkg: pkg.TensorDict({"l": [1, 2, 3]}, [3]),
    "list_floats": lambda pkg: pkg.TensorDict({"l": [[1.0], [2.0], [3.0]]}, [3]),
    "list_no_batch": lambda pkg: pkg.TensorDict({"l": [1, 2]}, []),
    "numpy": lambda pkg: pkg.TensorDict({"l": np.arange(6.0).reshape(3, 2)}, [3]),
    "numpy_scalar": lambda pkg: pkg.TensorDict({"l": np.float32(2.0)}, []),
    "scalar_float": lambda pkg: pkg.TensorDict({"x": 0.5}, []),
    "scalar_int": lambda pkg: pkg.TensorDict({"x": 1}, []),
    "scalar_bool": lambda pkg: pkg.TensorDict({"x": True}, []),
}


@pytest.mark.parametrize("name", sorted(CONSTRUCT))
def test_construction_matches_reference(name: str) -> None:
    build_td = CONSTRUCT[name]
    assert_same(build_td(ours), build_td(ref))


def test_scalars_with_a_batch_size_are_refused_not_aliased() -> None:
    # The reference refuses; a stride-0 view would make one write change every row.
    for pkg in (ref, ours):
        with pytest.raises(RuntimeError, match="batch dimension mismatch"):
            pkg.TensorDict({"x": 0.0}, [3])
        td = pkg.TensorDict({}, [3])
        with pytest.raises(RuntimeError, match="Python scalars are stored as 0-dim tensors"):
            td.set("z", 1.0)
        with pytest.raises(RuntimeError, match="batch dimension mismatch"):
            pkg.TensorDict({"l": [1, 2]}, [3])


def test_lists_and_arrays_become_tensors() -> None:
    array = np.zeros((3, 2))
    td = TensorDict({"l": [1, 2, 3], "arr": array}, [3])
    assert type(td["l"]) is torch.Tensor and type(td["arr"]) is torch.Tensor
    td["arr"][0, 0] = 5.0  # torch.as_tensor shares the array's memory, as tensordict does
    theirs = ref.TensorDict({"arr": array}, [3])
    assert theirs["arr"][0, 0] == 5.0 and array[0, 0] == 5.0
    words = TensorDict({"w": ["a", "b", "c"]}, [3])
    assert words["w"] == ["a", "b", "c"]


def test_non_tensor_entries_like_the_reference() -> None:
    mine, theirs = build(ours), build(ref)
    assert mine["s"] == theirs["s"] == "text"
    m, t = mine.get("s"), theirs.get("s")
    assert isinstance(m, NonTensorData) and isinstance(t, ref.NonTensorData)
    assert m.data == t.data and m.batch_size == t.batch_size and m.device == t.device
    assert m.tolist() == t.tolist()
    assert [type(v).__name__ for v in mine.values()] == [type(v).__name__ for v in theirs.values()]
    assert mine.keys(leaves_only=True) == list(theirs.keys(leaves_only=True))
    assert mine.keys(True, True) == list(theirs.keys(True, True))


# --------------------------------------------------------------------------- indexed writes


def test_indexed_write_with_new_keys_preallocates() -> None:
    results = []
    for pkg in (ours, ref):
        td = pkg.TensorDict({"a": torch.zeros(3)}, [3])
        td[0] = {
            "a": torch.tensor(1.0),
            "extra": torch.tensor([2, 3]),
            "nest": {"q": torch.tensor(True)},
        }
        td[1:] = pkg.TensorDict({"a": torch.ones(2), "e2": torch.ones(2, 4).half()}, [2])
        results.append(td)
    assert_same(*results)


def test_preallocation_of_an_empty_tensordict() -> None:
    results = []
    for pkg in (ours, ref):
        td = pkg.TensorDict({}, [4])
        for i in range(4):
            td[i] = pkg.TensorDict({"obs": torch.full((2,), float(i)), "r": torch.tensor(i)}, [])
        results.append(td)
    assert_same(*results)


def test_indexed_write_with_a_new_key_on_a_locked_tensordict() -> None:
    for pkg in (ours, ref):
        td = pkg.TensorDict({"a": torch.zeros(3)}, [3]).lock_()
        with pytest.raises(RuntimeError, match="locked"):
            td[0] = {"new": torch.tensor(1.0)}


INDEX_ERRORS = {
    "int": lambda td: td[5],
    "negative": lambda td: td[-5],
    "tensor": lambda td: td[torch.tensor([0, 5])],
    "negative_tensor": lambda td: td[torch.tensor([-4])],
    "list": lambda td: td[[0, 7]],
    "second_dim": lambda td: td[:, 4],
    "write_int": lambda td: td.__setitem__(5, td[0].clone()),
}


@pytest.mark.parametrize("name", sorted(INDEX_ERRORS))
def test_out_of_range_rows_like_the_reference(name: str) -> None:
    op = INDEX_ERRORS[name]
    source = {"a": torch.zeros(3, 2)}
    with pytest.raises(IndexError) as theirs:
        op(ref.TensorDict(source, [3, 2]))
    with pytest.raises(IndexError) as mine:
        op(ours.TensorDict(source, [3, 2]))
    assert str(mine.value) == str(theirs.value)


def test_key_membership_like_the_reference() -> None:
    for pkg in (ours, ref):
        td = build(pkg)
        assert ("a",) in td.keys() and "a" in td.keys()
        assert ("n", "m", "z") in td.keys(include_nested=True)
        assert ("n", "z") not in td.keys(include_nested=True)
        assert ("n", "x") not in td.keys()  # tensordict 0.15.3: False, not an error
        with pytest.raises(TypeError):
            42 in td.keys()  # noqa: B015
        assert td.sorted_keys == ["a", "n", "s"]


@pytest.mark.parametrize(
    "dtype",
    [
        [("name", "U10"), ("age", "i4"), ("weight", "f4")],  # aligned: views
        [("a", "i8"), ("b", "i1")],  # packed: "a" cannot be viewed, copied
        [("a", ">i4"), ("b", "<f8")],  # non-native byte order: copied
        [("a", "f4", (3,)), ("b", "i2")],
        [("a", [("x", "f4"), ("y", "i4")]), ("b", "i4")],
    ],
)
def test_from_struct_array_shares_memory_as_tensordict(dtype: Any) -> None:
    # the tensors view the array where torch can (writes show both ways), else copy
    def run(pkg: Any) -> Any:
        x = np.zeros(3, dtype=dtype)
        td = pkg.TensorDict.from_struct_array(x)
        shared = {}
        for key, value in td.items(True, True):
            if isinstance(value, torch.Tensor):
                value += 1
                path = (key,) if isinstance(key, str) else key
                field = x
                for part in path:
                    field = field[part]
                shared[key] = (field.tolist(), value.tolist())
        return shared

    assert run(ours) == run(ref)


def test_from_struct_array_read_only_copies_as_tensordict() -> None:
    for pkg in (ref, ours):
        x = np.zeros(2, dtype=[("a", "f4"), ("b", "i4")])
        x.flags.writeable = False
        td = pkg.TensorDict.from_struct_array(x)
        td["a"] += 1
        assert x["a"].tolist() == [0.0, 0.0] and td["a"].tolist() == [1.0, 1.0]


def _named(pkg: Any) -> Any:
    return pkg.TensorDict(
        {
            "a": torch.zeros(3, 4),
            "n": pkg.TensorDict({"b": torch.zeros(3, 4, 2)}, [3, 4, 2], names=["x", "y", "z"]),
            "e": pkg.TensorDict({}, [3, 4]),
        },
        [3, 4],
        names=["x", "y"],
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"batch_size": [3]},
        {"batch_size": []},
        {"batch_size": [3, 4, 5]},
        {"names": ["p", "q"]},
        {"names": None},
        {"device": "cpu"},
        {"recurse": True},
        {"recurse": True, "batch_size": [3]},
        {"recurse": True, "names": ["p", "q"]},
        {"recurse": True, "names": None},
    ],
)
def test_empty_keeps_names_as_tensordict(kwargs: dict[str, Any]) -> None:
    def run(pkg: Any) -> Any:
        out = _named(pkg).empty(**kwargs)
        nested = {k: v.names for k, v in out.items(True) if isinstance(v, pkg.TensorDict)}
        return out.batch_size, out.names, nested

    assert run(ours) == run(ref)


@pytest.mark.parametrize("inplace", [False, True])
def test_flatten_unflatten_keys_names_and_empty_subtrees_as_tensordict(inplace: bool) -> None:
    # names kept; an empty nested TensorDict leaves no key (at any depth)
    def run(pkg: Any) -> Any:
        td = _named(pkg)
        td["m"] = pkg.TensorDict({"k": pkg.TensorDict({}, [3, 4])}, [3, 4])
        flat = td.flatten_keys(inplace=inplace)
        back = flat.clone().unflatten_keys(inplace=inplace)
        return (
            list(flat.keys(True)),
            flat.names,
            sorted(map(str, back.keys(True))),
            back.names,
            back["n"].names,
        )

    assert run(ours) == run(ref)


@pytest.mark.parametrize(
    "nested_batch, batch_dims, first",
    [
        ([], None, False),
        ([], None, True),  # the first entry sets the prefix, even an empty one
        ([3], None, False),
        ([3, 7], None, False),
        ([3, 4, 5, 6], None, False),
        ([], 2, False),
        ([3, 4, 5, 6], 2, False),
    ],
)
def test_auto_batch_size_empty_nested_as_tensordict(
    nested_batch: list[int], batch_dims: Any, first: bool
) -> None:
    # an empty nested TensorDict does not limit the batch size, and takes it if shorter
    def run(pkg: Any) -> Any:
        entries = [("a", torch.zeros(3, 4, 5)), ("b", pkg.TensorDict({}, nested_batch))]
        td = pkg.TensorDict(dict(entries[::-1] if first else entries), [])
        td.auto_batch_size_(batch_dims=batch_dims)
        return td.batch_size, td["b"].batch_size

    assert run(ours) == run(ref)


def test_auto_batch_size_nested_empty_trees_as_tensordict() -> None:
    def run(pkg: Any) -> Any:
        results = []
        for nested in ({"c": {}}, {"e": {}, "d": torch.zeros(3, 4)}):
            td = pkg.TensorDict({"a": torch.zeros(3, 4, 5), "b": nested}, [])
            td.auto_batch_size_()
            trees = {k: v.batch_size for k, v in td.items(True) if isinstance(v, pkg.TensorDict)}
            results.append((td.batch_size, trees))
        return results

    assert run(ours) == run(ref)
