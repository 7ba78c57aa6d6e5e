"""``TensorDictParams``: a TensorDict of parameters that is also an ``nn.Module``.

Stored as a submodule of a model, its leaves are the model's parameters and buffers (so an
optimizer, ``model.to(...)``, ``model.state_dict()`` and ``model.parameters()`` see them), while
it reads and writes like the TensorDict it wraps (``params["0", "weight"]``,
``params.to_module(model)``, ``params.memmap(dir)``...). What
``TensorDict.from_module(model, as_module=True)`` returns.
"""

from __future__ import annotations

import builtins
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree

from ._core.walk import leaves as _walk_leaves
from ._core.walk import map_leaves as _map_leaves
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


def _wrap_like(value: torch.Tensor, before: Any) -> torch.Tensor:
    """A converted leaf (``to``, ``cpu``...) as the one it replaces: a Parameter (same
    ``requires_grad``) for a Parameter while floating point or complex, else a buffer."""
    if value is before:
        return value
    if isinstance(before, nn.Parameter) and (value.is_floating_point() or value.is_complex()):
        return nn.Parameter(value, requires_grad=before.requires_grad)
    return value


def _unwrapped(value: Any) -> Any:
    """``value`` (the arguments of a torch function) with each TensorDictParams, also in lists,
    tuples and dicts, replaced by its TensorDict."""
    if isinstance(value, TensorDictParams):
        return value._param_td
    if type(value) in (list, tuple):
        return type(value)(_unwrapped(item) for item in value)
    if type(value) is dict:
        return {key: _unwrapped(item) for key, item in value.items()}
    return value


