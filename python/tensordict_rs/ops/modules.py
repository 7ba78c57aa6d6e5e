"""Model weights: ``from_module``, ``from_modules``, ``to_module`` (a context manager too),
``state_dict`` and ``load_state_dict``.

A module's parameters and buffers become a tree that mirrors its submodules
(``module.layers[0].weight`` is the entry ``("layers", "0", "weight")``), holding the Parameter
and buffer objects themselves. ``to_module`` walks the tree and the module's own dicts
(``_parameters``, ``_buffers``, ``_modules``) together and swaps the leaves in, returning the
old ones, so that ``with params.to_module(model):`` runs the model with other weights and puts
its own back on exit. State dicts are the reference's formats, so they move both ways.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from .._core.nodes import NTD_TYPES, TD, NonTensorData, TreeNode
from .._core.nontensor import NonTensorStack
from . import as_classmethod

_NO_DEFAULT: Any = object()

# ``tensordict_rs.nn`` (above this layer) registers ``TensorDictParams`` here when it is imported
# (``tensordict_rs/__init__.py`` imports it), for ``from_module(..., as_module=True)``.
_MODULE_CLASS: list[Callable[..., Any]] = []


def register_module_class(factory: Callable[..., Any]) -> None:
    """Sets the class ``as_module=True`` wraps a tree in (``nn.TensorDictParams``)."""
    _MODULE_CLASS[:] = [factory]


def _as_module(td: TreeNode, lock: bool) -> Any:
    if not _MODULE_CLASS:
        raise RuntimeError("as_module=True needs tensordict_rs.nn (import tensordict_rs first)")
    return _MODULE_CLASS[0](td, no_convert=True, lock=lock)


# ---------------------------------------------------------------------------- from_module


def _module_tree(
    cls: type[TreeNode], module: nn.Module, use_state_dict: bool, filter_empty: bool
) -> TreeNode | None:
    entries: dict[str, Any] = {}
    if use_state_dict:
        for hook in module._state_dict_pre_hooks.values():
            hook(module, "", False)
        module._save_to_state_dict(entries, "", False)
        for hook in module._state_dict_hooks.values():
            result = hook(module, entries, "", {})
            if result is not None:
                entries = result
    else:
        for name, param in module._parameters.items():
            if param is not None:
                entries[name] = param
        for name, buffer in module._buffers.items():
            if buffer is not None:
                entries[name] = buffer
    td = None
    if entries or not filter_empty:
        td = cls._new_unchecked(torch.Size([]), None)
        td._tensordict.update(entries)
    for name, child in module._modules.items():
        if child is None:
            continue
        sub = _module_tree(cls, child, use_state_dict, filter_empty)
        if sub is None:
            continue
        if td is None:
            td = cls._new_unchecked(torch.Size([]), None)
        td._tensordict[name] = sub
    return td


def from_module(
    cls: type[TreeNode],
    module: nn.Module,
    as_module: bool = False,
    lock: bool = False,
    use_state_dict: bool = False,
    filter_empty: bool = True,
) -> Any:
    """A TensorDict of the parameters and buffers of ``module`` (the objects themselves, not
    copies), one nested TensorDict per submodule; ``use_state_dict`` reads ``state_dict()``
    (hooks run) instead; ``as_module`` wraps it in ``tensordict_rs.nn.TensorDictParams``.

    >>> from torch import nn
    >>> from tensordict_rs import TensorDict
    >>> module = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    >>> params = TensorDict.from_module(module)
    >>> params["0", "weight"] is module[0].weight, params.keys()
    (True, ['0'])
    """
    td = _module_tree(cls, module, use_state_dict, filter_empty)
    if td is None:
        td = cls._new_unchecked(torch.Size([]), None)
    if as_module:
        return _as_module(td, lock)
    if lock:
        td.lock_()
    return td


def from_modules(
    cls: type[TreeNode],
    *modules: nn.Module,
    as_module: bool = False,
    lock: bool = True,
    use_state_dict: bool = False,
    lazy_stack: bool = False,
    expand_identical: bool = False,
) -> Any:
    """The parameters and buffers of several modules of the same structure, stacked along a
    new batch dim: new Parameters (same ``requires_grad``) and buffers, for ``torch.vmap``
    ensembles with ``to_module``. ``expand_identical`` expands a parameter that is the same
    object in every module instead of stacking it.

    >>> import torch
    >>> from torch import nn
    >>> from tensordict_rs import TensorDict
    >>> params = TensorDict.from_modules(nn.Linear(3, 4), nn.Linear(3, 4))
    >>> params.batch_size, params["weight"].shape, type(params["weight"]).__name__
    (torch.Size([2]), torch.Size([2, 4, 3]), 'Parameter')
    """
    if lazy_stack:
        if as_module:
            raise RuntimeError("lazy_stack=True and as_module=True are exclusive.")
        raise NotImplementedError(
            "from_modules(lazy_stack=True) needs lazy stacks, which tensordict_rs does not "
            "have: use the dense stack (the default) and pass its parameters to the optimizer."
        )
    trees = [from_module(cls, m, use_state_dict=use_state_dict) for m in modules]
    first = trees[0]
    keys = sorted(map(str, first.keys(include_nested=True, leaves_only=True)))
    for other in trees[1:]:
        if sorted(map(str, other.keys(include_nested=True, leaves_only=True))) != keys:
            raise ValueError(
                "All key sets must match: the modules passed to from_modules have different "
                "parameters."
            )

    def make(*values: torch.Tensor) -> torch.Tensor:
        original = values[0]
        if expand_identical and all(v is original for v in values):
            return original.expand(len(values), *original.shape)
        with torch.no_grad():
            stacked = torch.stack([v.detach() for v in values])
        if isinstance(original, nn.Parameter):
            return nn.Parameter(stacked, original.requires_grad)
        return stacked

    from .._core.walk import map_leaves

    params = map_leaves(first, make, *trees[1:], batch_size=[len(trees)])
    if as_module:
        return _as_module(params, lock)
    if lock:
        params.lock_()
    return params


# ---------------------------------------------------------------------------- to_module


def _tracks_gradients(tensor: torch.Tensor) -> bool:
    if tensor.requires_grad:
        return True
    try:
        return bool(torch._C._functorch.is_batchedtensor(tensor))
    except AttributeError:  # pragma: no cover - older torch
        return False


def _parameter(value: torch.Tensor, requires_grad: bool) -> nn.Parameter:
    """A Parameter over ``value``'s memory (a memory-mapped leaf stays a view of its file)."""
    if type(value) is not torch.Tensor and not isinstance(value, nn.Parameter):
        value = value.as_subclass(torch.Tensor)
    return nn.Parameter(value, requires_grad=requires_grad)


