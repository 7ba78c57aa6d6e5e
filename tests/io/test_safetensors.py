"""safetensors both ways, checked against the ``safetensors`` Python package."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch as st
import tensordict_rs
import torch
from safetensors import safe_open
from tensordict_rs import TensorDict

# Every dtype the safetensors package maps to torch.
DTYPES = sorted(set(st._TYPES.values()), key=str)


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random bytes of ``dtype`` (any bit pattern: float8 and complex included)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    n = itemsize * int(torch.Size(shape).numel())
    raw = torch.randint(
        0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of dtype, shape and bytes."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def test_all_dtypes_are_covered() -> None:
    names = {str(d) for d in DTYPES}
    assert {"torch.float8_e4m3fn", "torch.bfloat16", "torch.complex64", "torch.uint64"} <= names
    assert len(DTYPES) >= 18


def test_reads_what_the_package_writes(tmp_path: Path) -> None:
    tensors = {f"{str(d)[6:]}.t": random_tensor(d, (3, 5), i) for i, d in enumerate(DTYPES)}
    tensors["flat"] = torch.arange(7, dtype=torch.int64)
    tensors["empty"] = torch.zeros(0, 4)
    path = tmp_path / "pkg.safetensors"
    st.save_file(tensors, path, metadata={"format": "pt"})
    td = TensorDict.from_safetensors(path)
    for name, tensor in tensors.items():
        key = tuple(name.split("."))
        assert same(td[key], tensor), name
    flat = TensorDict.from_safetensors(path, separator=None)
    assert set(flat.keys()) == set(tensors)
    assert same(flat["float32.t"], tensors["float32.t"])


def test_package_reads_what_we_write(tmp_path: Path) -> None:
    td = TensorDict({str(d)[6:]: random_tensor(d, (4, 2, 3), i) for i, d in enumerate(DTYPES)}, [4])
    td["nested"] = {"deep": {"x": torch.arange(12.0).reshape(4, 3)}}
    td["strided"] = torch.arange(24, dtype=torch.int32).reshape(3, 8).t()[:4]  # not contiguous
    td["label"] = "hello"
    path = tmp_path / "ours.safetensors"
    td.to_safetensors(path, metadata={"format": "pt"})
    loaded = st.load_file(path)
    assert set(loaded) == {str(d)[6:] for d in DTYPES} | {"nested.deep.x", "strided"}
    for d in DTYPES:
        assert same(loaded[str(d)[6:]], td[str(d)[6:]]), d
    assert same(loaded["nested.deep.x"], td["nested", "deep", "x"])
    assert same(loaded["strided"], td["strided"].contiguous())
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt"
    assert json.loads(meta["tensordict_rs.non_tensor"]) == {"label": "hello"}
    assert json.loads(meta["tensordict_rs.batch_sizes"])[""] == [4]


def test_same_bytes_as_the_package(tmp_path: Path) -> None:
    tensors = {"b": torch.ones(3, dtype=torch.bool), "w": torch.rand(5, 7), "i": torch.arange(9)}
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    TensorDict(tensors, []).to_safetensors(ours)
    st.save_file(tensors, theirs)
    assert ours.read_bytes() == theirs.read_bytes()


def test_round_trip_keeps_the_tree(tmp_path: Path) -> None:
    td = TensorDict(
        {
            "obs": torch.rand(6, 3),
            "next": {"done": torch.zeros(6, 1, dtype=torch.bool)},
            "sub": TensorDict({"x": torch.ones(6, 2, 5)}, [6, 2]),
            "info": tensordict_rs.NonTensorData({"step": 3, "tags": ["a", "b"]}),
            "empty": torch.zeros(6, 0),
        },
        [6],
    )
    path = tmp_path / "tree.safetensors"
    td.to_safetensors(path, separator="/")
    back = TensorDict.from_safetensors(path, separator="/")
    assert repr(back) == repr(td)
    assert back["sub"].batch_size == torch.Size([6, 2])
    assert back["info"] == {"step": 3, "tags": ["a", "b"]}
    assert all(
        same(back[k], td[k])
        for k in td.keys(include_nested=True, leaves_only=True)
        if isinstance(td[k], torch.Tensor)
    )
    over = TensorDict.from_safetensors(path, separator="/", batch_size=[])
    assert over.batch_size == torch.Size([]) and over["sub"].batch_size == torch.Size([])


def test_from_a_saved_directory(tmp_path: Path) -> None:
    """Lazy memory-mapped leaves are written straight from their maps."""
    TensorDict({"a": torch.arange(10.0), "n": {"b": torch.ones(10, 2)}}, [10]).memmap(
        tmp_path / "d"
    )
    loaded = TensorDict.load_memmap(tmp_path / "d")
    loaded.to_safetensors(tmp_path / "d.safetensors")
    got = st.load_file(tmp_path / "d.safetensors")
    assert same(got["a"], torch.arange(10.0)) and same(got["n.b"], torch.ones(10, 2))


def test_memory_mapped_copy_on_write(tmp_path: Path) -> None:
    path = tmp_path / "ro.safetensors"
    st.save_file({"x": torch.zeros(1000), "y": torch.ones(10)}, path)
    before = path.read_bytes()
    os.chmod(path, 0o444)
    td = TensorDict.from_safetensors(path)
    td["x"][0] = 5.0  # a private page: the file does not change, even read-only
    assert td["x"][0] == 5.0
    assert path.read_bytes() == before
    fresh = TensorDict.from_safetensors(path)
    assert fresh["x"][0] == 0.0
    # both tensors view one map of the file: their addresses are inside it
    ptrs = sorted(t.data_ptr() for t in (fresh["x"], fresh["y"]))
    assert ptrs[1] - ptrs[0] < path.stat().st_size


def handmade(path: Path, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # data starts 8-aligned, as the package writes it
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_misaligned_tensors_are_copied(tmp_path: Path) -> None:
    """Other writers may place a float32 at an odd offset; the values still come out right."""
    path = tmp_path / "odd.safetensors"
    values = torch.tensor([1.5, -2.25])
    header = {
        "b": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]},
        "f": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]},
    }
    handmade(path, header, bytes([1, 0, 1]) + values.numpy().tobytes())
    td = TensorDict.from_safetensors(path)
    assert same(td["f"], values) and td["b"].tolist() == [True, False, True]
    assert same(st.load_file(path)["f"], values)


def test_damaged_files_raise_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    st.save_file({"x": torch.rand(100)}, path)
    good = path.read_bytes()
    path.write_bytes(good[:-1])
    with pytest.raises(tensordict_rs.InvalidDirectoryError, match=r"bad\.safetensors"):
        TensorDict.from_safetensors(path)
    path.write_bytes(b"\xff" * 16)
    with pytest.raises(tensordict_rs.InvalidDirectoryError, match="not a valid safetensors"):
        TensorDict.from_safetensors(path)
    handmade(path, {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, bytes(8))
    with pytest.raises(tensordict_rs.InvalidDirectoryError):
        TensorDict.from_safetensors(path)
    handmade(path, {"__metadata__": {"tensordict_rs.batch_sizes": "[oops"}}, b"")
    with pytest.raises(tensordict_rs.InvalidDirectoryError, match="__metadata__"):
        TensorDict.from_safetensors(path)
    handmade(
        path,
        {
            "__metadata__": {"tensordict_rs.batch_sizes": '{"": [3]}'},
            "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        },
        bytes(8),
    )
    with pytest.raises(tensordict_rs.InvalidTreeError, match=r"bad\.safetensors"):
        TensorDict.from_safetensors(path)
    with pytest.raises(FileNotFoundError):
        TensorDict.from_safetensors(tmp_path / "nope.safetensors")


def test_names_that_do_not_make_a_tree(tmp_path: Path) -> None:
    path = tmp_path / "clash.safetensors"
    st.save_file({"a": torch.ones(2), "a.b": torch.zeros(2)}, path)
    with pytest.raises(tensordict_rs.InvalidTreeError, match="separator"):
        TensorDict.from_safetensors(path)
    assert set(TensorDict.from_safetensors(path, separator=None).keys()) == {"a", "a.b"}


def test_refused_writes_leave_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "keep.safetensors"
    TensorDict({"x": torch.ones(3)}, []).to_safetensors(path)
    before = path.read_bytes()
    with pytest.raises(tensordict_rs.InvalidTreeError, match="separator"):
        TensorDict({"a.b": torch.ones(3)}, []).to_safetensors(path)
    with pytest.raises(tensordict_rs.InvalidTreeError, match="complex128"):
        TensorDict({"c": torch.ones(3, dtype=torch.complex128)}, []).to_safetensors(path)
    with pytest.raises(tensordict_rs.InvalidTreeError, match="pickle"):
        TensorDict({"o": torch.ones(3), "v": object()}, []).to_safetensors(path)
    with pytest.raises(ValueError, match="reserved"):
        TensorDict({"x": torch.ones(3)}, []).to_safetensors(
            path, metadata={"tensordict_rs.batch_sizes": "{}"}
        )
    with pytest.raises(FileNotFoundError):
        TensorDict({"x": torch.ones(3)}, []).to_safetensors(tmp_path / "no" / "f.safetensors")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.safetensors"]
    # a replaced file is a new inode: maps of the old file keep their values
    old = TensorDict.from_safetensors(path)
    TensorDict({"x": torch.full((3,), 7.0)}, []).to_safetensors(path)
    assert old["x"].tolist() == [1.0, 1.0, 1.0]
    assert TensorDict.from_safetensors(path)["x"].tolist() == [7.0, 7.0, 7.0]


_WRITE_FOREVER = """
import sys, torch, tensordict_rs as rs
td = rs.TensorDict({"x": torch.ones(64 << 20, dtype=torch.uint8)}, [])
print("ready", flush=True)
while True:
    td.to_safetensors(sys.argv[1])
