"""Integrity check of a saved directory, without loading any tensor."""

from __future__ import annotations

import os

from . import _native


def verify(prefix: str | os.PathLike[str]) -> list[str]:
    """Walks the directory at ``prefix`` and returns every problem found (empty: it loads).

    Checks each meta.json (size, JSON, types, dtypes, shapes against the batch size), that every
    data file exists, is a regular file and is long enough, that sub-directories exist, and that
    nothing is reached through a symlink. No data is mapped or read.

    >>> import os, torch, tensordict_rs
    >>> _ = tensordict_rs.TensorDict({"a": torch.zeros(4)}, [4]).memmap("checked")
    >>> verify("checked")
    []
    >>> os.truncate("checked/a.memmap", 2)
    >>> [p.split(":")[0] for p in verify("checked")]
    ['the data file of key "a" is truncated']
    """
    if os.path.isfile(prefix):  # a .tdz archive: structure, tree and every entry's CRC-32
        return _native.verify_archive(os.fspath(prefix))
    return _native.verify_tree(os.fspath(prefix))
