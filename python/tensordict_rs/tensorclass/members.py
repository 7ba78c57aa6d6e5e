"""The members ``@tensorclass`` sets on a class: ``__init__`` around the dataclass's,
attribute access (``__getattr__`` forwards to the TensorDict), indexing, ``repr``, comparisons,
pickling state, ``__torch_function__``, ``get``/``set``/``select``, the conversions to and from
a TensorDict, and persistence (``memmap_``, ``memmap``, ``load_memmap``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
import types
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import torch

from .._core.locking import locked_error
from .._core.nodes import NTD_TYPES
from ..ops.devices import _normalize_device
from ..tensordict import TensorDict
from .fields import _MISSING, _set_field, _type_hints
from .forwarding import _forwarder, _unwrap, _wrap

# set while ``empty()`` builds its result: a shell that the caller fills, whose
# ``__post_init__`` would see no fields (tensordict skips it there too)
_SKIP_POST_INIT: ContextVar[bool] = ContextVar("tensorclass_skip_post_init", default=False)


def _init_wrapper(init: Callable[..., None]) -> Callable[..., None]:
    signature = inspect.signature(init)

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
        _refuse_unknown_keywords(cls, signature, self, args, kwargs)
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


def _refuse_unknown_keywords(
    cls: Any, signature: inspect.Signature, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """A keyword that is no field raises AttributeError, as tensordict's (which sets it as an
    attribute); when an argument is also missing, the dataclass's TypeError says both."""
    parameters = signature.parameters
    unknown = [key for key in kwargs if key not in parameters]
    if not unknown or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return  # (an ``__init__`` of the user's may take any keyword)
    known = {key: value for key, value in kwargs.items() if key in parameters}
    try:
        signature.bind(obj, *args, **known)
    except TypeError:
        return  # the dataclass's own TypeError names the missing argument
    fields = sorted(cls.__dataclass_fields__)
    raise AttributeError(
        f"Cannot set the attribute {unknown[0]!r}: {cls.__name__} has no such field. Its fields "
        f"are {fields}."
    )


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


def _delattr(self: Any, key: str) -> None:
    """``del tc.field`` sets the field to None (its entry removed), as tensordict's; a locked
    (or frozen) tensorclass refuses it."""
    cls = type(self)
    if key in cls.__dataclass_fields__ and key in cls.__expected_keys__:
        if cls._frozen:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {key!r}")
        td = self.__dict__["_tensordict"]
        if td.is_locked:
            raise locked_error()
        _set_field(self, key, None)
        return
    if key in self.__dict__:
        object.__delattr__(self, key)
        return
    del self.__dict__["_tensordict"][key]  # KeyError, as tensordict's


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
    from .._core.render import render
    from .._core.repr import _body

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
    if not self.batch_size:  # as a TensorDict without batch dims (it iterated over nothing)
        raise TypeError(
            "iteration over a 0-d tensordict. Use keys(), values() or items() to iterate "
            "over its entries."
        )
    return (self[i] for i in range(len(self)))


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
    if not all(issubclass(t, (torch.Tensor, cls, TensorDict)) for t in types):
        # another tensorclass among the arguments (even with the same fields): torch raises
        # TypeError, as tensordict's tensorclasses do
        return NotImplemented
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
    copy = _retyped(self.__dict__["_tensordict"].to_tensordict(), TensorDict)
    _untyped(copy)
    return copy


def _untyped(td: TensorDict) -> None:
    """Makes every nested tensorclass of ``td`` (a copy) a TensorDict, as tensordict's
    ``to_tensordict`` gives (a nested ``Inner`` stayed one)."""
    entries = td._tensordict
    for key, value in entries.items():
        if type(value) in NTD_TYPES:
            continue  # non-tensor data stays as it is
        if getattr(type(value), "_is_tensorclass", False):
            entries[key] = value.to_tensordict()
        elif isinstance(value, TensorDict):
            # a nested tensorclass is kept as a TensorDict subclass naming its class
            entries[key] = value = _retyped(value, TensorDict)
            _untyped(value)