def _swap_leaf(
    module: nn.Module,
    key: str,
    value: torch.Tensor,
    inplace: bool,
    return_swap: bool,
    preserve: bool,
    non_blocking: bool,
) -> Any:
    params: dict[str, Any] = module._parameters
    buffers: dict[str, Any] = module._buffers
    old: Any
    where: dict[str, Any] | None
    if key in params:
        old, where = params[key], params
    elif key in buffers:
        old, where = buffers[key], buffers
    else:
        try:
            old = module.__dict__[key]
        except KeyError:
            raise KeyError(
                f"{type(module).__name__} has no parameter, buffer or attribute {key!r} to "
                "write into"
            ) from None
        where = None
    if inplace:
        swapped = old.clone() if return_swap else old
        with torch.no_grad():
            old.data.copy_(value.data, non_blocking=non_blocking)
        return swapped
    new = value
    if preserve and where is params and old is not None:
        if not isinstance(value, nn.Parameter) or value.requires_grad != old.requires_grad:
            if not _tracks_gradients(value):
                new = _parameter(value, old.requires_grad)
    elif preserve and where is buffers and isinstance(value, nn.Parameter):
        new = value.data
    if where is None:
        module.__dict__[key] = new
    else:
        where[key] = new
    return old


def _swap(
    td: TreeNode,
    module: nn.Module,
    inplace: bool,
    return_swap: bool,
    preserve: bool,
    non_blocking: bool,
    memo: dict[int, Any],
) -> dict[str, Any]:
    swapped: dict[str, Any] = {}
    memo[id(module)] = swapped
    for key in list(td._tensordict):
        value = td._get_str(key)
        if isinstance(value, TreeNode):
            try:
                child = module._modules[key]
            except KeyError:
                raise KeyError(f"{type(module).__name__} has no submodule {key!r}") from None
            if child is None:
                raise KeyError(f"{type(module).__name__}.{key} is None")
            if id(child) in memo:  # a submodule used twice: swapped once
                swapped[key] = memo[id(child)]
                continue
            swapped[key] = _swap(
                value,
                child,
                inplace,
                return_swap,
                preserve,
                non_blocking,
                memo,  # type: ignore[arg-type]
            )
        elif type(value) in NTD_TYPES:
            continue
        else:
            swapped[key] = _swap_leaf(
                module, key, value, inplace, return_swap, preserve, non_blocking
            )
    return swapped


