"""Trees as directories (tensordict's format): save and load, one native call per tree each way.

Saving walks the tree once to build a plain spec (keys, dtype strings, shapes, source pointers),
hands it to Rust, and gets every leaf's buffer back in the same depth-first order. Loading gets
the whole validated tree and all buffers from one call. Leaves become ``_LazyLeaf`` entries: the
torch tensor is made on first access, so a 10,000-leaf save or load costs no torch call per leaf
until the leaf is used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NoReturn

import torch

from .. import _native
from .._core import classes as _classes
from .._core import nested as _nested
from .._core.dtypes import DTYPE_TO_STR, STR_TO_DTYPE, dtype_to_str, memory_dtype_to_str
from .._core.nodes import NTD_TYPES, TD, NonTensorData, TreeNode, _gc_paused, _json_text
from .._core.nontensor import NonTensorStack
from .._core.tensor_bytes import _source_bytes
from .._core.unbatched import UnbatchedTensor
from .._core.walk import refuse_unbatched
from ..memmap import MemoryMappedTensor, _from_buffer, _LazyLeaf, value_nbytes
from ..ops.stream import stream_tree
from . import growth

LEAF, NODE, NON_TENSOR, STACK = _native.LEAF, _native.NODE, _native.NON_TENSOR, _native.STACK
TENSORCLASS_DIR = _native.TENSORCLASS_DIR  # where a tensorclass directory keeps its TensorDict
_CPU = torch.device("cpu")
_STRIDED = torch.strided


def _check_layout(value: torch.Tensor, key: str, path: Path | None) -> None:
    """Refuses, before anything is written, leaves that the directory format cannot hold."""
    if value.layout is torch.strided and not value.is_nested:
        return
    kind = "a nested tensor" if value.is_nested else f"a {value.layout} tensor"
    where = "" if path is None else f" (saving to {path})"
    raise _native.UnsupportedFormatError(
        f"key {key!r} holds {kind}{where}: memmap saves dense strided tensors only; convert it "
        "first (t.to_dense(), or torch.stack / padding for nested tensors)"
    )


class _Plan:
    """The spec of one save, the source tensors it points into, and where results go."""

    def __init__(self, like: bool, reuse_maps: bool, copy_existing: bool = True) -> None:
        self.like = like
        self.reuse_maps = reuse_maps
        self.copy_existing = copy_existing
        # sources and their storages stay alive while Rust reads them (a storage, not just the
        # tensor: another thread's ``set_`` on the tensor must not free the memory being read)
        self.keep: list[Any] = []
        # (node, key, dtype, shape), or for a nested leaf ("nested", table, jagged, numel)
        # in place of the shape
        self.slots: list[tuple[TreeNode, str, torch.dtype, tuple[Any, ...]]] = []
        self.kept: set[int] = set()  # slots whose file the save keeps (see node)
        self.sources: list[tuple[int, int]] = []  # anonymous: (data_ptr, nbytes) per slot
        self.root: tuple[TreeNode, Path] | None = None  # the tree ``node`` was first given

    def _pointer(self, value: Any, nbytes: int) -> int:
        """Address of the bytes of a tensor or lazy leaf (kept alive in ``self.keep``)."""
        if self.like or nbytes == 0:
            return 0
        if type(value) is _LazyLeaf:
            self.keep.append(value.buffer)
            return value.buffer.address
        if not (value.is_cpu and value.is_contiguous()) or value.is_conj() or value.is_neg():
            value = _source_bytes(value)
        self.keep.append(value)
        self.keep.append(value.untyped_storage())
        return value.data_ptr()

    def _same_file(self, value: Any, target: Path) -> tuple[int, int] | None:
        """The (device, inode) of the file a mapped leaf is, whole and shared, when that file is
        meant to be the one at ``target``: the save then keeps it instead of rewriting it."""
        buffer = value.buffer if type(value) is _LazyLeaf else value._buffer
        name = None if buffer is None else buffer.filename
        if name is None:
            return None
        if name != os.fspath(target):
            if not self.copy_existing:
                raise RuntimeError(
                    f"A filename was provided but the tensor already has a file associated "
                    f"({name}). To copy the tensor onto the new location, pass copy_existing=True."
                )
            return None
        if buffer.nbytes != value_nbytes(value):
            return None
        if type(value) is not _LazyLeaf and (
            value.storage_offset() != 0
            or not value.is_contiguous()
            or value.is_conj()
            or value.is_neg()
            or value.data_ptr() != buffer.address
        ):
            return None  # a view with another layout than the file's
        return buffer.file_id

    def _nested_parts(self, value: torch.Tensor, key: str) -> tuple[torch.Tensor, Any, bool]:
        """The flat values, table of component shapes and layout of a nested leaf."""
        try:
            values, table, jagged = _nested.flat_parts(value)
        except NotImplementedError as err:
            raise _native.UnsupportedFormatError(
                f"key {key!r}: the directory format cannot hold {err}"
            ) from None
        if values.device.type != "cpu":
            values = values.cpu()
        return values.contiguous(), table.cpu(), jagged

    def _nested_entry(self, td: TreeNode, key: str, value: torch.Tensor) -> tuple[Any, ...]:
        """The spec of a nested leaf: its components' bytes and its table of shapes."""
        values, table, jagged = self._nested_parts(value, key)
        nbytes = values.numel() * values.element_size()
        ptr = 0
        if nbytes and not self.like:
            self.keep.append(values)
            self.keep.append(values.untyped_storage())
            ptr = values.data_ptr()
        dtype_name = DTYPE_TO_STR.get(values.dtype) or dtype_to_str(values.dtype)
        device = "cpu" if value.is_cpu else str(value.device)
        self.slots.append((td, key, values.dtype, ("nested", table, jagged, values.numel())))
        return (
            LEAF,
            key,
            dtype_name,
            tuple(table.shape),
            device,
            ptr,
            nbytes,
            None,
            (table.numpy().tobytes(), jagged),
        )

    def node(self, td: TreeNode, path: Path) -> tuple[Any, ...]:
        """The directory spec of ``td``, to be saved at ``path``: ``(batch, entries)``, and for
        a tensorclass's TensorDict also its class name and meta.json (its fields then go to
        ``path/_tensordict``)."""
        if self.root is None:
            self.root = (td, path)
        tensorclass = type(td)._tensorclass
        if tensorclass is not None:
            path = path / TENSORCLASS_DIR
        entries: list[tuple[Any, ...]] = []
        slots = self.slots
        keep = self.keep
        like = self.like
        for key, value in td._tensordict.items():
            cls = type(value)
            same: tuple[int, int] | None = None
            if cls is UnbatchedTensor:  # (the save methods refuse it first, naming the key)
                refuse_unbatched(td, "memory-mapped")
            if cls is NonTensorStack:
                data, shape = value.json_data(key)
                device = None if value.device is None else str(value.device)
                entries.append((STACK, key, value.stack_dim, device, data, shape))
                continue
            if cls is not _LazyLeaf and isinstance(value, torch.Tensor) and value.is_nested:
                entries.append(self._nested_entry(td, key, value))
                continue
            if cls is _LazyLeaf:
                if not self.like:
                    same = self._same_file(value, path / (_native.encode_key(key) + ".memmap"))
                dtype, shape, device = value.dtype, value.shape, "cpu"
                nbytes = value.buffer.nbytes
            elif cls in NTD_TYPES:
                entries.append((NON_TENSOR, key, _json_text(value.data, key)))
                continue
            elif cls is torch.Tensor and not like:
                # the common leaf, inline: a plain dense tensor (see _check_layout, _pointer)
                if value.layout is not _STRIDED or value.is_nested:
                    _check_layout(value, key, path)
                nbytes = value.nbytes
                if not value.is_cpu:
                    device = str(value.device)
                    ptr = self._pointer(value, nbytes)
                else:
                    device = "cpu"
                    if nbytes == 0:
                        ptr = 0
                    elif value.is_contiguous() and not (value.is_conj() or value.is_neg()):
                        keep.append(value)
                        keep.append(value.untyped_storage())
                        ptr = value.data_ptr()
                    else:
                        ptr = self._pointer(value, nbytes)
                dtype = value.dtype
                shape = tuple(value.shape)
                dtype_name = DTYPE_TO_STR.get(dtype) or dtype_to_str(dtype)
                entries.append((LEAF, key, dtype_name, shape, device, ptr, nbytes, None))
                slots.append((td, key, dtype, shape))
                continue
            elif isinstance(value, torch.Tensor):
                _check_layout(value, key, path)
                if cls is MemoryMappedTensor and not self.like:
                    same = self._same_file(value, path / (_native.encode_key(key) + ".memmap"))
                dtype, shape = value.dtype, tuple(value.shape)
                device = "cpu" if value.is_cpu else str(value.device)
                nbytes = value.nbytes
            else:
                entries.append((NODE, key, self.node(value, path / _native.encode_key(key))))
                continue
            dtype_name = DTYPE_TO_STR.get(dtype) or dtype_to_str(dtype)
            entries.append(
                (LEAF, key, dtype_name, shape, device, self._pointer(value, nbytes), nbytes, same)
            )
            if same is not None:
                self.kept.add(len(slots))
            slots.append((td, key, dtype, shape))
        if tensorclass is not None:
            return list(td.batch_size), entries, *class_spec(tensorclass)
        return list(td.batch_size), entries

    def anonymous(self, td: TreeNode) -> None:
        """Collects the leaves of ``td`` that need anonymous maps, in packed order (depth-first,
        sorted keys: see ``share/packed.py``), so that a tree of small leaves lies in its arena
        exactly as its one message does and is sent and received without a copy."""
        items = td._tensordict
        for key in sorted(items):
            value = items[key]
            cls = type(value)
            if cls in NTD_TYPES or cls is NonTensorStack:
                continue
            if cls is UnbatchedTensor:
                # share_memory_: the payload goes to torch's shared memory, the entry stays
                # an UnbatchedTensor, as in tensordict
                if value.device.type == "cpu":
                    value._data.share_memory_()
                continue
            if cls is not _LazyLeaf and isinstance(value, torch.Tensor) and value.is_nested:
                values, table, jagged = self._nested_parts(value, key)
                nbytes = values.numel() * values.element_size()
                self.keep.append(values)
                self.sources.append((values.data_ptr() if nbytes else 0, nbytes))
                self.slots.append(
                    (td, key, values.dtype, ("nested", table, jagged, values.numel()))
                )
                continue
            if cls is _LazyLeaf or isinstance(value, torch.Tensor):
                if self.reuse_maps and (cls is _LazyLeaf or cls is MemoryMappedTensor):
                    continue
                if cls is not _LazyLeaf:
                    _check_layout(value, key, None)
                dtype = value.dtype
                shape = value.shape if cls is _LazyLeaf else tuple(value.shape)
                nbytes = value.buffer.nbytes if cls is _LazyLeaf else value.nbytes
                memory_dtype_to_str(dtype)  # refuse dtypes a map cannot hold, before any work
                self.sources.append((self._pointer(value, nbytes), nbytes))
                self.slots.append((td, key, dtype, shape))
            else:
                self.anonymous(value)

    def place(self, buffers: list[Any], archive_shared: bool | None = None) -> None:
        """Puts the returned buffers into the target tree (and, for an archive mapped shared,
        makes its non-tensor values refuse writes in place: ``bind_archive``; whether it is
        comes from the buffers, or from ``archive_shared`` when given: a tree of no tensors
        has no buffer to tell)."""
        shared = _shared_archive(buffers) if archive_shared is None else archive_shared
        if self.root is not None and shared:
            bind_archive(self.root[0], self.root[1], copy_stacks=self.like)
        for i, ((td, key, dtype, shape), buffer) in enumerate(
            zip(self.slots, buffers, strict=True)
        ):
            if i in self.kept:
                continue  # the save kept this leaf's file: the source map (and object) stays
            if shape and shape[0] == "nested":
                _, table, jagged, numel = shape
                values = (
                    torch.empty(0, dtype=dtype)
                    if buffer is None
                    else _from_buffer(buffer, dtype, (numel,))
                )
                td._tensordict[key] = _nested.from_flat(values, table, jagged)
                continue
            td._tensordict[key] = (
                torch.empty(shape, dtype=dtype)
                if buffer is None
                else _LazyLeaf(buffer, dtype, shape)
            )


