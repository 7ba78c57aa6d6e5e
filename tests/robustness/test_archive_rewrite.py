"""A ``.tdz`` rewritten in place while it loads gives an error, never a signal (issue 28,
defect 5).

``cp new.tdz a.tdz`` truncates ``a.tdz`` and writes it again; a load in the middle of that met a
file shorter than its map, and since the zip index was parsed from the map, it died of SIGBUS.
The reference raises ``BadZipFile`` there. Now the index is read with ``pread`` into memory and a
load that finds the file changed under it raises ``InvalidDirectoryError`` (or ``OSError``).

A reader process loads the archive in a loop (3,000 entries: a long index) while this process
rewrites it in place: with ``shutil.copyfile`` (what ``cp`` does), with truncate-to-zero and
appends in pieces, and by cutting it to random lengths and restoring it. The reader must never
die of a signal; each of its loads either succeeds or raises a clean exception. (The loaded
leaves are views of the map: touching one after the file shrank is SIGBUS, as for any memory
map, so the reader does not touch them.)
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

READER = """
import json, sys, time
import tensordict_rs
from tensordict_rs import TensorDict
path, seconds = sys.argv[1], float(sys.argv[2])
load = TensorDict.from_safetensors if path.endswith(".safetensors") else TensorDict.load_memmap
counts = {}
end = time.monotonic() + seconds
print("started", flush=True)
while time.monotonic() < end:
    try:
        td = load(path)
        what = "loaded" if len(td.keys()) == 3001 else "wrong"
    except (tensordict_rs.TensorDictError, OSError) as err:
        what = type(err).__name__
    except Exception as err:
        what = "unclean " + type(err).__name__ + ": " + str(err)[:200]
    counts[what] = counts.get(what, 0) + 1
print(json.dumps(counts), flush=True)
"""


def archive(path: Path, version: float) -> None:
    from tensordict_rs import TensorDict

    td = TensorDict({f"k{i}": torch.full((16,), version) for i in range(3000)}, [])
    td["big"] = torch.full((1 << 20,), version)
    if path.suffix == ".safetensors":
        td.to_safetensors(path)
    else:
        td.memmap(path)


def rewrite_copy(target: Path, sources: list[Path], rng: random.Random) -> None:
    shutil.copyfile(rng.choice(sources), target)


def rewrite_append(target: Path, sources: list[Path], rng: random.Random) -> None:
    data = rng.choice(sources).read_bytes()
    with open(target, "r+b") as f:
        f.truncate(0)
        step = len(data) // 8 + 1
        for at in range(0, len(data), step):
            f.write(data[at : at + step])
            f.flush()
            time.sleep(0.0005)


def rewrite_cut(target: Path, sources: list[Path], rng: random.Random) -> None:
    size = target.stat().st_size
    os.truncate(target, rng.randrange(0, max(size, 1)))
    time.sleep(0.001)
    shutil.copyfile(rng.choice(sources), target)


MODES = {"copy": rewrite_copy, "append": rewrite_append, "cut": rewrite_cut}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("suffix", [".tdz", ".safetensors"])
def test_file_rewritten_during_loads(tmp_path: Path, mode: str, suffix: str) -> None:
    """(A safetensors file's header was parsed from its map too: the same signal.)"""
    sources = [tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"]
    archive(sources[0], 1.0)
    archive(sources[1], 2.0)
    target = tmp_path / f"x{suffix}"
    shutil.copyfile(sources[0], target)
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, os.fspath(target), "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout is not None and reader.stdout.readline().strip() == "started"
    rng = random.Random(28)
    rewrites = 0
    while reader.poll() is None:
        MODES[mode](target, sources, rng)
        rewrites += 1
        # quiet spells too, in which loads go through (however slow the machine)
        time.sleep(0.25 if rewrites % 10 == 0 else rng.uniform(0, 0.02))
    out, err = reader.communicate(timeout=60)
    assert reader.returncode >= 0, (
        f"the reader died of {signal.Signals(-reader.returncode).name} after {rewrites} "
        f"rewrites: {err[-2000:]}"
    )
    assert reader.returncode == 0, err[-3000:]
    counts = json.loads(out.strip().splitlines()[-1])
    unclean = {k: v for k, v in counts.items() if k.startswith(("unclean", "wrong"))}
    assert not unclean, counts
    assert counts.get("loaded", 0) > 0 and rewrites > 10, (counts, rewrites)
