"""``copy`` and ``convert``: the commands that go through the library's save path.

These import torch (when they run, not when the command line starts)."""

from __future__ import annotations

import os


class UsageError(Exception):
    """A command line that cannot be carried out as given (exit status 2)."""


def copy(src: str, dst: str, *, durable: bool = False, overwrite: bool = False) -> None:
    """Re-saves the tree at ``src`` to ``dst`` through ``TensorDict.memmap``.

    The copy is staged inside ``dst`` and committed with a journal, so ``dst`` holds the old
    tree or the whole new one, never a mix; the source is only read. Without ``overwrite`` an
    existing tree at ``dst`` is refused.
    """
    if not os.path.isdir(src):
        raise UsageError(f"{src}: no such directory")
    if os.path.exists(os.path.join(dst, "meta.json")) and not overwrite:
        raise UsageError(f"{dst}: a tree is there already; pass --overwrite to replace it")
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise UsageError(f"{dst}: exists and is not a directory")
    from ..tensordict import TensorDict

    td = TensorDict.load_memmap(src)
    td.memmap(dst, copy_existing=True, durable=durable, existsok=overwrite)


def convert(src: str, dst: str, *, separator: str = ".", overwrite: bool = False) -> None:
    """A tensordict directory to a ``.safetensors`` file, or a ``.safetensors`` file to a
    directory (the direction follows ``src``). Nested keys are joined with ``separator``; batch
    sizes and non-tensor values travel in the file's ``__metadata__``. Both writes are atomic.
    """
    from ..tensordict import TensorDict

    if os.path.isdir(src):
        if os.path.isdir(dst):
            raise UsageError(f"{dst}: is a directory; name the .safetensors file to write")
        if os.path.exists(dst) and not overwrite:
            raise UsageError(f"{dst}: exists; pass --overwrite to replace it")
        TensorDict.load_memmap(src).to_safetensors(dst, separator=separator)
    elif os.path.isfile(src):
        if os.path.exists(os.path.join(dst, "meta.json")) and not overwrite:
            raise UsageError(f"{dst}: a tree is there already; pass --overwrite to replace it")
        if os.path.exists(dst) and not os.path.isdir(dst):
            raise UsageError(f"{dst}: exists and is not a directory")
        td = TensorDict.from_safetensors(src, separator=separator)
        td.memmap_(dst, existsok=overwrite)
    else:
        raise UsageError(f"{src}: no such file or directory")