def class_spec(tensorclass: type) -> tuple[str, str]:
    """The class name (for the parent's meta.json entry) and the meta.json of a tensorclass
    directory, as tensordict writes them (``{"_type": "<class 'module.Name'>"}``)."""
    return tensorclass.__name__, json.dumps({"_type": str(tensorclass)})


class _ArchiveEntry:
    """Where a non-tensor value of a tree mapped shared onto a ``.tdz`` archive is saved, for
    ``_bind_saved``: a write in place asks its path before changing anything (the file first)
    and gets ``UnsupportedFormatError`` naming the key and the archive, instead of a value
    kept in this process's memory only while the tensor writes beside it reach the file (an
    archive's entry list cannot be rewritten in place).

    ``path`` is the archive, or a node inside it (``x.tdz/sub``), ``key`` the entry's key."""

    __slots__ = ("key", "path")

    def __init__(self, path: Path, key: str) -> None:
        self.path = path
        self.key = key

    def _refuse(self) -> NoReturn:
        archive, inner = self.path, [self.key]
        while not archive.is_file() and archive.parent != archive:
            inner.insert(0, archive.name)
            archive = archive.parent
        name = ".".join(part for part in inner if part != TENSORCLASS_DIR)
        raise _native.UnsupportedFormatError(
            f"cannot write the non-tensor entry {name!r} in place: the tree is saved in the "
            f"archive {os.fspath(archive)}, whose non-tensor values cannot be rewritten in "
            "place (only its tensors can); nothing was changed. Save the tree again, or "
            "unpack it into a directory (unpack_memmap), whose entries are rewritten in place"
        )

    def __fspath__(self) -> str:
        self._refuse()

    def __str__(self) -> str:
        self._refuse()

    def __repr__(self) -> str:
        return f"_ArchiveEntry({os.fspath(self.path)!r}, {self.key!r})"


