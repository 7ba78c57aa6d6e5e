"""A save touches only what it owns (issue 7): every reproduction of the review, as a test.

The directory stays the user's (inode, mode, cwd users, mount point, a symlinked prefix, no
write access to the parent needed); nothing foreign is deleted, moved or followed at any depth;
handles stay live on leaves a save does not change; ``existsok=False`` is exclusive; sources
are read safely; the loader never blocks and never lies; descriptors stay bounded; odd names
work. Cases that need a mount or another user run as root (in a private mount namespace, or
as ``nobody``) and skip cleanly elsewhere.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import tensordict
import tensordict_rs
import torch
from tensordict_rs import InvalidDirectoryError, InvalidTreeError, MemoryMappedTensor, TensorDict

ROOT = os.geteuid() == 0


def make(v: float) -> TensorDict:
    td = TensorDict(
        {
            "obs": torch.full((4, 3), float(v)),
            "sub": {"x": torch.full((4, 2), v, dtype=torch.int64)},
        },
        [4],
    )
    td["note"] = f"v{v}"
    return td


def ours(prefix: Path) -> list[str]:
    """Entries a save left in the tree (staging, journal), at any depth."""
    found = []
    for dirpath, dirnames, filenames in os.walk(prefix):
        found += [os.path.join(dirpath, n) for n in dirnames + filenames if n.startswith(".tdrs")]
    return found


def in_namespace(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` (Python) as root in a private mount namespace, or skips."""
    if not ROOT or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here")
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.run(
        ["unshare", "-m", sys.executable, os.fspath(path), os.fspath(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


# ------------------------------------------------------------------ the directory stays yours


def test_mount_inside_the_tree_survives_a_save(tmp_path: Path) -> None:
    result = in_namespace(
        """
        import os, subprocess, sys, torch
        from pathlib import Path
        from tensordict_rs import TensorDict
        tmp = Path(sys.argv[1]); prefix = tmp / "tree"
        td = TensorDict({"a": torch.ones(3), "sub": {"x": torch.ones(3)}}, [3])
        td.memmap(prefix)
        for where in ("data", "sub"):  # a user's mount, and a sub-TensorDict that is a mount
            (prefix / where).mkdir(exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", prefix / where], check=True)
        (prefix / "data" / "mine.txt").write_text("mine")
        td["sub", "x"] = torch.full((3,), 2.0)
        td.memmap(prefix)
        td.memmap(prefix)
        assert (prefix / "data" / "mine.txt").read_text() == "mine"
        back = TensorDict.load_memmap(prefix)
        assert float(back["sub", "x"][0]) == 2.0
        assert os.path.ismount(prefix / "sub") and os.path.ismount(prefix / "data")
        print("ok")
        """,
        tmp_path,
    )
    assert result.stdout.strip() == "ok", result.stderr[-3000:]


def test_mount_point_as_the_prefix(tmp_path: Path) -> None:
    result = in_namespace(
        """
        import subprocess, sys, torch
        from pathlib import Path
        from tensordict_rs import TensorDict
        prefix = Path(sys.argv[1]) / "mnt"; prefix.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", prefix], check=True)
        for v in (1.0, 2.0):
            TensorDict({"a": torch.full((3,), v)}, [3]).memmap(prefix)
        assert float(TensorDict.load_memmap(prefix)["a"][0]) == 2.0
        print("ok")
        """,
        tmp_path,
    )
    assert result.stdout.strip() == "ok", result.stderr[-3000:]


def test_directory_keeps_inode_mode_and_cwd_users(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    prefix.mkdir(mode=0o700)
    os.chmod(prefix, 0o700)
    before = os.stat(prefix)
    make(1).memmap(prefix)
    shell = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.readline(); print(open('meta.json').read())"],
        cwd=prefix,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    make(2).memmap(prefix)
    out, _ = shell.communicate("go\n", timeout=30)
    assert json.loads(out)["obs"]["shape"] == [4, 3]  # its cwd is still the tree
    after = os.stat(prefix)
    assert (after.st_ino, after.st_dev) == (before.st_ino, before.st_dev)
    assert stat.S_IMODE(after.st_mode) == 0o700
    assert float(TensorDict.load_memmap(prefix)["obs"][0, 0]) == 2.0


def test_symlinked_prefix_saves_twice(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.mkdir()
    link = tmp_path / "data"
    link.symlink_to(big)
    make(1).memmap(link)
    make(2).memmap(link)
    assert link.is_symlink() and (big / "meta.json").exists()
    assert float(TensorDict.load_memmap(link)["obs"][0, 0]) == 2.0


def test_no_write_access_to_the_parent_needed(tmp_path: Path) -> None:
    if not ROOT:
        pytest.skip("needs root to run as nobody")
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="tdrs-nobody-", dir="/tmp"))  # pytest's tmp is 0700
    os.chmod(base, 0o755)
    parent = base / "team"
    prefix = parent / "tree"
    prefix.mkdir(parents=True)
    os.chmod(parent, 0o755)  # root's: nobody cannot create names here
    os.chown(prefix, 65534, 65534)
    script = textwrap.dedent(
        f"""
        import os, torch
        from tensordict_rs import TensorDict  # (imported as root: Python may live in /root)
        os.setgid(65534); os.setuid(65534)
        for v in (1.0, 2.0):
            TensorDict({{"a": torch.full((3,), v)}}, [3]).memmap({os.fspath(prefix)!r})
        print(float(TensorDict.load_memmap({os.fspath(prefix)!r})["a"][0]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    try:
        assert result.stdout.strip() == "2.0", result.stderr[-3000:]
        assert sorted(os.listdir(parent)) == ["tree"]
    finally:
        shutil.rmtree(base)


# -------------------------------------------------------------- nothing foreign is touched


def test_nested_user_files_and_read_only_dirs_stay(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    make(1).memmap(prefix)
    (prefix / "sub" / "notes.txt").write_text("mine")
    locked = prefix / "sub" / "frozen"
    locked.mkdir()
    (locked / "keep.bin").write_bytes(b"x")
    os.chmod(locked, 0o555)
    td = make(2)
    del td["sub"]  # the sub-tree goes: its owned files go, the user's stay where they are
    td.memmap(prefix)
    assert (prefix / "sub" / "notes.txt").read_text() == "mine"
    assert (locked / "keep.bin").read_bytes() == b"x"
    assert not (prefix / "sub" / "x.memmap").exists()
    assert not (prefix / "sub" / "meta.json").exists()
    make(3).memmap(prefix)  # and back again around them
    assert (prefix / "sub" / "notes.txt").read_text() == "mine"
    assert ours(prefix) == []
    os.chmod(locked, 0o755)


def test_foreign_file_in_the_way_is_refused_before_anything_changes(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    make(1).memmap(prefix)
    (prefix / "extra.memmap").write_bytes(b"user data")
    before = (prefix / "meta.json").read_bytes()
    td = make(2)
    td["extra"] = torch.ones(4)
    with pytest.raises(FileExistsError, match="does not own"):
        td.memmap(prefix)
    assert (prefix / "extra.memmap").read_bytes() == b"user data"
    assert (prefix / "meta.json").read_bytes() == before
    assert ours(prefix) == []
    (prefix / "other").symlink_to(tmp_path)
    td = make(2)
    td["other"] = {"y": torch.ones(4)}
    with pytest.raises(FileExistsError):
        td.memmap(prefix)
    assert (prefix / "other").is_symlink()


def test_planted_symlinks_are_never_followed(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "f0").write_bytes(b"precious")
    (victim / "m0").write_bytes(b"precious")
    make(1).memmap(prefix)
    # names of the old scheme beside the tree, and of the new one inside it
    (tmp_path / ".tree.tdrs-2147483600-x").symlink_to(victim)
    (prefix / ".tdrs%staging-planted").symlink_to(victim)
    (prefix / "sub" / ".tdrs%staging-planted").symlink_to(victim)
    make(2).memmap(prefix)
    assert sorted(os.listdir(victim)) == ["f0", "m0"]
    assert (victim / "f0").read_bytes() == b"precious"
    assert (prefix / ".tdrs%staging-planted").is_symlink()


def test_a_live_save_elsewhere_is_not_swept(tmp_path: Path) -> None:
    """A staging directory whose lock is held (a save in another PID namespace or on another
    machine) is left alone; once its lock is free the next save removes it."""
    prefix = tmp_path / "tree"
    make(1).memmap(prefix)
    live = prefix / ".tdrs%staging-0123456789abcdef"
    live.mkdir()
    (live / "f0").write_bytes(b"half written")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.readline()",
            os.fspath(live),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    make(2).memmap(prefix)
    assert (live / "f0").read_bytes() == b"half written"
    holder.communicate("done\n", timeout=30)
    make(3).memmap(prefix)
    assert not live.exists()
    assert ours(prefix) == []


def test_keys_named_like_our_markers_save(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    names = [".tdrs-staging", ".tdrs%staging-abc", ".tdrs%journal", ".tree.tdrs-1-x", "mounts"]
    td = TensorDict({n: torch.full((2,), float(i)) for i, n in enumerate(names)}, [2])
    td[".tdrs-staging-dir"] = {".tdrs-staging": torch.ones(2)}
    td.memmap(prefix)
    td.memmap(prefix)
    back = TensorDict.load_memmap(prefix)
    for i, n in enumerate(names):
        assert float(back[n][0]) == i
    assert float(back[".tdrs-staging-dir", ".tdrs-staging"][0]) == 1
    ref = tensordict.TensorDict.load_memmap(prefix)
    assert float(ref[".tdrs%journal"][0]) == 2


def test_names_near_name_max(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    leaf = "k" * (255 - len(".memmap"))
    node = "n" * 255
    td = TensorDict({leaf: torch.ones(2), node: {leaf: torch.zeros(2)}}, [2])
    td.memmap(prefix)
    td[leaf] = torch.full((2,), 3.0)
    td.memmap(prefix)
    back = TensorDict.load_memmap(prefix)
    assert float(back[leaf][0]) == 3 and float(back[node, leaf][0]) == 0
    with pytest.raises(OSError) as err:
        TensorDict({"k" * 255: torch.ones(2)}, [2]).memmap(tmp_path / "too_long")
    assert err.value.errno == errno.ENAMETOOLONG
    assert not (tmp_path / "too_long").exists()


# ------------------------------------------------------------------ handles and re-saves


def test_handles_stay_live_across_a_resave(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    td = make(1).memmap_(prefix)
    handle = td["obs"]
    other = TensorDict.load_memmap(prefix)  # "another process" with the tree loaded
    td.unlock_()
    td["extra"] = torch.ones(4)
    td.memmap_(prefix)
    handle.fill_(7)
    assert float(TensorDict.load_memmap(prefix)["obs"][0, 0]) == 7
    other["sub", "x"].fill_(5)
    assert int(TensorDict.load_memmap(prefix)["sub", "x"][0, 0]) == 5
    assert float(TensorDict.load_memmap(prefix)["extra"][0]) == 1


def test_memmap_onto_its_prefix_writes_what_changed_underneath(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    td = make(1).memmap_(prefix)
    # a data file replaced (new inode with other bytes), and a sub-directory replaced
    data = prefix / "obs.memmap"
    data.unlink()
    data.write_bytes(torch.full((4, 3), 9.0).numpy().tobytes())
    shutil.rmtree(prefix / "sub")
    TensorDict({"x": torch.full((4, 2), 9, dtype=torch.int64)}, [4]).memmap(prefix / "sub")
    td.memmap_(prefix)
    back = TensorDict.load_memmap(prefix)
    assert float(back["obs"][0, 0]) == 1 and int(back["sub", "x"][0, 0]) == 1


def test_memmap_like_reopens_and_refuses_short_files(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    make(4).memmap(prefix)
    again = make(0).memmap_like(prefix)
    assert float(again["obs"][0, 0]) == 4  # "which lets you reopen a buffer"
    bigger = TensorDict({"obs": torch.zeros(8, 3)}, [8])
    before = (prefix / "meta.json").read_bytes()
    with pytest.raises(InvalidTreeError, match="does not grow"):
        bigger.memmap_like(prefix)
    assert os.path.getsize(prefix / "obs.memmap") == 4 * 3 * 4
    assert (prefix / "meta.json").read_bytes() == before


def test_memmap_like_reserve_or_sparse(tmp_path: Path) -> None:
    shape = (64, 1 << 16)  # 16 MiB of float32
    like = TensorDict({"a": torch.empty(shape, device="meta")}, [64])
    like.memmap_like(tmp_path / "reserved")
    like.memmap_like(tmp_path / "sparse", reserve=False)
    size = 64 * (1 << 16) * 4
    reserved = os.stat(tmp_path / "reserved" / "a.memmap")
    sparse = os.stat(tmp_path / "sparse" / "a.memmap")
    assert reserved.st_size == sparse.st_size == size
    assert reserved.st_blocks * 512 >= size
    assert sparse.st_blocks * 512 < size // 2


def test_existsok_false_is_exclusive(tmp_path: Path) -> None:
    for round_ in range(8):
        prefix = tmp_path / f"tree{round_}"
        start = threading.Barrier(2)
        outcomes: list[str] = []

        def save(
            v: float,
            barrier: threading.Barrier = start,
            prefix: Path = prefix,
            outcomes: list[str] = outcomes,
        ) -> None:
            td = TensorDict({"a": torch.full((1 << 20,), v)}, [])
            barrier.wait()
            try:
                td.memmap(prefix, existsok=False)
                outcomes.append("ok")
            except FileExistsError:
                outcomes.append("exists")

        threads = [threading.Thread(target=save, args=(float(v),)) for v in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["exists", "ok"], outcomes
        assert tensordict_rs.verify(prefix) == [] and ours(prefix) == []


# ---------------------------------------------------------------------------- sources


def test_conjugate_and_negative_views_are_resolved(tmp_path: Path) -> None:
    z = torch.tensor([1 + 2j, 3 - 4j])
    n = torch._neg_view(torch.tensor([1.0, -2.0]))
    td = TensorDict({"z": z.conj(), "n": n}, [2])
    td.memmap(tmp_path / "a")
    back = TensorDict.load_memmap(tmp_path / "a")
    assert torch.equal(back["z"], z.conj().resolve_conj())
    assert torch.equal(back["n"], torch.tensor([-1.0, 2.0]))
    mmt = MemoryMappedTensor.from_tensor(z.conj(), filename=tmp_path / "z.memmap")
    assert torch.equal(mmt, z.conj().resolve_conj())


def test_source_storage_outlives_a_set_from_another_thread(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, threading, torch
        from tensordict_rs import TensorDict
        src = torch.full((64, 1 << 20), 3.0)  # 256 MiB: the save takes a while
        td = TensorDict({"a": src}, [64])
        go = threading.Event()
        def meddle():
            go.wait()
            src.set_(torch.zeros(1))  # frees the storage unless the save holds it
        t = threading.Thread(target=meddle); t.start()
        import tensordict_rs._native as native
        real = native.write_tree
        def wrapped(*a, **k):
            go.set()
            return real(*a, **k)
        native.write_tree = wrapped
        out = td.memmap(sys.argv[1], num_threads=1)
        t.join()
        print(float(out["a"].min()), float(out["a"].max()))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, os.fspath(tmp_path / "tree")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["3.0", "3.0"]


# ----------------------------------------------------------------------------- the loader


def special(path: Path, kind: str) -> Any:
    """Puts a FIFO, a socket or a directory at ``path``; returns what must stay alive."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(os.fspath(path))
        return sock
    else:
        path.mkdir()
    return None


def load_within(prefix: Path, seconds: float = 20) -> BaseException | None:
    """load_memmap and verify in a thread that must finish in time; returns the load's error."""
    box: list[BaseException | None] = []

    def run() -> None:
        try:
            TensorDict.load_memmap(prefix)
            box.append(None)
        except BaseException as err:
            box.append(err)
        tensordict_rs.verify(prefix)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the load blocked"
    return box[0]


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory"])
@pytest.mark.parametrize("where", ["meta.json", "obs.memmap"])
def test_loader_refuses_special_files_without_blocking(
    tmp_path: Path, kind: str, where: str
) -> None:
    prefix = tmp_path / "tree"
    make(1).memmap(prefix)
    keep = special(prefix / where, kind)
    err = load_within(prefix)
    assert isinstance(err, InvalidDirectoryError), repr(err)
    assert where in str(err)
    if where == "obs.memmap":
        assert '"obs"' in str(err)
    assert any(where in p for p in tensordict_rs.verify(prefix))
    if keep is not None:
        keep.close()


def test_full_disk_is_enospc_at_load_not_sigbus(tmp_path: Path) -> None:
    result = in_namespace(
        """
        import errno, os, subprocess, sys, torch
        from pathlib import Path
        from tensordict_rs import TensorDict
        mnt = Path(sys.argv[1]) / "small"; mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], check=True)
        like = TensorDict({"a": torch.empty((1 << 21,), device="meta")}, [])  # 8 MiB
        like.memmap_like(mnt / "tree", reserve=False)  # sparse: fits until written
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"x" * 65536)
        except OSError:
            os.close(fd)
        try:
            td = TensorDict.load_memmap(mnt / "tree")
            td["a"].fill_(1.0)  # without the reservation: SIGBUS here
            print("loaded")
        except OSError as err:
            print("enospc" if err.errno == errno.ENOSPC else f"other {err}")
        """,
        tmp_path,
    )
    assert result.returncode == 0, f"rc {result.returncode}: {result.stderr[-3000:]}"
    assert result.stdout.strip() == "enospc", result.stdout + result.stderr[-3000:]


def test_meta_device_entry_is_refused(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    make(1).memmap(prefix)
    meta = json.loads((prefix / "meta.json").read_text())
    meta["device"] = "meta"
    (prefix / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InvalidDirectoryError, match=r"meta.json.*'meta'"):
        TensorDict.load_memmap(prefix)
    assert float(TensorDict.load_memmap(prefix, device="cpu")["obs"][0, 0]) == 1


def test_zero_element_shape_with_huge_dims(tmp_path: Path) -> None:
    prefix = tmp_path / "tree"
    make(1).memmap(prefix)
    meta = json.loads((prefix / "meta.json").read_text())
    meta["e"] = {"device": "cpu", "shape": [4, 0, 2**62, 4], "dtype": "torch.float32"}
    meta["e"]["is_nested"] = False
    (prefix / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InvalidDirectoryError, match=r'"e".*overflows'):
        TensorDict.load_memmap(prefix)
    meta["e"]["shape"] = [4, 0, 2**62, 1]  # torch can make this one: it loads
    (prefix / "meta.json").write_text(json.dumps(meta))
    assert TensorDict.load_memmap(prefix)["e"].shape == (4, 0, 2**62, 1)


def nested(depth: int) -> TensorDict:
    td = TensorDict({"x": torch.ones(1)}, [])
    for _ in range(depth):
        td = TensorDict({"n": td}, [])
    return td


def test_deep_trees_load_what_they_save_or_are_refused_first(tmp_path: Path) -> None:
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    nested(250).memmap(tmp_path / "deep")
    back = TensorDict.load_memmap(tmp_path / "deep")
    assert float(back[("n",) * 250 + ("x",)][0]) == 1
    with pytest.raises(InvalidTreeError, match="nested"):
        nested(300).memmap(tmp_path / "deeper")
    assert not (tmp_path / "deeper").exists()


def test_descriptors_stay_bounded(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    td = TensorDict({}, [])
    for i in range(1500):
        td[f"d{i}"] = TensorDict({"x": torch.full((2,), float(i))}, [])
        td[f"s{i}"] = f"value {i}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        td.memmap(tmp_path / "wide")
        td.memmap(tmp_path / "wide")
        back = TensorDict.load_memmap(tmp_path / "wide")
        assert tensordict_rs.verify(tmp_path / "wide") == []
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert float(back["d1499", "x"][0]) == 1499 and back["s7"] == "value 7"


def test_kill_inside_from_tensor_leaves_nothing(tmp_path: Path) -> None:
    """The file is written unnamed (O_TMPFILE) and linked at its name when complete: a kill
    leaves the whole file or nothing. (Replacing an existing file with existsok=True links a
    temporary name first: a kill in the microseconds between link and rename can leave it.)"""
    src = torch.full((1 << 22,), 2.0)  # 16 MiB
    for i in range(12):
        target = tmp_path / f"x{i}.memmap"
        pid = os.fork()
        if pid == 0:
            try:
                MemoryMappedTensor.from_tensor(src, filename=target)
            finally:
                os._exit(0)
        time.sleep(0.002 * i)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        names = os.listdir(tmp_path)
        assert all(n.startswith("x") and n.endswith(".memmap") for n in names), names
        if target.exists():
            assert torch.equal(
                MemoryMappedTensor.from_filename(target, torch.float32, src.shape), src
            )
