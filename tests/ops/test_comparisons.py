"""Comparisons of TensorDicts: ==, !=."""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict_rs import TensorDict

from .._trees import make_td

# --------------------------------------------------------------------------------- comparisons


def test_eq_ne() -> None:
    td = make_td()
    other = make_td()
    other["a"][1, 2, 0] = 100.0
    eq = td == other
    assert isinstance(eq, TensorDict)
    assert eq.batch_size == td.batch_size
    assert eq["a"].dtype == torch.bool and eq["n", "x"].dtype == torch.bool
    assert eq["n", "deep", "y"].dtype == torch.bool
    assert eq["a"].sum().item() == 23
    assert not eq.all()
    assert eq.any()
    ne = td != other
    assert ne["a"].sum().item() == 1
    assert ne.any() and not ne.all()
    assert (td == make_td()).all()
    assert not (td != make_td()).any()
    # Against a scalar.
    zeros = TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3, 2)}}, [3])
    assert (zeros == 0).all()
    assert not (zeros != 0).any()
    assert not (zeros == 1).any()


def test_eq_with_memmap_and_loaded(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.rand(5), "b": {"c": torch.rand(5, 2)}}, [5])
    mm = td.memmap(tmp_prefix)
    assert (mm == td).all()
    loaded = TensorDict.load_memmap(tmp_prefix)
    assert (loaded == td).all()
    loaded["b", "c"][4, 1] += 1
    assert not (loaded == td).all()
    assert (loaded != td)["b", "c"][4].tolist() == [False, True]
