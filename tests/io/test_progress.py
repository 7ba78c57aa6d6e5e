"""progress=True: a tqdm bar in bytes, fed by a counter the Rust workers advance."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from tensordict_rs import TensorDict
from tensordict_rs.io import progress as _progress


class FakeBar:
    """Stands in for ``tqdm.auto.tqdm``: records every update, with the time and thread."""

    made: ClassVar[list[FakeBar]] = []

    def __init__(self, total: int, **kwargs: Any) -> None:
        self.total, self.kwargs = total, kwargs
        self.n = 0
        self.updates: list[tuple[float, int]] = []
        self.closed = False
        FakeBar.made.append(self)

    def update(self, n: int) -> None:
        self.n += n
        self.updates.append((time.perf_counter(), self.n))

    def refresh(self) -> None:
        self.updates.append((time.perf_counter(), self.n))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def bars(monkeypatch: pytest.MonkeyPatch) -> list[FakeBar]:
    import tqdm.auto

    FakeBar.made = []
    monkeypatch.setattr(tqdm.auto, "tqdm", FakeBar)
    monkeypatch.delenv(_progress.ENV, raising=False)
    return FakeBar.made


def tree(mib: int = 8, leaves: int = 4) -> TensorDict:
    rows = mib * 2**20 // (leaves * 4 * 64)  # float32 [rows, 64] leaves, ``mib`` MiB in all
    return TensorDict({f"x{i}": torch.rand(rows, 64) for i in range(leaves)}, [rows])


def nbytes(td: TensorDict) -> int:
    return sum(v.nbytes for v in td.values(include_nested=True, leaves_only=True))


def test_every_path_shows_one_bar_in_bytes(tmp_path: Path, bars: list[FakeBar]) -> None:
    td = tree(4)
    total = nbytes(td)
    td.memmap(tmp_path / "a", progress=True)
    td.memmap_like(tmp_path / "b", progress=True)
    loaded = TensorDict.load_memmap(tmp_path / "a", progress=True)
    TensorDict.load(tmp_path / "a", progress=True)
    td.clone().memmap_(tmp_path / "c", progress=True)
    td.clone().memmap_(progress=True)  # anonymous
    assert len(bars) == 6
    for bar in bars:
        assert bar.total == total and bar.n == total and bar.closed
        assert bar.kwargs["unit"] == "B" and bar.kwargs["unit_scale"] is True
    assert (loaded == td).all()


def test_off_by_default_and_by_environment(
    tmp_path: Path, bars: list[FakeBar], monkeypatch: pytest.MonkeyPatch
) -> None:
    td = tree(1)
    td.memmap(tmp_path / "a")
    TensorDict.load_memmap(tmp_path / "a")
    assert bars == []
    monkeypatch.setenv(_progress.ENV, "1")
    td.memmap(tmp_path / "b", progress=True)
    TensorDict.load_memmap(tmp_path / "b", progress=True)
    assert bars == []
    assert (TensorDict.load_memmap(tmp_path / "b") == td).all()


def test_bar_moves_while_the_native_call_runs(tmp_path: Path, bars: list[FakeBar]) -> None:
    """The counter is read while the GIL is released: updates come during the save, from the
    polling thread, at least 4 times a second, each a partial count."""
    # Sized from a first save so that the measured one lasts about a second here.
    probe = TensorDict({"x": torch.zeros(2**24 // 4)}, [])
    start = time.perf_counter()
    probe.memmap(tmp_path / "probe", num_threads=1)
    rate = 2**24 / max(time.perf_counter() - start, 1e-3)
    rows = int(min(rate, 2**30)) // 1024  # float32 [rows, 256]: about 1 s of writing
    td = TensorDict({"x": torch.zeros(rows, 256)}, [rows])
    total = nbytes(td)
    start = time.perf_counter()
    td.memmap(tmp_path / "big", progress=True, num_threads=1)
    elapsed = time.perf_counter() - start
    (bar,) = bars[-1:]
    assert bar.n == total
    during = [(t, n) for t, n in bar.updates if 0 < n < total]
    assert len(during) >= 2, f"{len(during)} partial updates during a {elapsed:.2f} s save"
    stamps = [start] + [t for t, _ in bar.updates]
    assert max(b - a for a, b in itertools.pairwise(stamps)) < 0.25 + _progress.INTERVAL


def test_missing_tqdm_fails_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_progress.ENV, raising=False)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    td = tree(1)
    with pytest.raises(ModuleNotFoundError, match=r"tqdm \(a dependency of tensordict-rs\)"):
        td.memmap(tmp_path / "a", progress=True)
    assert not (tmp_path / "a").exists()
    td.memmap(tmp_path / "a")  # without progress, nothing is needed


def test_a_failed_save_closes_its_bar(tmp_path: Path, bars: list[FakeBar]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "meta.json").write_text("{}")
    with pytest.raises(FileExistsError):
        tree(1).memmap(tmp_path / "a", progress=True, existsok=False)
    assert all(bar.closed for bar in bars)
    assert threading.active_count() == 1 or all(
        t.name != "tensordict-rs progress" for t in threading.enumerate()
    )


def _worker_progress(_: int) -> bool:
    return _progress.enabled(True)


def test_off_in_dataloader_workers() -> None:
    from torch.utils.data import DataLoader

    class Data(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> bool:
            return _worker_progress(i)

    assert _progress.enabled(True)
    got = list(DataLoader(Data(), batch_size=None, num_workers=1, multiprocessing_context="fork"))
    assert got == [False, False]


def test_copy_command_progress(tmp_path: Path) -> None:
    tree(2).memmap(tmp_path / "src")
    code = textwrap.dedent(
        f"""
        import sys
        from tensordict_rs.cli import main
        sys.exit(main(["copy", {str(tmp_path / "src")!r}, {str(tmp_path / "dst")!r}, "--progress"]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "100%" in out.stderr and "2.00M" in out.stderr
    assert (
        TensorDict.load_memmap(tmp_path / "dst") == TensorDict.load_memmap(tmp_path / "src")
    ).all()


def test_archives_and_their_loads_show_bars(tmp_path: Path, bars: list[FakeBar]) -> None:
    """``.tdz`` saves (stored and deflated) and loads count through the same counter."""
    td = tree(4)
    total = nbytes(td)
    td.memmap(tmp_path / "a.tdz", progress=True)
    td.memmap(tmp_path / "z.tdz", compression="deflate", progress=True)
    td.memmap_like(tmp_path / "l.tdz", progress=True)
    td.clone().memmap_(tmp_path / "i.tdz", progress=True)
    loaded = TensorDict.load_memmap(tmp_path / "z.tdz", progress=True)
    assert len(bars) == 5
    for bar in bars:
        assert bar.total == total and bar.n == total and bar.closed
    assert (loaded == td).all()
    assert (TensorDict.load_memmap(tmp_path / "a.tdz") == td).all()


def test_counter_sees_the_native_writes(tmp_path: Path) -> None:
    """Without tqdm in the way: the counter a ``with`` block installs is advanced by the native
    save of a directory and of an archive (every byte once), and by nothing outside it."""
    from tensordict_rs import _native

    td = tree(8, leaves=2)
    total = nbytes(td)
    for name in ("d", "a.tdz"):
        counter = _native.ProgressCounter()
        with counter:
            td.memmap(tmp_path / name)
        assert total <= counter.value <= total + 4096  # archive headers and meta.json entries
        td.memmap(tmp_path / (name + "2"))
        assert counter.value <= total + 4096


def test_return_early_draws_from_the_writing_thread(tmp_path: Path, bars: list[FakeBar]) -> None:
    """With ``return_early`` the save (and its counter) runs on a background thread."""
    from tensordict_rs import TensorDictFuture

    td = tree(4)
    future = td.memmap(tmp_path / "a", return_early=True, num_threads=2, progress=True)
    assert isinstance(future, TensorDictFuture)
    saved = future.result()
    (bar,) = bars
    assert bar.n == bar.total == nbytes(td) and bar.closed
    assert (saved == td).all()


def test_tqdm_is_a_plain_dependency() -> None:
    """``pip install tensordict-rs`` brings tqdm: progress=True needs no extra."""
    import importlib.metadata

    requires = importlib.metadata.requires("tensordict-rs") or []
    plain = [r for r in requires if r.startswith("tqdm") and "extra ==" not in r]
    assert plain, requires
