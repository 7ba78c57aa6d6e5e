"""Strings per row: ``NonTensorStack`` (a value per element), ``LinkedList``, ``is_non_tensor``.

A stack is a *store* of cells and a *position array*: ``_pos`` is an int64 NumPy array with the
stack's batch shape, each element the index of its cell in the store. Indexing and shape
operations are the NumPy operations on ``_pos`` (NumPy's indexing rules are torch's): basic
indexing (ints, slices, None, Ellipsis) returns a view on the same store, so a write through it
reaches the source, as in tensordict; advanced indexing (tensors, lists, masks) gathers the cells
into a new store (a copy, as tensordict copies). The store is a list of Python values, or a packed
column of strings (``_native.StrColumn``: UTF-8 bytes and offsets in one buffer, what a loaded
stack of strings is) that becomes a list on the first write.

The store is in ``nontensor_store``, the shape operations (``StackShapes``) in
``nontensor_shape``, saving (``StackFiles``) in ``nontensor_files``, and ``LinkedList`` in
``linked_list``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .. import _native
from .linked_list import LinkedList, _nest, flatten_list, list_shape
from .nodes import NTD_TYPES, NonTensorData, _json_text
from .nontensor_files import StackFiles
from .nontensor_shape import StackShapes, index_data_dims, stacked_data_dims
from .nontensor_store import MemberCells, StrColumn, _Cells, _is_arange
from .shared_value import SharedValue

_BASIC = (int, slice, type(None), type(Ellipsis))


def _flat_positions(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


def _np_index(index: Any) -> tuple[Any, bool]:
    """``index`` in NumPy's terms, and whether it is basic (a view)."""
    parts = index if isinstance(index, tuple) else (index,)
    basic = True
    out: list[Any] = []
    for part in parts:
        if isinstance(part, bool) or isinstance(part, np.bool_):
            basic = False
            out.append(bool(part))
        elif isinstance(part, _BASIC):
            if isinstance(part, slice) and part.step is not None and part.step <= 0:
                raise ValueError("step must be greater than zero")
            out.append(part)
        elif isinstance(part, torch.Tensor):
            basic = False
            if part.dtype == torch.bool:
                out.append(part.detach().cpu().numpy())
            elif part.is_floating_point() or part.is_complex():
                raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
            else:
                out.append(part.detach().cpu().numpy().astype(np.int64))
        elif isinstance(part, np.ndarray):
            basic = False
            out.append(part)
        elif isinstance(part, range):
            basic = False
            out.append(np.asarray(part, dtype=np.int64))
        elif isinstance(part, Sequence):
            basic = False
            array = np.asarray(part)
            out.append(array.astype(np.int64) if array.dtype.kind in "iu" else array)
        elif hasattr(part, "__index__"):
            out.append(part.__index__())
        else:
            raise IndexError(f"unsupported index {part!r}")
    return (tuple(out) if isinstance(index, tuple) else out[0]), basic


