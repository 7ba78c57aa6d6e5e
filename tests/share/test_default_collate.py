"""torch's default ``collate_fn`` with trees, side by side with tensordict 0.15.3: a DataLoader
over a TensorDict (its batches read whole), over a dataset of one tree or tensorclass per
sample (stacked), and the refusals (samples that do not stack raise ``TypeError``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as rs
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

PKGS = [rs, ref]


@rs.tensorclass
class RsPoint:
    x: torch.Tensor
    label: str


@ref.tensorclass
class RefPoint:
    x: torch.Tensor
    label: str


class Samples(Dataset):
    """One tree (or tensorclass) per index; module level for spawn workers."""

    def __init__(self, pkg: str, kind: str) -> None:
        self.pkg, self.kind = pkg, kind

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> Any:
        P = rs if self.pkg == "rs" else ref
        if self.kind == "point":
            cls = RsPoint if self.pkg == "rs" else RefPoint
            return cls(x=torch.full((2,), float(i)), label=f"p{i}", batch_size=[])
        return P.TensorDict({"a": torch.tensor(float(i)), "n": {"b": torch.ones(2) * i}}, [])


def _plain(batch: Any) -> Any:
    if hasattr(batch, "to_dict"):
        return {"batch": tuple(batch.batch_size), "entries": _plain(batch.to_dict())}
    if isinstance(batch, dict):
        return {k: _plain(v) for k, v in batch.items()}
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    return batch


def test_a_tensordict_dataset_with_the_default_collate() -> None:
    got = []
    for P in PKGS:
        td = P.TensorDict({"a": torch.arange(10.0), "n": {"b": torch.arange(20).view(10, 2)}}, [10])
        got.append([_plain(b) for b in DataLoader(td, batch_size=4)])
    assert got[0] == got[1]
    assert got[0][0]["batch"] == (4,)


@pytest.mark.parametrize("kind", ["tree", "point"])
def test_samples_are_stacked(kind: str) -> None:
    got = []
    for name in ("rs", "ref"):
        batches = list(DataLoader(Samples(name, kind), batch_size=4))
        assert type(batches[0]).__name__ == (
            "TensorDict" if kind == "tree" else f"{name.title()}Point"
        )
        got.append([_plain(b) for b in batches])
    assert got[0] == got[1]


def test_samples_that_do_not_stack_raise_type_error() -> None:
    for P in PKGS:  # other numbers of batch dims: both refuse
        one = P.TensorDict({"a": torch.zeros(2)}, [2])
        with pytest.raises(TypeError, match="different numbers of batch dims"):
            default_collate([one, P.TensorDict({"a": torch.zeros(2)}, [])])
    # other keys: refused here, naming the keys (tensordict 0.15.3 returns a lazy stack, which
    # this library does not have: a listed difference)
    one = rs.TensorDict({"a": torch.zeros(2)}, [2])
    with pytest.raises(TypeError, match="do not stack"):
        default_collate([one, rs.TensorDict({"b": torch.zeros(2)}, [2])])


def test_memory_mapped_batches_through_spawn_workers(tmp_path: Path) -> None:
    """The default collate in the workers passes the batch read whole through: the ring's
    batches, memory-mapped source, the same rows as without workers."""
    td = rs.TensorDict({"a": torch.arange(40.0).view(20, 2)}, [20]).memmap(tmp_path / "d")
    plain = [b["a"].clone() for b in DataLoader(td, batch_size=5)]
    loader = DataLoader(td, batch_size=5, num_workers=2, multiprocessing_context="spawn")
    with_workers = [b["a"].clone() for b in loader]
    assert len(plain) == len(with_workers) == 4
    for a, b in zip(plain, with_workers, strict=True):
        assert torch.equal(a, b)


class WholeBatches(Dataset):
    """Batches made by the dataset itself (``batch_size=None`` loaders)."""

    def __init__(self, td: Any) -> None:
        self.td = td

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> Any:
        return self.td[i * 5 : (i + 1) * 5]


def test_batch_size_none_passes_trees_through(tmp_path: Path) -> None:
    """``DataLoader(batch_size=None)`` hands each tree to torch's ``default_convert``, which
    rebuilds mappings by iterating them: a TensorDict is no Mapping here, so it passes through
    (tensordict 0.15.3's, a MutableMapping, fails there: its iteration gives rows)."""
    td = rs.TensorDict({"x": torch.arange(20.0).view(10, 2)}, [10]).memmap(tmp_path / "d")
    got = [b["x"].clone() for b in DataLoader(WholeBatches(td), batch_size=None)]
    assert [g.shape for g in got] == [(5, 2), (5, 2)] and torch.equal(torch.cat(got), td["x"])
