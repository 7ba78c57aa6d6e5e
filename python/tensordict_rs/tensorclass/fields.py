"""Fields of a tensorclass: ``_Field`` (the descriptor of one field: reads the TensorDict
entry, writes through the class's conversion rules) and ``_set_field``, the one conversion path
of construction, attribute assignment and ``set`` (autocast, nocast, tensor_only, nested
tensorclasses and mappings, non-tensor values).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .._core.nodes import NTD_TYPES, NonTensorData
from .._core.nontensor import NonTensorStack
from ..memmap import _LazyLeaf
from ..ops.keys import leaf_value
from ..tensordict import TensorDict

_MISSING: Any = object()


class _Field:
    """A field: reads the TensorDict entry (None when missing), writes through the class's
    conversion rules."""

    __slots__ = ("_name", "_owner")

    def __init__(self, name: str, owner: type) -> None:
        self._name = name
        self._owner = owner

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            if objtype is self._owner:
                return self
            raise AttributeError(
                f"type object {objtype.__name__!r} has no attribute {self._name!r}"
            )
        td = obj.__dict__["_tensordict"]
        value = td._tensordict.get(self._name, _MISSING)
        if value is _MISSING:
            return obj.__dict__["_non_tensordict"].get(self._name)
        kind = type(value)
        if kind is _LazyLeaf:
            return td._get_str(self._name)
        if kind in NTD_TYPES:
            return value.data
        if kind is NonTensorStack:  # its values, as td[key] gives them (writes reach it)
            return value.tolist(as_linked_list=True)
        tc = getattr(kind, "_tensorclass", None)
        if tc is not None:
            return tc._from_tensordict(value)
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        cls = type(obj)
        if cls._frozen and obj.__dict__.get("_initialized", True):
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {self._name!r}")
        _set_field(obj, self._name, value)


def _type_hints(cls: type) -> dict[str, Any]:
    hints = cls.__dict__.get("_tc_hints")
    if hints is None:
        try:
            # not the class namespace (the forwarded float(), int()...), but the class itself
            # (a field annotated with its own class, as a string)
            hints = typing.get_type_hints(cls, localns={cls.__name__: cls})
        except Exception:
            hints = {}
        cls._tc_hints = hints  # type: ignore[attr-defined]
    return hints


def _is_tensorclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and getattr(tp, "_is_tensorclass", False)


def _set_field(obj: Any, key: str, value: Any, *, inplace: bool = False) -> None:
    """The one conversion path of construction, attribute assignment and ``set``."""
    cls = type(obj)
    td: TensorDict = obj.__dict__["_tensordict"]
    if value is None:
        if key in td._tensordict:
            if td.is_locked:
                td._set_str(key, None)  # raises the lock error
            del td._tensordict[key]
        obj.__dict__["_non_tensordict"].pop(key, None)
        return
    if value is obj:
        raise ValueError(f"cannot set the field {key!r} of a tensorclass to the tensorclass itself")
    hint = _type_hints(cls).get(key, Any) if (cls._autocast or cls._tensor_only) else Any
    if cls._tensor_only and not isinstance(value, (torch.Tensor, TensorDict)):
        if getattr(type(value), "_is_tensorclass", False):
            value = value._as_node()
        elif isinstance(value, Mapping) and _is_tensorclass_type(hint):
            value = (
                typing.cast(Any, hint).from_dict(dict(value), batch_size=td.batch_size)._as_node()
            )
        elif isinstance(value, Mapping):
            value = TensorDict(dict(value), td.batch_size)
        else:
            value = torch.as_tensor(value)  # tensor_only: anything else is cast to a tensor
    elif type(value) is NonTensorStack:
        pass  # one value per row, as tensordict keeps it (not wrapped in a NonTensorData)
    elif getattr(type(value), "_is_tensorclass", False) and type(value) not in NTD_TYPES:
        value = value._as_node()
    elif isinstance(value, dict) and _is_tensorclass_type(hint):
        value = typing.cast(Any, hint).from_dict(value, batch_size=td.batch_size)._as_node()
    elif cls._autocast and hint is not Any and not isinstance(value, TensorDict):
        value = _cast(value, hint, td.batch_size)
    elif isinstance(value, (torch.Tensor, TensorDict)):
        pass
    elif not cls._nocast and isinstance(value, (bool, int, float, np.ndarray, np.number)):
        if td.batch_dims and not isinstance(value, np.ndarray) and _scalar_hint(cls, key):
            value = NonTensorData(value)
        else:
            value = torch.as_tensor(value)
    elif not cls._nocast and type(value) is list and value:
        value = leaf_value(value)  # as a TensorDict takes it: a tensor or a stack of rows
    elif type(value) not in NTD_TYPES:  # a NonTensorData (or MetaData) is kept as it is
        value = NonTensorData(value)
    td.set(key, value, inplace=inplace)


def _scalar_hint(cls: type, key: str) -> bool:
    hint = _type_hints(cls).get(key)
    return hint in (int, float, bool)


def _cast(value: Any, hint: Any, batch_size: torch.Size) -> Any:
    """autocast: the value converted to its field's annotation (a mapping to a TensorDict for
    a TensorDict annotation, anything to an array for ``np.ndarray``; unions are left as they
    are, as in tensordict)."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType or hint is Any:
        return value if isinstance(value, torch.Tensor) else NonTensorData(value)
    if isinstance(hint, type) and issubclass(hint, torch.Tensor):
        return torch.as_tensor(value)
    if (
        isinstance(hint, type)
        and issubclass(hint, TensorDict)
        and isinstance(value, Mapping)
        and not isinstance(value, TensorDict)  # a TensorDict is kept as it is
    ):
        return TensorDict(dict(value), batch_size)
    if isinstance(hint, type) and issubclass(hint, np.ndarray):
        return NonTensorData(np.asarray(value))
    if isinstance(hint, type) and hint in (int, float, bool, str):
        if isinstance(value, torch.Tensor):
            value = value.item()
        return NonTensorData(hint(value))
    return value if isinstance(value, torch.Tensor) else NonTensorData(value)
