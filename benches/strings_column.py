"""A column of short strings (a NonTensorStack, one string per row) beside one tensor:
build (``td["text"] = list``), save (``memmap``), load (``load_memmap``) and a random 256-row
batch (``td[idx]["text"]``), tensordict 0.15.3 against tensordict_rs on the same data.

Run by hand (it is not part of the pytest suite: at a million rows the reference takes
minutes per call):

    python benches/strings_column.py --rows 1000000 --rounds 3
    python benches/strings_column.py --rows 100000 --rounds 5 --only rs

Each round runs every case of both libraries once, alternating which goes first; figures are
medians of the rounds, in seconds. Files go to a temporary directory under /dev/shm (or
/tmp), removed at the end. The machine's load average is printed with the table, since the
figures mean little on a busy machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

BATCH = 256


def strings(n: int) -> list[str]:
    """Short instruction-like strings (13 characters), as a robot dataset's episode ids."""
    return [f"instr-{i:07d}" for i in range(n)]


def cases(pkg: Any, values: list[str], base: str) -> dict[str, Callable[[], Any]]:
    """The timed calls of one library; each call's setup is done outside the timer by the
    caller (a fresh directory for saves)."""
    n = len(values)
    state: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, n, (BATCH,), generator=gen) for _ in range(10)]

    def build() -> Any:
        td = pkg.TensorDict({"i": torch.arange(n)}, [n])
        td["text"] = values
        state["td"] = td
        return td

    def save() -> Any:
        path = tempfile.mkdtemp(dir=base)
        shutil.rmtree(path)
        state["td"].memmap(path)
        state["path"] = path

    def load() -> Any:
        state["loaded"] = pkg.TensorDict.load_memmap(state["path"])

    def batch() -> Any:
        td = state["loaded"]
        for idx in batches:
            got = td[idx]["text"]
            assert len(got) == BATCH
        return None

    return {"build": build, "save": save, "load": load, "batch x10": batch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["rs", "ref", "both"], default="both")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import tensordict
    import tensordict_rs

    base = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    values = strings(args.rows)
    libs = {"tensordict": tensordict, "tensordict_rs": tensordict_rs}
    if args.only == "rs":
        libs.pop("tensordict")
    elif args.only == "ref":
        libs.pop("tensordict_rs")
    made = {name: cases(pkg, values, base) for name, pkg in libs.items()}
    times: dict[tuple[str, str], list[float]] = {}
    try:
        for r in range(args.rounds):
            order = list(made) if r % 2 == 0 else list(reversed(made))
            for name in order:
                for case, call in made[name].items():
                    gc.collect()
                    t0 = time.perf_counter()
                    call()
                    times.setdefault((name, case), []).append(time.perf_counter() - t0)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load = os.getloadavg()
    print(f"{args.rows:,} strings, {args.rounds} rounds, medians in seconds")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"| case | {' | '.join(libs)} |" + (" ratio |" if len(libs) == 2 else ""))
    print("|---" * (len(libs) + 1 + (len(libs) == 2)) + "|")
    for case in next(iter(made.values())):
        meds = [statistics.median(times[(name, case)]) for name in libs]
        cells = " | ".join(f"{m:.4f}" for m in meds)
        ratio = f" {meds[0] / meds[1]:.1f}x |" if len(meds) == 2 and meds[1] > 0 else ""
        print(f"| {case} | {cells} |{ratio}")


if __name__ == "__main__":
    main()
