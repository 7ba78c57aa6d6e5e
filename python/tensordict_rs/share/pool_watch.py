"""Waits on a ``multiprocessing`` pool that notice a dead worker (``map``, ``map_iter``).

A pool worker that dies (the OOM killer, a signal, a crash in native code) takes the task it
held with it; the pool starts a new worker in its place and the caller, waiting for that task's
result, would wait forever. These waits look at the pool's workers while they wait and raise
``WorkerDiedError`` instead.
"""

from __future__ import annotations

import signal
import threading
import weakref
from collections.abc import Iterator
from multiprocessing import TimeoutError as NotYet
from typing import Any

from .. import _native

__all__ = ["POLL_S", "NotYet", "Watch", "WorkerDiedError", "watched"]

# How often a wait on the pool looks at its workers: a worker that dies (the OOM killer, a
# signal, a crash in native code) takes its chunk with it, and the pool, which starts a new
# worker in its place, would wait for that chunk's result forever (tensordict's ``map`` does).
POLL_S = 0.2


class WorkerDiedError(_native.TensorDictError, RuntimeError):
    """A worker process of ``map``/``map_iter`` ended while the call waited on it (its chunk
    is lost; a memory-mapped ``out`` holds the chunks the others wrote). A ``RuntimeError`` too,
    as DataLoader's "worker exited unexpectedly"."""


# The watches waiting now, and a lock for them and for what the pools' threads add to them.
_WATCHES: weakref.WeakSet[Watch] = weakref.WeakSet()
_LOCK = threading.Lock()
_JOIN_EXITED: Any = None  # the pool's own, once ``_install`` wrapped it


def _join_exited_workers(workers: list[Any]) -> bool:
    """``Pool._join_exited_workers`` (a pool's worker thread: it drops the workers that ended
    from the pool's list before starting others in their place), which first hands the workers
    it drops to the watches of that pool. Looking at the list every ``POLL_S`` missed a worker
    that the pool started and lost between two looks (with ``max_tasks_per_child``, a new
    worker killed on its first chunk): the call waited for that chunk forever."""
    with _LOCK:
        watches = [w for w in _WATCHES if getattr(w.pool, "_pool", None) is workers]
    if not watches:
        return _JOIN_EXITED(workers)
    before = list(workers)
    try:
        return _JOIN_EXITED(workers)
    finally:
        gone = [p for p in before if not any(p is q for q in workers)]
        if gone:
            with _LOCK:
                for watch in watches:
                    for p in gone:
                        if not any(p is q for q in watch.ended):
                            watch.seen.setdefault(id(p), p)


def _install() -> None:
    """Wraps ``Pool._join_exited_workers`` once, when the first watch starts (importing this
    library changes nothing in ``multiprocessing``; a pool without a watch sees no change)."""
    global _JOIN_EXITED
    with _LOCK:
        if _JOIN_EXITED is None:
            from multiprocessing import pool

            _JOIN_EXITED = pool.Pool._join_exited_workers  # type: ignore[attr-defined]
            pool.Pool._join_exited_workers = staticmethod(_join_exited_workers)  # type: ignore[attr-defined]


class Watch:
    """The workers of a pool, to tell that one ended abnormally while a call waits on it
    (workers that a pool starts later, in place of ones that ended, are watched too, also
    ones that the pool started and lost between two checks: the pool hands them over)."""

    __slots__ = ("__weakref__", "ended", "pool", "seen", "what")

    def __init__(self, pool: Any, what: str) -> None:
        _install()
        self.pool, self.what = pool, what
        workers = list(getattr(pool, "_pool", ()))
        # only workers alive now: one that died before the call held none of its chunks
        self.ended = tuple(p for p in workers if p.exitcode is not None)
        self.seen = {id(p): p for p in workers if not any(p is q for q in self.ended)}
        with _LOCK:
            _WATCHES.add(self)

    def check(self) -> None:
        """Raises ``WorkerDiedError`` when a watched worker has ended other than by exit 0 (a
        worker ended by ``max_tasks_per_child`` exits with 0)."""
        with _LOCK:
            for p in list(getattr(self.pool, "_pool", ())):
                if not any(p is q for q in self.ended):
                    self.seen.setdefault(id(p), p)
            workers = list(self.seen.values())
        for p in workers:
            code = p.exitcode
            if code is None or code == 0:
                continue
            if code < 0:
                try:
                    how = f"killed by signal {signal.Signals(-code).name}"
                except ValueError:
                    how = f"killed by signal {-code}"
            else:
                how = f"exit code {code}"
            raise WorkerDiedError(
                f"{self.what}: worker process {p.pid} exited unexpectedly ({how}); the chunk "
                "it was working on is lost"
            )


def watched(imap: Any, watch: Watch) -> Iterator[Any]:
    """The results of a pool's ``imap``, checking its workers while one is awaited. When one
    died, the call's job leaves the pool's record first: the lost result would keep it there
    for good, and CPython's ``Pool.terminate`` then fails ("Cannot have cache with
    result_hander not alive") on a pool the caller may own (results still arriving for the
    job are dropped by the pool's result thread)."""
    while True:
        try:
            yield imap.next(POLL_S)
        except StopIteration:
            return
        except NotYet:
            try:
                watch.check()
            except WorkerDiedError:
                getattr(watch.pool, "_cache", {}).pop(getattr(imap, "_job", None), None)
                raise
