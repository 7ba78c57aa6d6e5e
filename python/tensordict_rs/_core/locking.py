"""Locking: a locked TensorDict keeps its keys; values can still be written in place."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any, Self

from .._native import LockedError
from .nodes import TreeNode

LOCK_ERROR = (
    "Cannot modify locked TensorDict. For in-place modification, consider using the `set_()` "
    "method and make sure the key is present."
)


READ_ONLY_ERROR = (
    "This TensorDict views a read-only buffer (received through pickle protocol 5 from a "
    "buffer lent read-only, as ray.get lends the object store's shared memory: every reader "
    "on the node sees the same bytes), so its values cannot be written. For a writable tree, "
    "take a copy: `td = td.clone()` (one copy of the whole buffer)."
)


def locked_error() -> LockedError:
    """The error of a key change on a locked TensorDict (a RuntimeError, as in tensordict)."""
    return LockedError(LOCK_ERROR)


def refuse_read_only(td: TreeNode) -> None:
    """Raises ``LockedError`` (a RuntimeError) before a write into a read-only tree's values,
    saying how to get a writable one."""
    if td._read_only:
        raise LockedError(READ_ONLY_ERROR)


def mark_read_only(td: TreeNode) -> None:
    """Marks ``td`` and every nested tree read-only (see ``refuse_read_only``)."""
    td._read_only = True
    for value in td._tensordict.values():
        if isinstance(value, TreeNode):
            mark_read_only(value)


class Lockable(TreeNode):
    """``lock_``/``unlock_``/``is_locked`` for TensorDict, with tensordict's nested-lock rules."""

    @property
    def is_locked(self) -> bool:
        """True when keys cannot be added, removed or replaced (values can still be written).

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3])
        >>> td.is_locked, td.lock_().is_locked
        (False, True)
        """
        return self._is_locked

    @is_locked.setter
    def is_locked(self, value: bool) -> None:
        if value:
            self.lock_()
        else:
            self.unlock_()

    def _children(self) -> Iterator[Lockable]:
        for value in self._tensordict.values():
            if isinstance(value, Lockable):
                yield value

    def lock_(self) -> Self:
        """Locks this TensorDict and every nested one; returns self (also a context manager).

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3])
        >>> try:
        ...     td.lock_()["new"] = torch.zeros(3)
        ... except RuntimeError as err:
        ...     type(err).__name__
        'LockedError'
        """
        changed = not self._is_locked
        self._lock_tree()
        self._lock_ops.append(True if changed else None)
        return self

    def _lock_tree(self) -> None:
        self._is_locked = True
        for child in self._children():
            if not any(ref() is self for ref in child._lock_parents):
                child._lock_parents.append(weakref.ref(self))
            child._lock_tree()

    def unlock_(self) -> Self:
        """Unlocks this TensorDict and its nested ones; also ends ``is_memmap()``, as in tensordict.

        A nested TensorDict cannot be unlocked while a locked TensorDict holds it.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3])
        >>> td.lock_().unlock_().is_locked
        False
        """
        for ref in self._lock_parents:
            parent = ref()
            if (
                parent is not None
                and parent._is_locked
                and any(c is self for c in parent._tensordict.values())
            ):
                raise RuntimeError(
                    "Cannot unlock a tensordict that is part of a locked graph. "
                    "Unlock the root tensordict first."
                )
        changed = self._is_locked
        self._unlock_tree()
        self._lock_ops.append(False if changed else None)
        return self

    def _unlock_tree(self) -> None:
        self._is_locked = False
        self._is_memmap = False
        self._is_shared = False
        for child in self._children():
            child._lock_parents = [
                r for r in child._lock_parents if r() is not None and r() is not self
            ]
            if not any(p._is_locked for r in child._lock_parents if (p := r()) is not None):
                child._unlock_tree()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock_ops:
            op = self._lock_ops.pop()
            if type(op) is WriteBack:  # a shape operation used as a context
                if exc[0] is None:  # an error in the block writes nothing back, as there
                    op.write(self)
            elif callable(op):  # the undo of an operation used as a context (to_module)
                op()
            elif op is True:
                self._unlock_tree()
            elif op is False:
                self._lock_tree()


class WriteBack:
    """What ``with td.view(-1) as v:`` (and the other shape operations used as a context)
    does on exit, as tensordict: ``v``'s entries, new ones too, written back into ``td``
    through the inverse operation (in place when ``td`` is locked). It holds ``td`` weakly and
    is given ``v`` at exit, so that a result never used as a context makes no reference cycle.
    """

    __slots__ = ("inverse", "source")

    def __init__(self, source: TreeNode, inverse: Callable[[Any], Any]) -> None:
        self.source = weakref.ref(source)
        self.inverse = inverse

    @staticmethod
    def record(result: Any, source: TreeNode, inverse: Callable[[Any], Any]) -> Any:
        """``result`` (of an operation on ``source``) with its write-back recorded."""
        if result is not source and isinstance(result, TreeNode):
            result._lock_ops.append(WriteBack(source, inverse))
        return result

    def write(self, result: Any) -> None:
        source = self.source()
        if source is None:
            return
        back = self.inverse(result)
        if source._is_locked:
            source.update_(back)
        else:
            source.update(back, inplace=False)
