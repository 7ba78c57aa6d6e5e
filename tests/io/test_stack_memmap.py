"""A NonTensorStack saved on its own (``stack.memmap(prefix)``, ``memmap_``, ``memmap_like``,
``load_memmap``), side by side with tensordict 0.15.3: the same directory, read both ways, the
file rewritten after every in-place write, the lock of a memory-mapped stack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as ours
import torch
from tensordict_rs import InvalidDirectoryError, NonTensorData, NonTensorStack, TensorDict

LIBS = [ours, ref]


def _grid(pkg: Any) -> Any:
    """tensordict's test_memmap_stack data: a [3, 2] stack of ints."""
    row = torch.stack([pkg.NonTensorData(data=0), pkg.NonTensorData(data=1)])
    return torch.stack([row] * 3)


def _meta(path: Path) -> dict[str, Any]:
    return json.loads((path / "meta.json").read_text())


@pytest.mark.parametrize("writer", LIBS, ids=["rs", "ref"])
@pytest.mark.parametrize("reader", LIBS, ids=["rs", "ref"])
def test_saved_stack_moves_both_ways(writer: Any, reader: Any, tmp_path: Path) -> None:
    data = _grid(writer)
    saved = data.memmap(tmp_path / "s")
    assert saved.is_memmap() and saved[0].is_memmap()
    assert saved.tolist() == data.tolist() == [[0, 1]] * 3
    loaded = reader.TensorDict.load_memmap(tmp_path / "s")
    assert type(loaded).__name__ == "NonTensorStack"
    assert loaded.tolist() == [[0, 1]] * 3 and loaded.batch_size == torch.Size([3, 2])
    meta = _meta(tmp_path / "s")
    assert (meta["stack_dim"], meta["device"], meta["data"]) == (0, None, [[0, 1]] * 3)


@pytest.mark.parametrize("pkg", LIBS, ids=["rs", "ref"])
def test_strings_stack_and_class_method(pkg: Any, tmp_path: Path) -> None:
    stack = pkg.NonTensorStack.from_list(["a", "é 日本", ""])
    stack.memmap_(tmp_path / "s")
    assert stack.is_memmap()
    back = ours.NonTensorStack.load_memmap(tmp_path / "s")
    assert back.tolist() == ["a", "é 日本", ""] and back.is_memmap()
    assert ref.TensorDict.load_memmap(tmp_path / "s").tolist() == ["a", "é 日本", ""]


@pytest.mark.parametrize("pkg", LIBS, ids=["rs", "ref"])
def test_memmap_leaves_the_source_and_memmap_like_keeps_values(pkg: Any, tmp_path: Path) -> None:
    data = _grid(pkg)
    out = data.memmap(tmp_path / "a")
    assert out is not data and not data.is_memmap()
    like = data.memmap_like(tmp_path / "b")
    assert like.is_memmap()
    assert pkg.TensorDict.load_memmap(tmp_path / "b").tolist() == data.tolist()


@pytest.mark.parametrize("pkg", LIBS, ids=["rs", "ref"])
def test_writes_into_a_saved_stack_rewrite_its_file(pkg: Any, tmp_path: Path) -> None:
    """tensordict's test_memmap_stack_updates, through the public calls."""
    data = _grid(pkg).clone()
    data.memmap_(tmp_path)

    def on_disk() -> Any:
        return pkg.TensorDict.load_memmap(tmp_path).tolist()

    other = torch.stack([torch.stack([pkg.NonTensorData(data=2), pkg.NonTensorData(data=3)])] * 3)
    with pytest.raises(RuntimeError, match="locked"):
        data.update(other)
    data.update(other, inplace=True, non_blocking=False)
    assert data.tolist() == on_disk() == [[2, 3]] * 3
    other = torch.stack([torch.stack([pkg.NonTensorData(data=4), pkg.NonTensorData(data=5)])] * 3)
    data.update_(other)
    assert data.tolist() == on_disk() == [[4, 5]] * 3
    data.update(pkg.NonTensorData(data=6), inplace=True, non_blocking=False)
    assert data.tolist() == on_disk() == [[6, 6]] * 3
    data.update_(pkg.NonTensorData(data=7))
    assert data.tolist() == on_disk() == [[7, 7]] * 3
    data[0, 0] = pkg.NonTensorData(data=99)
    assert data.tolist() == on_disk() == [[99, 7], [7, 7], [7, 7]]
    data.update_at_(pkg.NonTensorData(data=99), (0, 1))
    assert data.tolist() == on_disk() == [[99, 99], [7, 7], [7, 7]]
    assert data.is_memmap()


def test_anonymous_memmap_marks_only(tmp_path: Path) -> None:
    for pkg in LIBS:
        stack = pkg.NonTensorStack("a", "b")
        assert stack.memmap_() is stack and stack.is_memmap()
    assert list(tmp_path.iterdir()) == []


def test_a_directory_holding_a_tree_is_not_replaced(tmp_path: Path) -> None:
    TensorDict({"a": torch.zeros(2)}, [2]).memmap(tmp_path)
    before = (tmp_path / "meta.json").read_bytes()
    with pytest.raises(InvalidDirectoryError, match="something other than a NonTensorStack"):
        NonTensorStack("a", "b").memmap(tmp_path)
    assert (tmp_path / "meta.json").read_bytes() == before
    assert TensorDict.load_memmap(tmp_path)["a"].tolist() == [0.0, 0.0]


def test_existsok_false_and_symlink_refused(tmp_path: Path) -> None:
    NonTensorStack("a").memmap(tmp_path / "s")
    with pytest.raises(RuntimeError, match="already exists"):
        NonTensorStack("b").memmap(tmp_path / "s", existsok=False)
    (tmp_path / "link").symlink_to(tmp_path / "s")
    with pytest.raises(ours.SymlinkError):
        NonTensorStack("b").memmap(tmp_path / "link")
    assert NonTensorStack.load_memmap(tmp_path / "s").tolist() == ["a"]


def test_non_json_values_refused_naming_the_directory(tmp_path: Path) -> None:
    with pytest.raises(ours.InvalidTreeError, match="'s'"):
        NonTensorStack(1 + 2j, 3).memmap(tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_hostile_stack_meta_refused(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "meta.json").write_text(
        '{"_type":"<class \'tensordict.tensorclass.NonTensorStack\'>","stack_dim":5,'
        '"device":null,"data":["a","b"]}'
    )
    with pytest.raises(InvalidDirectoryError, match="stack_dim"):
        NonTensorStack.load_memmap(tmp_path / "s")
    with pytest.raises(InvalidDirectoryError, match="stack_dim"):
        TensorDict.load_memmap(tmp_path / "s")


def test_share_non_tensor_on_a_stack(tmp_path: Path) -> None:
    stack = NonTensorStack("a", "b").memmap_(tmp_path / "s", share_non_tensor=True)
    assert stack.is_shared() and stack.is_memmap()
    td = TensorDict({"s": stack}, [2])
    td.get("s")[1] = "c"
    assert NonTensorStack.load_memmap(tmp_path / "s").tolist() == ["a", "c"]
    assert isinstance(td.get("s")[0], NonTensorData)
