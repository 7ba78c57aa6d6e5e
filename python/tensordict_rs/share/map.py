"""``TensorDict.map`` and ``map_iter``: a function over chunks of a tree in worker processes.

The tree is split along ``dim`` into views (``split``/``chunk``/``unbind``, or lazily with
``index_with_generator``), each chunk is sent to a pool worker, and the results are joined
(``torch.cat``, or ``torch.stack`` for ``chunksize=0``) or written into ``out``.

Nothing is copied on the way: pool tasks and results cross through multiprocessing's
``ForkingPickler``, where this package's reducers are registered. A chunk of a memory-mapped
tree crosses as the paths of its files and the geometry of its views; a chunk of an anonymous
(``share_memory_()``) tree as one descriptor per arena; the worker maps the same pages. A
result crosses back as one new arena (one descriptor), or is not sent at all: with a
memory-mapped or shared ``out``, each worker writes its result into its slice of ``out``.

With such an ``out`` and a pool made here, the chunks are not sent at all: each worker gets one
message, and claims chunk after chunk from a counter shared with the others until none is left
(``_Loop``), so no pipe round trip, pickle or parent thread stands between two chunks. What runs
in the workers (the tasks, the loop, the writes into ``out``) is in ``map_worker``.

An exception raised by ``fn`` reaches the caller with its type, and a note naming the chunk. A
worker that dies (killed, or crashed in native code) raises ``WorkerDiedError`` in the caller
instead of leaving it waiting for the lost chunk.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .._core.nodes import TreeNode
from ..io.entries import FileEntries
from ..ops.autograd import Autograd
from ..ops.binary import MorePointwise
from ..ops.convert import Conversions
from ..ops.entries import Entries
from ..ops.factories import Factories
from ..ops.modules import ModuleWeights
from ..ops.names import Names
from ..ops.rearrange import Rearrange
from ..ops.reductions import Reductions
from .map_worker import _Batch, _Counters, _Loop, _seed_worker, _Task, _where
from .pool_watch import POLL_S, NotYet, Watch, WorkerDiedError, watched


def _batches(tasks: Iterator[tuple[Any, ...]], size: int) -> Iterator[list[tuple[Any, ...]]]:
    """``tasks`` in lists of ``size`` (the last one shorter)."""
    import itertools

    while batch := list(itertools.islice(tasks, size)):
        yield batch


def _holdable(td: TreeNode, mp_start_method: str | None) -> bool:
    """Whether the workers of a pool made here should hold the whole tree (tasks are then
    indices): when it reaches them without a copy, memory-mapped or shared, or inherited by
    fork. (A plain tree sent to spawn/forkserver workers would be copied once per worker; it
    is sent chunk by chunk instead, each chunk copied once.)"""
    from torch import multiprocessing as tmp

    method = (
        mp_start_method
        or tmp.get_start_method(allow_none=True)
        or tmp.get_context().get_start_method()
    )
    return method == "fork" or _shared_tree(td)


def _shared_tree(td: Any) -> bool:
    from .._core.walk import leaves

    if td.is_memmap() or td.is_shared():
        return True
    return all(type(leaf).__name__ == "MemoryMappedTensor" for _, _, leaf in leaves(td))


def _token() -> int:
    """A number naming one call's trees in its workers (never 0: 0 means "sent per task")."""
    import itertools

    global _COUNTER
    if _COUNTER is None:
        _COUNTER = itertools.count(1)
    return next(_COUNTER)


_COUNTER: Any = None


