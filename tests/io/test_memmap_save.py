"""memmap_, memmap and memmap_like."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from tensordict_rs import MemoryMappedTensor, TensorDict, TensorDictFuture

from .._trees import CPU, META, SOURCE_A, file_floats, make_td

# --------------------------------------------------------------------------------- memmap_


def test_memmap_anonymous() -> None:
    td = make_td()
    assert td.memmap_() is td
    assert td.is_memmap() and td.is_locked
    assert td.device == CPU
    assert td.saved_path is None
    for key in td.keys(include_nested=True, leaves_only=True):
        if key != "s":
            assert isinstance(td[key], MemoryMappedTensor)
            assert td[key]._filename is None
    assert torch.equal(td["a"], SOURCE_A)
    assert td["n"].is_memmap() and td["n", "deep"].is_memmap() and td["n", "deep"].is_locked
    # A second call is a no-op that keeps the same leaves.
    a = td["a"]
    assert td.memmap_() is td
    assert td["a"] is a and td.is_locked


def test_memmap_prefix(tmp_prefix: Path) -> None:
    td = make_td()
    td.memmap_(tmp_prefix)
    assert td.saved_path == tmp_prefix
    assert isinstance(td.saved_path, Path)
    assert td["n"].saved_path == tmp_prefix / "n"
    assert td["a"].filename == str(tmp_prefix / "a.memmap")
    assert td["n", "deep", "y"].filename == str(tmp_prefix / "n" / "deep" / "y.memmap")
    assert sorted(str(p.relative_to(tmp_prefix)) for p in tmp_prefix.rglob("*")) == [
        "a.memmap",
        "meta.json",
        "n",
        "n/deep",
        "n/deep/meta.json",
        "n/deep/y.memmap",
        "n/meta.json",
        "n/x.memmap",
        "s",
        "s/meta.json",
    ]
    meta = json.loads((tmp_prefix / "meta.json").read_text())
    assert meta["shape"] == [4, 3]
    assert meta["device"] == "cpu"
    assert meta["a"] == {
        "device": "cpu",
        "shape": [4, 3, 2],
        "dtype": "torch.float32",
        "is_nested": False,
    }
    assert meta["n"] == {"type": "TensorDict"}
    assert meta["s"] == {"type": "NonTensorData"}
    assert json.loads((tmp_prefix / "n" / "deep" / "meta.json").read_text())["shape"] == [4, 3, 5]
    assert json.loads((tmp_prefix / "s" / "meta.json").read_text())["data"] == "text"
    assert (tmp_prefix / "a.memmap").read_bytes() == SOURCE_A.numpy().tobytes()
    # Writes through the leaves reach the files.
    td["a"][0, 0, 0] = 99.0
    td.flush()
    assert file_floats(tmp_prefix / "a.memmap")[0] == 99.0


def test_memmap_locked_tensordict(tmp_prefix: Path) -> None:
    td = make_td().lock_()
    assert td.memmap_(tmp_prefix) is td
    assert td.is_locked and td.is_memmap()
    assert isinstance(td["n", "x"], MemoryMappedTensor)


def test_memmap_creates_missing_parents(tmp_prefix: Path) -> None:
    target = tmp_prefix / "deeper" / "still"
    TensorDict({"a": torch.arange(3.0)}, [3]).memmap_(target)
    assert file_floats(target / "a.memmap") == [0.0, 1.0, 2.0]
    assert (target / "meta.json").is_file()


def test_memmap_odd_keys(tmp_prefix: Path) -> None:
    td = TensorDict({"odd/key with space": torch.arange(3.0), "a.b": torch.ones(3)}, [3])
    td.memmap_(tmp_prefix)
    assert (tmp_prefix / "odd%2Fkey%20with%20space.memmap").is_file()
    assert (tmp_prefix / "a.b.memmap").is_file()
    loaded = TensorDict.load_memmap(tmp_prefix)
    assert sorted(loaded.keys()) == ["a.b", "odd/key with space"]
    assert loaded["odd/key with space"].tolist() == [0.0, 1.0, 2.0]


def test_memmap_prefix_as_str_and_device_reset(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.zeros(2)}, [2])
    assert td.device is None
    td.memmap_(str(tmp_prefix))
    assert td.saved_path == tmp_prefix
    assert td.device == CPU


def test_memmap_from_device(tmp_prefix: Path) -> None:
    if torch.cuda.is_available():
        td = TensorDict({"a": torch.arange(3.0)}, [3], device="cuda:0")
        td.memmap_(tmp_prefix)
        assert td.device == CPU and isinstance(td["a"], MemoryMappedTensor)
        assert td["a"].tolist() == [0.0, 1.0, 2.0]
    else:
        td = TensorDict({"a": torch.empty(3)}, [3], device="meta")
        with pytest.raises(NotImplementedError):
            td.memmap_(tmp_prefix)
        assert td.device == META and not td.is_memmap() and not td.is_locked


def test_memmap_same_prefix_again_keeps_leaves(tmp_prefix: Path) -> None:
    """Saving again to the same directory: earlier references to the leaves still reach it."""
    td = TensorDict({"a": torch.zeros(3)}, [3])
    td.memmap_(tmp_prefix)
    a = td["a"]
    td.memmap_(tmp_prefix)
    assert td.is_locked and td.is_memmap()
    a.fill_(4.0)
    td.flush()
    assert td["a"].tolist() == [4.0, 4.0, 4.0]
    assert file_floats(tmp_prefix / "a.memmap") == [4.0, 4.0, 4.0]


def test_memmap_after_unlock_adds_key(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.arange(3.0)}, [3]).memmap_(tmp_prefix)
    td.unlock_()
    td["b"] = torch.ones(3)
    td.memmap_()
    assert td.is_locked and td.is_memmap()
    assert td.saved_path == tmp_prefix
    assert td["b"].filename == str(tmp_prefix / "b.memmap")
    assert file_floats(tmp_prefix / "b.memmap") == [1.0, 1.0, 1.0]
    assert file_floats(tmp_prefix / "a.memmap") == [0.0, 1.0, 2.0]
    loaded = TensorDict.load_memmap(tmp_prefix)
    assert loaded.keys() == ["a", "b"]


def test_memmap_copy_existing(tmp_path: Path) -> None:
    td = TensorDict({"a": torch.arange(3.0), "n": {"b": torch.ones(3)}}, [3])
    td.memmap_(tmp_path / "first")
    with pytest.raises(RuntimeError, match=r"A filename was provided.*copy_existing=True"):
        td.memmap_(tmp_path / "second")
    assert td.saved_path == tmp_path / "first"
    assert td.is_locked and td.is_memmap()
    assert td.memmap_(tmp_path / "second", copy_existing=True) is td
    assert td.saved_path == tmp_path / "second"
    assert td["a"].filename == str(tmp_path / "second" / "a.memmap")
    assert td["n", "b"].filename == str(tmp_path / "second" / "n" / "b.memmap")
    assert td["a"].tolist() == [0.0, 1.0, 2.0]
    # The two directories are independent.
    td["a"].fill_(7.0)
    td.flush()
    assert file_floats(tmp_path / "first" / "a.memmap") == [0.0, 1.0, 2.0]
    assert file_floats(tmp_path / "second" / "a.memmap") == [7.0, 7.0, 7.0]


def test_memmap_existsok(tmp_prefix: Path) -> None:
    TensorDict({"a": torch.zeros(3)}, [3]).memmap_(tmp_prefix)
    td = TensorDict({"a": torch.ones(3)}, [3])
    with pytest.raises(FileExistsError):
        td.memmap_(tmp_prefix, existsok=False)
    # A failed save leaves the TensorDict as it was.
    assert not td.is_memmap() and not td.is_locked
    assert type(td["a"]) is torch.Tensor
    assert file_floats(tmp_prefix / "a.memmap") == [0.0, 0.0, 0.0]
    # existsok=True (the default) overwrites.
    td.memmap_(tmp_prefix)
    assert file_floats(tmp_prefix / "a.memmap") == [1.0, 1.0, 1.0]
    fresh = TensorDict({"a": torch.ones(3)}, [3])
    fresh.memmap_(tmp_prefix.parent / "fresh", existsok=False)
    assert fresh.is_memmap()


@pytest.mark.parametrize("num_threads", [0, 1, 2, 4])
def test_memmap_num_threads(tmp_path: Path, num_threads: int) -> None:
    leaves = {f"k{i}": torch.randn(8, i + 1) for i in range(20)}
    td = TensorDict({**leaves, "n": {"x": torch.arange(8)}}, [8])
    expected = td.clone()
    td.memmap_(tmp_path / "a", num_threads=num_threads)
    assert (td == expected).all()
    assert (TensorDict.load_memmap(tmp_path / "a") == expected).all()
    copy = expected.memmap(tmp_path / "b", num_threads=num_threads)
    assert (copy == expected).all()
    anonymous = expected.clone().memmap_(num_threads=num_threads)
    assert (anonymous == expected).all()


def test_memmap_return_early(tmp_prefix: Path) -> None:
    """As tensordict: a TensorDictFuture with num_threads > 1, else the finished TensorDict."""
    td = make_td()
    future = td.memmap_(tmp_prefix, num_threads=2, return_early=True)
    assert isinstance(future, TensorDictFuture)
    assert future.result() is td
    assert td.is_memmap() and td.is_locked
    assert torch.equal(td["a"], SOURCE_A)
    copy_future = make_td().memmap(num_threads=2, return_early=True)
    assert isinstance(copy_future, TensorDictFuture)
    copy = copy_future.result()
    assert isinstance(copy, TensorDict) and copy.is_memmap()
    assert torch.equal(copy["a"], SOURCE_A)
    like = make_td().memmap_like(return_early=True)  # one thread: done on return
    assert isinstance(like, TensorDict) and torch.equal(like["a"], torch.zeros_like(SOURCE_A))
    # Errors arrive through the future.
    failing = TensorDict({"a": torch.zeros(3)}, [3]).memmap_(
        tmp_prefix, existsok=False, return_early=True, num_threads=2
    )
    with pytest.raises(FileExistsError):
        failing.result()


_EXIT_BEFORE_THE_SAVE_ENDS = """
import sys, time, torch
import tensordict_rs as rs
from tensordict_rs.io import archive, directory
def slowed(save):  # the program ends while the save still runs
    def slow_save(*args, **kwargs):
        time.sleep(1.0)
        return save(*args, **kwargs)
    return slow_save
