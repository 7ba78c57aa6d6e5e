"""tensorclass: dataclasses whose tensor fields live in a TensorDict.

``@tensorclass`` (or subclassing ``TensorClass``) turns a class with annotated fields into a
dataclass whose instance holds one TensorDict: tensor fields and nested collections are its
entries, other values its ``NonTensorData`` entries, and a field set to ``None`` is a missing key
(as in tensordict 0.15). Every TensorDict method is forwarded: a TensorDict result comes back as
the tensorclass, the TensorDict itself as ``self``.

>>> import torch
>>> from tensordict_rs import tensorclass
>>> @tensorclass
... class Batch:
...     images: torch.Tensor
...     targets: torch.Tensor
>>> data = Batch(images=torch.zeros(4, 3, 8, 8), targets=torch.arange(4), batch_size=[4])
>>> data[1:3]
Batch(batch_size=[2], fields={images: f32[3,8,8], targets: i64[]})

A tensorclass nested in a TensorDict (or in another tensorclass) is stored as its TensorDict, of
a TensorDict subclass made for the class (``Batch._TensorDict``): every tree operation keeps the
subclass, reads give the tensorclass back, and a save records the class the way tensordict does
(``meta.json`` with the class, the fields in ``_tensordict/``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from ._core import classes as _classes
from ._core.metadata import MetaData
from ._core.nodes import NTD_TYPES, NonTensorData
from ._core.nontensor import NonTensorStack
from ._core.shared_value import unshared
from .memmap import _LazyLeaf
from .ops.devices import _normalize_device
from .ops.keys import leaf_value
from .tensordict import TensorDict, _classmethod

__all__ = [
    "MetaData",
    "NonTensorData",
    "NonTensorDataBase",
    "NonTensorStack",
    "TensorClass",
    "from_dataclass",
    "tensorclass",
]

#: tensordict's common base of ``NonTensorData`` and ``MetaData`` (``isinstance`` checks of
#: non-tensor entries): here ``MetaData`` is a ``NonTensorData``, so that class is the base.
NonTensorDataBase = NonTensorData

T = TypeVar("T")
# tensordict's name for reading a shared NonTensorData's cell (``entry._non_tensordict["data"]``)
_from_shared_nontensor = unshared
_MISSING: Any = object()
_FLAGS = ("autocast", "nocast", "frozen", "tensor_only", "shadow", "skip_post_init_on_rebuild")

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


# ------------------------------------------------------------------------------ field access


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


# ------------------------------------------------------------------------------ the class methods


def _init_wrapper(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        fields = cls.__dataclass_fields__
        # batch_size, device, names are the TensorDict's, unless a field takes the name (shadow)
        batch_size = None if "batch_size" in fields else kwargs.pop("batch_size", None)
        device = None if "device" in fields else kwargs.pop("device", None)
        names = None if "names" in fields else kwargs.pop("names", None)
        kwargs.pop("non_blocking", None)
        lock = kwargs.pop("lock", False)
        if isinstance(batch_size, int):
            batch_size = [batch_size]
        td = cls._TensorDict._new_unchecked(
            torch.Size([] if batch_size is None else batch_size), _normalize_device(device)
        )
        td.names = names
        state = self.__dict__
        state["_tensordict"] = td
        state["_non_tensordict"] = {}
        state["_initialized"] = False
        try:
            init(self, *args, **kwargs)
        finally:
            state["_initialized"] = True
        if lock or cls._frozen:  # a frozen tensorclass is locked, as tensordict's
            td.lock_()

    return __init__


def _getattr(self: Any, name: str) -> Any:
    """Names that are not fields: the TensorDict's (methods forwarded, results re-wrapped)."""
    if name in ("_tensordict", "_non_tensordict") or name.startswith("__"):
        raise AttributeError(name)
    state = self.__dict__
    if "_tensordict" not in state:
        raise AttributeError(name)
    td = state["_tensordict"]
    value = getattr(td, name, _MISSING)
    if value is _MISSING:
        fields = sorted(type(self).__dataclass_fields__)
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute {name!r}; its fields are {fields}"
        )
    if callable(value):
        return functools.partial(_forwarder(name), self)
    return _wrap(self, value, td)


