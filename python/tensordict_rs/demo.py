"""The main job, end to end: a replay buffer saved to disk and read back by another process.

``python -m tensordict_rs.demo [--mib 256] [--dir DIR] [--keep]`` builds a replay-buffer-like
TensorDict (observations, actions, rewards, dones and the next step's reward and done), saves it
with ``memmap_(prefix)``, loads it with ``TensorDict.load_memmap`` in a second Python process,
checks that every byte matches (BLAKE2 digests of each leaf, computed in both processes), samples
a random batch there, and prints sizes, the directory tree and the throughput of each step.

When PyTorch's ``tensordict`` is installed, the save is also timed against its ``memmap_`` on the
same data, in the same directory, in alternated rounds (``--rounds``, medians), and the demo says
which one was faster (``--no-compare`` skips it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import torch

from .tensordict import TensorDict
from .verify import verify

OBS_SHAPE = (3, 64, 64)  # float32 frames: 48 KiB a row
ACTIONS = 6


def build_buffer(mib: int, seed: int = 0) -> TensorDict:
    """A replay buffer of about ``mib`` MiB, mostly observations."""
    row = (torch.Size(OBS_SHAPE).numel() + ACTIONS + 1) * 4 + 1 + 4 + 1
    rows = max(1, (mib << 20) // row)
    gen = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "observation": torch.rand((rows, *OBS_SHAPE), generator=gen),
            "action": torch.randn((rows, ACTIONS), generator=gen),
            "reward": torch.randn((rows, 1), generator=gen),
            "done": torch.rand((rows, 1), generator=gen) < 0.01,
            "next": {
                "reward": torch.randn((rows, 1), generator=gen),
                "done": torch.rand((rows, 1), generator=gen) < 0.01,
            },
        },
        batch_size=[rows],
    )


def digests(td: TensorDict) -> dict[str, str]:
    """BLAKE2b digest of the bytes of every leaf, keyed by ``"a/b"`` paths."""
    out = {}
    for key, value in td.items(include_nested=True, leaves_only=True):
        name = "/".join(key) if isinstance(key, tuple) else key
        data = value.contiguous().view(-1).view(torch.uint8).numpy()
        out[name] = hashlib.blake2b(data, digest_size=16).hexdigest()
    return out


def tree_lines(root: Path) -> list[str]:
    """The directory as ``tree`` draws it, with file sizes."""
    lines: list[str] = []

    def walk(path: Path, pad: str) -> None:
        children = sorted(path.iterdir())
        for i, child in enumerate(children):
            last = i == len(children) - 1
            size = "" if child.is_dir() else f"  ({_size(child.stat().st_size)})"
            lines.append(f"{pad}{'└── ' if last else '├── '}{child.name}{size}")
            if child.is_dir():
                walk(child, pad + ("    " if last else "│   "))

    walk(root, "")
    return lines


def _indent(text: str) -> str:
    return textwrap.indent(text, " " * 8)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _reference() -> Any | None:
    """PyTorch's ``tensordict`` when it is installed (and is not this package under its name)."""
    try:
        import tensordict
    except ImportError:
        return None
    if not hasattr(tensordict, "TensorDict") or "tensordict_rs" in tensordict.__name__:
        return None
    if "tensordict_rs" in getattr(tensordict.TensorDict, "__module__", ""):
        return None
    return tensordict


