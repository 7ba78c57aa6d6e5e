"""Incremental checkpoints of a memory-mapped tree (issue 24): ``td.checkpoint(dest)``.

``dest`` is an ordinary directory in tensordict's format (``load_memmap`` here or in tensordict
loads it) whose files are byte for byte those a full copy (``td.memmap(dest,
copy_existing=True)``) writes, plus one hidden record, ``.tdrs%checkpoint``, that tensordict
ignores.

Two generations make each checkpoint atomic without a journal: beside ``dest`` lives its
previous generation, the hidden sibling ``.<name>.tdrs%spare``. A checkpoint brings the spare
up to date (copying only what changed since the spare was last brought up to date: the rows its
record says, the small files that differ), then exchanges the two directories in one
``renameat2(RENAME_EXCHANGE)``. Whatever instant a process dies at, ``dest`` is a whole
directory, the previous checkpoint or the new one, for tensordict's loader as for ours; an
interrupted update of the spare is finished by the next checkpoint (its record only moves
forward once the spare is whole). The price: twice the disk space, and each checkpoint copies
the rows written during the last two intervals (the spare is one checkpoint behind).

Which rows changed comes from the tree's dirty map (``io/dirty.py``), stamped by every write
through this library's methods from any process that loaded the tree. ``verify=True`` also
hashes every ``chunk_bytes`` chunk of every leaf and copies the chunks whose hash differs from
the spare's, so writes that bypass the library (through a leaf tensor) are caught too; it reads
the whole tree, and writes only what changed.

Files the user puts into ``dest`` are not the tree's: before each exchange the spare gets a
hard link to each of them (``_carry``), so they stay in ``dest``, and the spare's update
never deletes them. A tree loaded with ``load_memmap`` is checkpointed when every dense leaf
is still the map of its file (``_unmapped_leaf``); its non-tensor entries set, added or deleted
in memory since the load (``_non_tensor_changed``) are checkpointed as it holds them: its
meta.json files and non-tensor entries are then written as a full save writes them
(``_write_layout``, a sparse ``memmap_like`` beside ``dest``) and copied from there.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .. import _native
from .._core.dtypes import STR_TO_DTYPE
from .._core.nodes import NTD_TYPES, TreeNode
from .._core.nontensor import NonTensorStack
from ..memmap import _LazyLeaf
from . import directory
from .dirty import DirtyMap
from .growth import _mapped_here

RECORD = ".tdrs%checkpoint"
JOURNAL = ".tdrs%journal"  # an interrupted save's commit (tree/commit.rs)
RECORD_VERSION = 1
CHUNK_BYTES = 1 << 16  # the verifying option's chunks

try:
    import fcntl
except ImportError:  # Windows: checkpoints are not available (no directory exchange)
    fcntl = None  # type: ignore[assignment]


def spare_name(dest: Path) -> str:
    """The name of the hidden sibling holding ``dest``'s other generation."""
    return f".{dest.name}.tdrs%spare"


# This library's bookkeeping and temporaries in a tree or checkpoint directory, by exact name
# (a key never makes one: its file names escape "%" as "%25"; a user's ".notes.tmp" or
# ".cache.tmp" key is neither skipped nor deleted).
_BOOKKEEPING = re.compile(
    r"\.tdrs%(checkpoint|journal|dirty|lock)"
    r"|\.tdrs%(staging|tmp|new)-.*"
    r"|\.(meta\.json|\.tdrs%checkpoint)\.[0-9]+(\.[0-9a-f]{16})?\.tmp",
    re.DOTALL,
)


def _skip(name: str) -> bool:
    """Names of a tree directory that are not the tree's: this library's bookkeeping and
    temporaries (``_BOOKKEEPING``)."""
    return _BOOKKEEPING.fullmatch(name) is not None


