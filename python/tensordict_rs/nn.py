"""``TensorDictParams``: a TensorDict of parameters that is also an ``nn.Module``.

Stored as a submodule of a model, its leaves are the model's parameters and buffers (so an
optimizer, ``model.to(...)``, ``model.state_dict()`` and ``model.parameters()`` see them), while
it reads and writes like the TensorDict it wraps (``params["0", "weight"]``,
``params.to_module(model)``, ``params.memmap(dir)``...). What
``TensorDict.from_module(model, as_module=True)`` returns.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils import _pytree

from ._core.walk import leaves as _walk_leaves
from .ops import pytree as _pytree_ops
from .ops.modules import register_module_class
from .tensordict import TensorDict

__all__ = ["TensorDictParams"]

_FLOATS = (torch.float16, torch.float32, torch.float64)


def _convert(value: torch.Tensor, no_convert: bool) -> torch.Tensor:
    """A Parameter for a float tensor (unless ``no_convert``), else the tensor (a buffer)."""
    if isinstance(value, nn.Parameter) or no_convert:
        return value
    if value.dtype in _FLOATS:
        return nn.Parameter(value, requires_grad=True)
    return value


class TensorDictParams(nn.Module):
    """A TensorDict whose leaves are registered as the parameters (``nn.Parameter`` leaves)
    and buffers (the other tensors) of this module.

    ``no_convert=False`` (the default) turns float16/32/64 tensors into Parameters; other
    tensors are buffers. TensorDict methods are forwarded to the wrapped TensorDict; writes
    (``params[key] = value``) convert and register the new leaf. ``map`` is refused, as in
    tensordict (convert with ``to_tensordict()`` first).

    >>> import torch
    >>> from torch import nn
    >>> from tensordict_rs import TensorDict
    >>> from tensordict_rs.nn import TensorDictParams
    >>> module = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4))
    >>> holder = nn.Module()
    >>> holder.params = TensorDictParams(TensorDict.from_module(module))
    >>> [name for name, _ in holder.named_parameters()]
    ['params.0.weight', 'params.0.bias', 'params.1.weight', 'params.1.bias']
    >>> holder.params["other"] = torch.randn(3)
    >>> isinstance(holder.params["other"], nn.Parameter)
    True
    """

    _param_td: TensorDict

    def __init__(
        self,
        parameters: TensorDict | dict[str, Any] | None = None,
        *,
        no_convert: bool = False,
        lock: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if parameters is None:
            parameters = TensorDict(kwargs)
        elif kwargs:
            raise TypeError("parameters and keyword entries are exclusive")
        elif not isinstance(parameters, TensorDict):
            parameters = TensorDict(parameters)
        td = parameters
        if not no_convert:
            was_locked = td.is_locked
            if was_locked:
                td.unlock_()
            for node, key, value in list(_walk_leaves(td)):
                node._tensordict[key] = _convert(value, no_convert)
            if was_locked:
                td.lock_()
        object.__setattr__(self, "_param_td", td)
        self.no_convert = no_convert
        self._lock_content = lock
        if lock:
            td.lock_()
        self._reset_params()

    def _reset_params(self) -> None:
        """Registers every leaf of the TensorDict, under its "."-joined key."""
        self._parameters.clear()
        self._buffers.clear()
        for key, value in self._param_td.items(include_nested=True, leaves_only=True):
            name = ".".join(key) if isinstance(key, tuple) else key
            if isinstance(value, nn.Parameter):
                self._parameters[name] = value
            elif isinstance(value, torch.Tensor):
                self._buffers[name] = value

    # the TensorDict side -------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        td = self.__dict__.get("_param_td")
        if td is None:
            raise AttributeError(name)
        attr = getattr(td, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def forwarded(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            if result is not td:
                return result
            self._reset_params()  # in place (keys may have changed): this module, as there
            return self

        forwarded.__name__ = getattr(attr, "__name__", name)
        forwarded.__doc__ = getattr(attr, "__doc__", None)
        return forwarded

    def __getitem__(self, index: Any) -> Any:
        return self._param_td[index]

    # operators (Python looks them up on the class, never through __getattr__): those of the
    # wrapped TensorDict, giving TensorDicts, as tensordict's TensorDictParams
    __hash__ = nn.Module.__hash__  # a module: hashable by identity despite ``==``

    def __eq__(self, other: object) -> Any:  # type: ignore[override]
        return self._param_td == other

    def __ne__(self, other: object) -> Any:  # type: ignore[override]
        return self._param_td != other

    # ``with params.unlock_():`` (an in-place method returns this module): the TensorDict's
    # context, which undoes the operation on exit
    def __enter__(self) -> TensorDictParams:
        self._param_td.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._param_td.__exit__(*exc)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.set(key, value)

    def __delitem__(self, key: Any) -> None:
        del self._param_td[key]
        self._reset_params()

    def set(self, key: Any, value: Any, **kwargs: Any) -> TensorDictParams:
        """Sets ``key`` (converted to a Parameter or a buffer) and registers it."""
        if isinstance(value, torch.Tensor):
            value = _convert(value, self.no_convert)
        locked = self._param_td.is_locked
        if locked and key not in self._param_td:
            self._param_td.unlock_()
            try:
                self._param_td.set(key, value, **kwargs)
            finally:
                self._param_td.lock_()
        else:
            self._param_td.set(key, value, **kwargs)
        self._reset_params()
        return self

    def __iter__(self) -> Any:
        return iter(self._param_td)

    def __len__(self) -> int:
        return len(self._param_td)

    def __contains__(self, key: object) -> bool:
        return key in self._param_td

    def keys(self, *args: Any, **kwargs: Any) -> Any:
        """The keys of the wrapped TensorDict."""
        return self._param_td.keys(*args, **kwargs)

    def values(self, *args: Any, **kwargs: Any) -> Any:
        """The values of the wrapped TensorDict."""
        return self._param_td.values(*args, **kwargs)

    def items(self, *args: Any, **kwargs: Any) -> Any:
        """The items of the wrapped TensorDict."""
        return self._param_td.items(*args, **kwargs)

    def to_tensordict(self, *, retain_none: bool | None = None) -> TensorDict:
        """A plain TensorDict copy of the parameters."""
        return self._param_td.to_tensordict(retain_none=retain_none)

    def to_module(self, module: nn.Module, **kwargs: Any) -> Any:
        """``TensorDict.to_module`` of the wrapped TensorDict."""
        return self._param_td.to_module(module, **kwargs)

    def map(self, *args: Any, **kwargs: Any) -> Any:
        """Refused, as in tensordict: convert with ``to_tensordict()`` first."""
        raise RuntimeError(
            "Cannot call map on a TensorDictParams object. Convert it to a detached tensordict "
            "first (``tensordict.data``) and call map on that."
        )

    map_iter = map

    @property
    def batch_size(self) -> torch.Size:
        """The batch size of the wrapped TensorDict."""
        return self._param_td.batch_size

    @property
    def data(self) -> TensorDict:
        """The ``.data`` of the parameters, a TensorDict (no autograd)."""
        return self._param_td.data

    # the module side ------------------------------------------------------------------

    def _apply(self, fn: Any, recurse: bool = True) -> TensorDictParams:
        """``module.to(...)``, ``.double()``, ...: the TensorDict's leaves follow."""
        super()._apply(fn, recurse)
        moved = {**self._parameters, **self._buffers}
        td = self._param_td
        locked = td.is_locked
        if locked:
            td.unlock_()
        try:
            for key in list(td.keys(include_nested=True, leaves_only=True)):
                name = ".".join(key) if isinstance(key, tuple) else key
                if name in moved:
                    td.set(key, moved[name])
        finally:
            if locked:
                td.lock_()
        return self

    def __repr__(self) -> str:
        return f"TensorDictParams(params={self._param_td!r})"


