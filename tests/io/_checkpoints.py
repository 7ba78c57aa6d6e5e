"""What the checkpoint tests check about a checkpoint directory."""

from __future__ import annotations

from pathlib import Path

import tensordict
import torch
from tensordict_rs import TensorDict


def assert_checkpoint_is(live: TensorDict, dest: Path) -> None:
    """The checkpoint in ``dest`` loads (here and in tensordict) equal to ``live``."""
    for lib in (TensorDict, tensordict.TensorDict):
        got = lib.load_memmap(dest)
        assert got.batch_size == live.batch_size, lib
        for key in live.keys(include_nested=True, leaves_only=True):
            assert torch.equal(got[key], live[key]), (lib, key)
