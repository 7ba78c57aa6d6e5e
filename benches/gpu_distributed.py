"""The device checks of torch.distributed, for a machine with a GPU (none here): one script.

    python benches/gpu_distributed.py            # from the repository root, ~1-2 minutes

1. The CUDA tests of tests/share/test_distributed.py: CUDA trees over gloo (packed send from and
   into device trees, from_remote_init(device="cuda"), broadcast(device=...)), and with two
   GPUs the NCCL job (per-leaf and packed send/recv, first contact, all_reduce, all_gather).
2. With two GPUs, timings over NCCL of W3 (10,000 x 1 KiB leaves) on the device: per-leaf send,
   send(consolidated=True) and one tensor of the same bytes, medians of interleaved rounds.
   With one GPU, the same tree packed and scattered on the device (the pack/scatter part of a
   NCCL send), against one device copy of the same bytes.
Prints one line per figure; exits non-zero when a check fails.
"""

from __future__ import annotations

import multiprocessing
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 7


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _w3(device: torch.device):
    sys.path.insert(0, str(ROOT / "benches"))
    from _harness import build_w3, rs_td

    return rs_td(build_w3(), []).to(device)


def _nccl_rank(rank: int, port: int, out) -> None:
    from torch import distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    td = _w3(device)
    one = torch.zeros(
        sum(t.nbytes for t in td.values(True, True)), dtype=torch.uint8, device=device
    )
    sync = torch.cuda.synchronize
    cases = {
        "per-leaf send": (lambda: td.send(dst=1), lambda: td.recv(src=0)),
        "send(consolidated=True)": (
            lambda: td.send(dst=1, consolidated=True),
            lambda: td.recv(src=0, consolidated=True),
        ),
        "one tensor": (lambda: dist.send(one, dst=1), lambda: dist.recv(one, src=0)),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(ROUNDS + 1):
        names = list(cases)
        names = names[r % 3 :] + names[: r % 3]
        for name in names:
            send, recv = cases[name]
            dist.barrier()
            t = _timed(send if rank == 0 else recv, sync)
            if r:
                times[name].append(t)
    if rank == 0:
        leaves = 10_000
        for name, ts in times.items():
            out.put(f"NCCL {name}: {statistics.median(ts) / leaves * 1e6:.3f} us/leaf")
    dist.destroy_process_group()


def _pack_on_device() -> list[str]:
    from tensordict_rs.share import packed as _packed

    device = torch.device("cuda", 0)
    td = _w3(device)
    receiver = _w3(device)
    plan, target = _packed.plan(td), _packed.plan(receiver)
    one = torch.empty(plan.total, dtype=torch.uint8, device=device)
    other = torch.empty_like(one)
    sync = torch.cuda.synchronize
    pack = [_timed(lambda: target.unpack(plan.pack()), sync) for _ in range(ROUNDS)]
    copy = [_timed(lambda: other.copy_(one), sync) for _ in range(ROUNDS)]
    return [
        f"device pack + scatter of W3: {statistics.median(pack) * 1e3:.2f} ms",
        f"one device copy of the same bytes: {statistics.median(copy) * 1e3:.3f} ms",
    ]


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check here")
        return 0
    tests = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "tests/share/test_distributed.py",
            "-k",
            "cuda or nccl",
        ],
        cwd=ROOT,
    )
    lines = _pack_on_device()
    if torch.cuda.device_count() >= 2:
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        port = _port()
        procs = [ctx.Process(target=_nccl_rank, args=(r, port, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
        while not out.empty():
            lines.append(out.get())
    for line in lines:
        print(line)
    return tests.returncode


if __name__ == "__main__":
    sys.exit(main())
