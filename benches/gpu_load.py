"""The GPU path: ``load_memmap(prefix, device="cuda")`` against the pinned ceiling.

    python benches/gpu_load.py [--reps 5]

On a machine with CUDA: 1 GiB in 4 leaves and 10,000 leaves of 1 KiB, saved once to /dev/shm
and read with a warm page cache. Rows, in interleaved rounds (medians):

* pinned ceiling: one host-to-device copy of the same bytes from a pinned buffer;
* torch per leaf: tensordict 0.15.3's ``load_memmap(device="cuda")`` (a copy per leaf);
* tensordict_rs: one device allocation, streamed through two pinned staging buffers.

Prints a markdown table; without CUDA it says so and exits with status 0.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time

import torch


def _trees() -> dict[str, dict]:
    gen = torch.Generator().manual_seed(0)
    big = {f"x{i}": torch.rand(1 << 20, 64, generator=gen) for i in range(4)}
    small = {
        f"g{g}": {f"l{i}": torch.rand(256, generator=gen) for i in range(100)} for g in range(100)
    }
    return {"1 GiB in 4 leaves": big, "10,000 x 1 KiB in 100 groups": small}


def _nbytes(tree: dict) -> int:
    return sum(_nbytes(v) if isinstance(v, dict) else v.nbytes for v in tree.values())


def _measure(name: str, tree: dict, path: str, reps: int) -> None:
    """Prints the three rows of one tree."""
    import tensordict
    import tensordict_rs

    tensordict.TensorDict(tree, batch_size=[]).memmap_(path)
    nbytes = _nbytes(tree)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device_buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    cases = {
        "pinned ceiling": lambda: device_buf.copy_(pinned, non_blocking=True),
        "tensordict 0.15.3 per leaf": lambda: tensordict.TensorDict.load_memmap(
            path, device="cuda"
        ),
        "tensordict_rs": lambda: tensordict_rs.TensorDict.load_memmap(path, device="cuda"),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for round_ in range(reps + 1):
        order = list(cases)[round_ % 3 :] + list(cases)[: round_ % 3]
        for case in order:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            result = cases[case]()
            torch.cuda.synchronize()
            if round_:
                times[case].append(time.perf_counter() - t0)
            del result
    ceil = statistics.median(times["pinned ceiling"])
    for case, ts in times.items():
        med = statistics.median(ts)
        rate = nbytes / med / 1e9
        print(f"| {name} | {case} | {med * 1e3:.2f} | {rate:.2f} | {ceil / med:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_load.py: no CUDA device here; nothing to measure.")
        return 0
    base = tempfile.mkdtemp(dir="/dev/shm")
    print("| tree | case | ms median | GB/s | fraction of pinned ceiling |")
    print("|---|---|---|---|---|")
    try:
        for i, (name, tree) in enumerate(_trees().items()):
            _measure(name, tree, f"{base}/{i}", args.reps)
            torch.cuda.empty_cache()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
