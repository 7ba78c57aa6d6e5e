"""Entries: get, keys/values/items, membership, set, update, deletion."""

from __future__ import annotations

import pytest
import torch
from tensordict_rs import NonTensorData, TensorDict

from .._trees import make_td

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
        td["missing"]


def test_get_missing_gives_none_as_tensordict() -> None:
    """tensordict 0.15.3's ``get`` without a default gives None for a missing key (it raised
    here); ``set_get_defaults_to_none(False)`` (deprecated there and here) makes it raise."""
    import tensordict as ref
    import tensordict_rs as rs
    from tensordict_rs._core import nontensor_options

    for pkg in (rs, ref):
        td = pkg.TensorDict({"a": torch.zeros(2), "n": {"x": torch.ones(2)}}, [2])
        assert td.get("missing") is None and td.get(("n", "missing")) is None
        assert td.get(("missing", "x")) is None
        with pytest.warns(DeprecationWarning):
            pkg.set_get_defaults_to_none(False)
        try:
            with pytest.raises(KeyError):
                td.get("missing")
            assert td.get("missing", 3) == 3
        finally:
            with pytest.warns(DeprecationWarning):
                pkg.set_get_defaults_to_none(True)
        with pytest.warns(DeprecationWarning):
            assert pkg.get_defaults_to_none() is True
    assert nontensor_options.get_returns_none()


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


def test_update_of_another_shape_names_the_key_as_tensordict() -> None:
    """A value that cannot be copied into its entry raised torch's bare error: it now names
    the key and both shapes, in tensordict's words (a RuntimeError in both libraries)."""
    import tensordict

    for lib in (tensordict, __import__("tensordict_rs")):
        td = lib.TensorDict({"w": torch.zeros(1, 4), "n": {"c": torch.zeros(1, 1)}}, [1])
        with pytest.raises(
            RuntimeError,
            match=r"update_\(\) cannot copy the value of shape "
            r"torch.Size\(\[1, 3\]\) under the key 'w' into the entry of "
            r"shape torch.Size\(\[1, 4\]\)",
        ):
            td.update_({"w": torch.zeros(1, 3)})
    td = TensorDict({"n": {"c": torch.zeros(1, 1)}}, [1])
    with pytest.raises(RuntimeError, match=r"under the key \('n', 'c'\)"):
        td.update_({"n": {"c": torch.zeros(1, 2)}})


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


@pytest.mark.parametrize("lib", ["ref", "rs"])
def test_update_signature_matches_tensordict(lib: str) -> None:
    """Positional clone, keyword entries, keys_to_update, non_blocking, the lock and a source
    of another batch size, run on both libraries with the same expectations."""
    import tensordict

    TD = tensordict.TensorDict if lib == "ref" else TensorDict
    td = TD({"a": torch.zeros(3), "n": {"x": torch.zeros(3), "y": torch.zeros(3)}}, [3])
    src = torch.ones(3)
    td.update({"b": src}, True)  # clone, positionally
    assert td["b"] is not src and torch.equal(td["b"], src)
    inner = torch.ones(3)
    td.update({"new": {"x": inner}}, clone=True)  # a new nested entry from a plain mapping
    assert td["new", "x"] is not inner and torch.equal(td["new", "x"], inner)
    td.update(c=torch.full((3,), 2.0))  # keyword entries
    assert torch.equal(td["c"], torch.full((3,), 2.0))
    td.update({"a": torch.ones(3)}, a=torch.full((3,), 4.0))  # keywords win
    assert torch.equal(td["a"], torch.full((3,), 4.0))
    new = {
        "a": torch.full((3,), 7.0),
        "n": {"x": torch.full((3,), 7.0), "y": torch.full((3,), 7.0)},
    }
    td.update(new, keys_to_update=[("n", "x")], non_blocking=False)
    assert torch.equal(td["n", "x"], torch.full((3,), 7.0))
    assert torch.equal(td["a"], torch.full((3,), 4.0)) and torch.equal(td["n", "y"], torch.zeros(3))
    assert td.update(new, keys_to_update=[]) is td
    assert torch.equal(td["a"], torch.full((3,), 4.0))
    td.update({("n", "z"): torch.ones(3)})  # a nested key in a mapping
    assert torch.equal(td["n", "z"], torch.ones(3))
    with pytest.raises(RuntimeError, match="update_batch_size"):
        td.update(TD({"a": torch.zeros(5)}, [5]))
    assert td.batch_size == (3,)
    flat = TD({"a": torch.zeros(3)}, [3])
    flat.update(TD({"a": torch.ones(5), "b": torch.ones(5)}, [5]), update_batch_size=True)
    assert flat.batch_size == (5,) and torch.equal(flat["b"], torch.ones(5))
    with pytest.raises(RuntimeError, match="not present in the source"):
        TD({"a": torch.zeros(3), "q": torch.zeros(3)}, [3]).update(
            TD({"a": torch.ones(5)}, [5]), update_batch_size=True
        )
    td.lock_()
    with pytest.raises(RuntimeError, match="lock"):
        td.update({"a": torch.zeros(3)})
    a = td["a"]
    td.update({"a": torch.zeros(3)}, inplace=True)
    assert td["a"] is a and torch.equal(a, torch.zeros(3))


@pytest.mark.parametrize("lib", ["ref", "rs"])
def test_update__signature_matches_tensordict(lib: str) -> None:
    import tensordict

    TD = tensordict.TensorDict if lib == "ref" else TensorDict
    td = TD({"a": torch.zeros(3), "n": {"x": torch.zeros(3), "y": torch.zeros(3)}}, [3])
    a = td["a"]
    td.update_(a=torch.ones(3))
    assert td["a"] is a and torch.equal(a, torch.ones(3))
    new = {
        "a": torch.full((3,), 5.0),
        "n": {"x": torch.full((3,), 5.0), "y": torch.full((3,), 5.0)},
    }
    td.update_(new, keys_to_update=[("n", "y")], non_blocking=False)
    assert torch.equal(td["n", "y"], torch.full((3,), 5.0))
    assert torch.equal(td["n", "x"], torch.zeros(3)) and torch.equal(a, torch.ones(3))
    src = torch.full((3,), 6.0)
    td.update_({"a": src}, True)
    assert torch.equal(a, src)
    td.set_("a", torch.full((3,), 8.0), non_blocking=False)
    assert torch.equal(a, torch.full((3,), 8.0))
    with pytest.raises(KeyError):
        td.update_(missing=torch.ones(3))
