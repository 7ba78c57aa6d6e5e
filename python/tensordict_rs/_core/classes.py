"""The base types code checks against, and the registry of tensorclasses.

``TensorDictBase`` and ``TensorCollection`` are abstract bases: ``TensorDict`` is registered with
both, tensorclasses with ``TensorCollection`` (as in tensordict 0.15, a tensorclass is a tensor
collection but not a ``TensorDictBase``). The registry maps the names a directory records for a
class (``_type``: ``str(cls)``, ``_class``: ``module:qualname``) to the classes defined in this
process: loading finds a saved tensorclass there, never by importing a module named in a file.
"""

from __future__ import annotations

import abc
from typing import Any

__all__ = [
    "TensorCollection",
    "TensorDictBase",
    "is_tensor_collection",
    "is_tensorclass",
    "lookup",
    "register",
]


class TensorCollection(abc.ABC):  # noqa: B024 - a marker base: nothing is abstract
    """The common base of TensorDicts and tensorclasses, for ``isinstance`` checks.

    >>> import torch
    >>> from tensordict_rs import TensorDict, TensorCollection
    >>> isinstance(TensorDict({}, []), TensorCollection)
    True
    """


class TensorDictBase(TensorCollection):
    """The base of the TensorDict classes (``TensorDict`` is registered), for ``isinstance``
    checks; a tensorclass is not one (it is a ``TensorCollection``), as in tensordict.

    >>> import torch
    >>> from tensordict_rs import TensorDict, TensorDictBase
    >>> isinstance(TensorDict({}, []), TensorDictBase)
    True
    """


_BY_TYPE: dict[str, type] = {}
_BY_ID: dict[str, type] = {}


def class_id(cls: type) -> str:
    """``module:qualname``, the ``_class`` a meta.json may record."""
    return f"{cls.__module__}:{cls.__qualname__}"


def register(cls: type) -> None:
    """Records a tensorclass under its names (a later class of the same name replaces it, as a
    notebook redefines classes) and registers it with ``TensorCollection``."""
    _BY_TYPE[str(cls)] = cls
    _BY_ID[class_id(cls)] = cls
    TensorCollection.register(cls)


def lookup(type_name: str | None, class_name: str | None) -> type | None:
    """The registered class a meta.json names (``_class`` first, then ``_type``), or None."""
    if class_name is not None and class_name in _BY_ID:
        return _BY_ID[class_name]
    if type_name is not None:
        return _BY_TYPE.get(type_name)
    return None


def public(value: Any) -> Any:
    """A tree entry as users see it: a tensorclass's TensorDict (of its ``_TensorDict``
    subclass) as the tensorclass; anything else as it is."""
    tensorclass = getattr(type(value), "_tensorclass", None)
    return value if tensorclass is None else tensorclass._from_tensordict(value)


def is_tensorclass(obj: Any) -> bool:
    """True for a tensorclass or an instance of one (``NonTensorData`` included).

    >>> from tensordict_rs import TensorDict, is_tensorclass
    >>> is_tensorclass(TensorDict({}, []))
    False
    """
    cls = obj if isinstance(obj, type) else type(obj)
    return bool(getattr(cls, "_is_tensorclass", False))


def is_tensor_collection(obj: Any) -> bool:
    """True for a TensorDict or a tensorclass, given as a class or an instance.

    >>> import torch
    >>> from tensordict_rs import TensorDict, is_tensor_collection
    >>> is_tensor_collection(TensorDict({}, [])), is_tensor_collection(torch.zeros(1))
    (True, False)
    """
    cls = obj if isinstance(obj, type) else type(obj)
    return issubclass(cls, TensorCollection) or bool(getattr(cls, "_is_tensorclass", False))
