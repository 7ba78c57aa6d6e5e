"""Hostile stack and nested-tensor metadata: refused with an error naming the key, never loaded as
wrong data (the reference grows short files, ignores long ones and trusts every length)."""

from __future__ import annotations

import json
import struct
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as ours
import torch
from tensordict_rs import TensorDict

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A directory in the reference's layout: a stack, a 2-D stack, a strided nested leaf."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(5.0), torch.ones(2)])
    td = ref.TensorDict({"x": torch.zeros(3), "seq": nested}, [3])
    td["text"] = ["a", "b", "c"]
    td["grid"] = ref.NonTensorStack.from_list([["a", "b"], ["c", "d"], ["e", "f"]])
    td.memmap(tmp_path / "d")
    return tmp_path / "d"


def edit_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    meta = json.loads(path.read_bytes())
    change(meta)
    path.write_text(json.dumps(meta))


def refused(path: Path, key: str, error: type[Exception] = ours.InvalidDirectoryError) -> str:
    with pytest.raises(error) as info:
        TensorDict.load_memmap(path)
    message = str(info.value)
    assert any(form in message for form in (f"'{key}'", f'"{key}"', f"/{key}/")), message
    return str(info.value)


def test_untouched_directory_loads(saved: Path) -> None:
    td = TensorDict.load_memmap(saved)
    assert td["text"] == ["a", "b", "c"] and td["seq"].is_nested


# ------------------------------------------------------------------------------------------
# Stacks


STACK_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "data_not_a_list": lambda m: m.update(data=5),
    "too_few_rows": lambda m: m.update(data=["a", "b"]),
    "too_many_rows": lambda m: m.update(data=["a", "b", "c", "d"]),
    "missing_data_and_members": lambda m: m.pop("data"),
    "bad_device": lambda m: m.update(device="gpu:x"),
    "stack_dim_not_an_int": lambda m: m.update(stack_dim="0"),
    "unknown_pickle_name": lambda m: m.update(data="other.pkl"),
    "shape_disagrees_with_data": lambda m: m.update(shape=[4]),
}


@pytest.mark.parametrize("name", sorted(STACK_EDITS))
def test_hostile_stack_metadata_is_refused(saved: Path, name: str) -> None:
    edit_json(saved / "text" / "meta.json", STACK_EDITS[name])
    refused(saved, "text")


def test_pickled_stack_is_refused_as_unsupported(saved: Path) -> None:
    edit_json(saved / "text" / "meta.json", lambda m: m.update(data="pickle.pkl"))
    (saved / "text" / "pickle.pkl").write_bytes(b"\x80\x04K\x01.")
    message = refused(saved, "text", ours.UnsupportedFormatError)
    assert "pickle" in message


def test_ragged_grid_is_refused(saved: Path) -> None:
    """The parent's batch is 1-D, so a ragged 2-D grid is still a 1-D stack of lists; its rows
    must number 3."""
    edit_json(saved / "grid" / "meta.json", lambda m: m.update(data=[["a", "b"], ["c"]]))
    refused(saved, "grid")


def test_stack_entry_pointing_at_a_missing_directory(saved: Path) -> None:
    for child in (saved / "text").iterdir():
        child.unlink()
    (saved / "text").rmdir()
    refused(saved, "text")


# ------------------------------------------------------------------------------------------
# Nested leaves


def _shape_file(saved: Path) -> Path:
    return saved / "seq.shape.memmap"


def _values_file(saved: Path) -> Path:
    return saved / "seq.memmap"


def _truncate(path: Path, nbytes: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:nbytes])


NESTED_EDITS: dict[str, Callable[[Path], None]] = {
    "shape_file_too_short": lambda d: _truncate(_shape_file(d), 16),
    "shape_file_too_long": lambda d: _shape_file(d).write_bytes(
        _shape_file(d).read_bytes() + b"\0" * 8
    ),
    "shape_file_missing": lambda d: _shape_file(d).unlink(),
    "values_file_too_short": lambda d: _truncate(_values_file(d), 8),
    "values_file_too_long": lambda d: _values_file(d).write_bytes(
        _values_file(d).read_bytes() + b"\0" * 4
    ),
    "negative_length": lambda d: _shape_file(d).write_bytes(struct.pack("<3q", 3, -5, 2)),
    "lengths_disagree_with_values": lambda d: _shape_file(d).write_bytes(
        struct.pack("<3q", 3, 6, 2)
    ),
    "overflowing_length": lambda d: _shape_file(d).write_bytes(struct.pack("<3q", 3, 2**62, 2**62)),
    "components_disagree_with_batch": lambda d: edit_json(
        d / "meta.json", lambda m: m["seq"].update(shape=[2, 1])
    ),
    "shape_of_shapes_not_2d": lambda d: edit_json(
        d / "meta.json", lambda m: m["seq"].update(shape=[3])
    ),
    "unknown_layout": lambda d: edit_json(
        d / "meta.json", lambda m: m["seq"].update(layout="torch.sparse_coo")
    ),
    "layout_on_a_dense_leaf": lambda d: edit_json(
        d / "meta.json", lambda m: m["x"].update(layout="torch.jagged")
    ),
}


@pytest.mark.parametrize("name", sorted(NESTED_EDITS))
def test_hostile_nested_metadata_is_refused(saved: Path, name: str) -> None:
    NESTED_EDITS[name](saved)
    key = "x" if name == "layout_on_a_dense_leaf" else "seq"
    refused(saved, key, ours.TensorDictError)


def test_reference_loads_a_short_shape_file_as_wrong_data(saved: Path) -> None:
    """Why the checks matter: the reference loads the damaged file without a word, and the
    lengths it gives back are not the ones saved (3, 5, 2): a missing length reads as zero."""
    _truncate(_shape_file(saved), 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = ref.TensorDict.load_memmap(saved)["seq"]
    lengths = [t.numel() for t in loaded.unbind(0)]
    assert len(lengths) == 3 and lengths != [3, 5, 2] and lengths[2] == 0


def test_hostile_archive_is_refused(tmp_path: Path, saved: Path) -> None:
    """The same checks run on a .tdz archive's entries."""
    from tensordict._archive import _pack_dir  # packs the files as they are, unchecked

    _truncate(_shape_file(saved), 16)
    _pack_dir(saved, tmp_path / "a.tdz", compression=None)
    with pytest.raises(ours.TensorDictError, match=r"""['"]seq['"]"""):
        TensorDict.load_memmap(tmp_path / "a.tdz")