def _indices(
    size: int, chunksize: int | None, num_chunks: int | None, num_workers: int
) -> list[Any]:
    """The index of every chunk along the split dim: slices, or ints for ``chunksize=0``."""
    if chunksize is None and num_chunks is None:
        num_chunks = num_workers
    if chunksize is not None and num_chunks is not None:
        raise ValueError("Either chunksize or num_chunks must be provided, but not both.")
    if num_chunks is not None:
        num_chunks = max(min(size, num_chunks), 1)
        chunksize = -(size // -num_chunks) if size else 1
    elif chunksize == 0:
        return list(range(size))
    assert chunksize is not None
    if chunksize < 0:
        raise ValueError(f"chunksize must be non-negative, got {chunksize}")
    return [slice(start, min(start + chunksize, size)) for start in range(0, size, chunksize)]


def _tasks(
    td: TreeNode,
    out: TreeNode | None,
    dim: int,
    indices: list[Any],
    shuffle: bool,
    held: bool,
) -> Iterator[tuple[Any, ...]]:
    """``(position, description, chunk[, out chunk])`` for every chunk, made as the pool asks
    for them; with ``held`` (the workers hold the trees) the chunk is its index."""
    base = (slice(None),) * dim
    if shuffle:
        perm = torch.randperm(td.batch_size[dim], device=td.device)
        indices = [perm[i] if isinstance(i, slice) else perm[i : i + 1].squeeze(0) for i in indices]

    def one(position: int, index: Any) -> tuple[Any, ...]:
        if held:
            return (position, _where(index), index)
        chunk = td[(*base, index)]
        if out is None:
            return (position, _where(index), chunk)
        return (position, _where(index), chunk, out[(*base, index)])

    return (one(p, i) for p, i in enumerate(indices))


def _preload_seeding() -> None:
    """Imports here, once, what ``_seed_worker`` imports in each worker (``numpy.random``
    and torch's seed mixing), so that workers forked from this process start with them: a
    first ``np.random.seed`` imports ``numpy.random``, ~10 ms of every worker's start, paid
    again by every call's new pool."""
    try:
        import numpy.random  # noqa: F401
        from torch.utils.data._utils import worker  # noqa: F401
    except ImportError:  # pragma: no cover - numpy is optional
        pass


def _pool(
    num_workers: int | None,
    generator: torch.Generator | None,
    max_tasks_per_child: int | None,
    worker_threads: int,
    mp_start_method: str | None,
    method: str,
    token: int = 0,
    trees: tuple[Any, Any] | None = None,
) -> tuple[Any, _Counters]:
    """A pool of ``num_workers`` seeded workers, and the counters it shares with them; with
    ``trees`` (the source and ``out``), each worker holds them under ``token``."""
    from torch import multiprocessing as tmp

    if num_workers is None:
        num_workers = tmp.cpu_count()
    if generator is None:
        warnings.warn(
            f"{method}() got no generator and draws the base seed of its workers from a new "
            "torch.Generator, so every call seeds them alike. Starting with TensorDict 0.17, "
            "the default will change to drawing it from the global torch RNG, as "
            "torch.utils.data.DataLoader does, which also advances that RNG by one draw. Pass "
            "generator=torch.default_generator for the new behaviour now, or "
            "generator=torch.Generator() to keep the current seeds.",
            FutureWarning,
            stacklevel=3,
        )
        generator = torch.Generator()
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
    ctx = tmp.get_context(mp_start_method) if mp_start_method else tmp.get_context()
    if ctx.get_start_method() == "fork":
        _preload_seeding()
    counters = _Counters(ctx)
    held = None if trees is None else (*trees, counters)
    pool = ctx.Pool(
        processes=num_workers,
        initializer=_seed_worker,
        initargs=(seed, counters, worker_threads, token, held),
        maxtasksperchild=max_tasks_per_child,
    )
    return pool, counters


def _batch(chunks: int, workers: int) -> int:
    """Chunks per pool message: several when there are many (one pipe round trip per message,
    not per chunk; ``fn`` is still called on each chunk and results come back in order), but
    at least 16 messages per worker, so that the workers share out the chunks evenly: a worker
    slowed by the machine (or given harder chunks) is left with at most a 16th of its share
    when the others finish. (A quarter of its share before: with 64 chunks of 16 MiB and 2
    workers, batches of 8 chunks left one worker ~0.1 s behind the other on a loaded machine.)"""
    return max(1, min(64, chunks // (16 * max(workers, 1))))


def _split(
    td: TreeNode, dim: int, chunksize: int | None, num_chunks: int | None, workers: int
) -> tuple[int, list[Any]]:
    """``dim`` made non-negative (checked) and the index of every chunk along it."""
    ndim = td.batch_dims
    dim = dim + ndim if dim < 0 else dim
    if not 0 <= dim < ndim:
        raise IndexError(
            f"dim {dim} is out of range for tensordict with batch size {td.batch_size}"
        )
    return dim, _indices(td.batch_size[dim], chunksize, num_chunks, workers)


def _run(pool: Any, counters: _Counters, loop: _Loop) -> None:
    """Every worker of ``pool`` runs ``loop`` (its share of the chunks) and this waits for all;
    an exception of ``fn`` is raised here (the one of the lowest chunk, when several workers
    met one), after the others have stopped claiming chunks."""
    pending = [pool.apply_async(loop, (i,)) for i in range(pool._processes)]
    errors: list[tuple[int, BaseException]] = []
    watch = Watch(pool, "map")
    try:
        for one in pending:
            while True:
                try:
                    one.get(POLL_S)
                except NotYet:
                    watch.check()
                    continue
                except Exception as err:
                    errors.append((vars(err).pop("map_chunk", -1), err))
                break
    except BaseException:
        counters.stop()  # KeyboardInterrupt here: the workers finish the chunks they hold
        raise
    if errors:
        raise min(errors, key=lambda pair: pair[0])[1]


def _results(
    td: TreeNode,
    fn: Callable[..., Any],
    dim: int,
    pool: Any,
    out: TreeNode | None,
    chunksize: int | None,
    num_chunks: int | None,
    lazily: bool,
    shuffle: bool,
    pbar: bool,
    token: int = 0,
    what: str = "map",
) -> tuple[Any, list[Any], bool]:
    if shuffle and not lazily:
        raise RuntimeError(
            "Shuffling is not permitted unless use_generator is set to ``True`` for efficiency "
            "purposes."
        )
    dim, indices = _split(td, dim, chunksize, num_chunks, pool._processes)
    write = out is not None and (out.is_shared() or out.is_memmap())
    tasks = _tasks(td, out if write else None, dim, indices, shuffle, held=bool(token))
    batch = _batch(len(indices), pool._processes)
    # a worker that ends after some tasks may be gone before its results' descriptors are fetched
    task = _Task(fn, dim, write, token, copy=getattr(pool, "_maxtasksperchild", None) is not None)
    # several chunks per message, batched here rather than by the pool: its batched ``imap``
    # is a plain generator, whose waits could not look at the workers
    send = pool.imap_unordered if shuffle else pool.imap
    if batch > 1:
        messages = watched(send(_Batch(task), _batches(tasks, batch), 1), Watch(pool, what))
        imap: Any = (result for results in messages for result in results)
    else:
        imap = watched(send(task, tasks, 1), Watch(pool, what))
    if pbar and importlib.util.find_spec("tqdm") is not None:
        from tqdm.auto import tqdm  # type: ignore[import-untyped,unused-ignore]

        imap = tqdm(imap, total=len(indices))
    return imap, indices, write


def _gather(
    td: TreeNode,
    fn: Callable[..., Any],
    dim: int,
    pool: Any,
    out: TreeNode | None,
    chunksize: int | None,
    num_chunks: int | None,
    lazily: bool,
    pbar: bool,
    token: int,
) -> list[Any]:
    """``map`` through pool messages (a pool of the caller's, results to return, a plain
    ``out``, a progress bar): the results to join, in chunk order (a plain ``out`` is written
    here, slice by slice; a memory-mapped or shared one by the workers)."""
    imap, indices, write = _results(
        td, fn, dim, pool, out, chunksize, num_chunks, lazily, False, pbar, token
    )
    ndim = td.batch_dims
    base = (slice(None),) * (dim + ndim if dim < 0 else dim)
    results = []
    for index, item in zip(indices, imap, strict=True):
        if item is None or write:
            continue
        if out is not None:  # a plain ``out``: written here, slice by slice
            out[(*base, index)].update_(item)
        else:
            results.append(item)
    return results


def _join_later(pool: Any) -> None:
    """Waits for the workers of a closed pool to end in a background thread, not in the caller.

    Every result is in (or written into ``out``) before this is called, so the workers have
    nothing left to do but end, and ending is the kernel unmapping the pages they touched:
    ~0.1 s for 2 workers that wrote 1 GiB into a memory-mapped ``out`` (their source and
    ``out`` pages, their heaps), a fifth of the whole call, which the caller no longer waits
    for. The thread is not a daemon, so the interpreter's exit waits for it: a daemon thread
    could end during shutdown and free the pool (and tensors it holds) while Python was
    finalizing, which aborted the process after the program's last line."""
    import threading

    threading.Thread(target=pool.join, name="tensordict_rs map: pool join", daemon=False).start()


def map(
    td: TreeNode,
    fn: Callable[..., Any],
    dim: int = 0,
    num_workers: int | None = None,
    *,
    out: TreeNode | None = None,
    chunksize: int | None = None,
    num_chunks: int | None = None,
    pool: Any = None,
    generator: torch.Generator | None = None,
    max_tasks_per_child: int | None = None,
    worker_threads: int = 1,
    index_with_generator: bool = False,
    pbar: bool = False,
    mp_start_method: str | None = None,
) -> Any:
    """``fn`` applied to chunks of the TensorDict along ``dim`` in worker processes, the
    results concatenated (stacked for ``chunksize=0``) or written into ``out``.

    Chunks are views: a memory-mapped TensorDict's chunks reach the workers as its files (no
    copy), so data larger than memory can be processed; with a memory-mapped or shared ``out``
    (``example.expand(N).memmap_like(dir)``), each worker writes its result into its slice of
    ``out`` and nothing crosses back. ``chunksize`` xor ``num_chunks`` (default: one chunk per
    worker); ``pool`` (a ``multiprocessing.Pool``) replaces ``num_workers``, ``generator``,
    ``max_tasks_per_child``, ``worker_threads`` and ``mp_start_method``. Worker ``i`` seeds
    torch with the base seed (drawn from ``generator``) plus ``i``. ``fn`` must be picklable (a
    module-level function). An exception in ``fn`` is raised here, with a note naming the
    chunk. Returns None if ``fn`` returns None for every chunk (and no ``out``). A pool made
    here is closed before returning; its workers end in the background (a thread joins
    them, and the interpreter's exit waits for that thread), so the call does not wait for
    their pages to be unmapped. After an exception the call waits for them.

    Run it from a script with an ``if __name__ == "__main__":`` guard, as any pool::

        def process(data):
            return data.empty().set("y", data["x"] + 1)

        if __name__ == "__main__":
            data = TensorDict({"x": torch.zeros(1000, 3)}, [1000]).memmap_("in")
            out = process(data[:1])[0].expand(1000).memmap_like("out")
            data.map(process, num_workers=4, chunksize=100, out=out,
                     generator=torch.default_generator)

    A method of a class pickles by name, so it can be ``fn`` anywhere:

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"x": torch.arange(8.0)}, [8])
    >>> out = td.map(TensorDict.clone, num_workers=2, chunksize=4, generator=torch.Generator())
    >>> torch.equal(out["x"], td["x"])
    True
    """
    own = pool is None
    token = 0
    done = False
    write = out is not None and (out.is_shared() or out.is_memmap())
    results = []
    if own:
        token = _token() if _holdable(td, mp_start_method) else 0
        pool, counters = _pool(
            num_workers, generator, max_tasks_per_child, worker_threads, mp_start_method, "map",
            token, (td, out if write else None) if token else None,
        )  # fmt: skip
    died = False
    try:
        if own and token and write and not pbar:  # the workers claim the chunks themselves
            dim, indices = _split(td, dim, chunksize, num_chunks, pool._processes)
            first = indices[0] if indices else 0
            step = first.stop - first.start if isinstance(first, slice) else 0
            size = td.batch_size[dim]
            _run(pool, counters, _Loop(fn, dim, token, size, step, len(indices)))
        else:
            results = _gather(td, fn, dim, pool, out, chunksize, num_chunks, index_with_generator,
                              pbar, token)  # fmt: skip
        done = True
    except WorkerDiedError:
        died = True
        raise
    finally:
        if own:
            if not done:
                counters.stop()
            if died:
                # the lost chunk's result never comes: a closed pool would wait for it in
                # ``join`` (its worker thread runs while results are pending), so the pool's
                # record of them goes and the other workers are ended
                pool._cache.clear()
                pool.terminate()
                pool.join()
            else:
                pool.close()
                if done:
                    _join_later(pool)
                else:
                    pool.join()
    if out is not None:
        return out
    if not results:
        return None
    if chunksize == 0:
        return torch.stack(results, dim + td.batch_dims if dim < 0 else dim)
    return torch.cat(results, dim)


def map_iter(
    td: TreeNode,
    fn: Callable[..., Any],
    dim: int = 0,
    num_workers: int | None = None,
    *,
    shuffle: bool = False,
    chunksize: int | None = None,
    num_chunks: int | None = None,
    pool: Any = None,
    generator: torch.Generator | None = None,
    max_tasks_per_child: int | None = None,
    worker_threads: int = 1,
    index_with_generator: bool = True,
    pbar: bool = False,
    mp_start_method: str | None = None,
) -> Iterator[Any]:
    """``fn`` applied to chunks of the TensorDict in worker processes, each result yielded as
    soon as it is ready: in chunk order, or in the order the workers finish with ``shuffle``
    (which draws the chunks' elements from a random permutation, and needs
    ``index_with_generator=True``, the default here). The other arguments are ``map``'s. A
    pool made here is closed when the iteration ends or is abandoned.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"x": torch.arange(4)}, [4])
    >>> callable(td.map_iter)
    True
    """
    own = pool is None
    token = 0
    if own:
        token = _token() if _holdable(td, mp_start_method) else 0
        pool, _ = _pool(
            num_workers, generator, max_tasks_per_child, worker_threads, mp_start_method,
            "map_iter", token, (td, None) if token else None,
        )  # fmt: skip
    try:
        imap, _, _ = _results(
            td, fn, dim, pool, None, chunksize, num_chunks, index_with_generator, shuffle, pbar,
            token, "map_iter",
        )  # fmt: skip
        yield from imap
    finally:
        if own:
            # The iteration may have been abandoned: its results are not wanted. Dropping the
            # pool's record of them first keeps CPython's terminate() from refusing ("Cannot
            # have cache with result_hander not alive", 2 runs in 15 under load), after which
            # its workers would never be ended. A result still arriving for a dropped job is
            # ignored by the pool's result thread.
            pool._cache.clear()
            pool.terminate()
            pool.join()


class ParallelMap(TreeNode):
    """``map`` and ``map_iter`` (a mixin of TensorDict)."""

    map = map
    map_iter = map_iter


class Methods(
    ParallelMap,
    ModuleWeights,
    Autograd,
    Conversions,
    Entries,
    Factories,
    Names,
    MorePointwise,
    Rearrange,
    Reductions,
    FileEntries,
):
    """Every method family of issue 23 in one base of TensorDict (``map`` and the mixins of
    ``ops`` and ``io`` below it), so that ``tensordict.py`` names one class."""