def _setattr(self: Any, key: str, value: Any) -> None:
    cls = type(self)
    if key in ("batch_size", "names") and key not in cls.__dataclass_fields__:  # (shadow)
        setattr(self.__dict__["_tensordict"], key, value)
        return
    if key == "device" and "device" not in cls.__dataclass_fields__:
        raise RuntimeError(
            "device cannot be set using tensorclass.device = device, because device cannot be "
            "updated in-place. To update device, use tensorclass.to(new_device), which will "
            "return a new tensorclass on the new device."
        )
    static = inspect.getattr_static(cls, key, None)
    if key.startswith("_") or hasattr(static, "__set__"):
        object.__setattr__(self, key, value)
        return
    fields = sorted(cls.__dataclass_fields__)
    raise AttributeError(
        f"Cannot set the attribute {key!r}: {cls.__name__} has no such field. Its fields are "
        f"{fields}."
    )


def _getitem(self: Any, index: Any) -> Any:
    if isinstance(index, str) or (
        isinstance(index, tuple) and index and all(isinstance(i, str) for i in index)
    ):
        raise ValueError(
            f"Invalid indexing arguments: {index!r}. A tensorclass is indexed along its batch "
            f"dimensions; to read a field, use the attribute or get({index!r})."
        )
    td = self.__dict__["_tensordict"]
    return type(self)._from_tensordict(td[index], dict(self.__dict__["_non_tensordict"]))


def _setitem(self: Any, index: Any, value: Any) -> None:
    if isinstance(index, str) or (
        isinstance(index, tuple) and index and all(isinstance(i, str) for i in index)
    ):
        raise ValueError(
            f"Invalid indexing arguments: {index!r}. A tensorclass is indexed along its batch "
            f"dimensions; to write a field, use the attribute or set({index!r}, value)."
        )
    td = self.__dict__["_tensordict"]
    if getattr(type(value), "_is_tensorclass", False):
        if not isinstance(value, type(self)):
            mine = set(td.keys()) | set(self.__dict__["_non_tensordict"])
            theirs = set(value._tensordict.keys()) | set(value.__dict__["_non_tensordict"])
            if mine != theirs:
                raise ValueError(
                    "__setitem__ is only allowed for same-class or compatible class (i.e. same "
                    "members) assignment"
                )
        td[index] = value.__dict__["_tensordict"]
        return
    if not isinstance(value, (TensorDict, numbers.Number, torch.Tensor)):
        raise ValueError(
            "__setitem__ only supports tensorclasses, tensordicts, numeric scalars and tensors. "
            f"Got {type(value)}"
        )
    td[index] = value


def _repr(self: Any) -> str:
    from ._core.render import render
    from ._core.repr import _body

    td = self.__dict__["_tensordict"]
    body = _body(td)
    missing = [  # (class variables are not fields)
        (field.name, "None")
        for field in dataclasses.fields(self)
        if field.name not in td._tensordict and field.repr
    ]
    hidden = {n for n, f in type(self).__dataclass_fields__.items() if not f.repr}
    body = [(k, v) for k, v in body if k not in hidden]
    body += missing
    return render(type(self).__name__, td.batch_size, td.device, body)


def _len(self: Any) -> int:
    return len(self.__dict__["_tensordict"])


def _bool(self: Any) -> bool:
    raise RuntimeError("Converting a tensorclass to boolean value is not permitted. ")


def _iter(self: Any) -> Iterator[Any]:
    for i in range(len(self)):
        yield self[i]


def _getstate(self: Any) -> dict[str, Any]:
    return {
        "tensordict": self.__dict__["_tensordict"],
        "non_tensordict": self.__dict__["_non_tensordict"],
    }


def _setstate(self: Any, state: dict[str, Any]) -> None:
    self.__dict__["_tensordict"] = state["tensordict"]
    self.__dict__["_non_tensordict"] = state["non_tensordict"]
    self.__dict__["_initialized"] = True


def _torch_function(
    cls: type,
    func: Any,
    types: Any,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
) -> Any:
    kwargs = kwargs or {}
    first = _first_tensorclass(args)
    if first is None:  # (not ``or``: ``bool()`` of a tensorclass raises, as in tensordict)
        first = _first_tensorclass(tuple(kwargs.values()))
    out = kwargs.get("out")
    result = func(*_unwrap(list(args)), **{k: _unwrap(v) for k, v in kwargs.items()})
    if out is not None and getattr(type(out), "_is_tensorclass", False):
        return out
    if first is None:
        return result
    return _wrap(first, result, None)


def _first_tensorclass(items: tuple[Any, ...] | list[Any]) -> Any:
    for item in items:
        if getattr(type(item), "_is_tensorclass", False):
            return item
        if type(item) in (list, tuple):
            found = _first_tensorclass(item)
            if found is not None:
                return found
    return None


