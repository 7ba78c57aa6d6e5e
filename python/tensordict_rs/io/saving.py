"""How a save call runs: now or in a background thread (``TensorDictFuture``), to a directory
(``directory.save``) or to a ``.tdz`` archive (``_archive.write``), with an optional progress bar.

``persistence.py`` is the TensorDict-facing API; this module is what its save methods call.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic

from .._core.nodes import TD
from . import archive as _archive
from . import directory
from . import progress as _progress
from .options import SaveOptions


class TensorDictFuture(Generic[TD]):
    """A TensorDict still being written by a background thread, as tensordict returns it.

    ``memmap_``, ``memmap``, ``memmap_like`` and ``save`` return one with ``return_early=True``
    and ``num_threads > 1`` (otherwise they finish first and return the TensorDict, as
    tensordict does). ``result()`` waits and returns the TensorDict, or raises the save's error.
    Typed by what it gives: ``TensorDictFuture[TensorDict]``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.ones(4)}, [4])
    >>> future = td.memmap("bg", return_early=True, num_threads=2)
    >>> type(future).__name__, future.result().is_memmap()
    ('TensorDictFuture', True)
    """

    def __init__(self, futures: list[concurrent.futures.Future[None]], resulting_td: TD) -> None:
        """Wraps the writes to wait for and the TensorDict that ``result()`` returns."""
        self.futures = futures
        self.resulting_td = resulting_td
        self._retrieved = False  # result() was called: its error reaches the caller
        self._lost: BaseException | None = None  # a failure nobody has asked for yet

    def result(self) -> TD:
        """Waits for the writes to finish and returns the TensorDict (or raises their error)."""
        self._retrieved = True
        for future in self.futures:
            future.result()
        return self.resulting_td

    def __del__(self) -> None:
        """Reports a failure that ``result()`` never raised (see ``_report``)."""
        _report(self)

    def done(self) -> bool:
        """True once every write has finished."""
        return all(f.done() for f in self.futures)


def _maybe_done(
    future_result: TD, return_early: bool, num_threads: int, work: Callable[[], None]
) -> TD | TensorDictFuture[TD]:
    """Runs ``work`` now, or in a thread returning a TensorDictFuture (as tensordict does)."""
    if not (return_early and num_threads > 1):
        work()
        return future_result
    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    handle = TensorDictFuture([future], future_result)
    held = weakref.ref(handle)  # the thread must not keep the handle alive

    def run() -> None:
        try:
            work()
        except BaseException as err:  # handed to the caller through the future
            future.set_exception(err)
            holder = held()
            if holder is None:  # dropped already (fire and forget): nobody can ask for it
                _print_lost(err)
            elif not holder._retrieved:  # reported when dropped, or at exit, unless asked for
                holder._lost = err
                _unretrieved.add(holder)
            del holder
        else:
            future.set_result(None)

    # not a daemon: the interpreter's exit waits for the save, as it waits for tensordict's
    # executor threads (a daemon thread's save was cut off when the program ended first)
    threading.Thread(target=run, name="tensordict-rs save", daemon=False).start()
    return handle


# Futures whose save failed and whose error nobody has asked for yet: reported when they are
# dropped, or at the interpreter's exit (after every save thread has ended).
_unretrieved: weakref.WeakSet[TensorDictFuture[Any]] = weakref.WeakSet()


def _print_lost(err: BaseException) -> None:
    """Writes a failed background save's error to stderr: a program that started a save with
    ``return_early=True`` and never called ``result()`` would otherwise end without a word,
    with nothing saved (tensordict writes what this library refuses, so a program moved over
    from it meets these refusals here first)."""
    print(
        "tensordict_rs: a save started with return_early=True failed, and its error was never "
        "retrieved (TensorDictFuture.result() raises it); the target is as it was:",
        file=sys.stderr,
    )
    traceback.print_exception(err, file=sys.stderr)


def _report(handle: TensorDictFuture[Any]) -> None:
    """Prints ``handle``'s failure once, unless ``result()`` was called."""
    err, handle._lost = getattr(handle, "_lost", None), None
    if err is not None and not handle._retrieved:
        _print_lost(err)


@atexit.register
def _report_at_exit() -> None:
    for handle in list(_unretrieved):
        _report(handle)


def _to_archive(
    target: TD, path: Path | None, options: SaveOptions, *, like: bool, inplace: bool
) -> TD | TensorDictFuture[TD]:
    """Writes ``target`` as a ``.tdz`` archive at ``path`` (see ``archive.write``)."""
    assert path is not None  # _archive.wanted refuses an archive without a path
    return _maybe_done(
        target,
        options.return_early,
        options.num_threads,
        _progress.around(
            options.progress,
            "memmap",
            target,
            lambda: _archive.write(
                target,
                path,
                like=like,
                inplace=inplace,
                compression=options.compression,
                existsok=options.existsok,
                durable=options.durable,
                num_threads=options.num_threads,
            ),
        ),
    )


def _save(
    target: TD,
    path: Path | None,
    options: SaveOptions,
    *,
    like: bool,
    reuse_maps: bool,
    copy_existing: bool,
) -> TD | TensorDictFuture[TD]:
    """Memory-maps ``target`` in place and locks it (or returns a Future of that)."""

    def work() -> None:
        directory.save(
            target,
            path,
            like=like,
            reuse_maps=reuse_maps,
            copy_existing=copy_existing,
            existsok=options.existsok,
            durable=options.durable,
            num_threads=options.num_threads,
            sparse=not options.reserve,
        )
        target._lock_tree()

    work_shown = _progress.around(options.progress, "memmap", target, work)
    return _maybe_done(target, options.return_early, options.num_threads, work_shown)
