"""``UnbatchedTensor``: a tensor entry without the batch dims, kept whole by batch operations.

A plain tensor entry's shape starts with its tree's batch size; an ``UnbatchedTensor`` may have
any shape. The shape operations of a tree (indexing, ``reshape``, ``unsqueeze``, ``stack``,
``cat``, ``split``...) keep the entry as it is (the same data) and only set its ``batch_size``
to the result's; element-wise operations (``int()``, ``to(device)``, ``ones_like``...) apply to
the payload and give an ``UnbatchedTensor`` again. As in tensordict 0.15 it is a
``torch.Tensor`` (a wrapper subclass over its payload): ``td["a"]`` can be used as a tensor.

Memory-mapped directories do not hold one: ``memmap``/``save`` refuse an ``UnbatchedTensor``
entry, naming the key, as tensordict 0.15.3 does (its loader has no record of one, so the entry
would come back as a plain tensor that breaks the batch-size rule).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar, Self

import numpy as np
import torch

__all__ = ["UnbatchedTensor", "is_unbatched", "with_batch_size"]


def is_unbatched(value: Any) -> bool:
    """True for an ``UnbatchedTensor`` (a value whose class says ``_pass_through``)."""
    cls = type(value)
    return cls is not torch.Tensor and bool(getattr(cls, "_pass_through", False))


def with_batch_size(value: UnbatchedTensor, batch_size: Sequence[int]) -> UnbatchedTensor:
    """An alias of ``value`` (same payload, same data) whose ``batch_size`` is ``batch_size``."""
    out = value.copy()
    out.batch_size = torch.Size(batch_size)
    return out


def _batch_size_of(args: Any) -> torch.Size | None:
    """The batch size of the first ``UnbatchedTensor`` found in ``args`` (lists, tuples and
    dicts searched), None if there is none with a batch size."""
    if isinstance(args, UnbatchedTensor):
        return args._batch_size
    if isinstance(args, dict):
        args = list(args.values())
    if isinstance(args, (list, tuple)):
        for item in args:
            found = _batch_size_of(item)
            if found is not None:
                return found
    return None


def _unwrap(value: Any) -> Any:
    if isinstance(value, UnbatchedTensor):
        return value._data
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(item) for item in value)
    if isinstance(value, dict):
        return {key: _unwrap(item) for key, item in value.items()}
    return value


class UnbatchedTensor(torch.Tensor):
    """A tensor entry that has no batch dimensions and that batch operations leave unchanged.

    Use it for an entry that belongs to the whole batch: a lookup table, model parameters, a
    mask shared by every element. In a TensorDict, indexing and the shape operations
    (``reshape``, ``unsqueeze``, ``transpose``, ``stack``, ``cat``, ``split``...) return the
    entry with its data and shape unchanged, its ``batch_size`` set to the result's; other
    operations (arithmetic, ``clone``, ``to``...) apply to the payload and return an
    ``UnbatchedTensor``. ``auto_batch_size_`` ignores it. ``data`` that is not a tensor goes
    through ``torch.as_tensor``; ``batch_size`` is the batch size of the tree that holds it
    (set by the tree; it does not change the payload's shape).

    >>> import torch
    >>> from tensordict_rs import TensorDict, UnbatchedTensor
    >>> td = TensorDict(a=UnbatchedTensor(torch.zeros(3, 4)), b=torch.zeros(2, 3), batch_size=[2])
    >>> td[0]["a"].shape, td.reshape(1, 2)["a"].batch_size
    (torch.Size([3, 4]), torch.Size([1, 2]))
    """

    _pass_through: ClassVar[bool] = True
    _data: torch.Tensor
    _batch_size: torch.Size | None

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @staticmethod
    def __new__(cls, data: Any, batch_size: Sequence[int] | None = None) -> UnbatchedTensor:
        """Wraps ``data`` (its payload, not copied)."""
        if isinstance(data, UnbatchedTensor):
            return data if batch_size is None else with_batch_size(data, batch_size)
        if not isinstance(data, torch.Tensor):
            data = torch.as_tensor(data)
        kwargs: dict[str, Any] = {}
        if data.layout == torch.strided:
            kwargs["strides"] = data.stride()
            kwargs["storage_offset"] = data.storage_offset()
        out: UnbatchedTensor = torch.Tensor._make_wrapper_subclass(
            cls,
            data.shape,
            dtype=data.dtype,
            layout=data.layout,
            device=data.device,
            requires_grad=data.requires_grad,
            **kwargs,
        )
        out._data = data
        out._batch_size = None if batch_size is None else torch.Size(batch_size)
        return out

    def __init__(self, data: Any, batch_size: Sequence[int] | None = None) -> None:
        """See the class docstring (the work is done in ``__new__``)."""

    @property
    def batch_size(self) -> torch.Size:
        """The batch size of the tree that holds this entry (``[]`` when it was never set)."""
        batch = getattr(self, "_batch_size", None)
        return torch.Size() if batch is None else batch

    @batch_size.setter
    def batch_size(self, value: Sequence[int]) -> None:
        self._batch_size = torch.Size(value)

    def copy(self) -> Self:
        """An alias: a new ``UnbatchedTensor`` over the same payload, same batch size."""
        out = type(self)(self._data)
        out._batch_size = getattr(self, "_batch_size", None)
        return out

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # (torch types it as a function)
        cls,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Runs ``func`` on the payloads and wraps the tensors it returns (same batch size)."""
        batch = _batch_size_of(args)
        if batch is None and kwargs:
            batch = _batch_size_of(kwargs)
        result = func(*_unwrap(tuple(args)), **_unwrap(kwargs or {}))

        def wrap(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return cls(value, batch)
            return value

        if isinstance(result, (tuple, list)):
            return type(result)(wrap(item) for item in result)
        return wrap(result)

    def __tensor_flatten__(self) -> tuple[list[str], dict[str, Any]]:
        """The payload and the batch size (for torch.compile)."""
        return ["_data"], {"batch_size": getattr(self, "_batch_size", None)}

    @classmethod
    def __tensor_unflatten__(
        cls, inner: dict[str, torch.Tensor], meta: dict[str, Any] | None, size: Any, stride: Any
    ) -> UnbatchedTensor:
        """The inverse of ``__tensor_flatten__``."""
        return cls(inner["_data"], None if meta is None else meta.get("batch_size"))

    def data_ptr(self) -> int:
        """The address of the payload's first element, as ``torch.Tensor.data_ptr``."""
        return self._data.data_ptr()

    def untyped_storage(self) -> torch.UntypedStorage:
        """The payload's storage, as ``torch.Tensor.untyped_storage``."""
        return self._data.untyped_storage()

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
        return f"UnbatchedTensor({self._data!r})"

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (UnbatchedTensor, (self._data, self.batch_size))

    # Python conversions answer as the payload's would (same results, same errors)
    def __str__(self) -> str:
        return str(self._data)

    def __format__(self, format_spec: str) -> str:
        return self._data.__format__(format_spec)

    def __bool__(self) -> bool:
        return bool(self._data)

    def __int__(self) -> int:
        return int(self._data)

    def __float__(self) -> float:
        return float(self._data)

    def __complex__(self) -> complex:
        return complex(self._data)

    def __index__(self) -> int:
        return self._data.__index__()

    def __round__(self, ndigits: int | None = None) -> Any:
        payload: Any = self._data  # (torch's stubs give Tensor no __round__/__trunc__)
        return round(payload) if ndigits is None else round(payload, ndigits)

    def __trunc__(self) -> Any:
        payload: Any = self._data
        return math.trunc(payload)

    def __floor__(self) -> Any:
        return math.floor(self._data)

    def __ceil__(self) -> Any:
        return math.ceil(self._data)

    def __array__(self, dtype: Any = None) -> np.ndarray[Any, Any]:
        return self._data.__array__(dtype)

    def item(self) -> Any:
        """The payload's single value as a Python number."""
        return self._data.item()

    def numpy(self, *, force: bool = False) -> np.ndarray[Any, Any]:
        """The payload as a NumPy array."""
        return self._data.numpy(force=force)

    def tolist(self) -> Any:
        """The payload as (nested) Python lists."""
        return self._data.tolist()

    # vmap: a TensorDict's vmap takes the batch dim out of (and puts it back in) the batch size
    def _add_batch_dim(self, *, in_dim: int, vmap_level: int) -> UnbatchedTensor:
        batch = list(self.batch_size)
        if in_dim < 0 and batch:
            in_dim %= len(batch)
        return with_batch_size(self, batch[:in_dim] + batch[in_dim + 1 :])

    def _maybe_remove_batch_dim(
        self, funcname: Any = None, *, vmap_level: int, batch_size: int, out_dim: int | None
    ) -> UnbatchedTensor:
        if out_dim is None:
            return self
        batch = list(self.batch_size)
        if out_dim < 0:
            out_dim %= len(batch) + 1
        batch.insert(out_dim, batch_size)
        return with_batch_size(self, batch)

    @classmethod
    def _stack_non_tensor(
        cls, values: Sequence[UnbatchedTensor], dim: int = 0, raise_if_non_unique: bool = False
    ) -> UnbatchedTensor:
        """The stack of the entries of stacked trees: the first one (warns when the others hold
        other data), its batch size grown by the new dim."""
        first = values[0]
        others = [other for other in values[1:] if other is not first]
        if others:
            ptr = first.data_ptr()
            if any(other.data_ptr() != ptr for other in others):
                warnings.warn(
                    "Stacking UnbatchedTensors with different data storage. Only the first "
                    "element's data will be kept. UnbatchedTensor is shape-invariant; if you "
                    "need different data per batch element, consider using a regular tensor.",
                    stacklevel=3,
                )
        batch = list(first.batch_size)
        if dim < 0:
            dim += len(batch) + 1
        batch.insert(dim, len(values))
        return with_batch_size(first, batch)


# ---------------------------------------------------------------- torch.vmap
# torch.vmap batches every tensor leaf of its inputs along ``in_dims`` and unbatches every
# tensor it returns. An UnbatchedTensor is a tensor whose batch dims are in ``batch_size``, not
# in its payload: these three wrappers over torch's vmap steps read the mapped size from the
# batch size, take the dim out of it on the way in and put it back on the way out (the payload
# untouched), as tensordict 0.15 does. Calls without an UnbatchedTensor go to torch's own steps.


_VMAP_STEPS: dict[str, Any] = {}  # torch's steps that the wrappers replaced (once)


def _install_vmap_steps() -> None:
    try:
        import torch._functorch.vmap as steps
        from torch.utils._pytree import tree_flatten, tree_unflatten
    except ImportError:  # a torch without these private steps: vmap sees a plain tensor
        return
    names = ("_process_batched_inputs", "_add_batch_dim", "_maybe_remove_batch_dim")
    if not all(hasattr(steps, name) for name in names) or _VMAP_STEPS:
        return
    process, add_dim, remove_dim = (getattr(steps, name) for name in names)

    def process_batched_inputs(in_dims: Any, args: Any, func: Any) -> Any:
        flat, spec = tree_flatten(args)
        if not any(type(arg) is UnbatchedTensor for arg in flat):
            return process(in_dims, args, func)
        # torch checks in_dims and reads the mapped size from a stand-in of the batch shape
        originals: dict[int, UnbatchedTensor] = {}
        stand_ins = []
        for arg in flat:
            if type(arg) is UnbatchedTensor:
                stand_in = torch.zeros((), dtype=torch.bool).expand(arg.batch_size)
                originals[id(stand_in)] = arg
                arg = stand_in
            stand_ins.append(arg)
        size, flat_in_dims, flat_args, _ = process(in_dims, tree_unflatten(stand_ins, spec), func)
        flat_args = [originals.get(id(arg), arg) for arg in flat_args]
        return size, flat_in_dims, flat_args, spec  # the inputs' own structure

    def add_batch_dim(arg: Any, in_dim: int, vmap_level: int) -> Any:
        if type(arg) is UnbatchedTensor:
            return arg._add_batch_dim(in_dim=in_dim, vmap_level=vmap_level)
        return add_dim(arg, in_dim, vmap_level)

    def maybe_remove_batch_dim(
        name: str, output: Any, vmap_level: int, batch_size: int, out_dim: int | None
    ) -> Any:
        if type(output) is UnbatchedTensor:
            return output._maybe_remove_batch_dim(
                name, vmap_level=vmap_level, batch_size=batch_size, out_dim=out_dim
            )
        return remove_dim(name, output, vmap_level, batch_size, out_dim)

    wrappers = (process_batched_inputs, add_batch_dim, maybe_remove_batch_dim)
    for name, wrapper in zip(names, wrappers, strict=True):
        _VMAP_STEPS[name] = getattr(steps, name)  # torch's own, kept
        setattr(steps, name, wrapper)


_install_vmap_steps()
