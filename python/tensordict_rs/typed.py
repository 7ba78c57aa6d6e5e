"""``TypedTensorDict``: a TensorDict whose fields are declared as class annotations.

tensordict's experimental class (0.13+), here a plain ``TensorDict`` subclass: a declared field
is an entry reached as an attribute too (``state.obs``), the constructor takes the fields by
keyword and checks them, subclasses add fields to their parents', and every TensorDict method
works and keeps the class (results are made with ``_new_unchecked``, as every method makes
them). Options: ``class S(TypedTensorDict["frozen"])`` or ``class S(TypedTensorDict,
frozen=True)`` (``shadow``, ``frozen``; ``autocast``, ``nocast`` and ``tensor_only`` are
accepted and warn, as there).

``from_tensordict(td)`` wraps a TensorDict without copying: the new instance holds ``td``'s own
table of entries, so an entry set or deleted through either one is seen by the other, as
tensordict's wrapper does (the batch size, device, names and lock state are each instance's).
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NotRequired

from .ops import pytree as _pytree
from .tensordict import TensorDict

__all__ = ["TypedTensorDict"]

_OPTIONS = ("shadow", "frozen", "autocast", "nocast", "tensor_only")
_DEPRECATED_OPTIONS = ("autocast", "nocast", "tensor_only")
# annotation names that are class-level metadata, never fields
_META_FIELDS = frozenset(
    {
        "__expected_keys__",
        "__required_keys__",
        "__optional_keys__",
        "__field_defaults__",
        *(f"_{option}" for option in _OPTIONS),
    }
)
_NO_DEFAULT: Any = object()
# what a wrapper of ``from_tensordict`` keeps its own (who locked it, its shape contexts)
_OWN_STATE = frozenset({"_lock_parents", "_lock_ops"})


def _warn_deprecated(option: str) -> None:
    warnings.warn(
        f"The TypedTensorDict option {option!r} has no effect and is deprecated. It will be "
        "removed in TensorDict 0.17. TensorClass supports this option.",
        DeprecationWarning,
        stacklevel=3,
    )


def _not_required(tp: Any) -> bool:
    if getattr(tp, "__origin__", None) is NotRequired:
        return True
    text = str(tp)
    return text.startswith(("typing.NotRequired", "typing_extensions.NotRequired"))


def _own_hints(cls: type) -> dict[str, Any]:
    """The annotations ``cls`` declares itself, string ones evaluated in its module."""
    raw = inspect.get_annotations(cls)
    module = sys.modules.get(cls.__module__)
    globalns = vars(module) if module is not None else {}
    hints: dict[str, Any] = {}
    for name, ann in raw.items():
        if isinstance(ann, str):
            try:
                ann = eval(ann, globalns, {cls.__name__: cls})
            except Exception:  # an annotation that names something unimportable: a field still
                pass
        hints[name] = ann
    return hints


def _collect(cls: type) -> tuple[frozenset[str], frozenset[str], frozenset[str], dict[str, Any]]:
    """(expected, required, optional, defaults) of ``cls``: its fields and its bases'."""
    merged: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        if base is TypedTensorDict or not issubclass(base, TypedTensorDict):
            continue
        hints = _own_hints(base)
        merged.update(hints)
        defaults.update(base.__dict__.get("__field_defaults__", {}))
        for name in hints:
            value = base.__dict__.get(name, _NO_DEFAULT)
            if value is not _NO_DEFAULT and not isinstance(value, property):
                defaults[name] = value
    expected: set[str] = set()
    required: set[str] = set()
    optional: set[str] = set()
    for name, tp in merged.items():
        if name.startswith("_") or name in _META_FIELDS:
            continue
        if getattr(tp, "__origin__", None) is ClassVar or tp is ClassVar:
            continue
        expected.add(name)
        (optional if _not_required(tp) or name in defaults else required).add(name)
    defaults = {k: v for k, v in defaults.items() if k in expected}
    return frozenset(expected), frozenset(required), frozenset(optional), defaults


