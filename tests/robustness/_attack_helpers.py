"""Shared pieces of the commit-attack tests (issue 28): versioned trees, saves killed inside
their commit, and checks that a tree is one whole version.

A *version* ``v`` of a tree fills every leaf with ``float(v)`` and stores ``str(v)`` under the
non-tensor key ``note``, so a load tells at a glance which version each leaf comes from.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

STEP = "TENSORDICT_RS_KILL_AT_STEP"
JOURNAL = ".tdrs%journal"


def tree(version: int, keys: tuple[str, ...] = ("obs", "gone"), sub: bool = True) -> Any:
    """Version ``version``: leaves ``keys`` at the root, ``sub/x`` and ``sub/deep/y`` below
    (with ``sub``), and ``note``; batch size [4]."""
    from tensordict_rs import TensorDict

    v = float(version)
    source: dict[str, Any] = {k: torch.full((4, 3), v) for k in keys}
    if sub:
        source["sub"] = {"x": torch.full((4, 2), v), "deep": {"y": torch.full((4, 5), v)}}
    td = TensorDict(source, [4])
    td["note"] = str(version)
    return td


def leaves(td: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) of every tensor leaf of ``td`` (ours or the reference's), nested too."""
    for key in sorted(td.keys()):
        value = td.get(key)
        if isinstance(value, torch.Tensor):
            yield f"{prefix}{key}", value
        elif hasattr(value, "keys") and not isinstance(value, str):
            yield from leaves(value, f"{prefix}{key}/")


def versions(td: Any) -> dict[str, float]:
    """The value every leaf holds (NaN for a leaf that mixes values)."""
    out = {}
    for path, leaf in leaves(td):
        lo, hi = (float(x) for x in torch.aminmax(leaf.flatten().float()))
        out[path] = lo if lo == hi else float("nan")
    return out


def killed_save(save: Callable[[], Any], step: int) -> bool:
    """Runs ``save`` in a forked child that SIGKILLs itself once ``step`` steps of its commit
    ran (the crash tests' hook). Returns True when the child died that way (inside its
    commit), False when it finished (the commit has fewer steps)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.environ[STEP] = str(step)
            save()
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, "the saving child failed before its kill point"
    return False


def snapshot(prefix: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry below ``prefix`` (symlinks not followed): relative path -> (inode, size,
    mtime_ns). A replay that refuses must leave this unchanged."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(prefix):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.relpath(path, prefix)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def leftovers(prefix: Path) -> list[str]:
    """What saves leave in a tree (staging directories, journals, siblings), at any depth."""
    found = []
    for dirpath, dirnames, filenames in os.walk(prefix):
        found += [os.path.join(dirpath, n) for n in dirnames + filenames if n.startswith(".tdrs")]
    return found


def assert_whole(prefix: Path, version: int, keys: set[str] | None = None) -> None:
    """Both loaders read ``prefix`` as exactly ``version``: every leaf and ``note``, with the
    leaf paths ``keys`` when given; ``verify`` finds nothing."""
    import tensordict
    import tensordict_rs
    from tensordict_rs import TensorDict

    ours = TensorDict.load_memmap(prefix)
    seen = versions(ours)
    assert set(seen.values()) == {float(version)}, f"ours: {seen}"
    assert ours["note"] == str(version)
    if keys is not None:
        assert set(seen) == keys, sorted(seen)
    assert tensordict_rs.verify(prefix) == []
    ref = tensordict.TensorDict.load_memmap(prefix)
    assert versions(ref) == seen, f"reference: {versions(ref)}, ours: {seen}"


@contextlib.contextmanager
def reaped(*children: subprocess.Popen[str]) -> Iterator[None]:
    """Kills and waits for ``children`` when the block leaves early (a failed assertion), so a
    failing test leaves no process running and no pipe open for a later test to trip over."""
    try:
        yield
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
            for stream in (child.stdin, child.stdout, child.stderr):
                if stream is not None:
                    stream.close()
