"""New memory-mapped entries in a saved tree: ``make_memmap``, ``make_memmap_from_tensor``,
``make_memmap_from_storage``.

The new leaf's file is created where the directory format puts it
(``<dir>/<nested dirs>/<encoded key>.memmap``), then the tree's ``meta.json`` files are written
again by the ordinary save, which keeps every leaf that already is its file (nothing is copied
but the new data). The entry is added although a memory-mapped tree is locked, as in
tensordict; other processes see it after ``memmap_refresh_()``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, cast

import torch

from .. import _native
from .._core.index import key_path as _path
from .._core.nodes import TreeNode
from .._core.walk import leaves as _walk_leaves
from ..memmap import MemoryMappedTensor
from ..ops import as_classmethod
from . import h5 as _h5


def _target(td: TreeNode, key: Any, robust_key: bool | None) -> tuple[tuple[str, ...], Path]:
    """The key's path and the file its leaf gets; refuses a tree that is not saved."""
    if not td.is_memmap() or td.saved_path is None:
        raise RuntimeError(
            "Cannot make a memory-mapped entry in a tensordict that is not memory-mapped with "
            "a directory: call memmap_(prefix) first."
        )
    path = _path(key)
    if key in td:
        raise RuntimeError(f"The key {key!r} already exists in the tensordict.")
    encode = _native.encode_key if robust_key is not False else (lambda k: k)
    folder = Path(td.saved_path)
    for part in path[:-1]:
        folder = folder / encode(part)
    return path, folder / (encode(path[-1]) + ".memmap")


def _add(td: TreeNode, path: tuple[str, ...], value: torch.Tensor) -> None:
    """Puts ``value`` at ``path`` (creating nested trees) and commits the directory."""
    node = td
    for part in path[:-1]:
        child = node._tensordict.get(part)
        if not isinstance(child, TreeNode):
            child = type(td)._new_unchecked(node.batch_size, node.device)
            node._tensordict[part] = child
        node = child  # type: ignore[assignment]
    node._check_batch(path[-1], value.shape)
    node._tensordict[path[-1]] = value
    _commit(td)


def _commit(td: TreeNode) -> None:
    prefix = td.saved_path
    locked = td.is_locked
    if locked:
        td._unlock_tree()
    try:
        cast(Any, td).memmap_(prefix)  # keeps the files already there; writes meta.json
    finally:
        if locked and not td.is_locked:
            td.lock_()


def _file_of(td: TreeNode, storage: torch.UntypedStorage) -> str | None:
    """The file of ``storage`` when it is the storage of a file-backed leaf of ``td``."""
    address = storage.data_ptr()
    for _, _, leaf in _walk_leaves(td):
        buffer = getattr(leaf, "_buffer", None)
        if buffer is not None and buffer.filename and leaf.untyped_storage().data_ptr() == address:
            return str(buffer.filename)
    return None


def make_memmap(
    td: TreeNode,
    key: Any,
    shape: Any,
    *,
    dtype: torch.dtype | None = None,
    robust_key: bool | None = True,
) -> MemoryMappedTensor:
    """Adds an uninitialized memory-mapped tensor of ``shape`` at ``key``, its file in the
    tree's directory; returns it. The tree must be memory-mapped with a directory.

    >>> import torch, tempfile
    >>> from tensordict_rs import TensorDict
    >>> with tempfile.TemporaryDirectory() as d:
    ...     td = TensorDict({"a": torch.zeros(3)}, [3]).memmap_(d)
    ...     made = td.make_memmap(("n", "b"), (3, 2), dtype=torch.float64)
    ...     made.fill_(1.0).shape, TensorDict.load_memmap(d)["n", "b"].sum().item()
    (torch.Size([3, 2]), 6.0)
    """
    path, filename = _target(td, key, robust_key)
    if isinstance(shape, torch.Tensor):
        raise NotImplementedError(
            "make_memmap: nested tensors (a tensor of shapes) are not supported"
        )
    filename.parent.mkdir(parents=True, exist_ok=True)
    made = MemoryMappedTensor.empty(
        tuple(shape), dtype=dtype or torch.get_default_dtype(), filename=os.fspath(filename)
    )
    _add(td, path, made)
    return td.get(key)  # type: ignore[no-any-return]


