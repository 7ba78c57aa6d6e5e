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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import torch

from .. import _native


class TreeNode:
    """The base of TensorDict: what tree walkers test for, so they need not import it."""

    if TYPE_CHECKING:
        # What the walkers use of a TensorDict (defined there).
        _tensordict: dict[str, Any]
        _batch_size: torch.Size
        _device: torch.device | None
        _is_locked: bool
        _is_memmap: bool
        _memmap_prefix: Path | None

        @property
        def batch_dims(self) -> int: ...
        @property
        def batch_size(self) -> torch.Size: ...
        @property
        def device(self) -> torch.device | None: ...
        @classmethod
        def _new_unchecked(cls, batch_size: torch.Size, device: torch.device | None) -> Self: ...
        def _get_str(self, key: str) -> Any: ...
        def _check_batch(self, key: str, shape: tuple[int, ...] | torch.Size) -> None: ...
        def _lock_tree(self) -> None: ...
        def lock_(self) -> Self: ...
        def __getitem__(self, index: Any) -> Any: ...


class NonTensorData:
    """A non-tensor value stored in a TensorDict (a string, number, list or dict).

    Saved as JSON (never pickled); ``td[key]`` returns the value itself, ``td.get(key)`` this
    wrapper.

    >>> NonTensorData({"step": 3}).data
    {'step': 3}
    """

    __slots__ = ("batch_size", "data", "device")

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


_NUMBER_KEY = "$serde_json::private::Number"  # serde_json (arbitrary_precision): a number's text


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
