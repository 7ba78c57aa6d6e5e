"""Trees and checks that tests of several folders share (they were test_tensordict.py's)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict_rs import TensorDict

CPU = torch.device("cpu")
META = torch.device("meta")
LOCK_ERROR = (
    "Cannot modify locked TensorDict. For in-place modification, consider using the `set_()` "
    "method and make sure the key is present."
)
# the leaf "a" of make_td
SOURCE_A = torch.arange(24, dtype=torch.float32).reshape(4, 3, 2)


def locked_error() -> Any:
    """``pytest.raises`` for the exact lock error of tensordict."""
    return pytest.raises(RuntimeError, match=f"^{re.escape(LOCK_ERROR)}$")


def make_td(device: Any = None) -> TensorDict:
    """batch [4, 3]: a float leaf with an extra dim, a nested td with a deeper nested one that
    has an extra batch dim, and a string."""
    return TensorDict(
        {
            "a": torch.arange(24, dtype=torch.float32).reshape(4, 3, 2),
            "n": {
                "x": torch.arange(12).reshape(4, 3),
                "deep": TensorDict({"y": torch.arange(60.0).reshape(4, 3, 5)}, [4, 3, 5]),
            },
            "s": "text",
        },
        [4, 3],
        device=device,
    )


def file_floats(path: Path) -> list[float]:
    """The float32 values of a data file."""
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.float32).tolist()


def non_tensor_source(pkg: Any) -> Any:
    """A tree of tensors and strings (a stack, a NonTensorData, a nested stack) of ``pkg``
    (tensordict or tensordict_rs): what the tests of non-tensor copies write into others."""
    src = pkg.TensorDict({"a": torch.ones(3), "sub": {"b": torch.ones(3)}}, [3])
    src["s"] = ["X", "Y", "Z"]
    src.set_non_tensor("one", "w")
    src["sub", "t"] = ["p", "q", "r"]
    return src
