"""load_memmap and flush."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict_rs import MemoryMappedTensor, TensorDict

from .._trees import CPU, SOURCE_A, file_floats, make_td

# --------------------------------------------------------------------------------- load_memmap


def test_load_memmap(tmp_prefix: Path) -> None:
    td = make_td()
    td.memmap_(tmp_prefix)
    loaded = TensorDict.load_memmap(tmp_prefix)
    assert loaded.batch_size == td.batch_size
    assert loaded.device == CPU
    assert loaded.keys(include_nested=True) == td.keys(include_nested=True)
    assert loaded["n", "deep"].batch_size == torch.Size([4, 3, 5])
    assert (loaded == td).all()
    assert loaded["s"] == "text"
    assert not loaded.is_locked and not loaded.is_memmap()
    with pytest.raises(AttributeError, match="no saved path"):
        _ = loaded.saved_path
    for key in ("a", ("n", "x"), ("n", "deep", "y")):
        assert isinstance(loaded[key], MemoryMappedTensor)
        assert loaded[key].filename == td[key].filename
        assert loaded[key] is loaded[key]
    # Writes go both ways through the files.
    loaded["n", "x"][0, 0] = -3
    assert td["n", "x"][0, 0].item() == -3
    # Not locked: keys can be added (in memory).
    loaded["new"] = torch.zeros(4, 3)
    # memmap_() on it locks and marks it.
    again = TensorDict.load_memmap(tmp_prefix)
    again.memmap_()
    assert again.is_locked and again.is_memmap()
    assert TensorDict.load(tmp_prefix).keys() == td.keys()


def test_load_then_memmap_keeps_sharing_the_files(tmp_prefix: Path) -> None:
    """``load_memmap(p).memmap_()`` marks the loaded TensorDict; it still maps the same files."""
    td = TensorDict({"a": torch.zeros(3)}, [3]).memmap_(tmp_prefix)
    again = TensorDict.load_memmap(tmp_prefix)
    again.memmap_()
    assert again.saved_path == tmp_prefix
    td["a"][0] = 5.0
    again["a"][1] = 6.0
    assert again["a"].tolist() == [5.0, 6.0, 0.0]
    assert td["a"].tolist() == [5.0, 6.0, 0.0]
    td.flush()
    again.flush()
    assert file_floats(tmp_prefix / "a.memmap") == [5.0, 6.0, 0.0]


def test_load_memmap_str_and_subdirectory(tmp_prefix: Path) -> None:
    td = make_td().memmap_(tmp_prefix)
    loaded = TensorDict.load_memmap(str(tmp_prefix))
    assert (loaded == td).all()
    sub = TensorDict.load_memmap(tmp_prefix / "n")
    assert sub.batch_size == torch.Size([4, 3])
    assert sub.keys(include_nested=True) == ["x", ("deep", "y"), "deep"]
    assert torch.equal(sub["x"], torch.arange(12).reshape(4, 3))


def test_load_memmap_device(tmp_prefix: Path, accel_device: torch.device) -> None:
    make_td().memmap_(tmp_prefix)
    on_cpu = TensorDict.load_memmap(tmp_prefix, device="cpu")
    assert on_cpu.device == CPU and isinstance(on_cpu["a"], MemoryMappedTensor)
    moved = TensorDict.load_memmap(tmp_prefix, device=accel_device)
    assert moved.device == accel_device
    assert moved["n"].device == accel_device
    for key in ("a", ("n", "x"), ("n", "deep", "y")):
        assert moved[key].device == accel_device
        assert not isinstance(moved[key], MemoryMappedTensor)
    assert moved["a"].shape == SOURCE_A.shape
    if accel_device.type == "cuda":
        assert torch.equal(moved["a"].cpu(), SOURCE_A)


def test_load_memmap_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        TensorDict.load_memmap(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"meta\.json"):
        TensorDict.load_memmap(tmp_path / "empty")


def test_load_memmap_in_another_process(tmp_prefix: Path, run_python) -> None:
    td = make_td().memmap_(tmp_prefix)
    child = run_python(
        """
        import sys
        from tensordict_rs import TensorDict

        loaded = TensorDict.load_memmap(sys.argv[1])
        print(loaded["n", "x"].sum().item(), loaded["s"])
        loaded["a"].fill_(1.0)
        loaded.flush()
        """,
        str(tmp_prefix),
    )
    assert child.stdout.split() == [str(sum(range(12))), "text"]
    assert torch.equal(td["a"], torch.ones(4, 3, 2))


def test_flush(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3)}}, [3]).memmap_(tmp_prefix)
    td["a"][1] = 2.0
    td["n", "b"][2] = 3.0
    assert td.flush() is None
    assert file_floats(tmp_prefix / "a.memmap") == [0.0, 2.0, 0.0]
    assert file_floats(tmp_prefix / "n" / "b.memmap") == [0.0, 0.0, 3.0]
    # Anonymous and plain TensorDicts flush without error.
    TensorDict({"a": torch.zeros(3)}, [3]).memmap_().flush()
    TensorDict({"a": torch.zeros(3)}, [3]).flush()


def test_flush_of_a_loaded_tree_reaches_the_files(tmp_path):
    TensorDict({"a": torch.zeros(4), "n": {"b": torch.zeros(4, 2)}}, [4]).memmap_(tmp_path / "t")
    loaded = TensorDict.load_memmap(tmp_path / "t", non_blocking=True)
    loaded["n", "b"][1] = 7.0
    loaded.flush()
    # flushing reads the buffers of untouched leaves without making tensors of them
    assert type(loaded._tensordict["a"]).__name__ == "_LazyLeaf"
    raw = torch.frombuffer(
        bytearray((tmp_path / "t" / "n" / "b.memmap").read_bytes()), dtype=torch.float32
    )
    assert raw.view(4, 2)[1].tolist() == [7.0, 7.0]
