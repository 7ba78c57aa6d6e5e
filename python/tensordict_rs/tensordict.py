"""TensorDict: a dictionary of tensors that share leading batch dimensions and a device."""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Concatenate, Generic, ParamSpec, Self

import torch

from ._core import dirty as _dirty
from ._core import index as _index
from ._core import nested as _nested
from ._core.classes import TensorDictBase
from ._core.errors import InplaceWriteError
from ._core.index import key_path as _as_key
from ._core.locking import Lockable, locked_error, refuse_read_only
from ._core.nodes import NTD_TYPES, TD, Key, NonTensorData, TreeNode
from ._core.nontensor import NonTensorStack
from ._core.nontensor_options import get_returns_none
from ._core.repr import compact_repr
from ._core.unbatched import UnbatchedTensor, with_batch_size
from ._core.walk import map_leaves
from .io import checkpoint as _checkpoint
from .io import growth as _growth
from .io import safetensors as _safetensors
from .io.persistence import MemoryMapped
from .memmap import MemoryMappedTensor, _LazyLeaf
from .ops import apply as _apply
from .ops import casts as _casts
from .ops import collate as _collate
from .ops import contexts as _contexts
from .ops import indexing as _indexing
from .ops import inplace as _inplace
from .ops import keys as _keys
from .ops import nested as _nested_ops
from .ops import pointwise as _pointwise
from .ops import pytree as _pytree
from .ops import shape as _shape
from .ops import torch_functions as _torch
from .ops.batch import BatchShape, as_batch_size
from .ops.devices import DeviceMoves, _normalize_device
from .ops.pointwise_types import _PointwiseTypes
from .share import pickling as _pickling
from .share import processes as _sharing
from .share.consolidate import Consolidation
from .share.distributed import Distributed
from .share.map import Methods as _Methods
from .share.processes import Shareable, register

__all__ = ["TensorDict"]

_NO_DEFAULT: Any = object()
_CPU = torch.device("cpu")
_Tensor = torch.Tensor


PathLike = str | os.PathLike[str]
P = ParamSpec("P")


class _classmethod(Generic[P]):
    """``classmethod(fn)`` for a function over trees ``fn(cls: type[TD], ...) -> TD``, typed:
    ``TensorDict.from_dict(...)`` is a ``TensorDict`` (mypy cannot infer ``classmethod`` of a
    generic function). Bound to the class it is read from, as a classmethod is."""

    def __init__(self, fn: Callable[Concatenate[type[Any], P], Any]) -> None:
        self.__func__ = fn
        self.__doc__ = fn.__doc__

    def __get__(self, instance: object, owner: type[TD]) -> Callable[P, TD]:
        return types.MethodType(self.__func__, owner)


