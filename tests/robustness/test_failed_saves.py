"""Saves that must fail and change nothing.

Every case refuses the save with a clear error, and afterwards:

* the source TensorDict is as it was: not locked, not memory-mapped, the same tensor (and
  sub-TensorDict) objects holding the same values, no key added or removed;
* the target directory (an existing, valid tree) is byte-for-byte untouched, and nothing was
  left beside it (no staging directory ``.NAME.tdrs-*``).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tensordict_rs
import torch
from tensordict_rs import MemoryMappedTensor, TensorDict

METHODS = ["memmap_", "memmap", "memmap_like"]


# --------------------------------------------------------------------------- snapshots


def snapshot_tree(root: Path) -> dict[str, Any]:
    """Every entry under ``root`` (itself included): kind, mode and content or link target."""
    out: dict[str, Any] = {}

    def visit(path: Path, rel: str) -> None:
        st = path.lstat()
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            out[rel] = ("dir", st.st_mode, st.st_ino)
            for child in sorted(os.listdir(path)):
                visit(path / child, f"{rel}/{child}")
        else:
            out[rel] = ("file", st.st_mode, st.st_ino, path.read_bytes())

    visit(root, ".")
    return out


def _walk(td: TensorDict, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in td.items():
        yield (*prefix, key), value
        if isinstance(value, TensorDict):
            yield from _walk(value, (*prefix, key))


def snapshot_td(td: TensorDict) -> list[tuple[tuple[str, ...], Any, Any]]:
    """(key, object, copy of the value) for every entry, sub-TensorDicts included."""
    out = []
    for key, value in _walk(td):
        copy = value.clone() if isinstance(value, torch.Tensor) else None
        out.append((key, value, copy))
    return out


def assert_td_unchanged(td: TensorDict, before: list[tuple[tuple[str, ...], Any, Any]]) -> None:
    after = list(_walk(td))
    assert [k for k, _ in after] == [k for k, _, _ in before], "keys changed"
    for (key, obj, copy), (_, now) in zip(before, after, strict=True):
        assert now is obj, f"{key}: the entry was replaced by another object"
        if isinstance(obj, TensorDict):
            assert not obj.is_locked, f"{key}: sub-TensorDict left locked"
            assert not obj.is_memmap(), f"{key}: sub-TensorDict marked memory-mapped"
        elif isinstance(obj, torch.Tensor):
            assert type(now) is torch.Tensor, f"{key}: became {type(now).__name__}"
            assert not isinstance(now, MemoryMappedTensor)
            assert torch.equal(now, copy), f"{key}: values changed"
    assert not td.is_locked, "the source was left locked"
    assert not td.is_memmap(), "the source was marked memory-mapped"


def no_staging_left(parent: Path) -> list[str]:
    return [name for name in os.listdir(parent) if ".tdrs-" in name]


def existing_tree(prefix: Path) -> None:
    """A valid tree already at ``prefix`` (different keys and values than the sources)."""
    old = TensorDict({"old": torch.full((2, 3), 5.0), "keep": {"k": torch.arange(2)}}, [2])
    old["note"] = "old version"
    old.memmap_(prefix)
    (prefix / "user-file.txt").write_text("not part of the tree")
    assert tensordict_rs.verify(prefix) == []


def base_source() -> TensorDict:
    return TensorDict(
        {
            "x": torch.arange(6, dtype=torch.float32).reshape(2, 3),
            "e": torch.empty(2, 0),
            "sub": {"y": torch.ones(2, dtype=torch.int16)},
        },
        [2],
    )


def run_failing_save(
    tmp_path: Path,
    source: TensorDict,
    method: str,
    expect: type[BaseException] | tuple[type[BaseException], ...],
    match: Callable[[BaseException], bool],
    *,
    prefix: Path | None = None,
    existing: bool = True,
    **kwargs: Any,
) -> BaseException:
    prefix = prefix if prefix is not None else tmp_path / "target"
    if existing:
        existing_tree(prefix)
    parent = tmp_path
    disk_before = snapshot_tree(parent)
    td_before = snapshot_td(source)
    with pytest.raises(expect) as info:
        getattr(source, method)(prefix, **kwargs)
    assert match(info.value), f"unclear error: {type(info.value).__name__}: {info.value}"
    assert_td_unchanged(source, td_before)
    assert snapshot_tree(parent) == disk_before, "the target or its parent changed"
    assert no_staging_left(parent) == []
    if existing:
        assert tensordict_rs.verify(prefix) == []
        reloaded = TensorDict.load_memmap(prefix)
        assert torch.equal(reloaded["old"], torch.full((2, 3), 5.0))
    return info.value


# --------------------------------------------------------------------------- reserved keys


RESERVED = ["shape", "device", "_type", "_class", "_format_version"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("reserved", RESERVED)
@pytest.mark.parametrize("where", ["top", "nested"])
def test_reserved_key_refused(tmp_path: Path, method: str, reserved: str, where: str) -> None:
    source = base_source()
    if where == "top":
        source[reserved] = torch.zeros(2)
    else:
        source["sub", reserved] = torch.zeros(2)
    run_failing_save(
        tmp_path,
        source,
        method,
        tensordict_rs.InvalidTreeError,
        lambda e: "reserved" in str(e) and repr(reserved).replace("'", '"') in str(e),
    )


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ["non_tensor", "sub_td"])
def test_reserved_key_as_non_tensor_or_sub_td_refused(
    tmp_path: Path, method: str, kind: str
) -> None:
    source = base_source()
    if kind == "non_tensor":
        source["device"] = "a string"
    else:
        source["shape"] = {"z": torch.zeros(2)}
    run_failing_save(
        tmp_path, source, method, tensordict_rs.InvalidTreeError, lambda e: "reserved" in str(e)
    )


# --------------------------------------------------------------------------- collisions


def _collide_leaf_node(td: TensorDict) -> None:
    td["a"] = torch.zeros(2)
    td["a.memmap"] = {"x": torch.zeros(2)}


def _collide_node_leaf(td: TensorDict) -> None:
    td["a.memmap"] = {"x": torch.zeros(2)}
    td["a"] = torch.zeros(2)


def _collide_non_tensor(td: TensorDict) -> None:
    td["a"] = torch.zeros(2)
    td["a.memmap"] = "text"


def _collide_meta(td: TensorDict) -> None:
    td["meta.json"] = {"x": torch.zeros(2)}


def _collide_nested(td: TensorDict) -> None:
    td["sub", "b"] = torch.zeros(2)
    td["sub", "b.memmap"] = {"x": torch.zeros(2)}


COLLISIONS = {
    "leaf_then_dir": _collide_leaf_node,
    "dir_then_leaf": _collide_node_leaf,
    "leaf_and_non_tensor": _collide_non_tensor,
    "dir_named_meta_json": _collide_meta,
    "nested": _collide_nested,
}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", list(COLLISIONS))
def test_colliding_keys_refused(tmp_path: Path, method: str, case: str) -> None:
    source = base_source()
    COLLISIONS[case](source)
    run_failing_save(
        tmp_path,
        source,
        method,
        tensordict_rs.InvalidTreeError,
        lambda e: "a.memmap" in str(e) or "b.memmap" in str(e) or "meta.json" in str(e),
    )


# --------------------------------------------------------------------------- non-JSON values


class Opaque:
    pass


NON_JSON = {
    "set": {1, 2, 3},
    "object": Opaque(),
    "bytes": b"raw",
    "list_with_set": [1, {2}],
    "dict_int_keys": {1: "one"},
    "nan": float("nan"),
}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", list(NON_JSON))
@pytest.mark.parametrize("where", ["top", "nested"])
def test_non_json_value_refused(tmp_path: Path, method: str, kind: str, where: str) -> None:
    source = base_source()
    key = ("odd",) if where == "top" else ("sub", "odd")
    source[key] = tensordict_rs.NonTensorData(NON_JSON[kind])
    run_failing_save(
        tmp_path,
        source,
        method,
        tensordict_rs.InvalidTreeError,
        lambda e: "'odd'" in str(e) or '"odd"' in str(e),
    )


# --------------------------------------------------------------------------- the target


@pytest.mark.parametrize("method", METHODS)
def test_existsok_false_on_existing_tree(tmp_path: Path, method: str) -> None:
    err = run_failing_save(
        tmp_path,
        base_source(),
        method,
        FileExistsError,
        lambda e: isinstance(e, OSError) and "target" in str(e),
        existsok=False,
    )
    assert err.errno == errno.EEXIST


@pytest.mark.parametrize("method", METHODS)
def test_existsok_false_on_any_existing_entry(tmp_path: Path, method: str) -> None:
    """A directory holding only one file the save would write is not replaced either."""
    prefix = tmp_path / "target"
    prefix.mkdir()
    (prefix / "x.memmap").write_bytes(b"precious")
    run_failing_save(
        tmp_path,
        base_source(),
        method,
        FileExistsError,
        lambda e: "x.memmap" in str(e),
        prefix=prefix,
        existing=False,
        existsok=False,
    )


@pytest.mark.parametrize("method", METHODS)
def test_regular_file_in_the_way(tmp_path: Path, method: str) -> None:
    prefix = tmp_path / "target"
    prefix.write_bytes(b"a regular file")
    err = run_failing_save(
        tmp_path,
        base_source(),
        method,
        NotADirectoryError,
        lambda e: "target" in str(e),
        prefix=prefix,
        existing=False,
    )
    assert err.errno == errno.ENOTDIR


@pytest.mark.parametrize("method", METHODS)
def test_regular_file_in_the_way_of_a_parent(tmp_path: Path, method: str) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_bytes(b"a regular file")
    run_failing_save(
        tmp_path,
        base_source(),
        method,
        OSError,
        lambda e: "blocker" in str(e),
        prefix=blocker / "target",
        existing=False,
    )
    assert blocker.read_bytes() == b"a regular file"


# --------------------------------------------------------------------------- read-only parent


@pytest.fixture
def read_only_parent(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(writable source dir, read-only bind mount of it). Root ignores chmod, not ro mounts."""
    src = tmp_path / "rw"
    src.mkdir()
    ro = tmp_path / "ro"
    ro.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot make a read-only directory for root")
    bind = subprocess.run(["mount", "--bind", src, ro], capture_output=True, text=True)
    if bind.returncode != 0:
        pytest.skip(f"bind mounts are not permitted here: {bind.stderr.strip()}")
    try:
        remount = subprocess.run(
            ["mount", "-o", "remount,bind,ro", ro], capture_output=True, text=True
        )
        if remount.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remount.stderr.strip()}")
        yield src, ro
    finally:
        subprocess.run(["umount", ro], check=True)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("existing", [False, True], ids=["new", "replace"])
def test_read_only_parent(read_only_parent: tuple[Path, Path], method: str, existing: bool) -> None:
    src, ro = read_only_parent
    if existing:
        existing_tree(src / "target")
    disk_before = snapshot_tree(src)
    source = base_source()
    td_before = snapshot_td(source)
    with pytest.raises(OSError) as info:
        getattr(source, method)(ro / "target")
    assert info.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM), info.value
    assert "ro" in str(info.value) and str(ro) in str(info.value)
    assert_td_unchanged(source, td_before)
    assert snapshot_tree(src) == disk_before
    if existing:
        assert torch.equal(TensorDict.load_memmap(ro / "target")["old"], torch.full((2, 3), 5.0))


# --------------------------------------------------------------------------- unsaveable leaves


@pytest.mark.parametrize("method", METHODS)
def test_unstorable_dtype_refused(tmp_path: Path, method: str) -> None:
    """A dtype the format cannot store (float8): refused, nothing written."""
    source = base_source()
    source["q"] = torch.zeros(2, dtype=torch.float8_e4m3fn)
    run_failing_save(
        tmp_path,
        source,
        method,
        (tensordict_rs.TensorDictError, TypeError, ValueError),
        lambda e: "float8" in str(e),
    )
