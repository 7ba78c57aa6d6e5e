"""Crash consistency of growth in place and of incremental checkpoints (issue 24).

A server process (this file run as a script, so torch and the reference are imported once)
forks a child per kill that runs ``extend_`` (or ``checkpoint``) and SIGKILLs it after a delay
drawn uniformly over the measured duration of that operation (and a little past it). After each
kill the directory is loaded here and by the reference ``tensordict``: it must hold the old rows
or the old rows plus all the new ones (every row holds its own index, so a torn or misplaced row
shows), and a checkpoint directory must equal the previous checkpoint or the new one, never a
mix.

``TDRS_GROWTH_KILLS`` (default 120) and ``TDRS_CHECKPOINT_KILLS`` (default 100) set the number
of kills; ``TDRS_GROWTH_SEED`` the seed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

GROWTH_KILLS = int(os.environ.get("TDRS_GROWTH_KILLS", "120"))
CHECKPOINT_KILLS = int(os.environ.get("TDRS_CHECKPOINT_KILLS", "100"))
SEED = int(os.environ.get("TDRS_GROWTH_SEED", "24"))
ROW = 4096  # floats per row of "obs": 16 KiB rows


def rows(start: int, stop: int) -> Any:
    import torch
    from tensordict_rs import TensorDict

    idx = torch.arange(start, stop)
    return TensorDict(
        {
            "obs": idx[:, None].float().expand(-1, ROW).clone(),
            "act": (-idx).to(torch.int64),
        },
        [stop - start],
    )


def check(td: Any, allowed: tuple[int, ...]) -> str:
    """'' when ``td`` holds rows 0..n-1 (n in ``allowed``) each with its own index."""
    import torch

    n = td.batch_size[0]
    if n not in allowed:
        return f"{n} rows, expected one of {allowed}"
    idx = torch.arange(n)
    if not torch.equal(td["obs"][:, 0], idx.float()) or not torch.equal(
        td["obs"][:, -1], idx.float()
    ):
        return "a row of obs holds another index (torn or misplaced)"
    if not torch.equal(td["act"], -idx):
        return "a row of act holds another index"
    return ""


def _kill_after(run: Any, delay: float) -> bool:
    """Forks a child that runs ``run()``; SIGKILLs it after ``delay`` s. True if killed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            os.write(w, b"x")
            run()
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 3
        finally:
            os._exit(code)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status):
        raise RuntimeError(f"the child failed (exit status {os.WEXITSTATUS(status)})")
    return os.WIFSIGNALED(status)


def _adapt(cost: float, killed: bool) -> float:
    """The span of the next delays after a kill: shorter when the child had finished before
    it, a little longer when it was killed. A cost measured once can be off for the rest of the
    run (a full test suite's load made children finish before 103 of 120 kills, where a quiet
    run has 80-88 land in time); this settles where about three kills in four land in time."""
    return cost * (1.03 if killed else 0.85)


