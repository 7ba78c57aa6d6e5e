"""Conversions to and from other containers: NumPy (``numpy``, structured arrays), nested
lists (``tolist``), named tuples, tuples, dataclasses, pytrees, lists of dicts (``from_list``),
``from_any``; and between leaves and one tensor (``cat_tensors``, ``stack_tensors``,
``cat_from_tensordict``, ``stack_from_tensordict``).

Semantics are tensordict 0.15.3's, tested side by side.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch

from .._core.linked_list import LinkedList
from .._core.nodes import NTD_TYPES, TD, NonTensorData, TreeNode
from .._core.nontensor import NonTensorStack
from .._core.walk import leaves, map_leaves
from . import as_classmethod
from .keys import _max_batch

_PYTREE_TYPE = "_pytree_type"


def _finish(
    td: TD,
    *,
    auto_batch_size: bool = False,
    batch_dims: int | None = None,
    device: Any = None,
    batch_size: Any = None,
) -> TD:
    """The common keyword arguments of the ``from_*`` constructors."""
    if auto_batch_size and batch_size is not None:
        raise TypeError("auto_batch_size and batch_size are exclusive.")
    if batch_size is not None:
        _set_batch(td, torch.Size(batch_size))
    elif auto_batch_size:
        _max_batch(td, batch_dims)
    elif batch_dims is not None:
        warnings.warn(
            "batch_dims is ignored without auto_batch_size=True. Starting with TensorDict 0.17, "
            "the default will change to turning on auto_batch_size when batch_dims is given, "
            "as from_dict does.",
            FutureWarning,
            stacklevel=3,
        )
    if device is not None:
        td = td.to(device)
    return td


def _set_batch(td: TreeNode, batch: torch.Size) -> None:
    """Sets ``batch`` on the nested TensorDicts (deepest first), then on ``td``."""
    for value in td._tensordict.values():
        if isinstance(value, TreeNode):
            _set_batch(value, batch)  # type: ignore[arg-type]
    td.batch_size = batch


# ---------------------------------------------------------------------------- numpy, lists


def numpy(td: TreeNode) -> dict[str, Any]:
    """A nested dict of NumPy arrays (sharing memory with the tensors); non-tensor entries as
    their values.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.arange(2), "n": {"b": torch.ones(2)}}, [2]).numpy()["n"]["b"]
    array([1., 1.], dtype=float32)
    """
    out: dict[str, Any] = {}
    for key in list(td._tensordict):
        value = td._get_str(key)
        if isinstance(value, TreeNode):
            out[key] = numpy(value)  # type: ignore[arg-type]
        elif type(value) in NTD_TYPES:
            out[key] = value.data
        else:
            out[key] = value.as_subclass(torch.Tensor).numpy()
    return out


def tolist(
    td: TreeNode,
    *,
    convert_nodes: bool = True,
    convert_tensors: bool | str = False,
    tolist_first: bool = False,
    as_linked_list: bool = False,
) -> Any:
    """The elements of the batch as nested lists (one level per batch dim), each element a
    dict (``to_dict``) or, with ``convert_nodes=False``, a TensorDict; ``as_linked_list``
    gives a ``LinkedList`` whose item writes (``values[i] = row``) go into the tree.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.arange(2)}, [2]).tolist()
    [{'a': tensor(0)}, {'a': tensor(1)}]
    """
    if not convert_nodes and convert_tensors:
        raise TypeError("convert_tensors requires convert_nodes=True.")

    def element(item: TreeNode) -> Any:
        if not convert_nodes:
            return item
        return _element_dict(item, convert_tensors, tolist_first)

    if not td.batch_size:
        return element(td)

    def nest(item: TreeNode) -> Any:
        if item.batch_dims == 0:
            return element(item)
        return [nest(sub) for sub in item.unbind(0)]

    if as_linked_list:  # a list whose item writes go into the tree's rows, as tensordict's
        return LinkedList(nest(td), td=td)
    return nest(td)


def _element_dict(td: TreeNode, convert_tensors: bool | str, tolist_first: bool) -> dict:
    out: dict[str, Any] = {}
    for key in list(td._tensordict):
        value = td._get_str(key)
        if isinstance(value, TreeNode):
            if tolist_first and value.batch_size:
                out[key] = tolist(value, convert_tensors=convert_tensors)  # type: ignore[arg-type]
            else:
                out[key] = _element_dict(value, convert_tensors, tolist_first)  # type: ignore[arg-type]
        elif type(value) in NTD_TYPES:
            out[key] = value.data
        elif convert_tensors == "numpy":
            out[key] = value.as_subclass(torch.Tensor).numpy()
        elif convert_tensors:
            out[key] = value.tolist()
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------------------- named tuples


def to_namedtuple(td: TreeNode, dest_cls: type | None = None) -> Any:
    """A named tuple of the entries (nested TensorDicts as nested named tuples); without
    ``dest_cls`` each level gets a new ``GenericDict`` class whose fields are its keys.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> nt = TensorDict({"a": torch.zeros(2), "n": {"b": torch.ones(2)}}, [2]).to_namedtuple()
    >>> nt._fields, nt.n.b
    (('a', 'n'), tensor([1., 1.]))
    """
    values = {}
    for key in list(td._tensordict):
        value = td._get_str(key)
        if isinstance(value, TreeNode):
            fields = tuple(value._tensordict)
            nested_cls = dest_cls if dest_cls is not None and _takes(dest_cls, fields) else None
            values[key] = to_namedtuple(value, nested_cls)  # type: ignore[arg-type]
        elif type(value) in NTD_TYPES:
            values[key] = value.data
        else:
            values[key] = value
    cls = dest_cls or collections.namedtuple("GenericDict", list(values))  # type: ignore[misc]
    return cls(**values)


def _takes(cls: type, fields: tuple[str, ...]) -> bool:
    return tuple(getattr(cls, "_fields", ())) == fields


def _from_mapping_values(cls: type[TD], items: Sequence[tuple[str, Any]]) -> TD:
    td = cls({}, [])
    for key, value in items:
        td._set_str(key, from_any(cls, value), validate=True)
    return td


def from_namedtuple(
    cls: type[TD],
    named_tuple: Any,
    *,
    auto_batch_size: bool = False,
    batch_dims: int | None = None,
    device: Any = None,
    batch_size: Any = None,
) -> TD:
    """A TensorDict whose keys are the fields of ``named_tuple`` (values through
    ``from_any``: nested named tuples and dicts become nested TensorDicts).

    >>> import collections, torch
    >>> from tensordict_rs import TensorDict
    >>> Point = collections.namedtuple("Point", "x y")
    >>> TensorDict.from_namedtuple(Point(torch.zeros(3), torch.ones(3)), auto_batch_size=True)
    TensorDict(batch_size=[3], fields={x: f32[], y: f32[]})
    """
    items = list(zip(named_tuple._fields, tuple(named_tuple), strict=True))
    td = _from_mapping_values(cls, items)
    return _finish(
        td, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
        batch_size=batch_size,
    )  # fmt: skip


def from_tuple(
    cls: type[TD],
    obj: tuple[Any, ...],
    *,
    auto_batch_size: bool = False,
    batch_dims: int | None = None,
    device: Any = None,
    batch_size: Any = None,
) -> TD:
    """A TensorDict with the keys ``"0"``, ``"1"``, ... of a tuple (nested tuples and dicts
    become nested TensorDicts).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict.from_tuple((torch.zeros(3), torch.ones(3))).keys()
    ['0', '1']
    """
    td = _from_mapping_values(cls, [(str(i), v) for i, v in enumerate(obj)])
    return _finish(
        td, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
        batch_size=batch_size,
    )  # fmt: skip


def from_dataclass(
    cls: type[TD],
    dataclass: Any,
    *,
    dest_cls: type | None = None,
    auto_batch_size: bool = False,
    batch_dims: int | None = None,
    as_tensorclass: bool = False,
    device: Any = None,
    batch_size: Any = None,
) -> TD:
    """A TensorDict with one entry per field of a dataclass instance (values through
    ``from_any``).

    >>> import dataclasses, torch
    >>> from tensordict_rs import TensorDict
    >>> @dataclasses.dataclass
    ... class Sample:
    ...     obs: torch.Tensor
    ...     reward: torch.Tensor
    >>> TensorDict.from_dataclass(Sample(torch.zeros(4, 2), torch.ones(4)), auto_batch_size=True)
    TensorDict(batch_size=[4], fields={obs: f32[2], reward: f32[]})
    """
    if as_tensorclass:
        raise NotImplementedError(
            "TensorDict.from_dataclass(as_tensorclass=True): use the function "
            "tensordict_rs.from_dataclass(obj, dest_cls=None), which returns the tensorclass "
            "(TensorDict's own methods build TensorDicts only: the TensorDict layer does not "
            "import tensorclasses)."
        )
    del dest_cls
    items = [(f.name, getattr(dataclass, f.name)) for f in dataclasses.fields(dataclass)]
    td = _from_mapping_values(cls, items)
    return _finish(
        td, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device,
        batch_size=batch_size,
    )  # fmt: skip


def from_struct_array(
    cls: type[TD],
    struct_array: np.ndarray,
    *,
    auto_batch_size: bool = False,
    batch_dims: int | None = None,
    device: Any = None,
    batch_size: Any = None,
) -> TD:
    """A TensorDict with one entry per field of a NumPy structured array (batch size: the
    array's shape unless given). The tensors share the array's memory where torch can view
    it, as tensordict's (copies: read-only arrays, packed fields, non-native byte order);
    string and other non-numeric fields are NonTensorData of the field.

    >>> import numpy as np
    >>> from tensordict_rs import TensorDict
    >>> arr = np.array([(1, 2.0), (3, 4.0)], dtype=[("a", np.int64), ("b", np.float32)])
    >>> TensorDict.from_struct_array(arr)["b"]
    tensor([2., 4.])
    """
    td = cls({}, struct_array.shape)
    for name in struct_array.dtype.names or ():
        field = struct_array[name]
        if field.dtype.names:
            td._set_str(name, from_struct_array(cls, field), validate=True)
        elif field.dtype.kind not in "cifbu":  # strings, objects, dates: no tensor dtype
            td._set_str(name, NonTensorData(field), validate=True)
        else:
            td._set_str(name, _struct_field_tensor(field), validate=True)
    if batch_size is not None or auto_batch_size:
        return _finish(
            td,
            auto_batch_size=auto_batch_size,
            batch_dims=batch_dims,
            device=device,
            batch_size=batch_size,
        )
    return td.to(device) if device is not None else td


def _struct_field_tensor(field: np.ndarray) -> torch.Tensor:
    """The tensor of a numeric field of a structured array: a view of the array's memory
    where torch can view it, as tensordict; a copy for a read-only array, and for strides
    that are not a multiple of the item size (packed fields) or a non-native byte order."""
    if not field.flags.writeable:
        return torch.from_numpy(field.copy())
    try:
        return torch.from_numpy(field)
    except ValueError:
        return torch.from_numpy(field.astype(field.dtype.newbyteorder("="), order="C"))


def to_struct_array(td: TreeNode) -> np.ndarray:
    """A NumPy structured array of the batch, one field per entry (nested TensorDicts as
    nested structured fields); the arrays are copies.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.arange(2), "b": torch.ones(2)}, [2]).to_struct_array()["a"]
    array([0, 1])
    """
    batch = tuple(td.batch_size)
    fields = []
    arrays = {}
    for key in list(td._tensordict):
        value = td._get_str(key)
        if isinstance(value, TreeNode):
            sub = to_struct_array(value)  # type: ignore[arg-type]
            fields.append((key, sub.dtype, sub.shape[len(batch) :]))
            arrays[key] = sub
        elif type(value) in NTD_TYPES and isinstance(value.data, np.ndarray):
            array = value.data  # a string field of from_struct_array, as it was
            fields.append((key, array.dtype, array.shape[len(batch) :]))
            arrays[key] = array
        elif type(value) in NTD_TYPES:
            raise TypeError(f"to_struct_array: the non-tensor entry {key!r} has no NumPy dtype")
        else:
            array = value.detach().cpu().as_subclass(torch.Tensor).numpy()
            fields.append((key, array.dtype, array.shape[len(batch) :]))
            arrays[key] = array
    out = np.empty(batch, dtype=[(k, d, s) if s else (k, d) for k, d, s in fields])
    for key, array in arrays.items():
        out[key] = array
    return out


# ---------------------------------------------------------------------------- from_any, lists


def from_any(
    cls: type[TreeNode],
    obj: Any,
    *,
    auto_batch_size: bool = False,
    batch_dims: int | None = None,
    device: Any = None,
    batch_size: Any = None,
) -> Any:
    """A TensorDict from a dict, named tuple, tuple, dataclass or structured array, converted
    recursively (tensors and other values are returned as they are, numbers as tensors, a
    list as a tensor when ``torch.tensor`` takes it and a ``NonTensorStack`` otherwise).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict.from_any({"a": torch.zeros(3), "b": (torch.ones(3),)}, auto_batch_size=True)
    TensorDict(batch_size=[3], fields={a: f32[], b: {0: f32[]}})
    """
    kwargs = {"auto_batch_size": auto_batch_size, "batch_dims": batch_dims, "device": device,
              "batch_size": batch_size}  # fmt: skip
    if isinstance(obj, TreeNode):
        return obj
    if isinstance(obj, (Mapping, collections.UserDict)):
        td = _from_mapping_values(cls, [(str(k), v) for k, v in dict(obj).items()])
        return _finish(td, **kwargs)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return from_namedtuple(cls, obj, **kwargs)
    if type(obj).__module__ == "torch.return_types":
        warnings.warn(
            "from_any converts a torch.return_types result with the keys '0', '1', ... "
            "Starting with TensorDict 0.17, the default will change to its field names, as "
            "from_namedtuple gives.",
            FutureWarning,
            stacklevel=2,
        )
        return from_tuple(cls, tuple(obj), **kwargs)
    if isinstance(obj, tuple):
        return from_tuple(cls, obj, **kwargs)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return from_dataclass(cls, obj, **kwargs)
    if isinstance(obj, np.ndarray) and obj.dtype.names:
        return from_struct_array(cls, obj, **kwargs)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, (bool, int, float, complex)):
        return torch.as_tensor(obj)
    if type(obj) is list:  # a tensor where torch.tensor takes it, else one value per row
        try:
            return torch.tensor(obj)
        except (TypeError, ValueError, RuntimeError):
            return NonTensorStack.from_list(obj)
    return obj


def from_list(
    cls: type[TD],
    input: list[Any],
    *,
    auto_batch_size: bool | None = None,
    batch_size: Any = None,
    device: Any = None,
    batch_dims: int | None = None,
    names: Any = None,
    lazy: bool | None = None,
) -> TD:
    """The dicts (or TensorDicts) of ``input`` stacked along a new leading dim.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict.from_list([{"a": torch.zeros(2)}, {"a": torch.ones(2)}])
    TensorDict(batch_size=[2], fields={a: f32[2]})
    """
    if lazy:
        raise NotImplementedError(
            "from_list(lazy=True) needs lazy stacks (tensordict_rs has none)."
        )
    items = []
    for item in input:
        if isinstance(item, TreeNode):
            items.append(item)
        else:
            inner = None if batch_size is None else list(batch_size)[1:]
            dims = None if batch_dims is None else max(batch_dims - 1, 0)
            items.append(
                cast(Any, cls).from_dict(
                    item,
                    batch_size=inner,
                    device=device,
                    auto_batch_size=auto_batch_size,
                    batch_dims=dims,
                )
            )
    result: Any = torch.stack(cast(Any, items), 0)
    if names is not None:
        result.names = names
    return cast(TD, result)


def from_dict_instance(
    td: TD,
    input_dict: Mapping[str, Any],
    *,
    auto_batch_size: bool | None = None,
    batch_size: Any = None,
    device: Any = None,
    batch_dims: int | None = None,
    names: Any = None,
) -> TD:
    """``from_dict`` with the class of this TensorDict (and of its nested TensorDicts).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict().from_dict_instance({"a": torch.zeros(2)}, batch_size=[2])
    TensorDict(batch_size=[2], fields={a: f32[]})
    """
    return cast(Any, type(td)).from_dict(
        input_dict, auto_batch_size=auto_batch_size, batch_size=batch_size, device=device,
        batch_dims=batch_dims, names=names,
    )  # fmt: skip


# ---------------------------------------------------------------------------- pytrees


def from_pytree(
    cls: type[TreeNode],
    pytree: Any,
    *,
    batch_size: Any = None,
    auto_batch_size: bool = False,
    batch_dims: int | None = None,
) -> Any:
    """A TensorDict from lists, tuples, named tuples and dicts (nested to any depth); the type
    of each container is kept in a ``"_pytree_type"`` entry so ``to_pytree`` rebuilds it.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> tree = {"a": torch.zeros(3), "b": (torch.ones(3), torch.ones(2))}
    >>> back = TensorDict.from_pytree(tree).to_pytree()
    >>> type(back["b"]).__name__, back["b"][1]
    ('tuple', tensor([1., 1.]))
    """
    td = _from_pytree(cls, pytree)
    if not isinstance(td, TreeNode):
        return td
    return _finish(
        td, auto_batch_size=auto_batch_size, batch_dims=batch_dims, batch_size=batch_size
    )  # type: ignore[arg-type]


def _from_pytree(cls: type[TreeNode], obj: Any) -> Any:
    if isinstance(obj, (torch.Tensor, TreeNode)):
        return obj
    if isinstance(obj, (bool, int, float)):
        return torch.as_tensor(obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, Mapping):
        td = cls({}, [])
        for i, (key, value) in enumerate(obj.items()):
            if isinstance(key, str):
                td._set_str(key, _from_pytree(cls, value), validate=True)
            else:
                name = f"<{type(key).__name__}_{i}>"
                td._set_str(name, _from_pytree(cls, value), validate=True)
                td._set_str(name + "_key", NonTensorData(key), validate=False)
        td._set_str(_PYTREE_TYPE, NonTensorData(type(obj)), validate=False)
        return td
    if isinstance(obj, (list, tuple)):
        td = cls({}, [])
        for i, value in enumerate(obj):
            td._set_str(str(i), _from_pytree(cls, value), validate=True)
        td._set_str(_PYTREE_TYPE, NonTensorData(type(obj)), validate=False)
        return td
    raise NotImplementedError(f"from_pytree: {type(obj).__name__} is not a supported pytree type")


def to_pytree(td: TreeNode) -> Any:
    """The pytree ``from_pytree`` made this TensorDict from (``td`` itself if it was not).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict.from_pytree([torch.zeros(2), torch.ones(2)]).to_pytree()
    [tensor([0., 0.]), tensor([1., 1.])]
    """
    marker = td._tensordict.get(_PYTREE_TYPE)
    if not isinstance(marker, NonTensorData):
        return td
    kind = marker.data
    entries = {}
    for key in list(td._tensordict):
        if key == _PYTREE_TYPE or (key.endswith("_key") and key[:-4] in td._tensordict):
            continue
        value = td._get_str(key)
        if isinstance(value, TreeNode):
            value = to_pytree(value)  # type: ignore[arg-type]
        elif type(value) in NTD_TYPES:
            value = value.data
        entries[key] = value
    if issubclass(kind, Mapping):
        out = {}
        for key, value in entries.items():
            stored = td._tensordict.get(key + "_key")
            out[stored.data if isinstance(stored, NonTensorData) else key] = value
        return (
            kind(out) if kind is not collections.defaultdict else collections.defaultdict(None, out)
        )
    values = [entries[str(i)] for i in range(len(entries))]
    if hasattr(kind, "_fields"):
        return kind(*values)
    if kind.__module__ == "torch.return_types":
        return kind(values)
    return kind(values)


# ---------------------------------------------------------------------------- leaves as one tensor


def _join(td: TD, keys: tuple[Any, ...], out_key: Any, dim: int, keep: bool, op: Any) -> TD:
    values = [td._entry(k) for k in keys]
    joined = op(values, dim)
    if not keep:
        for key in keys:
            td.del_(key)
    td.set(out_key, joined)
    return td


def cat_tensors(td: TD, *keys: Any, out_key: Any, dim: int = 0, keep_entries: bool = False) -> TD:
    """Concatenates the entries ``keys`` along ``dim`` into ``out_key`` (removing them unless
    ``keep_entries``); returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2, 1), "b": torch.ones(2, 2)}, [2])
    >>> td.cat_tensors("a", "b", out_key="x", dim=-1)["x"].shape
    torch.Size([2, 3])
    """
    return _join(td, keys, out_key, dim, keep_entries, torch.cat)


def stack_tensors(td: TD, *keys: Any, out_key: Any, dim: int = 0, keep_entries: bool = False) -> TD:
    """Stacks the entries ``keys`` along a new ``dim`` into ``out_key`` (removing them unless
    ``keep_entries``); returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [2])
    >>> td.stack_tensors("a", "b", out_key="x", dim=-1)["x"].shape
    torch.Size([2, 2])
    """
    return _join(td, keys, out_key, dim, keep_entries, torch.stack)


def _sorted_leaves(td: TreeNode, order: bool | Sequence[Any] | None) -> list[torch.Tensor]:
    if order is None or order is False:
        return [v for _, _, v in leaves(td)]
    items = dict(td.items(include_nested=True, leaves_only=True))
    if order is True:
        keys = sorted(items, key=lambda k: k if isinstance(k, tuple) else (k,))
    else:
        keys = list(order)
    return [items[k] for k in keys]


def cat_from_tensordict(
    td: TreeNode, dim: int = 0, *, sorted: bool | Sequence[Any] | None = None, out: Any = None
) -> torch.Tensor:
    """All the leaves concatenated into one tensor along ``dim`` (in key order with
    ``sorted=True``, or the order of a list of keys).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2, 1), "b": torch.ones(2, 2)}, [2]).cat_from_tensordict(-1)
    tensor([[0., 1., 1.],
            [0., 1., 1.]])
    """
    return torch.cat(_sorted_leaves(td, sorted), dim, out=out)


def stack_from_tensordict(
    td: TreeNode, dim: int = 0, *, sorted: bool | Sequence[Any] | None = None, out: Any = None
) -> torch.Tensor:
    """All the leaves stacked into one tensor along a new ``dim``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [2]).stack_from_tensordict().shape
    torch.Size([2, 2])
    """
    return torch.stack(_sorted_leaves(td, sorted), dim, out=out)


def as_tensor(td: TD) -> TD:
    """The leaves converted with their ``as_tensor()`` method where they have one (a
    MemoryMappedTensor stays as it is).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2)}, [2]).as_tensor()["a"]
    tensor([0., 0.])
    """
    return map_leaves(td, lambda t: t.as_tensor() if hasattr(t, "as_tensor") else t, lock=True)


class Conversions(TreeNode):
    """Conversions to and from other containers (a mixin of TensorDict): NumPy, lists,
    named tuples, dataclasses, structured arrays, pytrees, flat tensors."""

    numpy = numpy
    tolist = tolist
    to_namedtuple = to_namedtuple
    from_namedtuple = as_classmethod(from_namedtuple)
    from_tuple = as_classmethod(from_tuple)
    from_dataclass = as_classmethod(from_dataclass)
    from_struct_array = as_classmethod(from_struct_array)
    to_struct_array = to_struct_array
    from_any = as_classmethod(from_any)
    from_list = as_classmethod(from_list)
    from_dict_instance = from_dict_instance
    from_pytree = as_classmethod(from_pytree)
    to_pytree = to_pytree
    cat_tensors = cat_tensors
    stack_tensors = stack_tensors
    cat_from_tensordict = cat_from_tensordict
    stack_from_tensordict = stack_from_tensordict
    as_tensor = as_tensor
