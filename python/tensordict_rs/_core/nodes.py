"""The node types of a tree: ``TreeNode`` (the base of TensorDict) and ``NonTensorData``.

A tree holds four kinds of entries: nested trees (``TreeNode``), tensors, lazy leaves
(``memmap._LazyLeaf``: a mapped leaf whose tensor is made on first access) and
``NonTensorData`` (a JSON value). Every module below ``tensordict.py`` works on trees through
``TreeNode``, never through ``TensorDict``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

import torch

from .. import _native

TD = TypeVar("TD", bound="TreeNode")  # a tree, and the same class of tree in the result
Key = str | tuple[str, ...]  # an entry: a str, or a tuple of str for nested entries


class TreeNode:
    """The base of every tree (``TensorDict``): its state, its constructor, and the methods
    that the modules below ``tensordict.py`` call on a tree.

    Those modules take and return ``TreeNode`` (or ``TD``, a TypeVar bound to it), never
    ``TensorDict``, and make new trees with ``type(td)._new_unchecked(batch_size, device)``, so
    that none of them imports ``tensordict.py``. The methods declared below for type checkers
    are implemented by ``TensorDict`` and its mixins; mypy checks each implementation against
    its declaration.
    """

    _tensordict: dict[str, Any]  # the entries: trees, tensors, lazy leaves, NonTensorData
    _batch_size: torch.Size
    _device: torch.device | None
    _is_locked: bool
    _is_memmap: bool
    _is_shared: bool
    _memmap_prefix: Path | None  # the directory (or archive) a memory-mapped tree is saved at
    _lock_parents: list[weakref.ref[TreeNode]]  # the trees that locked this one (see locking)
    _lock_ops: list[Any]  # what each lock_/unlock_ changed (for ``with td.lock_():``), or an undo
    _names: list[str | None] | None = None  # names of the batch dims (ops/names.py); None: unnamed
    # the tensorclass whose instances this tree class stores (a tensorclass's ``_TensorDict``
    # subclass, see tensorclass/), None for every other tree class
    _tensorclass: ClassVar[Any] = None
    # views of a buffer lent read-only (pickle protocol 5, ray.get): values never written
    _read_only: bool = False
    # the dirty map of the saved directory (io/dirty.py), shared by the trees of one load
    _tracker: Any = None
    # what the last growth in place left for the next (io/growth.py), None before any
    _growth: Any = None

    def _init(self, batch_size: torch.Size, device: torch.device | None) -> None:
        self._tensordict = {}
        self._batch_size = batch_size
        self._device = device
        self._is_locked = False
        self._is_memmap = False
        self._is_shared = False
        self._memmap_prefix = None
        self._lock_parents = []
        self._lock_ops = []

    @classmethod
    def _new_unchecked(cls, batch_size: torch.Size, device: torch.device | None) -> Self:
        """An empty tree of this class, without the checks of ``__init__``."""
        td = cls.__new__(cls)
        td._init(batch_size, device)
        return td

    if TYPE_CHECKING:
        # tensordict.py: the constructor, shape and device, entries
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
        ) -> None: ...
        @property
        def batch_size(self) -> torch.Size: ...
        @batch_size.setter
        def batch_size(self, value: Any) -> None: ...
        @property
        def batch_dims(self) -> int: ...
        @property
        def device(self) -> torch.device | None: ...
        def _get_str(self, key: str) -> Any: ...
        def _leaf_info(
            self, key: str
        ) -> tuple[tuple[int, ...], torch.dtype, torch.device] | None: ...
        def _check_batch(self, key: str, shape: tuple[int, ...] | torch.Size) -> None: ...
        def _set_str(
            self, key: str, value: Any, *, validate: bool = True, non_blocking: bool = False
        ) -> None: ...
        def _sub(self, path: tuple[str, ...], create: bool) -> Self: ...
        def get(self, key: Key, default: Any = ...) -> Any: ...
        def _entry(self, key: Key, default: Any = ...) -> Any: ...
        def set(
            self, key: Key, value: Any, *, inplace: bool = False, non_blocking: bool = False
        ) -> Self: ...
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
        ) -> Self: ...
        def update_(
            self,
            input_dict_or_td: Mapping[Any, Any] | TreeNode | None = None,
            clone: bool = False,
            *,
            non_blocking: bool = False,
            keys_to_update: Any = None,
            **kwargs: Any,
        ) -> Self: ...
        def set_(self, key: Key, value: Any, *, non_blocking: bool = False) -> Self: ...
        def __delitem__(self, key: Key) -> None: ...
        def keys(
            self,
            include_nested: bool = False,
            leaves_only: bool = False,
            is_leaf: Callable[[type], bool] | None = None,
            *,
            sort: bool = False,
        ) -> list[Key]: ...
        def items(
            self,
            include_nested: bool = False,
            leaves_only: bool = False,
            is_leaf: Callable[[type], bool] | None = None,
            *,
            sort: bool = False,
        ) -> list[tuple[Key, Any]]: ...
        def __getitem__(self, index: Any) -> Any: ...
        def __setitem__(self, index: Any, value: Any) -> None: ...
        def __contains__(self, key: object) -> bool: ...
        def apply(self, fn: Callable[..., Any], *others: Any, **kwargs: Any) -> Self | None: ...

        # the mixins of issue 23 (ops/names.py, ops/factories.py, ops/convert.py, ...)
        @property
        def names(self) -> list[str | None]: ...
        def _set_names(self, value: list[str | None] | None) -> None: ...
        def copy(self) -> Self: ...
        def _entry_shape(self, key: str) -> tuple[int, ...] | None: ...
        def reshape(self, *args: Any, **kwargs: Any) -> Self: ...
        def expand(self, *args: Any, **kwargs: Any) -> Self: ...
        def unbind(self, dim: int = 0) -> tuple[Self, ...]: ...
        def to(self, *args: Any, **kwargs: Any) -> Self: ...
        def del_(self, key: Key) -> Self: ...
        def is_memmap(self) -> bool: ...
        def is_shared(self) -> bool: ...
        @property
        def saved_path(self) -> Path | None: ...
        def _unlock_tree(self) -> None: ...

        # _core/locking.py
        @property
        def is_locked(self) -> bool: ...
        def lock_(self) -> Self: ...
        def unlock_(self) -> Self: ...
        def _lock_tree(self) -> None: ...

        # share/processes.py
        def _mark_shared(self) -> None: ...


class _EntryFlags:
    """A NonTensorData's ``_tensordict`` (tensordict's inner TensorDict of the entry): its
    sharing and memory-map flags, batch size and device, read from the entry when asked."""

    __slots__ = ("_entry",)

    def __init__(self, entry: NonTensorData) -> None:
        self._entry = entry

    @property
    def _is_shared(self) -> bool:
        return self._entry._is_shared

    @property
    def _is_memmap(self) -> bool:
        return self._entry._is_memmap

    def is_shared(self) -> bool:
        """Whether the entry's value is in shared memory."""
        return self._entry._is_shared

    def is_memmap(self) -> bool:
        """Whether the entry belongs to a saved directory."""
        return self._entry._is_memmap

    @property
    def batch_size(self) -> torch.Size:
        """The entry's batch size."""
        return self._entry.batch_size

    @property
    def device(self) -> torch.device | None:
        """The entry's device."""
        return self._entry.device


