"""Errors that code written for tensordict catches: RuntimeError there, RuntimeError here too."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as rs
import torch


def test_dual_classes_are_in_one_hierarchy() -> None:
    assert issubclass(rs.FileExistsRuntimeError, FileExistsError)
    assert issubclass(rs.FileExistsRuntimeError, RuntimeError)
    assert issubclass(rs.SymlinkError, rs.InvalidDirectoryError)
    assert issubclass(rs.SymlinkError, rs.InvalidTreeError)
    assert issubclass(rs.SymlinkError, RuntimeError)
    assert issubclass(rs.LockedError, rs.TensorDictError)
    assert issubclass(rs.LockedError, RuntimeError)
    for cls in (rs.FileExistsRuntimeError, rs.SymlinkError, rs.LockedError):
        assert cls.__module__ == "tensordict_rs"
        assert cls.__doc__


@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
def test_existing_file_is_a_runtime_error(pkg: object, tmp_path: Path) -> None:
    path = tmp_path / "x.memmap"
    pkg.MemoryMappedTensor.from_tensor(torch.zeros(3), filename=path)  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="already exists"):
        pkg.MemoryMappedTensor.from_tensor(torch.zeros(3), filename=path)  # type: ignore[attr-defined]


def test_existing_file_is_a_file_exists_error_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "x.memmap"
    rs.MemoryMappedTensor.from_tensor(torch.zeros(3), filename=path)
    with pytest.raises(FileExistsError) as info:
        rs.MemoryMappedTensor.from_tensor(torch.ones(3), filename=path)
    assert isinstance(info.value, rs.FileExistsRuntimeError)
    assert info.value.filename == os.fspath(path)
    assert info.value.errno == 17
    assert (rs.MemoryMappedTensor.from_filename(path, torch.float32, (3,)) == 0).all()


def test_existing_tree_with_existsok_false(tmp_path: Path) -> None:
    td = rs.TensorDict({"a": torch.zeros(3)}, [3])
    td.memmap(tmp_path / "t")
    with pytest.raises(RuntimeError) as info:
        td.memmap(tmp_path / "t", existsok=False)
    assert isinstance(info.value, FileExistsError)


@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
def test_write_through_symlink_is_a_runtime_error(pkg: object, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"unchanged")
    link = tmp_path / "file.memmap"
    link.symlink_to(target)
    with pytest.raises(RuntimeError, match="through symlink"):
        pkg.MemoryMappedTensor.from_tensor(torch.zeros(()), filename=link, existsok=True)  # type: ignore[attr-defined]
    assert target.read_bytes() == b"unchanged"


def test_write_through_symlink_keeps_the_precise_class(tmp_path: Path) -> None:
    link = tmp_path / "file.memmap"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(rs.InvalidTreeError) as info:
        rs.MemoryMappedTensor.from_tensor(torch.zeros(2), filename=link, existsok=True)
    assert isinstance(info.value, rs.SymlinkError)


def test_load_through_symlink(tmp_path: Path) -> None:
    rs.TensorDict({"a": torch.zeros(3)}, [3]).memmap(tmp_path / "t")
    moved = tmp_path / "a.moved"
    (tmp_path / "t" / "a.memmap").rename(moved)
    (tmp_path / "t" / "a.memmap").symlink_to(moved)
    with pytest.raises(RuntimeError, match="symlink") as info:
        rs.TensorDict.load_memmap(tmp_path / "t")
    assert isinstance(info.value, rs.InvalidDirectoryError)


@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
def test_locked_is_a_runtime_error(pkg: object) -> None:
    td = pkg.TensorDict({"a": torch.zeros(3)}, [3]).lock_()  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="locked"):
        td["b"] = torch.zeros(3)
    with pytest.raises(RuntimeError, match="locked"):
        del td["a"]


def test_locked_is_a_tensordict_error() -> None:
    td = rs.TensorDict({"a": torch.zeros(3)}, [3]).lock_()
    with pytest.raises(rs.LockedError):
        td.set("b", torch.zeros(3))
    with pytest.raises(rs.TensorDictError):
        td.to("cpu", torch.float64, inplace=True)


# Leaves a save refuses. Nested tensors are saved (tests/io/test_nested_leaves.py), except a
# jagged one whose ragged dim is not 1 (here 2: the components share their first dim).
LEAVES = {
    "jagged": lambda: torch.nested.nested_tensor(
        [torch.zeros(3, 4), torch.zeros(3, 5)], layout=torch.jagged
    ),
    "sparse": lambda: torch.eye(2).to_sparse(),
}


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("kind", sorted(LEAVES))
@pytest.mark.parametrize("prefix", [False, True])
def test_unsupported_leaves_name_the_key(kind: str, prefix: bool, tmp_path: Path) -> None:
    td = rs.TensorDict({"ok": torch.zeros(2), "odd": LEAVES[kind]()}, [2])
    with pytest.raises(rs.UnsupportedFormatError, match="'odd'"):
        td.memmap_(tmp_path / "t" if prefix else None)
    assert not td.is_memmap() and not td.is_locked
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    "key, value",
    [
        ("a", torch.zeros(3, 5)),
        ("a", torch.zeros(3, 4, 1)),
        ("a", torch.zeros(3)),
        (("n", "b"), torch.zeros(3, 5)),
    ],
)
@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
@pytest.mark.parametrize("how", ["set_", "set_inplace"])
def test_inplace_write_of_another_shape_is_value_and_runtime_error(
    pkg: Any, key: Any, value: torch.Tensor, how: str
) -> None:
    """``set_`` (and ``set(..., inplace=True)``) of a value that does not fit the entry raised
    torch's bare RuntimeError here; tensordict raises an error that is both a ValueError and a
    RuntimeError, naming the key and both shapes."""
    td = pkg.TensorDict({"a": torch.zeros(3, 4), "n": {"b": torch.zeros(3, 2)}}, [3])
    entry = td.get(key).shape
    with pytest.raises(ValueError) as info:
        if how == "set_":
            td.set_(key, value)
        else:
            td.set(key, value, inplace=True)
    assert isinstance(info.value, RuntimeError)
    text = str(info.value)
    assert repr(key if isinstance(key, str) else key[-1]) in text
    assert f"the value of shape {value.shape} does not fit the entry of shape {entry}" in text


def test_inplace_write_that_broadcasts_still_works() -> None:
    """A value that broadcasts to the entry is written, as in tensordict."""
    for pkg in (rs, ref):
        td = pkg.TensorDict({"a": torch.zeros(3, 4)}, [3])
        td.set_("a", torch.ones(3, 1))
        assert torch.equal(td["a"], torch.ones(3, 4))


@pytest.mark.parametrize(
    "index",
    [0, -1, slice(None), slice(0, 1), torch.tensor([0]), torch.tensor(0), [0], (0,), (None, 0)],
    ids=repr,
)
@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
def test_indexing_a_tensordict_without_batch_dims_is_a_runtime_error(pkg: Any, index: Any) -> None:
    """An index that uses a batch dim, on a TensorDict of batch size []: tensordict raises
    RuntimeError("indexing a tensordict with td.batch_dims==0 is not permitted ..."); this
    library raised IndexError."""
    td = pkg.TensorDict({"a": torch.zeros(3)}, [])
    with pytest.raises(RuntimeError, match=r"batch_dims==0 is not permitted\. Got index"):
        td[index]


@pytest.mark.parametrize(
    "index",
    [None, ..., (), (None, None), (None, ...), torch.tensor(True), torch.tensor(False)],
    ids=repr,
)
def test_indexing_without_batch_dims_by_what_adds_or_keeps_dims(index: Any) -> None:
    """``None``, ``...``, ``()`` and a 0-dim mask use no batch dim: they work, as in
    tensordict (a 0-dim mask adds a dim, as on a tensor)."""
    got = [pkg.TensorDict({"a": torch.zeros(3)}, [])[index] for pkg in (rs, ref)]
    assert got[0].batch_size == got[1].batch_size
    assert got[0]["a"].shape == got[1]["a"].shape