def _shared_archive(buffers: list[Any]) -> bool:
    """Whether ``buffers`` (those of one save or load) are views of an archive mapped shared
    (``memmap_``, ``memmap_like`` or ``load_memmap(mode="r+")`` of a ``.tdz``): its tensor
    writes reach the file. The buffers of one archive share its mode; a tree without tensor
    leaves has none, and its non-tensor values stay in memory."""
    for buffer in buffers:
        if buffer is not None:
            archive = buffer.archive
            return archive is not None and bool(archive[3])
    return False


def bind_archive(td: TreeNode, path: Path, copy_stacks: bool = False) -> None:
    """Makes every non-tensor value of ``td``, mapped shared onto the archive ``path``, refuse
    writes in place (``_ArchiveEntry``). ``copy_stacks``: ``td`` shares its stacks with
    another tree (``memmap_like`` of a structure): each becomes a copy first, so that the
    source's stacks stay writable."""
    if type(td)._tensorclass is not None:
        path = path / TENSORCLASS_DIR
    items = td._tensordict
    for key, value in items.items():
        if isinstance(value, TreeNode):
            bind_archive(value, path / _native.encode_key(key), copy_stacks)
        elif type(value) is NonTensorStack:
            if copy_stacks:
                copy = value._gathered(value._pos)
                copy.stack_dim = value.stack_dim
                items[key] = value = copy
            value._bind_saved(_ArchiveEntry(path, key), key)
        elif type(value) in NTD_TYPES:
            value._bind_saved(_ArchiveEntry(path, key), key, locked=False)  # type: ignore[arg-type]


