"""One file per tree: tensordict's ``.tdz`` archives.

An archive is a zip file whose entries are the files of the directory form (``meta.json`` per
level, one ``<key>.memmap`` per leaf), leaf payloads STORED and aligned to 64 bytes, so the
whole archive is mapped once and every leaf is a view of that map. The Rust core writes and
reads them in one call per tree (``rust/archive/``); this module decides from the suffix,
builds the trees, and holds the module-level conversions tensordict exports.
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from pathlib import Path
from typing import Any, cast

import torch

from .. import _native
from .._core.nodes import TD, TreeNode, _gc_paused
from . import directory
from .directory import _CPU

PathLike = str | os.PathLike[str]

ARCHIVE_SUFFIX = ".tdz"
# zip methods: names as tensordict spells them, and zipfile's constants
_METHODS: dict[Any, int] = {None: 0, "stored": 0, "deflate": 8, "deflated": 8, 0: 0, 8: 8}
_NOT_WRITTEN = {"bzip2": 12, "lzma": 14, 12: 12, 14: 14}
_DEFAULT_LEVEL = 6


def wanted(prefix: PathLike | None, archive: bool | None, compression: Any = None) -> bool:
    """Whether a save goes to an archive: ``archive``, or else a prefix ending in ``.tdz``."""
    if archive is None:
        archive = prefix is not None and Path(prefix).suffix == ARCHIVE_SUFFIX
    if archive and prefix is None:
        raise ValueError("A path is required to write a memmap archive.")
    if not archive and compression is not None:
        raise ValueError(
            "compression is only supported when writing a memmap archive "
            "(pass archive=True or use a '.tdz' prefix)."
        )
    return bool(archive)


def _method(compression: Any, compresslevel: int | None) -> tuple[int, int]:
    key = compression.lower() if isinstance(compression, str) else compression
    if key in _NOT_WRITTEN:
        raise ValueError(
            f"compression {compression!r} is not supported by tensordict-rs; use 'deflate' "
            "(or None to store the leaves uncompressed, memory-mappable)"
        )
    if key not in _METHODS:
        raise ValueError(
            f"Unknown compression {compression!r}. Expected one of "
            "['deflate', 'deflated', 'stored'] or a zipfile compression constant."
        )
    level = _DEFAULT_LEVEL if compresslevel is None or compresslevel < 0 else compresslevel
    if not 0 <= level <= 9:
        raise ValueError(f"compresslevel must be between 0 and 9, got {compresslevel}")
    return _METHODS[key], level


def _dos_time() -> tuple[int, int]:
    """The (time, date) of the entries in MS-DOS form, local time, as ``zipfile`` writes."""
    t = time.localtime()
    year = max(t.tm_year, 1980)
    return (
        (t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec // 2),
        ((year - 1980) << 9) | (t.tm_mon << 5) | t.tm_mday,
    )


def _mark(td: TD, path: Path, *, memmapped: bool) -> None:
    """Records the archive on the root; nested TensorDicts have no directory of their own."""
    td._device = _CPU
    td._is_memmap = memmapped
    td._memmap_prefix = path
    stack: list[TreeNode] = [td]
    while stack:
        node = stack.pop()
        for value in node._tensordict.values():
            if isinstance(value, TreeNode):
                value._device = _CPU
                value._is_memmap = memmapped
                value._memmap_prefix = None
                stack.append(value)


@_gc_paused()
def write(
    target: TD,
    path: Path,
    *,
    like: bool,
    inplace: bool,
    compression: Any = None,
    compresslevel: int | None = None,
    existsok: bool = True,
    durable: bool = False,
    num_threads: int = 0,
) -> None:
    """Writes ``target`` as one archive at ``path``; its leaves become views of the new file.

    ``inplace`` (``memmap_``): ``target`` is the caller's TensorDict, which ends memory-mapped
    and locked, its leaves mapped shared (writes reach the archive). Otherwise ``target`` is a
    new structure that ends as tensordict's ``load_memmap`` would return it: unlocked, mapped
    copy-on-write, or shared for ``like`` (``memmap_like``, as tensordict's ``mode="r+"``).
    """
    method, level = _method(compression, compresslevel)
    plan = directory._Plan(like=like, reuse_maps=False, copy_existing=True)
    spec = plan.node(target, path)
    buffers = _native.write_archive(
        os.fspath(path),
        spec,
        existsok=existsok,
        durable=durable,
        num_threads=num_threads,
        shared=inplace or like,
        compression=method,
        level=level,
        dos_time=_dos_time(),
    )
    del plan.keep
    plan.place(buffers, archive_shared=inplace or like)
    _mark(target, path, memmapped=inplace)
    if inplace:
        target._lock_tree()


@_gc_paused()
def load(
    cls: type[TD],
    path: PathLike,
    device: torch.device | None,
    non_blocking: bool = False,
    mode: str | None = None,
) -> TD:
    """Loads the archive at ``path``: one map, every stored aligned leaf a view of it.

    ``mode=None``/``"r"`` maps it copy-on-write (writes stay in this process, as in
    tensordict); ``"r+"`` maps it shared, so in-place writes reach the file, which needs every
    leaf stored and aligned (no copy).
    """
    if mode not in (None, "r", "r+"):
        raise ValueError(f"mode must be 'r', 'r+' or None, got {mode!r}.")
    absolute = Path(path).absolute()
    node, buffers, copied = _native.load_archive(os.fspath(absolute), shared=mode == "r+")
    if mode == "r+" and copied:
        raise RuntimeError(
            f"Cannot open {absolute} with mode='r+': entry {copied[0]!r} "
            f"{_why_copied(absolute, copied[0])}, so it must be copied and in-place writes "
            "could not reach the file. Re-save the archive without compression to make it "
            "writable."
        )
    if device is None:
        device = directory._device_or_none(node[1])
        if device is not None and device.type not in ("cpu", "meta"):
            try:
                torch.empty(0, device=device)
            except (RuntimeError, AssertionError) as err:
                raise _native.TensorDictError(
                    f"{absolute}::meta.json was saved for device {device}, which is not "
                    f"available here ({err}); pass device='cpu' to load_memmap to load it on "
                    "the CPU"
                ) from None
    td = directory._build(
        cls, node, buffers, absolute, device, non_blocking, bind=False, archive_shared=mode == "r+"
    )
    _mark(td, absolute, memmapped=False)
    if device is not None:
        td._device = device
    return td


def _subpath_parts(subpath: Any) -> tuple[str, ...]:
    if isinstance(subpath, str):
        return tuple(part for part in subpath.split("/") if part)
    parts: list[str] = []
    stack = [subpath]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            parts.append(item)
        elif isinstance(item, tuple):
            stack.extend(reversed(item))
        else:
            raise ValueError("subpath must be a string path or a (nested) tuple of strings.")
    if not parts:
        raise ValueError("subpath must be a string path or a (nested) tuple of strings.")
    return tuple(parts)


def subtree(td: TD, subpath: Any, prefix: PathLike) -> TD:
    """The nested TensorDict of a loaded tree at ``subpath`` (``load_memmap(subpath=)``):
    ``"a/b"``, ``("a", "b")`` or nested tuples of keys, as tensordict spells them; a
    ``ValueError`` when no TensorDict is there."""
    parts = _subpath_parts(subpath)
    node: Any = td
    for part in parts:
        value = node._tensordict.get(part)
        if not isinstance(value, TreeNode):
            raise ValueError(
                f"No tensordict found under subpath {'/'.join(parts)!r} (in {prefix})."
            )
        node = value
    return cast("TD", node)


def _why_copied(path: Path, name: str) -> str:
    """Why an entry the loader copied cannot be a view: its method, else its alignment (the
    archive was validated by the load that reported it; zipfile only reads its directory)."""
    with zipfile.ZipFile(path) as zf:
        compressed = zf.getinfo(name).compress_type != zipfile.ZIP_STORED
    return "is compressed" if compressed else "is not aligned for its dtype"


def _spec(node: Any, buffers: list[Any]) -> tuple[Any, ...]:
    """A save spec (see ``_native.write_tree``) of a loaded tree, reading from its buffers."""
    batch, _, entries, class_text = node
    out: list[tuple[Any, ...]] = []
    for entry in entries:
        tag, key = entry[0], entry[1]
        if tag == directory.LEAF:
            buffer = buffers[entry[4]]
            address, nbytes = (0, 0) if buffer is None else (buffer.address, buffer.nbytes)
            if len(entry) > 5:  # a nested leaf: its flat values, and its table of shapes
                table, dims, jagged = entry[5]
                shape = (len(table) // (8 * dims) if dims else 0, dims)
                nested = (bytes(table), jagged)
                out.append((tag, key, entry[2], shape, "cpu", address, nbytes, None, nested))
            else:
                out.append((tag, key, entry[2], entry[3], "cpu", address, nbytes, None))
        elif tag == directory.NODE:
            out.append((tag, key, _spec(entry[2], buffers)))
        elif tag == directory.STACK:
            stack = directory.loaded_stack(entry)
            data, dims = stack.json_data(key)
            device = None if stack.device is None else str(stack.device)
            out.append((tag, key, stack.stack_dim, device, data, dims))
        else:  # a non-tensor value: its JSON text, as saved
            out.append(entry)
    if class_text is not None:  # a tensorclass directory: its class name and meta.json
        saved = str(json.loads(class_text).get("_type", "")).removesuffix("'>")
        return list(batch), out, saved.rpartition(".")[2], class_text
    return list(batch), out


def is_memmap_archive(path: PathLike) -> bool:
    """Whether ``path`` is a memory-mapped tensordict archive.

    An archive is a valid zip file with a top-level ``meta.json`` entry, as written by
    :func:`pack_memmap` or by ``save``/``memmap`` with a ``".tdz"`` path (here or by
    tensordict). A directory, a missing path or another file gives ``False``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> _ = TensorDict({"a": torch.zeros(3)}, [3]).memmap("one.tdz")
    >>> is_memmap_archive("one.tdz"), is_memmap_archive("nowhere")
    (True, False)
    """
    return _native.is_archive(os.fspath(path))


def pack_memmap(
    prefix: PathLike,
    archive_path: PathLike,
    *,
    compression: str | int | None = None,
    compresslevel: int | None = None,
) -> Path:
    """Packs a saved directory into a single-file archive; returns the archive's path.

    The directory is loaded (and so validated) first: a damaged directory raises instead of
    being packed. The entries are the files of the tree, STORED and aligned by default, so
    :func:`unpack_memmap` (or ``unzip``) gives the directory back and ``load_memmap`` maps the
    archive without a copy. ``compression="deflate"`` makes a smaller archive whose leaves are
    decompressed when loaded. The archive is written beside ``archive_path`` and renamed over
    it. Raises ``ValueError`` when ``prefix`` has no ``meta.json`` or the archive would be
    inside ``prefix``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> _ = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3]).memmap("tree")
    >>> pack_memmap("tree", "tree.tdz").name
    'tree.tdz'
    >>> TensorDict.load_memmap("tree.tdz")["a"]
    MemoryMappedTensor([0., 1., 2.])
    """
    prefix = Path(prefix)
    archive_path = Path(archive_path)
    if not (prefix / "meta.json").is_file():
        raise ValueError(
            f"{prefix} does not look like a memory-mapped tensordict directory "
            "(no meta.json found)."
        )
    if archive_path.resolve().is_relative_to(prefix.resolve()):
        raise ValueError(
            f"The archive path {archive_path} must be outside the source directory {prefix}."
        )
    method, level = _method(compression, compresslevel)
    with _gc_paused():
        node, buffers = _native.load_tree(os.fspath(prefix.absolute()))
        spec = _spec(node, buffers)
        _native.write_archive(
            os.fspath(archive_path.absolute()),
            spec,
            compression=method,
            level=level,
            dos_time=_dos_time(),
        )
        del buffers
    return archive_path


def unpack_memmap(archive_path: PathLike, prefix: PathLike) -> Path:
    """Extracts an archive into a directory that ``load_memmap`` reads; returns its path.

    The same tree as ``unzip`` gives, written atomically like ``memmap_``: an existing tree at
    ``prefix`` is replaced as a whole (files you put there are kept). Raises ``ValueError``
    when ``archive_path`` is not an archive (see :func:`is_memmap_archive`), and
    ``InvalidDirectoryError`` when it is damaged.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> _ = TensorDict({"a": torch.arange(3.0)}, [3]).memmap("packed.tdz")
    >>> sorted(p.name for p in unpack_memmap("packed.tdz", "unpacked").iterdir())
    ['a.memmap', 'meta.json']
    """
    archive_path = Path(archive_path)
    prefix = Path(prefix)
    if not is_memmap_archive(archive_path):
        raise ValueError(f"{archive_path} is not a memory-mapped tensordict archive.")
    with _gc_paused():
        node, buffers, _ = _native.load_archive(os.fspath(archive_path.absolute()))
        spec = _spec(node, buffers)
        _native.write_tree(os.fspath(prefix.absolute()), spec, existsok=True)
        del buffers
    return prefix


def refresh_archive_checksums(archive_path: PathLike) -> Path:
    """Recomputes the CRC-32 checksums of an archive after in-place writes; returns its path.

    Leaves loaded with ``load_memmap(path, mode="r+")``, or made by ``memmap_``/``memmap_like``
    with a ``".tdz"`` path, write into the archive without updating the CRC-32 that the zip
    format stores per entry. ``load_memmap`` does not check the CRCs of stored leaves (as in
    tensordict; ``tensordict_rs.verify`` does), but ``unzip``, :mod:`zipfile` and
    :func:`unpack_memmap` refuse a stale one: call this first. The archive is patched in
    place (only CRC fields change). Raises ``ValueError`` when it is not an archive.

    >>> import torch, tensordict_rs
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(3)}, [3]).memmap_like("buf.tdz")  # writes reach the file
    >>> td["a"][0] = 1.0
    >>> any("CRC" in p for p in tensordict_rs.verify("buf.tdz"))  # the stored CRC is stale
    True
    >>> _ = refresh_archive_checksums("buf.tdz")
    >>> tensordict_rs.verify("buf.tdz")
    []
    """
    archive_path = Path(archive_path)
    if not is_memmap_archive(archive_path):
        raise ValueError(f"{archive_path} is not a memory-mapped tensordict archive.")
    _native.refresh_archive_checksums(os.fspath(archive_path))
    return archive_path
