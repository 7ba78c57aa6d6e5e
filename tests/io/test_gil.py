"""The native calls release the GIL: another Python thread keeps running while they work.

A probe thread sleeps a fraction of a millisecond at a time (releasing the GIL) and, each time it
gets the GIL back, counts one "turn" if the main thread is inside the native call being watched.
While a call holds the GIL the probe cannot get it back at all, so it counts at most a turn or
two around the call's edges; while a call releases it, the probe counts a turn every wake-up.
The harness is checked against a C call known to hold the GIL (``sum(range(n))``).
No timings are asserted: only how many times the other thread ran during the call.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from tensordict_rs import MemoryMappedTensor, TensorDict, _native

from .._gil_probe import MAX_TURNS_HELD, MIN_TURNS, probe_thread

BIG = 64 * 1024 * 1024  # float32 elements: 256 MiB


@pytest.fixture(scope="module")
def big() -> torch.Tensor:
    return torch.ones(BIG)


def test_harness_detects_a_call_that_holds_the_gil() -> None:
    with probe_thread() as probe:
        holds_gil = probe.watch(lambda n: sum(range(n)))
        for _ in range(3):  # repeated, as the load test repeats its call: no call gets more
            assert holds_gil(3_000_000) == 3_000_000 * 2_999_999 // 2
    assert max(probe.per_call) <= MAX_TURNS_HELD, probe.per_call


def test_harness_detects_a_call_that_releases_the_gil() -> None:
    with probe_thread() as probe:
        probe.watch(time.sleep)(0.05)
    assert probe.turns >= MIN_TURNS


def test_save_to_prefix_releases_gil(big, tmp_prefix: Path, monkeypatch) -> None:
    td = TensorDict({"a": big}, [BIG])
    with probe_thread() as probe:
        monkeypatch.setattr(_native, "write_tree", probe.watch(_native.write_tree))
        td.memmap_(tmp_prefix, num_threads=1)
    assert probe.calls == 1
    assert probe.turns >= MIN_TURNS, probe.turns
    assert td["a"].filename == str(tmp_prefix / "a.memmap")
    assert td["a"][-1].item() == 1.0


def test_anonymous_copy_releases_gil(big, monkeypatch) -> None:
    td = TensorDict({"a": big}, [BIG])
    with probe_thread() as probe:
        monkeypatch.setattr(_native, "anonymous_buffers", probe.watch(_native.anonymous_buffers))
        td.memmap_(num_threads=1)
    assert probe.calls == 1
    assert probe.turns >= MIN_TURNS, probe.turns
    assert isinstance(td["a"], MemoryMappedTensor) and td["a"][-1].item() == 1.0


def test_from_tensor_to_file_releases_gil(big, tmp_path: Path, monkeypatch) -> None:
    with probe_thread() as probe:
        monkeypatch.setattr(_native, "write_file", probe.watch(_native.write_file))
        t = MemoryMappedTensor.from_tensor(big, filename=tmp_path / "big.memmap")
    assert probe.calls == 1
    assert probe.turns >= MIN_TURNS, probe.turns
    assert t.shape == (BIG,) and t[-1].item() == 1.0


def test_load_releases_gil(tmp_prefix: Path, monkeypatch) -> None:
    # Loading maps files without reading them: many leaves make the call long enough to see.
    # 2,500 leaves (~3 ms on a fast CI machine) once got 7 of the 10 turns needed: 4,000 leaves,
    # and the best of three calls (a call that holds the GIL gets at most a turn or two in any
    # one call, however often it is repeated, so the best call still tells them apart).
    leaves = 4000
    TensorDict({f"k{i}": torch.full((2,), float(i)) for i in range(leaves)}, [2]).memmap_(
        tmp_prefix
    )
    with probe_thread() as probe:
        monkeypatch.setattr(_native, "load_tree", probe.watch(_native.load_tree))
        for _ in range(3):
            loaded = TensorDict.load_memmap(tmp_prefix)
            if probe.per_call[-1] >= MIN_TURNS:
                break
    assert max(probe.per_call) >= MIN_TURNS, probe.per_call
    assert len(loaded.keys()) == leaves
    assert loaded[f"k{leaves - 1}"].tolist() == [leaves - 1.0, leaves - 1.0]


def test_info_report_releases_gil(tmp_prefix: Path, monkeypatch) -> None:
    # The summary walk and the rendering of `tensordict-rs info` run with the GIL released.
    # 10,000 leaves: the native call (~13 ms of CPU) lasts long enough for the probe's turns
    # on a loaded machine too (4,000 leaves, ~5 ms, got 7 of the 10 needed beside another CI)
    tree = {f"g{g}": {f"k{i}": torch.zeros(2) for i in range(250)} for g in range(40)}
    TensorDict(tree, [2]).memmap_(tmp_prefix)
    from tensordict_rs.cli import info

    with probe_thread() as probe:
        monkeypatch.setattr(_native, "tree_report", probe.watch(_native.tree_report))
        for _ in range(3):  # the best of three calls, as in test_load_releases_gil
            text = info.report(tmp_prefix)
            if probe.per_call[-1] >= MIN_TURNS:
                break
    assert max(probe.per_call) >= MIN_TURNS, probe.per_call
    assert "10000 tensors, 40 sub-trees" in text
