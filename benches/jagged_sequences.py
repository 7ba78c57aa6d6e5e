"""A ragged dataset: 10,000,000 int64 tokens in 100,000 sequences (1 to 199 tokens each) as
one jagged nested leaf of tensordict_rs, against the padded tensor a user writes today (a
``[100000, 199]`` int64 tensor padded with -1 and a ``lengths`` column) in tensordict 0.15.3
and in tensordict_rs: build, save (``memmap``), load (``load_memmap``) and 10 random
256-sequence batches made into the padded ``[256, L]`` tensor a model takes.

Run by hand (not part of the pytest suite):

    python benches/jagged_sequences.py --sequences 100000 --rounds 3

Each round runs every case of every variant once, alternating the order of the variants;
figures are medians of the rounds, in seconds, with the bytes each variant writes. Files go to
a temporary directory under /dev/shm (or /tmp), removed at the end. The machine's load average
is printed with the table, since the figures mean little on a busy machine.
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
MAX_LEN = 199


def lengths_and_tokens(sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence lengths uniform in [1, MAX_LEN] (mean 100: 10,000,000 tokens for 100,000
    sequences) and the tokens back to back (int64, a vocabulary of 50,000)."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, MAX_LEN + 1, (sequences,), generator=gen)
    tokens = torch.randint(0, 50_000, (int(lengths.sum()),), generator=gen)
    return lengths, tokens


def padded(lengths: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The ``[n, MAX_LEN]`` tensor padded with -1 (what a user builds without nested tensors)."""
    out = torch.full((lengths.numel(), MAX_LEN), -1, dtype=tokens.dtype)
    mask = torch.arange(MAX_LEN)[None, :] < lengths[:, None]
    out[mask] = tokens
    return out


def cases(
    pkg: Any, layout: str, lengths: torch.Tensor, tokens: torch.Tensor, base: str
) -> dict[str, Callable[[], Any]]:
    """The timed calls of one variant (``layout``: ``"jagged"`` or ``"padded"``)."""
    n = lengths.numel()
    state: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, n, (BATCH,), generator=gen) for _ in range(10)]
    offsets = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])

    def build() -> Any:
        if layout == "jagged":
            seqs = torch.nested.nested_tensor_from_jagged(tokens, offsets)
            td = pkg.TensorDict({"tokens": seqs}, [n])
        else:
            td = pkg.TensorDict({"tokens": padded(lengths, tokens), "lengths": lengths}, [n])
        state["td"] = td

    def save() -> Any:
        path = tempfile.mkdtemp(dir=base)
        shutil.rmtree(path)
        state["td"].memmap(path)
        state["path"] = path
        state["bytes"] = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
        )

    def load() -> Any:
        state["loaded"] = pkg.TensorDict.load_memmap(state["path"])

    def batch() -> Any:
        td = state["loaded"]
        for idx in batches:
            rows = td[idx]
            if layout == "jagged":
                out = rows["tokens"].to_padded_tensor(-1)
            else:
                out = rows["tokens"]
            assert out.shape[0] == BATCH
            assert int((out[0] >= 0).sum()) == int(lengths[idx[0]])

    return {"build": build, "save": save, "load": load, "batch x10": batch, "_state": state}  # type: ignore[dict-item]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import tensordict
    import tensordict_rs

    base = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    lengths, tokens = lengths_and_tokens(args.sequences)
    variants = {
        "rs jagged": cases(tensordict_rs, "jagged", lengths, tokens, base),
        "rs padded": cases(tensordict_rs, "padded", lengths, tokens, base),
        "tensordict padded": cases(tensordict, "padded", lengths, tokens, base),
    }
    states = {name: calls.pop("_state") for name, calls in variants.items()}
    times: dict[tuple[str, str], list[float]] = {}
    try:
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                for case, call in variants[name].items():
                    gc.collect()
                    t0 = time.perf_counter()
                    call()
                    times.setdefault((name, case), []).append(time.perf_counter() - t0)
                shutil.rmtree(states[name]["path"], ignore_errors=True)
                states[name].pop("loaded", None)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load = os.getloadavg()
    print(
        f"{int(lengths.sum()):,} tokens in {args.sequences:,} sequences, "
        f"{args.rounds} rounds, medians in seconds"
    )
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"| case | {' | '.join(variants)} |")
    print("|---" * (len(variants) + 1) + "|")
    for case in next(iter(variants.values())):
        cells = " | ".join(f"{statistics.median(times[(name, case)]):.4f}" for name in variants)
        print(f"| {case} | {cells} |")
    sizes = " | ".join(f"{states[name]['bytes'] / 1e6:.0f} MB" for name in variants)
    print(f"| bytes written | {sizes} |")


if __name__ == "__main__":
    main()
