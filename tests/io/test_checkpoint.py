"""Incremental checkpoints (issue 24): ``td.checkpoint(dest)``.

After random write patterns (through the library's methods, from this process and another
one, with growth and shrinking), the checkpoint must equal a full copy
(``memmap(copy_existing=True)``) file for file, byte for byte, and load in the reference; only
the rows written are copied; writes through raw leaves are caught by ``verify=True``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
from pathlib import Path

import pytest
import tensordict
import torch
from tensordict_rs import TensorDict
from tensordict_rs.io.checkpoint import RECORD, spare_name


def tree_files(root: Path) -> dict[str, bytes]:
    """Every file of a saved tree (relative path -> bytes), bookkeeping excluded."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.startswith(".tdrs%"):
                continue
            path = Path(dirpath) / name
            out[os.path.relpath(path, root)] = path.read_bytes()
    return out


def assert_same_as_full_copy(td: TensorDict, dest: Path, tmp_path: Path) -> None:
    full = tmp_path / f"full-{random.getrandbits(32)}"
    td.memmap(full, copy_existing=True)
    want, got = tree_files(full), tree_files(dest)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
    ref = tensordict.TensorDict.load_memmap(dest)
    for key in td.keys(include_nested=True, leaves_only=True):
        assert torch.equal(ref[key], td[key]), key


def make(n: int = 300) -> TensorDict:
    g = torch.Generator().manual_seed(n)
    return TensorDict(
        {
            "obs": torch.randn(n, 64, generator=g),
            "act": torch.randint(0, 100, (n,), generator=g),
            "next": {
                "obs": torch.randn(n, 64, generator=g),
                "done": torch.zeros(n, dtype=torch.bool),
            },
        },
        [n],
    )


def test_checkpoint_equals_full_copy_after_random_writes(tmp_path: Path) -> None:
    td = make().memmap(tmp_path / "live")
    dest = tmp_path / "ckpt"
    first = td.checkpoint(dest)
    assert first["bytes_written"] > 0
    assert_same_as_full_copy(td, dest, tmp_path)
    rng = random.Random(7)
    total = sum(v.nbytes for v in td.values(include_nested=True, leaves_only=True))
    small = ("row", "update_at", "mask")
    kinds = ["copy"]
    for step in range(14):
        kind = rng.choice(["row", "slice", "index", "update_at", "copy", "mask", "inplace"])
        n = td.batch_size[0]
        if kind == "row":
            td[rng.randrange(n)] = make(1)[0]
        elif kind == "slice":
            a = rng.randrange(n - 5)
            td[a : a + 5] = make(5)
        elif kind == "index":
            idx = torch.tensor(rng.sample(range(n), 7))
            td[idx] = make(7)
        elif kind == "update_at":
            td.update_at_({"obs": torch.full((64,), float(step))}, rng.randrange(n))
        elif kind == "copy":
            td.copy_(make(n))
        elif kind == "mask":
            mask = torch.zeros(n, dtype=torch.bool)
            mask[rng.randrange(n)] = True
            td[mask] = make(1)
        else:
            td["next"].zero_()
        kinds.append(kind)
        stats = td.checkpoint(dest)
        assert_same_as_full_copy(td, dest, tmp_path)
        if kinds[-1] in small and kinds[-2] in small:
            # a block of rows in each of the last two intervals (the spare is one behind)
            assert stats["bytes_written"] < total // 4, (kind, stats)


def test_only_written_rows_are_copied(tmp_path: Path) -> None:
    n = 4096
    td = TensorDict({"x": torch.zeros(n, 1024)}, [n]).memmap(tmp_path / "live")  # 4 KiB rows
    td.checkpoint(tmp_path / "ckpt")
    assert td.checkpoint(tmp_path / "ckpt")["bytes_written"] < 4096  # nothing but meta.json
    rows = random.Random(3).sample(range(n), 40)
    for r in rows:
        td[r] = TensorDict({"x": torch.full((1024,), 1.0)}, [])
    stats = td.checkpoint(tmp_path / "ckpt")
    assert 40 * 4096 <= stats["bytes_written"] < 40 * 4096 + 4096
    assert_same_as_full_copy(td, tmp_path / "ckpt", tmp_path)


