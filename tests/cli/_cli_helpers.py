"""What the command-line tests share: running the CLI in a new interpreter, and a small tree."""

from __future__ import annotations

import subprocess
import sys

import torch
from tensordict_rs import TensorDict


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m tensordict_rs ARGS`` in a new interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "tensordict_rs", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sample() -> TensorDict:
    """Nested groups, a bool and an int16 leaf, a non-tensor value and an empty leaf."""
    return TensorDict(
        {
            "obs": torch.arange(40, dtype=torch.float32).reshape(10, 4),
            "next": {
                "done": torch.zeros(10, 1, dtype=torch.bool),
                "deep": TensorDict({"x": torch.ones(10, 3, 2, dtype=torch.int16)}, [10, 3]),
            },
            "label": "hello",
            "empty": torch.zeros(10, 0),
        },
        [10],
    )
