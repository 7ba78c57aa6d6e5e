"""Memory-mapped trees that grow in place along their first batch dim (issue 24).

``extend_(rows)``, ``append_(row)`` and ``resize_(n)`` change the number of rows of a
memory-mapped TensorDict whose entries are all tensors, on disk or in anonymous memory.

On disk, each leaf keeps its rows in its own file with room reserved past the last row (the
reservation grows by half each time it runs out, so appending costs amortised O(1) per row;
tensordict and this library both load a file longer than its leaf). A growth writes the new
rows into the reservation, then replaces ``meta.json`` in one rename: that rename is the commit
point, so a process killed at any instant leaves the old number of rows or the new one, never a
torn row, and ``load_memmap`` always sees a committed length. One native call takes the
directory's lock (the one saves take), checks that it still holds the rows this tree shows,
writes the new rows and commits: growths of one directory from several processes take turns,
and a process whose view is stale reloads the directory and appends after the rows it holds
then. Other processes see new rows after ``memmap_refresh_()``. What a growth learns of the
tree (its leaves, their files' names and identities) it keeps for the next one (``_Growth``),
used while the tree still holds the values, batch size and directory it set.

Views and batches taken before a growth stay valid: files never shrink (a shrink only commits
fewer rows), and a growth past the reservation maps the longer file again while old tensors
keep their own map of the same file alive, so they keep reading and writing the same rows as
the tree. In anonymous memory a growth past the reservation moves the rows to a larger map;
tensors taken before then keep the old memory (valid, but no longer the tree's).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .. import _native
from .._core.classes import is_tensorclass
from .._core.nodes import TD, TreeNode
from .._core.tensor_bytes import _source_bytes, _tensor_from_buffer
from ..memmap import _LazyLeaf, _wrap
from . import dirty as _dirty_map

GROWTH = 1.5  # the reservation grows by this factor when it runs out
MIN_RESERVE_BYTES = 1 << 16  # and by at least this many bytes per leaf
MAX_RELOADS = 64  # a growth reloads a directory changed under it at most this many times


def _growable(td: TreeNode, what: str) -> list[tuple[str, Any]]:
    """The leaves of ``td`` (key, value), after refusing a tree that cannot grow in place."""
    prefix = td._memmap_prefix
    on_disk = prefix is not None and os.path.isdir(prefix)
    if not (td._is_memmap and prefix is None) and not on_disk:
        raise RuntimeError(
            f"{what} grows a memory-mapped TensorDict in place (saved in a directory, or "
            "anonymous); call memmap_() first (or use torch.cat for one in ordinary memory)"
        )
    if td._read_only:
        raise _native.LockedError(f"{what}: this TensorDict is read-only")
    if not td._batch_size:
        raise RuntimeError(f"{what}: a TensorDict without batch dims has no rows to grow")
    out = []
    for key, value in td._tensordict.items():
        if type(value) is not _LazyLeaf and not isinstance(value, torch.Tensor):
            raise _native.UnsupportedFormatError(
                f"{what}: key {key!r} is not a tensor; only a TensorDict whose entries are all "
                "tensors grows in place (its one meta.json then commits every leaf at once)"
            )
        if isinstance(value, torch.Tensor) and value.is_nested:
            raise _native.UnsupportedFormatError(f"{what}: key {key!r} is a nested tensor")
        if not _mapped_here(value, prefix, key):
            where = f"in {os.fspath(prefix)!r}" if prefix is not None else "in anonymous memory"
            raise RuntimeError(
                f"{what}: key {key!r} is not memory-mapped {where} (a value set in memory "
                "after the tree was loaded or saved): growing would replace its values with the "
                "file's; call memmap_() first to write it there"
            )
        out.append((key, value))
    return out


def _mapped_here(value: Any, prefix: Any, key: str) -> bool:
    """Whether the leaf ``value`` is the map of its own file (``prefix``'s file of ``key``,
    or anonymous memory when ``prefix`` is None) from its first byte, which is what a growth
    writes and then shows; a leaf without elements has nothing to lose either way."""
    if type(value) is not _LazyLeaf and value.numel() == 0:
        return True
    buffer = _buffer(value)
    if buffer is None:
        return False
    if type(value) is not _LazyLeaf and (
        value.data_ptr() != buffer.address or not value.is_contiguous()
    ):
        return False
    if prefix is None:
        return buffer.filename is None
    name = buffer.filename
    if name is None:
        return False
    want = os.path.join(os.fspath(prefix), _native.encode_key(key) + ".memmap")
    if os.path.abspath(name) == os.path.abspath(want):
        return True
    try:  # the same file by another path (a relative one, a link to the directory)
        st = os.stat(want)
    except OSError:
        return False
    return buffer.file_id == (st.st_dev, st.st_ino)


def _buffer(value: Any) -> _native.Buffer | None:
    return value.buffer if type(value) is _LazyLeaf else getattr(value, "_buffer", None)


class _Leaf:
    """One leaf of a growing tree: its file, its row size, and (a weak reference to) the value
    the last growth set in the tree. During a growth it also holds the leaf's map (``buffer``)
    and a tensor over it (``full``), dropped at the end: between growths nothing here keeps a
    map alive."""

    __slots__ = (
        "buffer",
        "dtype",
        "file_id",
        "filename",
        "full",
        "key",
        "name",
        "prefix",
        "ref",
        "row_bytes",
        "strides",
        "tail",
    )

    def __init__(self, td: TreeNode, key: str, value: Any) -> None:
        self.key = key
        self.dtype = value.dtype
        self.tail = tuple(value.shape[1:])
        self.strides = torch.empty((0, *self.tail), dtype=torch.uint8).stride()
        self.row_bytes = torch.Size(self.tail).numel() * self.dtype.itemsize
        self.prefix = td._memmap_prefix  # None: anonymous memory
        self.name = _native.encode_key(key) + ".memmap"
        self.ref: weakref.ref[Any] | None = None
        self._set_buffer(_buffer(value))

    def _set_buffer(self, buffer: _native.Buffer | None) -> None:
        self.buffer = buffer
        # a tensor whose storage starts at the map's first byte (made on first use)
        self.full: torch.Tensor | None = None
        self.file_id = None if buffer is None or self.prefix is None else buffer.file_id
        self.filename = None if buffer is None else buffer.filename

    def resume(self, value: Any) -> None:
        """Takes up the value the last growth set (a view of the map from its first byte)."""
        self.buffer = getattr(value, "_buffer", None)
        self.full = value if self.buffer is not None else None

    def release(self) -> None:
        """Drops the map (the tree's values keep it alive as long as they need it)."""
        self.buffer = self.full = None

    def capacity(self) -> int:
        if self.row_bytes == 0:
            return 1 << 62
        return 0 if self.buffer is None else self.buffer.nbytes // self.row_bytes

    def reserve(self, rows: int, keep: int) -> None:
        """Makes the map hold at least ``rows`` rows (``keep``: rows to carry over when the
        memory moves, in anonymous memory)."""
        if self.capacity() >= rows:
            return
        want = max(rows, int(self.capacity() * GROWTH), rows + MIN_RESERVE_BYTES // self.row_bytes)
        nbytes = want * self.row_bytes
        if self.prefix is None:
            new = _native.anonymous_buffers([(0, nbytes)])[0]
            if keep and self.buffer is not None:
                n = keep * self.row_bytes
                dst = torch.frombuffer(new, dtype=torch.uint8, count=n)
                dst.copy_(torch.frombuffer(self.buffer, dtype=torch.uint8, count=n))
            self._set_buffer(new)
            return
        name = os.path.join(self.prefix, self.name)
        if not os.path.lexists(name):  # a leaf saved with no rows has no file yet
            try:
                _native.write_file(name, 0, nbytes, existsok=False)
            except FileExistsError:
                pass  # another growth of this directory made it meanwhile: reserved below
        length = _native.reserve_file(name, nbytes)
        self._set_buffer(_native.open_file(name, length // self.row_bytes * self.row_bytes))

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of the map (within its capacity), as a plain tensor."""
        if self.full is None:
            assert self.buffer is not None
            shape = (self.buffer.nbytes // self.row_bytes, *self.tail)
            self.full = _tensor_from_buffer(self.buffer, self.dtype, shape)
        offset = start * self.strides[0]
        return self.full.as_strided((stop - start, *self.tail), self.strides, offset)

    def leaf(self, n: int) -> Any:
        """The tree's new value: the first ``n`` rows of the map (referenced weakly here)."""
        if self.row_bytes == 0 or n == 0 or self.buffer is None:
            value: Any = torch.empty((n, *self.tail), dtype=self.dtype)
        else:
            # a tensor, not a lazy leaf: the map is longer than the leaf (the reservation),
            # and the savers take a lazy leaf's bytes to be its whole map
            value = _wrap(self.rows(0, n), self.buffer, self.filename)
        self.ref = weakref.ref(value)
        return value


class _Growth:
    """What a growth leaves on the tree (``td._growth``) for the next one: the leaves (file
    names and identities, dtypes, weak references to the values it set) and the batch size it
    set. The next growth takes them as they are while the tree still holds exactly those
    values, that batch size and that directory (any other change to the tree replaces one of
    them); otherwise it starts again from the tree. The directory itself is checked by every
    growth, under its lock, whatever this says."""

    __slots__ = ("batch", "leaves", "prefix", "spec")

    def __init__(self, td: TreeNode, what: str) -> None:
        self.prefix = td._memmap_prefix
        self.batch = td._batch_size
        self.leaves = [_Leaf(td, key, value) for key, value in _growable(td, what)]
        self.spec = [(leaf.key, str(leaf.dtype), list(leaf.tail)) for leaf in self.leaves]

    @staticmethod
    def of(td: TreeNode, what: str) -> _Growth:
        """The growth state of ``td``: the one the last growth left while it still holds.
        It is taken off the tree (a growth from another thread meanwhile starts from the
        tree) and put back by the growth that succeeds."""
        state = td._growth
        td._growth = None
        if (
            type(state) is _Growth
            and state.prefix is td._memmap_prefix
            and state.batch is td._batch_size
            and not td._read_only
            and len(td._tensordict) == len(state.leaves)
        ):
            entries = td._tensordict
            for leaf in state.leaves:
                value = entries.get(leaf.key)
                if leaf.ref is None or value is None or value is not leaf.ref():
                    break
                leaf.resume(value)
            else:
                return state
        return _Growth(td, what)


def _new_rows(
    what: str, leaves: list[_Leaf], source: TreeNode | None, count: int
) -> list[torch.Tensor]:
    """The ``count`` new rows of each leaf, as contiguous CPU tensors of the leaf's dtype
    (zeros without a source); refuses rows whose keys are not exactly the tree's, or whose
    dims after the first are not the leaf's (a broadcastable row is taken, as ``copy_`` takes
    it)."""
    if source is None:
        return [torch.zeros((count, *leaf.tail), dtype=leaf.dtype) for leaf in leaves]
    values = source._tensordict
    if len(values) != len(leaves) or any(leaf.key not in values for leaf in leaves):
        missing = set(values) ^ {leaf.key for leaf in leaves}
        raise KeyError(
            f"{what}: the rows must have exactly the keys of the TensorDict; these differ: "
            f"{sorted(missing)}"
        )
    out = []
    for leaf in leaves:
        row = source._get_str(leaf.key)
        want = (count, *leaf.tail)
        if row.shape != want:
            try:
                fits = torch.broadcast_shapes(row.shape, want) == want
            except RuntimeError:
                fits = False
            if not fits:
                raise ValueError(
                    f"{what}: key {leaf.key!r}: rows of shape {tuple(row.shape)} do not fit the "
                    f"leaf's rows of shape {leaf.tail}"
                )
            row = row.expand(want)  # a broadcastable row, as copy_ takes it
        if row.dtype != leaf.dtype:
            row = row.to(dtype=leaf.dtype)
        if not (row.is_cpu and row.is_contiguous() and not row.is_conj() and not row.is_neg()):
            row = _source_bytes(row)
        out.append(row)
    return out


MAX_ROWS = 1 << 48  # more rows than any file or memory holds, even of one byte each

# Growths of trees in anonymous memory, one at a time in this process (a directory's growths
# take its lock): threads appending to one tree lost rows, each committing over the others.
_ANONYMOUS_GROWTH = threading.Lock()


def _grow(
    td: TD,
    what: str,
    new_rows: int | None,
    source: TreeNode | None,
    durable: bool,
) -> TD:
    """Commits ``td`` at its current rows + those of ``source``, or at ``new_rows`` (new rows
    zero-filled); see the module's docstring for the steps and their order."""
    # growths of one directory take its lock; of anonymous memory, this process's
    with _ANONYMOUS_GROWTH if td._memmap_prefix is None else contextlib.nullcontext():
        state = _Growth.of(td, what)
        used = [state]  # the states whose leaves hold maps during this growth
        try:
            prefix = state.prefix
            for _attempt in range(MAX_RELOADS):
                leaves = state.leaves
                start = td._batch_size[0]
                stop = start + source._batch_size[0] if source is not None else int(new_rows or 0)
                grows = stop > start
                # (anonymous memory zero-fills its new rows in place; a directory's new zero rows
                # are written by the native call from one small buffer, never made here whole)
                fill = grows and source is not None
                new = _new_rows(what, leaves, source, stop - start) if fill else []
                tracker = td._tracker
                token = None
                if grows:
                    # files never shrink, so reserving needs no lock (another process's growth in
                    # the meantime is seen below, and its rows are never written over)
                    for leaf in leaves:
                        leaf.reserve(stop, start)
                    if tracker is not None:
                        token = tracker.mark_rows(start, stop)
                if prefix is None:
                    for i, leaf in enumerate(leaves):
                        if grows and leaf.row_bytes:
                            target = leaf.rows(start, stop)
                            target.copy_(new[i]) if new else target.zero_()
                    break
                # on disk: one native call takes the directory's lock, checks that it still is
                # this tree (``start`` rows, these leaves, the files these maps show), pwrites
                # the new rows from their memory and commits ``stop``
                held = _native.grow_rows(
                    os.fspath(prefix),
                    start,
                    stop,
                    state.spec,
                    [
                        (
                            leaf.name,
                            start * leaf.row_bytes,
                            src.data_ptr(),
                            src.nbytes,
                            leaf.file_id,
                        )
                        for leaf, src in zip(leaves, new, strict=True)
                        if leaf.row_bytes
                    ]
                    if new
                    else [  # zero rows (``resize_``): a null address writes zeros
                        (
                            leaf.name,
                            start * leaf.row_bytes,
                            0,
                            (stop - start) * leaf.row_bytes,
                            leaf.file_id,
                        )
                        for leaf in leaves
                        if leaf.row_bytes
                    ]
                    if grows
                    else [],
                    durable=durable,
                )
                del new
                if held is None:
                    break
                # another process grew, shrank or saved the directory since: take what it holds now
                # and grow that (its keys must still be the rows' keys)
                refresh: Any = td
                refresh.load_memmap_(prefix)
                state = _Growth(td, what)
                used.append(state)
            else:
                raise RuntimeError(
                    f"{what}: {str(prefix)!r} changed under this growth {MAX_RELOADS} times in a "
                    "row (other processes saving or growing it): nothing was written"
                )
            if tracker is not None and token is not None:
                tracker.confirm(None, stop, token)
            # the commit is done: the tree now shows ``stop`` rows
            entries = td._tensordict
            for leaf in leaves:
                entries[leaf.key] = leaf.leaf(stop)
            td._batch_size = state.batch = torch.Size([stop, *td._batch_size[1:]])
            td._growth = state
            return td
        finally:
            for each in used:
                for leaf in each.leaves:
                    leaf.release()


def _as_rows(td: TreeNode, rows: Any, what: str, unsqueeze: bool) -> TreeNode:
    """``rows`` as a tree of rows with ``td``'s trailing batch dims, on the CPU."""
    tail = td._batch_size[1:]
    inner = getattr(rows, "__dict__", {}).get("_tensordict") if is_tensorclass(rows) else None
    if isinstance(inner, TreeNode):
        rows = inner  # a tensorclass: its TensorDict's rows
    if not isinstance(rows, TreeNode):
        if not isinstance(rows, Mapping):
            raise TypeError(
                f"{what} takes a TensorDict, a tensorclass or a mapping of tensors, "
                f"got {type(rows)}"
            )
        sample = next(iter(rows.values()), None)
        if unsqueeze:
            batch = torch.Size(tail)
        else:
            if not isinstance(sample, torch.Tensor) or sample.ndim == 0:
                raise ValueError(f"{what}: give a TensorDict (its batch size says the rows)")
            batch = torch.Size([sample.shape[0], *tail])
        rows = type(td)(dict(rows), batch)
    if unsqueeze:
        if rows._batch_size != tail:
            raise ValueError(
                f"{what}: a row has batch size {tuple(tail)}, got {tuple(rows._batch_size)}"
            )
        rows = rows.unsqueeze(0)
    elif rows._batch_size[1:] != tail or not rows._batch_size:
        raise ValueError(
            f"{what}: the rows need batch size (k, {', '.join(map(str, tail))}), got "
            f"{tuple(rows._batch_size)}"
        )
    for key, value in rows._tensordict.items():
        if isinstance(value, TreeNode):
            raise _native.UnsupportedFormatError(f"{what}: key {key!r} is a nested TensorDict")
    return rows


def extend_(td: TD, rows: Any, *, durable: bool = False) -> TD:
    """Appends ``rows`` (a TensorDict with batch size ``(k, *td.batch_size[1:])`` and the same
    keys, or a mapping of tensors) after the last row, in place; returns ``td``.

    ``durable`` fsyncs the new rows and the meta.json before returning (a power cut then
    keeps them); without it a killed process still never leaves a torn row.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"obs": torch.zeros(2, 3)}, [2]).memmap("buf")
    >>> td.extend_(TensorDict({"obs": torch.ones(4, 3)}, [4])).batch_size
    torch.Size([6])
    >>> TensorDict.load_memmap("buf")["obs"].sum().item()
    12.0
    """
    return _grow(td, "extend_", None, _as_rows(td, rows, "extend_", False), durable)


def append_(td: TD, row: Any, *, durable: bool = False) -> TD:
    """Appends one row (a TensorDict with batch size ``td.batch_size[1:]``, or a mapping of
    tensors) after the last row, in place; returns ``td``. See ``extend_``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"obs": torch.zeros(0, 3)}, [0]).memmap()
    >>> td.append_({"obs": torch.ones(3)}).batch_size
    torch.Size([1])
    """
    return _grow(td, "append_", None, _as_rows(td, row, "append_", True), durable)


def resize_(td: TD, rows: int, *, durable: bool = False) -> TD:
    """Grows or shrinks ``td`` to ``rows`` rows in place (new rows are zeros); returns ``td``.

    A shrink keeps the files' space (as a reservation for later growth).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"obs": torch.ones(4, 3)}, [4]).memmap("buf2")
    >>> td.resize_(2).batch_size, td.resize_(3)["obs"][2].sum().item()
    (torch.Size([2]), 0.0)
    """
    if int(rows) < 0:
        raise ValueError(f"resize_: a number of rows cannot be negative, got {rows}")
    if int(rows) >= MAX_ROWS:
        raise ValueError(f"resize_: {rows} rows is more than any file or memory can hold")
    return _grow(td, "resize_", int(rows), None, durable)


def _holder(path: Path) -> Path | None:
    """The directory of the saved tree that holds the tree at ``path`` as a nested entry with
    the same rows (its meta.json names ``path`` and has batch dims), else None."""
    parent = path.parent
    try:
        with open(parent / "meta.json", "rb") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or not meta.get("shape"):
        return None
    for key, entry in meta.items():
        if (
            isinstance(entry, dict)
            and "type" in entry
            and "dtype" not in entry
            and _native.encode_key(key) == path.name
        ):
            return parent
    return None


def map_directory(prefix: Path) -> Path:
    """The directory whose dirty map stamps the writes of the tree saved at ``prefix``: that of
    the outermost saved tree holding it (a nested tree loaded from its own directory writes the
    rows of the tree that holds it, as ``td["sub"]`` does), else ``prefix`` itself."""
    path = Path(prefix)
    while True:
        up = _holder(path)
        if up is None and path.name == _native.TENSORCLASS_DIR:
            up = _holder(path.parent)  # a tensorclass's TensorDict: what holds the tensorclass
        if up is None:
            return path
        path = up


def tracker_at(directory: Path) -> Any:
    """The dirty map in ``directory``, or a ``PendingMap`` for it while it has none."""
    tracker = _dirty_map.DirtyMap.open(Path(directory))
    if tracker is None:  # no checkpoint yet: its writes look for the map the first one makes
        return _dirty_map.PendingMap(Path(directory))
    return tracker


def attach(td: TreeNode, prefix: Path) -> None:
    """Attaches the dirty map of the directory ``prefix`` to the saved or loaded ``td`` (a
    ``PendingMap`` while the directory has none): that of the saved tree holding it when it is
    a nested tree's directory (``map_directory``), or its own when only it was checkpointed."""
    top = map_directory(Path(prefix))
    tracker = _dirty_map.DirtyMap.open(top)
    if tracker is None and top != Path(prefix):
        tracker = _dirty_map.DirtyMap.open(Path(prefix))
    if tracker is None:  # no checkpoint yet: its writes look for the map the first one makes
        _dirty_map.PendingMap(top).attach(td)
    else:
        tracker.attach(td)