def test_growth_and_shrink_are_checkpointed(tmp_path: Path) -> None:
    td = TensorDict({"x": torch.arange(10.0), "y": torch.zeros(10, 3)}, [10]).memmap(
        tmp_path / "live"
    )
    dest = tmp_path / "ckpt"
    td.checkpoint(dest)
    td.extend_(TensorDict({"x": torch.arange(10.0, 30.0), "y": torch.ones(20, 3)}, [20]))
    td.checkpoint(dest)
    assert_same_as_full_copy(td, dest, tmp_path)
    td.resize_(5)
    td.checkpoint(dest)
    assert_same_as_full_copy(td, dest, tmp_path)
    assert tensordict.TensorDict.load_memmap(dest).batch_size == torch.Size([5])
    td.resize_(8)
    td.checkpoint(dest)
    assert_same_as_full_copy(td, dest, tmp_path)


def test_raw_leaf_writes_need_verify(tmp_path: Path) -> None:
    n = 2048
    td = TensorDict({"x": torch.zeros(n, 256)}, [n]).memmap(tmp_path / "live")
    dest = tmp_path / "ckpt"
    td.checkpoint(dest)
    td.checkpoint(dest)
    td["x"][1000, 5] = 3.0  # through the leaf: no tracking sees it
    td.checkpoint(dest)
    assert tensordict.TensorDict.load_memmap(dest)["x"][1000, 5] == 0  # missed, as documented
    stats = td.checkpoint(dest, verify=True)
    assert stats["bytes_hashed"] >= n * 256 * 4
    assert tensordict.TensorDict.load_memmap(dest)["x"][1000, 5] == 3.0
    assert_same_as_full_copy(td, dest, tmp_path)
    td["x"][7, 0] = 1.0
    td.checkpoint(dest, verify=True)  # the spare is behind too: verified again
    assert_same_as_full_copy(td, dest, tmp_path)
    assert stats["bytes_written"] < n * 256 * 4 // 4


def _write_in_child(prefix: str, row: int) -> None:
    td = TensorDict.load_memmap(prefix)
    td[row] = TensorDict({"x": torch.full((256,), 9.0)}, [])


def test_writes_from_another_process_are_tracked(tmp_path: Path) -> None:
    n = 2048
    td = TensorDict({"x": torch.zeros(n, 256)}, [n]).memmap(tmp_path / "live")
    dest = tmp_path / "ckpt"
    td.checkpoint(dest)  # creates the dirty map: processes loading from now on stamp it
    p = mp.get_context("spawn").Process(
        target=_write_in_child, args=(os.fspath(tmp_path / "live"), 77)
    )
    p.start()
    p.join(120)
    assert p.exitcode == 0
    stats = td.checkpoint(dest)
    assert stats["bytes_written"] < n * 256 * 4 // 8
    assert tensordict.TensorDict.load_memmap(dest)["x"][77, 0] == 9.0
    assert_same_as_full_copy(td, dest, tmp_path)


def test_refuses_foreign_destination(tmp_path: Path) -> None:
    td = make(10).memmap(tmp_path / "live")
    other = tmp_path / "mine"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="mine"):
        td.checkpoint(other)
    assert (other / "precious.txt").read_text() == "keep me"
    with pytest.raises(RuntimeError, match="memmap_"):
        make(10).checkpoint(tmp_path / "c")
    with pytest.raises(ValueError, match="inside"):
        td.checkpoint(tmp_path / "live" / "c")


def test_layout_of_generations(tmp_path: Path) -> None:
    td = make(10).memmap(tmp_path / "live")
    td.checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / RECORD).is_file()
    assert (tmp_path / spare_name(tmp_path / "ckpt") / RECORD).is_file()
    assert TensorDict.load_memmap(tmp_path / "ckpt")["obs"].shape == (10, 64)