"""


@pytest.mark.skipif(sys.platform == "win32", reason="flock is unix-only")
def test_a_killed_write_leaves_nothing_the_next_write_keeps(tmp_path: Path) -> None:
    """A write killed before its rename left the ``safetensors`` crate's ``.tmpXXXXXX`` file
    (64 MiB here) beside the target for good: nothing could tell it from a file of the user's.
    Writes now go through a locked staging file named for the target, as ``.tdz`` archives,
    which the next write removes once its writer is dead; the user's files stay."""
    import signal
    import time

    path = tmp_path / "m.safetensors"
    TensorDict({"x": torch.zeros(3)}, []).to_safetensors(path)
    (tmp_path / ".tmpABC123").write_bytes(b"the user's")  # the crate's pattern: never touched
    script = tmp_path / "forever.py"
    script.write_text(_WRITE_FOREVER)
    for _ in range(20):  # until a kill lands while a staging file exists
        argv = [sys.executable, os.fspath(script), os.fspath(path)]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as child:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                staged = [n for n in os.listdir(tmp_path) if n.startswith(".m.safetensors.tdrs-")]
                if staged:
                    break
            child.send_signal(signal.SIGKILL)
        staged = [n for n in os.listdir(tmp_path) if n.startswith(".m.safetensors.tdrs-")]
        if staged:
            break
    assert staged, "no kill landed during a write"
    assert sorted(n for n in os.listdir(tmp_path) if not n.startswith(".m.")) == [
        ".tmpABC123",
        "forever.py",
        "m.safetensors",
    ]
    loaded = TensorDict.from_safetensors(path)  # the old file or a whole new one
    assert loaded["x"].numel() in (3, 64 << 20)
    del loaded
    TensorDict({"x": torch.full((2,), 5.0)}, []).to_safetensors(path)
    assert sorted(os.listdir(tmp_path)) == [".tmpABC123", "forever.py", "m.safetensors"]
    assert (tmp_path / ".tmpABC123").read_bytes() == b"the user's"
    assert st.load_file(path)["x"].tolist() == [5.0, 5.0]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes and symlinks")