def _get(self: Any, key: Any, default: Any = _MISSING) -> Any:
    """A field's value (None for a field that holds nothing, or ``default`` when given); a
    nested key reads inside nested fields; another name reads that attribute."""
    if isinstance(key, tuple) and len(key) == 1:
        key = key[0]
    if isinstance(key, str):
        if key in type(self).__dataclass_fields__:
            value = getattr(self, key)
            return default if value is None and default is not _MISSING else value
        value = getattr(self, key, _MISSING)
        if value is not _MISSING:
            return value
        return None if default is _MISSING else default
    head: Any = getattr(self, key[0], None)
    if not hasattr(head, "get") or isinstance(head, torch.Tensor):
        return None if default is _MISSING else default
    return head.get(key[1:], None if default is _MISSING else default)


def _set(self: Any, key: Any, value: Any, inplace: bool = False, non_blocking: bool = False) -> Any:
    if isinstance(key, tuple) and len(key) > 1:
        getattr(self, key[0]).set(key[1:], value, inplace=inplace)
        return self
    if isinstance(key, tuple):
        key = key[0]
    if key not in type(self).__dataclass_fields__:
        fields = sorted(type(self).__dataclass_fields__)
        raise AttributeError(
            f"Cannot set the attribute {key!r}: {type(self).__name__} has no such field. Its "
            f"fields are {fields}."
        )
    _set_field(self, key, value, inplace=inplace)
    return self


def _select(
    self: Any, *keys: Any, inplace: bool = False, strict: bool = True, as_tensordict: bool = False
) -> Any:
    """The tensorclass with only the fields of ``keys`` (the others None; ``inplace``: this
    one, changed), or with ``as_tensordict`` those entries in a plain TensorDict.

    >>> import torch; from tensordict_rs import TensorClass
    >>> class Foo(TensorClass):
    ...     x: torch.Tensor
    ...     y: torch.Tensor
    >>> foo = Foo(x=torch.zeros(3), y=torch.ones(3), batch_size=[3])
    >>> foo.select("x").y is None, type(foo.select("x", as_tensordict=True)).__name__
    (True, 'TensorDict')
    """
    td = self.__dict__["_tensordict"]
    result = td.select(*keys, inplace=inplace, strict=strict)
    if as_tensordict:
        return _retyped(result, TensorDict)
    return _wrap(self, result, td)


def _to_tensordict(self: Any, *, retain_none: bool | None = None) -> TensorDict:
    copy = self.__dict__["_tensordict"].to_tensordict()
    return _retyped(copy, TensorDict)


def _retyped(td: TensorDict, cls: type[TensorDict]) -> TensorDict:
    """``td``'s entries (shared, not copied) in a TensorDict of class ``cls``."""
    if type(td) is cls:
        return td
    out = cls._new_unchecked(td._batch_size, td._device)
    out._tensordict = td._tensordict
    out._is_locked = td._is_locked
    out._is_memmap = td._is_memmap
    out._memmap_prefix = td._memmap_prefix
    out._lock_parents = td._lock_parents
    out._lock_ops = td._lock_ops
    return out


def _from_tensordict(
    cls: Any,
    tensordict: TensorDict,
    non_tensordict: dict[str, Any] | None = None,
    safe: bool = True,
) -> Any:
    obj = cls.__new__(cls)
    state = obj.__dict__
    state["_tensordict"] = _retyped(tensordict, cls._TensorDict)
    state["_non_tensordict"] = {} if non_tensordict is None else non_tensordict
    state["_initialized"] = True
    if cls._post_init is not None and not cls._skip_post_init_on_rebuild:
        cls._post_init(obj)
    return obj


def _from_tensordict_public(
    cls: Any,
    tensordict: TensorDict,
    non_tensordict: dict[str, Any] | None = None,
    safe: bool = True,
) -> Any:
    """Wraps ``tensordict`` (its entries are shared) as an instance of the class; its keys must
    be fields of the class."""
    fields = set(cls.__dataclass_fields__)
    extra = set(tensordict.keys()) - fields
    if safe and extra:
        raise ValueError(
            f"Keys from the tensordict ({set(tensordict.keys())}) must correspond to the class "
            f"attributes ({fields}). Got the set of keys {extra} which do not belong to the class."
        )
    return cls._from_tensordict(tensordict, non_tensordict)


