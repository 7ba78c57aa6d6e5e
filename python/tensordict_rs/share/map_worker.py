"""The worker side of ``map`` and ``map_iter``: what runs in the pool's processes.

The pool's initializer (``_seed_worker``: seeds, threads, and the trees a worker holds), the
counters a pool made by ``map`` shares with its workers (``_Counters``), the tasks sent to the
workers (``_Task`` for one chunk, ``_Batch`` for one message of several, ``_Loop`` for a
worker's whole share of a call with a memory-mapped or shared ``out``), ``_Copied`` (a result
that crosses back as bytes) and the writes of a chunk's result into its slice of ``out``.

The classes are module-level so that workers started with spawn or forkserver unpickle them
by name; the caller's side (splitting, the pool, joining the results) is in ``map``.
"""

from __future__ import annotations

import errno
import pickle
from collections.abc import Callable
from typing import Any

import torch

from .. import _native
from .._core.nodes import TreeNode

# The trees of the calls whose pool this process serves (set by ``_seed_worker``): a worker of
# a pool that ``map`` made gets the source, ``out`` and the call's ``_Counters`` once, and its
# tasks are only indices (or one ``_Loop``).
_TREES: dict[int, tuple[Any, Any, Any]] = {}


class _Counters:
    """Three counters a pool made here shares with its workers (one small shared array and its
    lock): the next worker id, the next chunk to claim, and a stop flag.

    A worker takes its id with ``get`` (the ``queue.get`` that tensordict's worker initializer
    calls; ids are 0, 1, ... in the order the workers start, as from its queue, with no feeder
    thread of the parent in between; a worker started later, to replace one ended by
    ``max_tasks_per_child``, gets the next id, where tensordict's queue has none left for it).
    It crosses to workers only as a pool's initializer argument (a lock pickles only then)."""

    def __init__(self, ctx: Any) -> None:
        self.cells = ctx.Array("q", 3)  # next worker id, next chunk, stop (0 or 1)

    def get(self, timeout: float | None = None) -> int:
        """The next worker id."""
        with self.cells.get_lock():
            worker_id = int(self.cells[0])
            self.cells[0] = worker_id + 1
        return worker_id

    def claim(self, count: int) -> int | None:
        """The next of ``count`` chunks, or None once all are claimed or after ``stop``."""
        with self.cells.get_lock():
            chunk = int(self.cells[1])
            if chunk >= count or self.cells[2]:
                return None
            self.cells[1] = chunk + 1
        return chunk

    def stop(self) -> None:
        """No chunk is claimed after this (an exception, in a worker or in the caller)."""
        with self.cells.get_lock():
            self.cells[2] = 1


def _seed_worker(
    base_seed: int, queue: Any, num_threads: int, token: int = 0, trees: Any = None
) -> None:
    """Pool initializer: worker ``i`` (from ``queue.get``) seeds torch with ``base + i`` and
    NumPy from both (the rule of DataLoader workers), uses ``num_threads`` torch threads, and
    keeps ``trees`` (the source, ``out`` and counters of the call, crossed once: paths and
    descriptors, not data)."""
    if trees is not None:
        _TREES[token] = trees
    worker_id = queue.get(timeout=120)
    torch.manual_seed(base_seed + worker_id)
    try:
        import numpy as np
        from torch.utils.data._utils.worker import _generate_state

        np.random.seed(_generate_state(base_seed, worker_id))
    except ImportError:  # pragma: no cover - numpy is optional
        pass
    torch.set_num_threads(num_threads)


class _Task:
    """Calls ``fn`` on one chunk in a worker (and writes into ``out``'s slice when given).

    A module-level class, so workers started with spawn or forkserver unpickle it by name.
    An exception gets a note naming the chunk before it crosses back.
    """

    __slots__ = ("copy", "dim", "fn", "token", "write")

    def __init__(
        self, fn: Callable[..., Any], dim: int, write: bool, token: int = 0, copy: bool = False
    ) -> None:
        self.fn, self.dim, self.write, self.token = fn, dim, write, token
        self.copy = copy

    def __call__(self, task: tuple[Any, ...]) -> Any:
        index, where, chunk, *out = task
        try:
            if self.token:  # the worker holds the trees: the task is the chunk's index
                td, target, _ = _TREES[self.token]
                at = (*(slice(None),) * self.dim, chunk)
                chunk = td[at]
                out = [] if target is None else [target[at]]
            result = self.fn(chunk)
            if self.write:
                _write(out[0], result)
                return None
            return _Copied(pickle.dumps(result)) if self.copy else result
        except Exception as err:
            err.add_note(_note(index, where, self.dim))
            raise


class _Batch:
    """Runs the tasks of one pool message (several chunks) in a worker; their results in
    order (an exception of one fails the message, as the pool's own batches do)."""

    __slots__ = ("task",)

    def __init__(self, task: _Task) -> None:
        self.task = task

    def __call__(self, tasks: list[tuple[Any, ...]]) -> list[Any]:
        return [self.task(one) for one in tasks]