def _mark(td: TreeNode, prefix: Path | None) -> None:
    if prefix is not None and type(td)._tensorclass is not None:
        prefix = prefix / TENSORCLASS_DIR
    td._device = _CPU
    td._is_memmap = True
    td._memmap_prefix = prefix
    for key, value in td._tensordict.items():
        if isinstance(value, TreeNode):
            _mark(value, None if prefix is None else prefix / _native.encode_key(key))
        elif (type(value) is NonTensorStack or type(value) in NTD_TYPES) and (prefix is not None):
            value._bind_saved(prefix, key)


@_gc_paused()
def save(
    target: TreeNode,
    prefix: str | os.PathLike[str] | None,
    *,
    like: bool,
    reuse_maps: bool,
    copy_existing: bool = True,
    existsok: bool,
    durable: bool,
    num_threads: int,
    sparse: bool = False,
) -> None:
    """Memory-maps every leaf of ``target`` in place (anonymous, or under ``prefix``).

    ``target``'s leaves are the sources; on success they are replaced by the maps, the tree is
    marked memory-mapped and put on the CPU. On failure nothing in ``target`` has changed.
    """
    plan = _Plan(like=like, reuse_maps=reuse_maps, copy_existing=copy_existing)
    if prefix is None:
        path = None
        plan.anonymous(target)
        wanted = [(i, src) for i, src in enumerate(plan.sources) if src[1]]
        mapped = _native.anonymous_buffers([src for _, src in wanted], num_threads=num_threads)
        buffers: list[Any] = [None] * len(plan.sources)
        for (i, _), buffer in zip(wanted, mapped, strict=True):
            buffers[i] = buffer
    else:
        path = Path(prefix).absolute()
        spec = plan.node(target, path)
        buffers = _native.write_tree(
            os.fspath(path),
            spec,
            existsok=existsok,
            durable=durable,
            num_threads=num_threads,
            sparse=sparse,
        )
    del plan.keep
    plan.place(buffers)
    _mark(target, path)
    if path is not None:
        growth.attach(target, path)


