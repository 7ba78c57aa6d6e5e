"""Errors raised by the Python layers where tensordict raises a built-in type: each is also a
``TensorDictError`` (the library's one hierarchy) and of the built-in types tensordict's is."""

from __future__ import annotations

from .. import _native


class InplaceWriteError(_native.TensorDictError, ValueError, RuntimeError):
    """An in-place write (``set_``, ``set(..., inplace=True)``) that failed, naming the key
    and both shapes: a ``ValueError`` and a ``RuntimeError``, as tensordict's."""


class ZeroBatchDimsIndexError(_native.TensorDictError, RuntimeError, IndexError):
    """Indexing a TensorDict without batch dims by something that consumes a dim: a
    ``RuntimeError``, as tensordict raises, and an ``IndexError``, as before."""
