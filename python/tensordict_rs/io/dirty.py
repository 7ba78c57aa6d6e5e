"""The dirty map of a saved tree: which blocks of rows were written since which checkpoint.

The map is the file ``.tdrs%dirty`` inside the tree's directory, an int64 array mapped shared
by every process that loads the tree, so a write in any of them is seen by a checkpoint in
another. Header: ``MAGIC``, the current epoch, a random token naming the map, the rows per
block; then one entry per block of rows: the epoch of the last write into it. Blocks hold at
least 4 KiB of row data (one page: what the page cache writes anyway), so the map costs at
most 1/512 of the tree.

A write stamps its blocks with the current epoch before writing and, after, again if the epoch
moved meanwhile (``confirm``); a checkpoint moves the epoch forward before copying and then
copies the blocks stamped at or after the epoch its target generation was last brought up to
date at. A write that finished before the epoch moved is therefore in the copy, and one that
overlapped it is stamped with the new epoch and copied by the next checkpoint.

Tensordict ignores files its meta.json does not name, so the map never disturbs it.

A tree saved or loaded before its directory has a map carries a ``PendingMap`` instead: it
looks for the file after every write and takes it up once the first checkpoint made it. So a
process that loaded the tree (or was forked with it, or got it pickled) before the first
checkpoint still stamps its writes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .. import _native
from .._core.dirty import attach as _attach
from .._core.nodes import TreeNode
from ..memmap import MemoryMappedTensor

DIRTY_FILE = ".tdrs%dirty"
MAGIC = 0x7464727364697274  # "tdrsdirt"
HEADER = 4  # MAGIC, epoch, token, rows per block
BLOCK_BYTES = 4096


def block_rows(row_bytes: int) -> int:
    """Rows per block for rows of ``row_bytes`` bytes (all leaves together)."""
    return max(1, BLOCK_BYTES // max(1, row_bytes))


class DirtyMap:
    """The mapped dirty map of one saved tree (see the module's docstring)."""

    def __init__(self, path: Path, table: torch.Tensor) -> None:
        self.path = path
        self.table = table  # int64, HEADER + one entry per block
        self.rows = int(table[3])
        self.token = int(table[2])

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, prefix: Path, *, create_rows: int | None = None) -> DirtyMap | None:
        """The map of the tree at ``prefix``; None when it has none (and ``create_rows`` is
        None: otherwise one is created, for rows of ``create_rows`` bytes)."""
        path = prefix / DIRTY_FILE
        if not os.path.lexists(path):
            if create_rows is None:
                return None
            # os.urandom, not the secrets module: a process that dropped root after importing
            # torch may be unable to read the standard library (the ownership tests run so)
            token = int.from_bytes(os.urandom(8), "little") >> 2
            header = torch.tensor(
                [MAGIC, 1, token, block_rows(create_rows)] + [0] * 60,
                dtype=torch.int64,
            )
            try:
                _native.write_file(
                    os.fspath(path), header.data_ptr(), header.nbytes, existsok=False
                )
            except FileExistsError:
                pass  # another process made it: use that one
        size = os.path.getsize(path)
        if size < HEADER * 8:
            raise _native.InvalidDirectoryError(f"{path}: a dirty map too short to hold its header")
        table = MemoryMappedTensor.from_filename(path, torch.int64, (size // 8,))
        if int(table[0]) != MAGIC:
            raise _native.InvalidDirectoryError(f"{path}: not a dirty map of tensordict_rs")
        return cls(path, table.as_subclass(torch.Tensor))

    def attach(self, td: TreeNode) -> None:
        """Makes ``td`` and its nested trees report their writes here."""
        _attach(self, td)

    def reserve(self, rows: int) -> None:
        """Makes room for ``rows`` rows (the map file grows, as the tree does, by half)."""
        need = HEADER + -(-rows // self.rows)
        if need <= self.table.numel():
            return
        size = _native.reserve_file(
            os.fspath(self.path), max(need, self.table.numel() * 3 // 2) * 8
        )
        table = MemoryMappedTensor.from_filename(self.path, torch.int64, (size // 8,))
        self.table = table.as_subclass(torch.Tensor)

    # ------------------------------------------------------------------ writes

    @property
    def epoch(self) -> int:
        """The epoch writes are stamped with now."""
        return int(self.table[1])

    def _blocks(self, index: Any, n: int) -> Any:
        """The blocks rows ``index`` of ``n`` fall in: a slice of the block entries, or a
        tensor of block numbers."""
        if isinstance(index, tuple):
            index = index[0] if index else slice(None)
        br = self.rows
        if isinstance(index, bool) or index is None or index is Ellipsis:
            return slice(0, -(-n // br))
        if isinstance(index, int):
            row = index + n if index < 0 else index
            return slice(row // br, row // br + 1)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                return slice(start // br, -(-stop // br)) if stop > start else slice(0, 0)
            index = torch.arange(start, stop, step)
        try:
            rows = torch.as_tensor(index)
        except (TypeError, ValueError, RuntimeError):
            return slice(0, -(-n // br))  # anything else: all rows
        if rows.dtype == torch.bool:
            rows = (
                rows.reshape(rows.shape[0], -1).any(1).nonzero().flatten()
                if rows.ndim
                else (torch.arange(n) if bool(rows) else torch.empty(0, dtype=torch.int64))
            )
        rows = rows.to(torch.int64).flatten()
        rows = torch.where(rows < 0, rows + n, rows)
        return rows // br

    def _stamp(self, blocks: Any, epoch: int) -> None:
        if isinstance(blocks, slice):
            self.table[HEADER + blocks.start : HEADER + blocks.stop] = epoch
        elif blocks.numel():
            self.table[HEADER + blocks] = epoch

    def mark(self, index: Any, n: int) -> tuple[Any, int]:
        """Stamps the blocks of rows ``index`` (of ``n``) before they are written."""
        if n > (self.table.numel() - HEADER) * self.rows:
            self.reserve(n)
        blocks = self._blocks(index, n)
        epoch = self.epoch
        self._stamp(blocks, epoch)
        return blocks, epoch

    def mark_rows(self, start: int, stop: int) -> tuple[Any, int]:
        """Stamps rows ``start:stop`` (new rows of a growth)."""
        self.reserve(stop)
        return self.mark(slice(start, stop), stop)

    def confirm(self, index: Any, n: int, token: tuple[Any, int]) -> None:
        """Stamps the blocks again if a checkpoint moved the epoch during the write."""
        blocks, epoch = token
        now = self.epoch
        if now != epoch:
            self._stamp(blocks, now)

    # ------------------------------------------------------------------ checkpoints

    def advance(self) -> int:
        """Moves the epoch forward (a checkpoint starts); returns the new epoch: every block
        written after this call is stamped with it or later."""
        epoch = self.epoch + 1
        self.table[1] = epoch
        return epoch

    def dirty_rows(self, since: int, n: int) -> list[tuple[int, int]]:
        """Runs ``(start, stop)`` of the rows (of ``n``) in blocks stamped at or after
        ``since``."""
        nblocks = -(-n // self.rows)
        have = min(nblocks, self.table.numel() - HEADER)
        stamps = self.table[HEADER : HEADER + have]
        hot = (stamps >= since).to(torch.int8)
        if have < nblocks:  # rows past the map: never stamped, so new: copy them
            hot = torch.cat([hot, torch.ones(nblocks - have, dtype=torch.int8)])
        if not bool(hot.any()):
            return []
        edges = torch.diff(
            hot, prepend=torch.zeros(1, dtype=torch.int8), append=torch.zeros(1, dtype=torch.int8)
        )
        starts = (edges == 1).nonzero().flatten().tolist()
        stops = (edges == -1).nonzero().flatten().tolist()
        br = self.rows
        return [(a * br, min(b * br, n)) for a, b in zip(starts, stops, strict=True)]


class _Untracked:
    """``mark``'s token while there is no map: the rows announced, for ``confirm``."""

    __slots__ = ("index",)

    def __init__(self, index: Any) -> None:
        self.index = index


class PendingMap:
    """Stands in for the dirty map of a tree whose directory has none yet (see the module's
    docstring). A write looks for the file after it is done (``confirm``: one ``access``
    call), and stamps its rows when the file is there: a write that finished before that look
    finished before the map existed, so before the first checkpoint's copy began, which
    holds it. The first look that finds the file opens it, and later writes go through it."""

    def __init__(self, prefix: Path) -> None:
        self.path = os.fspath(prefix / DIRTY_FILE)
        self.real: DirtyMap | None = None

    def attach(self, td: TreeNode) -> None:
        """Makes ``td`` and its nested trees report their writes here."""
        _attach(self, td)

    def resolve(self) -> DirtyMap | None:
        """The map, once a checkpoint made it, else None."""
        real = self.real
        if real is None:
            if not os.access(self.path, os.F_OK, follow_symlinks=False):
                return None
            real = self.real = DirtyMap.open(Path(self.path).parent)
        return real

    def mark(self, index: Any, n: int) -> Any:
        real = self.real
        return _Untracked(index) if real is None else real.mark(index, n)

    def mark_rows(self, start: int, stop: int) -> Any:
        real = self.real
        return _Untracked(slice(start, stop)) if real is None else real.mark_rows(start, stop)

    def confirm(self, index: Any, n: int, token: Any) -> None:
        if type(token) is _Untracked:
            real = self.resolve()
            if real is not None:  # made while this write ran: its rows are stamped now
                real.mark(token.index, n)
        else:
            real = self.real
            assert real is not None
            real.confirm(index, n, token)