def _field(name: str, default: Any) -> property:
    """The attribute of field ``name``: its entry (``default``, if any, while it is not set)."""

    def getter(self: TensorDict) -> Any:
        try:
            return self._entry(name)
        except KeyError:
            if default is not _NO_DEFAULT:
                return default
            raise AttributeError(
                f"'{type(self).__name__}' has field '{name}' declared but not set"
            ) from None

    def setter(self: TensorDict, value: Any) -> None:
        self[name] = value

    return property(getter, setter, doc=f"The field {name!r} (its entry).")


def _missing_warning(cls: _TypedMeta, keys: Any, call: str, opt_out: str) -> None:
    missing = cls.__required_keys__.difference(keys)
    if missing:
        warnings.warn(
            f"{call.format(cls.__name__)} returns an instance of {cls.__name__} that misses the "
            f"required field(s) {', '.join(sorted(missing))}. Starting with TensorDict 0.17, "
            "the default will change to raising the TypeError that the constructor raises. "
            f"Pass these fields, or {opt_out} to keep the instance without them.",
            FutureWarning,
            stacklevel=3,
        )


def _make_init(cls: _TypedMeta) -> Callable[..., None]:
    required = cls.__required_keys__
    expected = cls.__expected_keys__
    frozen = cls._frozen

    def __init__(
        self: TensorDict,
        _source: Mapping[Any, Any] | None = None,
        batch_size: Any = None,
        device: Any = None,
        names: Any = None,
        *,
        non_blocking: bool | None = None,
        lock: bool = False,
        **fields: Any,
    ) -> None:
        blocking = bool(non_blocking)
        if _source is not None:
            TensorDict.__init__(
                self, _source, batch_size, device, names, non_blocking=blocking, lock=lock
            )
            _missing_warning(cls, self._tensordict, "{}(dict)", "use from_dict(..., check=False)")
            return
        missing = required.difference(fields)
        if missing:
            raise TypeError(
                f"{type(self).__name__}() missing required field(s): {', '.join(sorted(missing))}"
            )
        extra = set(fields).difference(expected)
        if extra:
            raise TypeError(
                f"{type(self).__name__}() got unexpected field(s): {', '.join(sorted(extra))}"
            )
        TensorDict.__init__(
            self, fields, batch_size, device, names, non_blocking=blocking, lock=lock
        )
        if frozen:
            self.lock_()

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


class _TypedMeta(type):
    """Collects the fields of a ``TypedTensorDict`` subclass and its options."""

    __expected_keys__: frozenset[str]  # every field
    __required_keys__: frozenset[str]  # the fields the constructor requires
    __optional_keys__: frozenset[str]  # ``NotRequired`` fields and fields with a default
    __field_defaults__: dict[str, Any]  # the class-level defaults
    _shadow: bool
    _frozen: bool

    def __new__(
        mcs,
        name: str,
        bases: tuple[type, ...],
        namespace: dict[str, Any],
        **options: Any,
    ) -> _TypedMeta:
        unknown = set(options).difference(_OPTIONS)
        if unknown:
            raise TypeError(f"unknown TypedTensorDict option(s): {', '.join(sorted(unknown))}")
        cls = super().__new__(mcs, name, bases, namespace)
        for option in _OPTIONS:
            value = options.get(option)
            if value is None:
                value = getattr(cls, f"_{option}", False)
            elif option in _DEPRECATED_OPTIONS and not name.startswith("TypedTensorDict_"):
                _warn_deprecated(option)
            setattr(cls, f"_{option}", bool(value))
        if name == "TypedTensorDict" or name.startswith("TypedTensorDict_"):
            cls.__expected_keys__ = frozenset()
            cls.__required_keys__ = frozenset()
            cls.__optional_keys__ = frozenset()
            cls.__field_defaults__ = {}
            return cls
        expected, required, optional, defaults = _collect(cls)
        if not cls._shadow:
            for field in sorted(expected):
                if hasattr(TensorDict, field):
                    raise AttributeError(
                        f"Field '{field}' shadows a TensorDictBase attribute. Use "
                        "TypedTensorDict['shadow'] to allow this."
                    )
        cls.__expected_keys__ = expected
        cls.__required_keys__ = required
        cls.__optional_keys__ = optional
        cls.__field_defaults__ = defaults
        for field in expected:
            setattr(cls, field, _field(field, defaults.get(field, _NO_DEFAULT)))
        if "__init__" not in namespace:
            setattr(cls, "__init__", _make_init(cls))  # noqa: B010 - mypy: no method assignment
        _pytree.register(cls)
        return cls

    def __init__(cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **_: Any):
        super().__init__(name, bases, namespace)

    def __getitem__(cls, item: Any) -> type:
        """A base class with the given options on: ``TypedTensorDict["shadow", "frozen"]``."""
        items = item if isinstance(item, tuple) else (item,)
        for option in items:
            if option not in _OPTIONS:
                raise ValueError(
                    f"Unknown TypedTensorDict option: {option!r}. Valid options: "
                    f"{', '.join(_OPTIONS)}"
                )
            if option in _DEPRECATED_OPTIONS:
                _warn_deprecated(option)
        return _TypedMeta(
            f"TypedTensorDict_{'_'.join(items)}", (cls,), {}, **dict.fromkeys(items, True)
        )


