"""HDF5 files (``from_h5``, ``to_h5``), through ``h5py`` (installed separately).

``from_h5`` gives a TensorDict of the file's groups and datasets. A dataset stored contiguously
and unfiltered (h5py's default layout, ``to_h5``'s too) is not read: its leaf is a view of a
map of the file at the dataset's offset (copy-on-write with ``mode="r"``, shared with
``mode="r+"``, so that writes reach the file). Chunked or compressed datasets are read into
memory. So ``TensorDict.from_h5(path).memmap(dir)`` copies an HDF5 dataset larger than memory
into a memory-mapped directory page by page. Strings read as ``str`` (tensordict 0.15 reads
its own as ``bytes``, with a FutureWarning announcing ``str``).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import numpy as np
import torch

from .._core.nodes import NTD_TYPES, TD, NonTensorData, TreeNode
from .._core.walk import walk_items


def _h5py() -> Any:
    try:
        h5py = importlib.import_module("h5py")  # optional, untyped: not a dependency
    except ImportError as err:
        raise ImportError(
            "from_h5 and to_h5 need h5py, which tensordict_rs does not install: pip install h5py"
        ) from err
    return h5py


def _file_view(file: torch.Tensor, dataset: Any) -> torch.Tensor | None:
    """The dataset as a view of the mapped file, or None if it is not one contiguous run."""
    if dataset.chunks is not None or dataset.compression is not None:
        return None
    if dataset.dtype.kind not in "biufc" or dataset.dtype.byteorder == ">":
        return None
    offset = dataset.id.get_offset()
    if offset is None:
        return None
    dtype = torch.from_numpy(np.empty(0, dtype=dataset.dtype)).dtype
    nbytes = int(np.prod(dataset.shape, dtype=np.int64)) * dataset.dtype.itemsize
    if offset + nbytes > file.numel() or offset % dtype.itemsize:
        return None
    return file[offset : offset + nbytes].view(dtype).view(dataset.shape)


def _read(cls: type[TD], group: Any, file: torch.Tensor | None) -> TD:
    td = cls({}, [])
    for key, item in group.items():
        if hasattr(item, "items"):  # a group
            td._tensordict[key] = _read(cls, item, file)
            continue
        view = None if file is None else _file_view(file, item)
        if view is not None:
            td._tensordict[key] = view
        elif item.dtype.kind in "biufc":
            td._tensordict[key] = torch.from_numpy(np.asarray(item[()]))
        else:
            value = item[()]
            if isinstance(value, bytes):
                value = value.decode()
            elif isinstance(value, np.ndarray):
                value = [v.decode() if isinstance(v, bytes) else v for v in value.tolist()]
            td._tensordict[key] = NonTensorData(value)
    return td


def _set_batch(td: Any, batch: torch.Size) -> None:
    for value in td._tensordict.values():
        if isinstance(value, TreeNode):
            _set_batch(value, batch)
    td.batch_size = batch


def from_h5(
    cls: type[TD],
    filename: str | os.PathLike[str],
    *,
    mode: str = "r",
    auto_batch_size: bool = False,
    batch_dims: int | None = None,
    batch_size: Any = None,
    non_tensor_as_stack: bool = False,
) -> TD:
    """A TensorDict of an HDF5 file: groups are nested TensorDicts, datasets leaves (views of
    the mapped file when stored contiguously). The batch size is ``batch_size``, or each
    (nested) TensorDict's longest shared leading shape (cut to ``batch_dims``). Needs h5py.

    >>> import torch, tempfile, importlib.util
    >>> from tensordict_rs import TensorDict
    >>> if importlib.util.find_spec("h5py"):
    ...     with tempfile.TemporaryDirectory() as d:
    ...         _ = TensorDict(a=torch.arange(4.0), batch_size=[4]).to_h5(f"{d}/x.h5")
    ...         print(TensorDict.from_h5(f"{d}/x.h5")["a"].tolist())
    ... else:
    ...     print([0.0, 1.0, 2.0, 3.0])
    [0.0, 1.0, 2.0, 3.0]
    """
    if non_tensor_as_stack:
        raise NotImplementedError(
            "from_h5(non_tensor_as_stack=True) is not supported yet: string columns read as one "
            "NonTensorData holding a list (NonTensorStack.from_list(value.tolist()) makes a stack)."
        )
    if auto_batch_size and batch_size is not None:
        raise TypeError("auto_batch_size and batch_size are exclusive.")
    h5py = _h5py()
    path = os.fspath(filename)
    if mode not in ("r", "r+", "a"):
        raise ValueError(f"from_h5 reads an existing file: mode 'r', 'r+' or 'a', got {mode!r}")
    size = os.path.getsize(path)
    file = torch.from_file(path, shared=mode != "r", size=size, dtype=torch.uint8) if size else None
    with h5py.File(path, "r") as handle:
        td = _read(cls, handle, file)
    if batch_size is not None:
        _set_batch(td, torch.Size(batch_size))
    else:
        from ..ops.keys import _max_batch

        _max_batch(td, batch_dims if auto_batch_size else None)
    return td


def to_h5(td: TD, filename: str | os.PathLike[str], **kwargs: Any) -> TD:
    """Writes the tree to a new HDF5 file (groups for nested TensorDicts, a dataset per leaf,
    ``kwargs`` passed to ``create_dataset``, e.g. ``compression="gzip"``) and returns
    ``from_h5(filename, mode="r+")`` with this batch size. Needs h5py::

        td.to_h5("data.h5", compression="gzip")
        back = TensorDict.from_h5("data.h5")

    >>> from tensordict_rs import TensorDict
    >>> callable(TensorDict.to_h5)
    True
    """
    h5py = _h5py()
    path = os.fspath(filename)
    with h5py.File(path, "w") as handle:
        for key, value in walk_items(td, nested=True, leaves_only=False):
            name = "/".join(key) if isinstance(key, tuple) else key
            if isinstance(value, TreeNode):
                handle.require_group(name)
            elif type(value) in NTD_TYPES:
                handle.create_dataset(name, data=value.data)
            else:
                array = value.detach().cpu().as_subclass(torch.Tensor).numpy()
                handle.create_dataset(name, data=array, **kwargs)
    return from_h5(type(td), path, mode="r+", batch_size=td.batch_size)
