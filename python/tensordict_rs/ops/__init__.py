"""TensorDict methods grouped by concern, each a set of functions over trees: shape, keys,
element-wise, apply, batch indexing and the batched gather, torch functions, devices and the
streaming device path.

Owns: what maps a tree to a new tree (or writes into one) in memory. Uses: ``_core``,
``memmap`` and ``_native``. ``TensorDict`` exposes the functions as methods (one line each);
none of these modules imports ``tensordict.py``: they take ``TreeNode`` (or ``TD``) and make
new trees with ``type(td)._new_unchecked``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def as_classmethod(fn: Callable[..., Any]) -> classmethod[Any, ..., Any]:
    """``classmethod(fn)`` for a function over trees ``fn(cls, ...)`` set on a mixin (mypy
    cannot infer a classmethod of a generic function; called on a class, it returns a tree of
    that class)."""
    return classmethod(fn)