def _timed_child(run: Any) -> float:
    """Seconds a forked child takes to run ``run()`` to the end (as the killed ones run)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.write(w, b"x")
            run()
        finally:
            os._exit(0)
    os.close(w)
    os.read(r, 1)
    t0 = time.perf_counter()
    os.close(r)
    os.waitpid(pid, 0)
    return time.perf_counter() - t0


def serve_growth(root: Path, kills: int, seed: int) -> dict[str, Any]:
    import tensordict
    import torch
    from tensordict_rs import TensorDict

    torch.set_num_threads(1)
    rng = random.Random(seed)
    prefix = root / "buf"
    rows(0, 8).memmap(prefix)
    sizes = [1, 7, 64, 300]
    cost: dict[int, float] = {}
    for k in sizes:  # measured durations (in a child, as the kills will run)
        runs = []
        for _ in range(3):  # the fastest of 3: one slow first run (its files reserved, a busy
            # moment) let most children finish before their kill (18 of 120 killed, once)
            n = TensorDict.load_memmap(prefix).batch_size[0]
            new = rows(n, n + k)
            runs.append(_timed_child(lambda new=new: TensorDict.load_memmap(prefix).extend_(new)))
        cost[k] = min(runs)
    outcomes = {"old": 0, "new": 0, "killed": 0}
    for i in range(kills):
        n = TensorDict.load_memmap(prefix).batch_size[0]
        k = rng.choice(sizes)
        durable = i % 3 == 0
        new = rows(n, n + k)

        def run(n: int = n, new: Any = new, durable: bool = durable) -> None:
            td = TensorDict.load_memmap(prefix)
            td.extend_(new, durable=durable)

        delay = rng.uniform(0, cost[k] * (1.5 if durable else 1.0))
        killed = _kill_after(run, delay)
        outcomes["killed"] += killed
        cost[k] = _adapt(cost[k], killed)
        for name, load in (
            ("ours", TensorDict.load_memmap),
            ("reference", tensordict.TensorDict.load_memmap),
        ):
            td = load(prefix)
            problem = check(td, (n, n + k))
            if problem:
                return {"error": f"kill {i} ({name}): {problem}"}
        outcomes["new" if td.batch_size[0] == n + k else "old"] += 1
    return outcomes


def serve_checkpoint(root: Path, kills: int, seed: int) -> dict[str, Any]:
    import tensordict
    import torch
    from tensordict_rs import TensorDict

    torch.set_num_threads(1)
    rng = random.Random(seed)
    live = rows(0, 1500).memmap(root / "live")
    dest = root / "ckpt"
    live.checkpoint(dest)
    cost = {}
    for verify in (False, True):  # measured durations of an incremental checkpoint
        live[3] = rows(3, 4)[0]
        cost[verify] = _timed_child(lambda verify=verify: live.checkpoint(dest, verify=verify))
    state = {k: v.clone() for k, v in live.items()}  # what dest holds
    outcomes = {"old": 0, "new": 0, "killed": 0}
    for i in range(kills):
        # writes through the library, sometimes a growth: rows keep holding their index
        n = live.batch_size[0]
        idx = torch.tensor(rng.sample(range(n), 20))
        live["obs"][idx] = -1.0  # a raw write...
        # ...then the library's write over it: values of this round (so every round differs)
        live[idx] = TensorDict(
            {"obs": torch.full((20, ROW), float(i + 1)), "act": torch.full((20,), i + 1)}, [20]
        )
        if rng.random() < 0.3:
            live.extend_(rows(n, n + rng.randrange(1, 50)))
        new = {k: v.clone() for k, v in live.items()}
        verify = i % 4 == 0
        delay = rng.uniform(0, cost[verify])
        killed = _kill_after(lambda v=verify: live.checkpoint(dest, verify=v), delay)
        outcomes["killed"] += killed
        cost[verify] = _adapt(cost[verify], killed)
        seen = None
        for name, load in (
            ("ours", TensorDict.load_memmap),
            ("reference", tensordict.TensorDict.load_memmap),
        ):
            td = load(dest)
            got = {k: td[k] for k in ("obs", "act")}
            if all(got[k].shape == state[k].shape and torch.equal(got[k], state[k]) for k in got):
                now = "old"
            elif all(got[k].shape == new[k].shape and torch.equal(got[k], new[k]) for k in got):
                now = "new"
            else:
                return {
                    "error": f"kill {i} ({name}): the checkpoint is neither the old nor the new one"
                }
            if seen is not None and seen != now:
                return {"error": f"kill {i}: ours sees {seen}, the reference {now}"}
            seen = now
        outcomes[seen] += 1  # type: ignore[index]
        if seen == "new":
            state = new
    # a last, uninterrupted checkpoint equals the tree
    live.checkpoint(dest)
    ref = tensordict.TensorDict.load_memmap(dest)
    if not all(torch.equal(ref[k], live[k]) for k in ("obs", "act")):
        return {"error": "the last checkpoint differs from the tree"}
    return outcomes


def _run_server(tmp_path: Path, mode: str, kills: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, mode, os.fspath(tmp_path), str(kills), str(SEED)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert "error" not in result, result["error"]
    print(mode, result)  # the outcomes, shown with -s
    return result


@pytest.mark.skipif(not hasattr(os, "fork"), reason="kills forked children (POSIX)")
def test_kill_during_extend(tmp_path: Path) -> None:
    result = _run_server(tmp_path, "growth", GROWTH_KILLS)
    assert result["old"] + result["new"] == GROWTH_KILLS
    # the delays span the operation: both outcomes happen, most children die mid-way
    assert result["old"] > 0 and result["new"] > 0, result
    assert result["killed"] >= GROWTH_KILLS // 5, result


@pytest.mark.skipif(not hasattr(os, "fork"), reason="kills forked children (POSIX)")
def test_kill_during_checkpoint(tmp_path: Path) -> None:
    result = _run_server(tmp_path, "checkpoint", CHECKPOINT_KILLS)
    assert result["old"] + result["new"] == CHECKPOINT_KILLS
    assert result["old"] > 0 and result["new"] > 0, result
    # most kills land mid-way (82-99 of 100 on a quiet machine); at a load of 9 a run once
    # counted 26, the children's timing stretched past the measured cost: a fifth, as above
    assert result["killed"] >= CHECKPOINT_KILLS // 5, result


if __name__ == "__main__":
    mode, where, count, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    serve = serve_growth if mode == "growth" else serve_checkpoint
    print(json.dumps(serve(where, count, seed)))
