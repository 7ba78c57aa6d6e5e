"""Ray's opt-in zero-copy path for torch tensors, beside ours: run by hand, its own process.

    python benches/ray_torch_zero_copy.py            # 1 GiB in 4 leaves (TDRS_BENCH_SCALE)

``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1`` is read at ``import ray`` and registers a reducer for
every ``torch.Tensor`` of the process, so it cannot be a case of ``bench_ray.py`` (it would
change the reference's path too). This script sets it before importing Ray and times, in
alternated rounds (medians of 5 after 1 warm-up), ``ray.put`` and ``ray.get`` of: one plain
1 GiB tensor (Ray's reducer), tensordict 0.15.3's TensorDict of 4 leaves (whose leaves now
use Ray's reducer, one buffer per leaf) and ours (one buffer, our own reducer; the variable
changes nothing for it). One local Ray on 127.0.0.1, 2 CPUs, no dashboard.
"""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_ZERO_COPY_TORCH_TENSORS"] = "1"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ray
import tensordict
import tensordict_rs
import torch
from _harness import build_w1, nbytes, w1_rows

ROUNDS, WARMUP = 5, 1


def main() -> None:
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=4 << 30,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    assert all(node["NodeManagerAddress"] == "127.0.0.1" for node in ray.nodes())
    tree = build_w1()
    total = nbytes(tree.values())
    objects = {
        "plain tensor (Ray's reducer)": torch.cat([t.reshape(-1) for t in tree.values()]),
        "tensordict 0.15.3 (Ray's reducer per leaf)": tensordict.TensorDict(
            dict(tree), batch_size=[w1_rows()]
        ),
        "tensordict-rs (one buffer)": tensordict_rs.TensorDict(
            dict(tree), [w1_rows()]
        ).consolidate(),
    }
    times: dict[str, dict[str, list[float]]] = {n: {"put": [], "get": []} for n in objects}
    names = list(objects)
    for r in range(WARMUP + ROUNDS):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            ref = ray.put(objects[name])
            t1 = time.perf_counter()
            got = ray.get(ref)
            t2 = time.perf_counter()
            del got, ref  # Ray frees the object with its last reference
            if r >= WARMUP:
                times[name]["put"].append(t1 - t0)
                times[name]["get"].append(t2 - t1)
    print(f"{total / 2**30:.2f} GiB; load average {os.getloadavg()[0]:.2f}; medians of {ROUNDS}")
    print("| case | ray.put | ray.get |")
    print("|---|---|---|")
    for name in names:
        put = statistics.median(times[name]["put"])
        get = statistics.median(times[name]["get"])
        print(f"| {name} | {total / put / 1e9:.2f} GB/s ({put:.3f} s) | {get * 1e3:.2f} ms |")
    ray.shutdown()


if __name__ == "__main__":
    main()