class NonTensorData:
    """A non-tensor value stored in a TensorDict (a string, number, list or dict): one value
    for every element of the batch.

    Saved as JSON (never pickled); ``td[key]`` returns the value itself, ``td.get(key)`` this
    wrapper. Indexing keeps the value (a row is a ``NonTensorData`` with a smaller batch);
    ``==`` gives a bool tensor of the batch size, as in tensordict; a row that receives
    another value turns the entry into a ``NonTensorStack`` (``maybe_to_stack``).

    >>> NonTensorData({"step": 3}).data
    {'step': 3}
    >>> NonTensorData("a", batch_size=[3])[1:]
    NonTensorData(data=a, batch_size=torch.Size([2]), device=None)
    """

    __slots__ = ("_cell", "_local", "_saved", "_shared", "_value", "batch_size", "device")
    _is_tensorclass = True  # tensordict's NonTensorData is a tensorclass (is_tensorclass)
    _is_non_tensor = True

    def __init__(
        self, data: Any, batch_size: Any = None, device: Any = None, names: Any = None
    ) -> None:
        # ``names``: tensordict's keyword; an entry's dims are its tree's, which names them
        del names
        if type(data) in NTD_TYPES:
            data = data.data
        self._value: Any = data
        self._shared: Any = None  # a SharedValue (_core/shared_value.py) once shared
        # (directory, key, locked) of a saved entry; locked: saved by memmap_/memmap (a loaded
        # tree is not locked, as in tensordict)
        self._saved: tuple[Path, str, bool] | None = None
        # (the cells of a NonTensorStack, a cell) for an element of a stack: reads and writes
        # go to the stack (nontensor.NonTensorStack._row)
        self._cell: tuple[Any, int] | None = None
        # the key of an entry of a shared tree whose value JSON cannot hold: it stayed this
        # process's own, so it refuses writes in place (they would reach no other process)
        self._local: str | None = None
        self.batch_size = torch.Size([] if batch_size is None else batch_size)
        self.device = None if device is None else torch.device(device)

    @property
    def data(self) -> Any:
        """The value (of a shared entry: the value now in shared memory, which another
        process may have written)."""
        shared = self._shared
        if shared is not None:
            return shared.get()
        cell = self._cell
        if cell is not None:
            return cell[0].one(cell[1])
        return self._value

    @data.setter
    def data(self, value: Any) -> None:
        shared, saved, cell = self._shared, self._saved, self._cell
        if self._local is not None:
            raise NotImplementedError(
                f"Updating {type(self._value).__name__} within a shared/memmaped structure is "
                f"not supported: the value of {self._local!r} is not JSON, so it was not put in "
                "shared memory, and a value written in place would reach no other process"
            )
        if cell is not None:  # an element of a stack: the stack's cell (its file, its memory)
            cells, index = cell

            def change(values: list[Any]) -> None:
                values[index] = value

            cells.modify(change)
        if shared is None and saved is None:
            self._value = value
            return
        key = "<value>" if saved is None else saved[1]
        text = _json_text(value, key).encode("utf-8")  # refuses what JSON cannot hold
        if shared is not None:
            shared.refuse_oversize(text)  # before the file: a refused value reaches neither
        if saved is not None:
            # the file first: a value that cannot be written leaves the entry as it was
            _native.rewrite_non_tensor(str(saved[0]), saved[1], text)
        if shared is None:
            self._value = value
        else:
            shared.set_text(text)

    def _bind_saved(self, parent: Path, key: str, locked: bool = True) -> None:
        """Marks this entry as saved in ``parent`` at ``key``: a value written in place later
        rewrites its meta.json, as tensordict does."""
        self._saved = (parent, key, locked)

    def __reduce__(self) -> Any:
        """Pickled by value (a shared entry crosses to other processes shared only with its
        TensorDict, see share/processes.py)."""
        return (NonTensorData, (self.data, self.batch_size, self.device))

    def __setstate__(self, state: Any) -> None:
        """Reads pickles written before ``__reduce__`` existed: their state is the slots
        ``data``, ``batch_size`` and ``device`` (as ``(None, slots)``)."""
        slots = state[1] if isinstance(state, tuple) else state
        NonTensorData.__init__(
            self, slots.get("data"), slots.get("batch_size"), slots.get("device")
        )

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        """The entry's state, slot by slot (a copy: attributes are not added through it).

        As in tensordict, the value is not an instance attribute named ``data`` (``data`` is
        a property that reads it, from shared memory for a shared entry), so ``vars(entry)``
        and ``"data" in entry.__dict__`` behave as they do there.
        """
        return {name: getattr(self, name) for name in NonTensorData.__slots__}

    @property
    def _is_shared(self) -> bool:
        """True for a value kept in shared memory (``share_memory_``, ``share_non_tensor``)."""
        return self._shared is not None

    @property
    def _is_memmap(self) -> bool:
        """True for an entry of a saved directory (``memmap_``, ``load_memmap``): a value
        written in place rewrites its meta.json."""
        return self._saved is not None

    def _is_memmaped_from_above(self) -> bool:
        """True for an element of a memory-mapped ``NonTensorStack`` (tensordict's name): its
        writes go to the stack and its meta.json."""
        cell = self._cell
        return cell is not None and bool(cell[0].memmapped)

    @property
    def _tensordict(self) -> _EntryFlags:
        """The flags tensordict keeps on a NonTensorData's inner TensorDict (``_is_shared``,
        ``_is_memmap``, ``batch_size``, ``device``), read from this entry (it has no tree)."""
        return _EntryFlags(self)

    @property
    def _non_tensordict(self) -> dict[str, Any]:
        """``{"data": ...}`` as in tensordict: the shared cell of a shared entry (read it with
        ``tensorclass._from_shared_nontensor``), else the value."""
        return {"data": self._shared if self._shared is not None else self.data}

    def update_(self, other: Any, non_blocking: bool = False) -> NonTensorData:
        """Writes the value of ``other`` (a ``NonTensorData`` or a plain value) into this
        entry, in place: into shared memory for a shared entry, as tensordict does.

        >>> entry = NonTensorData("a")
        >>> entry.update_(NonTensorData("b")).data
        'b'
        """
        if getattr(other, "_is_non_tensor", False) and type(other) not in NTD_TYPES:
            raise ValueError(
                "Cannot update a NonTensorDataBase object with a NonTensorStack. Call "
                "`non_tensor_data.maybe_to_stack()` before calling update()."
            )
        self.data = other.data if type(other) in NTD_TYPES else other
        return self

    def update(
        self, other: Any, inplace: bool = False, non_blocking: bool = False, **_: Any
    ) -> NonTensorData:
        """``update_`` with ``inplace=True``; otherwise the value is replaced, which a shared
        or memory-mapped entry (locked, as tensordict's are) refuses.

        >>> NonTensorData(1).update(NonTensorData(2)).data
        2
        """
        cell = self._cell
        if not inplace and (
            self._shared is not None
            or (self._saved and self._saved[2])
            or (cell is not None and cell[0].memmapped)  # an element of a memory-mapped stack
        ):
            raise RuntimeError(
                "Cannot modify locked TensorDict. For in-place modification, consider using "
                "the `set_()` method and make sure the key is present."
            )
        return self.update_(other)

    def __repr__(self) -> str:
        text = str(self.data)
        if len(text) > 200:
            text = text[:20] + "  ...  " + text[-20:]
        name = type(self).__name__
        return f"{name}(data={text}, batch_size={self.batch_size}, device={self.device})"

    @property
    def shape(self) -> torch.Size:
        """The batch size."""
        return self.batch_size

    @property
    def batch_dims(self) -> int:
        """The number of batch dims."""
        return len(self.batch_size)

    ndim = batch_dims

    def dim(self) -> int:
        """The number of batch dims."""
        return len(self.batch_size)

    def tolist(self, **_: Any) -> Any:
        """The value repeated over the batch dims, as nested lists (as tensordict gives it)."""
        value = self.data
        for size in reversed(self.batch_size):
            value = [value] * size
        return value

    def to_dict(self, **_: Any) -> Any:
        """The value itself."""
        return self.data

    def __getitem__(self, index: Any) -> NonTensorData:
        """The same value with the batch size of ``index`` applied to this one's."""
        batch = torch.empty(self.batch_size, dtype=torch.bool, device="meta")[index].shape
        return type(self)(self.data, batch_size=batch, device=self.device)

    def __setitem__(self, index: Any, value: Any) -> None:
        """``entry[index] = value`` where ``index`` selects every element (``True``, ``...``,
        ``:``): the entry takes the value (an element of a stack writes it into the stack).
        A NonTensorData holds one value for all its elements, so a part of them cannot take
        another (``maybe_to_stack()`` first), as in tensordict."""
        batch = self.batch_size
        if torch.empty(batch, dtype=torch.bool, device="meta")[index].numel() != batch.numel():
            raise ValueError(
                "A NonTensorData holds one value for all its elements, so it cannot take "
                "another value for some of them; call maybe_to_stack() first."
            )
        if type(value) in NTD_TYPES:
            value = value.data
        elif getattr(value, "_is_non_tensor", False):  # a stack of one element
            if value.numel() != 1:
                raise ValueError(
                    f"cannot write a stack of batch size {value.batch_size} into a "
                    "NonTensorData (one value)"
                )
            (value,) = value.values_flat()
        self.data = value

    def maybe_to_stack(self) -> Any:
        """A ``NonTensorStack`` with the value in every element (``self`` without batch dims)."""
        if not self.batch_size:
            return self
        from .nontensor import NonTensorStack

        n = self.batch_size.numel()
        return NonTensorStack.from_values([self.data] * n, self.batch_size, self.device)

    def clone(self, recurse: bool = True) -> NonTensorData:
        """A copy (the value deep-copied when ``recurse``)."""
        import copy

        data = copy.deepcopy(self.data) if recurse else self.data
        return type(self)(data, batch_size=self.batch_size, device=self.device)

    def to(self, *args: Any, **kwargs: Any) -> NonTensorData:
        """The entry on another device (the value itself is a Python object and stays)."""
        device = kwargs.get("device", self.device)
        for arg in args:
            if isinstance(arg, (str, torch.device, int)):
                device = arg
        return type(self)(self.data, batch_size=self.batch_size, device=device)

    def is_empty(self) -> bool:
        """Always False: the entry holds a value."""
        return False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the value (a function stored as a non-tensor entry)."""
        return self.data(*args, **kwargs)

    def _with_batch(self, fn: Any) -> NonTensorData:
        """The value with the batch size ``fn`` gives a tensor of this one's shape."""
        batch = fn(torch.empty(self.batch_size, device="meta")).shape
        return type(self)(self.data, batch_size=batch, device=self.device)

    def as_stack(self) -> Any:
        """A ``NonTensorStack`` of this batch size with the value in every element (one
        element for a 0-dim entry): what the shape operations that make a stack start from."""
        from .nontensor import NonTensorStack

        n = self.batch_size.numel()
        return NonTensorStack.from_values([self.data] * n, self.batch_size, self.device)

    def stacked(self, fn: Any) -> Any:
        """``fn`` (a shape operation on a tensor of the batch shape) applied to ``as_stack()``:
        expand and unsqueeze of a ``NonTensorData`` give a ``NonTensorStack`` in tensordict
        (reshape, view, squeeze, flatten, permute, transpose keep a ``NonTensorData``)."""
        return self.as_stack().apply_positions(fn)

    def expand(self, *shape: Any) -> Any:
        """A ``NonTensorStack`` of the value over the expanded batch (a value per element)."""
        sizes = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        return self.stacked(lambda t: t.expand(*sizes))

    def reshape(self, *shape: Any) -> NonTensorData:
        """The value with a reshaped batch size."""
        return self._with_batch(lambda t: t.reshape(*shape))

    view = reshape

    def squeeze(self, dim: int | None = None) -> NonTensorData:
        """The value without batch dims of size one."""
        return self._with_batch(lambda t: t.squeeze() if dim is None else t.squeeze(dim))

    def unsqueeze(self, dim: int) -> Any:
        """A ``NonTensorStack`` of the value with a batch dim of size one at ``dim`` (as
        tensordict gives)."""
        return self.stacked(lambda t: t.unsqueeze(dim))

    def flatten(self, start_dim: int | None = None, end_dim: int | None = None) -> NonTensorData:
        """The value with batch dims ``start_dim..end_dim`` made one."""
        start = 0 if start_dim is None else start_dim
        end = -1 if end_dim is None else end_dim
        return self._with_batch(lambda t: t.flatten(start, end))

    def permute(self, *dims: Any) -> NonTensorData:
        """The value with its batch dims permuted."""
        return self._with_batch(lambda t: t.permute(*dims))

    def transpose(self, dim0: int, dim1: int) -> NonTensorData:
        """The value with batch dims ``dim0`` and ``dim1`` swapped."""
        return self._with_batch(lambda t: t.transpose(dim0, dim1))

    def unbind(self, dim: int = 0) -> tuple[NonTensorData, ...]:
        """One entry per element along ``dim``."""
        return tuple(
            type(self)(self.data, batch_size=t.shape, device=self.device)
            for t in torch.empty(self.batch_size, device="meta").unbind(dim)
        )

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        """``torch.stack`` / ``torch.cat`` of non-tensor entries give a ``NonTensorStack``."""
        from .nontensor import NonTensorStack

        return NonTensorStack.__torch_function__(func, types, args, kwargs)

    def _compare(self, other: Any, equal: bool) -> Any:
        if type(other) in NTD_TYPES:
            try:
                same = other.data is self.data or bool(other.data == self.data)
            except Exception:
                same = False
            return torch.full(self.batch_size, same == equal, device=self.device)
        if getattr(other, "_is_non_tensor", False):  # a stack: element by element
            result = other == self if equal else other != self
            return result
        return NotImplemented

    def __eq__(self, other: object) -> Any:  # type: ignore[override]
        return self._compare(other, True)

    def __ne__(self, other: object) -> Any:  # type: ignore[override]
        return self._compare(other, False)

    __hash__ = None  # type: ignore[assignment]


