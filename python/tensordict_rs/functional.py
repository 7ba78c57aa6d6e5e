"""Functions over lists of trees: ``stack``, ``cat``, ``pad``, ``pad_sequence``,
``merge_tensordicts``, ``dense_stack_tds``, ``lazy_stack`` (tensordict's names and semantics).

``lazy_stack`` is a dense stack here: tensordict's ``LazyStackedTensorDict`` keeps the stacked
TensorDicts and writes through to them, allows members with different keys or shapes, and saves
one sub-directory per member. This library stores and loads dense trees only (a memory-mapped
dataset is dense by construction, and a batch is one gather), so ``lazy_stack`` returns
``torch.stack(items, dim)``: a copy (writing into it does not reach the members), whose members
must have the same keys and shapes (else the error names the key).

Tensorclasses are accepted wherever TensorDicts are, and come back as their class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ._core.classes import is_tensorclass
from ._core.nodes import NonTensorData
from ._core.nontensor import NonTensorStack
from .ops import shape as _shape
from .tensordict import TensorDict

__all__ = [
    "cat",
    "dense_stack_tds",
    "from_any",
    "from_consolidated",
    "from_dict",
    "from_h5",
    "from_module",
    "from_modules",
    "from_namedtuple",
    "from_pytree",
    "from_safetensors",
    "from_struct_array",
    "from_tuple",
    "fromkeys",
    "lazy_stack",
    "load",
    "load_memmap",
    "make_tensordict",
    "maybe_dense_stack",
    "memmap",
    "merge_tensordicts",
    "pad",
    "pad_sequence",
    "save",
    "stack",
    "to_safetensors",
]


def stack(items: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
    """``torch.stack`` of TensorDicts or tensorclasses (``out=`` writes into an existing one).

    >>> import torch; from tensordict_rs import TensorDict, stack
    >>> stack([TensorDict({"a": torch.zeros(2)}, [2])] * 3).batch_size
    torch.Size([3, 2])
    """
    return (
        torch.stack(list(items), dim, out=out) if out is not None else torch.stack(list(items), dim)
    )


def cat(items: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
    """``torch.cat`` of TensorDicts or tensorclasses.

    >>> import torch; from tensordict_rs import TensorDict, cat
    >>> cat([TensorDict({"a": torch.zeros(2)}, [2])] * 3).batch_size
    torch.Size([6])
    """
    return torch.cat(list(items), dim, out=out) if out is not None else torch.cat(list(items), dim)


def lazy_stack(items: Sequence[Any], dim: int = 0, *, out: Any = None, **kwargs: Any) -> Any:
    """A dense ``torch.stack`` (see the module docstring for how it differs from tensordict's
    ``LazyStackedTensorDict``).

    >>> import torch; from tensordict_rs import TensorDict, lazy_stack
    >>> lazy_stack([TensorDict({"a": torch.zeros(2)}, [2])] * 3, 1).batch_size
    torch.Size([2, 3])
    """
    return stack(items, dim, out=out)


def dense_stack_tds(td_list: Any, dim: int | None = None) -> Any:
    """A dense stack of a list of TensorDicts along ``dim`` (required); a TensorDict is returned
    as it is (stacks are always dense here).

    >>> import torch; from tensordict_rs import TensorDict, dense_stack_tds
    >>> dense_stack_tds([TensorDict({"a": torch.zeros(2)}, [2])] * 2, 0).batch_size
    torch.Size([2, 2])
    """
    if isinstance(td_list, TensorDict) or is_tensorclass(td_list):
        return td_list
    if dim is None:
        raise ValueError("If a list of tensordicts is provided, stack_dim must not be None")
    return stack(td_list, dim)


def _tree(value: Any) -> Any:
    return value._tensordict if is_tensorclass(value) and hasattr(value, "_as_node") else value


def _rewrap(like: Any, result: TensorDict) -> Any:
    if is_tensorclass(like) and hasattr(like, "_as_node"):
        return type(like)._from_tensordict(result, dict(like._non_tensordict))
    return result


def pad(tensordict: Any, pad_size: Sequence[int], value: float = 0.0, inplace: bool = False) -> Any:
    """Pads every tensor along the batch dims: ``pad_size`` is ``[before_0, after_0, before_1,
    after_1, ...]`` in batch-dim order (non-tensor entries are kept).

    >>> import torch; from tensordict_rs import TensorDict, pad
    >>> pad(TensorDict({"a": torch.ones(2)}, [2]), [1, 0])["a"]
    tensor([0., 1., 1.])
    """
    if type(tensordict) is NonTensorStack:  # padded with None (in place: the same stack)
        holder = TensorDict({"v": tensordict}, tensordict.batch_size, tensordict.device)
        padded = _shape.pad(holder, pad_size, value, inplace).get("v")
        return tensordict if inplace else padded
    td = _tree(tensordict)
    result = _shape.pad(td, pad_size, value, inplace)
    return tensordict if inplace else _rewrap(tensordict, result)


def pad_sequence(
    list_of_tensordicts: Sequence[Any],
    pad_dim: int = 0,
    padding_value: float = 0.0,
    out: Any = None,
    return_mask: bool | str | tuple[str, ...] = False,
    padding_side: str = "right",
) -> Any:
    """Pads every tensor along ``pad_dim`` to the longest, then stacks: the result's batch is
    ``[len(list), *batch]``; ``return_mask`` adds a ``"masks"`` tree (or that key) of bools,
    True where the data is real.

    >>> import torch; from tensordict_rs import TensorDict, pad_sequence
    >>> tds = [TensorDict({"a": torch.ones(n)}, [n]) for n in (1, 3)]
    >>> pad_sequence(tds)["a"]
    tensor([[1., 0., 0.],
            [1., 1., 1.]])
    """
    if not len(list_of_tensordicts):
        raise RuntimeError("list_of_tensordicts cannot be empty")
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
    first = list_of_tensordicts[0]
    if return_mask and is_tensorclass(first):
        raise RuntimeError(
            "Expected 'return_mask=False' when list_of_tensordicts contains tensorclasses, but "
            "got 'return_mask=True'. If you want masks, plase convert the tensorclasses to "
            "TensorDicts first."
        )
    masks_key: Any = "masks" if isinstance(return_mask, bool) else return_mask
    tds = [_tree(td) for td in list_of_tensordicts]
    keys = tds[0].keys(include_nested=True, leaves_only=True)
    for td in tds[1:]:
        if set(td.keys(include_nested=True, leaves_only=True)) != set(keys):
            raise KeyError("the tensordicts of pad_sequence must have the same keys")
    # each key is padded to its own longest (as tensordict, through torch's pad_sequence per
    # key); the batch dim, when ``pad_dim`` is one, to the longest of all
    longest_of = dict.fromkeys(keys, 0)
    for td in tds:
        for key in keys:
            shape = td.get(key).shape
            if not shape:
                raise RuntimeError("Cannot pad scalars")
            length = shape[pad_dim if pad_dim >= 0 else len(shape) + pad_dim]
            longest_of[key] = max(longest_of[key], length)
    longest = max(longest_of.values(), default=0)
    padded = []
    for td in tds:
        entries: dict[Any, Any] = {}
        masks: dict[Any, Any] = {}
        batch = list(td.batch_size)
        for key in keys:
            t = td.get(key)
            dim = pad_dim if pad_dim >= 0 else t.dim() + pad_dim
            missing = longest_of[key] - t.shape[dim]
            pads = [0, 0] * (t.dim() - dim - 1) + (
                [0, missing] if padding_side == "right" else [missing, 0]
            )
            entries[key] = torch.nn.functional.pad(t, pads, value=padding_value)
            if return_mask:
                shape = (
                    list(td.batch_size) if dim < td.batch_dims else [*td.batch_size, t.shape[dim]]
                )
                mask = torch.ones(shape, dtype=torch.bool)
                mask_pads = [0, 0] * (len(shape) - dim - 1) + pads[-2:]
                masks[key] = torch.nn.functional.pad(mask, mask_pads, value=False)
        if pad_dim < td.batch_dims:
            batch[pad_dim] = longest
        new = TensorDict({}, batch)
        for key, value in entries.items():
            new.set(key, value)
        for key, value in _non_tensor_entries(td):
            # as tensordict: kept, so that the stack gives one value per tensordict (rows that
            # padding adds along a batch dim hold None)
            if type(value) is NonTensorStack and pad_dim < td.batch_dims:
                grown = list(td.batch_size)
                grown[pad_dim] = longest
                pads = [0, 0] * td.batch_dims
                at = 2 * pad_dim + (1 if padding_side == "right" else 0)
                pads[at] = longest - td.batch_size[pad_dim]
                value = _shape.pad(TensorDict({"v": value}, td.batch_size), pads).get("v")
            new.set(key, value.data if type(value) is NonTensorData else value)
        if return_mask:
            tree = TensorDict({}, batch)
            for key, value in masks.items():
                tree.set(key, value)
            new.set(masks_key, tree)
        padded.append(new)
    result: Any = stack(padded, 0, out=_tree(out)) if out is not None else stack(padded)
    if out is not None:
        return out
    return _rewrap(first, result)


def _non_tensor_entries(td: TensorDict) -> list[tuple[Any, Any]]:
    return [
        (key, value)
        for key, value in td.items(include_nested=True, leaves_only=True, is_leaf=_non_tensor)
        if type(value) is NonTensorData or type(value) is NonTensorStack
    ]


def _non_tensor(cls: type) -> bool:
    return not issubclass(cls, TensorDict)


def merge_tensordicts(
    *tensordicts: Any,
    callback_exist: Callable[..., Any] | Mapping[Any, Callable[..., Any]] | None = None,
) -> Any:
    """A new tree with the entries of all ``tensordicts`` (the first one that has a key wins;
    ``callback_exist(*values)`` combines a key that every tree has).

    >>> import torch; from tensordict_rs import TensorDict, merge_tensordicts
    >>> merge_tensordicts(TensorDict(a=torch.zeros(2), batch_size=[2]),
    ...                   TensorDict(b=torch.ones(2), batch_size=[2])).keys()
    ['a', 'b']
    """
    if len(tensordicts) < 2:
        raise RuntimeError(f"at least 2 tensordicts must be provided, got {len(tensordicts)}")
    trees = [_tree(td) for td in tensordicts]
    out = TensorDict({}, trees[0].batch_size, trees[0].device)
    for td in trees:
        for key, value in td.items(include_nested=True, leaves_only=False):
            if isinstance(value, TensorDict) or key in out.keys(include_nested=True):
                continue
            values = [other.get(key, None) for other in trees]
            callback = (
                callback_exist.get(key) if isinstance(callback_exist, Mapping) else callback_exist
            )
            if callback is not None and all(v is not None for v in values):
                value = callback(*values)
            out.set(key, value.data if isinstance(value, NonTensorData) else value)
    return _rewrap(tensordicts[0], out)


def make_tensordict(
    input_dict: Mapping[str, Any] | None = None,
    batch_size: Sequence[int] | torch.Size | int | None = None,
    device: Any = None,
    auto_batch_size: bool | None = None,
    **kwargs: Any,
) -> TensorDict:
    """A TensorDict from a mapping and keyword entries (the mapping's win on a shared key), as
    ``TensorDict.from_dict``: nested mappings become nested TensorDicts; with
    ``auto_batch_size=True`` each gets the longest leading shape its entries share.

    >>> import torch; from tensordict_rs import make_tensordict
    >>> td = make_tensordict({"a": torch.zeros(3), "b": {"c": torch.zeros(3, 4)}},
    ...                      auto_batch_size=True)
    >>> td.batch_size, td["b"].batch_size
    (torch.Size([3]), torch.Size([3, 4]))
    """
    if input_dict is not None:
        kwargs.update(input_dict)
    return TensorDict.from_dict(
        kwargs, batch_size=batch_size, device=device, auto_batch_size=auto_batch_size
    )


# ------------------------------------------------------------------------ module-level forms
# tensordict's functions of the package namespace (``from tensordict import from_module``):
# each calls the TensorDict method of the same name.


def _forward(name: str, doc: str) -> Callable[..., Any]:
    def function(*args: Any, **kwargs: Any) -> Any:
        return getattr(TensorDict, name)(*args, **kwargs)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"``TensorDict.{name}(...)``: {doc}"
    return function


from_any = _forward("from_any", "a TensorDict from a dict, tuple, dataclass, list, ...")
from_tuple = _forward("from_tuple", "a TensorDict of a tuple's items, keyed '0', '1', ...")
from_namedtuple = _forward("from_namedtuple", "a TensorDict of a named tuple's fields.")
from_struct_array = _forward("from_struct_array", "a TensorDict of a NumPy structured array.")
from_dict = _forward("from_dict", "a TensorDict from a (nested) mapping.")
from_h5 = _forward("from_h5", "a TensorDict of an HDF5 file's datasets (needs h5py).")


def from_module(
    module: Any,
    as_module: bool = False,
    lock: bool = True,
    use_state_dict: bool = False,
    filter_empty: bool = True,
) -> Any:
    """``TensorDict.from_module``, locked by default (as tensordict's function of the package;
    the method's default is unlocked).

    >>> import torch; from tensordict_rs import from_module
    >>> from_module(torch.nn.Linear(2, 3)).is_locked
    True
    """
    return TensorDict.from_module(
        module, as_module=as_module, lock=lock, use_state_dict=use_state_dict,
        filter_empty=filter_empty,
    )  # fmt: skip


def from_modules(
    *modules: Any,
    as_module: bool = False,
    lock: bool = True,
    use_state_dict: bool = False,
    lazy_stack: bool = False,
    expand_identical: bool = False,
) -> Any:
    """``TensorDict.from_modules``, locked by default (as tensordict's function)."""
    return TensorDict.from_modules(
        *modules, as_module=as_module, lock=lock, use_state_dict=use_state_dict,
        lazy_stack=lazy_stack, expand_identical=expand_identical,
    )  # fmt: skip


from_pytree = _forward("from_pytree", "a TensorDict of a pytree's leaves.")
fromkeys = _forward("fromkeys", "a TensorDict with the given keys, each holding one value.")
from_consolidated = _forward("from_consolidated", "a TensorDict over a consolidated file.")
load_memmap = _forward("load_memmap", "a memory-mapped TensorDict loaded from a directory.")
load = _forward("load", "a memory-mapped TensorDict loaded from a directory or archive.")
maybe_dense_stack = _forward("maybe_dense_stack", "the trees stacked (dense here).")


def memmap(data: Any, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> Any:
    """``data.memmap(prefix, ...)``: a memory-mapped copy of ``data`` saved at ``prefix``.

    (``tensordict_rs.memmap`` is the module of ``MemoryMappedTensor``, as in tensordict: this
    function is ``tensordict_rs.functional.memmap``.)

    >>> import torch, tempfile; from tensordict_rs import TensorDict, functional
    >>> path = tempfile.mkdtemp()
    >>> _ = functional.memmap(TensorDict(a=torch.ones(2)), path)
    >>> functional.load_memmap(path)["a"]
    MemoryMappedTensor([1., 1.])
    """
    return data.memmap(prefix, copy_existing, **kwargs)


def save(data: Any, prefix: Any = None, copy_existing: bool = False, **kwargs: Any) -> Any:
    """``data.save(prefix, ...)``: ``data`` saved at ``prefix`` (as ``memmap``)."""
    return data.save(prefix, copy_existing, **kwargs)


def to_safetensors(data: Any, path: Any, **kwargs: Any) -> None:
    """``data.to_safetensors(path)``: the leaves in one safetensors file, with the structure."""
    _tree(data).to_safetensors(path, **kwargs)


def from_safetensors(path: Any, *, device: Any = None, **kwargs: Any) -> TensorDict:
    """A TensorDict of a safetensors file (``TensorDict.from_safetensors``), on ``device``."""
    td = TensorDict.from_safetensors(path, **kwargs)
    return td if device is None else td.to(device)