@contextlib.contextmanager
def _lock(parent: Path, dest: Path) -> Iterator[None]:
    """One checkpoint of ``dest`` at a time (a lock file beside it)."""
    assert fcntl is not None
    fd = os.open(parent / f".{dest.name}.tdrs%lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _tree_lock(prefix: Path) -> Iterator[None]:
    """The lock that growths and saves of the tree's directory take (``flock`` of the
    directory): held while a checkpoint reads the tree, so that a growth from another process
    waits instead of committing rows the checkpoint's copy of ``meta.json`` would then claim
    and its copies of the data files lack (a checkpoint that tensordict loaded as wrong data;
    found by an attack). Where the file system has no ``flock``, nothing is held.

    A save killed inside its commit leaves a journal and the directory half moved (its
    ``meta.json`` may be away): a load finishes that commit first, and so does a checkpoint,
    before it reads anything (it raised ``FileNotFoundError``, or copied the tree from before
    a commit that had passed its commit point)."""
    assert fcntl is not None
    for _attempt in range(5):
        fd = os.open(prefix, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:
                if e.errno not in (
                    errno.ENOLCK,
                    errno.EOPNOTSUPP,
                    errno.EINVAL,
                    errno.EBADF,
                    errno.ENOSYS,
                ):
                    raise
            if not os.path.lexists(prefix / JOURNAL):
                yield
                return
        finally:
            os.close(fd)
        # let go of the lock, which the load's recovery takes, and finish the commit
        _native.load_tree(os.fspath(prefix))
    raise _native.TensorDictError(
        f"{prefix / JOURNAL}: an interrupted save's commit is still pending after 5 attempts "
        "to finish it (other saves keep dying there?); nothing was checkpointed"
    )


def _read_record(gen: Path) -> dict[str, Any] | None:
    try:
        with open(gen / RECORD, "rb") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return None
    return record


def _write_record(gen: Path, record: dict[str, Any]) -> None:
    tmp = gen / f".{RECORD}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, gen / RECORD)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # our own temporary: a full disk must not keep it
        raise type(err)(err.errno, err.strerror, os.fspath(gen / RECORD)) from err


class _Source:
    """The files of the saved tree at ``prefix``: row files (dense leaves whose first dim is
    the root's first batch dim) and the others (meta.json files, nested tables, ...).

    ``layout``: a directory holding the tree's meta.json files and non-tensor entries as the
    tree now holds them in memory (``_write_layout``); the tree's files are then those of
    ``layout``, its tensor files (``.memmap``) read from ``prefix``."""

    def __init__(self, prefix: Path, layout: Path | None = None) -> None:
        self.prefix = prefix
        self.layout = layout
        walked = prefix if layout is None else layout
        with open(walked / "meta.json", "rb") as f:
            root = json.load(f)
        if "shape" not in root and (walked / _native.TENSORCLASS_DIR / "meta.json").is_file():
            # a tensorclass directory: its rows are those of the TensorDict it holds
            with open(walked / _native.TENSORCLASS_DIR / "meta.json", "rb") as f:
                root = json.load(f)
        shape = root.get("shape") or []
        self.rows = int(shape[0]) if shape else None
        self.row_files: dict[str, int] = {}  # relative path -> bytes per row
        self.files: list[str] = []  # every file, relative
        self.dirs: list[str] = []  # every directory, relative ("" is the root)
        self._walk(walked, "")

    def path(self, rel: str) -> Path:
        """Where the file ``rel`` of the tree is read from."""
        if self.layout is None or rel.endswith(".memmap"):
            return self.prefix / rel
        return self.layout / rel

    def _walk(self, path: Path, rel: str) -> None:
        self.dirs.append(rel)
        meta: dict[str, Any] = {}
        try:
            with open(path / "meta.json", "rb") as f:
                loaded = json.load(f)
            meta = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            pass
        for key, entry in meta.items():
            if not isinstance(entry, dict) or self.rows is None or entry.get("is_nested"):
                continue
            dtype, shape = entry.get("dtype"), entry.get("shape")
            if dtype in STR_TO_DTYPE and isinstance(shape, list) and shape:
                if shape[0] == self.rows:
                    numel = torch.Size(shape[1:]).numel()
                    name = _native.encode_key(key) + ".memmap"
                    self.row_files[rel + name] = numel * STR_TO_DTYPE[dtype].itemsize
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            if _skip(entry.name):
                continue
            if entry.is_dir(follow_symlinks=False):
                self._walk(Path(entry.path), rel + entry.name + "/")
            elif entry.is_file(follow_symlinks=False):
                self.files.append(rel + entry.name)


def _state(path: Path) -> list[int] | None:
    """What tells a file written since: its inode, size and change times (None: no file)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _ranges(runs: list[tuple[int, int]], row_bytes: int) -> list[tuple[int, int]]:
    return [(a * row_bytes, (b - a) * row_bytes) for a, b in runs]


def _hashes(path: Path, nbytes: int, chunk: int) -> torch.Tensor:
    raw = _native.chunk_hashes(os.fspath(path), nbytes, chunk)
    return (
        torch.frombuffer(bytearray(raw), dtype=torch.int64)
        if raw
        else torch.zeros(0, dtype=torch.int64)
    )


def _sync(
    source: _Source,
    gen: Path,
    tracker: DirtyMap,
    epoch: int,
    verify: bool,
    chunk: int,
    durable: bool,
    keep: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """Brings the generation directory ``gen`` up to date with ``source``; returns counts.
    Files of ``gen`` that the source does not have go, except those named in ``keep`` (the
    user's files of the other generation, carried over by ``_carry``)."""
    record = _read_record(gen)
    if record is not None and record.get("token") != tracker.token:
        record = None  # another tree's checkpoint, or a dirty map made again: copy all
    since = None if record is None else int(record["since"])
    old_ids: dict[str, list[int]] = {} if record is None else dict(record.get("ids", {}))
    old_hashes: dict[str, str] = {}
    if record is not None and record.get("chunk") == chunk:
        old_hashes = dict(record.get("hashes") or {})
    # each file of ``gen`` as this library left it: one written since by anyone else (the
    # user writing a loaded checkpoint, tensordict saving into it) is copied whole, its
    # recorded hashes not trusted
    old_states: dict[str, list[int]] = {} if record is None else dict(record.get("states", {}))
    if record is not None and record.get("hashes"):
        # from here until the new record, the spare's content is no longer what they say
        record["hashes"] = {}
        _write_record(gen, record)
    stats = {"bytes_written": 0, "files_written": 0, "bytes_hashed": 0}
    for rel in source.dirs:  # parents first
        if rel:
            where = gen / rel
            if os.path.islink(where):
                # a link put where the tree has a directory: writing the tree's files through
                # it wrote them into the folder it points to; the link goes (never its target)
                os.unlink(where)
            os.makedirs(where, exist_ok=True)
    wanted = set(source.files)
    ids: dict[str, list[int]] = {}
    hashes: dict[str, str] = {}
    rows = source.rows or 0
    for rel in source.files:
        src, dst = source.path(rel), gen / rel
        if os.path.islink(dst):
            # a link put where the tree has a file (``meta.json`` replaced by one): the tree's
            # name is the tree's, as in a full copy; the link goes, never what it points to
            # (it was opened without following, and every checkpoint failed on it)
            os.unlink(dst)
        st = os.stat(src)
        ids[rel] = [st.st_dev, st.st_ino]
        row_bytes = source.row_files.get(rel)
        if row_bytes is None:  # a small file: copied whole when it differs
            nbytes = st.st_size
            same = False
            with contextlib.suppress(OSError):
                if os.path.getsize(dst) == nbytes:
                    same = src.read_bytes() == dst.read_bytes()
            if not same:
                stats["bytes_written"] += _native.sync_file(
                    os.fspath(src), os.fspath(dst), None, nbytes, durable=durable
                )
                stats["files_written"] += 1
            continue
        nbytes = rows * row_bytes
        ranges: list[tuple[int, int]] | None
        if (
            since is None
            or old_ids.get(rel) != ids[rel]
            or not os.path.lexists(dst)
            or _state(dst) != old_states.get(rel)
        ):
            # a new leaf, a file saved again, no usable record, or a copy written since by
            # another: all of it
            ranges = None
        else:
            ranges = _ranges(tracker.dirty_rows(since, rows), row_bytes) if row_bytes else []
            had = os.path.getsize(dst)
            if had < nbytes:  # rows the spare never had
                ranges.append((had, nbytes - had))
        if verify and nbytes:
            new = _hashes(src, nbytes, chunk)
            stats["bytes_hashed"] += nbytes
            hashes[rel] = new.numpy().tobytes().hex()
            if ranges is not None:
                old_hex = old_hashes.get(rel)
                if old_hex is not None:
                    old = torch.frombuffer(bytearray.fromhex(old_hex), dtype=torch.int64)
                else:  # no hashes of the spare's content: hash it too
                    have = min(os.path.getsize(dst), nbytes)
                    old = _hashes(dst, have, chunk)
                    stats["bytes_hashed"] += have
                n = min(old.numel(), new.numel())
                differ = (old[:n] != new[:n]).nonzero().flatten().tolist()
                ranges.extend((i * chunk, chunk) for i in differ)
                if new.numel() > n:
                    ranges.append((n * chunk, nbytes - n * chunk))
        written = _native.sync_file(os.fspath(src), os.fspath(dst), ranges, nbytes, durable=durable)
        stats["bytes_written"] += written
        stats["files_written"] += bool(written)
    # what the source no longer has goes (deepest first)
    for root, dirnames, filenames in os.walk(gen, topdown=False):
        rel_root = os.path.relpath(root, gen)
        rel_root = "" if rel_root == "." else rel_root + "/"
        for name in filenames:
            rel = rel_root + name
            if rel not in wanted and rel not in keep and (rel_root or name != RECORD):
                os.unlink(os.path.join(root, name))  # gone from the tree, or a leftover
        for name in dirnames:
            if rel_root + name + "/" not in source.dirs and rel_root + name + "/" not in keep:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(root, name))
    states = {rel: state for rel in source.files if (state := _state(gen / rel)) is not None}
    new_record = {
        "version": RECORD_VERSION,
        "token": tracker.token,
        "since": epoch,
        "source": os.fspath(source.prefix),
        "ids": ids,
        "chunk": chunk,
        "hashes": hashes if verify else {},
        "states": states,
    }
    _write_record(gen, new_record)
    return stats


def _user_files(gen: Path, source: _Source) -> frozenset[str]:
    """The files of the generation ``gen`` (relative paths; symbolic links and other
    non-directories too) that are neither the tree's (now, or when a checkpoint last wrote
    ``gen``: its record names them) nor this library's bookkeeping: what the user put into
    the checkpoint directory. Folders of the user's end with "/"."""
    record = _read_record(gen)
    wanted = set(source.files) | set((record or {}).get("ids", {}))
    # the tree's directories, now or when ``gen`` was written (each holds a meta.json)
    tree_dirs = set(source.dirs) | {rel.rpartition("/")[0] + "/" for rel in wanted if "/" in rel}
    out: set[str] = set()

    def walk(path: Path, rel: str) -> None:
        with os.scandir(path) as it:
            for entry in it:
                if _skip(entry.name):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    name = rel + entry.name + "/"
                    if name not in tree_dirs:
                        out.add(name)  # the user's folder (kept even when empty)
                    walk(Path(entry.path), name)
                elif rel + entry.name not in wanted:
                    out.add(rel + entry.name)

    walk(gen, "")
    return frozenset(out)


def _carry(dest: Path, spare: Path, names: frozenset[str]) -> None:
    """Makes each of the user's files ``names`` of ``dest`` present in ``spare`` too (a hard
    link to the same file, a copy where links are refused), so that after the exchange the
    new ``dest`` still shows them: a checkpoint never moves what the user put into its
    directory out of sight (into the hidden spare), nor deletes it later."""
    for rel in names:
        src, dst = dest / rel, spare / rel
        if rel.endswith("/"):  # a folder of the user's (its files are carried one by one)
            if not dst.is_symlink() and not dst.is_file():
                dst.mkdir(parents=True, exist_ok=True)
            continue
        try:
            have = os.lstat(src)
        except FileNotFoundError:
            continue  # removed by the user meanwhile
        try:
            there = os.lstat(dst)
        except FileNotFoundError:
            pass
        else:
            if (there.st_dev, there.st_ino) == (have.st_dev, have.st_ino):
                continue
            if dst.is_dir() and not dst.is_symlink():
                continue  # a directory of the tree by that name: the tree's wins
            os.unlink(dst)  # an older link or copy of a file the user replaced since
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            shutil.copy2(src, dst, follow_symlinks=False)


def _unmapped_leaf(td: TreeNode, prefix: Path) -> str | None:
    """The first dense tensor leaf of ``td`` that is not the map of its own file under
    ``prefix`` (a value set in memory after a load: the directory does not hold it), or
    None."""
    for key, value in td._tensordict.items():
        if isinstance(value, TreeNode):
            sub = value._memmap_prefix
            found = _unmapped_leaf(
                value,
                Path(sub)
                if sub is not None and os.path.isdir(sub)
                else prefix / _native.encode_key(key),  # set in memory: no file of it there
            )
            if found is not None:
                return f"{key}.{found}"
            continue
        if isinstance(value, torch.Tensor) and (value.is_nested or value.layout != torch.strided):
            continue
        if (isinstance(value, torch.Tensor) or type(value) is _LazyLeaf) and not _mapped_here(
            value, prefix, key
        ):
            return key
    return None


def _non_tensor_changed(td: TreeNode, prefix: Path) -> bool:
    """Whether the non-tensor entries of the loaded ``td`` differ from those its directory
    ``prefix`` holds: a value set in memory since the load (``set_non_tensor``, a stack
    assigned), a new key, a key deleted, a sub-tree set in memory. A value written in place
    into an entry of the directory rewrote its meta.json (it is bound to it), so it does not
    count."""
    try:
        with open(prefix / "meta.json", "rb") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return True
    if not isinstance(meta, dict):
        return True
    items = td._tensordict
    saved = {key for key, entry in meta.items() if isinstance(entry, dict)}
    if saved != set(items):
        return True
    for key, value in items.items():
        if isinstance(value, TreeNode):
            sub = value._memmap_prefix
            name = _native.encode_key(key)
            if type(value)._tensorclass is not None:
                name = f"{name}/{_native.TENSORCLASS_DIR}"
            if sub is None or os.fspath(sub) != os.fspath(prefix / name) or not Path(sub).is_dir():
                return True
            if _non_tensor_changed(value, Path(sub)):
                return True
        elif type(value) is NonTensorStack:
            stack_saved = value._cells.saved
            if (
                stack_saved is None
                or stack_saved[2] != key
                or not isinstance(stack_saved[1], (str, Path))
                or os.fspath(stack_saved[1]) != os.fspath(prefix)
            ):
                return True
        elif type(value) in NTD_TYPES:
            entry_saved = value._saved
            if (
                entry_saved is None
                or entry_saved[1] != key
                or not isinstance(entry_saved[0], (str, Path))
                or os.fspath(entry_saved[0]) != os.fspath(prefix)
            ):
                return True
    return False


def _write_layout(td: TreeNode, layout: Path) -> None:
    """Writes into the empty directory ``layout`` what a full save of ``td`` writes, its
    tensor files left sparse (as ``memmap_like`` writes them; the checkpoint reads those
    from the tree's directory): its meta.json files and non-tensor entries as ``td`` holds
    them now, byte for byte as ``td.memmap(dest)`` writes them."""
    plan = directory._Plan(like=True, reuse_maps=False)
    spec = plan.node(td, layout)
    _native.write_tree(
        os.fspath(layout), spec, existsok=True, durable=False, num_threads=0, sparse=True
    )


def _is_tensorclass_dir(path: Path) -> bool:
    """Whether ``path`` is a tensorclass's directory (its meta.json names the class and holds
    no batch size: the TensorDict is in its ``_tensordict``)."""
    try:
        with open(path / "meta.json", "rb") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "_type" in meta and "shape" not in meta


def checkpoint(
    td: TreeNode,
    dest: str | os.PathLike[str],
    *,
    verify: bool = False,
    chunk_bytes: int = CHUNK_BYTES,
    durable: bool = False,
) -> dict[str, int]:
    """Brings the checkpoint directory ``dest`` up to date with the memory-mapped ``td``,
    copying only what changed since the previous checkpoint; returns counts (``bytes_written``,
    ``files_written``, ``bytes_hashed``).

    ``dest`` then holds, byte for byte, the files ``td.memmap(dest, copy_existing=True)``
    would write, and is the previous checkpoint or the new one at every instant (see the
    module's docstring for how, and for the hidden sibling ``.<name>.tdrs%spare``).
    ``verify=True`` also compares every ``chunk_bytes`` chunk by hash, catching writes that
    bypassed the library's methods. ``durable=True`` fsyncs before the exchange. Growths of the
    tree from other processes wait while a checkpoint runs; a write into existing rows that
    overlaps it may be half in it (and is whole in the next one).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"obs": torch.zeros(1000, 4)}, [1000]).memmap("live")
    >>> td.checkpoint("ckpt")["bytes_written"] > 0  # the first one copies everything
    True
    >>> td[3] = TensorDict({"obs": torch.ones(4)}, [])
    >>> td.checkpoint("ckpt")["bytes_written"]  # then only the block of rows written
    4096
    >>> TensorDict.load_memmap("ckpt")["obs"][3].sum().item()
    4.0
    """
    prefix = td._memmap_prefix
    if prefix is None or not Path(prefix).is_dir():
        raise RuntimeError(
            "checkpoint() copies a TensorDict memory-mapped in a directory; call "
            "memmap_(prefix) first (an anonymous or archive-backed one has no directory)"
        )
    # loaded (load_memmap), so not locked: a leaf may have been set in memory since, and
    # non-tensor entries set, added or deleted (those the checkpoint takes from memory)
    changed = False
    if not td._is_memmap:
        key = _unmapped_leaf(td, Path(prefix))
        if key is not None:
            raise RuntimeError(
                f"checkpoint(): key {key!r} is not memory-mapped in {os.fspath(prefix)!r} (a "
                "value set in memory after the tree was loaded), so the directory does not "
                "hold it; call memmap_() first to write it there"
            )
        changed = _non_tensor_changed(td, Path(prefix))
    if fcntl is None:
        raise NotImplementedError("checkpoint() needs renameat2 and flock (Linux)")
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    lock_prefix = prefix = Path(prefix)
    if prefix.name == _native.TENSORCLASS_DIR and _is_tensorclass_dir(prefix.parent):
        prefix = prefix.parent  # a tensorclass's TensorDict: the checkpoint holds the class too
    dest = Path(os.path.abspath(dest))  # "a/../b" is "b"
    # by the paths as given and as resolved (a link to the tree's directory, or to a folder
    # holding it, leads inside it too: the checkpoint then copied itself into itself), for
    # ``dest`` and its hidden other generation (a tree saved there was renamed away)
    for target in (dest, dest.parent / spare_name(dest)):
        real = Path(os.path.realpath(target))
        for a, b in ((target, prefix), (real, Path(os.path.realpath(prefix)))):
            if a == b or b in a.parents or a in b.parents:
                raise ValueError(
                    f"the checkpoint {dest} (or its other generation {target.name}) cannot "
                    f"be inside the tree {prefix} or hold it"
                )
    parent = dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    spare = parent / spare_name(dest)
    if os.path.lexists(dest):
        if dest.is_symlink() or not dest.is_dir():
            raise FileExistsError(f"{dest} exists and is not a checkpoint directory")
        if _read_record(dest) is None and os.listdir(dest):
            raise FileExistsError(
                f"{dest} exists and is not a checkpoint made by checkpoint(); refusing to "
                "replace what it holds: remove it or choose another destination"
            )
    with contextlib.ExitStack() as stack, _lock(parent, dest), _tree_lock(lock_prefix):
        layout = None
        if changed:
            # the tree's meta.json files and non-tensor entries as it holds them in memory
            # (its directory holds them as they were), its tensors read from its directory
            layout = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tdrs%staging-", dir=parent))
            stack.callback(shutil.rmtree, layout, True)
            _write_layout(td, layout / "tree")
            layout = layout / "tree"
        source = _Source(prefix, layout)
        tracker = td._tracker
        if not isinstance(tracker, DirtyMap):
            # the first checkpoint of this tree: from now on its writes are stamped (and those
            # of every process holding it: their PendingMap finds the file)
            rows = max(1, sum(source.row_files.values()))
            tracker = DirtyMap.open(lock_prefix, create_rows=rows)
            assert tracker is not None
            tracker.attach(td)
        tracker.reserve(source.rows or 0)  # the map covers every row the tree has
        epoch = tracker.advance()
        spare.mkdir(exist_ok=True)
        mine = _user_files(dest, source) if os.path.lexists(dest) else frozenset()
        stats = _sync(source, spare, tracker, epoch, verify, chunk_bytes, durable, mine)
        _carry(dest, spare, mine)
        if durable:
            _sync_dirs(spare)
        if os.path.lexists(dest):
            _native.exchange_dirs(os.fspath(parent), spare.name, dest.name, durable=durable)
        else:
            _native.rename_new(os.fspath(parent), spare.name, dest.name, durable=durable)
            # the first checkpoint also writes the other generation, so the next one is
            # incremental already
            spare.mkdir()
            _sync(source, spare, tracker, epoch, verify, chunk_bytes, durable)
    return stats


def _sync_dirs(gen: Path) -> None:
    for root, _, _ in os.walk(gen):
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
