"""Forwarding: every public member of TensorDict on a tensorclass, called on its TensorDict
(methods, properties, classmethods), with a TensorDict result given back as the tensorclass
(``_wrap``) and tensorclass arguments passed as their TensorDicts (``_unwrap``). Made once, from
TensorDict itself (``_forwarded``): a method added to TensorDict is forwarded without a table.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ..tensordict import TensorDict, _classmethod

# Members of TensorDict that a tensorclass defines itself or must not take.
_OWN = frozenset(
    {
        "__init__",
        "__new__",
        "__getattr__",
        "__getattribute__",
        "__setattr__",
        "__delattr__",
        "__getitem__",
        "__getitems__",
        "__setitem__",
        "__delitem__",
        "__repr__",
        "__str__",
        "__getstate__",
        "__setstate__",
        "__reduce__",
        "__reduce_ex__",
        "__class__",
        "__dict__",
        "__doc__",
        "__module__",
        "__weakref__",
        "__init_subclass__",
        "__subclasshook__",
        "__sizeof__",
        "__format__",
        "__dir__",
        "__hash__",
        "__annotations__",
        "__torch_function__",
        "__iter__",
        "__len__",
        "__contains__",
        "__bool__",
        "__eq__",
        "__ne__",
        "get",
        "set",
        "select",
        "to_tensordict",
        "to_dict",
        "update",
        "update_",
        "empty",
        "memmap",
        "memmap_",
        "memmap_like",
        "save",
        "dumps",
    }
)

_SELF_OPS = ("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__", "__iand__")


def _unwrap(value: Any) -> Any:
    """A tensorclass as its TensorDict (lists and tuples element-wise)."""
    if getattr(type(value), "_is_tensorclass", False) and "_tensordict" in getattr(
        value, "__dict__", ()
    ):
        return value.__dict__["_tensordict"]
    if type(value) in (list, tuple):
        return type(value)(_unwrap(v) for v in value)
    return value


def _wrap(self: Any, result: Any, td: Any) -> Any:
    """A forwarded method's result as the tensorclass would give it."""
    if result is td:
        return self
    if isinstance(result, TensorDict):
        return type(self)._from_tensordict(result, dict(self.__dict__["_non_tensordict"]))
    if type(result) in (tuple, list):
        return type(result)(_wrap(self, r, td) for r in result)
    if isinstance(result, tuple) and hasattr(type(result), "n_fields"):
        # a torch.return_types structseq (``max(dim=...)``: values and indices)
        return type(result)([_wrap(self, r, td) for r in result])
    return result


def _forwarder(name: str) -> Callable[..., Any]:
    source = getattr(TensorDict, name, None)
    takes_filter = source is not None and "cast_filter" in _parameters(source)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        td = self.__dict__["_tensordict"]
        if takes_filter and "cast_filter" not in kwargs and type(self)._cast_filter is not None:
            kwargs["cast_filter"] = type(self)._cast_filter  # the class's default
        result = getattr(td, name)(
            *[_unwrap(a) for a in args], **{k: _unwrap(v) for k, v in kwargs.items()}
        )
        return _wrap(self, result, td)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"``TensorDict.{name}`` on the tensorclass's TensorDict; a TensorDict result comes back "
        "as the tensorclass.\n\n" + (inspect.getdoc(source) or "")
    )
    return method


def _parameters(fn: Any) -> Any:
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}


def _property(name: str, prop: property) -> property:
    def get(self: Any) -> Any:
        td = self.__dict__["_tensordict"]
        return _wrap(self, getattr(td, name), td)

    def set_(self: Any, value: Any) -> None:
        setattr(self.__dict__["_tensordict"], name, value)

    return property(get, set_ if prop.fset is not None else None, doc=prop.__doc__)


@functools.cache
def _forwarded() -> dict[str, Any]:
    """Every public member of TensorDict (and its operators), forwarded. Computed once, after
    TensorDict is complete, so that methods added to TensorDict appear here without a table."""
    out: dict[str, Any] = {}
    for name in dir(TensorDict):
        if name in _OWN or (name.startswith("_") and not name.startswith("__")):
            continue
        member = inspect.getattr_static(TensorDict, name)
        if isinstance(member, property):
            out[name] = _property(name, member)
        elif inspect.isfunction(member):
            out[name] = _forwarder(name)
        elif isinstance(member, (classmethod, _classmethod)) and name not in _OWN_CLASSMETHODS:
            out[name] = _class_forwarder(name)
    return out


# the tensorclass's own versions of these are among the members set by ``_process``
_OWN_CLASSMETHODS = frozenset({"from_dict", "load", "load_memmap"})


def _class_forwarder(name: str) -> classmethod:  # type: ignore[type-arg]
    """A classmethod of TensorDict (``from_list``, ``fromkeys``, ``stack``, ...) called on the
    class's TensorDict class; a TensorDict result comes back as the tensorclass."""
    source = getattr(TensorDict, name)

    def method(cls: Any, *args: Any, **kwargs: Any) -> Any:
        result = getattr(cls._TensorDict, name)(
            *[_unwrap(a) for a in args], **{k: _unwrap(v) for k, v in kwargs.items()}
        )
        return cls._from_tensordict(result, {}) if isinstance(result, TensorDict) else result

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"``TensorDict.{name}`` for the tensorclass: a TensorDict result comes back as an "
        "instance of the class.\n\n" + (inspect.getdoc(source) or "")
    )
    return classmethod(method)