class NonTensorStack(StackShapes, StackFiles):
    """A stack of non-tensor values, one per batch element (strings per row, for instance).

    ``td["names"] = ["a", "b", "c"]`` makes one; so does ``torch.stack`` of TensorDicts whose
    non-tensor values differ, ``NonTensorStack("a", "b")`` and ``NonTensorStack.from_list``.
    ``td["names"]`` returns a ``LinkedList`` of the values, ``td.get("names")`` the stack;
    ``td[i]["names"]`` the value of row ``i``. Saved as the JSON list tensordict writes.

    A stack of entries of more than 0 dims keeps its members: ``torch.stack`` of two
    TensorDicts of batch size ``[3]`` holding ``"a"`` and ``"b"`` gives a stack whose ``[0]``
    is the member ``NonTensorData("a", batch_size=[3])``, as in tensordict (``[:, 0]`` is a
    stack of two values).

    >>> stack = NonTensorStack.from_list([["a", "b"], ["c", "d"]])
    >>> stack.batch_size, stack[1, 0].data, stack[:, 1].tolist()
    (torch.Size([2, 2]), 'c', ['b', 'd'])
    """

    __slots__ = ("__weakref__", "_cells", "_data_dims", "_device", "_pos", "stack_dim")

    _is_non_tensor = True

    def __init__(
        self,
        *values: Any,
        stack_dim: int = 0,
        device: Any = None,
        batch_size: Sequence[int] | None = None,
    ) -> None:
        members = [_as_member(v) for v in values]
        if not members:
            # an empty stack of members of batch size ``batch_size``, as tensordict builds it
            tail = () if batch_size is None else tuple(torch.Size(batch_size))
            self._cells = _Cells([])
            self._pos = np.zeros((0, *tail), dtype=np.int64)
            self._device = None if device is None else torch.device(device)
            self.stack_dim = 0
            self._data_dims = None
            return
        shape = members[0]._pos.shape
        for member in members[1:]:
            if member._pos.shape != shape:
                raise RuntimeError(
                    "cannot stack non-tensor entries of different batch sizes: "
                    f"{torch.Size(shape)} and {torch.Size(member._pos.shape)}"
                )
        ndim = len(shape) + 1
        if not -ndim <= stack_dim < ndim:
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], "
                f"but got {stack_dim})"
            )
        dim = stack_dim % ndim
        cells: list[Any] = []
        positions = []
        for member in members:
            positions.append(len(cells) + _dense_positions(member))
            cells.extend(member._cells.get(member._pos.ravel()))
        self._cells = _Cells(cells)
        self._pos = np.stack(positions, axis=dim)
        self._device = torch.device(device) if device is not None else _common_device(members)
        self.stack_dim = dim
        # which dims are the members' own (an index selecting one member gives it back)
        self._data_dims = stacked_data_dims(
            [_member_dims(v, m) for v, m in zip(values, members, strict=True)], len(shape), dim
        )
        if batch_size is not None and torch.Size(batch_size) != self.batch_size:
            raise RuntimeError(
                f"batch_size does not match self.batch_size: {torch.Size(batch_size)} vs "
                f"{self.batch_size}."
            )

    # ------------------------------------------------------------------ construction
    @classmethod
    def _from_parts(
        cls,
        cells: _Cells,
        pos: np.ndarray,
        device: torch.device | None,
        stack_dim: int = 0,
        data_dims: tuple[bool, ...] | None = None,
    ) -> NonTensorStack:
        out = cls.__new__(cls)
        out._cells = cells
        out._pos = pos
        out._device = device
        out.stack_dim = stack_dim
        keep = data_dims is not None and len(data_dims) == pos.ndim and any(data_dims)
        out._data_dims = data_dims if keep else None
        return out

    @classmethod
    def from_values(
        cls, values: list[Any], shape: Sequence[int], device: Any = None
    ) -> NonTensorStack:
        """A stack of the given shape over ``values`` in row-major order (a list, or a packed
        column of strings), taken as they are."""
        n = len(values)
        if int(np.prod(shape, dtype=np.int64)) != n:
            raise ValueError(f"{n} values do not fill a stack of shape {list(shape)}")
        return cls._from_parts(
            _Cells(values),
            _flat_positions(n).reshape(tuple(shape)),
            None if device is None else torch.device(device),
        )

    @classmethod
    def _from_loaded(
        cls, cells: Any, shape: Sequence[int], device: Any, stack_dim: int
    ) -> NonTensorStack:
        """A stack from what the Rust core read (a saved directory, a message): its strings as
        a packed column (``(values_bytes, offsets_bytes)``), or the JSON text of its cells."""
        values: Any = StrColumn(*cells) if isinstance(cells, tuple) else json.loads(cells)
        out = cls.from_values(values, shape, device)
        out.stack_dim = stack_dim
        return out

    @classmethod
    def from_list(cls, non_tensors: list[Any], device: Any = None) -> NonTensorStack:
        """A stack of the values of ``non_tensors``; nested lists of equal lengths are dims.

        >>> NonTensorStack.from_list([["a", "b"], ["c", "d"]]).batch_size
        torch.Size([2, 2])
        """
        shape = list_shape(non_tensors)
        flat = flatten_list(non_tensors, len(shape))
        flat = [v.data if type(v) in NTD_TYPES else v for v in flat]
        return cls.from_values(flat, shape, device)

    @classmethod
    def concatenate(cls, values: Sequence[Any], dim: int = 0) -> NonTensorStack:
        """The entries ``values`` (stacks, or NonTensorData with their batch sizes) joined along
        batch dim ``dim``, as ``torch.cat`` joins tensors."""
        members = [_as_member(v) for v in values]
        cells: list[Any] = []
        positions = []
        for member in members:
            positions.append(torch.from_numpy(len(cells) + _dense_positions(member)))
            cells.extend(member._cells.get(member._pos.ravel()))
        pos = torch.cat(positions, dim).numpy()
        return cls._from_parts(_Cells(cells), pos, _common_device(members))

    def where(
        self, condition: torch.Tensor, other: Any, *, out: Any = None, pad: Any = None
    ) -> NonTensorStack:
        """This stack's values where ``condition`` holds, ``other``'s elsewhere (as
        ``torch.where(condition, self, other)``); with ``out`` (a stack of the same batch
        size) the values are written into it and ``out`` is returned, as in tensordict.
        ``pad`` (for keys missing on one side of a TensorDict) has nothing to fill here.

        >>> import torch
        >>> flags = torch.tensor([True, False])
        >>> NonTensorStack("a", "b").where(flags, NonTensorStack("c", "d")).tolist()
        ['a', 'd']
        """
        result = NonTensorStack.select(condition, self, other)
        if out is None:
            return result
        out[...] = result
        return out  # type: ignore[no-any-return]

    @classmethod
    def select(cls, condition: torch.Tensor, input: Any, other: Any) -> NonTensorStack:
        """The values of ``input`` where ``condition`` holds, of ``other`` elsewhere (entries
        with their batch sizes; ``condition`` broadcast over their leading dims): what
        ``torch.where`` and ``TensorDict.where`` do with non-tensor entries."""
        mine, theirs = _as_member(input), _as_member(other)
        shape = mine._pos.shape
        if theirs._pos.shape != shape:
            raise RuntimeError(
                f"where: the entries have batch sizes {torch.Size(shape)} and "
                f"{torch.Size(theirs._pos.shape)}"
            )
        flags = condition.detach().cpu().numpy().astype(bool)
        flags = flags.reshape(flags.shape + (1,) * (len(shape) - flags.ndim))
        pick = np.broadcast_to(flags, shape).ravel()
        a, b = mine.values_flat(), theirs.values_flat()
        values = [x if keep else y for keep, x, y in zip(pick.tolist(), a, b, strict=True)]
        return cls.from_values(values, shape, _common_device([mine, theirs]))

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """``torch.stack``, ``torch.cat`` and ``torch.where`` of stacks (and NonTensorData);
        nothing else."""
        kwargs = kwargs or {}
        if func is torch.stack or func is torch.cat:
            values = list(args[0] if args else kwargs["tensors"])
            if any(not is_non_tensor(v) for v in values):
                return NotImplemented
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if func is torch.stack:
                return cls(*values, stack_dim=dim)
            return cls.concatenate(values, dim)
        names = ("condition", "input", "other")
        if func is torch.where and all(n in kwargs for n in names[len(args) :]):
            condition, input, other = (*args, *(kwargs[n] for n in names[len(args) :]))
            return cls.select(condition, input, other)
        return NotImplemented

    # ------------------------------------------------------------------ properties
    @property
    def batch_size(self) -> torch.Size:
        """The batch size (the shape of the stack)."""
        return torch.Size(self._pos.shape)

    shape = batch_size

    @property
    def batch_dims(self) -> int:
        """The number of batch dims."""
        return self._pos.ndim

    ndim = batch_dims

    def dim(self) -> int:
        """The number of batch dims."""
        return self._pos.ndim

    def numel(self) -> int:
        """The number of values."""
        return int(self._pos.size)

    @property
    def device(self) -> torch.device | None:
        """The device of the entry (the values themselves are Python objects)."""
        return self._device

    @property
    def names(self) -> None:
        """Dim names: always None."""
        return None

    @property
    def data(self) -> Any:
        """The value every element holds; AttributeError when they differ (use ``tolist``).

        >>> NonTensorStack("x", "x").data
        'x'
        """
        values = self._cells.get(self._pos.ravel())
        if values:
            first = values[0]
            if all(v is first or _equal(v, first) for v in values[1:]):
                return first
        raise AttributeError(
            "Cannot get the non-unique data of a NonTensorStack. Use .tolist() instead."
        )

    def tolist(self, *, as_linked_list: bool = False, **_: Any) -> Any:
        """The values in nested lists, one item per batch element.

        >>> NonTensorStack("a", "b").tolist()
        ['a', 'b']
        """
        flat = self._cells.get(self._pos.ravel())
        out = _nest(flat, self._pos.shape)
        if as_linked_list:
            return LinkedList._bound(out, self)
        return out

    def to_dict(self, **_: Any) -> Any:
        """The values as nested lists (as ``tolist``)."""
        return self.tolist()

    def values_flat(self) -> list[Any]:
        """The values in row-major order."""
        return self._cells.get(self._pos.ravel())

    # ------------------------------------------------------------------ indexing
    def __len__(self) -> int:
        if not self._pos.ndim:
            raise TypeError("len() of a 0-d NonTensorStack")
        return int(self._pos.shape[0])

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def __getitem__(self, index: Any) -> Any:
        np_index, basic = _np_index(index)
        try:
            pos = self._pos[np_index]
        except IndexError as err:
            raise IndexError(str(err).replace("axis", "dimension")) from None
        if not isinstance(pos, np.ndarray) or pos.ndim == 0:
            return self._row(int(pos))
        flags = self._data_dims
        if flags is not None:
            flags = index_data_dims(flags, np_index)
        return self._select(pos, flags, basic)

    def __setitem__(self, index: Any, value: Any) -> None:
        np_index, _ = _np_index(index)
        target = np.asarray(self._pos[np_index])
        if target.ndim == 0:
            scalar = _scalar_value(value)

            def change(cells: list[Any]) -> None:
                cells[int(target)] = scalar

        else:
            values = _broadcast_values(value, target.shape)

            def change(cells: list[Any]) -> None:
                for cell, item in zip(target.ravel().tolist(), values, strict=True):
                    cells[cell] = item

        self._cells.modify(change)

    # ------------------------------------------------------------------ updates (saves: StackFiles)
    def update(
        self, other: Any, inplace: bool = False, non_blocking: bool = False, **_: Any
    ) -> NonTensorStack:
        """Writes the values of ``other`` (a stack of this batch size, or one value for every
        element). A memory-mapped stack is locked: it needs ``inplace=True``, as in tensordict.

        >>> NonTensorStack("a", "b").update(NonTensorStack("c", "d")).tolist()
        ['c', 'd']
        """
        if not inplace and self.is_locked:
            raise RuntimeError(
                "Cannot modify locked TensorDict. For in-place modification, consider using "
                "the `set_()` method and make sure the key is present."
            )
        return self.update_(other)

    def update_(self, other: Any, non_blocking: bool = False, **_: Any) -> NonTensorStack:
        """Writes the values of ``other`` into every element, in place (a saved stack's file
        and a shared stack's memory follow).

        >>> NonTensorStack("a", "b").update_(NonTensorData("z")).tolist()
        ['z', 'z']
        """
        self[...] = other
        return self

    def update_at_(self, other: Any, index: Any, non_blocking: bool = False) -> NonTensorStack:
        """Writes ``other`` into the elements ``index``, in place.

        >>> NonTensorStack("a", "b", "c").update_at_(NonTensorData("z"), slice(1, None)).tolist()
        ['a', 'z', 'z']
        """
        self[index] = other
        return self

    # ------------------------------------------------------------------ views, copies (StackShapes)
    def _gathered(
        self, pos: np.ndarray, data_dims: tuple[bool, ...] | None = None
    ) -> NonTensorStack:
        """A copy holding the cells ``pos`` (any shape); a copy of the whole stack
        (``pos is self._pos``) keeps its members, else ``data_dims`` tells its members' dims."""
        return NonTensorStack._from_parts(
            self._cells.take(pos.ravel()),
            _flat_positions(pos.size).reshape(pos.shape),
            self._device,
            data_dims=self._data_dims if pos is self._pos else data_dims,
        )

    def _view(self, pos: np.ndarray, data_dims: tuple[bool, ...] | None = None) -> NonTensorStack:
        return NonTensorStack._from_parts(self._cells, pos, self._device, data_dims=data_dims)

    def _select(self, pos: np.ndarray, data_dims: tuple[bool, ...] | None, view: bool) -> Any:
        """The elements ``pos`` (a view of the cells, or a copy of them): a stack whose
        members' own dims are ``data_dims``, or, when every dim is a member's own (one member
        selected) and its elements hold one value, that member as a ``NonTensorData`` bound
        to its cells (writing its ``data`` writes every element of the member)."""
        out = self._view(pos, data_dims) if view else self._gathered(pos, data_dims)
        if data_dims is None or not all(data_dims) or not pos.size:
            return out
        ids = out._pos.ravel()
        values = out._cells.get(ids)
        first = values[0]
        if not all(v is first or _equal(v, first) for v in values[1:]):
            return out  # an element was written: the member is a stack now, as in tensordict
        member = NonTensorData(first, batch_size=pos.shape, device=self._device)
        member._cell = (MemberCells(out._cells, ids.copy()), 0)
        return member

    def _row(self, cell: int) -> NonTensorData:
        """The element in cell ``cell`` as a ``NonTensorData`` bound to it: it reads the
        stack's value and writes into it (``.data = ...``, ``update_``), as tensordict's
        elements of a stack are its members. A copy (``clone``) is not bound."""
        row = NonTensorData(self._cells.one(cell), batch_size=[], device=self._device)
        row._cell = (self._cells, cell)
        return row

    def clone(self, recurse: bool = True) -> NonTensorStack:
        """A copy: new cells (their values deep-copied when ``recurse``)."""
        out = self._gathered(self._pos)
        if recurse and type(out._cells.values) is list:
            out._cells.values = copy.deepcopy(out._cells.values)
        out.stack_dim = self.stack_dim
        return out

    def to(self, *args: Any, **kwargs: Any) -> NonTensorStack:
        """The stack on another device (a dtype is ignored: the values are not tensors)."""
        device = kwargs.get("device")
        for arg in args:
            if isinstance(arg, (str, torch.device, int)):
                device = arg
        if device is None:
            return self
        return NonTensorStack._from_parts(
            self._cells, self._pos, torch.device(device), self.stack_dim, self._data_dims
        )

    def cpu(self) -> NonTensorStack:
        """The stack on the CPU."""
        return self.to("cpu")

    def is_shared(self) -> bool:
        """True for a stack whose values are in shared memory (``share_memory_()``,
        ``memmap_(share_non_tensor=True)``): other processes holding it see its writes."""
        return self._cells.shared is not None

    _is_shared = property(is_shared)

    def maybe_to_stack(self) -> NonTensorStack:
        """The stack itself (``NonTensorData.maybe_to_stack`` gives one)."""
        return self

    def contiguous(self, *, canonical: bool = False) -> NonTensorStack:
        """The stack itself: it is its own contiguous form, as in tensordict."""
        return self

    def is_empty(self) -> bool:
        """Always False: a stack holds values."""
        return False

    # ------------------------------------------------------------------ comparisons
    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        return self._compare(other, equal=True)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        return self._compare(other, equal=False)

    def _compare(self, other: Any, equal: bool) -> torch.Tensor:
        mine = self.values_flat()
        if isinstance(other, NonTensorStack):
            if other.batch_size != self.batch_size:
                raise RuntimeError(
                    f"cannot compare stacks of batch sizes {self.batch_size} and {other.batch_size}"
                )
            theirs = other.values_flat()
        elif type(other) in NTD_TYPES:
            theirs = [other.data] * len(mine)
        else:
            flat = flatten_list(other, self._pos.ndim) if isinstance(other, list) else None
            theirs = [other] * len(mine) if flat is None or len(flat) != len(mine) else flat
        flags = [_equal(a, b) == equal for a, b in zip(mine, theirs, strict=True)]
        return torch.tensor(flags, dtype=torch.bool, device=self._device).reshape(self.batch_size)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        text = str(self.tolist())
        if len(text) > 50:
            text = f"{text[:50]}..."
        return (
            f"NonTensorStack(\n    {text},\n    batch_size={self.batch_size},\n"
            f"    device={self._device})"
        )

    def __reduce__(self) -> Any:
        cells = self._cells._fresh()
        ids = self._pos.ravel()
        if type(cells) is list:
            values: Any = [cells[i] for i in ids.tolist()]
        else:  # a packed column stays one (two byte strings in the pickle)
            values = cells if _is_arange(ids, len(cells)) else cells.take(ids)
        return (_rebuild, (values, tuple(self._pos.shape), self._device, self.stack_dim))