def _as_tree(cls: type[TD], swapped: dict[str, Any]) -> TD:
    td = cls._new_unchecked(torch.Size([]), None)
    for key, value in swapped.items():
        td._tensordict[key] = _as_tree(cls, value) if isinstance(value, dict) else value
    return td


def _write_into(dest: TreeNode, swapped: dict[str, Any]) -> None:
    for key, value in swapped.items():
        if isinstance(value, dict):
            if key not in dest._tensordict:
                dest._set_str(key, type(dest)._new_unchecked(dest.batch_size, dest.device))
            _write_into(dest._tensordict[key], value)
        else:
            dest._set_str(key, value, validate=False)


def _state_dict_input(td: TD, module: nn.Module) -> TD:
    """``use_state_dict=True``: the module's load pre-hooks see the flat state dict, and the
    values become Parameters where the module holds Parameters."""
    state = collections.OrderedDict(
        (".".join(k) if isinstance(k, tuple) else k, v)
        for k, v in td.items(include_nested=True, leaves_only=True)
    )
    for hook in module._load_state_dict_pre_hooks.values():
        hook(state, "", {}, True, [], [], [])
    out = type(td)._new_unchecked(torch.Size([]), None)
    for name, value in state.items():
        path = tuple(name.split("."))
        owner: Any = module
        for part in path[:-1]:
            owner = owner._modules[part]
        old = owner._parameters.get(path[-1])
        if isinstance(old, nn.Parameter) and not isinstance(value, nn.Parameter):
            value = _parameter(value, old.requires_grad)
        out.set(path, value)
    return out


