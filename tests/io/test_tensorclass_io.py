"""tensorclass directories and .tdz archives side by side with tensordict 0.15.3: the
reference's layout (meta.json naming the class, the fields in ``_tensordict/``), both ways,
memory-mapped row assignment, refusals (unknown classes, pickled fields), print_directory_tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as rs
import torch

from .._tensorclasses import both, check, define, files, same, sample


def memmap_row_assignment(pkg: Any) -> list[Any]:
    """The tutorial's pattern: preallocated memory maps, memmap_(), rows written in batches."""
    Data = define(pkg, "MapData", {"images": torch.Tensor, "targets": torch.Tensor})
    n = 10
    data = Data(
        images=pkg.MemoryMappedTensor.empty((n, 3, 4, 4), dtype=torch.uint8),
        targets=pkg.MemoryMappedTensor.empty((n,), dtype=torch.int64),
        batch_size=[n],
    )
    data.memmap_()
    print(data.is_memmap(), data.is_locked, type(data.images).__name__)
    g = torch.Generator().manual_seed(0)
    for i in range(0, n, 4):
        b = min(4, n - i)
        imgs = torch.randint(0, 255, (b, 3, 4, 4), dtype=torch.uint8, generator=g)
        data[i : i + b] = Data(images=imgs, targets=torch.arange(i, i + b), batch_size=[b])
    print(data)
    return [data.images, data.targets, type(data.images).__name__]


def test_memmap_row_assignment() -> None:
    check(memmap_row_assignment)


def persisted(pkg: Any, root: Path) -> list[Any]:
    tc = sample(pkg)
    saved = tc.memmap(root / "copy")
    print(saved)
    like = tc.memmap_like(root / "like")
    print(like)
    tc.memmap_(root / "inplace")
    print(tc, tc.is_locked, tc.is_memmap())
    loaded = type(tc).load_memmap(root / "inplace")
    print(loaded)
    generic = pkg.TensorDict.load_memmap(root / "copy")
    print(generic)
    return [
        files(root),
        type(saved).__name__,
        type(loaded).__name__,
        type(generic).__name__,
        loaded.x,
        loaded.inner.y,
        loaded.name,
        loaded.opt,
        like.x,
    ]


def test_memmap_layout(tmp_path: Path) -> None:
    (out_rs, res_rs), (out_ref, res_ref) = both(lambda pkg: persisted(pkg, tmp_path / pkg.__name__))
    assert out_rs == out_ref
    same(res_rs, res_ref)


@pytest.mark.parametrize("writer", ["rs", "ref"])
@pytest.mark.parametrize("kind", ["dir", "tdz"])
def test_directories_move_both_ways(tmp_path: Path, writer: str, kind: str) -> None:
    """A tensorclass saved by one package loads as the same class in the other."""
    src, dst = (rs, ref) if writer == "rs" else (ref, rs)
    tc = sample(src)
    path = tmp_path / ("data.tdz" if kind == "tdz" else "data")
    tc.memmap(path)
    reader_cls = type(sample(dst))
    for loaded in (reader_cls.load_memmap(path), dst.TensorDict.load_memmap(path)):
        assert type(loaded) is reader_cls
        assert torch.equal(loaded.x, tc.x)
        assert torch.equal(loaded.inner.y, tc.inner.y)
        assert type(loaded.inner).__qualname__ == "Inner"
        assert loaded.name == "sample"
        assert loaded.opt is None
        assert loaded.batch_size == torch.Size([4])


def test_unknown_class_is_refused(tmp_path: Path) -> None:
    Gone = define(rs, "Gone", {"x": torch.Tensor})
    path = tmp_path / "gone"
    Gone(x=torch.zeros(2), batch_size=[2]).memmap(path)
    meta = json.loads((path / "meta.json").read_text())
    meta["_type"] = "<class 'nowhere.Missing'>"
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(RuntimeError, match=r"nowhere\.Missing"):
        rs.TensorDict.load_memmap(path)


def test_pickled_fields_are_refused(tmp_path: Path) -> None:
    """A reference directory with a pickled field (other.pickle) is refused, never unpickled."""
    Odd = define(ref, "Odd", {"x": torch.Tensor, "obj": Any})
    tc = Odd(x=torch.zeros(2), obj=None, batch_size=[2])
    tc._non_tensordict["obj"] = {1, 2}  # a set: not JSON, the reference pickles it
    tc.memmap(tmp_path / "odd")
    assert (tmp_path / "odd" / "other.pickle").exists()
    define(rs, "Odd", {"x": torch.Tensor, "obj": Any})
    with pytest.raises(rs.UnsupportedFormatError, match="pickle"):
        rs.TensorDict.load_memmap(tmp_path / "odd")


def test_print_directory_tree(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    td = rs.TensorDict({"a": torch.zeros(3), "b": {"c": torch.ones(3)}}, [3])
    td.memmap(tmp_path / "tree")
    ours = rs.utils.print_directory_tree(str(tmp_path / "tree"))
    theirs = ref.utils.print_directory_tree(str(tmp_path / "tree"))
    assert ours == theirs
    assert ours.splitlines()[0].startswith("Directory size: ")
