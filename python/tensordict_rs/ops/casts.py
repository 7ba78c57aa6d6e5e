"""Casts of every tensor leaf: ``float16`` ... ``complex128``, ``float``/``double``/``half``/
``bfloat16``/``int``/``long``/``bool``, the deprecated quantized casts, and ``type``.

Each cast maps the leaves through ``map_leaves`` (a new tree, locked like its source);
``cast_filter(key, leaf)`` chooses the leaves to cast and keeps the others as they are.
``CASTS`` is the table ``tensordict.py`` sets on TensorDict.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from .._core.nodes import NTD_TYPES, TD, TreeNode
from .._core.nontensor import NonTensorStack
from .._core.walk import map_leaves
from .pointwise import _documented


def _cast(dtype: torch.dtype, name: str) -> Callable[..., TD]:
    def method(td: TD, *, cast_filter: Callable[..., bool] | None = None) -> TD:
        if cast_filter is None:
            return map_leaves(td, lambda t: t.to(dtype), lock=True)
        return _cast_filtered(td, dtype, cast_filter, ())

    return _documented(
        method,
        name,
        f"Every tensor leaf cast to ``{dtype}`` (a new TensorDict). ``cast_filter(key, leaf)`` "
        "(key: a tuple) chooses the leaves to cast; the others are kept as they are.\n\n"
        "    >>> import torch\n    >>> from tensordict_rs import TensorDict\n"
        "    >>> td = TensorDict({'x': torch.tensor([1.5, 2.0])}, [2])\n" + _cast_call(name, dtype),
    )


def _cast_call(name: str, dtype: torch.dtype) -> str:
    """The example's call: torch warns that complex32 is experimental, which doctests (warnings as
    errors) would take for a failure."""
    if dtype is not torch.complex32:
        return f"    >>> td.{name}()['x'].dtype\n    {dtype}\n"
    return (
        "    >>> import warnings\n    >>> with warnings.catch_warnings():\n"
        "    ...     warnings.simplefilter('ignore')  # torch: ComplexHalf is experimental\n"
        f"    ...     out = td.{name}()\n    >>> out['x'].dtype\n    {dtype}\n"
    )


def _cast_filtered(
    td: TD,
    dtype: Any,
    keep: Callable[..., bool],
    prefix: tuple[str, ...],
    method: str = "to",
) -> TD:
    out = type(td)._new_unchecked(td._batch_size, td._device)
    for key in list(td._tensordict):
        value = td._get_str(key)
        if isinstance(value, TreeNode):
            out._tensordict[key] = _cast_filtered(value, dtype, keep, (*prefix, key), method)  # type: ignore[arg-type]
        elif type(value) in NTD_TYPES or type(value) is NonTensorStack:
            out._tensordict[key] = value.clone(recurse=False)
        else:
            keep_it = keep((*prefix, key), value)
            out._tensordict[key] = getattr(value, method)(dtype) if keep_it else value
    if td._is_locked:
        out._lock_tree()
    return out


def type_(
    td: TD, dst_type: torch.dtype | str, *, cast_filter: Callable[..., bool] | None = None
) -> TD:
    """Every tensor leaf cast with ``Tensor.type(dst_type)`` (a dtype or a name such as
    ``"torch.IntTensor"``). A locked TensorDict gives an unlocked result with a FutureWarning,
    as in tensordict 0.15.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"x": torch.tensor([1.5])}, [1]).type(torch.int32)["x"]
    tensor([1], dtype=torch.int32)
    """
    if td.is_locked:
        warnings.warn(
            "type() returns an unlocked tensordict for a locked one. Starting with TensorDict "
            "0.17, the default will change to a locked result, as int(), float() and "
            "to(dtype) return.",
            FutureWarning,
            stacklevel=2,
        )
    if cast_filter is None:
        return map_leaves(td, lambda t: t.type(dst_type))
    out = _cast_filtered(td, dst_type, cast_filter, (), method="type")
    out._unlock_tree() if out.is_locked else None
    return out


def _quantized(dtype: torch.dtype, name: str) -> Callable[..., TreeNode]:
    cast = _cast(dtype, name)

    def method(td: TreeNode, *, cast_filter: Callable[..., bool] | None = None) -> TreeNode:
        warnings.warn(
            f"TensorDictBase.{name}() is deprecated and will be removed in TensorDict 0.18. "
            "Use td.apply(lambda x: torch.quantize_per_tensor(x, scale, zero_point, "
            f"torch.{name})) instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return cast(td, cast_filter=cast_filter)

    return _documented(
        method,
        name,
        f"Deprecated (as in tensordict 0.15): casts every leaf to ``torch.{name}``, which torch "
        "refuses for plain tensors; quantize with ``torch.quantize_per_tensor`` instead, as the "
        "deprecation warning says:\n\n"
        "    >>> import torch, warnings\n    >>> from tensordict_rs import TensorDict\n"
        "    >>> td = TensorDict({'x': torch.tensor([1.5, 2.0])}, [2])\n"
        "    >>> with warnings.catch_warnings(record=True) as caught:\n"
        "    ...     warnings.simplefilter('always')\n"
        "    ...     try:\n"
        f"    ...         _ = td.{name}()\n"
        "    ...     except RuntimeError:  # torch: no quantized tensors from plain casts\n"
        "    ...         pass\n"
        "    >>> caught[0].category.__name__\n    'DeprecationWarning'\n",
    )


CASTS = {
    **{
        name: _cast(getattr(torch, name), name)
        for name in (
            "float16",
            "float32",
            "float64",
            "int8",
            "int16",
            "int32",
            "int64",
            "uint8",
            "uint16",
            "uint32",
            "uint64",
            "complex32",
            "complex64",
            "complex128",
        )
    },
    **{
        name: _quantized(getattr(torch, name), name)
        for name in ("qint8", "qint32", "quint8", "quint4x2")
    },
    "float": _cast(torch.float32, "float"),
    "double": _cast(torch.float64, "double"),
    "half": _cast(torch.float16, "half"),
    "bfloat16": _cast(torch.bfloat16, "bfloat16"),
    "int": _cast(torch.int32, "int"),
    "long": _cast(torch.int64, "long"),
    "bool": _cast(torch.bool, "bool"),
}