def to_module(
    td: TreeNode,
    module: nn.Module,
    *,
    inplace: bool | None = None,
    return_swap: bool = True,
    swap_dest: Any = None,
    use_state_dict: bool = False,
    non_blocking: bool = False,
    preserve_module_state: bool = True,
    memo: Any = None,
) -> Any:
    """Writes the leaves into the parameters and buffers of ``module`` (keys as
    ``from_module`` gives them) and returns the old ones (into ``swap_dest`` if given). Used as
    a context manager, the old parameters are put back on exit, exception or not.
    ``inplace`` copies into the existing tensors instead of replacing them;
    ``preserve_module_state`` keeps Parameters Parameters (with their ``requires_grad``)
    unless the new value tracks gradients; ``use_state_dict`` runs the module's load hooks.

    >>> import torch
    >>> from torch import nn
    >>> from tensordict_rs import TensorDict
    >>> module = nn.Linear(3, 4)
    >>> zeros = TensorDict.from_module(module).data.clone().zero_()
    >>> with zeros.to_module(module):
    ...     bool((module(torch.ones(2, 3)) == 0).all())
    True
    >>> bool((module.weight != 0).any())
    True
    """
    if memo is not None:
        raise RuntimeError("memo cannot be passed to the public to_module anymore.")
    if preserve_module_state is None:
        raise TypeError(
            "to_module(..., preserve_module_state=None) is no longer supported. Pass True to "
            "preserve the parameter and buffer registrations of the module, or False for the "
            "historical replacement behavior."
        )
    source = td
    if use_state_dict:
        if inplace is not None:
            raise RuntimeError("inplace argument cannot be passed when use_state_dict=True.")
        source = _state_dict_input(td, module)
    inplace = bool(inplace)
    swapped = _swap(source, module, inplace, return_swap, preserve_module_state, non_blocking, {})
    if not return_swap:
        return None
    if swap_dest is not None:
        if isinstance(swap_dest, dict):
            swap_dest.update(swapped)
            return swap_dest
        _write_into(swap_dest, swapped)
        result = swap_dest
    else:
        result = _as_tree(type(td), swapped)

    def restore() -> None:
        to_module(
            result,
            module,
            inplace=inplace,
            return_swap=False,
            non_blocking=non_blocking,
            preserve_module_state=preserve_module_state,
        )

    result._lock_ops.append(restore)
    return result


# ---------------------------------------------------------------------------- state dicts


def state_dict(
    td: TreeNode,
    destination: Any = None,
    prefix: str = "",
    keep_vars: bool = False,
    flatten: bool = True,
) -> collections.OrderedDict[str, Any]:
    """The leaves in an ``OrderedDict``, as ``nn.Module.state_dict``: keys joined with "."
    (or nested ``OrderedDict``s with ``flatten=False``); the batch size and device of each
    level in ``_metadata``. Read back by ``load_state_dict``, here or in tensordict.

    >>> from tensordict_rs import TensorDict
    >>> data = TensorDict({"1": 1, "2": 2, "3": {"3": 3}}, [])
    >>> dict(data.state_dict())
    {'1': tensor(1), '2': tensor(2), '3.3': tensor(3)}
    """
    if destination is None:
        destination = collections.OrderedDict()
        destination._metadata = collections.OrderedDict()  # type: ignore[attr-defined]
    elif not hasattr(destination, "_metadata"):
        destination._metadata = collections.OrderedDict()
    level = prefix[:-1] if prefix.endswith(".") else prefix
    record: dict[str, Any] = {"batch_size": td.batch_size, "device": td.device}
    destination._metadata[level] = record
    fields = _tensorclass_fields(td)
    if fields is not None:
        # a tensorclass: its class name and non-tensor fields (None ones too) in its record
        record["_type"] = type(td)._tensorclass.__qualname__
        record["_non_tensor"] = dict.fromkeys(f for f in fields if f not in td._tensordict)
    for key in list(td._tensordict):
        value = td._get_str(key)
        if fields is not None and _is_non_tensor(value):
            record["_non_tensor"][key] = value.data if type(value) in NTD_TYPES else value.tolist()
            continue
        if isinstance(value, TreeNode):
            if flatten:
                state_dict(value, destination, prefix + key + ".", keep_vars, True)  # type: ignore[arg-type]
            else:
                destination[prefix + key] = state_dict(value, keep_vars=keep_vars, flatten=False)  # type: ignore[arg-type]
            continue
        if _is_non_tensor(value):
            # as tensordict: not a state dict entry (torch modules take tensors), its value in
            # the ``_metadata`` of its level, which ``load_state_dict`` reads back
            entry = {"batch_size": td.batch_size, "device": td.device, **_non_tensor(value)}
            if flatten:
                destination._metadata[prefix + key] = entry
            else:
                holder: collections.OrderedDict[str, Any] = collections.OrderedDict()
                holder._metadata = collections.OrderedDict({"": entry})  # type: ignore[attr-defined]
                destination[prefix + key] = holder
            continue
        if not keep_vars:
            value = value.detach()
        full = prefix + key
        if flatten and full in destination:
            raise KeyError(
                f"state_dict: the flat key {full!r} is given by two entries (a dotted key and "
                "a nested one); use flatten=False to keep them apart."
            )
        destination[full] = value
    return destination  # type: ignore[no-any-return]