directory.save = slowed(directory.save)
archive.write = slowed(archive.write)
td = rs.TensorDict({"a": torch.arange(10.0), "b": {"c": torch.ones(3, dtype=torch.int8)}}, [])
td.memmap(sys.argv[1], num_threads=2, return_early=True)
td.memmap(sys.argv[2], num_threads=2, return_early=True, archive=True)
"""


def test_a_returned_early_save_finishes_before_the_program_ends(tmp_path: Path) -> None:
    """A program that ends without waiting for its ``return_early`` saves still saves them,
    as tensordict does (its executor's threads are joined at exit): the save ran in a daemon
    thread, so the directory was never written when the program ended first (found by trying
    a 1 GiB save). In a child process; the save is slowed down so it is still running."""
    import subprocess
    import sys

    script = tmp_path / "early.py"
    script.write_text(_EXIT_BEFORE_THE_SAVE_ENDS)
    target, archive = tmp_path / "saved", tmp_path / "saved.tdz"
    done = subprocess.run(
        [sys.executable, os.fspath(script), os.fspath(target), os.fspath(archive)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for path in (target, archive):
        loaded = TensorDict.load_memmap(path)
        assert torch.equal(loaded["a"], torch.arange(10.0)), path
        assert torch.equal(loaded["b", "c"], torch.ones(3, dtype=torch.int8)), path


_FAILING_EARLY_SAVES = """
import sys, torch
import tensordict_rs as rs
bad = lambda: rs.TensorDict({"a": torch.zeros(3), "cfg": {1, 2}}, [3])
bad().memmap(sys.argv[1] + "/dropped", return_early=True, num_threads=2)
kept = bad().memmap(sys.argv[1] + "/kept", return_early=True, num_threads=2)
asked = bad().memmap(sys.argv[1] + "/asked", return_early=True, num_threads=2)
try:
    asked.result()
except rs.InvalidTreeError:
    print("raised", flush=True)
print("end", flush=True)
"""


def test_a_failed_early_save_nobody_asked_about_is_reported(tmp_path: Path) -> None:
    """A ``return_early`` save that fails (here a value that is not JSON: tensordict pickles
    it) raised only through ``result()``: a program that never called it ended with status 0,
    nothing saved, and no word (found by an attack). The error is now written to stderr when
    the future is dropped, or at exit if it is still held; ``result()`` raising it silences
    it."""
    import subprocess
    import sys

    script = tmp_path / "failing.py"
    script.write_text(_FAILING_EARLY_SAVES)
    done = subprocess.run(
        [sys.executable, os.fspath(script), os.fspath(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["raised", "end"]
    headline = "a save started with return_early=True failed, and its error was never retrieved"
    assert done.stderr.count(headline) == 2, done.stderr
    assert done.stderr.count("key 'cfg': a value of type set") == 2, done.stderr
    assert not any((tmp_path / name).exists() for name in ("dropped", "kept", "asked"))


def test_memmap_durable(tmp_prefix: Path) -> None:
    td = make_td()
    td.memmap_(tmp_prefix, durable=True)
    assert (TensorDict.load_memmap(tmp_prefix) == make_td()).all()
    copy = make_td().memmap(tmp_prefix.parent / "copy", durable=True)
    assert copy.saved_path == tmp_prefix.parent / "copy"


def test_memmap_requires_grad_leaf() -> None:
    td = TensorDict({"a": torch.ones(3, requires_grad=True)}, [3])
    td.memmap_()
    assert isinstance(td["a"], MemoryMappedTensor)
    assert not td["a"].requires_grad
    assert torch.equal(td["a"], torch.ones(3))


def test_memmap_empty_leaf(tmp_prefix: Path) -> None:
    td = TensorDict({"e": torch.zeros(3, 0), "a": torch.ones(3)}, [3]).memmap_(tmp_prefix)
    assert td["e"].shape == (3, 0)
    assert not (tmp_prefix / "e.memmap").exists()
    loaded = TensorDict.load_memmap(tmp_prefix)
    assert loaded["e"].shape == (3, 0) and loaded["e"].dtype == torch.float32


# ----------------------------------------------------------------------------- memmap / memmap_like


def test_memmap_returns_new(tmp_prefix: Path) -> None:
    td = make_td()
    out = td.memmap(tmp_prefix)
    assert out is not td
    assert out.is_memmap() and out.is_locked and out.device == CPU
    assert out.saved_path == tmp_prefix
    assert not td.is_memmap() and not td.is_locked
    assert type(td["a"]) is torch.Tensor
    assert isinstance(out["a"], MemoryMappedTensor)
    assert out["a"].data_ptr() != td["a"].data_ptr()
    assert (out == td).all()
    assert out["s"] == "text"
    out["a"].fill_(0)
    assert torch.equal(td["a"], SOURCE_A)
    anonymous = td.memmap()
    assert anonymous.saved_path is None and anonymous.is_memmap()


def test_memmap_like(tmp_prefix: Path) -> None:
    td = make_td()
    like = td.memmap_like(tmp_prefix)
    assert like is not td
    assert like.is_memmap() and like.is_locked and like.device == CPU
    assert like.saved_path == tmp_prefix
    assert not td.is_locked and not td.is_memmap()
    assert like.keys(include_nested=True) == td.keys(include_nested=True)
    for key in td.keys(include_nested=True, leaves_only=True):
        if key == "s":
            assert like[key] == "text"
            continue
        assert isinstance(like[key], MemoryMappedTensor)
        assert like[key].shape == td[key].shape and like[key].dtype == td[key].dtype
        assert not like[key].any()
        assert like[key].data_ptr() != td[key].data_ptr()
    assert like["n", "deep"].batch_size == torch.Size([4, 3, 5])
    assert (tmp_prefix / "a.memmap").stat().st_size == SOURCE_A.numel() * 4
    anonymous = td.memmap_like()
    assert anonymous.saved_path is None and not anonymous["a"].any()


def test_memmap_like_from_meta_and_expanded() -> None:
    meta = TensorDict({"a": torch.empty(1000, 3, device="meta")}, [1000])
    like = meta.memmap_like()
    assert like.device == CPU
    assert like["a"].device == CPU and like["a"].shape == (1000, 3)
    assert not like["a"].any()
    expanded = TensorDict({"a": torch.zeros(()).expand(100_000)}, [100_000]).memmap_like()
    assert expanded["a"].shape == (100_000,) and expanded["a"].is_contiguous()


def test_memmap_copy_existing_applies_to_the_new_tensordict(tmp_path):
    source = TensorDict({"a": torch.arange(4.0)}, [4]).memmap_(tmp_path / "first")
    with pytest.raises(RuntimeError, match="copy_existing=True"):
        source.memmap(tmp_path / "second")
    copy = source.memmap(tmp_path / "second", copy_existing=True)
    assert copy["a"].filename == str(tmp_path / "second" / "a.memmap")
    assert torch.equal(copy["a"], torch.arange(4.0))
    assert source["a"].filename == str(tmp_path / "first" / "a.memmap")


# ------------------------------------------------------------------ a directory it cannot write


def _drop_dac_capabilities() -> None:
    """(in a forked child) Drops CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER, so
    that permission bits apply to root as to any user (``capset``; nothing to do otherwise)."""
    import ctypes

    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # (effective, permitted, inheritable) x 2 words
    assert libc.capget(header, data) == 0, ctypes.get_errno()
    for word in (0, 1):  # effective and permitted of the first word
        data[word] &= ~((1 << 1) | (1 << 2) | (1 << 3))
    assert libc.capset(header, data) == 0, ctypes.get_errno()


def test_save_into_a_read_only_sub_directory_changes_nothing(tmp_path: Path) -> None:
    """A re-save that must change a read-only sub-directory stopped after its commit point
    (the root's data file replaced, its meta.json moved aside): neither library loaded the
    tree until the permission was fixed. It is now refused before the commit point, naming
    the directory, and the old tree stays loadable by both."""
    import tensordict

    prefix = tmp_path / "t"
    TensorDict({"a": torch.zeros(3), "n": {"c": torch.zeros(3)}}, [3]).memmap(prefix)
    before = {p.name: p.read_bytes() for p in prefix.rglob("*") if p.is_file()}
    (prefix / "n").chmod(0o555)
    try:
        pid = os.fork()
        if pid == 0:  # the save runs where permission bits apply
            code = 1
            try:
                _drop_dac_capabilities()
                new = {"a": torch.ones(3), "n": {"c": torch.ones(3), "new": torch.ones(3)}}
                try:
                    TensorDict(new, [3]).memmap(prefix)
                except PermissionError as err:
                    code = 0 if err.filename == str(prefix / "n") else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        (prefix / "n").chmod(0o755)
    assert {p.name: p.read_bytes() for p in prefix.rglob("*") if p.is_file()} == before
    for lib in (TensorDict, tensordict.TensorDict):
        loaded = lib.load_memmap(prefix)
        assert loaded["a"].tolist() == [0.0] * 3 and loaded["n", "c"].tolist() == [0.0] * 3
