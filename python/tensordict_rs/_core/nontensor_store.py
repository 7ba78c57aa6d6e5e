"""The store of a ``NonTensorStack``: the cells its views share (``_Cells``) and the packed
column of strings a loaded stack holds (``StrColumn``).

The cells are a list of Python values, or a ``StrColumn`` that becomes a list on the first
write. They know where else the values are kept: the meta.json of a saved stack (written again
after every write) and the shared memory of a shared one (read again when another process
wrote).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _native
from .nodes import _json_text
from .shared_value import SharedValue


class StrColumn:
    """A packed column of strings: their UTF-8 bytes back to back and ``n + 1`` int64 offsets
    (NumPy arrays, over the buffers a load returns). What a loaded stack of strings holds: no
    Python object per row until a row is read, and the bytes cross to other processes as two
    buffers, not as a million ``str``.

    >>> column = StrColumn.from_strings(["a", "bé", ""])
    >>> len(column), column.tolist(), column.take(np.array([2, 1])).tolist()
    (3, ['a', 'bé', ''], ['', 'bé'])
    """

    __slots__ = ("offsets", "values")

    def __init__(self, values: Any, offsets: Any) -> None:
        self.values = (
            np.frombuffer(values, dtype=np.uint8) if not isinstance(values, np.ndarray) else values
        )
        self.offsets = (
            np.frombuffer(offsets, dtype=np.int64)
            if not isinstance(offsets, np.ndarray)
            else offsets
        )

    @classmethod
    def from_strings(cls, strings: list[str]) -> StrColumn:
        """A column of ``strings``."""
        encoded = [s.encode("utf-8") for s in strings]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return cls(b"".join(encoded), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _addresses(self) -> tuple[int, int, int, int]:
        values = self.values if self.values.size else np.zeros(1, dtype=np.uint8)
        return (
            values.ctypes.data,
            int(self.values.size),
            self.offsets.ctypes.data,
            int(self.offsets.size),
        )

    def get(self, ids: np.ndarray) -> list[Any]:
        """The strings ``ids`` (a flat int64 array), in one native call."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        values, nbytes, offsets, count = self._addresses()
        return _native.decode_strings(  # type: ignore[no-any-return]
            values, nbytes, offsets, count, ids.ctypes.data if ids.size else 0, int(ids.size)
        )

    def tolist(self) -> list[Any]:
        """Every string, in order."""
        return self.get(np.arange(len(self), dtype=np.int64))

    def take(self, ids: np.ndarray) -> StrColumn:
        """A new column of the strings ``ids`` (their bytes gathered)."""
        ids = np.asarray(ids, dtype=np.int64).ravel()
        starts = self.offsets[ids]
        lengths = self.offsets[ids + 1] - starts
        offsets = np.zeros(ids.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        if total == 0:
            return StrColumn(np.zeros(0, dtype=np.uint8), offsets)
        base = np.repeat(starts - offsets[:-1], lengths)
        return StrColumn(self.values[base + np.arange(total)], offsets)

    def json(self, shape: Sequence[int]) -> bytes:
        """The column as the nested JSON arrays of a stack's meta.json."""
        values, nbytes, offsets, count = self._addresses()
        return _native.strings_json(values, nbytes, offsets, count, list(shape))  # type: ignore[no-any-return]

    def __reduce__(self) -> Any:
        return (StrColumn, (self.values.tobytes(), self.offsets.tobytes()))


class _Cells:
    """The values of one or more stacks (views share it): a list, or a packed string column.

    ``saved`` is set for the cells of a stack that is saved in a directory: (a weak reference
    to that stack, the directory that holds it, its key); a write through any view of the cells
    then writes the stack's meta.json again, as tensordict does. ``shared`` is set for the
    cells of a shared stack (``share_memory_``, ``share_non_tensor=True``): a
    ``SharedValue`` holding the JSON list of the cells, which every process holding the tree
    reads and writes (this process's list is refreshed when another process wrote).
    """

    __slots__ = ("memmapped", "saved", "shared", "values")

    def __init__(self, values: Any) -> None:
        self.values = values
        # (the stack, its parent directory, its key), or (the stack, its own directory, None)
        # for a stack saved on its own (``stack.memmap(prefix)``)
        self.saved: tuple[Any, Any, str | None] | None = None
        self.shared: SharedValue | None = None
        self.memmapped = False  # memory-mapped (saved, or ``memmap_()`` without a prefix)

    def written(self) -> None:
        """Writes the saved stack these cells belong to again (if any)."""
        if self.saved is None:
            return
        ref, parent, key = self.saved
        stack = ref()
        if stack is None:
            self.saved = None
            return
        data, shape = stack.json_data("<stack>" if key is None else key)
        device = None if stack.device is None else str(stack.device)
        if key is None:
            _native.write_stack_dir(os.fspath(parent), stack.stack_dim, device, data, shape)
        else:
            _native.rewrite_stack(os.fspath(parent), key, stack.stack_dim, device, data, shape)

    def _fresh(self) -> Any:
        """The values, read again from shared memory when another process wrote them."""
        shared = self.shared
        if shared is not None and shared.changed():
            self.values = shared.get()
        return self.values

    def writable(self) -> list[Any]:
        """The cells as a list (a packed column is decoded once, for every view)."""
        if type(self._fresh()) is not list:
            self.values = self.values.tolist()
        return self.values  # type: ignore[no-any-return]

    def modify(self, change: Any) -> None:
        """Calls ``change(cells)`` on the cells as a list, then writes them where they are kept:
        shared memory (a read-modify-write of the cell, so that writes of other processes to
        other rows are kept) and the saved stack's meta.json. A change that cannot be written
        there (a value that is not JSON, a failed write) leaves the cells as they were, here
        and there."""
        shared = self.shared
        if shared is None and self.saved is None:
            change(self.writable())  # kept in this process only: nothing can refuse it after
            return

        def apply(current: list[Any]) -> bytes:
            before = self.values
            self.values = current
            try:
                change(current)
                text = b""
                if shared is not None:
                    try:
                        text = _shared_text(current)
                    except (TypeError, ValueError):
                        if self.saved is None:
                            raise
                        # not JSON: the directory's write below refuses it, naming the key
                    else:
                        shared.refuse_oversize(text)  # before the directory is written
                if self.saved is not None:
                    # the directory first (it refuses values that are not JSON, naming the
                    # key); under the shared lock no other process writes in between, and
                    # the stack reads ``current`` as it is, not the shared copy being written
                    self.shared = None
                    try:
                        self.written()
                    finally:
                        self.shared = shared
                return text
            except BaseException:
                self.values = before
                raise

        if shared is None:
            apply(list(self.writable()))  # a copy: the cells change once it is written
        else:
            # a saved stack writes its directory inside the change: under the cell's lock,
            # so the directory follows the cells' order; otherwise optimistic (no lock held
            # while Python runs: a process killed meanwhile leaves the cell usable)
            shared.update(apply, exclusive=self.saved is not None)

    def take(self, ids: np.ndarray) -> _Cells:
        """A new store holding the cells ``ids`` (flat), in that order."""
        values = self._fresh()
        if type(values) is list:
            return _Cells([values[i] for i in ids.tolist()])
        return _Cells(values.take(ids))

    def one(self, cell: int) -> Any:
        """The value of one cell (what an element bound to it reads)."""
        values = self._fresh()
        if type(values) is list:
            return values[cell]
        return values.get(np.asarray([cell]))[0]

    def get(self, ids: np.ndarray) -> list[Any]:
        values = self._fresh()
        if type(values) is list:
            return [values[i] for i in ids.tolist()]
        return values.get(ids)  # type: ignore[no-any-return]

    def share(self, key: str) -> bytes:
        """The JSON text of the cells (a new shared cell's first value); JSON values only,
        refused naming ``key``."""
        values = self.writable()
        for value in values:
            _json_text(value, key)
        return _shared_text(values)


def _shared_text(values: list[Any]) -> bytes:
    return json.dumps(values, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _is_arange(ids: np.ndarray, n: int) -> bool:
    return ids.size == n and (n == 0 or (int(ids[0]) == 0 and bool((np.diff(ids) == 1).all())))


class MemberCells:
    """The cells of one member of a stack (``ids``, flat): what a ``NonTensorData`` selected
    out of a ``NonTensorStack`` is bound to (as its ``_cell``, with index 0). It reads the
    first of them and writes a value into all of them, so that writing the member's ``data``
    changes every element of that member in the stack, as tensordict's stacked members do.
    """

    __slots__ = ("cells", "ids")

    def __init__(self, cells: _Cells, ids: np.ndarray) -> None:
        self.cells = cells
        self.ids = ids

    @property
    def memmapped(self) -> bool:
        """Whether the stack's cells are memory-mapped (a member then refuses replacing)."""
        return self.cells.memmapped

    def one(self, _: int) -> Any:
        """The member's value (that of its first cell)."""
        return self.cells.one(int(self.ids[0]))

    def modify(self, change: Any) -> None:
        """``change`` (which writes index 0 of a list) applied to every cell of the member."""
        box: list[Any] = [None]
        change(box)
        value = box[0]

        def write(values: list[Any]) -> None:
            for cell in self.ids.tolist():
                values[cell] = value

        self.cells.modify(write)