def _rebuild(
    values: list[Any], shape: tuple[int, ...], device: Any, stack_dim: int
) -> NonTensorStack:
    out = NonTensorStack.from_values(values, shape, device)
    out.stack_dim = stack_dim
    return out


# ---------------------------------------------------------------------- helpers


def _as_member(value: Any) -> NonTensorStack:
    if isinstance(value, NonTensorStack):
        return value
    if type(value) in NTD_TYPES:
        batch = tuple(value.batch_size)
        n = int(np.prod(batch, dtype=np.int64))
        return NonTensorStack._from_parts(
            _Cells([value.data] * n), _flat_positions(n).reshape(batch), value.device
        )
    return NonTensorStack._from_parts(_Cells([value]), np.zeros((), dtype=np.int64), None)


def _member_dims(value: Any, member: NonTensorStack) -> tuple[bool, ...] | None:
    """Which dims of a stacked entry are its own: all of a ``NonTensorData`` (one value over
    its batch size), those a stack recorded (none for a stack of values)."""
    if isinstance(value, NonTensorStack):
        return value._data_dims
    if type(value) in NTD_TYPES:
        return (True,) * member._pos.ndim
    return None


def _dense_positions(stack: NonTensorStack) -> np.ndarray:
    return _flat_positions(stack._pos.size).reshape(stack._pos.shape)


