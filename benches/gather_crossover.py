"""Where the native batch gather starts to beat torch's per-leaf path (``_gather.MIN_BYTES``).

    python benches/gather_crossover.py [--rows 50000] [--reps 200] [--tree w4|one]

``--tree w4`` (the default): a W4-like tree (obs float32 [3, 32, 32], action, reward, done,
next/{reward, done}: 6 leaves, 12,322 bytes per row); ``--tree one``: one float32 [16] leaf
(64-byte rows), the case where torch's per-leaf path costs least. The tree lives in memory;
for each batch size, the median time of ``td[idx]`` with the native gather forced on, forced
off (torch's ``index_select`` per leaf), and tensordict 0.15.3's, in interleaved rounds.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import tensordict
import torch
from tensordict_rs import TensorDict
from tensordict_rs.ops import gather as _gather


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--tree", choices=("w4", "one"), default="w4")
    args = parser.parse_args()
    n = args.rows
    gen = torch.Generator().manual_seed(0)
    source: dict = {
        "obs": torch.rand(n, 3, 32, 32, generator=gen),
        "action": torch.rand(n, 6, generator=gen),
        "reward": torch.rand(n, 1, generator=gen),
        "done": torch.rand(n, 1, generator=gen) < 0.01,
        "next": {"reward": torch.rand(n, 1, generator=gen), "done": torch.rand(n, 1) < 0.01},
    }
    if args.tree == "one":
        source = {"x": torch.rand(n, 16, generator=gen)}
    row_bytes = sum(
        t.nbytes // n for t in TensorDict(source, [n]).values(include_nested=True, leaves_only=True)
    )
    sizes = (1, 2, 4, 8, 16, 32, 64, 256, 1024) if args.tree == "w4" else (1, 4, 16, 64, 256, 4096)
    ours = TensorDict(source, [n])
    ref = tensordict.TensorDict(source, batch_size=[n])
    default = _gather.MIN_BYTES
    print("| batch rows | bytes | native µs | torch per-leaf µs | tensordict 0.15.3 µs | faster? |")
    print("|---|---|---|---|---|---|")
    for rows in sizes:
        idx = [torch.randint(0, n, (rows,), generator=gen) for _ in range(args.reps)]
        times: dict[str, list[float]] = {"native": [], "torch": [], "ref": []}
        for round_ in range(6):
            for name in ("native", "torch", "ref")[round_ % 3 :] + ("native", "torch", "ref")[
                : round_ % 3
            ]:
                _gather.MIN_BYTES = 0 if name == "native" else 1 << 62
                td = ref if name == "ref" else ours
                t0 = time.perf_counter()
                for i in idx:
                    td[i]
                if round_:
                    times[name].append((time.perf_counter() - t0) / args.reps * 1e6)
        _gather.MIN_BYTES = default
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"| {rows} | {rows * row_bytes:,} | {med['native']:.1f} | {med['torch']:.1f} | "
            f"{med['ref']:.1f} | {'yes' if med['native'] < med['torch'] else 'no'} |"
        )


if __name__ == "__main__":
    main()