class TensorDictParams(nn.Module):
    """A TensorDict whose leaves are registered as the parameters (``nn.Parameter`` leaves)
    and buffers (the other tensors) of this module.

    ``no_convert=False`` (the default) turns float16/32/64 tensors into Parameters; other
    tensors are buffers. TensorDict methods are forwarded to the wrapped TensorDict; writes
    (``params[key] = value``) convert and register the new leaf. ``map`` is refused, as in
    tensordict (convert with ``to_tensordict()`` first).

    The methods ``nn.Module`` shares with TensorDict are TensorDict's, as in tensordict:
    ``to``/``cpu``/``cuda`` and ``clone`` give a new TensorDictParams (new leaf Parameters),
    ``apply`` and the casts (``float()``, ``type()``...) a new TensorDict, leaving the
    parameters as they are; ``state_dict``/``load_state_dict`` use "."-joined keys; in-place
    writes (``zero_``, ``fill_``, ``update_``...) go through the leaves' ``.data``. A module
    holding it still converts it in place (``holder.to(torch.float64)``).

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

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """``torch.stack([params, params])``, ``torch.zeros_like(params)``...: the torch
        function over the wrapped TensorDicts (giving TensorDicts), as in tensordict."""
        return TensorDict.__torch_function__(func, types, _unwrapped(args), _unwrapped(kwargs))

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

    # the TensorDict methods ``nn.Module`` also has: as class attributes, the module's would
    # win over ``__getattr__``; they behave as tensordict's TensorDictParams ---------------

    def apply(self, fn: Any, *others: Any, inplace: bool = False, **kwargs: Any) -> Any:  # type: ignore[override]
        """``TensorDict.apply`` over the leaves: a new TensorDict of ``fn``'s results (this
        module and its parameters unchanged), as in tensordict; ``inplace=True`` writes the
        results into the leaves and returns this module. Not ``nn.Module.apply``."""
        if not inplace:
            return self._param_td.apply(fn, *_unwrapped(others), **kwargs)
        return self._write("apply", fn, *_unwrapped(others), inplace=True, **kwargs)

    def named_apply(self, fn: Any, *others: Any, inplace: bool = False, **kwargs: Any) -> Any:
        """``TensorDict.named_apply`` over the leaves, as ``apply``."""
        if not inplace:
            return self._param_td.named_apply(fn, *_unwrapped(others), **kwargs)
        return self._write("named_apply", fn, *_unwrapped(others), inplace=True, **kwargs)

    def _write(self, name: str, *args: Any, **kwargs: Any) -> TensorDictParams:
        """Calls the TensorDict method ``name`` (unlocked), then registers the leaves again."""
        td = self._param_td
        locked = td.is_locked
        if locked:
            td.unlock_()
        try:
            getattr(td, name)(*args, **kwargs)
        finally:
            if locked:
                td.lock_()
        self._reset_params()
        return self

    def to(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """``TensorDict.to``: a new TensorDictParams of the converted leaves (Parameters stay
        Parameters, with their ``requires_grad``, while they are floating point), or this
        module when nothing changes. This module and the source model are left as they were
        (``model.to(...)`` on a module holding it converts it in place)."""
        return self._converted(self._param_td.to(*args, **kwargs))

    def cpu(self, **kwargs: Any) -> Any:  # type: ignore[override]
        """``TensorDict.cpu``: a new TensorDictParams on the CPU, as ``to``."""
        return self._converted(self._param_td.cpu(**kwargs))

    def cuda(self, device: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        """``TensorDict.cuda``: a new TensorDictParams on a CUDA device, as ``to``."""
        return self._converted(self._param_td.cuda(device=device, **kwargs))

    def _converted(self, params: Any) -> Any:
        """The TensorDictParams of ``params``, what ``to`` gave for the wrapped TensorDict."""
        if params is self._param_td:
            return self
        if not isinstance(params, TensorDict):
            return params
        before = dict(self._param_td.items(include_nested=True, leaves_only=True))
        locked = params.is_locked
        if locked:
            params.unlock_()
        for key, value in list(params.items(include_nested=True, leaves_only=True)):
            if isinstance(value, torch.Tensor):
                params.set(key, _wrap_like(value, before.get(key)))
        if locked:
            params.lock_()
        out = TensorDictParams(params, no_convert=True)
        out.no_convert = self.no_convert
        return out

    def type(self, dst_type: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """``TensorDict.type``: a new TensorDict of the cast leaves (the parameters are left
        as they were), as in tensordict."""
        return self._param_td.type(dst_type, **kwargs)

    def float(self, **kwargs: Any) -> Any:  # type: ignore[override]
        """``TensorDict.float``: a new TensorDict of the cast leaves, as ``type``."""
        return self._param_td.float(**kwargs)

    def double(self, **kwargs: Any) -> Any:  # type: ignore[override]
        """``TensorDict.double``: a new TensorDict of the cast leaves, as ``type``."""
        return self._param_td.double(**kwargs)

    def half(self, **kwargs: Any) -> Any:  # type: ignore[override]
        """``TensorDict.half``: a new TensorDict of the cast leaves, as ``type``."""
        return self._param_td.half(**kwargs)

    def bfloat16(self, **kwargs: Any) -> Any:  # type: ignore[override]
        """``TensorDict.bfloat16``: a new TensorDict of the cast leaves, as ``type``."""
        return self._param_td.bfloat16(**kwargs)

    def requires_grad_(self, requires_grad: bool = True) -> TensorDictParams:
        """``TensorDict.requires_grad_``: every tensor leaf (buffers too: an integer one
        raises, as in tensordict); returns this module."""
        self._param_td.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> TensorDictParams:  # type: ignore[override]
        """``TensorDict.zero_grad``: resets the leaves' ``.grad``; returns this module."""
        self._param_td.zero_grad(set_to_none)
        return self

    def state_dict(  # type: ignore[override]
        self,
        destination: Any = None,
        prefix: str = "",
        keep_vars: bool = False,
        flatten: bool = True,
    ) -> Any:
        """``TensorDict.state_dict`` of the wrapped TensorDict ("."-joined keys by default, as
        a module's), also what a module holding this one gets for it."""
        return self._param_td.state_dict(
            destination=destination, prefix=prefix, keep_vars=keep_vars, flatten=flatten
        )

    def load_state_dict(  # type: ignore[override]
        self,
        state_dict: Any,
        strict: bool = True,
        assign: bool = False,
        from_flatten: bool | None = None,
    ) -> TensorDictParams:
        """Copies a state dict (flat, with "."-joined keys as ``state_dict`` gives, or nested)
        into the parameters in place; returns this module."""
        self._data_view().load_state_dict(
            state_dict, strict=strict, assign=assign, from_flatten=from_flatten is not False
        )
        return self

    def _load_from_state_dict(
        self,
        state_dict: Any,
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """``nn.Module``'s, for a module holding this one, with the leaves' "."-joined names as
        the local names (the module's rule took "0" of "0.weight" for a submodule and called
        every nested entry unexpected). ``assign=True`` copies too, as tensordict's (a module
        cannot assign a dotted name)."""
        ignored: list[str] = []
        local_metadata = {**local_metadata, "assign_to_params_buffers": False}
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, ignored, error_msgs
        )
        if strict:
            local = set(self._parameters) | set(self._buffers)
            unexpected_keys.extend(
                key
                for key in state_dict
                if key.startswith(prefix) and key[len(prefix) :] not in local
            )

    # copies: fresh leaf Parameters, as tensordict's (``clone`` of the TensorDict would give
    # tensors in the autograd graph of these parameters) ------------------------------

    def clone(self, recurse: bool = True) -> TensorDictParams:
        """A new TensorDictParams of new leaf Parameters (and buffers): copies of the data,
        out of the autograd graph (gradients do not reach these parameters), with their
        ``requires_grad``; a parameter found twice stays shared (tied) in the copy.
        ``recurse=False`` (``copy()``) shares the leaves instead."""
        if not recurse:
            out = TensorDictParams(self._param_td.clone(recurse=False), no_convert=True)
        else:
            memo: dict[int, torch.Tensor] = {}

            def fresh(value: torch.Tensor) -> torch.Tensor:
                result = memo.get(id(value))
                if result is None:
                    result = value.data.clone()
                    if isinstance(value, nn.Parameter):
                        result = nn.Parameter(result, requires_grad=value.requires_grad)
                    memo[id(value)] = result
                return result

            out = TensorDictParams(self._param_td.apply(fresh), no_convert=True)
        out.no_convert = self.no_convert
        return out

    def copy(self) -> TensorDictParams:
        """A new TensorDictParams sharing these parameters (``clone(recurse=False)``)."""
        return self.clone(recurse=False)

    # in-place writes into the leaves: through their ``.data``, as tensordict (a leaf that
    # requires grad refuses in-place operations) ----------------------------------------

    def _data_view(self) -> TensorDict:
        """The tree of the leaves' ``.data`` (same storage), the non-tensor entries shared."""
        return _map_leaves(self._param_td, lambda t: t.data, lock=True, non_tensor=lambda v: v)

    def _on_data(self, name: str, *args: Any, **kwargs: Any) -> TensorDictParams:
        getattr(self._data_view(), name)(*_unwrapped(args), **_unwrapped(kwargs))
        return self

    def zero_(self) -> TensorDictParams:
        """Zeros every leaf in place (through ``.data``); returns this module."""
        return self._on_data("zero_")

    def fill_(self, key: Any, value: builtins.float | bool) -> TensorDictParams:
        """Fills the entry at ``key`` in place (through ``.data``); returns this module."""
        return self._on_data("fill_", key, value)

    def apply_(self, fn: Any, *others: Any, **kwargs: Any) -> TensorDictParams:
        """``TensorDict.apply_`` on the leaves' ``.data``; returns this module."""
        return self._on_data("apply_", fn, *others, **kwargs)

    def copy_(self, tensordict: Any, non_blocking: bool = False) -> TensorDictParams:
        """Copies ``tensordict`` into the leaves (through ``.data``); returns this module."""
        return self._on_data("copy_", tensordict, non_blocking=non_blocking)

    def set_(self, key: Any, item: Any, **kwargs: Any) -> TensorDictParams:
        """``TensorDict.set_`` on the leaves' ``.data``; returns this module."""
        return self._on_data("set_", key, item, **kwargs)

    def set_at_(self, key: Any, value: Any, index: Any, **kwargs: Any) -> TensorDictParams:
        """``TensorDict.set_at_`` on the leaves' ``.data``; returns this module."""
        return self._on_data("set_at_", key, value, index, **kwargs)

    def update_(self, input_dict_or_td: Any = None, *args: Any, **kwargs: Any) -> TensorDictParams:
        """``TensorDict.update_`` on the leaves' ``.data``; returns this module."""
        return self._on_data("update_", input_dict_or_td, *args, **kwargs)

    def update_at_(
        self, input_dict_or_td: Any, idx: Any, *args: Any, **kwargs: Any
    ) -> TensorDictParams:
        """``TensorDict.update_at_`` on the leaves' ``.data``; returns this module."""
        return self._on_data("update_at_", input_dict_or_td, idx, *args, **kwargs)

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
