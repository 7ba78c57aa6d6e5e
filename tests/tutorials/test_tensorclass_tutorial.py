"""tensordict's tutorial "Batched data loading with tensorclasses" (tensorclass_imagenet.py),
shrunk to synthetic images (``examples/tensorclass_imagenet.py``: the dataset section replaced,
every other line the tutorial's), runs with only its import changed and prints what it prints
with tensordict 0.15.3 (the rates and times masked)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "tensorclass_imagenet.py"
IMPORTS = (
    "from tensordict_rs import MemoryMappedTensor, tensorclass\n"
    "from tensordict_rs.utils import strtobool\n"
)


def run(source: str, tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    env = {
        **os.environ,
        "NUM_WORKERS": "2",
        "N_TRAIN": "48",
        "N_VAL": "40",
        "IMAGE_SIZE": "64",
        "CUDA_VISIBLE_DEVICES": "",
    }
    result = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, (
        f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return re.sub(r"Rate: [0-9.]+ fps, time: +[0-9.]+s", "Rate: R fps, time: Ts", result.stdout)


def test_tutorial_prints_the_same(tmp_path: Path) -> None:
    source = SCRIPT.read_text()
    assert IMPORTS in source  # the only lines that differ from the reference's version
    theirs = source.replace(IMPORTS, IMPORTS.replace("tensordict_rs", "tensordict"))
    ours_out = run(source, tmp_path, "ours")
    theirs_out = run(theirs, tmp_path, "theirs")
    assert ours_out == theirs_out
    lines = ours_out.splitlines()
    assert lines[0] == "Using device: cpu"
    # 48 / 64 rows written by batches of 64: the memory-mapped tensorclass and each batch
    assert sum(line.startswith("ImageNetData(") for line in lines) == 4
    assert sum("Rate: R fps" in line for line in lines) == 4


@pytest.mark.parametrize("pkg", ["tensordict_rs"])
def test_tutorial_strtobool(pkg: str) -> None:
    """The tutorial's ``strtobool`` (deprecated in tensordict 0.15.3, kept here)."""
    from tensordict_rs.utils import strtobool

    assert strtobool("False") is False and strtobool("True") is True
