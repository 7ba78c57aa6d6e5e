"""Runs the code blocks of one documentation page, as ``tests/docs/test_docs.py`` plans them.

    python tests/docs/_page_runner.py PLAN.json

The plan names the page and its blocks in order (kind, first line, code, ranks). The current
directory is the page's empty working directory. Every ``python`` block runs in one namespace
(a fresh ``__main__`` module) with ``exec``, compiled under the page's path and its own line
numbers, so a traceback points at the page's line; ``bash`` blocks run with
``bash -euo pipefail``; ``script`` blocks are written to a file and run as their own program;
``ranks`` blocks are started as N processes with torchrun's environment (gloo on 127.0.0.1).
A python or bash block with an ``expect`` must print exactly that (line by line, trailing
spaces and blank lines aside).
The first block that fails stops the page: its page, number, line and kind are printed on a
``FAILED:`` line, and the exit status is 1.
"""

from __future__ import annotations

import builtins
import contextlib
import difflib
import io
import json
import os
import socket
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

RANK_TIMEOUT = 300  # seconds for all the ranks of one job
SCRIPT_TIMEOUT = 300


class BlockFailed(Exception):
    """A block that did not succeed (the message says how)."""


def _padded(code: str, line: int) -> str:
    """``code`` preceded by blank lines, so that its line numbers are the page's."""
    return "\n" * (line - 1) + code


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _program(page: Path, block: dict[str, Any]) -> Path:
    path = Path(f"{page.stem}-line{block['line']}.py").resolve()
    path.write_text(_padded(block["code"], block["line"]))
    return path


class _Tee(io.StringIO):
    """Keeps what is written and passes it on."""

    def __init__(self, through: Any) -> None:
        super().__init__()
        self.through = through

    def write(self, text: str) -> int:
        self.through.write(text)
        return super().write(text)


def _check_output(block: dict[str, Any], printed: str) -> None:
    """The block's output must be the text block shown after it (when there is one)."""
    if block.get("expect") is None:
        return

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().split("\n")]

    want, got = lines(block["expect"]), lines(printed)
    if want != got:
        diff = "\n".join(difflib.unified_diff(want, got, "shown", "printed", lineterm=""))
        raise BlockFailed(f"the output is not the one the page shows:\n{diff}")


def run_python(page: Path, block: dict[str, Any], namespace: dict[str, Any]) -> None:
    code = compile(_padded(block["code"], block["line"]), str(page), "exec")
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        exec(code, namespace)
    _check_output(block, tee.getvalue())


def run_bash(block: dict[str, Any]) -> None:
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block["code"]],
        stdout=subprocess.PIPE,
        text=True,
        timeout=SCRIPT_TIMEOUT,
    )
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        raise BlockFailed(f"bash exited with status {out.returncode}")
    _check_output(block, out.stdout)


def run_script(page: Path, block: dict[str, Any]) -> None:
    path = _program(page, block)
    out = subprocess.run([sys.executable, str(path)], timeout=SCRIPT_TIMEOUT)
    if out.returncode != 0:
        raise BlockFailed(f"{path.name} exited with status {out.returncode}")


def run_ranks(page: Path, block: dict[str, Any]) -> None:
    """One torch.distributed job: the block is each rank's program, started as torchrun
    starts it (the env:// variables), every address on the loopback."""
    path = _program(page, block)
    world = int(block["ranks"])
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "GLOO_SOCKET_IFNAME": "lo",
        }
        procs.append(subprocess.Popen([sys.executable, str(path)], env=env))
    deadline = time.monotonic() + RANK_TIMEOUT
    codes: dict[int, int | None] = {}
    try:
        for rank, proc in enumerate(procs):
            try:
                codes[rank] = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[rank] = None
            if codes[rank] != 0:
                break
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    bad = {rank: code for rank, code in codes.items() if code != 0}
    if bad or len(codes) != world:
        text = ", ".join(
            f"rank {rank} " + ("timed out" if code is None else f"exited with status {code}")
            for rank, code in bad.items()
        )
        raise BlockFailed(f"{world}-rank job of {path.name}: {text}")


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    page = Path(plan["page"])
    shown = plan["shown"]
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module  # what pickle and multiprocessing look functions up in
    blocks = plan["blocks"]
    for number, block in enumerate(blocks, 1):
        label = f"{shown} block {number} of {len(blocks)} (line {block['line']}, {block['kind']})"
        print(f"--- {label}", flush=True)
        try:
            if block["kind"] == "python":
                run_python(page, block, module.__dict__)
            elif block["kind"] == "bash":
                run_bash(block)
            elif block["kind"] == "script":
                run_script(page, block)
            elif block["kind"] == "ranks":
                run_ranks(page, block)
            else:
                raise BlockFailed(f"unknown kind {block['kind']!r}")
        except BaseException as err:  # SystemExit and KeyboardInterrupt included
            if isinstance(err, BlockFailed):
                print(err, file=sys.stderr)
            else:
                traceback.print_exc()
            print(f"FAILED: {label}", file=sys.stderr, flush=True)
            return 1
        sys.stdout.flush()
        sys.stderr.flush()
    print(f"ran {len(blocks)} blocks of {shown}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
