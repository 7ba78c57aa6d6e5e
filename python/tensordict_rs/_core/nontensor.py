"""Strings per row: ``NonTensorStack`` (a value per element), ``LinkedList``, ``is_non_tensor``.

A stack is a *store* of cells and a *position array*: ``_pos`` is an int64 NumPy array with the
stack's batch shape, each element the index of its cell in the store. Indexing and shape
operations are the NumPy operations on ``_pos`` (NumPy's indexing rules are torch's): basic
indexing (ints, slices, None, Ellipsis) returns a view on the same store, so a write through it
reaches the source, as in tensordict; advanced indexing (tensors, lists, masks) gathers the cells
into a new store (a copy, as tensordict copies). The store is a list of Python values, or a packed
column of strings (``_native.StrColumn``: UTF-8 bytes and offsets in one buffer, what a loaded
stack of strings is) that becomes a list on the first write.
"""

from __future__ import annotations

import copy
import json
import os
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .. import _native
from .nodes import NTD_TYPES, NonTensorData, _json_text
from .shared_value import SharedValue

_BASIC = (int, slice, type(None), type(Ellipsis))


class StrColumn:
    """A packed column of strings: their UTF-8 bytes back to back and ``n + 1`` int64 offsets
    (NumPy arrays, over the buffers a load returns). What a loaded stack of strings holds: no
    Python object per row until a row is read, and the bytes cross to other processes as two
    buffers, not as a million ``str``.

    >>> column = StrColumn.from_strings(["a", "bé", ""])
    >>> len(column), column.tolist(), column.take(np.array([2, 1])).tolist()
    (3, ['a', 'bé', ''], ['', 'bé'])
    """

    __slots__ = ("offsets", "values")

    def __init__(self, values: Any, offsets: Any) -> None:
        self.values = (
            np.frombuffer(values, dtype=np.uint8) if not isinstance(values, np.ndarray) else values
        )
        self.offsets = (
            np.frombuffer(offsets, dtype=np.int64)
            if not isinstance(offsets, np.ndarray)
            else offsets
        )

    @classmethod
    def from_strings(cls, strings: list[str]) -> StrColumn:
        """A column of ``strings``."""
        encoded = [s.encode("utf-8") for s in strings]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return cls(b"".join(encoded), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _addresses(self) -> tuple[int, int, int, int]:
        values = self.values if self.values.size else np.zeros(1, dtype=np.uint8)
        return (
            values.ctypes.data,
            int(self.values.size),
            self.offsets.ctypes.data,
            int(self.offsets.size),
        )

    def get(self, ids: np.ndarray) -> list[Any]:
        """The strings ``ids`` (a flat int64 array), in one native call."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        values, nbytes, offsets, count = self._addresses()
        return _native.decode_strings(  # type: ignore[no-any-return]
            values, nbytes, offsets, count, ids.ctypes.data if ids.size else 0, int(ids.size)
        )

    def tolist(self) -> list[Any]:
        """Every string, in order."""
        return self.get(np.arange(len(self), dtype=np.int64))

    def take(self, ids: np.ndarray) -> StrColumn:
        """A new column of the strings ``ids`` (their bytes gathered)."""
        ids = np.asarray(ids, dtype=np.int64).ravel()
        starts = self.offsets[ids]
        lengths = self.offsets[ids + 1] - starts
        offsets = np.zeros(ids.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        if total == 0:
            return StrColumn(np.zeros(0, dtype=np.uint8), offsets)
        base = np.repeat(starts - offsets[:-1], lengths)
        return StrColumn(self.values[base + np.arange(total)], offsets)

    def json(self, shape: Sequence[int]) -> bytes:
        """The column as the nested JSON arrays of a stack's meta.json."""
        values, nbytes, offsets, count = self._addresses()
        return _native.strings_json(values, nbytes, offsets, count, list(shape))  # type: ignore[no-any-return]

    def __reduce__(self) -> Any:
        return (StrColumn, (self.values.tobytes(), self.offsets.tobytes()))


class _Cells:
    """The values of one or more stacks (views share it): a list, or a packed string column.

    ``saved`` is set for the cells of a stack that is saved in a directory: (a weak reference
    to that stack, the directory that holds it, its key); a write through any view of the cells
    then writes the stack's meta.json again, as tensordict does. ``shared`` is set for the
    cells of a shared stack (``share_memory_``, ``share_non_tensor=True``): a
    ``SharedValue`` holding the JSON list of the cells, which every process holding the tree
    reads and writes (this process's list is refreshed when another process wrote).
    """

    __slots__ = ("memmapped", "saved", "shared", "values")

    def __init__(self, values: Any) -> None:
        self.values = values
        # (the stack, its parent directory, its key), or (the stack, its own directory, None)
        # for a stack saved on its own (``stack.memmap(prefix)``)
        self.saved: tuple[Any, Any, str | None] | None = None
        self.shared: SharedValue | None = None
        self.memmapped = False  # memory-mapped (saved, or ``memmap_()`` without a prefix)

    def written(self) -> None:
        """Writes the saved stack these cells belong to again (if any)."""
        if self.saved is None:
            return
        ref, parent, key = self.saved
        stack = ref()
        if stack is None:
            self.saved = None
            return
        data, shape = stack.json_data("<stack>" if key is None else key)
        device = None if stack.device is None else str(stack.device)
        if key is None:
            _native.write_stack_dir(os.fspath(parent), stack.stack_dim, device, data, shape)
        else:
            _native.rewrite_stack(os.fspath(parent), key, stack.stack_dim, device, data, shape)

    def _fresh(self) -> Any:
        """The values, read again from shared memory when another process wrote them."""
        shared = self.shared
        if shared is not None and shared.changed():
            self.values = shared.get()
        return self.values

    def writable(self) -> list[Any]:
        """The cells as a list (a packed column is decoded once, for every view)."""
        if type(self._fresh()) is not list:
            self.values = self.values.tolist()
        return self.values  # type: ignore[no-any-return]

    def modify(self, change: Any) -> None:
        """Calls ``change(cells)`` on the cells as a list, then writes them where they are kept:
        shared memory (under its lock, so that writes of other processes to other rows are
        kept) and the saved stack's meta.json."""
        shared = self.shared
        if shared is None:
            change(self.writable())
        else:

            def apply(current: list[Any]) -> bytes:
                before = self.values
                self.values = current
                try:
                    change(current)
                    return _shared_text(current)
                except BaseException:
                    self.values = before
                    raise

            shared.update(apply)
        self.written()

    def take(self, ids: np.ndarray) -> _Cells:
        """A new store holding the cells ``ids`` (flat), in that order."""
        values = self._fresh()
        if type(values) is list:
            return _Cells([values[i] for i in ids.tolist()])
        return _Cells(values.take(ids))

    def one(self, cell: int) -> Any:
        """The value of one cell (what an element bound to it reads)."""
        values = self._fresh()
        if type(values) is list:
            return values[cell]
        return values.get(np.asarray([cell]))[0]

    def get(self, ids: np.ndarray) -> list[Any]:
        values = self._fresh()
        if type(values) is list:
            return [values[i] for i in ids.tolist()]
        return values.get(ids)  # type: ignore[no-any-return]

    def share(self, key: str) -> bytes:
        """The JSON text of the cells (a new shared cell's first value); JSON values only,
        refused naming ``key``."""
        values = self.writable()
        for value in values:
            _json_text(value, key)
        return _shared_text(values)


def _shared_text(values: list[Any]) -> bytes:
    return json.dumps(values, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


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


class NonTensorStack:
    """A stack of non-tensor values, one per batch element (strings per row, for instance).

    ``td["names"] = ["a", "b", "c"]`` makes one; so does ``torch.stack`` of TensorDicts whose
    non-tensor values differ, ``NonTensorStack("a", "b")`` and ``NonTensorStack.from_list``.
    ``td["names"]`` returns a ``LinkedList`` of the values, ``td.get("names")`` the stack;
    ``td[i]["names"]`` the value of row ``i``. Saved as the JSON list tensordict writes.

    >>> stack = NonTensorStack.from_list([["a", "b"], ["c", "d"]])
    >>> stack.batch_size, stack[1, 0].data, stack[:, 1].tolist()
    (torch.Size([2, 2]), 'c', ['b', 'd'])
    """

    __slots__ = ("__weakref__", "_cells", "_device", "_pos", "stack_dim")

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
        if batch_size is not None and torch.Size(batch_size) != self.batch_size:
            raise RuntimeError(
                f"batch_size does not match self.batch_size: {torch.Size(batch_size)} vs "
                f"{self.batch_size}."
            )

    # ------------------------------------------------------------------ construction
    @classmethod
    def _from_parts(
        cls, cells: _Cells, pos: np.ndarray, device: torch.device | None, stack_dim: int = 0
    ) -> NonTensorStack:
        out = cls.__new__(cls)
        out._cells = cells
        out._pos = pos
        out._device = device
        out.stack_dim = stack_dim
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
        if basic:
            return NonTensorStack._from_parts(self._cells, pos, self._device)
        return NonTensorStack._from_parts(
            self._cells.take(pos.ravel()),
            _flat_positions(pos.size).reshape(pos.shape),
            self._device,
        )

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

    def _bind_saved(self, parent: Any, key: str | None) -> None:
        """Marks this stack as saved under ``parent`` at ``key`` (``key`` None: saved on its own
        in the directory ``parent``): a later write into it (or a view of it) writes its
        meta.json again."""
        self._cells.saved = (weakref.ref(self), parent, key)
        self._cells.memmapped = True

    # ------------------------------------------------------------------ memory maps, updates
    def is_memmap(self) -> bool:
        """True for a stack saved (``memmap``, ``memmap_``, in a saved TensorDict) or
        memory-mapped without a prefix; its rows are then written in place only.

        >>> stack = NonTensorStack("a", "b")
        >>> stack.is_memmap(), stack.memmap().is_memmap()
        (False, True)
        """
        return self._cells.memmapped

    _is_memmap = property(is_memmap)

    @property
    def is_locked(self) -> bool:
        """True once memory-mapped, as tensordict's stacks: ``update`` then needs
        ``inplace=True`` (rows are still written with ``stack[i] = value``)."""
        return self._cells.memmapped

    @property
    def saved_path(self) -> Any:
        """The directory of a stack saved on its own (``memmap(prefix)``), else None."""
        saved = self._cells.saved
        return saved[1] if saved is not None and saved[2] is None else None

    def memmap_(
        self,
        prefix: Any = None,
        copy_existing: bool = False,
        *,
        share_non_tensor: bool = False,
        existsok: bool = True,
        durable: bool = False,
        **_: Any,
    ) -> NonTensorStack:
        """Saves the stack on its own in the directory ``prefix`` (its meta.json: the values
        as tensordict writes them; ``TensorDict.load_memmap(prefix)`` and tensordict read it
        back) and marks it memory-mapped; later writes into it rewrite the file. Without a
        prefix only the mark is set, as in tensordict. ``share_non_tensor=True`` also keeps the
        values in shared memory (processes that receive a tree holding the stack see its
        writes). A directory holding something other than a stack is refused, never replaced;
        so is an existing one with ``existsok=False``. Returns self.

        >>> stack = NonTensorStack("a", "b").memmap_("words")
        >>> stack.is_memmap(), NonTensorStack.load_memmap("words").tolist()
        (True, ['a', 'b'])
        """
        if prefix is not None:
            path = os.path.abspath(os.fspath(prefix))
            if not existsok and os.path.exists(os.path.join(path, "meta.json")):
                raise RuntimeError(f"The file {path} already exists.")
            data, shape = self.json_data(os.path.basename(path))
            device = None if self._device is None else str(self._device)
            _native.write_stack_dir(path, self.stack_dim, device, data, shape, durable=durable)
            self._bind_saved(path, None)
        else:
            self._cells.memmapped = True
        if share_non_tensor and self._cells.shared is None:
            self._cells.shared = SharedValue.create(self._cells.share("<stack>"))
        return self

    def memmap(
        self, prefix: Any = None, copy_existing: bool = False, **options: Any
    ) -> NonTensorStack:
        """A memory-mapped copy of the stack (see ``memmap_``); this one is unchanged.

        >>> NonTensorStack("a", "b").memmap("copy").tolist()
        ['a', 'b']
        """
        out = self._gathered(self._pos)
        out.stack_dim = self.stack_dim
        return out.memmap_(prefix, copy_existing, **options)

    def memmap_like(
        self, prefix: Any = None, copy_existing: bool = False, **options: Any
    ) -> NonTensorStack:
        """As ``memmap``: a stack's values live in its meta.json, which tensordict's
        ``memmap_like`` writes too (there is no file of zeros to make)."""
        return self.memmap(prefix, copy_existing, **options)

    @classmethod
    def load_memmap(cls, prefix: Any, *_: Any, **__: Any) -> NonTensorStack:
        """The stack saved on its own at ``prefix`` (by ``memmap`` here or in tensordict),
        memory-mapped: writes into it rewrite the file. A damaged meta.json is refused
        naming the path.

        >>> _ = NonTensorStack.from_list([["a", "b"], ["c", "d"]]).memmap("grid")
        >>> NonTensorStack.load_memmap("grid").batch_size
        torch.Size([2, 2])
        """
        path = os.path.abspath(os.fspath(prefix))
        shape, device, stack_dim, cells = _native.load_stack_dir(path)
        out = cls._from_loaded(cells, shape, device, stack_dim)
        out._bind_saved(path, None)
        return out

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

    # ------------------------------------------------------------------ shapes
    def _gathered(self, pos: np.ndarray) -> NonTensorStack:
        """A copy holding the cells ``pos`` (any shape)."""
        return NonTensorStack._from_parts(
            self._cells.take(pos.ravel()),
            _flat_positions(pos.size).reshape(pos.shape),
            self._device,
        )

    def _view(self, pos: np.ndarray) -> NonTensorStack:
        return NonTensorStack._from_parts(self._cells, pos, self._device)

    def reshape(self, *shape: Any) -> NonTensorStack:
        """The stack with another batch shape (row-major), as ``Tensor.reshape``."""
        return self._view(_torch_op(self._pos, lambda t: t.reshape(*shape)))

    def view(self, *shape: Any) -> NonTensorStack:
        """As ``reshape``."""
        return self.reshape(*shape)

    def unsqueeze(self, dim: int) -> NonTensorStack:
        """A dim of size one at ``dim``."""
        return self._view(_torch_op(self._pos, lambda t: t.unsqueeze(dim)))

    def squeeze(self, dim: int | None = None) -> NonTensorStack:
        """Dims of size one removed (all, or ``dim``)."""
        return self._view(
            _torch_op(self._pos, lambda t: t.squeeze() if dim is None else t.squeeze(dim))
        )

    def permute(self, *dims: Any) -> NonTensorStack:
        """The batch dims in another order."""
        return self._view(_torch_op(self._pos, lambda t: t.permute(*dims)))

    def transpose(self, dim0: int, dim1: int) -> NonTensorStack:
        """Two batch dims swapped."""
        return self._view(_torch_op(self._pos, lambda t: t.transpose(dim0, dim1)))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> NonTensorStack:
        """Batch dims ``start_dim..end_dim`` made one."""
        return self._view(_torch_op(self._pos, lambda t: t.flatten(start_dim, end_dim)))

    def unflatten(self, dim: int, sizes: Sequence[int]) -> NonTensorStack:
        """Batch dim ``dim`` split into ``sizes``."""
        return self._view(_torch_op(self._pos, lambda t: t.unflatten(dim, sizes)))

    def expand(self, *shape: Any) -> NonTensorStack:
        """The stack repeated over new leading dims (the values are not copied, the cells are:
        a write into one element leaves the others, as in tensordict)."""
        return self._gathered(_torch_op(self._pos, lambda t: t.expand(*shape)))

    def apply_positions(self, fn: Any) -> Any:
        """The stack whose elements are ``fn(positions)`` (``fn`` applied to an int64 tensor of
        the batch shape holding each element's position): how index and shape operations act
        on a stack. A view of the positions (basic indexing, reshape, permute...) shares the
        values, so writes reach this stack; anything else (advanced indexing, expand, flip...)
        copies them, as tensordict does. A 0-dim result is a ``NonTensorData``."""
        source = torch.from_numpy(_writable_positions(self._pos))
        out = fn(source)
        if out.ndim == 0:
            return self._row(int(out))
        shares = (
            out.untyped_storage().data_ptr() == source.untyped_storage().data_ptr()
            and out.numel() > 0
            and all(
                stride or size == 1 for size, stride in zip(out.shape, out.stride(), strict=True)
            )
        )
        pos = out.numpy()
        return self._view(pos) if shares else self._gathered(pos)

    def take_rows(self, rows: torch.Tensor) -> NonTensorStack:
        """The rows ``rows`` (int64, negative from the end) of the first dim, copied (as an
        advanced index copies); IndexError, as torch words it, for a row out of range."""
        index = rows.detach().cpu().numpy()
        size = self._pos.shape[0]
        if index.size:
            low, high = int(index.min()), int(index.max())
            if low < -size or high >= size:
                bad = high if high >= size else low
                raise IndexError(f"index {bad} is out of bounds for dimension 0 with size {size}")
        return self._gathered(self._pos[index])

    def repeat(self, *sizes: Any) -> NonTensorStack:
        """The stack repeated along each dim, as ``Tensor.repeat``."""
        return self.apply_positions(lambda t: t.repeat(*sizes))

    def repeat_interleave(self, repeats: Any, dim: int | None = None) -> NonTensorStack:
        """Each element repeated along ``dim``, as ``Tensor.repeat_interleave``."""
        return self.apply_positions(lambda t: t.repeat_interleave(repeats, dim=dim))

    def flip(self, dims: Any) -> NonTensorStack:
        """The elements in reverse order along ``dims``."""
        return self.apply_positions(lambda t: t.flip(dims))

    def unbind(self, dim: int = 0) -> tuple[Any, ...]:
        """The elements along ``dim``."""
        moved = np.moveaxis(self._pos, dim, 0)
        return tuple(self._result(moved[i]) for i in range(moved.shape[0]))

    def _result(self, pos: np.ndarray) -> Any:
        if pos.ndim == 0:
            return self._row(int(pos))
        return self._view(pos)

    def _row(self, cell: int) -> NonTensorData:
        """The element in cell ``cell`` as a ``NonTensorData`` bound to it: it reads the
        stack's value and writes into it (``.data = ...``, ``update_``), as tensordict's
        elements of a stack are its members. A copy (``clone``) is not bound."""
        row = NonTensorData(self._cells.one(cell), batch_size=[], device=self._device)
        row._cell = (self._cells, cell)
        return row

    def split(self, split_size: Any, dim: int = 0) -> tuple[NonTensorStack, ...]:
        """Pieces along ``dim``, as ``Tensor.split``."""
        parts = torch.from_numpy(self._pos).split(split_size, dim)
        return tuple(self._view(p.numpy()) for p in parts)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[NonTensorStack, ...]:
        """Pieces along ``dim``, as ``Tensor.chunk``."""
        parts = torch.from_numpy(self._pos).chunk(chunks, dim)
        return tuple(self._view(p.numpy()) for p in parts)

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
            self._cells, self._pos, torch.device(device), self.stack_dim
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

    def json_data(self, key: str) -> tuple[bytes, list[int] | None]:
        """What a save writes: the JSON of the values (nested lists, row-major) and the shape
        when the nesting alone would not give it (cells that are lists of one length). A value
        that JSON cannot hold raises ``InvalidTreeError`` naming ``key`` (nothing is pickled)."""
        shape = list(self._pos.shape)
        cells = self._cells._fresh()
        ids = self._pos.ravel()
        if type(cells) is not list:
            column = cells if _is_arange(ids, len(cells)) else cells.take(ids)
            return column.json(shape), None
        flat = [cells[i] for i in ids.tolist()]
        fast = _native.str_list_json(flat, shape)
        if fast is not None:
            return fast, None
        for value in flat:
            _json_text(value, key)  # refuses what JSON cannot hold, naming the key
        text = json.dumps(_nest(flat, tuple(shape)), ensure_ascii=False, separators=(",", ":"))
        lengths = {len(v) if type(v) in (list, tuple) else None for v in flat}
        hint = (
            shape if flat and len(lengths) == 1 and None not in lengths and 0 not in shape else None
        )
        return text.encode("utf-8"), hint

    def __reduce__(self) -> Any:
        cells = self._cells._fresh()
        ids = self._pos.ravel()
        if type(cells) is list:
            values: Any = [cells[i] for i in ids.tolist()]
        else:  # a packed column stays one (two byte strings in the pickle)
            values = cells if _is_arange(ids, len(cells)) else cells.take(ids)
        return (_rebuild, (values, tuple(self._pos.shape), self._device, self.stack_dim))


def _is_arange(ids: np.ndarray, n: int) -> bool:
    return ids.size == n and (n == 0 or (int(ids[0]) == 0 and bool((np.diff(ids) == 1).all())))


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


def _dense_positions(stack: NonTensorStack) -> np.ndarray:
    return _flat_positions(stack._pos.size).reshape(stack._pos.shape)


def _common_device(members: Sequence[NonTensorStack]) -> torch.device | None:
    devices = {m._device for m in members}
    return devices.pop() if len(devices) == 1 else None


def _writable_positions(pos: np.ndarray) -> np.ndarray:
    """``pos`` as torch.from_numpy takes it without a warning (a writable array)."""
    return pos if pos.flags.writeable else pos.copy()


def _torch_op(pos: np.ndarray, fn: Any) -> np.ndarray:
    """``fn`` applied to the positions as a torch tensor (torch's argument rules and errors)."""
    out = fn(torch.from_numpy(_writable_positions(pos)))
    return np.asarray(out.numpy())


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


def list_shape(values: Any) -> list[int]:
    """The shape of nested lists: the dims as deep as every list at a level has one length."""
    shape: list[int] = []
    level = [values]
    while all(type(v) is list or type(v) is LinkedList for v in level) and level:
        lengths = {len(v) for v in level}
        if len(lengths) != 1:
            break
        (n,) = lengths
        shape.append(n)
        level = [item for v in level for item in v]
        if not n:
            break
    return shape


def flatten_list(values: Any, depth: int) -> list[Any]:
    """The items of nested lists ``depth`` levels down, row-major."""
    level = [values]
    for _ in range(depth):
        level = [item for v in level for item in v]
    return level


def _nest(flat: list[Any], shape: tuple[int, ...]) -> Any:
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0] if shape[0] else 0
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


class LinkedList(list):  # type: ignore[type-arg]
    """The values of a stack (``td[key]``): a list whose item writes go into the stack (or
    the rows of a TensorDict, ``td.tolist(as_linked_list=True)``).

    ``_td()`` is the stack (a weak reference); a change of the list's length (``append``,
    ``extend``...) unbinds it: the stack keeps its size, the list is then a plain list.

    >>> stack = NonTensorStack("a", "b")
    >>> values = stack.tolist(as_linked_list=True)
    >>> values[0] = "z"
    >>> stack.tolist()
    ['z', 'b']
    """

    __slots__ = ("_td",)

    def __init__(self, *args: Any, td: Any = None, **kwargs: Any) -> None:
        # ``type(values)(iterable)``, as code that rebuilds a sequence calls it, is not linked
        super().__init__(*args, **kwargs)
        self._td: Any = _NO_STACK if td is None else weakref.ref(td)

    @classmethod
    def _bound(cls, values: list[Any], stack: NonTensorStack) -> LinkedList:
        if stack._pos.ndim > 1:
            values = [cls._bound(row, stack[i]) for i, row in enumerate(values)]
        return cls(values, td=stack)

    def tolist(self) -> list[Any]:
        """A plain ``list`` copy of the values, not linked to the stack (nested linked lists,
        of a stack with several batch dims, become nested lists), as tensordict's does.

        >>> values = NonTensorStack("a", "b").tolist(as_linked_list=True)
        >>> type(values.tolist()).__name__, values.tolist()
        ('list', ['a', 'b'])
        """
        return [item.tolist() if isinstance(item, LinkedList) else item for item in self]

    def __setitem__(self, index: Any, value: Any) -> None:
        stack = self._td()
        if stack is not None:
            stack[index] = value
        super().__setitem__(index, value)

    def _unbind(self) -> None:
        self._td = _NO_STACK

    def append(self, value: Any) -> None:
        self._unbind()
        super().append(value)

    def extend(self, values: Iterable[Any]) -> None:
        self._unbind()
        super().extend(values)

    def insert(self, index: Any, value: Any) -> None:
        self._unbind()
        super().insert(index, value)

    def pop(self, index: Any = -1) -> Any:
        self._unbind()
        return super().pop(index)

    def remove(self, value: Any) -> None:
        self._unbind()
        super().remove(value)

    def clear(self) -> None:
        self._unbind()
        super().clear()

    def __delitem__(self, index: Any) -> None:
        self._unbind()
        super().__delitem__(index)

    def __iadd__(self, values: Iterable[Any]) -> LinkedList:  # type: ignore[override,misc]
        self._unbind()
        return super().__iadd__(values)  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"LinkedList({list.__repr__(self)})"

    def __reduce__(self) -> Any:
        """Pickled as its values (a list sent to another process is no longer linked to the
        stack), as the reference does."""
        return type(self), (list(self),)


def _NO_STACK() -> None:
    return None


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
