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

The package: ``forwarding`` (TensorDict's members on a tensorclass), ``fields`` (the field
descriptor and the conversion of assigned values), ``members`` (the methods set on every
tensorclass); making a class and the public names are here.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import torch

from .._core import classes as _classes
from .._core.metadata import MetaData
from .._core.nodes import NonTensorData
from .._core.nontensor import NonTensorStack
from .._core.shared_value import unshared
from ..tensordict import TensorDict
from .fields import _Field, _is_tensorclass_type, _type_hints
from .forwarding import _OWN, _forwarded
from .members import (
    _as_node,
    _bool,
    _delattr,
    _empty,
    _eq,
    _fields,
    _from_dict,
    _from_tensordict,
    _from_tensordict_public,
    _get,
    _getattr,
    _getitem,
    _getstate,
    _init_wrapper,
    _iter,
    _len,
    _load_memmap,
    _memmap,
    _memmap_,
    _memmap_like,
    _ne,
    _repr,
    _select,
    _set,
    _setattr,
    _setitem,
    _setstate,
    _to_dict,
    _to_tensordict,
    _torch_function,
    _update,
    _update_,
)

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
_FLAGS = ("autocast", "nocast", "frozen", "tensor_only", "shadow", "skip_post_init_on_rebuild")


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
    params = list(signature.parameters.values())
    # (before a ``**kwargs`` of the user's ``__init__``, which must come last)
    at = len(params) - (bool(params) and params[-1].kind is inspect.Parameter.VAR_KEYWORD)
    init.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*params[:at], *extra, *params[at:]]
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
        "__delattr__": _delattr,
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
        "to_dict": _to_dict,
        "update": _update,
        "update_": _update_,
        "empty": _empty,
        "fields": classmethod(_fields),
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