def _retyped(td: TensorDict, cls: type[TensorDict], *, own: bool = False) -> TensorDict:
    """``td``'s entries (shared, not copied) in a TensorDict of class ``cls``; with ``own``, a
    new TensorDict whose dict of entries is its own (a shallow copy)."""
    if type(td) is cls and not own:
        return td
    out = cls._new_unchecked(td._batch_size, td._device)
    out._tensordict = dict(td._tensordict) if own else td._tensordict
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
    if (
        cls._post_init is not None
        and not cls._skip_post_init_on_rebuild
        and not _SKIP_POST_INIT.get()
    ):
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
    if isinstance(tensordict, TensorDict):
        tensordict = _typed_entries(cls, tensordict)
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


# ------------------------------------------------------------------ fields of a tensorclass type


def _tensorclass_annotation(hint: Any) -> Any:
    """The tensorclass of a ``T``, ``T[...]`` or ``Optional[T]`` annotation, else None (as
    tensordict's: other unions, the non-tensor classes and ``TensorClass`` itself do not
    count)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(args) != 1:
            return None
        hint = args[0]
    hint = typing.get_origin(hint) or hint
    if (
        isinstance(hint, type)
        and getattr(hint, "_is_tensorclass", False)
        and "__expected_keys__" in vars(hint)
    ):
        return hint
    return None


def _tensorclass_fields(cls: Any) -> dict[str, Any]:
    """The fields of ``cls`` annotated with a tensorclass: {name: that class}."""
    out = {}
    for key, hint in _type_hints(cls).items():
        if key in cls.__expected_keys__:
            tc = _tensorclass_annotation(hint)
            if tc is not None:
                out[key] = tc
    return out


def _fits(tc: Any, entry: Any) -> bool:
    """``entry`` is a TensorDict (not a tensorclass's) whose keys are all fields of ``tc``."""
    return (
        isinstance(entry, TensorDict)
        and getattr(type(entry), "_tensorclass", None) is None
        and all(key in tc.__expected_keys__ for key in entry.keys())
    )


def _as_class(tc: Any, entry: Any) -> TensorDict:
    """``entry`` as the node of tensorclass ``tc`` (a shallow copy, its own fields typed)."""
    node = _typed_entries(tc, entry)
    return (
        _retyped(node, tc._TensorDict, own=True)
        if node is entry
        else _retyped(node, tc._TensorDict)
    )


def _typed_entries(cls: Any, td: TensorDict) -> TensorDict:
    """``td``, or a shallow copy of it in which the entries of the fields annotated with a
    tensorclass are of that class (recursively), where their keys are fields of the class;
    an entry with other keys stays a TensorDict, as in tensordict."""
    changes = {
        key: _as_class(tc, entry)
        for key, tc in _tensorclass_fields(cls).items()
        if _fits(tc, entry := td._tensordict.get(key))
    }
    if not changes:
        return td
    out = _retyped(td, type(td), own=True)
    out._tensordict.update(changes)
    return out


# ------------------------------------------------------------------ methods of TensorDict, own


def _to_dict(self: Any, *, retain_none: bool = True, convert_tensors: bool = False) -> dict:
    """The fields as a (nested) dict, as ``TensorDict.to_dict``; with ``retain_none`` (the
    default) the fields that hold nothing are there as ``None``, as in tensordict.

    >>> import torch; from tensordict_rs import TensorClass
    >>> class Foo(TensorClass):
    ...     x: torch.Tensor
    ...     y: torch.Tensor | None = None
    >>> Foo(x=torch.zeros(2), batch_size=[2]).to_dict()
    {'x': tensor([0., 0.]), 'y': None}
    """
    td = self.__dict__["_tensordict"]
    out = td.to_dict(retain_none=retain_none, convert_tensors=convert_tensors)
    for key, value in self.__dict__["_non_tensordict"].items():
        if key not in out and value is not None:  # a value kept outside the TensorDict
            out[key] = value
    if retain_none:
        _add_none_fields(type(self), td, out)
    return out


def _add_none_fields(cls: Any, td: TensorDict, out: dict) -> None:
    """Adds ``None`` for the fields of ``cls`` that ``td`` misses, in ``out`` (``td.to_dict()``)
    and in the dicts of its nested tensorclasses."""
    for key, value in td._tensordict.items():
        tc = getattr(type(value), "_tensorclass", None)
        if tc is not None and isinstance(out.get(key), dict):
            _add_none_fields(tc, value, out[key])
    for key in cls.__dataclass_fields__:
        if key in cls.__expected_keys__ and key not in td._tensordict:
            out.setdefault(key, None)


_UPDATE_OPTIONS = frozenset(
    {"non_blocking", "keys_to_update", "is_leaf", "update_batch_size", "ignore_lock"}
)
_td_update = _forwarder("update")
_td_update_ = _forwarder("update_")
_td_empty = _forwarder("empty")


def _dict_heads(cls: Any, source: Any, kwargs: dict[str, Any], what: str) -> list[str]:
    """The fields that a dict (and the entry keywords) of ``update``/``update_`` writes; a key
    that is no field raises ValueError, as tensordict's (which builds the class from it)."""
    keys = list(kwargs.keys() - _UPDATE_OPTIONS)
    if isinstance(source, Mapping) and not isinstance(source, TensorDict):
        keys += list(source.keys())
    elif source is not None or not keys:
        return []
    heads = [key[0] if isinstance(key, tuple) and key else key for key in keys]
    unknown = sorted({str(h) for h in heads if h not in cls.__expected_keys__})
    if unknown:
        raise ValueError(
            f"Cannot {what} a {cls.__name__} with the keys {unknown}: they are not fields of "
            f"the class. Its fields are {sorted(cls.__expected_keys__)}."
        )
    return heads


def _update(
    self: Any,
    input_dict_or_td: Any = None,
    clone: bool = False,
    inplace: bool = False,
    **kwargs: Any,
) -> Any:
    """``TensorDict.update`` on the fields. A dict's keys must be fields (else ValueError, as
    in tensordict), and a nested dict written to a field annotated with a tensorclass (where
    the field held no TensorDict) becomes that class, as in tensordict: with ``inner: Inner |
    None``, ``tc.update({"inner": {"x": x}})`` gives ``tc.inner`` an ``Inner``.
    """
    cls = type(self)
    heads = _dict_heads(cls, input_dict_or_td, kwargs, "update")
    td = self.__dict__["_tensordict"]
    fields = _tensorclass_fields(cls) if heads else {}
    fresh = {
        key: fields[key]
        for key in heads
        if key in fields and not isinstance(td._tensordict.get(key), TensorDict)
    }
    result = _td_update(self, input_dict_or_td, clone, inplace, **kwargs)
    for key, tc in fresh.items():
        entry = td._tensordict.get(key)
        if _fits(tc, entry):
            td._tensordict[key] = _as_class(tc, entry)
    return result


def _update_(self: Any, input_dict_or_td: Any = None, clone: bool = False, **kwargs: Any) -> Any:
    """``TensorDict.update_`` on the fields (in place); a dict's keys must be fields (else
    ValueError, as in tensordict)."""
    _dict_heads(type(self), input_dict_or_td, kwargs, "update_")
    return _td_update_(self, input_dict_or_td, clone, **kwargs)


def _empty(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``TensorDict.empty``: the tensorclass without its tensors (their shell, to fill), whose
    ``__post_init__`` is not run (it would see no fields), as in tensordict."""
    token = _SKIP_POST_INIT.set(True)
    try:
        return _td_empty(self, *args, **kwargs)
    finally:
        _SKIP_POST_INIT.reset(token)


def _fields(cls: Any) -> tuple[dataclasses.Field, ...]:  # type: ignore[type-arg]
    """The fields of the tensorclass: ``dataclasses.fields(cls)``.

    .. deprecated:: 0.15
        As in tensordict (removed in its 0.17): use ``dataclasses.fields(cls)``, the same
        tuple of :class:`dataclasses.Field`.
    """
    warnings.warn(
        "TensorClass.fields() is deprecated and will be removed in TensorDict 0.17. Use "
        "dataclasses.fields(cls) instead.",
        DeprecationWarning,
        stacklevel=2,
    )
    return dataclasses.fields(cls)


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