def _from_dict(
    cls: Any,
    input_dict: dict[str, Any],
    batch_size: Any = None,
    device: Any = None,
    batch_dims: int | None = None,
    auto_batch_size: bool | None = None,
) -> Any:
    """An instance from a (nested) dict of its fields."""
    td = TensorDict.from_dict(
        input_dict,
        batch_size=batch_size,
        device=device,
        batch_dims=batch_dims,
        auto_batch_size=auto_batch_size,
    )
    return cls.from_tensordict(td)


def _as_node(self: Any) -> TensorDict:
    """The TensorDict to store when this tensorclass is an entry of another tree (of the class's
    TensorDict subclass, so that the tree keeps the class)."""
    state = self.__dict__
    td = state["_tensordict"]
    if type(td) is not type(self)._TensorDict:
        td = state["_tensordict"] = _retyped(td, type(self)._TensorDict)
    return td


def _compare(self: Any, other: Any, ne: bool) -> Any:
    """``==`` / ``!=``: a tensorclass of bools; against a number or tensor the non-tensor
    fields are left out (as tensordict does); anything else compares unequal."""
    if not isinstance(other, (dict, numbers.Number, torch.Tensor, TensorDict)) and not getattr(
        type(other), "_is_tensorclass", False
    ):
        return ne
    td = self.__dict__["_tensordict"]
    if not isinstance(other, TensorDict) and not getattr(type(other), "_is_tensorclass", False):
        plain = [k for k, v in td.items(include_nested=True) if type(v) in NTD_TYPES]
        td = td.exclude(*plain) if plain else td
    result = (td != _unwrap(other)) if ne else (td == _unwrap(other))
    return type(self)._from_tensordict(result, dict(self.__dict__["_non_tensordict"]))


def _eq(self: Any, other: Any) -> Any:
    return _compare(self, other, False)


def _ne(self: Any, other: Any) -> Any:
    return _compare(self, other, True)


# ------------------------------------------------------------------------------ making a class


def _node_class(cls: type) -> type[TensorDict]:
    """The TensorDict subclass that stores instances of ``cls`` inside trees, reachable as
    ``cls._TensorDict`` (so that it pickles by reference wherever ``cls`` does)."""
    node = type(
        "_TensorDict",
        (TensorDict,),
        {
            "__module__": cls.__module__,
            "__qualname__": f"{cls.__qualname__}._TensorDict",
            "__doc__": f"The TensorDict of a {cls.__qualname__} inside a tree.",
            "_tensorclass": cls,
        },
    )
    return node


def _reserved(name: str) -> bool:
    # a field named "data" (as NonTensorData's) or "fields" replaces the member, as in
    # tensordict 0.15.3; any other member's name needs ``shadow=True``
    if name in ("data", "fields"):
        return False
    return hasattr(TensorDict, name) or name in _OWN