def test_a_rewrite_keeps_the_mode_and_writes_through_a_symlink(tmp_path: Path) -> None:
    """A symlink given as the path is followed (the file it names gets the new contents, the
    link stays) and a replaced file keeps its permission bits, as for ``.tdz`` archives (the
    crate's temporary file replaced the link by a file, and made every file 0600); a new file
    is 0600, as the package's ``save_file`` makes it."""
    real = tmp_path / "real.safetensors"
    link = tmp_path / "link.safetensors"
    TensorDict({"x": torch.zeros(2)}, []).to_safetensors(real)
    real.chmod(0o640)
    link.symlink_to(real)
    TensorDict({"x": torch.ones(2)}, []).to_safetensors(link)
    assert link.is_symlink() and os.readlink(link) == os.fspath(real)
    assert st.load_file(real)["x"].tolist() == [1.0, 1.0]
    assert real.stat().st_mode & 0o777 == 0o640
    fresh = tmp_path / "fresh.safetensors"
    TensorDict({"x": torch.zeros(2)}, []).to_safetensors(fresh)
    st.save_file({"x": torch.zeros(2)}, tmp_path / "package.safetensors")
    assert fresh.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "package.safetensors").stat().st_mode & 0o777 == 0o600


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensordict_rs", *args], capture_output=True, text=True, timeout=120
    )


