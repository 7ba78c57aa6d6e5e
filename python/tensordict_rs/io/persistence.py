"""Memory maps of a whole TensorDict: ``memmap_``, ``memmap``, ``memmap_like``, ``load_memmap``.

The file-system work is the Rust core's (``directory`` hands it one call per tree); this module is
the TensorDict-facing API around it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Self, Unpack, overload

from .. import _native
from .._core.classes import public
from .._core.nodes import NonTensorData, TreeNode
from .._core.nontensor import NonTensorStack, share_entries
from .._core.walk import refuse_unbatched
from ..memmap import MemoryMappedTensor, _LazyLeaf
from ..ops.devices import _normalize_device
from . import archive as _archive
from . import directory
from . import progress as _progress
from .options import COPY, LIKE, CopyOptions, LikeOptions, SaveOptions, keywords
from .saving import TensorDictFuture, _maybe_done, _save, _to_archive

PathLike = str | os.PathLike[str]


class MemoryMapped(TreeNode):
    """The memory-map methods of TensorDict."""

    _is_memmap: bool
    _memmap_prefix: Path | None

    def is_memmap(self) -> bool:
        """True after ``memmap_``, ``memmap`` or ``memmap_like`` (until ``unlock_``).

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3])
        >>> td.is_memmap(), td.memmap().is_memmap()
        (False, True)
        """
        return self._is_memmap

    @property
    def saved_path(self) -> Path | None:
        """The directory of a memory-mapped TensorDict (None when anonymous).

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2)}, [2])
        >>> td.memmap_(prefix="saved").saved_path.name, td.memmap().saved_path
        ('saved', None)
        """
        if not self._is_memmap:
            raise AttributeError(
                f"The tensordict has no saved path (memmap=False, path={self._memmap_prefix})."
            )
        return self._memmap_prefix

    @overload
    def memmap_(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        return_early: Literal[False] = False,
        **options: Unpack[CopyOptions],
    ) -> Self: ...
    @overload
    def memmap_(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        return_early: bool,
        **options: Unpack[CopyOptions],
    ) -> Self | TensorDictFuture[Self]: ...
    @keywords(COPY)
    def memmap_(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        return_early: bool = False,
        **options: Unpack[CopyOptions],
    ) -> Self | TensorDictFuture[Self]:
        """Moves every tensor into memory maps, in place, then locks the keys; returns self.

        Without ``prefix`` (and no earlier one) the maps are anonymous shared memory. With
        ``prefix`` the tree is written in tensordict's directory format, atomically, into the
        directory itself (which stays yours: its inode, mode and owner are kept): a crash
        leaves the old or the new tree. Leaves that already are the files at ``prefix`` keep
        them (handles on them stay live); other leaves get new files, so maps of the old files
        keep their values. Files you put there are never replaced, moved or deleted; a save
        that would have to is refused first. ``durable=True`` fsyncs everything first.
        ``num_threads`` sets the writer threads (0: one per CPU). ``existsok=False`` refuses to
        replace an existing tree. A failed save leaves this TensorDict as it was.
        ``return_early=True`` with ``num_threads > 1`` returns a ``TensorDictFuture`` (its
        ``result()`` waits), as tensordict does; otherwise the save finishes first.
        With ``archive=True`` or a prefix ending in ``.tdz`` the tree is one zip archive (see
        ``io/archive.py``), its leaves views of it; ``compression="deflate"`` compresses them.
        ``progress=True`` draws a ``tqdm`` bar of the bytes written (off when
        ``TENSORDICT_RS_NO_PROGRESS=1`` and in DataLoader workers).

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0)}, [3]).memmap_("saved")
        >>> td.is_memmap(), td.is_locked, type(td["a"]).__name__
        (True, True, 'MemoryMappedTensor')
        >>> sorted(p.name for p in td.saved_path.iterdir())
        ['a.memmap', 'meta.json']
        """
        opts = SaveOptions.given("memmap_", return_early, options, COPY)
        _check_save_options(self, opts.share_non_tensor, opts.robust_key)
        if opts.share_non_tensor:
            share_entries(self)
        path = Path(prefix).absolute() if prefix is not None else self._memmap_prefix
        if self._is_memmap and path == self._memmap_prefix and prefix is None:
            self.lock_()
            return _maybe_done(self, opts.return_early, opts.num_threads, lambda: None)
        if _archive.wanted(path, opts.archive, opts.compression):
            return _to_archive(self, path, opts, like=False, inplace=True)
        reuse = path is None
        return _save(self, path, opts, like=False, reuse_maps=reuse, copy_existing=copy_existing)

    def _structure(self) -> Self:
        out = self._new_unchecked(self._batch_size, self._device)
        out._names = self._names  # kept in memory (meta.json records no names, as tensordict's)
        for key in list(self._tensordict):
            value = self._tensordict[key]
            if isinstance(value, MemoryMapped):
                out._tensordict[key] = value._structure()
            elif isinstance(value, NonTensorData):
                out._tensordict[key] = type(value)(value.data)
            elif isinstance(value, NonTensorStack):
                # its own cells: the saved copy's rows are bound to its files, and a write into
                # either tree must not reach the other (nor the other's directory)
                out._tensordict[key] = value.clone(recurse=False)
            else:
                # a lazy leaf is shared as it is: the save reads its buffer, no tensor is made
                out._tensordict[key] = value
        return out

    @overload
    def memmap(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        return_early: Literal[False] = False,
        **options: Unpack[CopyOptions],
    ) -> Self: ...
    @overload
    def memmap(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        return_early: bool,
        **options: Unpack[CopyOptions],
    ) -> Self | TensorDictFuture[Self]: ...
    @keywords(COPY)
    def memmap(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        return_early: bool = False,
        **options: Unpack[CopyOptions],
    ) -> Self | TensorDictFuture[Self]:
        """Like ``memmap_`` but returns a new memory-mapped TensorDict; this one is unchanged.

        Of a TensorDict that is memory-mapped already (without a prefix, or with its own saved
        path) the result holds the same tensors, as in tensordict: ``td.memmap()["a"] is
        td["a"]``; nothing is copied.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0)}, [3])
        >>> saved = td.memmap("copy")
        >>> saved.is_memmap(), td.is_memmap(), torch.equal(saved["a"], td["a"])
        (True, False, True)
        >>> td.memmap("copy.tdz")["a"]  # one zip file, each leaf a view of its map
        MemoryMappedTensor([0., 1., 2.])
        """
        opts = SaveOptions.given("memmap", return_early, options, COPY)
        _check_save_options(self, opts.share_non_tensor, opts.robust_key)
        path = Path(prefix).absolute() if prefix is not None else None
        same = self._is_memmap and (path is None or path == self._memmap_prefix)
        if same:
            _materialize(self)  # the result shares the tensor objects, not only their memory
        # To an archive (``archive=True`` or a ``.tdz`` prefix) the result is what tensordict
        # returns, ``load_memmap(prefix)``: unlocked, its leaves copy-on-write views of the file.
        if _archive.wanted(path, opts.archive, opts.compression):
            return _to_archive(self._structure(), path, opts, like=False, inplace=False)
        reuse = same and path is None
        out = self._structure()
        if opts.share_non_tensor:
            share_entries(out)
        return _save(out, path, opts, like=False, reuse_maps=reuse, copy_existing=copy_existing)

    @overload
    def memmap_like(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        return_early: Literal[False] = False,
        **options: Unpack[LikeOptions],
    ) -> Self: ...
    @overload
    def memmap_like(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        return_early: bool,
        **options: Unpack[LikeOptions],
    ) -> Self | TensorDictFuture[Self]: ...
    @keywords(LIKE)
    def memmap_like(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        return_early: bool = False,
        **options: Unpack[LikeOptions],
    ) -> Self | TensorDictFuture[Self]:
        """A new locked TensorDict of memory maps with the same keys, shapes and dtypes (no
        values copied; source leaves may be on any device, ``meta`` included).
        To an archive (``archive=True`` or a ``.tdz`` prefix) the result is unlocked and
        mapped shared, as tensordict's ``load_memmap(prefix, mode="r+")``: writes reach the
        file (see ``refresh_archive_checksums``).

        New maps are zero-filled. With ``prefix``, a data file already there is mapped as it
        is and keeps its content, as in tensordict (which lets you reopen a buffer); a file
        too small for its leaf's shape is refused, not grown. The directory is written
        atomically like ``memmap_``. ``reserve=True`` reserves the space of new files now, so
        that a full disk is an ``OSError(ENOSPC)`` here; ``reserve=False`` makes them sparse
        (instant, as tensordict does), at the risk of a SIGBUS when a write later finds the
        disk full. ``copy_existing`` is accepted for tensordict's signature; since no values
        are copied it changes nothing.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> spec = TensorDict({"obs": torch.empty(1000, 3, device="meta")}, [1000])
        >>> buffer = spec.memmap_like("buffer")  # 12 kB of zeros on disk
        >>> buffer[0] = TensorDict({"obs": torch.ones(3)}, [])
        >>> buffer["obs"][:2]
        MemoryMappedTensor([[1., 1., 1.],
                            [0., 0., 0.]])
        """
        opts = SaveOptions.given("memmap_like", return_early, options, LIKE)
        _check_save_options(self, opts.share_non_tensor, opts.robust_key)
        path = Path(prefix).absolute() if prefix is not None else None
        if _archive.wanted(path, opts.archive):
            return _to_archive(self._structure(), path, opts, like=True, inplace=False)
        out = self._structure()
        if opts.share_non_tensor:
            share_entries(out)
        return _save(out, path, opts, like=True, reuse_maps=False, copy_existing=True)

    @classmethod
    def load_memmap(
        cls,
        prefix: PathLike,
        device: Any = None,
        non_blocking: bool = False,
        *,
        out: Self | None = None,
        robust_key: bool | None = True,
        subpath: Any = None,
        mode: str | None = None,
        num_threads: int = 0,
        allow_pickle: bool | None = None,
        progress: bool = False,
    ) -> Self:
        """Loads a directory saved by ``memmap_``/``memmap``/``memmap_like`` here or by tensordict.

        The directory is validated first: a missing or short data file, an unknown dtype, a bad
        shape, a key that would leave the directory or pass a symlink, or pickled data raise an
        exception naming the key and path (pickles also with ``allow_pickle=True``, which is
        accepted: a directory without them loads as with ``False``). Leaves are file-backed
        MemoryMappedTensors (writes reach the files); with a non-CPU ``device`` they are copied
        there instead (with ``non_blocking``). The result is not locked, as in tensordict.
        ``out`` loads into that TensorDict (see ``load_memmap_``). ``num_threads`` is accepted
        for tensordict's signature: the whole tree is already opened in one native call.
        A file is read as a ``.tdz`` archive: one map, each leaf a view of it, copy-on-write
        unless ``mode="r+"`` (then writes reach the file). ``subpath`` (``"a/b"``, ``("a",
        "b")``) returns the nested TensorDict there, as tensordict does (the whole tree is
        validated and mapped; ``ValueError`` when no TensorDict is there). ``progress=True``
        draws a bar of the bytes mapped or copied (see ``memmap_``).

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> _ = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3, 2)}}, [3]).memmap("d")
        >>> TensorDict.load_memmap("d")
        TensorDict(batch_size=[3], device=cpu, fields={a: f32[], b: {c: f32[2]}})
        """
        _check_load_options(robust_key, allow_pickle)
        if out is not None:
            return out.load_memmap_(prefix)
        target = _normalize_device(device)
        if os.path.isfile(prefix):
            loaded = _progress.load(
                progress, prefix, lambda: _archive.load(cls, prefix, target, non_blocking, mode)
            )
            return public(loaded if subpath is None else _archive.subtree(loaded, subpath, prefix))
        if mode not in (None, "r+"):
            raise ValueError(
                f"mode {mode!r}: directories are mapped shared where writable (mode='r+'); "
                "copy-on-write mode='r' is supported for .tdz archives only"
            )
        try:
            loaded = _progress.load(
                progress,
                prefix,
                lambda: directory.load(cls, prefix, target, non_blocking),
            )
        except _native.UnsupportedFormatError:
            # a NonTensorStack saved on its own (``stack.memmap(prefix)``): tensordict's
            # load_memmap returns the stack
            stack = _stack_on_its_own(prefix, subpath)
            if stack is None:
                raise
            return stack  # type: ignore[return-value]
        return public(loaded if subpath is None else _archive.subtree(loaded, subpath, prefix))

    @overload
    def save(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        return_early: Literal[False] = False,
        **options: Unpack[CopyOptions],
    ) -> Self: ...
    @overload
    def save(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        return_early: bool,
        **options: Unpack[CopyOptions],
    ) -> Self | TensorDictFuture[Self]: ...
    @keywords(COPY)
    def save(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        return_early: bool = False,
        **options: Unpack[CopyOptions],
    ) -> Self | TensorDictFuture[Self]:
        """``memmap(prefix, ...)``, under tensordict's other name: returns the saved TensorDict
        (memory-mapped, locked); this one is unchanged. ``TensorDict.load`` reads it back.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> _ = TensorDict({"a": torch.ones(2)}, [2]).save("ckpt")
        >>> TensorDict.load("ckpt")["a"]
        MemoryMappedTensor([1., 1.])
        """
        SaveOptions.given("save", return_early, options, COPY)  # unknown names: save()'s error
        return self.memmap(prefix, copy_existing, return_early=return_early, **options)

    dumps = save

    @classmethod
    def load(cls, prefix: PathLike, *args: Any, **kwargs: Any) -> Self:
        """``load_memmap(prefix, ...)``, under tensordict's other name.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> _ = TensorDict({"a": torch.ones(2)}, [2]).save("ckpt.tdz")
        >>> TensorDict.load("ckpt.tdz")["a"]
        MemoryMappedTensor([1., 1.])
        """
        return cls.load_memmap(prefix, *args, **kwargs)

    def load_memmap_(
        self,
        prefix: PathLike,
        robust_key: bool | None = True,
        *,
        allow_pickle: bool | None = None,
        mode: str | None = None,
    ) -> Any:
        """Loads the tree at ``prefix`` into this TensorDict and returns it.

        As in tensordict: nested TensorDicts are kept (same objects), every leaf is replaced by
        the loaded one, keys the directory lacks are removed. A memory-mapped TensorDict stays
        memory-mapped (now at ``prefix``) and locked.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3])
        >>> _ = td.memmap("saved")
        >>> fresh = TensorDict({"a": torch.zeros(3), "b": {}}, [3])
        >>> fresh.load_memmap_("saved")["b", "c"]
        MemoryMappedTensor([1., 1., 1.])
        """
        _check_load_options(robust_key, allow_pickle)
        was_memmap = self._is_memmap
        if was_memmap:
            self.unlock_()
        loaded = type(self).load_memmap(prefix, device=self._device)
        _replace_entries(self, loaded)
        self._tracker = loaded._tracker
        if was_memmap:
            directory._mark(self, loaded._memmap_prefix)
            self._lock_tree()
        return self

    def memmap_refresh_(self, *, allow_pickle: bool | None = None) -> Any:
        """Loads this memory-mapped TensorDict again from its ``saved_path`` (entries another
        process added or removed show up); returns it.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3])
        >>> saved = td.memmap("saved")
        >>> other = TensorDict.load_memmap("saved")
        >>> other["a"][0] = 9.0
        >>> saved.memmap_refresh_()["a"][0]
        MemoryMappedTensor(9.)
        """
        if not self._is_memmap or self._memmap_prefix is None:
            raise RuntimeError(
                "Cannot refresh a TensorDict that is not memory mapped or has no path associated."
            )
        return self.load_memmap_(self._memmap_prefix, allow_pickle=allow_pickle)

    def flush(self) -> None:
        """Writes the dirty pages of every file-backed leaf to disk and waits (one native call).

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3])
        >>> saved = td.memmap("saved")
        >>> saved["a"][0] = 5.0
        >>> saved.flush()  # on disk now, for other processes and after a crash
        >>> TensorDict.load_memmap("saved")["a"][0]
        MemoryMappedTensor(5.)
        """
        buffers: list[_native.Buffer] = []
        _collect_buffers(self, buffers)
        _native.flush_buffers(buffers)


def _stack_on_its_own(prefix: PathLike, subpath: Any) -> NonTensorStack | None:
    """The stack saved on its own at ``prefix``, or None when something else is there."""
    if subpath is not None:
        return None
    try:
        return NonTensorStack.load_memmap(prefix)
    except _native.InvalidDirectoryError:
        return None


def _check_save_options(td: Any, share_non_tensor: bool, robust_key: bool | None) -> None:
    """The reference's ``share_non_tensor`` and ``robust_key`` options of the save methods.

    Keys are always percent-encoded in file names here (``robust_key=True``, the reference's
    default); ``robust_key=False`` is accepted when no key needs encoding, since the names are
    then the same. Non-tensor values are written to ``meta.json``; with
    ``share_non_tensor=True`` they are also kept in shared memory (see
    ``_core/nontensor.share_entries``), so that a value written in place in one process is
    read in the others, as in tensordict.
    """
    refuse_unbatched(td, "memory-mapped")
    if robust_key is False:
        for key, _ in td.items(include_nested=True):
            for part in key if isinstance(key, tuple) else (key,):
                if _native.encode_key(part) != part:
                    raise ValueError(
                        f"robust_key=False: the key {part!r} needs percent-encoding to be a "
                        "file name inside the directory; tensordict_rs always encodes it "
                        "(robust_key=True)."
                    )


def _check_load_options(robust_key: bool | None, allow_pickle: bool | None) -> None:
    if robust_key is False:
        raise ValueError("robust_key=False (tensordict's legacy key encoding) is not supported")
    # tensordict's check: 0, 1 and numpy bools are refused
    if allow_pickle is not None and type(allow_pickle) is not bool:
        raise TypeError("allow_pickle must be a bool or None.")
    # allow_pickle=True is accepted: a directory without pickled entries loads as it does with
    # False (as in tensordict); one with them is still refused, naming the entry: pickles are
    # never loaded here, whatever allow_pickle says (they can run code)


def _materialize(td: Any) -> None:
    """Makes the tensors of every lazy leaf, so that trees sharing the entries share them."""
    for key, value in list(td._tensordict.items()):
        if type(value) is _LazyLeaf:
            td._get_str(key)
        elif isinstance(value, MemoryMapped):
            _materialize(value)


def _replace_entries(td: Any, loaded: Any) -> None:
    """Gives ``td`` the entries of ``loaded``; nested trees of ``td`` are kept and filled."""
    td._batch_size = loaded._batch_size
    td._memmap_prefix = loaded._memmap_prefix
    items = td._tensordict
    for key in [k for k in items if k not in loaded._tensordict]:
        del items[key]
    for key, value in loaded._tensordict.items():
        current = items.get(key)
        if isinstance(value, MemoryMapped) and isinstance(current, MemoryMapped):
            _replace_entries(current, value)
        else:
            items[key] = value


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