def _process(cls: type, flags: dict[str, Any]) -> type:
    """Makes ``cls`` a tensorclass in place and returns it."""
    if flags.get("autocast") and flags.get("nocast"):
        raise TypeError("autocast is exclusive with nocast.")
    if flags.get("tensor_only") and (flags.get("autocast") or flags.get("nocast")):
        raise TypeError("tensor_only and autocast or nocast are exclusive features.")
    own = inspect.get_annotations(cls)
    if not flags.get("shadow"):
        for name in own:
            if _reserved(name):
                raise AttributeError(
                    f"Attribute name {name} can't be used with @tensorclass or TensorClass, as "
                    "tensorclasses have a member of that name. To allow it, pass shadow=True "
                    "(@tensorclass(shadow=True) or TensorClass['shadow'])."
                )
    dataclasses.dataclass(cls, repr=False, eq=False, kw_only=flags.get("kw_only", False))  # type: ignore[call-overload]
    for name, value in _forwarded().items():
        if name not in cls.__dict__ and not _inherited_from_user(cls, name):
            setattr(cls, name, value)
    cls._is_tensorclass = True  # type: ignore[attr-defined]
    cls._autocast = bool(flags.get("autocast"))  # type: ignore[attr-defined]
    cls._nocast = bool(flags.get("nocast"))  # type: ignore[attr-defined]
    cls._frozen = bool(flags.get("frozen"))  # type: ignore[attr-defined]
    if not _user_hash(cls):
        # as a dataclass with eq: unhashable unless frozen (== gives a tree of bools)
        cls.__hash__ = object.__hash__ if flags.get("frozen") else None  # type: ignore[assignment]
    cls._tensor_only = bool(flags.get("tensor_only"))  # type: ignore[attr-defined]
    cls._shadow = bool(flags.get("shadow"))  # type: ignore[attr-defined]
    cls._skip_post_init_on_rebuild = bool(flags.get("skip_post_init_on_rebuild"))  # type: ignore[attr-defined]
    cls._cast_filter = flags.get("cast_filter")  # type: ignore[attr-defined]
    cls._post_init = getattr(cls, "__post_init__", None)  # type: ignore[attr-defined]
    cls._TensorDict = _node_class(cls)  # type: ignore[attr-defined]
    init = _init_wrapper(cls.__init__)  # type: ignore[misc]
    # the signature shows the TensorDict's keywords after the fields, as tensordict's does
    signature = inspect.signature(cls.__init__)  # type: ignore[misc]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
        for name in ("batch_size", "device", "names")
        if name not in signature.parameters
    ]
    init.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), *extra]
    )
    cls.__init__ = init  # type: ignore[misc]
    expected = set()
    for name, field in cls.__dataclass_fields__.items():  # type: ignore[attr-defined]
        if field._field_type is dataclasses._FIELD:  # type: ignore[attr-defined]
            setattr(cls, name, _Field(name, cls))
            expected.add(name)
    cls.__expected_keys__ = expected  # type: ignore[attr-defined]
    members = {
        "__getattr__": _getattr,
        "__setattr__": _setattr,
        "__getitem__": _getitem,
        "__getitems__": _getitem,
        "__setitem__": _setitem,
        "__repr__": _repr,
        "__eq__": _eq,
        "__ne__": _ne,
        "__len__": _len,
        "__bool__": _bool,  # as tensordict: not the truth of its length
        "__iter__": _iter,
        "__getstate__": _getstate,
        "__setstate__": _setstate,
        "__torch_function__": classmethod(_torch_function),
        "get": _get,
        "set": _set,
        "to_tensordict": _to_tensordict,
        "select": _select,
        "_as_node": _as_node,
        "_from_tensordict": classmethod(_from_tensordict),
        "from_tensordict": classmethod(_from_tensordict_public),
        "from_dict": classmethod(_from_dict),
        "memmap_": _memmap_,
        "memmap": _memmap,
        "memmap_like": _memmap_like,
        "save": _memmap,
        "load_memmap": classmethod(_load_memmap),
        "load": classmethod(_load_memmap),
    }
    for name, value in members.items():
        if name not in cls.__dict__ and not _inherited_from_user(cls, name):
            setattr(cls, name, value)
    if flags.get("tensor_only"):
        _check_tensor_only(cls)
    _classes.register(cls)
    return cls


def _tensor_only_type(hint: Any) -> bool:
    if hint is type(None) or hint is Any:
        return hint is type(None)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return all(_tensor_only_type(arg) for arg in typing.get_args(hint))
    return isinstance(hint, type) and (
        issubclass(hint, (torch.Tensor, TensorDict)) or _is_tensorclass_type(hint)
    )


def _check_tensor_only(cls: type) -> None:
    """tensor_only: every field is annotated with a tensor type or a tensor collection."""
    hints = _type_hints(cls)
    for name in (field.name for field in dataclasses.fields(cls)):  # type: ignore[arg-type]
        if name in hints and not _tensor_only_type(hints[name]):
            raise TypeError("tensor_only requires types to be Tensor, Tensor-subtypes or None.")


def _user_hash(cls: type) -> bool:
    """True when the class or a base that is not a tensorclass defines ``__hash__``."""
    return "__hash__" in cls.__dict__ or any(
        "__hash__" in base.__dict__
        for base in cls.__mro__[1:]
        if base is not object
        and base is not TensorClass
        and not getattr(base, "_is_tensorclass", False)
    )


def _inherited_from_user(cls: type, name: str) -> bool:
    """True when a user base class (not a tensorclass machinery class) defines ``name``."""
    for base in cls.__mro__[1:]:
        if base is object or base is TensorClass or name not in base.__dict__:
            continue
        if getattr(base, "_is_tensorclass", False) and base.__dict__.get(name) is _forwarded().get(
            name
        ):
            continue
        return True
    return False


# ------------------------------------------------------------------------------ persistence