@_gc_paused()
def load(
    cls: type[TD],
    prefix: str | os.PathLike[str],
    device: torch.device | None,
    non_blocking: bool = False,
) -> TD:
    """Loads the tree at ``prefix`` with one native call; see ``TensorDict.load_memmap``."""
    path = Path(prefix).absolute()
    node, buffers = _native.load_tree(os.fspath(path))
    if device is None:
        # tensordict always records "cpu"; another device is honoured as tensordict does, by
        # moving the leaves there, once it is known to exist here.
        device = _device_or_none(node[1])
        if device is not None and device.type == "meta":
            raise _native.InvalidDirectoryError(
                f"{path / 'meta.json'} records the device 'meta', which holds no data: loading "
                "it would give tensors without values; pass device='cpu' to load the files"
            )
        if device is not None and device.type not in ("cpu", "meta"):
            try:
                torch.empty(0, device=device)
            except (RuntimeError, AssertionError) as err:
                raise _native.TensorDictError(
                    f"{path / 'meta.json'} was saved for device {device}, which is not available "
                    f"here ({err}); pass device='cpu' to load_memmap to load it on the CPU"
                ) from None
    if device is not None and device.type == "cuda":
        # one device allocation for the whole tree, streamed through pinned staging buffers
        moved = stream_tree(_build(cls, node, buffers, path, None, False), device)
        if moved is not None:
            return moved
    td = _build(cls, node, buffers, path, device, non_blocking)
    if device is None or device.type == "cpu":
        growth.attach(td, path)  # its writes are stamped in the directory's dirty map
    return td


def _build(
    cls: type[TD],
    node: Any,
    buffers: list[Any],
    path: Path,
    device: torch.device | None,
    non_blocking: bool,
    bind: bool = True,
    archive_shared: bool | None = None,
) -> TD:
    """The tree of a loaded ``node`` (its leaves views of ``buffers``) saved at ``path``;
    ``bind``: its non-tensor values written in place rewrite their meta.json there (False
    for an archive: there they stay in memory, as in tensordict, when it is mapped
    copy-on-write, and refuse writes in place when it is mapped shared, whose tensor writes
    reach the file: ``bind_archive``; ``archive_shared`` says which, else the buffers do)."""
    if archive_shared is None:
        archive_shared = _shared_archive(buffers)
    batch, _, entries, class_text = node
    plain = _plain(cls)
    if class_text is not None:
        cls = _tensorclass_node(cls, class_text, path)
        path = path / TENSORCLASS_DIR
    else:
        cls = plain
    td = cls._new_unchecked(torch.Size(batch), device)
    td._memmap_prefix = path
    items = td._tensordict
    move = device is not None and device.type != "cpu"
    for entry in entries:
        tag, key = entry[0], entry[1]
        if tag == LEAF and len(entry) > 5:
            items[key] = _nested_leaf(entry, buffers, device, non_blocking)
        elif tag == LEAF:
            dtype = STR_TO_DTYPE[entry[2]]
            shape = entry[3]
            buffer = buffers[entry[4]]
            if move:
                value: Any = (
                    torch.empty(shape, dtype=dtype, device=device)
                    if buffer is None or device.type == "meta"  # type: ignore[union-attr]
                    else _from_buffer(buffer, dtype, shape).to(device, non_blocking=non_blocking)
                )
            else:
                value = (
                    torch.empty(shape, dtype=dtype)
                    if buffer is None
                    else _LazyLeaf(buffer, dtype, shape)
                )
            items[key] = value
        elif tag == NODE:
            sub_path = path / _native.encode_key(key)
            items[key] = _build(
                plain, entry[2], buffers, sub_path, device, non_blocking, bind, archive_shared
            )
        elif tag == STACK:
            items[key] = stack = loaded_stack(entry)
            if bind:
                stack._bind_saved(path, key)
            elif archive_shared:
                stack._bind_saved(_ArchiveEntry(path, key), key)
        else:
            items[key] = entry_value = NonTensorData(json.loads(entry[2]))
            if bind:
                entry_value._bind_saved(path, key, locked=False)
            elif archive_shared:
                entry_value._bind_saved(_ArchiveEntry(path, key), key, locked=False)  # type: ignore[arg-type]
    return td


