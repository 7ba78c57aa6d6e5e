"""Which rows of a saved tree were written: the hooks the write paths call (issue 24).

A memory-mapped tree saved in a directory carries the directory's dirty map (``io/dirty.py``:
created by the first ``checkpoint``; until then a ``PendingMap`` that looks for it) as
``_tracker`` on its root and nested trees, attached by every save, load and unpickling.
Every write through the library's methods (``td[i] = ...``, ``set_at_``/``update_at_``,
``copy_``, ``extend_``, in-place arithmetic, ``torch.stack/cat(out=)``, ``apply_``, the
``out=`` of ``apply``, ``where``, ``index_select`` and reductions) calls
``mark`` with the batch index before writing and ``confirm`` after, so that a checkpoint
copies only the rows written since the last one. Writes that bypass these methods (through a
leaf tensor) are not seen: ``checkpoint(verify=True)`` finds them by content.

A tree that views a tracked one (``select``, ``exclude``, ``td[3:9]``, ``unbind``, ``split``,
``detach``, a reshape: any result sharing its leaves' memory) reports its writes to the same
map (``view_of``): with the same rows through the same tracker, otherwise through ``RowsOf``,
which stamps the rows of the tracked tree the view covers (all of them when a shape operation
mixed them).
"""

from __future__ import annotations

from typing import Any

import torch

from .nodes import TreeNode

ALL: Any = slice(None)  # every row


def mark(td: TreeNode, index: Any = ALL) -> Any:
    """Records that rows ``index`` (a batch index of ``td``) are about to be written; returns
    the token ``confirm`` needs (None when ``td`` is not tracked)."""
    tracker = td._tracker
    if tracker is None:
        return None
    return tracker.mark(index, td._batch_size[0] if td._batch_size else 0)


def confirm(td: TreeNode, index: Any, token: Any) -> None:
    """After the write that ``mark`` announced: marks the rows again if a checkpoint started
    in between (so the next one copies them)."""
    if token is not None:
        tracker = td._tracker
        if tracker is not None:
            tracker.confirm(index, td._batch_size[0] if td._batch_size else 0, token)


class RowsOf:
    """The tracker of a view of a tracked tree whose rows are not the tree's: a write through
    it stamps ``rows`` (a slice, or ``ALL``) of the tree it views, which had ``n`` rows."""

    __slots__ = ("base", "n", "rows")

    def __init__(self, base: Any, rows: Any, n: int) -> None:
        self.base, self.rows, self.n = base, rows, n

    def mark(self, index: Any, n: int) -> Any:
        return self.base.mark(self.rows, self.n)

    def mark_rows(self, start: int, stop: int) -> Any:
        return self.base.mark(self.rows, self.n)

    def confirm(self, index: Any, n: int, token: Any) -> None:
        self.base.confirm(self.rows, self.n, token)


def attach(tracker: Any, td: TreeNode) -> None:
    """Makes ``td`` and its nested trees report their writes to ``tracker``."""
    td._tracker = tracker
    for value in td._tensordict.values():
        if isinstance(value, TreeNode):
            attach(tracker, value)


def view_of(base: TreeNode, view: TreeNode, rows: Any = None) -> None:
    """Makes writes through ``view``, a tree sharing the memory of ``base``'s leaves, stamp
    ``base``'s rows: ``rows`` None means the same rows (the same tracker), a slice or ``ALL``
    the rows of ``base`` it covers. Nothing when ``base`` is not tracked."""
    tracker = base._tracker
    if tracker is None or view is base or view._tracker is not None:
        return
    if rows is not None:
        tracker = RowsOf(tracker, rows, base._batch_size[0] if base._batch_size else 0)
    attach(tracker, view)


def shares_memory(base: TreeNode, view: TreeNode) -> bool:
    """Whether the first tensor leaf of ``view`` lies in the memory of ``base``'s leaf at the
    same key (so that ``view`` is a view of ``base``: every leaf went through the same
    operation)."""
    for key, value in base._tensordict.items():
        other = view._tensordict.get(key)
        if isinstance(value, TreeNode):
            if isinstance(other, TreeNode) and shares_memory(value, other):
                return True
        elif isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor):
            strided = value.layout == other.layout == torch.strided
            if not strided or value.is_nested or other.is_nested:
                continue  # no storage of its own to compare (a nested leaf): the next one
            mine = value.untyped_storage()
            start = mine.data_ptr()
            return start <= other.untyped_storage().data_ptr() < start + max(1, mine.nbytes())
    return False
