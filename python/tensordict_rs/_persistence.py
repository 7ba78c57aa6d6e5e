"""Memory maps of a whole TensorDict: ``memmap_``, ``memmap``, ``memmap_like``, ``load_memmap``.

The file-system work is the Rust core's (``_tree`` hands it one call per tree); this module is
the TensorDict-facing API around it.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from . import _archive, _native, _tree
from ._devices import _normalize_device
from ._tree import NonTensorData, _LazyLeaf
from .memmap import MemoryMappedTensor

if TYPE_CHECKING:
    from .tensordict import TensorDict

PathLike = str | os.PathLike[str]


def _maybe_done(future_result: TensorDict, return_early: bool, work: Callable[[], None]) -> Any:
    """Runs ``work`` now, or in a thread returning a Future when ``return_early``."""
    if not return_early:
        work()
        return future_result
    future: concurrent.futures.Future[TensorDict] = concurrent.futures.Future()

    def run() -> None:
        try:
            work()
        except BaseException as err:  # handed to the caller through the future
            future.set_exception(err)
        else:
            future.set_result(future_result)

    threading.Thread(target=run, daemon=True).start()
    return future


class MemoryMapped:
    """The memory-map methods of TensorDict."""

    if TYPE_CHECKING:
        # The rest of TensorDict, which this part of the class is mixed into.
        def __getattr__(self, name: str) -> Any: ...

    _is_memmap: bool
    _memmap_prefix: Path | None

    def is_memmap(self) -> bool:
        """True after ``memmap_``, ``memmap`` or ``memmap_like`` (until ``unlock_``)."""
        return self._is_memmap

    @property
    def saved_path(self) -> Path | None:
        """The directory of a memory-mapped TensorDict (None when anonymous)."""
        if not self._is_memmap:
            raise AttributeError(
                f"The tensordict has no saved path (memmap=False, path={self._memmap_prefix})."
            )
        return self._memmap_prefix

    def memmap_(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        existsok: bool = True,
        durable: bool = False,
        archive: bool | None = None,
        compression: str | int | None = None,
    ) -> Any:
        """Moves every tensor into memory maps, in place, then locks the keys; returns self.

        Without ``prefix`` (and no earlier one) the maps are anonymous shared memory. With
        ``prefix`` the tree is written in tensordict's directory format, atomically: beside the
        target, then swapped in with one rename, so a crash leaves the old or the new tree, and
        maps of the old files keep their values. ``durable=True`` fsyncs everything first.
        ``num_threads`` sets the writer threads (0: one per CPU). ``existsok=False`` refuses to
        replace an existing tree. A failed save leaves this TensorDict as it was.
        ``return_early=True`` returns a ``concurrent.futures.Future`` of the result.
        With ``archive=True`` or a prefix ending in ``.tdz`` the tree is one zip archive (see
        ``_archive``), its leaves views of it; ``compression="deflate"`` compresses them.
        """
        path = Path(prefix).absolute() if prefix is not None else self._memmap_prefix
        if self._is_memmap and path == self._memmap_prefix and prefix is None:
            self.lock_()
            return _maybe_done(cast("TensorDict", self), return_early, lambda: None)
        if _archive.wanted(path, archive, compression):
            return _to_archive(
                self, path, return_early, False, True, compression, existsok, durable, num_threads
            )

        return _save(
            cast("TensorDict", self),
            path,
            like=False,
            reuse_maps=path is None,
            copy_existing=copy_existing,
            return_early=return_early,
            num_threads=num_threads,
            existsok=existsok,
            durable=durable,
        )

    def _structure(self) -> TensorDict:
        out = self._new_unchecked(self._batch_size, self._device)
        for key in list(self._tensordict):
            value = self._tensordict[key]
            if isinstance(value, MemoryMapped):
                out._tensordict[key] = value._structure()
            elif isinstance(value, NonTensorData):
                out._tensordict[key] = NonTensorData(value.data)
            else:
                # a lazy leaf is shared as it is: the save reads its buffer, no tensor is made
                out._tensordict[key] = value
        return out

    def memmap(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        existsok: bool = True,
        durable: bool = False,
        archive: bool | None = None,
        compression: str | int | None = None,
    ) -> Any:
        """Like ``memmap_`` but returns a new memory-mapped TensorDict; this one is unchanged.

        To an archive (``archive=True`` or a ``.tdz`` prefix) the result is what tensordict
        returns, ``load_memmap(prefix)``: unlocked, its leaves copy-on-write views of the file.
        """
        path = Path(prefix).absolute() if prefix is not None else None
        if _archive.wanted(path, archive, compression):
            return _to_archive(
                self._structure(),
                path,
                return_early,
                False,
                False,
                compression,
                existsok,
                durable,
                num_threads,
            )
        return _save(
            self._structure(),
            path,
            like=False,
            reuse_maps=False,
            copy_existing=copy_existing,
            return_early=return_early,
            num_threads=num_threads,
            existsok=existsok,
            durable=durable,
        )

    def memmap_like(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        existsok: bool = True,
        durable: bool = False,
        archive: bool | None = None,
    ) -> Any:
        """A new locked TensorDict of zero-filled memory maps with the same keys, shapes and
        dtypes (no values copied; source leaves may be on any device, ``meta`` included).
        To an archive (``archive=True`` or a ``.tdz`` prefix) the result is unlocked and
        mapped shared, as tensordict's ``load_memmap(prefix, mode="r+")``: writes reach the
        file (see ``refresh_archive_checksums``).

        With ``prefix`` the directory is written atomically like ``memmap_``; an existing tree
        there is replaced by the new, zero-filled one. ``copy_existing`` is accepted for
        tensordict's signature; since no values are copied it changes nothing.
        """
        path = Path(prefix).absolute() if prefix is not None else None
        if _archive.wanted(path, archive):
            return _to_archive(
                self._structure(),
                path,
                return_early,
                True,
                False,
                None,
                existsok,
                durable,
                num_threads,
            )
        return _save(
            self._structure(),
            path,
            like=True,
            reuse_maps=False,
            copy_existing=True,
            return_early=return_early,
            num_threads=num_threads,
            existsok=existsok,
            durable=durable,
        )

    @classmethod
    def load_memmap(
        cls,
        prefix: PathLike,
        device: Any = None,
        non_blocking: bool = False,
        *,
        mode: str | None = None,
    ) -> TensorDict:
        """Loads a directory saved by ``memmap_``/``memmap``/``memmap_like`` here or by tensordict.

        The directory is validated first: a missing or short data file, an unknown dtype, a bad
        shape, a key that would leave the directory or pass a symlink, or pickled data raise an
        exception naming the key and path. Leaves are file-backed MemoryMappedTensors (writes
        reach the files); with a non-CPU ``device`` they are copied there instead (with
        ``non_blocking``). The result is not locked, as in tensordict.
        A file is read as a ``.tdz`` archive: one map, each leaf a view of it, copy-on-write
        unless ``mode="r+"`` (then writes reach the file).
        """
        target = _normalize_device(device)
        if os.path.isfile(prefix):
            return _archive.load(cast("type[TensorDict]", cls), prefix, target, non_blocking, mode)
        if mode not in (None, "r+"):
            raise ValueError(
                f"mode {mode!r}: directories are mapped shared where writable (mode='r+'); "
                "copy-on-write mode='r' is supported for .tdz archives only"
            )
        return _tree.load(cast("type[TensorDict]", cls), prefix, target, non_blocking)

    load = load_memmap

    def flush(self) -> None:
        """Writes the dirty pages of every file-backed leaf to disk and waits (one native call)."""
        buffers: list[_native.Buffer] = []
        _collect_buffers(self, buffers)
        _native.flush_buffers(buffers)


def _collect_buffers(td: Any, out: list[_native.Buffer]) -> None:
    """The buffers of every mapped leaf, without making tensors of lazy leaves."""
    for value in td._tensordict.values():
        if type(value) is _LazyLeaf:
            out.append(value.buffer)
        elif isinstance(value, MemoryMappedTensor):
            if value._buffer is not None:
                out.append(value._buffer)
        elif isinstance(value, MemoryMapped):
            _collect_buffers(value, out)


def _to_archive(
    target: Any,
    path: Path | None,
    return_early: bool,
    like: bool,
    inplace: bool,
    compression: Any,
    existsok: bool,
    durable: bool,
    num_threads: int,
) -> Any:
    """Writes ``target`` as a ``.tdz`` archive at ``path`` (see ``_archive.write``)."""
    assert path is not None  # _archive.wanted refuses an archive without a path
    return _maybe_done(
        target,
        return_early,
        lambda: _archive.write(
            target,
            path,
            like=like,
            inplace=inplace,
            compression=compression,
            existsok=existsok,
            durable=durable,
            num_threads=num_threads,
        ),
    )


def _save(
    target: TensorDict,
    path: Path | None,
    *,
    like: bool,
    reuse_maps: bool,
    copy_existing: bool,
    return_early: bool,
    num_threads: int,
    existsok: bool,
    durable: bool,
) -> Any:
    """Memory-maps ``target`` in place and locks it (or returns a Future of that)."""

    def work() -> None:
        _tree.save(
            target,
            path,
            like=like,
            reuse_maps=reuse_maps,
            copy_existing=copy_existing,
            existsok=existsok,
            durable=durable,
            num_threads=num_threads,
        )
        target._lock_tree()

    return _maybe_done(target, return_early, work)
