"""Damaged and hostile directories: every case must be refused cleanly, by three doors.

Each case starts from a valid saved tree and damages it. For every case:

* ``TensorDict.load_memmap`` raises a tensordict_rs exception or an ``OSError`` whose message
  names the damaged key or path (never loads, never crashes, never reads outside the prefix);
* ``tensordict_rs.verify(prefix)`` returns a non-empty list of problems;
* ``python -m tensordict_rs verify DIR`` exits with status 1.

A few valid variations (longer data files, unknown extra sub-folders) must still load.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tensordict_rs
import torch
from tensordict_rs import TensorDict
from tensordict_rs.__main__ import main as cli_main

TD_TYPE = "<class 'tensordict._td.TensorDict'>"
NTD_TYPE = "<class 'tensordict.tensorclass.NonTensorData'>"
META_LIMIT = 64 << 20  # the loader's documented bound on meta.json

Damage = Callable[[Path, Path], None]


# --------------------------------------------------------------------------- building blocks


def build_valid(prefix: Path) -> TensorDict:
    """Saves the reference tree at ``prefix`` and returns the source values (plain tensors)."""
    source = TensorDict(
        {
            "a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
            "b": torch.arange(3),
            "n": {
                "x": torch.full((3, 2), 2.5, dtype=torch.float64),
                "deep": {"y": torch.tensor([7, 8, 9], dtype=torch.int32)},
            },
        },
        [3],
    )
    source["s"] = "hello"
    expected = source.clone()
    source.memmap_(prefix)
    del source
    return expected


def read_meta(prefix: Path, rel: str = "meta.json") -> dict[str, Any]:
    return json.loads((prefix / rel).read_text())


def write_meta(prefix: Path, meta: Any, rel: str = "meta.json") -> None:
    (prefix / rel).write_text(json.dumps(meta))


def edit_meta(rel: str, change: Callable[[dict[str, Any]], None]) -> Damage:
    def damage(prefix: Path, outside: Path) -> None:
        meta = read_meta(prefix, rel)
        change(meta)
        write_meta(prefix, meta, rel)

    return damage


def set_leaf(key: str, **fields: Any) -> Damage:
    def change(meta: dict[str, Any]) -> None:
        meta[key].update(fields)

    return edit_meta("meta.json", change)


def drop_field(key: str, field: str, rel: str = "meta.json") -> Damage:
    def change(meta: dict[str, Any]) -> None:
        del meta[key][field]

    return edit_meta(rel, change)


def set_top(rel: str = "meta.json", **fields: Any) -> Damage:
    def change(meta: dict[str, Any]) -> None:
        meta.update(fields)

    return edit_meta(rel, change)


def add_entry(key: str, entry: Any) -> Damage:
    def change(meta: dict[str, Any]) -> None:
        meta[key] = entry

    return edit_meta("meta.json", change)


def leaf_entry(shape: list[int], dtype: str = "torch.float32") -> dict[str, Any]:
    return {"device": "cpu", "shape": shape, "dtype": dtype, "is_nested": False}


def truncate(rel: str, size: int) -> Damage:
    def damage(prefix: Path, outside: Path) -> None:
        os.truncate(prefix / rel, size)

    return damage


def remove(rel: str) -> Damage:
    def damage(prefix: Path, outside: Path) -> None:
        target = prefix / rel
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()

    return damage


def replace_text(rel: str, text: str) -> Damage:
    def damage(prefix: Path, outside: Path) -> None:
        (prefix / rel).write_text(text)

    return damage


def truncate_meta(prefix: Path, outside: Path) -> None:
    raw = (prefix / "meta.json").read_bytes()
    (prefix / "meta.json").write_bytes(raw[: len(raw) // 2])


def meta_not_utf8(prefix: Path, outside: Path) -> None:
    (prefix / "meta.json").write_bytes(b'{"a\xff\xfe": 1, "_type": "x"}')


def meta_too_large(prefix: Path, outside: Path) -> None:
    # Valid JSON followed by whitespace: only the size bound can refuse it.
    raw = (prefix / "meta.json").read_bytes()
    with open(prefix / "meta.json", "ab") as f:
        f.write(b" " * (META_LIMIT + 1 - len(raw) + 16))


def replace_with_dir(rel: str) -> Damage:
    def damage(prefix: Path, outside: Path) -> None:
        (prefix / rel).unlink()
        (prefix / rel).mkdir()

    return damage


def replace_with_file(rel: str) -> Damage:
    def damage(prefix: Path, outside: Path) -> None:
        shutil.rmtree(prefix / rel)
        (prefix / rel).write_bytes(b"not a directory")

    return damage


def replace_with_fifo(rel: str) -> Damage:
    def damage(prefix: Path, outside: Path) -> None:
        (prefix / rel).unlink()
        os.mkfifo(prefix / rel)

    return damage


def symlink_out(rel: str) -> Damage:
    """Moves ``rel`` outside the tree (intact) and leaves a symlink to it in its place."""

    def damage(prefix: Path, outside: Path) -> None:
        moved = outside / ("moved-" + rel.replace("/", "_"))
        shutil.move(prefix / rel, moved)
        os.symlink(moved, prefix / rel)

    return damage


def traversal_leaf(key: str, bait: str) -> Damage:
    """A leaf whose key tries to leave the prefix; valid data waits at the place it aims at."""

    def damage(prefix: Path, outside: Path) -> None:
        meta = read_meta(prefix)
        meta[key] = leaf_entry([3])
        write_meta(prefix, meta)
        target = prefix / bait
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(torch.ones(3).numpy().tobytes())

    return damage


def traversal_dir(key: str) -> Damage:
    """A sub-TensorDict whose key is ``..``/``.``/a path: must not reach the parent or itself."""

    def damage(prefix: Path, outside: Path) -> None:
        meta = read_meta(prefix)
        meta[key] = {"type": "TensorDict"}
        write_meta(prefix, meta)

    return damage


def pickled_non_tensor(prefix: Path, outside: Path) -> None:
    # tensordict pickles values it cannot write as JSON: other.pickle and no "data". The pickle
    # here creates a marker file when unpickled; the test checks that it never was.
    write_meta(
        prefix,
        {"_type": NTD_TYPE, "_metadata": None, "_is_non_tensor": True},
        "s/meta.json",
    )
    marker = outside / "UNPICKLED"
    payload = b"c__builtin__\nopen\n(" + pickle.dumps(str(marker), protocol=0)[:-1] + b"S'w'\ntR."
    (prefix / "s" / "other.pickle").write_bytes(payload)


def jagged(prefix: Path, outside: Path) -> None:
    meta = read_meta(prefix)
    meta["a"]["is_nested"] = True
    meta["a"]["shape"] = [3, 2]
    meta["a"]["dtype"] = "torch.int64"
    write_meta(prefix, meta)
    # tensordict stores the component shapes beside the values
    (prefix / "a.shape.memmap").write_bytes(
        torch.tensor([[1, 4], [2, 2], [3, 1]]).numpy().tobytes()
    )


def non_tensor_root(prefix: Path, outside: Path) -> None:
    write_meta(prefix, {"_type": NTD_TYPE, "data": 1, "_metadata": None, "_is_non_tensor": True})


def too_deep(prefix: Path, outside: Path) -> None:
    depth = 300
    node = prefix / "n"
    shutil.rmtree(node)
    for _ in range(depth):
        node.mkdir()
        write_meta(node, {"n": {"type": "TensorDict"}, "shape": [3], "_type": TD_TYPE})
        node = node / "n"
    node.mkdir()
    write_meta(node, {"shape": [3], "_type": TD_TYPE})


@dataclass(frozen=True)
class Case:
    name: str
    damage: Damage
    # The message must contain one of these (the damaged key, quoted as the library quotes
    # keys, or the damaged path relative to the prefix).
    mentions: tuple[str, ...]


def key(k: str) -> str:
    return json.dumps(k)  # the loader quotes keys like Rust's {:?}, i.e. "a"


CASES = [
    # data files
    Case("data_truncated", truncate("a.memmap", 20), ("a.memmap", key("a"))),
    Case("data_missing", remove("a.memmap"), ("a.memmap", key("a"))),
    Case("data_empty", truncate("a.memmap", 0), ("a.memmap", key("a"))),
    Case("data_one_byte_short", truncate("b.memmap", 23), ("b.memmap", key("b"))),
    Case("nested_data_truncated", truncate("n/deep/y.memmap", 4), ("deep/y.memmap", key("y"))),
    Case("nested_data_missing", remove("n/x.memmap"), ("n/x.memmap", key("x"))),
    Case("data_is_directory", replace_with_dir("a.memmap"), ("a.memmap", key("a"))),
    Case("data_is_fifo", replace_with_fifo("b.memmap"), ("b.memmap", key("b"))),
    # meta.json itself
    Case("meta_corrupt", replace_text("meta.json", "{not json"), ("meta.json",)),
    Case("meta_empty", replace_text("meta.json", ""), ("meta.json",)),
    Case("meta_truncated", truncate_meta, ("meta.json",)),
    Case("meta_array", replace_text("meta.json", "[1, 2, 3]"), ("meta.json",)),
    Case("meta_number", replace_text("meta.json", "42"), ("meta.json",)),
    Case("meta_string", replace_text("meta.json", '"TensorDict"'), ("meta.json",)),
    Case("meta_null", replace_text("meta.json", "null"), ("meta.json",)),
    Case("meta_not_utf8", meta_not_utf8, ("meta.json",)),
    Case("meta_too_large", meta_too_large, ("meta.json",)),
    Case("meta_missing", remove("meta.json"), ("meta.json",)),
    Case("meta_is_directory", replace_with_dir("meta.json"), ("meta.json",)),
    Case("nested_meta_corrupt", replace_text("n/meta.json", '{"x": '), ("n/meta.json",)),
    Case("nested_meta_missing", remove("n/deep/meta.json"), ("deep/meta.json",)),
    Case(
        "no_type",
        edit_meta("meta.json", lambda m: [m.pop("_type"), m.pop("_class")]),
        ("meta.json",),
    ),
    Case(
        "unknown_type",
        set_top(
            _class="tensordict:LazyStackedTensorDict",
            _type="<class 'tensordict._lazy.LazyStackedTensorDict'>",
        ),
        ("meta.json",),
    ),
    Case("non_tensor_root", non_tensor_root, ("meta.json", "prefix'")),
    Case("entry_not_object", add_entry("a", 7), (key("a"),)),
    Case("device_not_string", set_top(device=5), ("meta.json",)),
    Case("device_not_a_device", set_top(device="TensorDict"), ("meta.json",)),
    Case("device_empty", set_top(device=""), ("meta.json",)),
    # shapes
    Case("shape_not_batch", set_leaf("a", shape=[4, 4]), (key("a"),)),
    Case("shape_too_few_dims", set_leaf("a", shape=[]), (key("a"),)),
    Case("shape_negative", set_leaf("a", shape=[3, -4]), (key("a"),)),
    Case("shape_fractional", set_leaf("a", shape=[3, 1.5]), (key("a"),)),
    Case("shape_string_dim", set_leaf("a", shape=[3, "4"]), (key("a"),)),
    Case("shape_bool_dim", set_leaf("a", shape=[3, True]), (key("a"),)),
    Case("shape_overflow", set_leaf("a", shape=[3, 2**62, 2**62]), (key("a"),)),
    Case("shape_beyond_u64", set_leaf("a", shape=[3, 2**64 + 1]), (key("a"),)),
    # no data at all (a zero dim), but a dimension torch cannot hold (int64)
    Case("shape_empty_beyond_int64", add_entry("z", leaf_entry([3, 0, 2**63])), (key("z"),)),
    Case("batch_beyond_int64", set_top(shape=[0, 2**63]), ("meta.json",)),
    Case(
        "batch_beyond_int64_alone",
        replace_text("meta.json", json.dumps({"shape": [0, 2**63], "_type": TD_TYPE})),
        ("meta.json",),
    ),
    Case("shape_huge_for_file", set_leaf("a", shape=[3, 2**40]), ("a.memmap", key("a"))),
    Case("shape_larger_than_file", set_leaf("a", shape=[3, 5]), ("a.memmap", key("a"))),
    Case("shape_not_list", set_leaf("a", shape=12), (key("a"),)),
    Case("shape_missing", drop_field("a", "shape"), (key("a"),)),
    Case("batch_negative", set_top(shape=[-3]), ("meta.json",)),
    Case("batch_not_list", set_top(shape="3"), ("meta.json",)),
    Case("nested_batch_mismatch", set_top("n/meta.json", shape=[2]), (key("x"), "n/meta.json")),
    Case("nested_batch_not_parent", set_top("n/meta.json", shape=[]), (key("n"), "prefix/n'")),
    # dtypes
    Case("dtype_unknown", set_leaf("a", dtype="torch.foo"), (key("a"),)),
    Case("dtype_without_prefix", set_leaf("a", dtype="float32"), (key("a"),)),
    Case("dtype_quantized", set_leaf("a", dtype="torch.qint8"), (key("a"),)),
    Case("dtype_not_string", set_leaf("a", dtype=4), (key("a"),)),
    Case("dtype_missing", drop_field("a", "dtype"), (key("a"),)),
    Case("nested_dtype_missing", drop_field("x", "dtype", "n/meta.json"), (key("x"),)),
    # keys that try to leave the tree
    Case("traversal_parent_leaf", traversal_leaf("../x", "../x.memmap"), (key("../x"),)),
    Case("traversal_deep_leaf", traversal_leaf("n/../../x", "../x.memmap"), (key("n/../../x"),)),
    Case(
        "traversal_absolute_leaf",
        traversal_leaf("/etc/passwd", "etc/passwd.memmap"),
        (key("/etc/passwd"),),
    ),
    Case("traversal_dotdot_leaf", traversal_leaf("..", "...memmap"), (key(".."),)),
    Case("traversal_dotdot_dir", traversal_dir(".."), (key(".."), "%2E%2E")),
    Case("traversal_dot_dir", traversal_dir("."), (key("."), "%2E")),
    Case("traversal_path_dir", traversal_dir("n/deep"), (key("n/deep"),)),
    Case("traversal_absolute_dir", traversal_dir("/etc"), (key("/etc"),)),
    # symlinks
    Case("symlink_data_file", symlink_out("a.memmap"), ("a.memmap", key("a"))),
    Case("symlink_nested_data_file", symlink_out("n/x.memmap"), ("x.memmap", key("x"))),
    Case("symlink_subdir", symlink_out("n"), (key("n"),)),
    Case("symlink_meta", symlink_out("meta.json"), ("meta.json",)),
    Case("symlink_nested_meta", symlink_out("n/meta.json"), ("n/meta.json",)),
    Case("symlink_non_tensor_dir", symlink_out("s"), (key("s"),)),
    # sub-folders
    Case("missing_subdir", remove("n"), (key("n"),)),
    Case("missing_nested_subdir", remove("n/deep"), (key("deep"),)),
    Case("missing_non_tensor_dir", remove("s"), (key("s"),)),
    Case("subdir_is_file", replace_with_file("n"), (key("n"),)),
    Case("too_deep", too_deep, ("n/n/n",)),
    # contents this library refuses to load
    Case("pickled_non_tensor", pickled_non_tensor, ("s/meta.json",)),
    Case("format_version_2", set_top(_format_version=2), ("meta.json",)),
    Case("nested_format_version_2", set_top("n/meta.json", _format_version=2), ("n/meta.json",)),
    Case("format_version_string", set_top(_format_version="1"), ("meta.json",)),
    Case("format_version_negative", set_top(_format_version=-1), ("meta.json",)),
    Case("jagged_nested_tensor", jagged, (key("a"),)),
]

ALLOWED = (tensordict_rs.TensorDictError, OSError)


def make_case(root: Path, case: Case) -> Path:
    """A damaged tree at ``root/<name>/prefix``; ``root/<name>/outside`` is outside of it."""
    base = root / case.name
    prefix, outside = base / "prefix", base / "outside"
    base.mkdir(parents=True)
    outside.mkdir()
    build_valid(prefix)
    assert tensordict_rs.verify(prefix) == []
    case.damage(prefix, outside)
    return prefix


def check_load_refused(prefix: Path, case: Case) -> str:
    """Returns a problem description, or '' when the load was refused as it should be."""
    try:
        td = TensorDict.load_memmap(prefix)
    except ALLOWED as err:
        message = str(err)
        if not any(m in message for m in case.mentions):
            return f"message names neither key nor path {case.mentions}: {message!r}"
        if (prefix.parent / "outside" / "UNPICKLED").exists():
            return "a pickle was unpickled"
        return ""
    except BaseException as err:  # any other exception is a failure of the test
        return f"raised {type(err).__name__}: {err}"
    return f"loaded instead of failing: {td!r}"


def cli_status(prefix: Path) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        status = cli_main(["verify", os.fspath(prefix)])
    return status, out.getvalue()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_directory(tmp_path: Path, case: Case) -> None:
    prefix = make_case(tmp_path, case)
    problem = check_load_refused(prefix, case)
    assert problem == "", problem
    problems = tensordict_rs.verify(prefix)
    assert problems, "verify() found nothing wrong"
    assert all(isinstance(p, str) and p for p in problems)
    status, output = cli_status(prefix)
    assert status == 1, output
    assert "problem" in output


def test_hostile_cli_subprocess_and_figure(tmp_path: Path) -> None:
    """The real command line, once over every case (one interpreter start for all)."""
    prefixes = {case.name: make_case(tmp_path, case) for case in CASES}
    handled = 0
    failures = []
    for case in CASES:
        prefix = prefixes[case.name]
        problem = check_load_refused(prefix, case) or (
            "" if tensordict_rs.verify(prefix) else "verify() returned no problem"
        )
        if problem:
            failures.append(f"{case.name}: {problem}")
        else:
            handled += 1
    result = subprocess.run(
        [sys.executable, "-m", "tensordict_rs", "verify", *map(os.fspath, prefixes.values())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    for name, prefix in prefixes.items():
        line = next(
            (ln for ln in result.stdout.splitlines() if ln.startswith(f"{os.fspath(prefix)}: ")),
            None,
        )
        if line is None or "problem" not in line:
            failures.append(f"{name}: the command line did not report it: {line!r}")
    print(f"\nhostile cases handled: {handled} out of {len(CASES)}")
    assert not failures, "\n".join(failures)
    # one case alone exits 1 too (each case alone goes through cli_main in-process above)
    one = subprocess.run(
        [sys.executable, "-m", "tensordict_rs", "verify", os.fspath(prefixes["symlink_subdir"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert one.returncode == 1, (one.stdout, one.stderr)


# --------------------------------------------------------------------------- valid variations


def assert_loads_like(prefix: Path, expected: TensorDict) -> None:
    loaded = TensorDict.load_memmap(prefix)
    for k in ("a", "b"):
        assert torch.equal(loaded[k], expected[k])
    assert torch.equal(loaded["n", "x"], expected["n", "x"])
    assert torch.equal(loaded["n", "deep", "y"], expected["n", "deep", "y"])
    assert loaded["s"] == "hello"
    assert tensordict_rs.verify(prefix) == []
    assert cli_status(prefix)[0] == 0


def test_longer_data_file_loads(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    expected = build_valid(prefix)
    with open(prefix / "a.memmap", "ab") as f:
        f.write(b"\xff" * 100)
    with open(prefix / "n" / "deep" / "y.memmap", "ab") as f:
        f.write(b"\x01")
    assert_loads_like(prefix, expected)
    # the extra bytes are ignored, not exposed
    assert TensorDict.load_memmap(prefix)["a"].shape == (3, 4)


def test_unknown_extra_entries_are_ignored(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    expected = build_valid(prefix)
    (prefix / "extra").mkdir()
    (prefix / "extra" / "meta.json").write_text("{garbage")
    (prefix / "n" / "other").mkdir()
    (prefix / "stale.memmap").write_bytes(b"\0" * 5)
    (prefix / "notes.txt").write_text("mine")
    assert_loads_like(prefix, expected)


def test_legacy_meta_without_version_and_class_loads(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    expected = build_valid(prefix)
    for rel in ("meta.json", "n/meta.json", "n/deep/meta.json"):
        meta = read_meta(prefix, rel)
        del meta["_format_version"], meta["_class"]
        write_meta(prefix, meta, rel)
    assert_loads_like(prefix, expected)


def test_saved_accelerator_device_is_honoured_or_refused_clearly(tmp_path: Path) -> None:
    """A meta.json naming another device moves the leaves there, as tensordict does; where that
    device does not exist the load fails with an error naming meta.json, and device="cpu"
    still loads the data."""
    prefix = tmp_path / "tree"
    TensorDict({"a": torch.arange(3.0)}, [3]).memmap_(prefix)
    meta = json.loads((prefix / "meta.json").read_text())
    meta["device"] = "cuda:0"
    (prefix / "meta.json").write_text(json.dumps(meta))
    if torch.cuda.is_available():
        loaded = TensorDict.load_memmap(prefix)
        assert loaded.device == torch.device("cuda:0")
        assert loaded["a"].device == torch.device("cuda:0")
    else:
        with pytest.raises(tensordict_rs.TensorDictError, match=r"meta\.json.*cuda:0"):
            TensorDict.load_memmap(prefix)
    on_cpu = TensorDict.load_memmap(prefix, device="cpu")
    assert on_cpu.device == torch.device("cpu")
    assert torch.equal(on_cpu["a"], torch.arange(3.0))