def make_memmap_from_tensor(
    td: TreeNode,
    key: Any,
    tensor: torch.Tensor,
    *,
    copy_data: bool = True,
    existsok: bool = True,
    robust_key: bool | None = True,
) -> MemoryMappedTensor:
    """Adds a memory-mapped copy of ``tensor`` at ``key`` (its file in the tree's directory;
    uninitialized with ``copy_data=False``); returns it.

    >>> import torch, tempfile
    >>> from tensordict_rs import TensorDict
    >>> with tempfile.TemporaryDirectory() as d:
    ...     td = TensorDict({"a": torch.zeros(3)}, [3]).memmap_(d)
    ...     td.make_memmap_from_tensor("c", torch.arange(3)).tolist()
    [0, 1, 2]
    """
    del existsok
    path, filename = _target(td, key, robust_key)
    filename.parent.mkdir(parents=True, exist_ok=True)
    made = MemoryMappedTensor.empty(tensor.shape, dtype=tensor.dtype, filename=os.fspath(filename))
    if copy_data:
        made.copy_(tensor)
    _add(td, path, made)
    return td.get(key)  # type: ignore[no-any-return]


def make_memmap_from_storage(
    td: TreeNode,
    key: Any,
    storage: torch.UntypedStorage,
    shape: Any,
    *,
    dtype: torch.dtype | None = None,
    robust_key: bool | None = True,
) -> torch.Tensor:
    """Adds a tensor at ``key`` that reads its data from ``storage`` and returns it. A storage
    that is the new entry's file in the directory is committed with the tree; a storage without
    a file is used as it is (not written to the directory, so ``load_memmap`` does not see it:
    a FutureWarning says so, as in tensordict).

    >>> import torch, tempfile
    >>> from tensordict_rs import TensorDict
    >>> with tempfile.TemporaryDirectory() as d:
    ...     td = TensorDict({"a": torch.zeros(3)}, [3]).memmap_(d)
    ...     b = td.make_memmap("b", (3,))
    ...     c = td.make_memmap_from_storage("c", b.untyped_storage(), (3,))
    Traceback (most recent call last):
    RuntimeError: Providing a storage with an associated filename that differs ...
    """
    path, filename = _target(td, key, robust_key)
    dtype = dtype or torch.get_default_dtype()
    size = torch.Size(shape)
    strides: list[int] = []
    step = 1
    for n in reversed(size):  # contiguous strides
        strides.insert(0, step)
        step *= max(n, 1)
    view = torch.empty(0, dtype=dtype).set_(storage, 0, size, strides)
    source = _file_of(td, storage)
    if source is not None and source != os.fspath(filename):
        raise RuntimeError(
            "Providing a storage with an associated filename that differs from the filename "
            f"argument is not permitted unless filename=None. Got filename={filename}, "
            f"storage.filename={source}"
        )
    if source is not None:
        _add(td, path, view)
        return view
    if storage.nbytes() and td.saved_path is not None:
        warnings.warn(
            f"make_memmap_from_storage: the storage of {key!r} is not the entry's file in "
            "the directory, so load_memmap and memmap_refresh_ drop the entry. Starting with "
            "TensorDict 0.17, the default will change to raising a RuntimeError. Use "
            "make_memmap_from_tensor to copy the data into the directory.",
            FutureWarning,
            stacklevel=2,
        )
    node = td
    for part in path[:-1]:
        child = node._tensordict.get(part)
        if not isinstance(child, TreeNode):
            child = type(td)._new_unchecked(node.batch_size, node.device)
            node._tensordict[part] = child
        node = child  # type: ignore[assignment]
    node._check_batch(path[-1], view.shape)
    node._tensordict[path[-1]] = view
    del filename
    return view


class FileEntries(TreeNode):
    """Entries written straight to files (a mixin of TensorDict): ``make_memmap*``,
    ``from_h5`` / ``to_h5``, and the deprecated ``load_``."""

    make_memmap = make_memmap
    make_memmap_from_tensor = make_memmap_from_tensor
    make_memmap_from_storage = make_memmap_from_storage
    from_h5 = as_classmethod(_h5.from_h5)
    to_h5 = _h5.to_h5

    def load_(self, prefix: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Any:
        """Deprecated (as in tensordict 0.15): ``load_memmap_(prefix, ...)``.

        >>> import torch, warnings; from tensordict_rs import TensorDict
        >>> _ = TensorDict({"a": torch.ones(2)}, [2]).memmap("saved_")
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     TensorDict({"a": torch.zeros(2)}, [2]).load_("saved_")["a"]
        MemoryMappedTensor([1., 1.])
        """
        warnings.warn(
            "load_ is deprecated and will be removed in TensorDict 0.17. Use load_memmap_ instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return cast(Any, self).load_memmap_(prefix, *args, **kwargs)
