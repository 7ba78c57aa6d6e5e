"""One big leaf on a disk file system: preallocated saves and CRC-32s in ranges.

A new data file of 64 MiB or more on a disk file system (ext4 here; not tmpfs) gets all its
blocks with ``fallocate`` before its bytes are written (``rust/sys/prealloc.rs``);
``TDRS_PREALLOCATE`` (``auto``, ``always``, ``never``) overrides the choice. Whatever the
choice, what a user sees is the same: the values, the file sizes, files without holes (a
writable map never meets a hole), and the reference reads them. The CRC-32 of a big archive
entry is computed in ranges across the threads and combined (``rust/archive/checksum.rs``):
``verify`` must still find a change anywhere in it, and ``refresh_archive_checksums`` must
write the CRC zipfile computes.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
import tensordict_rs
import torch
from tensordict_rs import MemoryMappedTensor, TensorDict

ROWS = (64 << 20) // 256 + 1  # float32 [rows, 64]: just above the 64 MiB threshold
POLICIES = ["auto", "always", "never"]


def _big() -> torch.Tensor:
    return torch.arange(ROWS * 64, dtype=torch.float32).reshape(ROWS, 64)


def _no_holes(path: Path, size: int) -> None:
    st = os.stat(path)
    assert st.st_size == size
    assert st.st_blocks * 512 >= size, "the data file has holes"


@pytest.mark.parametrize("policy", POLICIES)
def test_big_leaf_save_under_every_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    import tensordict

    monkeypatch.setenv("TDRS_PREALLOCATE", policy)
    big = _big()
    td = TensorDict({"obs": big, "step": torch.tensor([3])}, [])
    td.memmap_(tmp_path / "tree")
    _no_holes(tmp_path / "tree" / "obs.memmap", big.numel() * 4)
    assert torch.equal(td["obs"], big)
    td["obs"][-1, -1] = -1.0  # the shared map is writable to its last byte
    back = tensordict.TensorDict.load_memmap(tmp_path / "tree")
    assert back["obs"][-1, -1] == -1.0 and torch.equal(back["obs"][:-1], big[:-1])
    # a re-save over it (a new file exchanged with the old)
    TensorDict({"obs": big * 2, "step": torch.tensor([4])}, []).memmap_(
        tmp_path / "tree", existsok=True
    )
    _no_holes(tmp_path / "tree" / "obs.memmap", big.numel() * 4)
    assert torch.equal(TensorDict.load_memmap(tmp_path / "tree")["obs"], big * 2)


@pytest.mark.parametrize("policy", POLICIES)
def test_big_from_tensor_under_every_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    monkeypatch.setenv("TDRS_PREALLOCATE", policy)
    big = _big()
    path = tmp_path / "obs.memmap"
    mm = MemoryMappedTensor.from_tensor(big, filename=path)
    _no_holes(path, big.numel() * 4)
    assert torch.equal(mm, big)
    mm2 = MemoryMappedTensor.from_tensor(big + 1, filename=path, existsok=True)
    assert torch.equal(mm2, big + 1) and torch.equal(mm, big)  # the old map keeps its values
    _no_holes(path, big.numel() * 4)


@pytest.mark.parametrize("policy", POLICIES)
def test_big_archive_under_every_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    import tensordict

    monkeypatch.setenv("TDRS_PREALLOCATE", policy)
    big = _big()
    path = tmp_path / "td.tdz"
    TensorDict({"obs": big, "step": torch.tensor([3])}, []).memmap(path)
    assert zipfile.ZipFile(path).testzip() is None
    assert tensordict_rs.verify(path) == []
    assert torch.equal(tensordict.TensorDict.load_memmap(path)["obs"], big)
    st = os.stat(path)
    assert st.st_blocks * 512 >= st.st_size


@pytest.mark.parametrize("where", [0, 17 << 20, (64 << 20) - 1])
def test_verify_finds_a_change_in_any_range_of_a_big_entry(tmp_path: Path, where: int) -> None:
    """The big entry's CRC comes from ranges; a byte changed in the first, a middle or the
    last range fails it, and the refreshed CRC is the one zipfile computes."""
    big = _big()
    path = tmp_path / "td.tdz"
    TensorDict({"obs": big}, []).memmap(path)
    loaded = TensorDict.load_memmap(path, mode="r+")
    flat = loaded["obs"].view(-1).view(torch.uint8)
    flat[where] ^= 0xFF
    loaded.flush()
    del loaded, flat
    problems = tensordict_rs.verify(path)
    assert len(problems) == 1 and "obs.memmap" in problems[0] and "CRC" in problems[0]
    for threads in (1, 2, 3):  # the same CRC however the entry is cut
        changed = tensordict_rs._native.refresh_archive_checksums(
            os.fspath(path), num_threads=threads
        )
        assert changed == (["obs.memmap"] if threads == 1 else [])
        assert zipfile.ZipFile(path).testzip() is None
        assert tensordict_rs.verify(path) == []
