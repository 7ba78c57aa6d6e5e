"""``copy`` and ``convert``: the commands that go through the library's save path.

Each side is a tensordict directory, a ``.tdz`` archive (one zip file, the reference's other
form) or, for ``convert``, a ``.safetensors`` file. A path that exists is what it is on disk; a
new one is told by its suffix (``.tdz``, ``.safetensors``; anything else is a directory), as
tensordict decides where ``memmap`` writes. These import torch (when they run, not when the
command line starts).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..tensordict import TensorDict

DIR, ARCHIVE, SAFETENSORS = "directory", "archive", "safetensors"


class UsageError(Exception):
    """A command line that cannot be carried out as given (exit status 2)."""


def kind(path: str) -> str:
    """What ``path`` is, or would be once written: a directory, an archive or a safetensors file.

    >>> kind("/nonexistent/x.tdz"), kind("/nonexistent/w.safetensors"), kind("/nonexistent/d")
    ('archive', 'safetensors', 'directory')
    """
    if os.path.isdir(path):
        return DIR
    if os.path.isfile(path):
        from .. import _native

        if _native.is_archive(os.fspath(path)):
            return ARCHIVE
        if path.endswith(".safetensors"):
            return SAFETENSORS
        raise UsageError(f"{path}: neither a tensordict archive nor a .safetensors file")
    if path.endswith(".tdz"):
        return ARCHIVE
    return SAFETENSORS if path.endswith(".safetensors") else DIR


def _check_target(dst: str, what: str, overwrite: bool) -> None:
    """Refuses a ``dst`` that holds something else, or a tree without ``overwrite``."""
    if what == DIR:
        if os.path.exists(dst) and not os.path.isdir(dst):
            raise UsageError(f"{dst}: exists and is not a directory")
        if os.path.exists(os.path.join(dst, "meta.json")) and not overwrite:
            raise UsageError(f"{dst}: a tree is there already; pass --overwrite to replace it")
    elif os.path.isdir(dst):
        raise UsageError(f"{dst}: is a directory; name the {what} file to write")
    elif os.path.lexists(dst) and not overwrite:
        raise UsageError(f"{dst}: exists; pass --overwrite to replace it")


def _load(src: str, what: str, *, separator: str = ".", progress: bool = False) -> TensorDict:
    from ..tensordict import TensorDict

    if what == SAFETENSORS:
        return TensorDict.from_safetensors(src, separator=separator)
    return TensorDict.load_memmap(src, progress=progress)


def copy(
    src: str, dst: str, *, progress: bool = False, durable: bool = False, overwrite: bool = False
) -> None:
    """Re-saves the tree at ``src`` (a directory or a ``.tdz`` archive) to ``dst`` (either).

    Writes go through ``TensorDict.memmap``: a directory is staged inside ``dst`` and committed
    with a journal, an archive is written beside it and renamed into place, so ``dst`` holds the
    old tree or the whole new one, never a mix; the source is only read. Without ``overwrite``
    an existing tree at ``dst`` is refused. ``progress`` draws a bar of the bytes written.
    """
    if not os.path.exists(src):
        raise UsageError(f"{src}: no such file or directory")
    source, target = kind(src), kind(dst)
    if SAFETENSORS in (source, target):
        raise UsageError("copy is between directories and .tdz archives: use convert")
    _check_target(dst, target, overwrite)
    td = _load(src, source)
    td.memmap(
        dst,
        copy_existing=True,
        durable=durable,
        existsok=overwrite,
        archive=target == ARCHIVE,
        progress=progress,
    )


def convert(
    src: str, dst: str, *, separator: str = ".", overwrite: bool = False, progress: bool = False
) -> None:
    """Between a tensordict directory, a ``.tdz`` archive and a ``.safetensors`` file, any way
    (each side is told by ``kind``). Nested keys are joined with ``separator`` in safetensors
    names; batch sizes and non-tensor values travel in its ``__metadata__``. Every write is
    atomic.
    """
    if not os.path.exists(src):
        raise UsageError(f"{src}: no such file or directory")
    if separator == "":
        raise UsageError("--separator cannot be empty: nested keys would not split back")
    source, target = kind(src), kind(dst)
    if source == target == SAFETENSORS:
        raise UsageError("both sides are .safetensors files: nothing to convert")
    _check_target(dst, target, overwrite)
    td = _load(src, source, separator=separator)
    if target == SAFETENSORS:
        td.to_safetensors(dst, separator=separator)
    else:
        td.memmap(dst, existsok=overwrite, archive=target == ARCHIVE, progress=progress)
