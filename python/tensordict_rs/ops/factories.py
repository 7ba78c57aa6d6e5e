"""New trees shaped like an existing one: ``new_zeros``, ``new_ones``, ``new_full``,
``new_empty``, ``new_tensor``, ``copy``, and ``from_schema``.

Each maps every leaf to a new tensor of batch size ``size`` that keeps the leaf's own dims, its
dtype and device (unless given), through ``map_leaves``.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, cast

import torch

from .._core.nodes import TD, TreeNode
from .._core.nontensor import NonTensorStack
from .._core.walk import copy_tree, map_leaves
from . import as_classmethod

_KEEP: Any = object()


def _size(size: tuple[Any, ...]) -> list[int]:
    if len(size) == 1 and isinstance(size[0], Iterable) and not isinstance(size[0], torch.Tensor):
        size = tuple(size[0])
    return [operator.index(s) for s in size]


def _resized_stacks(batch: list[int], n: int) -> Any:
    """The non-tensor map of a factory: a ``NonTensorStack`` becomes a stack of the new batch
    size (its own extra dims kept) holding its first value everywhere, as tensordict's
    ``new_zeros(..., empty_lazy=True)`` gives; a ``NonTensorData`` keeps its value."""

    def resize(value: Any, *_: Any) -> Any:
        if type(value) is not NonTensorStack:
            return value.clone(recurse=False)
        shape = (*batch, *value.batch_size[n:])
        count = 1
        for size in shape:
            count *= size
        first = value.values_flat()[:1] or [None]
        return NonTensorStack.from_values(first * count, shape, value.device)

    return resize


def _factory(name: str, fill: Any = None) -> Any:
    torch_fn = getattr(torch, name)

    def method(
        td: TreeNode,
        *size: Any,
        dtype: torch.dtype | None = None,
        device: Any = _KEEP,
        requires_grad: bool = False,
        layout: torch.layout = torch.strided,
        pin_memory: bool | None = None,
        empty_lazy: bool = False,
    ) -> TreeNode:
        del empty_lazy  # no lazy stacks here
        batch = _size(size)
        n = td.batch_dims

        def leaf(t: torch.Tensor) -> torch.Tensor:
            return torch_fn(
                (*batch, *t.shape[n:]),
                dtype=dtype or t.dtype,
                device=t.device if device is _KEEP else device,
                requires_grad=requires_grad,
                layout=layout,
                pin_memory=bool(pin_memory),
            )

        target = (
            td.device if device is _KEEP else (None if device is None else torch.device(device))
        )
        stacks = _resized_stacks(batch, n)
        return map_leaves(td, leaf, batch_size=batch, device=target, non_tensor=stacks)

    method.__name__ = method.__qualname__ = f"new_{name}"
    method.__doc__ = (
        f"A new TensorDict of ``torch.{name}`` leaves with batch size ``size`` (each leaf keeps "
        "its feature dims, dtype and device unless ``dtype``/``device`` are given).\n\n"
        "    >>> import torch\n    >>> from tensordict_rs import TensorDict\n"
        "    >>> td = TensorDict({'x': torch.ones(2, 3)}, [2])\n"
        f"    >>> td.new_{name}(4)['x'].shape\n    torch.Size([4, 3])\n"
    )
    return method


new_zeros = _factory("zeros")
new_ones = _factory("ones")
new_empty = _factory("empty")


def new_full(
    td: TD,
    size: Any,
    fill_value: Any,
    *,
    dtype: torch.dtype | None = None,
    device: Any = _KEEP,
    requires_grad: bool = False,
    layout: torch.layout = torch.strided,
    pin_memory: bool | None = None,
    empty_lazy: bool = False,
) -> TD:
    """A TensorDict of batch size ``size`` whose every leaf (own dims and dtype kept) is
    filled with ``fill_value``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(3, 2)}, [3]).new_full((2,), 7.0)["a"]
    tensor([[7., 7.],
            [7., 7.]])
    """
    del empty_lazy
    batch = _size((size,))
    n = td.batch_dims

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return torch.full(
            (*batch, *t.shape[n:]),
            fill_value,
            dtype=dtype or t.dtype,
            device=t.device if device is _KEEP else device,
            requires_grad=requires_grad,
            layout=layout,
            pin_memory=bool(pin_memory),
        )

    target = td.device if device is _KEEP else (None if device is None else torch.device(device))
    stacks = _resized_stacks(batch, n)
    return map_leaves(td, leaf, batch_size=batch, device=target, non_tensor=stacks)


def new_tensor(
    td: TD,
    data: Any,
    *,
    dtype: torch.dtype | None = None,
    device: Any = _KEEP,
    requires_grad: bool = False,
    pin_memory: bool | None = None,
) -> TD:
    """A TensorDict whose every leaf is ``leaf.new_tensor(data)``: a copy of ``data`` (or of
    the matching leaf of a TensorDict ``data``) with the leaf's dtype; the batch size is
    ``data``'s shape.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict(a=torch.zeros(3), b=torch.zeros(3, dtype=torch.int64), batch_size=[3])
    >>> out = td.new_tensor([1, 2])
    >>> out.batch_size, out["a"], out["b"]
    (torch.Size([2]), tensor([1., 2.]), tensor([1, 2]))
    """
    kwargs: dict[str, Any] = {"requires_grad": requires_grad}
    if pin_memory:
        kwargs["pin_memory"] = True
    if device is not _KEEP:
        kwargs["device"] = device
    if isinstance(data, TreeNode):

        def pair(t: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
            return t.new_tensor(d, dtype=dtype or t.dtype, **kwargs)

        batch = data.batch_size
        target = data.device if device is _KEEP else device
        return map_leaves(td, pair, data, batch_size=batch, device=target)
    source = data if isinstance(data, torch.Tensor) else torch.as_tensor(data)

    def leaf(t: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings():  # torch's advice on copying a tensor: a copy is meant
            warnings.simplefilter("ignore", UserWarning)
            return t.new_tensor(source, dtype=dtype or t.dtype, **kwargs)

    if device is _KEEP:
        target = source.device  # a list becomes a CPU tensor: the tree is on CPU, as tensordict
    else:
        target = None if device is None else torch.device(device)
    return map_leaves(td, leaf, batch_size=source.shape, device=target)


def copy(td: TD) -> TD:
    """A shallow copy: new (nested) TensorDicts holding the same tensors (``copy.copy(td)``).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.ones(2)}}, [2])
    >>> c = td.copy()
    >>> c["a"] is td["a"], c["n"] is td["n"]
    (True, False)
    """
    return copy_tree(td)


def from_schema(
    cls: type[TD],
    schema: Mapping[Any, tuple[Any, torch.dtype]],
    *,
    batch_size: Any = None,
    storage: str | None = None,
    device: Any = None,
    **kwargs: Any,
) -> TD:
    """A zero-filled TensorDict from ``{key: (element_shape, dtype)}``: each entry has shape
    ``[*batch_size, *element_shape]``. ``storage``: ``None`` (plain tensors), ``"memmap"``
    (files under ``prefix=``, written without building the tree in memory first) or
    ``"shared"`` (shared memory).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict.from_schema({"a": ([3], torch.float32), ("n", "b"): ([], torch.int64)},
    ...                             batch_size=[4])
    >>> td["a"].shape, td["n", "b"].dtype
    (torch.Size([4, 3]), torch.int64)
    """
    batch = torch.Size([] if batch_size is None else batch_size)
    if storage not in (None, "memmap", "shared"):
        raise ValueError(
            f"Unknown storage backend {storage!r} for tensordict_rs: expected None, 'memmap' or "
            "'shared' (h5, zarr and key-value stores are not supported)."
        )
    td = cls({}, batch, device=device)
    for key, (shape, dtype) in schema.items():
        full = (*batch, *shape)
        if storage == "memmap":  # a stride-0 zero: memmap_like makes the files, nothing in memory
            td.set(key, torch.zeros((), dtype=dtype).expand(full))
        else:
            td.set(key, torch.zeros(full, dtype=dtype, device=device))
    if storage == "memmap":
        return cast(Any, td).memmap_like(**kwargs)  # io/ is above ops/: a TensorDict's method
    if kwargs:
        raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
    if storage == "shared":
        cast(Any, td).share_memory_()
    return td


class Factories(TreeNode):
    """``copy`` and the ``new_*`` factories of TensorDict (a mixin), and ``from_schema``."""

    copy = __copy__ = copy
    new_zeros = new_zeros
    new_ones = new_ones
    new_empty = new_empty
    new_full = new_full
    new_tensor = new_tensor
    from_schema = as_classmethod(from_schema)
