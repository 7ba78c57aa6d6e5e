"""``copy``: the commands that go through the library's save path (these import torch)."""

from __future__ import annotations

import os


class UsageError(Exception):
    """A command line that cannot be carried out as given (exit status 2)."""


def copy(src: str, dst: str, *, durable: bool = False, overwrite: bool = False) -> None:
    """Re-saves the tree at ``src`` to ``dst`` through ``TensorDict.memmap``.

    The copy is written beside ``dst`` and swapped in with one rename, so ``dst`` holds the old
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