def _memmap_(self: Any, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> Any:
    """Memory-maps every field in place (anonymous, or the reference's tensorclass layout under
    ``prefix``: ``meta.json`` with the class, the fields in ``_tensordict/``) and locks."""
    _as_node(self).memmap_(prefix, copy_existing, **kwargs)
    return self


def _memmap(self: Any, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> Any:
    """A memory-mapped copy (see ``memmap_``)."""
    result = _as_node(self).memmap(prefix, copy_existing, **kwargs)
    return type(self)._from_tensordict(result, dict(self.__dict__["_non_tensordict"]))


def _memmap_like(self: Any, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> Any:
    """Zero-filled memory maps of the same fields, shapes and dtypes (see ``memmap_``)."""
    result = _as_node(self).memmap_like(prefix, copy_existing, **kwargs)
    return type(self)._from_tensordict(result, dict(self.__dict__["_non_tensordict"]))


def _load_memmap(
    cls: Any, prefix: Any, device: Any = None, non_blocking: bool = False, **kwargs: Any
) -> Any:
    """Loads a saved tensorclass (of the class recorded in the directory)."""
    loaded = cls._TensorDict.load_memmap(prefix, device=device, non_blocking=non_blocking, **kwargs)
    return loaded


# ------------------------------------------------------------------------------ public API


class _TensorClassMeta(type):
    """``TensorClass["nocast", "frozen"]``: a base with those flags."""

    def __getitem__(cls, item: Any) -> Any:
        items = item if isinstance(item, tuple) else (item,)
        for flag in items:
            if flag not in _FLAGS:
                raise ValueError(f"TensorClass accepts the flags {_FLAGS}. Got {item}.")
        flags = {flag: True for flag in items}
        return _TensorClassMeta(
            f"TensorClass[{', '.join(map(repr, items))}]",
            (cls,),
            {"__module__": cls.__module__, "_base_flags": flags},
        )


class TensorClass(metaclass=_TensorClassMeta):
    """A base class for dataclass-like containers of tensors: subclasses are tensorclasses
    (``@tensorclass`` with the flags given as ``TensorClass["nocast"]`` or class keywords).

    >>> import torch
    >>> from tensordict_rs import TensorClass
    >>> class Pair(TensorClass):
    ...     a: torch.Tensor
    ...     b: torch.Tensor
    >>> Pair(a=torch.zeros(2), b=torch.ones(2), batch_size=[2]).b
    tensor([1., 1.])
    """

    _base_flags: ClassVar[dict[str, Any]] = {}
    # the options of the base itself (each subclass gets its own, see _process)
    _autocast: ClassVar[bool] = False
    _nocast: ClassVar[bool] = False
    _frozen: ClassVar[bool] = False
    _tensor_only: ClassVar[bool] = False
    _shadow: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        flags = {
            **cls._base_flags,
            **{
                k: kwargs.pop(k)
                for k in list(kwargs)
                if k in _FLAGS or k in ("cast_filter", "kw_only")
            },
        }
        super().__init_subclass__(**kwargs)
        if "_base_flags" in cls.__dict__ and not inspect.get_annotations(cls):
            return  # TensorClass["flag"] itself
        _process(cls, flags)


def tensorclass(
    cls: Any = None,
    /,
    *,
    autocast: bool = False,
    frozen: bool = False,
    nocast: bool = False,
    shadow: bool = False,
    tensor_only: bool = False,
    skip_post_init_on_rebuild: bool = False,
    cast_filter: Callable[..., bool] | None = None,
    kw_only: bool = False,
) -> Any:
    """Turns a class with annotated fields into a tensorclass (see the module docstring).

    ``autocast`` converts assigned values to their annotation, ``nocast`` keeps numbers and
    arrays as Python values, ``frozen`` makes field assignment raise
    ``dataclasses.FrozenInstanceError``, ``shadow`` lets fields take TensorDict member names.
    """
    flags = {
        "autocast": autocast,
        "frozen": frozen,
        "nocast": nocast,
        "shadow": shadow,
        "tensor_only": tensor_only,
        "skip_post_init_on_rebuild": skip_post_init_on_rebuild,
        "cast_filter": cast_filter,
        "kw_only": kw_only,
    }

    def wrap(c: Any) -> Any:
        return _process(c, flags)

    return wrap if cls is None else wrap(cls)


def from_dataclass(obj: Any, *, dest_cls: Any = None, **flags: Any) -> Any:
    """A tensorclass from a dataclass type (a new class with the same fields), or an instance of
    it from a dataclass instance."""
    if isinstance(obj, type):
        ns = {
            "__module__": obj.__module__,
            "__qualname__": obj.__qualname__ + "_tc",
            "__annotations__": {f.name: f.type for f in dataclasses.fields(obj)},
        }
        return tensorclass(**flags)(type(obj.__name__ + "_tc", (), ns))
    cls = dest_cls or from_dataclass(type(obj), **flags)
    return cls(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
