"""Which rows of a saved tree were written: the hooks the write paths call (issue 24).

A memory-mapped tree saved in a directory carries the directory's dirty map (``io/dirty.py``:
created by the first ``checkpoint``; until then a ``PendingMap`` that looks for it) as
``_tracker`` on its root and nested trees, attached by every save, load and unpickling. Every write through the library's methods (``td[i] = ...``, ``set_at_``/``update_at_``,
``copy_``, ``extend_``, in-place arithmetic, ``torch.stack/cat(out=)``, ``apply_``) calls
``mark`` with the batch index before writing and ``confirm`` after, so that a checkpoint
copies only the rows written since the last one. Writes that bypass these methods (through a
leaf tensor, or a view made by indexing the tree) are not seen: ``checkpoint(verify=True)``
finds them by content.
"""

from __future__ import annotations

from typing import Any

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
