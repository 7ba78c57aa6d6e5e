"""Re-saving big leaves: the old files are exchanged out and freed in the background.

A data file of 4 MiB or more that replaces one of the old tree is exchanged with it
(``RENAME_EXCHANGE``) and the old file unlinked at once; its space is freed by a background
thread after the save returns (``rust/sys/reclaim.rs``). What a user sees must not change:
the directory holds exactly the new tree when the save returns, readers of the old version
keep its values, the reference reads the new one, and nothing stays open once freed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from tensordict_rs import TensorDict
from tensordict_rs._native import wait_freed

BIG = 2_000_000  # float32: 8 MB, above the 4 MiB threshold


def _tree(value: float) -> TensorDict:
    return TensorDict(
        {"obs": torch.full((BIG,), value), "small": torch.full((3,), value)}, batch_size=[]
    )


def _deleted_memmaps() -> list[str]:
    """Files of this process's descriptors that are unlinked ``.memmap`` files."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".memmap (deleted)") or "%staging-" in target:
            out.append(target)
    return out


@pytest.mark.skipif(sys.platform != "linux", reason="background frees are Linux-only")
@pytest.mark.parametrize("drop_obs", [False, True])
def test_resave_over_a_big_leaf(tmp_path: Path, drop_obs: bool) -> None:
    import tensordict

    prefix = tmp_path / "tree"
    _tree(1.0).memmap_(prefix)
    reader = TensorDict.load_memmap(prefix)
    old_obs = reader["obs"]
    old_ino = os.stat(prefix / "obs.memmap").st_ino
    new = _tree(2.0)
    if drop_obs:  # the big file is dropped, not replaced: an Unlink step
        del new["obs"]
    new.memmap_(prefix, existsok=True)
    names = sorted(os.listdir(prefix))
    if drop_obs:
        assert names == ["meta.json", "small.memmap"]
    else:
        assert names == ["meta.json", "obs.memmap", "small.memmap"]
        assert os.stat(prefix / "obs.memmap").st_ino != old_ino
        assert torch.equal(TensorDict.load_memmap(prefix)["obs"], torch.full((BIG,), 2.0))
        ref = tensordict.TensorDict.load_memmap(prefix)
        assert torch.equal(ref["obs"], torch.full((BIG,), 2.0))
    # the reader of the old version keeps its values (its map holds the old file)
    assert torch.equal(old_obs, torch.full((BIG,), 1.0))
    wait_freed()
    assert _deleted_memmaps() == []
    assert wait_freed() == 0


@pytest.mark.skipif(sys.platform != "linux", reason="background frees are Linux-only")
def test_many_resaves_free_their_space(tmp_path: Path) -> None:
    """Ten re-saves in a row leave one version's blocks once the frees are done."""
    prefix = tmp_path / "tree"
    for i in range(10):
        _tree(float(i)).memmap_(prefix, existsok=True)
    wait_freed()
    assert _deleted_memmaps() == []
    blocks = os.stat(prefix / "obs.memmap").st_blocks * 512
    assert blocks >= BIG * 4
    assert torch.equal(TensorDict.load_memmap(prefix)["obs"], torch.full((BIG,), 9.0))


@pytest.mark.skipif(sys.platform != "linux", reason="background frees are Linux-only")
def test_from_tensor_over_a_big_file(tmp_path: Path) -> None:
    """``from_tensor(filename=, existsok=True)`` over a big file: the same exchange."""
    from tensordict_rs import MemoryMappedTensor

    path = tmp_path / "x.memmap"
    old = MemoryMappedTensor.from_tensor(torch.full((BIG,), 1.0), filename=path)
    new = MemoryMappedTensor.from_tensor(torch.full((BIG,), 2.0), filename=path, existsok=True)
    assert sorted(os.listdir(tmp_path)) == ["x.memmap"]
    assert torch.equal(old, torch.full((BIG,), 1.0))
    assert torch.equal(new, torch.full((BIG,), 2.0))
    assert torch.equal(MemoryMappedTensor.from_filename(path, torch.float32, (BIG,)), new)
    wait_freed()
    assert _deleted_memmaps() == []