class TypedTensorDict(TensorDict, metaclass=_TypedMeta):
    """A TensorDict whose fields are declared as class annotations, as a ``TypedDict``'s.

    Experimental in tensordict, as here. A subclass gets attribute access to its fields, a
    constructor that takes them by keyword (a missing required field or an unknown name raises
    ``TypeError``; a field annotated ``NotRequired[...]`` or given a class-level default may be
    left out), its parents' fields, and every TensorDict operation, whose results keep the
    class.

    >>> import torch
    >>> from tensordict_rs import TensorDict, TypedTensorDict
    >>> class State(TypedTensorDict):
    ...     eta: torch.Tensor
    ...     X: torch.Tensor
    >>> state = State(eta=torch.zeros(5, 3), X=torch.zeros(5, 4), batch_size=[5])
    >>> state.eta.shape, type(state[0]).__name__
    (torch.Size([5, 3]), 'State')
    >>> td = TensorDict(eta=torch.zeros(5, 3), X=torch.zeros(5, 4), batch_size=[5])
    >>> State.from_tensordict(td).eta is td["eta"]
    True
    """

    @classmethod
    def from_tensordict(cls, td: TensorDict, *, check: bool = True) -> Any:
        """``td`` as an instance of the class, without a copy: both hold the same entries (a
        key set or deleted through one is seen by the other). With ``check``, a missing
        required field raises ``TypeError``."""
        if check:
            missing = cls.__required_keys__.difference(td.keys())
            if missing:
                raise TypeError(
                    f"{cls.__name__}.from_tensordict() missing required field(s): "
                    f"{', '.join(sorted(missing))}"
                )
        out = cls._new_unchecked(td.batch_size, td.device)
        for name, value in vars(td).items():  # its flags (lock, memory map, names, ...) too
            if name not in _OWN_STATE:
                setattr(out, name, list(value) if isinstance(value, list) else value)
        out._tensordict = td._tensordict  # the same table: a key set in one is in the other
        return out

    @classmethod
    def from_dict(cls, *args: Any, check: bool = True, **kwargs: Any) -> Any:
        """``TensorDict.from_dict`` giving an instance of the class; without ``check``, a
        missing required field is allowed (else it warns, as tensordict 0.15.3)."""
        td = TensorDict.from_dict(*args, **kwargs)
        if check:
            _missing_warning(cls, td._tensordict, "{}.from_dict()", "pass check=False")
        return cls.from_tensordict(td, check=False)

    def to_tensordict(self, *, retain_none: bool | None = None) -> Any:
        """A plain TensorDict (not of the class) of cloned entries, as tensordict's."""
        out = TensorDict.to_tensordict(self, retain_none=retain_none)
        if type(out) is not TensorDict:
            plain = TensorDict._new_unchecked(out.batch_size, out.device)
            plain._tensordict = out._tensordict
            return plain
        return out
