"""The process-wide options of tensordict 0.15: whether stacking identical non-tensor values
captures them in one ``NonTensorData`` (``set_capture_non_tensor_stack``) and whether a list set
into a tree becomes a ``NonTensorStack`` (``set_list_to_stack``), each a context manager, a
decorator, or ``.set()`` for the rest of the program, kept in step with its environment
variable so that child processes see the same mode; and whether ``td.get(key)`` without a
default gives ``None`` for a missing key (``set_get_defaults_to_none``, a plain function)."""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any


class _Option:
    """A process-wide flag set by a context manager / decorator (``set_...(mode)``), or for the
    rest of the program with ``.set()``; its environment variable gives the first value and is
    kept in step, so that child processes see the same mode."""

    def __init__(self, env: str, default: bool) -> None:
        self.env = env
        self.default = default
        raw = os.environ.get(env)
        self.value: bool | None = None if raw is None else _strtobool(raw, default)

    def get(self, allow_none: bool) -> bool | None:
        if self.value is None:
            return None if allow_none else self.default
        return self.value


def _strtobool(text: str, default: bool) -> bool:
    lowered = text.strip().lower()
    if lowered in ("y", "yes", "t", "true", "on", "1"):
        return True
    if lowered in ("n", "no", "f", "false", "off", "0"):
        return False
    return default


_CAPTURE = _Option("CAPTURE_NONTENSOR_STACK", False)
_LIST_TO_STACK = _Option("LIST_TO_STACK", True)


class _SetOption:
    """Context manager, decorator and ``.set()`` for an ``_Option``."""

    _option: _Option
    _deprecated_mode: bool
    _name: str
    _replacement: str

    def __init__(self, mode: bool) -> None:
        self.mode = bool(mode)
        self._old: list[tuple[bool | None, str | None]] = []
        if self.mode == self._deprecated_mode:
            warnings.warn(
                f"{self._name}({self.mode}) is deprecated and will be removed in TensorDict 0.17 "
                f"(as in tensordict 0.15); use {self._replacement} instead.",
                DeprecationWarning,
                stacklevel=2,
            )

    def set(self) -> None:
        """Applies the mode for the rest of the program."""
        self._option.value = self.mode
        os.environ[self._option.env] = str(self.mode)

    def __enter__(self) -> None:
        self._old.append((self._option.value, os.environ.get(self._option.env)))
        self.set()

    def __exit__(self, *exc: object) -> None:
        value, env = self._old.pop()
        self._option.value = value
        if env is None:
            os.environ.pop(self._option.env, None)
        else:
            os.environ[self._option.env] = env

    def __call__(self, fn: Any) -> Any:
        mode, cls = self.mode, type(self)

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            manager = cls.__new__(cls)
            manager.mode, manager._old = mode, []
            with manager:
                return fn(*args, **kwargs)

        return wrapped


class set_capture_non_tensor_stack(_SetOption):
    """Sets whether stacking identical non-tensor values gives one ``NonTensorData`` instead of
    a ``NonTensorStack`` (default ``False``: a stack, as in tensordict 0.15; ``True`` is
    deprecated there and warns here too). A context manager, a decorator, or ``.set()``.

    >>> import torch
    >>> from tensordict_rs import NonTensorData
    >>> with set_capture_non_tensor_stack(False):
    ...     stack = torch.stack([NonTensorData("a"), NonTensorData("a")])
    >>> type(stack).__name__, stack.data
    ('NonTensorStack', 'a')
    """

    _option = _CAPTURE
    _deprecated_mode = True
    _name = "set_capture_non_tensor_stack"
    _replacement = "NonTensorStack.data to get the single value of a stack of identical values"


def capture_non_tensor_stack(allow_none: bool = False) -> bool | None:
    """Whether stacking identical non-tensor values gives one value (see
    ``set_capture_non_tensor_stack``); ``None`` when never set and ``allow_none``.

    >>> capture_non_tensor_stack()
    False
    """
    return _CAPTURE.get(allow_none)


class set_list_to_stack(_SetOption):
    """Sets whether ``td[key] = a_list`` stores a ``NonTensorStack`` (default ``True``) or one
    ``NonTensorData`` holding the list (``False``: deprecated in tensordict 0.15, warns here
    too; use ``td.set_non_tensor(key, value)``). A context manager, a decorator, or ``.set()``.

    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict(batch_size=[2])
    >>> with set_list_to_stack(True):
    ...     td["x"] = ["a", "b"]
    >>> type(td.get("x")).__name__
    'NonTensorStack'
    """

    _option = _LIST_TO_STACK
    _deprecated_mode = False
    _name = "set_list_to_stack"
    _replacement = "td.set_non_tensor(key, value) to store a list as one value"


def list_to_stack(allow_none: bool = False) -> bool | None:
    """Whether assigning a list stores a ``NonTensorStack`` (see ``set_list_to_stack``).

    >>> list_to_stack()
    True
    """
    return _LIST_TO_STACK.get(allow_none)


# ---------------------------------------------------------------------- shared values


_GET_DEFAULTS_TO_NONE = _Option("TD_GET_DEFAULTS_TO_NONE", True)
_GET_REPLACEMENT = "td[key] to raise a KeyError for a missing key"


def set_get_defaults_to_none(set_to_none: bool = True) -> None:
    """Sets whether ``td.get(key)`` without a default returns ``None`` for a missing key (the
    default, as in tensordict since 0.7) or raises ``KeyError``. Deprecated in tensordict 0.15
    (and warns here too): ``td[key]`` raises for a missing key.

    >>> import warnings; from tensordict_rs import TensorDict
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     set_get_defaults_to_none(True)
    >>> TensorDict().get("missing") is None
    True
    """
    warnings.warn(
        "set_get_defaults_to_none() is deprecated and will be removed in TensorDict 0.17 (as in "
        f"tensordict 0.15); use {_GET_REPLACEMENT} instead.",
        DeprecationWarning,
        stacklevel=2,
    )
    _GET_DEFAULTS_TO_NONE.value = bool(set_to_none)
    os.environ[_GET_DEFAULTS_TO_NONE.env] = str(bool(set_to_none))


def get_defaults_to_none(set_to_none: bool = True) -> bool:
    """Whether ``td.get(key)`` returns ``None`` for a missing key (``set_to_none`` is ignored,
    as in tensordict). Deprecated in tensordict 0.15, and warns here too.

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     get_defaults_to_none()
    True
    """
    del set_to_none
    warnings.warn(
        "get_defaults_to_none() is deprecated and will be removed in TensorDict 0.17 (as in "
        f"tensordict 0.15); use {_GET_REPLACEMENT} instead.",
        DeprecationWarning,
        stacklevel=2,
    )
    return bool(_GET_DEFAULTS_TO_NONE.get(False))


def get_returns_none() -> bool:
    """The option ``TensorDict.get`` reads (no warning)."""
    return bool(_GET_DEFAULTS_TO_NONE.get(False))