# The classes of non-tensor leaves that hold one value for the whole batch: NonTensorData and
# its subclasses (MetaData and each MetaData[T], _core/metadata.py, which add themselves). The
# tree's checks read ``type(value) in NTD_TYPES`` (one hash lookup, as cheap as ``is``).
NTD_TYPES: set[type] = {NonTensorData}

_NUMBER_KEY = _native.NUMBER_KEY  # serde_json (arbitrary_precision): a number's text


def _json_text(value: Any, key: str) -> str:
    def check(v: Any) -> None:
        if v is None or isinstance(v, (str, bool, int)):
            return
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError("non-finite float")
            return
        if isinstance(v, (list, tuple)):
            for item in v:
                check(item)
            return
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            if _NUMBER_KEY in v:  # the Rust JSON parser would read this object as a number
                raise ValueError(f"a dict with the key {_NUMBER_KEY!r}")
            for item in v.values():
                check(item)
            return
        raise TypeError(type(v).__name__)

    try:
        check(value)
    except (TypeError, ValueError) as err:
        raise _native.InvalidTreeError(
            f"key {key!r}: a value of type {type(value).__name__} ({err}) cannot be saved; "
            "only JSON values (str, int, float, bool, None, lists, dicts with str keys) "
            "are stored, never pickles"
        ) from None
    return json.dumps(value, ensure_ascii=False)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pauses the cyclic garbage collector while a tree is converted.

    A 10,000-leaf tree makes tens of thousands of short-lived tuples, which would trigger full
    collections (about 0.2 s each with torch loaded) in the middle of a save or load.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