def _nested(leaves: dict[tuple[str, ...], torch.Tensor]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in leaves.items():
        node = out
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return out


def compare_saves(
    leaves: dict[tuple[str, ...], torch.Tensor], batch: list[int], work: Path, rounds: int
) -> tuple[float, float, str] | None:
    """Median ``memmap_`` times of this package and of the reference on the same tensors, each
    saving to a new prefix in ``work``, in alternated rounds. None without the reference."""
    ref = _reference()
    if ref is None:
        return None
    times: dict[str, list[float]] = {"rs": [], "ref": []}
    for r in range(rounds):
        for who in ("rs", "ref") if r % 2 == 0 else ("ref", "rs"):
            data = _nested(leaves)
            td = TensorDict(data, batch) if who == "rs" else ref.TensorDict(data, batch_size=batch)
            prefix = work / f"compare-{who}-{r}"
            os.sync()  # neither starts with the other's dirty pages still to write
            t0 = time.perf_counter()
            td.memmap_(prefix)
            times[who].append(time.perf_counter() - t0)
            del td
            shutil.rmtree(prefix, ignore_errors=True)
    return statistics.median(times["rs"]), statistics.median(times["ref"]), ref.__version__


def _fs_type(path: Path) -> str:
    """The file system type of ``path`` (from /proc/mounts; "?" elsewhere)."""
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                inside = len(parts) > 2 and os.fspath(path).startswith(parts[1])
                if inside and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def _child(prefix: str) -> None:
    """Runs in the second process: load, digest, sample a batch, report as JSON."""
    t0 = time.perf_counter()
    td = TensorDict.load_memmap(prefix)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    sums = digests(td)
    t_read = time.perf_counter() - t0
    idx = torch.randint(0, td.batch_size[0], (256,), generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    batch = td[idx]
    t_batch = time.perf_counter() - t0
    report = {
        "load_s": t_load,
        "read_s": t_read,
        "batch_s": t_batch,
        "batch": repr(batch),
        "digests": sums,
        "repr": repr(td),
    }
    print(json.dumps(report))


def _print_comparison(
    leaves: dict[tuple[str, ...], torch.Tensor],
    batch: list[int],
    work: Path,
    rounds: int,
    nbytes: int,
) -> None:
    result = compare_saves(leaves, batch, work, rounds)
    if result is None:
        print("vs ref  tensordict is not installed: no side-by-side figure")
        return
    rs, ref, version = result
    where = f"{work} ({_fs_type(work)})"
    print(
        f"vs ref  memmap_ of the same buffer to {where}, {rounds} alternated rounds, medians: "
        f"tensordict-rs {rs * 1e3:.0f} ms ({nbytes / rs / 1e9:.2f} GB/s), tensordict {version} "
        f"{ref * 1e3:.0f} ms ({nbytes / ref / 1e9:.2f} GB/s)"
    )
    if rs <= ref:
        print(f"        tensordict-rs was faster: {ref / rs:.2f}x the reference's speed")
    else:
        print(f"        tensordict {version} was faster: {rs / ref:.2f}x tensordict-rs's speed")


def main(argv: list[str] | None = None) -> int:
    """Runs the demo; returns 0 when the second process saw exactly the saved values."""
    parser = argparse.ArgumentParser(prog="python -m tensordict_rs.demo", description=__doc__)
    parser.add_argument("--mib", type=int, default=256, help="buffer size in MiB (default 256)")
    parser.add_argument("--dir", help="where to save (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the saved directory")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternated rounds against tensordict (default 3)"
    )
    parser.add_argument(
        "--no-compare", action="store_true", help="do not time the save against tensordict"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tensordict-rs-demo-"))
    prefix = work / "replay_buffer"
    try:
        t0 = time.perf_counter()
        td = build_buffer(args.mib)
        nbytes = sum(v.nbytes for v in td.values(include_nested=True, leaves_only=True))
        elapsed = time.perf_counter() - t0
        print(f"built   {td.batch_size[0]:,} transitions, {_size(nbytes)} in {elapsed:.2f} s")
        print(_indent(repr(td)))
        expected = digests(td)
        source = dict(td.items(include_nested=True, leaves_only=True))
        leaves = {(k,) if isinstance(k, str) else tuple(k): v for k, v in source.items()}

        t0 = time.perf_counter()
        td.memmap_(prefix)
        t_save = time.perf_counter() - t0
        print(
            f"saved   memmap_({prefix}) in {t_save * 1e3:.0f} ms = "
            f"{nbytes / t_save / 1e9:.2f} GB/s; locked={td.is_locked}, is_memmap={td.is_memmap()}"
        )
        print(f"        {prefix.name}/")
        for line in tree_lines(prefix):
            print(f"        {line}")
        problems = verify(prefix)
        print(f"verify  {'OK' if not problems else problems}")
        if not args.no_compare and args.rounds > 0:
            _print_comparison(leaves, list(td.batch_size), work, args.rounds, nbytes)

        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "tensordict_rs.demo", "--child", os.fspath(prefix)],
            capture_output=True,
            text=True,
            check=True,
        )
        t_child = time.perf_counter() - t0
        report = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"loaded  in a second process (pid != {os.getpid()}, {t_child:.2f} s with start-up): "
            f"load_memmap {report['load_s'] * 1e3:.1f} ms, first read of every byte "
            f"{nbytes / report['read_s'] / 1e9:.2f} GB/s (with hashing)"
        )
        print(_indent(report["repr"]))
        print(f"sampled 256 random transitions in {report['batch_s'] * 1e6:.0f} µs (first access):")
        print(_indent(report["batch"]))
        same = report["digests"] == expected
        for key, digest in expected.items():
            mark = "ok" if report["digests"].get(key) == digest else "MISMATCH"
            print(f"        {key:14s} {digest}  {mark}")
        print("equal   " + ("yes: every byte read by the second process matches" if same else "NO"))
        return 0 if same else 1
    finally:
        if not args.keep:
            shutil.rmtree(work if not args.dir else prefix, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
