"""meta.json files that are valid but unusual load as tensordict 0.15.3 loads them.

The loader parses meta.json on a typed fast path and hands any file it does not fully
understand to the generic parser (``rust/format/fast.rs``); these tests edit reference-written
files in the ways that matter (key order, escapes, keys that the fast path leaves to the
generic code, duplicates, whitespace) and compare the loaded trees with the reference's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch
from tensordict_rs import TensorDict, TensorDictError
from tensordict_rs.cli.info import report


def saved(path: Path) -> Path:
    """A reference-written tree: leaves of several dtypes, a sub-tree, a non-tensor value."""
    td = tensordict.TensorDict(
        {
            "zeta": torch.arange(6, dtype=torch.float32).reshape(3, 2),
            "data": torch.tensor([1, 2, 3], dtype=torch.int64),
            "alpha": torch.tensor([True, False, True]),
            "mid": {"b": torch.ones(3, 2, dtype=torch.bfloat16), "a": torch.zeros(3)},
        },
        [3],
    )
    td["label"] = "hello"
    td.memmap(path)
    return path


def edit_text(path: Path, change: Callable[[str], str]) -> None:
    meta = path / "meta.json"
    meta.write_text(change(meta.read_text()))


def assert_same(ours: Any, ref: Any, ordered: bool) -> None:
    if ordered:
        assert list(ours.keys()) == list(ref.keys())
    assert sorted(ours.keys()) == sorted(ref.keys())
    for key in ref.keys():
        if isinstance(ref[key], tensordict.TensorDictBase):
            assert_same(ours[key], ref[key], ordered)
        elif isinstance(ref[key], torch.Tensor):
            assert ours[key].dtype == ref[key].dtype
            assert torch.equal(ours[key], ref[key].clone())
        else:
            assert ours[key] == ref[key]


def reorder(text: str) -> str:
    meta = json.loads(text)
    return json.dumps(dict(reversed(list(meta.items()))))


def escape_keys(text: str) -> str:
    # "zeta" -> "\u007aeta", "shape" -> "\u0073hape": the same keys, written with escapes
    return text.replace('"zeta"', '"\\u007aeta"').replace('"shape"', '"\\u0073hape"')


def compact(text: str) -> str:
    return json.dumps(json.loads(text), separators=(",", ":"))


def spaced(text: str) -> str:
    return json.dumps(json.loads(text), indent=4)


def names_null(text: str) -> str:
    meta = json.loads(text)
    meta["_names"] = None
    return json.dumps(meta)


def duplicate_leaf(text: str) -> str:
    # the first "alpha" says float64 [3, 7]; the last one (which json.load keeps) is the truth
    if '"alpha"' not in text:
        return text
    body = text.lstrip()[1:]
    first = '"alpha": {"device": "cpu", "shape": [3, 7], "dtype": "torch.float64"}, '
    return "{" + first + body


@pytest.mark.parametrize(
    "change",
    [reorder, escape_keys, compact, spaced, names_null, duplicate_leaf],
    ids=lambda f: f.__name__,
)
def test_unusual_meta_loads_as_the_reference_loads_it(tmp_path: Path, change: Any) -> None:
    path = saved(tmp_path / "td")
    edit_text(path, change)
    edit_text(path / "mid", change)
    ref = tensordict.TensorDict.load_memmap(path)
    ours = TensorDict.load_memmap(path)
    # Our keys follow the file's order (see below); the reference orders a reordered file
    # its own way, so only files in the writer's order are compared key by key in order.
    assert_same(ours, ref, ordered=change is not reorder)
    assert tuple(ours.batch_size) == tuple(ref.batch_size)


def test_file_order_is_the_tree_order(tmp_path: Path) -> None:
    path = saved(tmp_path / "td")
    edit_text(path, reorder)
    entries = {"zeta", "data", "alpha", "mid", "label"}
    keys = [k for k in json.loads((path / "meta.json").read_text()) if k in entries]
    assert keys != sorted(keys)
    assert list(TensorDict.load_memmap(path).keys()) == keys
    assert list(json.loads(report(path, as_json=True))["tree"]["entries"]) == keys


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda t: t.replace('"torch.int64"', '"torch.int65"'), "unknown dtype"),
        (lambda t: t.replace('"shape": [3]', '"shape": [3.0]', 1), "non-negative"),
        (lambda t: t.replace('"device": "cpu", "_type"', '"device": "gpu", "_type"'), "a device"),
        (lambda t: t + " x", "not valid JSON"),
        (lambda t: t.replace('"data": {', '"data": 7, "_x": {', 1), "not an object"),
    ],
    ids=["dtype", "float_dim", "device", "trailing", "data_not_object"],
)
def test_damaged_meta_names_the_file(tmp_path: Path, change: Any, words: str) -> None:
    path = saved(tmp_path / "td")
    before = (path / "meta.json").read_text()
    edit_text(path, change)
    assert (path / "meta.json").read_text() != before, "the damage did not apply"
    with pytest.raises(TensorDictError) as info:
        TensorDict.load_memmap(path)
    assert words in str(info.value) and str(path / "meta.json") in str(info.value)


def test_leaf_marked_nested_without_its_shape_table_is_refused(tmp_path: Path) -> None:
    """``"is_nested": true`` on a dense leaf declares a nested leaf (issue 21): without the table
    of its components' shapes the load refuses, naming the key's missing file."""
    path = saved(tmp_path / "td")
    edit_text(path, lambda t: t.replace('"is_nested": false', '"is_nested": true', 1))
    with pytest.raises(TensorDictError) as info:
        TensorDict.load_memmap(path)
    assert "component shapes" in str(info.value) and ".shape.memmap" in str(info.value)