class TensorDict(
    _contexts.ShapeContexts,
    BatchShape,
    MemoryMapped,
    DeviceMoves,
    Lockable,
    Distributed,
    Consolidation,
    Shareable,
    _PointwiseTypes,
    _Methods,
):
    """A dictionary of tensors with common leading batch dimensions and an optional device.

    >>> td = TensorDict({"obs": torch.zeros(8, 3), "next": {"done": torch.zeros(8, 1)}}, [8])
    >>> td["next", "done"].shape
    torch.Size([8, 1])

    With ``device``, every entry (now and later) is moved to that device. ``memmap_()`` moves
    every tensor into memory maps (anonymous shared memory, or files under ``prefix``) and
    locks the keys; ``load_memmap(prefix)`` opens a saved directory again, in any process.
    Directories are in tensordict's format and move both ways.
    """

    def __init__(
        self,
        source: Mapping[Any, Any] | None = None,
        batch_size: Any = None,
        device: Any = None,
        names: Any = None,
        *,
        non_blocking: bool = False,
        lock: bool = False,
        **entries: Any,
    ) -> None:
        """Builds a TensorDict from a mapping and/or keyword entries (``TensorDict(a=x,
        batch_size=[3])``); nested mappings become nested TensorDicts, tuple keys nested
        entries; lists of numbers and NumPy arrays become tensors."""
        self._init(as_batch_size(batch_size), _normalize_device(device))
        for key, value in _keys.entry_pairs(source, entries):
            if isinstance(key, str):
                self._set_str(key, value, validate=True, non_blocking=non_blocking)
            else:
                self.set(key, value, non_blocking=non_blocking)
        if names is not None:
            self.names = names
        if lock:
            self.lock_()

    # ------------------------------------------------------------------ entries

    def _get_str(self, key: str) -> Any:
        value = self._tensordict[key]
        cls = type(value)
        if cls is _Tensor or cls is MemoryMappedTensor:  # the common leaves: quick
            return value
        if cls is _LazyLeaf:
            value = value.materialize()
            self._tensordict[key] = value
        elif cls is UnbatchedTensor and value._batch_size != self._batch_size:
            # kept by an operation that changed the batch size: an alias with this tree's
            value = with_batch_size(value, self._batch_size)
            self._tensordict[key] = value
        return value

    def _leaf_info(self, key: str) -> tuple[tuple[int, ...], torch.dtype, torch.device] | None:
        """(shape, dtype, device) of a tensor entry without making a lazy leaf; None otherwise."""
        value = self._tensordict[key]
        if type(value) is _LazyLeaf:
            return value.shape, value.dtype, _CPU
        if isinstance(value, torch.Tensor):
            return _nested.leaf_shape(value), value.dtype, value.device
        return None

    def _entry_shape(self, key: str) -> tuple[int, ...] | None:
        value = self._tensordict[key]
        if isinstance(value, (TensorDict, NonTensorStack)):
            return tuple(value.batch_size)
        info = self._leaf_info(key)
        return None if info is None else info[0]

    def _check_batch(self, key: str, shape: tuple[int, ...] | torch.Size) -> None:
        if tuple(shape[: self.batch_dims]) != tuple(self._batch_size):
            hint = (
                " Python scalars are stored as 0-dim tensors: to store a scalar in a tensordict "
                "with a non-empty batch size, expand it to the batch size or wrap it in "
                "NonTensorData."
                if not shape
                else ""
            )
            raise RuntimeError(
                f"batch dimension mismatch, got self.batch_size={self._batch_size} and "
                f"value.shape={torch.Size(shape)} for key {key!r}. The leading dimensions of a "
                f"value must match the batch size.{hint}"
            )

    def _convert(self, key: str, value: Any, non_blocking: bool) -> Any:
        """Validates a new value for ``key``: device, batch dims, nested mappings."""
        as_node = getattr(value, "_as_node", None)
        if as_node is not None:  # a tensorclass: stored as its TensorDict (of its subclass)
            value = as_node()
        if isinstance(value, TensorDict):
            if tuple(value._batch_size[: self.batch_dims]) != tuple(self._batch_size):
                # as tensordict: a tree of other batch dims is taken as a shallow copy with
                # this tree's batch size, when its entries allow it (the value is left as is)
                copy = value.clone(recurse=False)
                try:
                    copy.batch_size = self._batch_size
                except RuntimeError as err:
                    raise RuntimeError(
                        f"batch dimension mismatch, got self.batch_size={self._batch_size} and "
                        f"a tree of batch size {value.batch_size} for key {key!r}, whose "
                        f"entries do not take this batch size ({err})"
                    ) from None
                value = copy
            if self._device is not None and value.device != self._device:
                value = value.to(self._device, non_blocking=non_blocking)
            if self._names is not None and value.names[: len(self._names)] != self._names:
                value._set_names([*self._names, *value.names[len(self._names) :]])
            elif self._names is None and value._names is not None and self._batch_size:
                # as tensordict: an unnamed tree takes the names of a named sub-tree's dims
                own = value._names[: len(self._batch_size)]
                if any(n is not None for n in own):
                    self._set_names(list(own))
            return value
        if isinstance(value, Mapping):
            nested = TensorDict(value, self._batch_size, self._device, non_blocking=non_blocking)
            if self._names is not None:
                nested._set_names(list(self._names))
            return nested
        value = _keys.leaf_value(value)
        if isinstance(value, NonTensorData):
            return value
        if type(value) is UnbatchedTensor:  # any shape: no batch check
            if self._device is not None and value.device != self._device:
                value = value.to(self._device, non_blocking=non_blocking)
            return with_batch_size(value, self._batch_size)
        if isinstance(value, NonTensorStack):
            self._check_batch(key, value.batch_size)
            if self._device is not None and value.device != self._device:
                value = value.to(self._device)
            return value
        if self._device is not None and value.device != self._device:
            value = value.to(self._device, non_blocking=non_blocking)
        self._check_batch(key, _nested.leaf_shape(value))
        return value

    def _set_str(
        self, key: str, value: Any, *, validate: bool = True, non_blocking: bool = False
    ) -> None:
        if not isinstance(key, str):
            raise TypeError(f"keys are str, got {key!r}")
        if self._is_locked:
            raise locked_error()
        self._tensordict[key] = self._convert(key, value, non_blocking) if validate else value

    def _sub(self, path: tuple[str, ...], create: bool) -> TensorDict:
        td = self
        for part in path:
            if part not in td._tensordict:
                if not create:
                    raise KeyError(
                        f'key "{part}" not found in TensorDict with keys {sorted(td._tensordict)}'
                    )
                child = TensorDict._new_unchecked(td._batch_size, td._device)
                child._names = td._names
                td._set_str(part, child, validate=False)
            td = td._tensordict[part]
            if not isinstance(td, TensorDict):
                raise KeyError(f"{part!r} is a leaf, not a nested TensorDict")
        return td

    def get(self, key: Key, default: Any = _NO_DEFAULT) -> Any:
        """The entry at ``key`` (a str or a tuple of str for nested entries); a non-tensor entry
        comes as its ``NonTensorData`` (``td[key]`` gives the value itself). A missing key gives
        ``default``, or ``None`` without one, as in tensordict (``td[key]`` raises ``KeyError``;
        so does ``get`` after ``set_get_defaults_to_none(False)``).

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2), "b": {"c": torch.ones(2)}}, [2])
        >>> td.get(("b", "c")), td.get("missing", "default"), td.get("missing")
        (tensor([1., 1.]), 'default', None)
        """
        if type(key) is str:  # the common case first: a plain leaf of this level
            value = self._tensordict.get(key)
            cls = type(value)
            if cls is _Tensor or cls is MemoryMappedTensor:
                return value
        if default is _NO_DEFAULT and get_returns_none():
            default = None
        return self._entry(key, default)

    def _entry(self, key: Key, default: Any = _NO_DEFAULT) -> Any:
        """``get``, raising ``KeyError`` for a missing key unless ``default`` is given."""
        path = _as_key(key)
        try:
            td = self._sub(path[:-1], create=False)
            value = td._get_str(path[-1])
        except KeyError:
            if default is not _NO_DEFAULT:
                return default
            raise KeyError(
                f'key "{key}" not found in TensorDict with keys {sorted(self._tensordict)}'
            ) from None
        if type(value) in NTD_TYPES:
            value.batch_size, value.device = td._batch_size, td._device
        elif isinstance(value, TensorDict) and type(value)._tensorclass is not None:
            return type(value)._tensorclass._from_tensordict(value)
        return value

    def set(
        self, key: Key, value: Any, *, inplace: bool = False, non_blocking: bool = False
    ) -> Self:
        """Sets ``key`` to ``value`` (moved to the device, checked against the batch size).

        On a locked TensorDict only ``inplace=True`` on an existing key works: it copies into
        the existing tensor (and so into its memory map).

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({}, [2]).set(("b", "c"), torch.ones(2))  # makes td["b"]
        >>> td.lock_().set(("b", "c"), torch.zeros(2), inplace=True)["b", "c"]
        tensor([0., 0.])
        """
        path = _as_key(key)
        td = self._sub(path[:-1], create=True)  # a missing parent on a locked td: lock error
        if inplace and path[-1] in td._tensordict:
            td._copy_into(path[-1], value, non_blocking)
        else:
            td._set_str(path[-1], value, non_blocking=non_blocking)
        return self

    def set_(self, key: Key, value: Any, *, non_blocking: bool = False) -> Self:
        """Copies ``value`` into the existing entry at ``key``; works on locked TensorDicts.

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2)}, [2], lock=True)
        >>> a = td["a"]
        >>> td.set_("a", torch.ones(2))["a"] is a, a
        (True, tensor([1., 1.]))
        """
        path = _as_key(key)
        td = self._sub(path[:-1], create=False)
        if path[-1] not in td._tensordict:
            raise KeyError(
                f'key "{path[-1]}" not found in TensorDict with keys {sorted(td._tensordict)}'
            )
        td._copy_into(path[-1], value, non_blocking)
        return self

    def _copy_into(self, key: str, value: Any, non_blocking: bool) -> None:
        refuse_read_only(self)
        _dirty.mark(self)
        current = self._get_str(key)
        if isinstance(current, TensorDict):
            current.update_(value)
        elif isinstance(current, NonTensorData):
            if isinstance(value, NonTensorStack) and current._saved is not None:
                # one value in a saved meta.json: it cannot become a stack in place
                same, one = _inplace._one_value(value)
                if not same:
                    raise _indexing.saved_kind_change_error(key, current)
                current.data = one
            elif isinstance(value, NonTensorStack):
                self._tensordict[key] = self._convert(key, value, non_blocking)
            else:
                current.data = value.data if isinstance(value, NonTensorData) else value
        elif isinstance(current, NonTensorStack):
            current[...] = value
        else:
            if type(value).__module__ == "numpy" and hasattr(value, "shape"):
                value = torch.as_tensor(value)  # an array is written as the tensor it holds
            if not isinstance(value, torch.Tensor):
                current.fill_(value)
                return
            self._check_batch(key, value.shape)
            try:
                current.copy_(value, non_blocking=non_blocking)
            except RuntimeError as err:
                if type(err) is not RuntimeError:  # this library's own errors stay as they are
                    raise
                try:
                    fits = torch.broadcast_shapes(current.shape, value.shape) == current.shape
                except RuntimeError:
                    fits = False
                detail = (
                    f"the value of shape {value.shape} does not fit the entry of shape "
                    f"{current.shape}"
                    if not fits
                    else str(err)
                )
                raise InplaceWriteError(f"Failed to update {key!r}: {detail}") from err

    def update(
        self,
        input_dict_or_td: Mapping[Any, Any] | TreeNode | None = None,
        clone: bool = False,
        inplace: bool = False,
        *,
        non_blocking: bool = False,
        keys_to_update: Any = None,
        is_leaf: Callable[[type], bool] | None = None,
        update_batch_size: bool = False,
        ignore_lock: bool = False,
        **kwargs: Any,
    ) -> Self:
        """Sets every entry of ``input_dict_or_td`` and of the keyword arguments (nested
        mappings update nested TensorDicts, whose other entries stay).

        ``clone`` copies the values first; ``inplace`` writes into existing entries (so a
        locked TensorDict accepts it); ``keys_to_update`` limits the keys written (a key
        names its whole subtree); ``is_leaf`` tells which types are not merged into; a tree
        of another batch size replaces the contents and the batch size only with
        ``update_batch_size=True``, as in tensordict.

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2), "b": {"c": torch.zeros(2)}}, [2])
        >>> td.update({"b": {"d": torch.ones(2)}}).keys(include_nested=True)
        ['a', ('b', 'c'), ('b', 'd'), 'b']
        >>> new = {"a": torch.ones(2), "b": {"c": torch.ones(2)}}
        >>> td.update(new, keys_to_update=[("b", "c")])["a"]
        tensor([0., 0.])
        """
        return _inplace.update(
            self, input_dict_or_td, clone, inplace, non_blocking=non_blocking,
            keys_to_update=keys_to_update, is_leaf=is_leaf,
            update_batch_size=update_batch_size, ignore_lock=ignore_lock, **kwargs,
        )  # fmt: skip

    def update_(
        self,
        input_dict_or_td: Mapping[Any, Any] | TreeNode | None = None,
        clone: bool = False,
        *,
        non_blocking: bool = False,
        keys_to_update: Any = None,
        **kwargs: Any,
    ) -> Self:
        """Copies every entry of ``input_dict_or_td`` (and of the keyword arguments) into the
        existing entries (works when locked); an unknown key raises ``KeyError``.

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2)}, [2], lock=True)
        >>> td.update_({"a": torch.ones(2)})["a"]
        tensor([1., 1.])
        """
        return _inplace.update_(
            self, input_dict_or_td, clone, non_blocking=non_blocking,
            keys_to_update=keys_to_update, **kwargs,
        )  # fmt: skip

    def __getitem__(self, index: Any) -> Any:
        """An entry (a str or tuple of str key) or the rows of a batch index (int, slice,
        tensor, ...); a non-tensor entry comes as its value.

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(4), "b": {"c": torch.arange(4) * 10}}, [4])
        >>> td["b", "c"], td[1:3]["a"], td[torch.tensor([3, 0])]["a"]
        (tensor([ 0, 10, 20, 30]), tensor([1, 2]), tensor([3, 0]))
        """
        if type(index) is str:  # the common case first: a plain leaf of this level
            value = self._tensordict.get(index)
            cls = type(value)
            if cls is _Tensor or cls is MemoryMappedTensor:
                return value
        if isinstance(index, str) or (
            isinstance(index, tuple) and not _index.is_batch_index(index)
        ):
            value = self._entry(index)
            if type(value) in NTD_TYPES:
                return value.data
            if type(value) is NonTensorStack:
                return value.tolist(as_linked_list=True)
            return value
        return self._index(index)

    def __setitem__(self, index: Any, value: Any) -> None:
        """Sets an entry (a key) or writes into the rows of a batch index (a value for every
        leaf, or a mapping / TensorDict of entries, new ones zero-filled elsewhere).

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(3)}, [3])
        >>> td["b"] = torch.ones(3)
        >>> td[1:] = 2.0
        >>> td[0] = {"a": 5.0}
        >>> td["a"], td["b"]
        (tensor([5., 2., 2.]), tensor([1., 2., 2.]))
        """
        if isinstance(index, str) or (
            isinstance(index, tuple) and not _index.is_batch_index(index)
        ):
            self.set(index, value)
            return
        self._set_rows(index, value)

    _set_rows = _indexing.set_rows
    _preallocate = _indexing.preallocate

    def __delitem__(self, key: Key) -> None:
        if self._is_locked:
            raise locked_error()
        path = _as_key(key)
        del self._sub(path[:-1], create=False)._tensordict[path[-1]]

    def pop(self, key: Key, default: Any = _NO_DEFAULT) -> Any:
        """Removes ``key`` and returns its value (``default`` when missing and given).

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [2])
        >>> td.pop("b"), td.pop("x", None), td.keys()
        (tensor([1., 1.]), None, ['a'])
        """
        try:
            value = self._entry(key)
        except KeyError:
            if default is _NO_DEFAULT:
                raise
            return default
        del self[key]
        return value

    # the key views: ops/keys.py
    keys = _keys.keys
    values = _keys.values
    items = _keys.items
    __contains__ = _keys.contains

    def __len__(self) -> int:
        return self._batch_size[0] if self._batch_size else 0

    def __iter__(self) -> Iterator[TensorDict]:
        return _shape.iterate(self)

    # ------------------------------------------------------------------ growth in place and
    # incremental checkpoints: io/growth.py, io/checkpoint.py

    extend_ = _growth.extend_
    append_ = _growth.append_
    resize_ = _growth.resize_
    checkpoint = _checkpoint.checkpoint

    # ------------------------------------------------------------------ shape: ops/shape.py

    expand = _shape.expand
    expand_as = _shape.expand_as
    reshape = _shape.reshape
    split = _shape.split
    chunk = _shape.chunk
    unbind = _shape.unbind
    pad = _shape.pad
    densify = _shape.densify

    # ------------------------------------------------------------------ keys: ops/keys.py

    select = _keys.select
    exclude = _keys.exclude
    rename_key_ = _keys.rename_key_
    to_dict = _keys.to_dict
    set_non_tensor = _keys.set_non_tensor
    get_non_tensor = _keys.get_non_tensor
    non_tensor_items = _keys.non_tensor_items
    is_non_tensor = _keys.is_non_tensor
    filter_non_tensor_data = _keys.filter_non_tensor_data
    empty = _keys.empty
    is_empty = _keys.is_empty

    _check_batch_size = _keys.check_batch_size
    _has_non_tensor = property(_keys.has_non_tensor)

    sorted_keys = property(_keys.sorted_keys)

    from_dict = _classmethod(_keys.from_dict)
    fromkeys = _classmethod(_keys.fromkeys)

    # ------------------------------------------------------------------ torch functions

    where = _torch.where
    stack = _classmethod(_torch.stack_classmethod)
    cat = _classmethod(_torch.cat_classmethod)
    lazy_stack = maybe_dense_stack = _classmethod(_torch.lazy_stack_classmethod)
    to_lazystack = _torch.to_lazystack

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """``torch.stack``, ``torch.cat``, ``torch.zeros_like``, ... on TensorDicts (the table
        of ``ops/torch_functions.py``); other torch functions are not implemented for them."""
        return _torch.dispatch(func, args, kwargs)

    # ------------------------------------------------------------------ batch indexing

    to_padded_tensor = _nested_ops.to_padded_tensor

    _index = _indexing.index
    index_select = _indexing.index_select

    # ------------------------------------------------------------------ comparisons (ops/pointwise)

    __eq__ = _pointwise.eq  # type: ignore[assignment]
    __ne__ = _pointwise.ne  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]
    __bool__ = _pointwise.no_bool
    all = _pointwise.all_true
    any = _pointwise.any_true

    # -------------------------------------------------- ops/apply, ops/inplace, ops/pointwise

    apply = _apply.apply
    apply_ = _apply.apply_
    named_apply = _apply.named_apply
    zero_ = _inplace.zero_
    fill_ = _inplace.fill_
    copy_ = _inplace.copy_
    set_at_ = _inplace.set_at_
    update_at_ = _inplace.update_at_
    masked_fill = _inplace.masked_fill
    masked_fill_ = _inplace.masked_fill_
    add = _pointwise.add
    add_ = _pointwise.add_
    sub = _pointwise.sub
    sub_ = _pointwise.sub_
    clamp = _pointwise.clamp
    clamp_min = _pointwise.clamp_min
    clamp_max = _pointwise.clamp_max
    lerp = _pointwise.lerp
    detach = _pointwise.detach
    detach_ = _pointwise.detach_
    contiguous = _pointwise.contiguous
    to_tensordict = _pointwise.to_tensordict
    # operators (+, +=, -, <, ~, ...) and the casts float(), int(), bool(), ...: set below

    def clone(self, recurse: bool = True) -> TensorDict:
        """A copy; with ``recurse`` (default) every tensor is copied too (to plain tensors).

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2)}, [2])
        >>> td.clone()["a"] is td["a"], td.clone(recurse=False)["a"] is td["a"]
        (False, True)
        """
        if recurse:
            whole = _pickling.clone_whole(self)  # leaves in one buffer: one copy of it
            if whole is not None:
                return whole
            return map_leaves(
                self, lambda t: t.clone() if t.is_nested else t.clone().as_subclass(torch.Tensor)
            )
        return map_leaves(self, lambda t: t)

    # ------------------------------------------------------------------ safetensors, repr, pickling

    from_safetensors = _classmethod(_safetensors.from_safetensors)
    to_safetensors = _safetensors.to_safetensors

    def __repr__(self) -> str:
        return compact_repr(self)

    __getstate__ = _sharing.getstate
    __setstate__ = _sharing.setstate

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickling: with protocol 5, one out-of-band buffer for the whole tree and its
        description in-band (zero-copy through Ray's object store; see
        ``share/pickling.py``); below 5, leaf by leaf (``__getstate__``).

        >>> import pickle, torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0)}, [3])
        >>> buffers = []
        >>> data = pickle.dumps(td, protocol=5, buffer_callback=buffers.append)
        >>> pickle.loads(data, buffers=buffers)["a"], len(buffers)
        (MemoryMappedTensor([0., 1., 2.]), 1)
        """
        return _pickling.reduce_ex(self, protocol)

    is_read_only = property(_pickling.is_read_only)


register(TensorDict)
TensorDictBase.register(TensorDict)
_pytree.register(TensorDict)
# DataLoader's default collate stacks trees and tensorclasses (as tensordict's)
_collate.register(TensorDict)
_collate.register(_collate.AnyTensorClass)

# Set after the class body so that the casts named float/int/bool do not shadow the builtins there.
for _name, _method in {**_pointwise.methods(), **_casts.CASTS}.items():
    setattr(TensorDict, _name, _method)


_pairs = _indexing.pairs
