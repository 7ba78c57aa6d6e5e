"""A memory-mapped tensorclass sent to DataLoader worker processes (anonymous memory and
files): every batch comes back as the class, with the right rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tensordict_rs as rs
import torch


@rs.tensorclass
class Worked:
    """A module-level tensorclass (pickled by reference to and from DataLoader workers)."""

    images: torch.Tensor
    targets: torch.Tensor


def _identity(batch: Any) -> Any:
    return batch


@pytest.mark.parametrize("memmap", ["anonymous", "files"])
def test_dataloader_workers(tmp_path: Path, memmap: str) -> None:
    n = 32
    data = Worked(
        images=torch.arange(n * 4, dtype=torch.float32).view(n, 4),
        targets=torch.arange(n),
        batch_size=[n],
    )
    data.memmap_(None if memmap == "anonymous" else tmp_path / "data")
    loader = torch.utils.data.DataLoader(data, batch_size=5, num_workers=2, collate_fn=_identity)
    batches = list(loader)
    assert all(type(b) is Worked for b in batches)
    assert torch.equal(torch.cat([b.targets for b in batches]), torch.arange(n))
    assert torch.equal(torch.cat([b.images for b in batches]), data.images)