def loaded_stack(entry: tuple[Any, ...]) -> NonTensorStack:
    """A NonTensorStack from a loaded ``(STACK, key, shape, device, stack_dim, cells)`` entry:
    its strings as a packed column, or its JSON values as a list."""
    _, _, shape, device, stack_dim, cells = entry
    return NonTensorStack._from_loaded(cells, shape, device, stack_dim)


def _nested_leaf(
    entry: tuple[Any, ...], buffers: list[Any], device: torch.device | None, non_blocking: bool
) -> torch.Tensor:
    """A nested leaf from a loaded ``(LEAF, key, dtype, shape, index, (table, dims, jagged))``
    entry: a view of its mapped components."""
    dtype = STR_TO_DTYPE[entry[2]]
    table_bytes, dims, jagged = entry[5]
    table = (
        torch.frombuffer(bytearray(table_bytes), dtype=torch.int64).reshape(-1, dims)
        if table_bytes
        else torch.zeros((entry[3][0], dims), dtype=torch.int64)
    )
    buffer = buffers[entry[4]]
    numel = int(table.prod(1).sum()) if dims else table.shape[0]
    values = (
        torch.empty(0, dtype=dtype) if buffer is None else _from_buffer(buffer, dtype, (numel,))
    )
    value = _nested.from_flat(values, table, jagged)
    if device is not None and device.type != "cpu":
        value = value.to(device, non_blocking=non_blocking)
    return value


def _plain(cls: type[TD]) -> type[TD]:
    """The tree class itself for a tensorclass's subclass of it (``Cls._TensorDict``)."""
    for klass in cls.__mro__:
        if klass.__dict__.get("_tensorclass") is None:
            return klass
    return cls


def _tensorclass_node(cls: type[TD], class_text: str, path: Path) -> type[TD]:
    """The tree subclass of the tensorclass a tensorclass directory names.

    The class is looked up among the tensorclasses defined in this process (``_class``, then
    ``_type``), never imported. As tensordict does, ``X.load_memmap`` on a tensorclass ``X``
    with the saved ``__qualname__`` loads as ``X`` when the saved module is another one (a
    class saved from ``__main__`` loads in a module that defines it again).
    """
    meta = json.loads(class_text)
    type_name = meta.get("_type")
    found: Any = _classes.lookup(type_name, meta.get("_class"))
    saved = str(type_name or meta.get("_class")).removeprefix("<class '").removesuffix("'>")
    caller = cls._tensorclass
    if found is None and caller is not None:
        module = saved.removesuffix("." + caller.__qualname__)
        if module != saved and not module.startswith("__main__.") and "<locals>" not in module:
            found = caller
    if found is None:
        raise RuntimeError(
            f"Could not find the class {saved} saved in {path}. Import the module that defines "
            f"it, or call {saved.rpartition('.')[2]}.load_memmap() instead of "
            f"{cls.__qualname__.removesuffix('._TensorDict')}.load_memmap()."
        )
    node: type[TD] = found._TensorDict
    return node


def _device_or_none(name: str | None) -> torch.device | None:
    return None if name is None else torch.device(name)
