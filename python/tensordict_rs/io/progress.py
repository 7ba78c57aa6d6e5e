"""Progress bars for long saves, loads and copies (``progress=True``).

The Rust workers advance an atomic byte counter (``_native.ProgressCounter``) while the GIL
is released: entered as a context manager, the counter is this thread's for the native calls
made inside (directory and ``.tdz`` saves, loads, anonymous maps: no call takes a parameter for
it). A small Python thread reads it every 0.1 s and moves (or refreshes) a ``tqdm.auto`` bar,
so the bar is redrawn about ten times a second whatever the native call is doing, and the
workers pay one atomic addition per 4 MiB written.
``TENSORDICT_RS_NO_PROGRESS=1`` turns every bar off, and bars are always off inside DataLoader
workers (many processes would draw over each other). tqdm is a dependency of the package (small,
pure Python, installed by ``pip install tensordict-rs``), so ``progress=True`` works on every
install; an environment that removed it gets a clear error before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .. import _native

T = TypeVar("T")

ENV = "TENSORDICT_RS_NO_PROGRESS"
INTERVAL = 0.1  # seconds between two reads of the counter


def enabled(progress: bool) -> bool:
    """Whether a bar should be shown for a call made with ``progress``.

    >>> enabled(False)
    False
    """
    if not progress:
        return False
    if os.environ.get(ENV, "").strip() not in ("", "0"):
        return False
    data = sys.modules.get("torch.utils.data")
    return not (data is not None and data.get_worker_info() is not None)


def _tqdm() -> Any:
    try:
        from tqdm.auto import tqdm  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise ModuleNotFoundError(
            "progress=True draws a tqdm bar, and tqdm (a dependency of tensordict-rs) is missing "
            "from this environment: pip install tqdm, or leave progress off",
            name="tqdm",
        ) from None
    return tqdm


@contextlib.contextmanager
def bar(progress: bool, total: int, desc: str) -> Iterator[_native.ProgressCounter | None]:
    """A counter to hand to a native call, drawn as a bar of ``total`` bytes while it runs.

    The counter counts the native calls this thread makes inside the block. Yields None (no
    bar, nothing counted) when ``enabled(progress)`` is false. tqdm is imported before the
    call starts, so a missing tqdm fails before anything is written. A block that ends
    normally shows the whole ``total`` (parts no worker counts, such as leaves of an archive
    that are views of its map, are done too).

    >>> with bar(False, 100, "save") as counter:
    ...     counter is None
    True
    """
    if not enabled(progress):
        yield None
        return
    tqdm = _tqdm()
    counter = _native.ProgressCounter()
    pbar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc)
    done = threading.Event()
    shown = 0

    def poll() -> None:
        nonlocal shown
        while not done.wait(INTERVAL):
            now = min(counter.value, total)
            if now > shown:
                pbar.update(now - shown)
                shown = now
            else:
                pbar.refresh()  # keeps the elapsed time and rate live while nothing moves

    thread = threading.Thread(target=poll, name="tensordict-rs progress", daemon=True)
    thread.start()
    finished = False
    try:
        with counter:
            yield counter
        finished = True
    finally:
        done.set()
        thread.join()
        now = total if finished else min(counter.value, total)
        if now > shown:
            pbar.update(now - shown)
        pbar.close()


def tree_nbytes(td: Any) -> int:
    """Bytes of every tensor leaf of a TensorDict (lazy leaves included, none made).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> tree_nbytes(TensorDict({"a": torch.zeros(4), "b": {"c": torch.zeros(2, dtype=torch.int8)}}))
    18
    """
    total = 0
    for value in td._tensordict.values():
        if isinstance(getattr(value, "_tensordict", None), dict):  # a tree
            total += tree_nbytes(value)
        elif hasattr(value, "buffer"):
            total += value.buffer.nbytes  # a lazy leaf
        elif hasattr(value, "element_size"):
            total += value.numel() * value.element_size()
    return total


def summary_nbytes(node: Any) -> int:
    """Bytes of every tensor leaf of a ``_native.tree_summary`` result (meta.json only)."""
    total = 0
    for entry in node[3]:
        if entry[0] == 0:
            total += entry[4]
        elif entry[0] == 1:
            total += summary_nbytes(entry[2])
    return total


def around(progress: bool, desc: str, td: Any, work: Callable[[], T]) -> Callable[[], T]:
    """``work`` (a save of ``td``) drawn as a bar of ``td``'s bytes; ``work`` itself without
    progress. tqdm is looked for now, so a missing tqdm fails before anything is written.

    >>> around(False, "memmap", None, lambda: 3)()
    3
    """
    if not enabled(progress):
        return work
    _tqdm()
    total = tree_nbytes(td)

    def counted() -> T:
        with bar(progress, total, desc):
            return work()

    return counted


def load(progress: bool, prefix: str | os.PathLike[str], work: Callable[[], T]) -> T:
    """``work()`` (a load of ``prefix``), drawn as a bar of the tree's bytes with ``progress``
    (the total is read from the meta.json files first; no data is opened for it)."""
    if not enabled(progress):
        return work()
    _tqdm()
    total = summary_nbytes(_native.tree_summary(os.fspath(prefix)))
    with bar(progress, total, "load_memmap"):
        return work()