def test_convert_both_ways(tmp_path: Path) -> None:
    td = TensorDict({"obs": torch.rand(5, 2), "n": {"r": torch.arange(5)}, "name": "run-1"}, [5])
    td.memmap(tmp_path / "dir")
    out = cli("convert", str(tmp_path / "dir"), str(tmp_path / "f.safetensors"))
    assert out.returncode == 0, out.stderr
    got = st.load_file(tmp_path / "f.safetensors")
    assert same(got["obs"], td["obs"]) and same(got["n.r"], td["n", "r"])
    out = cli("convert", str(tmp_path / "f.safetensors"), str(tmp_path / "back"))
    assert out.returncode == 0, out.stderr
    back = TensorDict.load_memmap(tmp_path / "back")
    assert repr(back) == repr(TensorDict.load_memmap(tmp_path / "dir"))
    assert (back == td).all()
    assert cli("verify", str(tmp_path / "back")).returncode == 0
    again = cli("convert", str(tmp_path / "dir"), str(tmp_path / "f.safetensors"))
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert cli("convert", str(tmp_path / "nope"), str(tmp_path / "x")).returncode == 2
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    bad = cli("convert", str(tmp_path / "junk.safetensors"), str(tmp_path / "junk"))
    assert bad.returncode == 1 and "junk.safetensors" in bad.stderr
    assert not (tmp_path / "junk").exists()


def test_sub_trees_without_tensors_come_back(tmp_path: Path) -> None:
    """Empty sub-trees were dropped on the way through a .safetensors file (and through the
    command line's convert), though a directory or .tdz keeps them; they are now recorded with
    the batch sizes and made again."""
    from tensordict_rs import TensorDict

    td = TensorDict(
        {"x": torch.zeros(3), "a": TensorDict({}, [3, 2]), "b": {"c": {}, "y": torch.ones(3)}},
        [3],
    )
    td.to_safetensors(tmp_path / "t.safetensors")
    back = TensorDict.from_safetensors(tmp_path / "t.safetensors")
    assert set(back.keys(include_nested=True)) == set(td.keys(include_nested=True))
    assert back["a"].batch_size == (3, 2) and back["b", "c"].batch_size == (3,)
    assert back["b", "y"].tolist() == [1.0] * 3
