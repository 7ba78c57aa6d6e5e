"""The loading loop of tensordict's tutorial "Batched data loading with tensorclasses".

A memory-mapped ``ImageNetData`` tensorclass (uint8 images [3, 128, 128] and int64 targets,
8,192 rows = 384 MiB at full scale, in /dev/shm) is read through
``DataLoader(data, batch_size=128, shuffle=True, collate_fn=Collate("cpu"))``: one
``__getitems__`` gather per batch, then the tutorial's ``Collate`` (``.to(device)``) and the
fields read. The reference runs the same loop over its own tensorclass; the limit case is the
same loop over a tensordict_rs TensorDict of the same data (what the tensorclass costs).
"""

from __future__ import annotations

import gc

import pytest
import tensordict
import tensordict_rs
import torch
from _harness import SCALE, SHM_BASE, Case, fresh_dir, measure, remove, replay
from _workloads import CASES, LIMIT, REF, RS
from torch.utils.data import DataLoader

BATCH = 128


def rows() -> int:
    return max(1024, int(8192 * SCALE))


class Collate(torch.nn.Module):
    """The tutorial's collate module (no transform: its validation loader)."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = torch.device(device)

    def __call__(self, x):  # type: ignore[no-untyped-def]
        out = x
        if self.device:
            out = out.to(self.device)
        return out


def _classes(pkg):  # type: ignore[no-untyped-def]
    @pkg.tensorclass
    class ImageNetData:
        images: torch.Tensor
        targets: torch.Tensor

    return ImageNetData


@pytest.fixture(scope="module")
def saved():
    """The dataset saved by the reference (as a tensorclass) under /dev/shm."""
    path = fresh_dir(SHM_BASE)
    g = torch.Generator().manual_seed(0)
    n = rows()
    data = _classes(tensordict)(
        images=torch.randint(0, 256, (n, 3, 128, 128), dtype=torch.uint8, generator=g),
        targets=torch.randint(0, 1000, (n,), generator=g),
        batch_size=[n],
    )
    data.memmap_(path)
    del data
    gc.collect()
    yield path
    remove(path)


def _cases(path) -> dict[str, Case]:  # type: ignore[no-untyped-def]
    ref = _classes(tensordict).load_memmap(path)
    ours = _classes(tensordict_rs).load_memmap(path)
    plain = tensordict_rs.TensorDict.load_memmap(path / "_tensordict")
    for td in (ref, ours):
        td.images.sum(), td.targets.sum()  # fault every page in once, untimed
    plain["images"].sum()

    def loop(data, fields):  # type: ignore[no-untyped-def]
        def call(_):  # type: ignore[no-untyped-def]
            loader = DataLoader(
                data,
                batch_size=BATCH,
                shuffle=True,
                generator=torch.Generator().manual_seed(0),
                collate_fn=Collate("cpu"),
            )
            for batch in loader:
                fields(batch)

        return call

    def tc_fields(batch):  # type: ignore[no-untyped-def]
        return batch.images, batch.targets

    def td_fields(batch):  # type: ignore[no-untyped-def]
        return batch["images"], batch["targets"]

    return {
        REF: Case(call=loop(ref, tc_fields)),
        RS: Case(call=loop(ours, tc_fields)),
        LIMIT: Case(call=loop(plain, td_fields)),
    }


@pytest.mark.parametrize("case", CASES)
def test_tensorclass_loading(benchmark, case, saved):  # type: ignore[no-untyped-def]
    measure("tc_loading", rows(), lambda: _cases(saved), batch=BATCH, dataset_rows=rows())
    replay(benchmark, "tc_loading", case)


def test_tensorclass_loading_sanity(saved):  # type: ignore[no-untyped-def]
    """Both libraries load the same class and rows (not timed)."""
    ref = _classes(tensordict).load_memmap(saved)
    ours = _classes(tensordict_rs).load_memmap(saved)
    assert type(ours).__name__ == "ImageNetData"
    idx = [5, 1, 7]
    assert torch.equal(ours[idx].images, ref[idx].images)
    assert torch.equal(ours[idx].targets, ref[idx].targets)