def _is_non_tensor(value: Any) -> bool:
    return type(value) in NTD_TYPES or type(value) is NonTensorStack


def _tensorclass_fields(td: TreeNode) -> list[str] | None:
    """The field names of the tensorclass whose TensorDict ``td`` is, or None."""
    cls = type(td)._tensorclass
    return None if cls is None else list(cls.__dataclass_fields__)


def _non_tensor(value: Any) -> dict[str, Any]:
    """The ``_metadata`` record of a non-tensor entry: tensordict's for a ``NonTensorData``;
    a ``NonTensorStack``'s values as a list (tensordict records none, and loads none back)."""
    if type(value) is NonTensorStack:
        values = list(value._cells.get(value._pos.ravel()))  # row-major, as from_values reads
        return {"_type": "NonTensorStack", "_non_tensor": {"data": values}}
    return {
        "_type": "NonTensorData",
        "_non_tensor": {"data": value.data, "_metadata": None, "_is_non_tensor": True},
    }


def _non_tensor_entry(value: Any, batch_size: torch.Size) -> Any:
    """The non-tensor entry a nested state dict level stands for, or None for a tree level."""
    record = (getattr(value, "_metadata", None) or {}).get("", {})
    if not isinstance(record, Mapping) or "_non_tensor" not in record or value:
        return None
    if record.get("_type") not in ("NonTensorData", "NonTensorStack"):
        return None  # a tensorclass level
    data = record["_non_tensor"].get("data")
    if record.get("_type") == "NonTensorStack":
        return NonTensorStack.from_values(data, batch_size)
    return NonTensorData(data)


def _unflatten(state: Mapping[str, Any]) -> collections.OrderedDict[str, Any]:
    """A flat state dict (with ``_metadata``) as nested ``OrderedDict``s."""
    metadata = getattr(state, "_metadata", None) or {}
    root: collections.OrderedDict[str, Any] = collections.OrderedDict()
    root._metadata = collections.OrderedDict({"": metadata.get("", {})})  # type: ignore[attr-defined]
    levels = sorted((k for k in metadata if k), key=lambda k: k.count("."))
    for level in levels:
        node = root
        for part in level.split("."):
            if part not in node:
                child: collections.OrderedDict[str, Any] = collections.OrderedDict()
                child._metadata = collections.OrderedDict({"": {}})  # type: ignore[attr-defined]
                node[part] = child
            node = node[part]
        node._metadata[""] = metadata[level]  # type: ignore[attr-defined]
    for key, value in state.items():
        parts = key.split(".")
        node = root
        for part in parts[:-1]:
            if part not in node or not isinstance(node[part], Mapping):
                child = collections.OrderedDict()
                child._metadata = collections.OrderedDict({"": {}})  # type: ignore[attr-defined]
                node[part] = child
            node = node[part]
        node[parts[-1]] = value
    return root


def _empty_mapping(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        k in ("__batch_size", "__device") or _empty_mapping(v) for k, v in value.items()
    )


