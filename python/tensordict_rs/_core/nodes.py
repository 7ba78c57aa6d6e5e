"""The node types of a tree: ``TreeNode`` (the base of TensorDict) and ``NonTensorData``.

A tree holds four kinds of entries: nested trees (``TreeNode``), tensors, lazy leaves
(``memmap._LazyLeaf``: a mapped leaf whose tensor is made on first access) and
``NonTensorData`` (a JSON value). Every module below ``tensordict.py`` works on trees through
``TreeNode``, never through ``TensorDict``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

import torch

from .. import _native

TD = TypeVar("TD", bound="TreeNode")  # a tree, and the same class of tree in the result
Key = str | tuple[str, ...]  # an entry: a str, or a tuple of str for nested entries


class TreeNode:
    """The base of every tree (``TensorDict``): its state, its constructor, and the methods
    that the modules below ``tensordict.py`` call on a tree.

    Those modules take and return ``TreeNode`` (or ``TD``, a TypeVar bound to it), never
    ``TensorDict``, and make new trees with ``type(td)._new_unchecked(batch_size, device)``, so
    that none of them imports ``tensordict.py``. The methods declared below for type checkers
    are implemented by ``TensorDict`` and its mixins; mypy checks each implementation against
    its declaration.
    """

    _tensordict: dict[str, Any]  # the entries: trees, tensors, lazy leaves, NonTensorData
    _batch_size: torch.Size
    _device: torch.device | None
    _is_locked: bool
    _is_memmap: bool
    _is_shared: bool
    _memmap_prefix: Path | None  # the directory (or archive) a memory-mapped tree is saved at
    _lock_parents: list[weakref.ref[TreeNode]]  # the trees that locked this one (see locking)
    _lock_ops: list[bool | None]  # what each lock_/unlock_ changed (for ``with td.lock_():``)
    # the tensorclass whose instances this tree class stores (a tensorclass's ``_TensorDict``
    # subclass, see tensorclass.py), None for every other tree class
    _tensorclass: ClassVar[Any] = None

    def _init(self, batch_size: torch.Size, device: torch.device | None) -> None:
        self._tensordict = {}
        self._batch_size = batch_size
        self._device = device
        self._is_locked = False
        self._is_memmap = False
        self._is_shared = False
        self._memmap_prefix = None
        self._lock_parents = []
        self._lock_ops = []

    @classmethod
    def _new_unchecked(cls, batch_size: torch.Size, device: torch.device | None) -> Self:
        """An empty tree of this class, without the checks of ``__init__``."""
        td = cls.__new__(cls)
        td._init(batch_size, device)
        return td

    if TYPE_CHECKING:
        # tensordict.py: the constructor, shape and device, entries
        def __init__(
            self,
            source: Mapping[Any, Any] | None = None,
            batch_size: Any = None,
            device: Any = None,
            names: Any = None,
            *,
            non_blocking: bool = False,
            lock: bool = False,
            **entries: Any,
        ) -> None: ...
        @property
        def batch_size(self) -> torch.Size: ...
        @batch_size.setter
        def batch_size(self, value: Any) -> None: ...
        @property
        def batch_dims(self) -> int: ...
        @property
        def device(self) -> torch.device | None: ...
        def _get_str(self, key: str) -> Any: ...
        def _leaf_info(
            self, key: str
        ) -> tuple[tuple[int, ...], torch.dtype, torch.device] | None: ...
        def _check_batch(self, key: str, shape: tuple[int, ...] | torch.Size) -> None: ...
        def _set_str(
            self, key: str, value: Any, *, validate: bool = True, non_blocking: bool = False
        ) -> None: ...
        def _sub(self, path: tuple[str, ...], create: bool) -> Self: ...
        def get(self, key: Key, default: Any = ...) -> Any: ...
        def set(
            self, key: Key, value: Any, *, inplace: bool = False, non_blocking: bool = False
        ) -> Self: ...
        def update(
            self,
            input_dict: Mapping[str, Any] | TreeNode,
            *,
            clone: bool = False,
            inplace: bool = False,
        ) -> Self: ...
        def update_(self, input_dict: Mapping[str, Any] | TreeNode) -> Self: ...
        def keys(self, include_nested: bool = False, leaves_only: bool = False) -> list[Key]: ...
        def items(
            self, include_nested: bool = False, leaves_only: bool = False
        ) -> list[tuple[Key, Any]]: ...
        def __getitem__(self, index: Any) -> Any: ...
        def __setitem__(self, index: Any, value: Any) -> None: ...
        def __contains__(self, key: object) -> bool: ...
        def apply(self, fn: Callable[..., Any], *others: Any, **kwargs: Any) -> Self: ...

        # _core/locking.py
        @property
        def is_locked(self) -> bool: ...
        def lock_(self) -> Self: ...
        def unlock_(self) -> Self: ...
        def _lock_tree(self) -> None: ...

        # share/processes.py
        def _mark_shared(self) -> None: ...


class NonTensorData:
    """A non-tensor value stored in a TensorDict (a string, number, list or dict).

    Saved as JSON (never pickled); ``td[key]`` returns the value itself, ``td.get(key)`` this
    wrapper.

    >>> NonTensorData({"step": 3}).data
    {'step': 3}
    """

    __slots__ = ("batch_size", "data", "device")
    _is_tensorclass = True  # tensordict's NonTensorData is a tensorclass (is_tensorclass)
    _is_non_tensor = True

    def __init__(self, data: Any, batch_size: Any = None, device: Any = None) -> None:
        self.data = data
        self.batch_size = torch.Size([] if batch_size is None else batch_size)
        self.device = None if device is None else torch.device(device)

    def __repr__(self) -> str:
        return (
            f"NonTensorData(data={self.data!r}, batch_size={self.batch_size}, device={self.device})"
        )

    def tolist(self) -> Any:
        """The value repeated over the batch dims, as nested lists (as tensordict gives it)."""
        value = self.data
        for size in reversed(self.batch_size):
            value = [value] * size
        return value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NonTensorData) and other.data == self.data

    __hash__ = None  # type: ignore[assignment]


_NUMBER_KEY = _native.NUMBER_KEY  # serde_json (arbitrary_precision): a number's text


def _json_text(value: Any, key: str) -> str:
    def check(v: Any) -> None:
        if v is None or isinstance(v, (str, bool, int)):
            return
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError("non-finite float")
            return
        if isinstance(v, (list, tuple)):
            for item in v:
                check(item)
            return
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            if _NUMBER_KEY in v:  # the Rust JSON parser would read this object as a number
                raise ValueError(f"a dict with the key {_NUMBER_KEY!r}")
            for item in v.values():
                check(item)
            return
        raise TypeError(type(v).__name__)

    try:
        check(value)
    except (TypeError, ValueError) as err:
        raise _native.InvalidTreeError(
            f"key {key!r}: a value of type {type(value).__name__} ({err}) cannot be saved; "
            "only JSON values (str, int, float, bool, None, lists, dicts with str keys) "
            "are stored, never pickles"
        ) from None
    return json.dumps(value, ensure_ascii=False)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pauses the cyclic garbage collector while a tree is converted.

    A 10,000-leaf tree makes tens of thousands of short-lived tuples, which would trigger full
    collections (about 0.2 s each with torch loaded) in the middle of a save or load.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