def _common_device(members: Sequence[NonTensorStack]) -> torch.device | None:
    devices = {m._device for m in members}
    return devices.pop() if len(devices) == 1 else None


def _equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        result = a == b
        if isinstance(result, torch.Tensor):
            return bool(result.all())
        if isinstance(result, np.ndarray):
            return bool(result.all())
        return bool(result)
    except Exception:
        return False


def _scalar_value(value: Any) -> Any:
    if type(value) in NTD_TYPES:
        return value.data
    if isinstance(value, NonTensorStack):
        if value.numel() != 1:
            raise RuntimeError(
                f"cannot write a stack of batch size {value.batch_size} into one element"
            )
        return value.values_flat()[0]
    return value


def _broadcast_values(value: Any, shape: tuple[int, ...]) -> list[Any]:
    """The values ``value`` writes into cells of ``shape``, row-major."""
    n = int(np.prod(shape, dtype=np.int64))
    if isinstance(value, list):
        value = NonTensorStack.from_list(value)
    if isinstance(value, NonTensorStack):
        pos = value._pos
        try:
            pos = np.broadcast_to(pos, shape)
        except ValueError:
            raise RuntimeError(
                f"cannot write a stack of batch size {value.batch_size} into "
                f"{torch.Size(shape)} elements"
            ) from None
        return value._cells.get(pos.ravel())
    if type(value) in NTD_TYPES:
        value = value.data
    return [value] * n