def load_state_dict(
    td: TD,
    state_dict: Mapping[str, Any],
    strict: bool = True,
    assign: bool = False,
    from_flatten: bool | None = None,
) -> TD:
    """Loads a state dict (flat, nested, or tensordict's legacy ``__batch_size`` format) into
    the tree; returns ``td``. ``strict`` requires the same keys; ``assign`` replaces the
    tensors instead of copying into them; the batch size becomes the state dict's.

    >>> from tensordict_rs import TensorDict
    >>> data = TensorDict({"1": 1, "2": 2, "3": {"3": 3}}, [])
    >>> zeros = TensorDict({"1": 0, "2": 0, "3": {"3": 0}}, [])
    >>> zeros.load_state_dict(data.state_dict())["3", "3"]
    tensor(3)
    """
    if from_flatten is None:
        metadata = getattr(state_dict, "_metadata", None)
        from_flatten = metadata is not None and set(state_dict) != set(td._tensordict)
    if from_flatten:
        return load_state_dict(td, _unflatten(state_dict), strict, assign, from_flatten=False)
    metadata = getattr(state_dict, "_metadata", None)
    state = dict(state_dict)
    fields = _tensorclass_fields(td)
    if fields is not None and "_tensordict" in state and "_non_tensordict" in state:
        # the state dict of tensorclasses of tensordict before 0.11
        load_state_dict(td, state["_tensordict"], strict, assign, from_flatten=False)
        _load_fields(td, fields, state["_non_tensordict"], assign)
        return td
    if metadata is not None:
        local = metadata.get("", {})
        if fields is not None:
            _load_fields(td, fields, local.get("_non_tensor", {}), assign)
            unexpected = [k for k in state if k not in td._tensordict]
            if strict and unexpected:
                raise KeyError(f"Key '{unexpected[0]}' wasn't expected in the state-dict.")
        batch_size = local.get("batch_size", td.batch_size)
        device = local.get("device")
    elif "__batch_size" in state:
        batch_size = state.pop("__batch_size")
        device = state.pop("__device", None)
    else:
        batch_size, device = td.batch_size, td.device
    keys = set(td._tensordict)
    if fields is not None:  # a tensorclass's non-tensor fields are in its record, loaded above
        keys = {k for k, v in td._tensordict.items() if not _is_non_tensor(v)}
    if strict and set(state) != keys:
        extra_td = keys - set(state)
        extra_sd = set(state) - keys
        if not all(
            isinstance(td._tensordict[k], TreeNode) and td._tensordict[k].is_empty()
            for k in extra_td
        ) or not all(_empty_mapping(state[k]) for k in extra_sd):
            raise RuntimeError(
                "Cannot load state-dict because the key sets don't match: got "
                f"state_dict extra keys \n{extra_sd}\n and tensordict extra keys\n{extra_td}\n"
            )
    if device is not None and td.device is not None and torch.device(device) != td.device:
        raise RuntimeError(
            f"the state dict was saved on device {device}, the tensordict is on {td.device}"
        )
    for key, value in state.items():
        entry = _non_tensor_entry(value, torch.Size(batch_size))
        if entry is not None:
            if assign:
                td._tensordict.pop(key, None)
            td.set(key, entry, inplace=key in td._tensordict)
            continue
        if isinstance(value, Mapping):
            current = td._tensordict.get(key)
            if not isinstance(current, TreeNode):
                current = type(td)._new_unchecked(torch.Size([]), td.device)
                td._set_str(key, current, validate=False)
            load_state_dict(current, value, strict, assign, from_flatten=False)  # type: ignore[arg-type]
        elif assign or key not in td._tensordict:
            td._tensordict[key] = value
        else:
            td._get_str(key).copy_(value)
    td._batch_size = torch.Size(batch_size)
    return td


def _load_fields(td: TreeNode, fields: list[str], values: Mapping[str, Any], assign: bool) -> None:
    """The non-tensor fields of a tensorclass's state dict record set back (None: no entry)."""
    for key, value in values.items():
        if key not in fields:
            raise KeyError(f"Key '{key}' wasn't expected in the state-dict.")
        if value is None:
            if key in td._tensordict and not isinstance(td._tensordict[key], torch.Tensor):
                del td._tensordict[key]
            continue
        if assign:
            td._tensordict.pop(key, None)
        td.set(key, NonTensorData(value), inplace=key in td._tensordict)


class ModuleWeights(TreeNode):
    """Model weights (a mixin of TensorDict): ``from_module``, ``from_modules``,
    ``to_module`` (also a context manager), ``state_dict``, ``load_state_dict``."""

    from_module = as_classmethod(from_module)
    from_modules = as_classmethod(from_modules)
    to_module = to_module
    state_dict = state_dict
    load_state_dict = load_state_dict
