"""``StackFiles``, a ``NonTensorStack`` saved (a mixin): on its own in a directory
(``memmap_``, ``memmap``, ``load_memmap``) or in a saved tree (``_bind_saved``), and the JSON
of its values a save writes (``json_data``). A write into a saved stack writes its meta.json
again (``_Cells.written``).
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import torch

from .. import _native
from .linked_list import _nest
from .nodes import _json_text
from .nontensor_store import _Cells, _is_arange
from .shared_value import SharedValue

if TYPE_CHECKING:
    from .nontensor import NonTensorStack


class StackFiles:
    """Saving and loading of ``NonTensorStack`` (its base), and the JSON a save writes."""

    __slots__ = ()

    if TYPE_CHECKING:
        _cells: _Cells
        _pos: np.ndarray
        _device: torch.device | None
        stack_dim: int

        def _gathered(self, pos: np.ndarray) -> NonTensorStack: ...
        @classmethod
        def _from_loaded(
            cls, cells: Any, shape: Sequence[int], device: Any, stack_dim: int
        ) -> NonTensorStack: ...

    def _bind_saved(self, parent: Any, key: str | None) -> None:
        """Marks this stack as saved under ``parent`` at ``key`` (``key`` None: saved on its own
        in the directory ``parent``): a later write into it (or a view of it) writes its
        meta.json again."""
        self._cells.saved = (weakref.ref(self), parent, key)
        self._cells.memmapped = True

    def is_memmap(self) -> bool:
        """True for a stack saved (``memmap``, ``memmap_``, in a saved TensorDict) or
        memory-mapped without a prefix; its rows are then written in place only.

        >>> from tensordict_rs import NonTensorStack
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
    ) -> Self:
        """Saves the stack on its own in the directory ``prefix`` (its meta.json: the values
        as tensordict writes them; ``TensorDict.load_memmap(prefix)`` and tensordict read it
        back) and marks it memory-mapped; later writes into it rewrite the file. Without a
        prefix only the mark is set, as in tensordict. ``share_non_tensor=True`` also keeps the
        values in shared memory (processes that receive a tree holding the stack see its
        writes). A directory holding something other than a stack is refused, never replaced;
        so is an existing one with ``existsok=False``. Returns self.

        >>> from tensordict_rs import NonTensorStack
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

        >>> from tensordict_rs import NonTensorStack
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

        >>> from tensordict_rs import NonTensorStack
        >>> _ = NonTensorStack.from_list([["a", "b"], ["c", "d"]]).memmap("grid")
        >>> NonTensorStack.load_memmap("grid").batch_size
        torch.Size([2, 2])
        """
        path = os.path.abspath(os.fspath(prefix))
        shape, device, stack_dim, cells = _native.load_stack_dir(path)
        out = cls._from_loaded(cells, shape, device, stack_dim)
        out._bind_saved(path, None)
        return out

    def json_data(self, key: str) -> tuple[bytes, list[int] | None]:
        """What a save writes: the JSON of the values (nested lists, row-major) and the shape
        when the nesting alone would not give it (cells that are lists of one length). A value
        that JSON cannot hold raises ``InvalidTreeError`` naming ``key`` (nothing is pickled)."""
        shape = list(self._pos.shape)
        # the nesting of the data stops at its first empty dim ([0, 3] reads as [0])
        empty = shape if 0 in shape[:-1] else None
        cells = self._cells._fresh()
        ids = self._pos.ravel()
        if type(cells) is not list:
            column = cells if _is_arange(ids, len(cells)) else cells.take(ids)
            return column.json(shape), empty
        flat = [cells[i] for i in ids.tolist()]
        fast = _native.str_list_json(flat, shape)
        if fast is not None:
            return fast, empty
        for value in flat:
            _json_text(value, key)  # refuses what JSON cannot hold, naming the key
        text = json.dumps(_nest(flat, tuple(shape)), ensure_ascii=False, separators=(",", ":"))
        lengths = {len(v) if type(v) in (list, tuple) else None for v in flat}
        hint = (
            shape if flat and len(lengths) == 1 and None not in lengths and 0 not in shape else None
        )
        return text.encode("utf-8"), hint