def is_non_tensor(value: Any) -> bool:
    """True for a non-tensor entry: ``NonTensorData`` or ``NonTensorStack``."""
    return type(value) in NTD_TYPES or isinstance(value, NonTensorStack)


def share_entries(td: Any) -> None:
    """Puts the values of every ``NonTensorData`` and ``NonTensorStack`` of the tree ``td``
    (nested trees included) in shared memory, one cell each, all in one arena: what
    ``share_memory_()`` and ``memmap_(share_non_tensor=True)`` do, as in tensordict. Processes
    that receive the tree then read and write the same values. A value that JSON cannot hold
    stays this process's own (it is sent by value, as before), since values are stored as
    JSON.

    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"name": "a", "rows": ["x", "y"]}, [2])
    >>> share_entries(td)
    >>> td.get("name")._is_shared, td.get("rows").is_shared()
    (True, True)
    """
    found: list[tuple[Any, bytes]] = []

    def walk(node: Any, path: tuple[str, ...]) -> None:
        for key, value in node._tensordict.items():
            name = ".".join((*path, key))
            try:
                if type(value) in NTD_TYPES:
                    if value._shared is None:
                        found.append((value, _json_text(value.data, name).encode("utf-8")))
                elif type(value) is NonTensorStack:
                    if value._cells.shared is None:
                        found.append((value._cells, value._cells.share(name)))
            except _native.InvalidTreeError:
                # not JSON: stays a value of this process (sent by value), written in place
                # nowhere (tensordict refuses that too)
                if type(value) in NTD_TYPES:
                    value._local = name
                continue
            if isinstance(getattr(value, "_tensordict", None), dict):  # a tree
                walk(value, (*path, key))

    walk(td, ())
    if not found:
        return
    cells = SharedValue.create_many([text for _, text in found])
    for (owner, _), cell in zip(found, cells, strict=True):
        if type(owner) in NTD_TYPES:
            owner._shared = cell
        else:
            owner.shared = cell