class _Copied:
    """A result that crosses back as a copy of its bytes (plain pickle), for a worker that may
    exit right after sending it (``max_tasks_per_child``): shared memory crosses as descriptors
    that the parent fetches from the sending worker's resource sharer, so a result of a worker
    that had ended by then never arrived and ``map`` waited forever."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple[Any, ...]:
        return (pickle.loads, (self.data,))


class _Loop:
    """One worker's share of a call with a memory-mapped or shared ``out`` (the worker holds
    the trees): claims chunk after chunk from the call's shared counter, calls ``fn`` on each
    and writes its result into ``out``, until no chunk is left; returns how many it did.

    The workers share the chunks out one at a time as each becomes free, so a worker slowed by
    the machine holds up the end by at most one chunk, and nothing crosses between the chunks.
    An exception stops every worker's claiming (chunks already claimed are finished) and
    reaches the caller with the chunk's note and its number (``map_chunk``)."""

    __slots__ = ("count", "dim", "fn", "size", "step", "token")

    def __init__(
        self, fn: Callable[..., Any], dim: int, token: int, size: int, step: int, count: int
    ) -> None:
        self.fn, self.dim, self.token = fn, dim, token
        self.size, self.step, self.count = size, step, count

    def __call__(self, _: int) -> int:
        td, target, counters = _TREES[self.token]
        base = (slice(None),) * self.dim
        done = 0
        while (chunk := counters.claim(self.count)) is not None:
            index: Any = chunk
            if self.step:  # slices of ``step`` elements (else one element per chunk)
                index = slice(chunk * self.step, min((chunk + 1) * self.step, self.size))
            at = (*base, index)
            try:
                _write(target[at], self.fn(td[at]))
            except Exception as err:
                counters.stop()
                err.add_note(_note(chunk, _where(index), self.dim))
                vars(err)["map_chunk"] = chunk  # pickled with the exception, read by ``_run``
                raise
            done += 1
        return done


def _note(position: int, where: str, dim: int) -> str:
    return f"map: fn raised on chunk {position} ({where} along dim {dim})"


def _write(target: TreeNode, result: Any) -> None:
    """A chunk's result into its slice of a memory-mapped or shared ``out``."""
    if result is not None and not _write_through_files(target, result):
        target.update_(result)


def _write_through_files(target: TreeNode, result: Any) -> bool:
    """Writes ``result`` into the slice ``target`` of a memory-mapped ``out`` with one positioned
    write per leaf into its file, when every entry allows it (``result`` has exactly
    ``target``'s tensor entries, each contiguous on the CPU with the leaf's dtype and shape, and
    each leaf is a contiguous view of a file map); returns False, having written nothing,
    otherwise (the caller then uses ``update_``). The bytes land in the same page cache the
    map shows, without faulting ``out``'s pages into this worker one by one: measured, the
    first write through a fresh map of a file costs ~0.4 s of CPU per GiB here, ~0.25 s as a
    ``pwrite``."""
    if (
        not isinstance(result, TreeNode)
        or result._batch_size != target._batch_size
        or target._read_only
    ):
        return False
    dst_items = target._tensordict
    src_items = result._tensordict
    if dst_items.keys() != src_items.keys():
        return False
    writes = []
    for key, dst in dst_items.items():
        src = src_items[key]
        buffer = getattr(dst, "_buffer", None)
        if (
            buffer is None
            or buffer.file_id is None  # a shared map of a file (not anonymous, not an archive)
            or not buffer.writable
            or not isinstance(src, torch.Tensor)
            or src.device.type != "cpu"
            or src.dtype != dst.dtype
            or src.shape != dst.shape
            or src.requires_grad
            or not src.is_contiguous()
            or not dst.is_contiguous()
        ):
            return False
        writes.append((buffer, dst.data_ptr(), src))
    try:
        for buffer, address, src in writes:
            buffer.write_through(address, src.data_ptr(), src.nbytes)
    except _native.InvalidTreeError:
        # a file replaced since ``out`` mapped it: ``update_`` writes through the maps, as it
        # always did (the leaves written here it writes again, the same bytes)
        return False
    except OSError as err:
        if err.errno in _GONE:  # a file (or its folder) removed, or no longer ours to open
            return False
        # any other (ENOSPC, EDQUOT, EIO, ...): the same write through the map would fault
        # (SIGBUS: the worker died and the caller got WorkerDiedError, not this error)
        raise
    return True


# The errors of a positioned write that mean the file is no longer the one at its path (or
# cannot be opened there again) while its map still takes writes: ``update_`` writes through it.
_GONE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ESTALE, errno.EACCES, errno.EPERM})


def _where(index: Any) -> str:
    if isinstance(index, slice):
        return f"elements {index.start}:{index.stop}"
    if isinstance(index, torch.Tensor):
        return f"{index.numel()} shuffled elements"
    return f"element {index}"