register_module_class(TensorDictParams)


def _operator(name: str) -> Any:
    def method(self: TensorDictParams, *args: Any) -> Any:
        return getattr(self._param_td, name)(*args)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``{name}`` of the wrapped TensorDict (a TensorDict)."
    return method


for _name in (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__floordiv__", "__mod__", "__pow__", "__neg__", "__abs__", "__invert__",
    "__and__", "__or__", "__xor__", "__lt__", "__le__", "__gt__", "__ge__",
):  # fmt: skip
    setattr(TensorDictParams, _name, _operator(_name))


def _params_flatten(params: TensorDictParams) -> tuple[list[Any], Any]:
    return _pytree_ops._flatten(params._param_td)


def _params_flatten_with_keys(params: TensorDictParams) -> tuple[list[tuple[Any, Any]], Any]:
    return _pytree_ops._flatten_with_keys(params._param_td)


# a pytree node too, so that ``torch.vmap(fn, (0, None))(params, x)`` over
# ``TensorDict.from_modules(..., as_module=True)`` sees the stacked leaves (the ensembling
# recipe); inside the transform it is the TensorDict of those leaves
_pytree.register_pytree_node(
    TensorDictParams,
    _params_flatten,
    _pytree_ops._unflatten,
    serialized_type_name=f"{TensorDictParams.__module__}.TensorDictParams",
    flatten_with_keys_fn=_params_flatten_with_keys,
)
