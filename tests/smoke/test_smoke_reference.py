"""Save and load both ways with tensordict 0.15.3, directories and ``.tdz`` archives, and
``progress=True`` with the tqdm that ``pip install`` brought."""

from __future__ import annotations

from pathlib import Path

import pytest
import tensordict
import torch
from tensordict_rs import TensorDict


def data() -> dict[str, object]:
    return {
        "obs": torch.arange(120, dtype=torch.float32).reshape(10, 3, 4),
        "action": torch.arange(10, dtype=torch.int64),
        "next": {
            "done": torch.arange(10).remainder(3).eq(0).unsqueeze(-1),
            "reward": torch.linspace(-1, 1, 10, dtype=torch.float64),
            "pixels": torch.arange(10 * 2 * 2, dtype=torch.uint8).reshape(10, 2, 2),
        },
        "half": torch.ones(10, 2, dtype=torch.bfloat16),
        "label": "episode 7",
    }


LEAVES = [
    ("obs",),
    ("action",),
    ("next", "done"),
    ("next", "reward"),
    ("next", "pixels"),
    ("half",),
]


def assert_same(got: object, expected: object) -> None:
    assert tuple(got.batch_size) == tuple(expected.batch_size)  # type: ignore[attr-defined]
    for key in LEAVES:
        a, b = got[key], expected[key]  # type: ignore[index]
        assert a.dtype == b.dtype and torch.equal(a, b), key
    assert got["label"] == expected["label"] == "episode 7"  # type: ignore[index]


@pytest.mark.parametrize("name", ["dir", "tree.tdz"])
def test_ours_read_by_the_reference(tmp_path: Path, name: str) -> None:
    ours = TensorDict(data(), [10])
    ours.memmap(tmp_path / name)
    assert_same(tensordict.TensorDict.load_memmap(tmp_path / name), ours)


@pytest.mark.parametrize("name", ["dir", "tree.tdz"])
def test_the_references_read_by_ours(tmp_path: Path, name: str) -> None:
    ref = tensordict.TensorDict(data(), [10])
    if name.endswith(".tdz"):
        ref.save(tmp_path / name)
    else:
        ref.memmap(tmp_path / name)
    loaded = TensorDict.load_memmap(tmp_path / name)
    assert_same(loaded, ref)
    # and back: what ours re-saves the reference reads
    loaded.memmap(tmp_path / "again", copy_existing=True)  # its leaves map the first files
    assert_same(tensordict.TensorDict.load_memmap(tmp_path / "again"), ref)


def test_progress_bar(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    td = TensorDict({"x": torch.zeros(1 << 20)}, [1 << 20])  # 4 MiB
    td.memmap(tmp_path / "big", progress=True)
    err = capfd.readouterr().err
    assert "memmap" in err and "100%" in err and "4.00M" in err, err
    back = TensorDict.load_memmap(tmp_path / "big", progress=True)
    assert "load_memmap" in capfd.readouterr().err
    assert torch.equal(back["x"], td["x"])
