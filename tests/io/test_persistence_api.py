"""Persistence names (save/load/load_memmap_/memmap_refresh_) and MemoryMappedTensor
constructors, side by side with tensordict 0.15.3."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensordict as ref
import tensordict_rs as rs
import torch


def make(pkg: Any) -> Any:
    return pkg.TensorDict(
        {"a": torch.arange(3.0), "n": {"b": torch.ones(3, 2, dtype=torch.int16)}}, [3]
    )


def plain(td: Any) -> dict[Any, torch.Tensor]:
    return {
        k: v.as_subclass(torch.Tensor).clone()
        for k, v in td.items(include_nested=True, leaves_only=True)
    }


def assert_same(ours: Any, theirs: Any) -> None:
    a, b = plain(ours), plain(theirs)
    assert a.keys() == b.keys()
    for key in b:
        assert a[key].dtype == b[key].dtype
        torch.testing.assert_close(a[key], b[key])


@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
def test_save_returns_a_saved_copy_and_load_reads_it(pkg: Any, tmp_path: Path) -> None:
    td = make(pkg)
    saved = td.save(tmp_path / "x")
    assert saved is not td and saved.is_memmap() and saved.is_locked
    assert not td.is_memmap() and not td.is_locked
    loaded = pkg.TensorDict.load(tmp_path / "x")
    assert not loaded.is_locked
    assert_same(loaded, td)


def test_save_and_load_move_both_ways(tmp_path: Path) -> None:
    make(rs).save(tmp_path / "ours")
    make(ref).save(tmp_path / "theirs")
    assert_same(ref.TensorDict.load(tmp_path / "ours"), rs.TensorDict.load(tmp_path / "theirs"))


@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
def test_memmap_of_a_memmapped_tensordict_shares_the_tensors(pkg: Any, tmp_path: Path) -> None:
    td0 = make(pkg).memmap_(tmp_path / "y")
    td1 = td0.memmap()
    assert td1 is not td0
    assert td1["a"] is td0["a"] and td1["n", "b"] is td0["n", "b"]
    assert td0.memmap(tmp_path / "y")["a"] is td0["a"]
    anon = make(pkg).memmap_()
    assert anon.memmap()["a"] is anon["a"]


@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
def test_load_memmap_into_an_existing_tensordict(pkg: Any, tmp_path: Path) -> None:
    pkg.TensorDict({"a": torch.ones(3), "n": {"b": torch.full((3,), 2.0)}}, [3]).save(
        tmp_path / "p"
    )
    td = pkg.TensorDict({"a": torch.zeros(3), "c": torch.zeros(3), "n": {"b": torch.zeros(3)}}, [3])
    nested = td["n"]
    out = td.load_memmap_(tmp_path / "p")
    assert out is td and td["n"] is nested
    assert sorted(td.keys()) == ["a", "n"]
    assert (td["a"] == 1).all() and (td["n", "b"] == 2).all()
    assert type(td["a"]).__name__ == "MemoryMappedTensor"


@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
def test_memmap_refresh_sees_another_writer(pkg: Any, tmp_path: Path) -> None:
    td = pkg.TensorDict({"a": torch.zeros(3)}, [3]).memmap(tmp_path / "r")
    pkg.TensorDict({"a": torch.ones(3), "b": torch.ones(3)}, [3]).memmap(tmp_path / "r")
    assert td.memmap_refresh_() is td
    assert sorted(td.keys()) == ["a", "b"] and (td["a"] == 1).all()
    assert td.is_memmap() and td.is_locked
    with pytest.raises(RuntimeError, match="not memory mapped"):
        make(pkg).memmap_refresh_()


def test_load_memmap_keywords(tmp_path: Path) -> None:
    make(rs).save(tmp_path / "k")
    assert_same(rs.TensorDict.load_memmap(tmp_path / "k", num_threads=4), make(rs))
    out = make(rs).zero_()
    assert rs.TensorDict.load_memmap(tmp_path / "k", out=out) is out
    assert_same(out, make(rs))
    # allow_pickle=True loads a directory without pickles, as in tensordict ...
    assert_same(rs.TensorDict.load_memmap(tmp_path / "k", allow_pickle=True), make(rs))
    for bad in (0, 1, np.bool_(True)):  # ... and, as there, only a bool or None is taken
        for pkg in (rs, ref):
            with pytest.raises(TypeError, match="allow_pickle must be a bool or None"):
                pkg.TensorDict.load_memmap(tmp_path / "k", allow_pickle=bad)


@pytest.mark.parametrize("allow_pickle", [False, True])
def test_pickled_entries_are_never_loaded(tmp_path: Path, allow_pickle: bool) -> None:
    ref.TensorDict({"n": {"v": ref.NonTensorData(1 + 2j)}}, []).memmap(tmp_path / "p")
    assert (tmp_path / "p" / "n" / "v" / "other.pickle").exists()
    with pytest.raises(rs.UnsupportedFormatError, match=r"pickle.*n/v/meta\.json"):
        rs.TensorDict.load_memmap(tmp_path / "p", allow_pickle=allow_pickle)
    loaded = ref.TensorDict.load_memmap(tmp_path / "p", allow_pickle=True)
    assert loaded["n", "v"] == 1 + 2j  # (tensordict unpickles it)


@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
def test_return_early(pkg: Any, tmp_path: Path) -> None:
    now = make(pkg).memmap_(tmp_path / "e0", return_early=True)  # one thread: no future
    assert isinstance(now, pkg.TensorDict) and now.is_memmap()
    future = make(pkg).memmap(tmp_path / "e1", num_threads=2, return_early=True)
    assert type(future).__name__ == "TensorDictFuture"
    result = future.result()
    assert result.is_memmap() and (result["a"] == torch.arange(3.0)).all()
    assert future.futures and future.resulting_td is result


def test_return_early_reports_the_error(tmp_path: Path) -> None:
    make(rs).memmap(tmp_path / "x")
    future = make(rs).memmap(tmp_path / "x", num_threads=2, return_early=True, existsok=False)
    assert isinstance(future, rs.TensorDictFuture)
    with pytest.raises(FileExistsError):
        future.result()


@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
def test_from_filename_creates_a_missing_file(pkg: Any, tmp_path: Path) -> None:
    path = tmp_path / "new.memmap"
    t = pkg.MemoryMappedTensor.from_filename(path, dtype=torch.float64, shape=[2, 3])
    assert path.stat().st_size == 48 and (t == 0).all()
    t.copy_(torch.arange(6).view(2, 3))
    again = pkg.MemoryMappedTensor.from_filename(path, dtype=torch.float64, shape=[2, 3])
    assert (again.view(-1) == torch.arange(6)).all()


def test_from_filename_refuses_to_grow_a_short_file(tmp_path: Path) -> None:
    path = tmp_path / "short.memmap"
    path.write_bytes(b"\x00" * 8)
    with pytest.raises(rs.InvalidDirectoryError):
        rs.MemoryMappedTensor.from_filename(path, dtype=torch.float64, shape=[4])
    assert path.stat().st_size == 8


@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
def test_list_source_is_float32(pkg: Any) -> None:
    t = pkg.MemoryMappedTensor([1, 2, 3])
    assert t.dtype == torch.float32 and t.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
def test_handler_and_from_storage(pkg: Any, tmp_path: Path) -> None:
    t = pkg.MemoryMappedTensor.from_tensor(torch.arange(10.0))
    assert t[:3]._handler is t._handler is not None
    with pytest.warns(DeprecationWarning):
        view = pkg.MemoryMappedTensor.from_handler(t._handler, torch.float32, [2, 5])
    view[0, 0] = 42.0
    assert t[0] == 42.0
    s = pkg.MemoryMappedTensor.from_storage(t.untyped_storage(), shape=[5, 2], dtype=torch.float32)
    assert type(s) is pkg.MemoryMappedTensor and s[0, 0] == 42.0
    f = pkg.MemoryMappedTensor.from_tensor(torch.arange(4.0), filename=tmp_path / "f.memmap")
    assert f._handler is None


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("pkg", [rs, ref], ids=["rs", "ref"])
@pytest.mark.parametrize("with_file", [False, True])
def test_nested_memory_mapped_tensors(pkg: Any, with_file: bool, tmp_path: Path) -> None:
    shape = torch.tensor([[2, 3], [2, 4]])
    filename = tmp_path / "n.memmap" if with_file else None
    empty = pkg.MemoryMappedTensor.zeros(shape, dtype=torch.int32, filename=filename)
    assert empty.is_nested and (empty[1] == 0).all() and empty[1].shape == (2, 4)
    source = torch.nested.nested_tensor(
        [torch.arange(6.0).view(2, 3), torch.arange(8.0).view(2, 4)]
    )
    name = tmp_path / "m.memmap" if with_file else None
    mapped = pkg.MemoryMappedTensor.from_tensor(source, filename=name)
    assert type(mapped) is pkg.MemoryMappedTensor
    for a, b in zip(source.unbind(0), mapped.unbind(0), strict=True):
        assert (a == b).all()
    if with_file:
        reopened = pkg.MemoryMappedTensor.from_filename(name, dtype=torch.float32, shape=shape)
        assert (reopened[1] == torch.arange(8.0).view(2, 4)).all()


def test_nested_file_backed_tensor_pickles(tmp_path: Path) -> None:
    import pickle

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = torch.nested.nested_tensor([torch.ones(2, 3), torch.zeros(1, 3)])
    mapped = rs.MemoryMappedTensor.from_tensor(source, filename=tmp_path / "p.memmap")
    back = pickle.loads(pickle.dumps(mapped))
    assert back.is_nested and back.filename == mapped.filename
    assert (back[0] == 1).all() and (back[1] == 0).all()
