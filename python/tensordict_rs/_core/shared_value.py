"""Non-tensor values shared between processes: what ``share_memory_()`` and
``memmap_(..., share_non_tensor=True)`` do to a tree's ``NonTensorData`` and ``NonTensorStack``
entries, as tensordict does.

Each value (a ``NonTensorData``'s value, or all the values of a stack) is kept as its JSON in a
cell of anonymous shared memory (``rust/sys/seqcell.rs``: a sequence lock and the bytes). Every
process that receives the tree maps the same cell (it crosses as a file descriptor with the
tree's other arenas), so a value written in one process is read in the others. A read costs one
atomic load when nothing changed (the decoded value is cached per version); a write stores the
new JSON under the cell's lock. The cell's capacity is fixed when it is made (four times the
first value, at least 64 KiB, in memory touched only when written): a longer value is refused
with an error naming the key, the old one kept. Values must be JSON, as everywhere in this
library (tensordict keeps shared ints, floats and strings in ``multiprocessing`` values and
lists and dicts in a manager process, and truncates a string longer than its buffer).
"""

from __future__ import annotations

import json
from typing import Any

from .. import _native

_HEADER = _native.shared_value_header()
_MIN_CAPACITY = 64 * 1024
_IMMUTABLE = (str, int, float, bool, type(None))


class SharedValue:
    """A JSON value in shared memory, read and written by every process holding its buffer.

    >>> cell = SharedValue.create(b'"a"')
    >>> cell.get()
    'a'
    >>> cell.set_text(b'[1, 2]'); cell.get()
    [1, 2]
    """

    __slots__ = ("_decoded", "_text", "_version", "buffer")

    def __init__(self, buffer: _native.Buffer) -> None:
        self.buffer = buffer
        self._version = -1
        self._text = b"null"
        self._decoded: Any = None

    @classmethod
    def create(cls, text: bytes) -> SharedValue:
        """A new cell holding the JSON ``text``."""
        return cls.create_many([text])[0]

    @classmethod
    def create_many(cls, texts: list[bytes]) -> list[SharedValue]:
        """New cells holding the JSON ``texts``, in one arena of shared memory (one file
        descriptor when the tree crosses to another process)."""
        sizes = [_HEADER + _round8(max(_MIN_CAPACITY, 4 * len(text))) for text in texts]
        buffers = _native.anonymous_buffers([(0, size) for size in sizes])
        cells = [cls(buffer) for buffer in buffers]
        for cell, text in zip(cells, texts, strict=True):
            cell.set_text(text)
        return cells

    @property
    def capacity(self) -> int:
        """The most bytes of JSON the cell holds."""
        return len(self.buffer) - _HEADER

    def text(self) -> bytes:
        """The JSON now in the cell."""
        return _native.shared_value_read(self.buffer)[1]

    def changed(self) -> bool:
        """True when another write happened since this process last read the value."""
        return _native.shared_value_version(self.buffer) != self._version

    def get(self) -> Any:
        """The value now in the cell (a list or dict is a new copy each time, as a value read
        from tensordict's shared manager is)."""
        if _native.shared_value_version(self.buffer) != self._version:
            version, text = _native.shared_value_read(self.buffer)
            self._remember(version, text)
        if isinstance(self._decoded, _IMMUTABLE):
            return self._decoded
        return json.loads(self._text)

    def _remember(self, version: int, text: bytes) -> None:
        self._decoded = json.loads(text)
        self._text = text
        self._version = version

    def refuse_oversize(self, text: bytes) -> None:
        """Raises the ValueError a store of ``text`` would (it exceeds the capacity): for a
        write that has effects elsewhere first (a saved tree's meta.json), checked before
        them, so that a refused value reaches neither."""
        if len(text) > self.capacity:
            raise ValueError(
                f"the new value takes {len(text)} bytes; this shared value holds at most "
                f"{self.capacity}"
            )

    def set_text(self, text: bytes) -> None:
        """Stores the JSON ``text`` (ValueError when it exceeds the capacity: the cell is
        unchanged)."""
        self._remember(_native.shared_value_write(self.buffer, text), text)

    def update(self, change: Any, *, exclusive: bool = False) -> None:
        """Read-modify-write: ``change(value)`` returns the new value's JSON text (or None to
        leave it); no write of another process is lost.

        Optimistic by default: the value is read, changed here, and stored only if no other
        write came in between (else read and changed again), so the lock is held only inside
        the store, and a process killed while ``change`` runs (a terminated worker, an
        abandoned ``map_iter``) leaves the cell as it was and usable. ``change`` may then run
        more than once. ``exclusive=True`` holds the cell's lock around ``change`` (once, no
        other write in between): for a change with effects of its own that must follow the
        cells' order (a saved stack's directory write)."""
        if exclusive:
            before, text = _native.shared_value_lock(self.buffer)
            new: bytes | None = None
            try:
                new = change(json.loads(text))
            finally:
                version = _native.shared_value_unlock(self.buffer, before, new)
            if new is not None:
                self._remember(version, new)
            return
        while True:
            version, text = _native.shared_value_read(self.buffer)
            new = change(json.loads(text))
            if new is None:
                return
            stored = _native.shared_value_write_if(self.buffer, version, new)
            if stored is not None:
                self._remember(stored, new)
                return

    def __reduce__(self) -> Any:
        raise TypeError(
            "a shared non-tensor value crosses to other processes with its TensorDict "
            "(multiprocessing, DataLoader workers), not on its own"
        )


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


def unshared(value: Any) -> Any:
    """The value a shared cell holds now (``value`` itself when it is not a cell): tensordict's
    ``tensorclass._from_shared_nontensor`` of ``entry._non_tensordict["data"]``.

    >>> cell = SharedValue.create(b'"a"')
    >>> unshared(cell), unshared(3)
    ('a', 3)
    """
    return value.get() if isinstance(value, SharedValue) else value
