"""A ragged dataset through ``consolidate()``: 10,000,000 int64 tokens in 100,000 sequences (1
to 199 tokens each, ``jagged_sequences.py``'s) as one jagged leaf, with a dense per-sequence
column, in tensordict 0.15.3 and tensordict_rs: ``consolidate()``, and the consolidated tree's
pickle round trip (protocol 5 with out-of-band buffers: ``pickle.dumps``/``loads``, the
message a process or an object store carries).

Run by hand (not part of the pytest suite):

    python benches/nested_consolidate.py --sequences 100000 --rounds 5

Each round runs every case of both libraries once, alternating which goes first; figures are
medians of the rounds, in seconds. The machine's load average is printed with the table.
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import statistics
import time
import warnings
from typing import Any

import tensordict
import tensordict_rs
import torch
from jagged_sequences import lengths_and_tokens

warnings.filterwarnings("ignore", "The PyTorch API of nested tensors")


def tree(pkg: Any, lengths: torch.Tensor, tokens: torch.Tensor) -> Any:
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    seq = torch.nested.nested_tensor_from_jagged(tokens, offsets=offsets)
    return pkg.TensorDict({"tokens": seq, "reward": torch.ones(lengths.numel())}, [lengths.numel()])


def round_trip(td: Any) -> Any:
    buffers: list[Any] = []
    data = pickle.dumps(td, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=buffers)


def timed(fn: Any) -> tuple[float, Any]:
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lengths, tokens = lengths_and_tokens(args.sequences)
    pkgs = {"tensordict 0.15.3": tensordict, "tensordict_rs": tensordict_rs}
    figures: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        order = list(pkgs) if r % 2 == 0 else list(reversed(pkgs))
        for name in order:
            td = tree(pkgs[name], lengths, tokens)
            t, c = timed(td.consolidate)
            figures.setdefault((name, "consolidate"), []).append(t)
            t, back = timed(lambda c=c: round_trip(c))
            figures.setdefault((name, "pickle round trip"), []).append(t)
            assert torch.equal(back["tokens"].offsets(), td["tokens"].offsets())
            del td, c, back
    print(f"{int(tokens.numel()):,} tokens in {args.sequences:,} sequences, {args.rounds} rounds")
    print(f"{'case':<20}" + "".join(f"{n:>20}" for n in pkgs))
    for case in ("consolidate", "pickle round trip"):
        row = "".join(f"{statistics.median(figures[(n, case)]):>19.4f}s" for n in pkgs)
        print(f"{case:<20}{row}")
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
