"""Sharing across processes without copies: TensorDicts and MemoryMappedTensors under
``multiprocessing`` (Process arguments, Queue, Pipe, Pool) and DataLoader workers, with every
start method (fork, spawn, forkserver).

What crosses is plain data plus one file descriptor per arena of shared memory (a tree of
small leaves is one arena; large leaves are spread over one arena per writer thread, so a big
tree is a few), never the bytes: the layout of the tree (keys, dtypes, shapes, batch sizes,
flags) as tuples, and the arenas as ``multiprocessing.reduction.DupFd`` handles, which
multiprocessing passes the way it passes every fd (inherited by spawn children, sent with
``SCM_RIGHTS`` to forkserver children, fetched through ``resource_sharer`` after start-up). The
receiver maps the same memory, once per process however often it arrives. File-backed leaves
travel by path. Plain tensor leaves are copied, with one native call, into new arenas: a
DataLoader batch crosses back from a worker as one descriptor (a few for batches of hundreds
of MiB), not one per leaf.

The reducers are registered with ``multiprocessing.reduction.ForkingPickler`` only (as torch
registers its own), so a plain ``pickle.dumps`` of anonymous memory raises at the caller, with
an error that says what to do.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from multiprocessing import context, reduction
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch

from .. import _native
from .._core import dirty as _dirty
from .._core import nested as _nested
from .._core.dtypes import MEMORY_DTYPE_TO_STR as DTYPE_TO_STR
from .._core.dtypes import MEMORY_STR_TO_DTYPE as STR_TO_DTYPE
from .._core.metadata import kind_of, of_kind
from .._core.nodes import NTD_TYPES, TD, TreeNode, _gc_paused
from .._core.nontensor import NonTensorStack, share_entries
from .._core.nontensor_store import _Cells
from .._core.shared_value import SharedValue
from .._core.tensor_bytes import _source_bytes, check_same_file
from .._core.unbatched import UnbatchedTensor
from .._core.walk import leaves
from ..io import directory, growth
from ..memmap import MemoryMappedTensor, _LazyLeaf, _wrap
from . import ring as _ring
from . import ring_layout, ring_receive

BUFFER, NODE, NON_TENSOR, TENSOR, NESTED, STACK, RING, SHARED_NON_TENSOR, SHARED_STACK = range(9)
LOCKED, MEMMAP, SHARED = 1, 2, 4

# (size, stride, storage_offset) of a view; None for the whole buffer as one contiguous tensor
Geometry = tuple[tuple[int, ...], tuple[int, ...], Any] | None
# one arena of a message: (DupFd, arena nbytes, [(offset, nbytes)], [buffer position])
Handle = tuple[Any, int, list[tuple[int, int]], list[int]]
# a node's dirty map: its directory, and the rows of the tree it views, from the view outwards
# ((rows, n) of each ``RowsOf``: ``td[4:12]`` is (slice(4, 12), 16))
Tracking = tuple[str, tuple[tuple[Any, int], ...]]


class _Message:
    """What one pickled tree refers to: the buffers its leaves view (grouped into arenas, one
    fd each, or files) and the plain leaves that go into one new arena."""

    def __init__(self, ring: _ring.WorkerRing | None = None) -> None:
        self.buffers: list[_native.Buffer] = []
        # arenas made for this message only: their fds must stay open until they are sent
        self.keep: list[Any] = []
        self.plain: list[tuple[list[Any], int, str, torch.Tensor]] = []
        # a DataLoader worker's ring: its slots that the leaves view, (slot, generation)
        self.ring = ring
        self.slots: list[tuple[int, int]] = []
        # the dirty maps the nodes stamp (``tracking``): (path of the node, what finds its map)
        self.trackers: list[tuple[tuple[str, ...], Tracking]] = []

    def tensor_entry(self, key: str, value: torch.Tensor, entries: list[Any]) -> tuple[Any, ...]:
        """The entry of a tensor leaf (plain CPU tensors are queued for the batch arena)."""
        if type(value) is MemoryMappedTensor and value._buffer is not None:
            buffer = value._buffer
            dtype_name = DTYPE_TO_STR.get(value.dtype)
            if dtype_name is not None and value.untyped_storage().data_ptr() == buffer.address:
                shape = tuple(value.shape)
                whole = (
                    value.storage_offset() == 0
                    and value.is_contiguous()
                    and value.nbytes == buffer.nbytes
                )
                geometry = None if whole else (shape, tuple(value.stride()), value.storage_offset())
                self.buffers.append(buffer)
                return (BUFFER, key, len(self.buffers) - 1, dtype_name, shape, geometry)
        if self.ring is not None and value.device.type == "cpu" and not value.requires_grad:
            storage = value.untyped_storage().data_ptr()
            held = self.ring.lookup(storage)
            if held is not None and value.dtype in DTYPE_TO_STR:
                if held not in self.slots:
                    self.slots.append(held)
                return (
                    RING,
                    key,
                    self.slots.index(held),
                    DTYPE_TO_STR[value.dtype],
                    tuple(value.shape),
                    tuple(value.stride()),
                    value.storage_offset(),
                )
        if (
            value.device.type != "cpu"
            or value.numel() == 0
            or value.requires_grad
            or value.dtype not in DTYPE_TO_STR
            or (type(value) is torch.Tensor and value.is_shared())
        ):
            # torch's own reducers: CUDA IPC, shared storages (kept shared), empty tensors
            return (TENSOR, key, value.as_subclass(torch.Tensor))
        self.plain.append((entries, len(entries), key, value))
        return (TENSOR, key, None)  # replaced once the batch arena exists

    def consolidate(self) -> None:
        """Copies every queued plain leaf into one new arena (one native call)."""
        if not self.plain:
            return
        sources = [_source_bytes(value) for _, _, _, value in self.plain]
        buffers = _native.anonymous_buffers([(s.data_ptr(), s.nbytes) for s in sources])
        del sources
        # the new arenas (one, or a few for large leaves) live on in no tree of this process
        self.keep.extend({buffer.region_id: buffer for buffer in buffers}.values())
        for (entries, at, key, value), buffer in zip(self.plain, buffers, strict=True):
            self.buffers.append(buffer)
            at_buffer = len(self.buffers) - 1
            entries[at] = (
                BUFFER,
                key,
                at_buffer,
                DTYPE_TO_STR[value.dtype],
                tuple(value.shape),
                None,
            )
        self.plain = []

    def handles(self) -> tuple[list[Handle], list[tuple[Any, ...]]]:
        """One ``DupFd`` per arena, taken now (while every arena is alive), and the files
        (a file's path, or an archive's ``(path, identity, offset, shared)``)."""
        arenas, others = _native.group_shared(self.buffers)
        files: list[tuple[Any, ...]] = []
        for position in others:
            buffer = self.buffers[position]
            if buffer.archive is not None:  # a leaf of a .tdz: where it lies in the archive
                files.append((position, buffer.archive, buffer.nbytes))
                continue
            if buffer.filename is None:
                raise TypeError("a memory map with neither a file nor a descriptor cannot be sent")
            files.append((position, buffer.filename, buffer.nbytes, buffer.file_id))
        popen = context.get_spawning_popen()
        if popen is not None and self.keep:
            # spawn and forkserver pass the fd numbers themselves after pickling: a batch arena
            # made for this message must stay open until the child has it, so it lives as long
            # as the child's Popen. (The arenas of the trees live as long as the trees, which
            # the Process arguments hold.)
            popen.__dict__.setdefault("_tensordict_rs_keep", []).extend(self.keep)
        handles = [
            (reduction.DupFd(fd), nbytes, slices, positions)
            for fd, nbytes, slices, positions in arenas
        ]
        return handles, files


def tracking(tracker: Any) -> Tracking | None:
    """What finds ``tracker`` (a tree's ``_tracker``) again in another process: the directory
    of its dirty map and the rows of the tree it views (see ``retrack``); None when untracked."""
    rows: list[tuple[Any, int]] = []
    while type(tracker) is _dirty.RowsOf:
        rows.append((tracker.rows, tracker.n))
        tracker = tracker.base
    path = getattr(tracker, "path", None)
    if path is None:
        return None
    return os.path.dirname(os.fspath(path)), tuple(rows)


def retrack(spec: Tracking) -> Any:
    """The tracker ``tracking`` described: the directory's map (or a ``PendingMap``), wrapped
    so that a view stamps the rows of the tree it views (``td[4:12]``'s row 1 is row 5)."""
    directory, rows = spec
    tracker = growth.tracker_at(Path(directory))
    for view_rows, n in reversed(rows):
        tracker = _dirty.RowsOf(tracker, view_rows, n)
    return tracker


def _describe(
    td: Any, msg: _Message, parent: Any = None, path: tuple[str, ...] = ()
) -> tuple[Any, ...]:
    tracker = td._tracker
    if tracker is not None and tracker is not parent:
        # a view (td[4:12], select), a sub-tree, or a tree saved in another directory: the
        # receiver stamps the same map, at the rows of the tree the sender's stamps
        spec = tracking(tracker)
        if spec is not None:
            msg.trackers.append((path, spec))
    entries: list[Any] = []
    buffers = msg.buffers
    for key, value in td._tensordict.items():
        cls = type(value)
        entry: tuple[Any, ...]
        if cls is _LazyLeaf:
            dtype_name = DTYPE_TO_STR.get(value.dtype)
            if dtype_name is None:
                entry = msg.tensor_entry(key, value.materialize(), entries)
            else:
                buffers.append(value.buffer)
                entry = (BUFFER, key, len(buffers) - 1, dtype_name, value.shape, None)
        elif cls is UnbatchedTensor:
            # pickled in the layout (by ForkingPickler: its payload's own shared-memory
            # reducer), so that it stays an UnbatchedTensor over the same memory
            entry = (TENSOR, key, value)
        elif isinstance(value, torch.Tensor) and value.is_nested:
            # its components' bytes as a 1-D leaf (in the batch arena, or the map it views),
            # its table of component shapes and layout as plain data
            flat, table, jagged = _nested.flat_parts(value)
            holder: list[Any] = []
            holder.append(msg.tensor_entry(key, flat.contiguous(), holder))
            entry = (NESTED, key, holder, table, jagged)
        elif isinstance(value, torch.Tensor):
            entry = msg.tensor_entry(key, value, entries)
        elif cls in NTD_TYPES:
            if value._shared is not None:  # the receiver maps the same cell
                buffers.append(value._shared.buffer)
                batch = tuple(value.batch_size)
                entry = (SHARED_NON_TENSOR, key, len(buffers) - 1, batch, kind_of(value))
            else:
                entry = (NON_TENSOR, key, value.data, kind_of(value), _bound(td, key, value))
        elif cls is NonTensorStack:
            shared = value._cells.shared
            if shared is not None:
                buffers.append(shared.buffer)
                device = None if value.device is None else str(value.device)
                positions = value._pos
                entry = (
                    SHARED_STACK,
                    key,
                    len(buffers) - 1,
                    (positions.tolist(), tuple(positions.shape), device, value.stack_dim),
                )
            else:
                # pickled: a packed column as two byte strings
                entry = (STACK, key, value, _bound(td, key, value))
        else:
            entry = (NODE, key, _describe(value, msg, tracker, (*path, key)))
        entries.append(entry)
    flags = (
        (LOCKED if td._is_locked else 0)
        | (MEMMAP if td._is_memmap else 0)
        | (SHARED if td._is_shared else 0)
    )
    prefix = None if td._memmap_prefix is None else os.fspath(td._memmap_prefix)
    device = None if td._device is None else str(td._device)
    return (type(td), tuple(td._batch_size), device, flags, prefix, entries)


def _leaf(buffer: _native.Buffer, dtype_name: str, shape: Any, geometry: Geometry) -> Any:
    dtype = STR_TO_DTYPE[dtype_name]
    # anonymous memory that came from another process is shared with it (is_shared)
    shared = buffer.filename is None
    if geometry is None:
        return _LazyLeaf(buffer, dtype, tuple(shape), shared)
    size, stride, offset = geometry
    storage = torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage()
    view = torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
    return _wrap(view, buffer, buffer.filename, shared)


def _ring_leaf(storage: torch.UntypedStorage, entry: tuple[Any, ...]) -> torch.Tensor:
    _, _, _, dtype_name, shape, stride, offset = entry
    return torch.empty(0, dtype=STR_TO_DTYPE[dtype_name]).set_(storage, offset, shape, stride)


def _build(node: tuple[Any, ...], buffers: list[Any], storages: Sequence[Any] = ()) -> Any:
    from pathlib import Path

    cls, batch, device, flags, prefix, entries = node
    td = cls._new_unchecked(torch.Size(batch), None if device is None else torch.device(device))
    items = td._tensordict
    dtypes = STR_TO_DTYPE
    ring_leaves: Any = ()
    if storages:
        # the leaves that view a ring slot, made together (a few torch calls for many leaves)
        specs = [(storages[e[2]], dtypes[e[3]], e[4], e[5], e[6]) for e in entries if e[0] == RING]
        ring_leaves = iter(ring_layout.views(specs))
    for entry in entries:
        tag, key = entry[0], entry[1]
        if tag == BUFFER:
            if entry[5] is None:
                buffer = buffers[entry[2]]
                items[key] = _LazyLeaf(buffer, dtypes[entry[3]], entry[4], buffer.filename is None)
            else:
                items[key] = _leaf(buffers[entry[2]], entry[3], entry[4], entry[5])
        elif tag == RING:
            items[key] = next(ring_leaves)
        elif tag == NODE:
            items[key] = _build(entry[2], buffers, storages)
        elif tag == NON_TENSOR:
            items[key] = value = of_kind(entry[3], entry[2])
            if flags & SHARED:  # a value of a shared tree that JSON cannot hold (its own)
                value._local = key
        elif tag == SHARED_NON_TENSOR:
            items[key] = shared_value = of_kind(entry[4], None, entry[3])
            shared_value._shared = SharedValue(buffers[entry[2]])
        elif tag == SHARED_STACK:
            items[key] = _shared_stack(buffers[entry[2]], *entry[3])
        elif tag == NESTED:
            inner = entry[2][0]
            if inner[0] == RING:
                flat = _ring_leaf(storages[inner[2]], inner)
            elif inner[0] == BUFFER:
                flat = (
                    _LazyLeaf(buffers[inner[2]], STR_TO_DTYPE[inner[3]], inner[4]).materialize()
                    if inner[5] is None
                    else _leaf(buffers[inner[2]], inner[3], inner[4], inner[5])
                )
            else:
                flat = inner[2]
            items[key] = _nested.from_flat(flat, entry[3], entry[4])
        else:
            items[key] = entry[2]
    td._is_memmap = bool(flags & MEMMAP)
    td._is_shared = bool(flags & SHARED)
    td._memmap_prefix = None if prefix is None else Path(prefix)
    if td._is_memmap and prefix is not None and os.path.isdir(prefix):
        # values written here in place rewrite the saved files, as in the sender (every
        # non-tensor value of a tree made by memmap_())
        for key, value in items.items():
            if type(value) in NTD_TYPES or type(value) is NonTensorStack:
                value._bind_saved(td._memmap_prefix, key)
    for entry in entries:
        # the values the sender had bound: in a tree loaded with load_memmap (not a value set
        # in memory since the load), or of an archive mapped shared (they refuse writes in
        # place, there and here); the others stay in memory, there and here
        if entry[0] not in (NON_TENSOR, STACK) or entry[-1] is None:
            continue
        parent, locked = entry[-1]
        if isinstance(parent, Path) and not os.path.isdir(parent):
            continue
        value = items[entry[1]]
        if type(value) is NonTensorStack:
            value._bind_saved(parent, entry[1])
        else:
            value._bind_saved(parent, entry[1], locked=locked)
    return td


def _bound(td: Any, key: str, value: Any) -> tuple[Any, bool] | None:
    """Where the non-tensor ``value`` at ``key`` of ``td`` is saved, as ``_bind_saved``
    recorded it: ``(parent, locked)``, its directory (``td``'s) or the ``_ArchiveEntry`` of an
    archive mapped shared, and for a ``NonTensorData`` whether it is locked; or None: kept in
    memory only. The receiver binds it the same way (``_build``)."""
    if type(value) is NonTensorStack:
        saved = value._cells.saved
        if saved is None or saved[2] != key:
            return None
        parent, locked = saved[1], False
    else:
        saved = value._saved
        if saved is None or saved[1] != key:
            return None
        parent, locked = saved[0], bool(saved[2])
    if type(parent) is directory._ArchiveEntry:
        return parent, locked
    prefix = td._memmap_prefix
    if prefix is None or not isinstance(parent, (str, Path)):
        return None
    if os.fspath(parent) != os.fspath(prefix):
        return None
    return Path(parent), locked


def _shared_stack(
    buffer: _native.Buffer, positions: Any, shape: Any, device: Any, stack_dim: int
) -> NonTensorStack:
    """A stack over the shared cell ``buffer`` (its values: what the cell holds now)."""
    cell = SharedValue(buffer)
    cells = _Cells(cell.get())
    cells.shared = cell
    pos = np.asarray(positions, dtype=np.int64).reshape(shape)
    return NonTensorStack._from_parts(
        cells, pos, None if device is None else torch.device(device), stack_dim
    )


def _relock(td: Any, node: tuple[Any, ...]) -> None:
    """Locks the rebuilt nodes that were locked (a locked node locks everything under it)."""
    if node[3] & LOCKED:
        td._lock_tree()
        return
    for entry in node[5]:
        if entry[0] == NODE:
            _relock(td._tensordict[entry[1]], entry[2])


def _receive(handles: list[Handle], files: list[tuple[Any, ...]], count: int) -> list[Any]:
    """Every buffer of the message, in order: each arena mapped once, the files opened (the
    leaves of one archive share one map of it, refused if the archive was replaced)."""
    buffers: list[Any] = [None] * count
    for i, (handle, nbytes, slices, positions) in enumerate(handles):
        fd = handle.detach()
        try:
            mapped = _native.receive_shared(fd, nbytes, slices)
        except BaseException:
            for later in handles[i + 1 :]:
                os.close(later[0].detach())
            raise
        for position, buffer in zip(positions, mapped, strict=True):
            buffers[position] = buffer
    named = [file for file in files if type(file[1]) is str]
    if named:
        opened = _native.open_files([(file[1], file[2]) for file in named])
        for (position, name, _, identity), buffer in zip(named, opened, strict=True):
            check_same_file(name, identity, buffer)
            buffers[position] = buffer
    for position, archive, nbytes, *_ in files:
        if type(archive) is not str:
            path, identity, offset, shared = archive
            buffers[position] = _native.reopen_archive(path, identity, offset, nbytes, shared)
    return buffers


@_gc_paused()
def _rebuild_td(
    layout: bytes,
    handles: list[Handle],
    files: list[tuple[Any, ...]],
    rings: tuple[tuple[Any, ...], ...] = (),
) -> Any:
    # The layout is unpickled here, with the collector paused: a 10,000-leaf tree is tens of
    # thousands of tuples, which would trigger full collections while they are made.
    storages = [ring_receive.receive(message) for message in rings]
    node, count, trackers = pickle.loads(layout)
    td = _build(node, _receive(handles, files, count), storages)
    _relock(td, node)
    for path, spec in trackers:  # parents first: a nested tree's own map replaces theirs
        at = td
        for key in path:
            at = at._tensordict[key]
        _dirty.attach(retrack(spec), at)
    _track(td)
    return td


def _track(td: Any) -> None:
    """A tree saved in a directory stamps its writes in the directory's dirty map here as in
    the sender (``io/dirty.py``), so that a checkpoint sees what this process writes (a tree
    sent to a spawned process did not: its writes were missed by every checkpoint). The sender's
    tracker comes with the tree (``tracking``): a view (``td[4:12]``, ``select``) or a sub-tree
    stamps the rows of the tree it views, in that tree's map; a tree without one, saved in a
    directory, takes that directory's map (``growth.attach``: the map of the tree holding it,
    for a nested tree's directory)."""
    prefix = td._memmap_prefix
    if prefix is not None and td._tracker is None and os.path.isdir(prefix):
        growth.attach(td, prefix)


def reduce_tensordict(td: TD) -> tuple[Any, ...]:
    """ForkingPickler reducer of a TensorDict: the layout as plain data, one fd per arena
    (in a DataLoader worker, the slot of its ring that a batch views, and no new fd)."""
    ring = _ring.local_ring()
    if ring is not None:
        fast = _ring.reduce_batch(td)  # a flat ring batch: a few tuples, no pause needed
        if fast is not None:
            return fast
    return _reduce_tree(td, ring)


@_gc_paused()
def _reduce_tree(td: TD, ring: _ring.WorkerRing | None) -> tuple[Any, ...]:
    msg = _Message(ring)
    node = _describe(td, msg)
    rings: list[tuple[Any, ...]] = []
    if ring is not None and msg.slots:
        if ring.claim(msg.slots):
            rings = [ring.message(slot, generation) for slot, generation in msg.slots]
        else:  # a batch pickled twice: its leaves are copied like any plain tensor
            msg = _Message()
            node = _describe(td, msg)
    msg.consolidate()
    handles, files = msg.handles()
    # ForkingPickler again: non-tensor values and CUDA leaves use their own reducers.
    layout = bytes(reduction.ForkingPickler.dumps((node, len(msg.buffers), msg.trackers)))
    return (_rebuild_td, (layout, handles, files, tuple(rings)))


def _as_index(indices: Any) -> torch.Tensor:
    """``torch.as_tensor(indices)``; a list of ints (what a DataLoader's batch sampler gives)
    goes through numpy, 5 us for 256 against 30."""
    if type(indices) is list:
        array = np.array(indices)
        if array.dtype == np.int64:
            return torch.from_numpy(array)
    return torch.as_tensor(indices)


def getstate(td: TD) -> dict[str, Any]:
    """TensorDict's pickled state (``__getstate__``): the entries (lazy leaves made), batch
    size, device, lock and memory-map flags; the leaves pickle themselves (see ``register``)."""
    items = {}
    for key in list(td._tensordict):
        items[key] = td._get_str(key)
    return {
        "items": items,
        "batch_size": td._batch_size,
        "device": td._device,
        "is_locked": td._is_locked,
        "is_memmap": td._is_memmap,
        "prefix": td._memmap_prefix,
        "tracking": tracking(td._tracker),
    }


def setstate(td: TD, state: dict[str, Any]) -> None:
    """``__setstate__``: a TensorDict again from what ``getstate`` gave.

    >>> import pickle, torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(3), "b": {"c": torch.ones(3)}}, [3], lock=True)
    >>> again = pickle.loads(pickle.dumps(td))
    >>> again["a"].tolist(), again.batch_size, again.is_locked
    ([0, 1, 2], torch.Size([3]), True)
    """
    td._init(state["batch_size"], state["device"])
    td._tensordict = state["items"]
    td._is_memmap = state["is_memmap"]
    td._memmap_prefix = state["prefix"]
    if state["is_locked"]:
        td._lock_tree()
    spec = state.get("tracking")
    if spec is not None:
        _attach_over(retrack(spec), td)
    _track(td)


def _attach_over(tracker: Any, td: Any) -> None:
    """Attaches ``tracker`` to ``td`` and to its nested trees that have none of their own (they
    were unpickled first, with their own)."""
    td._tracker = tracker
    for value in td._tensordict.values():
        if isinstance(value, TreeNode) and value._tracker is None:
            _attach_over(tracker, value)


def register(tensordict_cls: type) -> None:
    """Registers the TensorDict reducer with multiprocessing's ForkingPickler (torch's Queues
    too); MemoryMappedTensor's is registered with its class (``memmap.py``)."""
    reduction.ForkingPickler.register(tensordict_cls, reduce_tensordict)


class Shareable(TreeNode):
    """``share_memory_``/``is_shared``, DataLoader batches (``__getitems__``), ``pin_memory``."""

    _is_shared: bool = False

    def share_memory_(self) -> Self:
        """Moves every CPU leaf into shared memory, locks the TensorDict, and returns self.

        Processes that receive it (``multiprocessing`` or ``torch.multiprocessing`` Process
        arguments, Queues, Pipes, Pools, DataLoader workers) read and write the same memory.
        The leaves go into anonymous arenas (memfds): they become anonymous
        MemoryMappedTensors, and the tree crosses processes with one file descriptor, whatever
        its number of leaves (a few when large leaves fill several arenas, one per writer
        thread). A CUDA TensorDict is left as it is (CUDA tensors are shared
        already) and not locked. A memory-mapped TensorDict raises ``RuntimeError``, as in
        tensordict. ``is_shared()`` is True until ``unlock_()``. Non-tensor values (JSON) and
        the values of stacks go into shared memory too (``_core/shared_value.py``): a value
        written in place in one process (``td.get(key).update_(...)``, ``td.set_``, rows of a
        stack) is read in the others, as in tensordict.

        >>> import multiprocessing as mp, torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"x": torch.zeros(4)}, [4]).share_memory_()
        >>> td.is_shared(), td.is_locked
        (True, True)
        >>> child = mp.get_context("fork").Process(target=td["x"].fill_, args=(7.0,))
        >>> child.start(); child.join()
        >>> td["x"]  # the child wrote the same memory
        MemoryMappedTensor([7., 7., 7., 7.])
        """
        if self._is_memmap:
            raise RuntimeError("memmap and shared memory are mutually exclusive features.")
        if self._device is not None and self._device.type == "cuda":
            return self
        share_entries(self)
        directory.save(
            self,
            None,
            like=False,
            reuse_maps=True,
            existsok=True,
            durable=False,
            num_threads=0,
        )
        self._mark_shared()
        self._lock_tree()
        return self

    def _mark_shared(self) -> None:
        self._is_shared = True
        self._is_memmap = False
        for value in self._tensordict.values():
            if isinstance(value, Shareable):
                value._mark_shared()
            elif type(value) is _LazyLeaf:
                value.shared = True  # its leaves answer is_shared(), as tensordict's
            elif type(value) is MemoryMappedTensor and value._filename is None:
                value._shared = True

    def is_shared(self) -> bool:
        """True after ``share_memory_()`` (until ``unlock_()``), as in tensordict.

        A memory-mapped TensorDict reports False (``is_memmap()`` is True), as in tensordict,
        though its memory is shared too.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3])
        >>> td.is_shared(), td.share_memory_().is_shared()
        (False, True)
        """
        return self._is_shared

    def __getitems__(self, indices: Any) -> Any:
        """The rows ``indices`` of batch dim 0 in one gather: the hook that lets
        ``DataLoader(td, batch_size=B, collate_fn=...)`` index once per batch, not per row.

        In a DataLoader worker the rows go straight into a reused slot of the worker's ring
        of shared slabs, and the batch crosses to the main process as its slot number: see
        the DataLoader section of the sharing guide for the rule that keeps a batch the user
        holds from being overwritten.
        """
        index = indices if isinstance(indices, torch.Tensor) else _as_index(indices)
        if _ring.in_worker():
            batch = _ring.gather_batch(self, index)
            if batch is not None:
                return batch
        return self[index]

    def pin_memory(self, num_threads: int | None = None, inplace: bool = False) -> Any:
        """A copy with every tensor in pinned (page-locked) memory, for fast, asynchronous
        copies to an accelerator; ``inplace=True`` replaces the leaves of self instead.
        ``num_threads`` is accepted for tensordict's signature.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2), "b": {"c": torch.ones(2)}}, [2])
        >>> pinned = td.pin_memory() if torch.cuda.is_available() else None  # needs CUDA
        >>> pinned is None or (pinned["a"].is_pinned() and pinned["b", "c"].is_pinned())
        True
        """
        del num_threads
        if ring_receive.pin_slabs(self):
            return self  # a DataLoader ring batch: its slabs are pinned once, in place
        if not inplace:
            return self.apply(lambda t: t.pin_memory())
        for td, key, value in list(leaves(self)):
            td._tensordict[key] = value.pin_memory()
        return self

    def pin_memory_(self, num_threads: int | None = None) -> Self:
        """``pin_memory(inplace=True)``: pins every tensor leaf in place; returns self (CUDA
        is needed to pin; a tree with no leaves is returned as it is).

        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({}, [])
        >>> td.pin_memory_() is td
        True
        """
        self.pin_memory(num_threads, inplace=True)
        return self
