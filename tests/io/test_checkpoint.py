"""Incremental checkpoints (issue 24): ``td.checkpoint(dest)``.

After random write patterns (through the library's methods, from this process and another
one, with growth and shrinking), the checkpoint must equal a full copy
(``memmap(copy_existing=True)``) file for file, byte for byte, and load in the reference; only
the rows written are copied; writes through raw leaves are caught by ``verify=True``.
"""

from __future__ import annotations

import multiprocessing as mp
import operator
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch
from tensordict_rs import TensorDict
from tensordict_rs import tensorclass as tensorclass_rs
from tensordict_rs.io.checkpoint import RECORD, spare_name


def tree_files(root: Path) -> dict[str, bytes]:
    """Every file of a saved tree (relative path -> bytes), bookkeeping excluded."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.startswith(".tdrs%"):
                continue
            path = Path(dirpath) / name
            out[os.path.relpath(path, root)] = path.read_bytes()
    return out


def assert_same_as_full_copy(td: TensorDict, dest: Path, tmp_path: Path) -> None:
    full = tmp_path / f"full-{random.getrandbits(32)}"
    td.memmap(full, copy_existing=True)
    want, got = tree_files(full), tree_files(dest)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
    ref = tensordict.TensorDict.load_memmap(dest)
    for key in td.keys(include_nested=True, leaves_only=True):
        assert torch.equal(ref[key], td[key]), key


def make(n: int = 300) -> TensorDict:
    g = torch.Generator().manual_seed(n)
    return TensorDict(
        {
            "obs": torch.randn(n, 64, generator=g),
            "act": torch.randint(0, 100, (n,), generator=g),
            "next": {
                "obs": torch.randn(n, 64, generator=g),
                "done": torch.zeros(n, dtype=torch.bool),
            },
        },
        [n],
    )


def test_checkpoint_equals_full_copy_after_random_writes(tmp_path: Path) -> None:
    td = make().memmap(tmp_path / "live")
    dest = tmp_path / "ckpt"
    first = td.checkpoint(dest)
    assert first["bytes_written"] > 0
    assert_same_as_full_copy(td, dest, tmp_path)
    rng = random.Random(7)
    total = sum(v.nbytes for v in td.values(include_nested=True, leaves_only=True))
    small = ("row", "update_at", "mask")
    kinds = ["copy"]
    for step in range(14):
        kind = rng.choice(["row", "slice", "index", "update_at", "copy", "mask", "inplace"])
        n = td.batch_size[0]
        if kind == "row":
            td[rng.randrange(n)] = make(1)[0]
        elif kind == "slice":
            a = rng.randrange(n - 5)
            td[a : a + 5] = make(5)
        elif kind == "index":
            idx = torch.tensor(rng.sample(range(n), 7))
            td[idx] = make(7)
        elif kind == "update_at":
            td.update_at_({"obs": torch.full((64,), float(step))}, rng.randrange(n))
        elif kind == "copy":
            td.copy_(make(n))
        elif kind == "mask":
            mask = torch.zeros(n, dtype=torch.bool)
            mask[rng.randrange(n)] = True
            td[mask] = make(1)
        else:
            td["next"].zero_()
        kinds.append(kind)
        stats = td.checkpoint(dest)
        assert_same_as_full_copy(td, dest, tmp_path)
        if kinds[-1] in small and kinds[-2] in small:
            # a block of rows in each of the last two intervals (the spare is one behind)
            assert stats["bytes_written"] < total // 4, (kind, stats)


def test_only_written_rows_are_copied(tmp_path: Path) -> None:
    n = 4096
    td = TensorDict({"x": torch.zeros(n, 1024)}, [n]).memmap(tmp_path / "live")  # 4 KiB rows
    td.checkpoint(tmp_path / "ckpt")
    assert td.checkpoint(tmp_path / "ckpt")["bytes_written"] < 4096  # nothing but meta.json
    rows = random.Random(3).sample(range(n), 40)
    for r in rows:
        td[r] = TensorDict({"x": torch.full((1024,), 1.0)}, [])
    stats = td.checkpoint(tmp_path / "ckpt")
    assert 40 * 4096 <= stats["bytes_written"] < 40 * 4096 + 4096
    assert_same_as_full_copy(td, tmp_path / "ckpt", tmp_path)


def test_growth_and_shrink_are_checkpointed(tmp_path: Path) -> None:
    td = TensorDict({"x": torch.arange(10.0), "y": torch.zeros(10, 3)}, [10]).memmap(
        tmp_path / "live"
    )
    dest = tmp_path / "ckpt"
    td.checkpoint(dest)
    td.extend_(TensorDict({"x": torch.arange(10.0, 30.0), "y": torch.ones(20, 3)}, [20]))
    td.checkpoint(dest)
    assert_same_as_full_copy(td, dest, tmp_path)
    td.resize_(5)
    td.checkpoint(dest)
    assert_same_as_full_copy(td, dest, tmp_path)
    assert tensordict.TensorDict.load_memmap(dest).batch_size == torch.Size([5])
    td.resize_(8)
    td.checkpoint(dest)
    assert_same_as_full_copy(td, dest, tmp_path)


def test_raw_leaf_writes_need_verify(tmp_path: Path) -> None:
    n = 2048
    td = TensorDict({"x": torch.zeros(n, 256)}, [n]).memmap(tmp_path / "live")
    dest = tmp_path / "ckpt"
    td.checkpoint(dest)
    td.checkpoint(dest)
    td["x"][1000, 5] = 3.0  # through the leaf: no tracking sees it
    td.checkpoint(dest)
    assert tensordict.TensorDict.load_memmap(dest)["x"][1000, 5] == 0  # missed, as documented
    stats = td.checkpoint(dest, verify=True)
    assert stats["bytes_hashed"] >= n * 256 * 4
    assert tensordict.TensorDict.load_memmap(dest)["x"][1000, 5] == 3.0
    assert_same_as_full_copy(td, dest, tmp_path)
    td["x"][7, 0] = 1.0
    td.checkpoint(dest, verify=True)  # the spare is behind too: verified again
    assert_same_as_full_copy(td, dest, tmp_path)
    assert stats["bytes_written"] < n * 256 * 4 // 4


def _write_in_child(prefix: str, row: int) -> None:
    td = TensorDict.load_memmap(prefix)
    td[row] = TensorDict({"x": torch.full((256,), 9.0)}, [])


def test_writes_from_another_process_are_tracked(tmp_path: Path) -> None:
    n = 2048
    td = TensorDict({"x": torch.zeros(n, 256)}, [n]).memmap(tmp_path / "live")
    dest = tmp_path / "ckpt"
    td.checkpoint(dest)  # creates the dirty map: processes loading from now on stamp it
    p = mp.get_context("spawn").Process(
        target=_write_in_child, args=(os.fspath(tmp_path / "live"), 77)
    )
    p.start()
    p.join(120)
    assert p.exitcode == 0
    stats = td.checkpoint(dest)
    assert stats["bytes_written"] < n * 256 * 4 // 8
    assert tensordict.TensorDict.load_memmap(dest)["x"][77, 0] == 9.0
    assert_same_as_full_copy(td, dest, tmp_path)


def test_refuses_foreign_destination(tmp_path: Path) -> None:
    td = make(10).memmap(tmp_path / "live")
    other = tmp_path / "mine"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="mine"):
        td.checkpoint(other)
    assert (other / "precious.txt").read_text() == "keep me"
    with pytest.raises(RuntimeError, match="memmap_"):
        make(10).checkpoint(tmp_path / "c")
    with pytest.raises(ValueError, match="inside"):
        td.checkpoint(tmp_path / "live" / "c")
    # the same through a link to the tree's directory (it was taken, and the next checkpoint
    # copied the checkpoint into itself)
    (tmp_path / "link").symlink_to(tmp_path / "live")
    linked = TensorDict.load_memmap(tmp_path / "link")
    with pytest.raises(ValueError, match="inside"):
        linked.checkpoint(tmp_path / "live" / "c")
    with pytest.raises(ValueError, match="inside"):
        td.checkpoint(tmp_path / "link" / "c")
    assert not (tmp_path / "live" / "c").exists()


def test_layout_of_generations(tmp_path: Path) -> None:
    td = make(10).memmap(tmp_path / "live")
    td.checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / RECORD).is_file()
    assert (tmp_path / spare_name(tmp_path / "ckpt") / RECORD).is_file()
    assert TensorDict.load_memmap(tmp_path / "ckpt")["obs"].shape == (10, 64)


def test_the_users_files_in_the_checkpoint_stay_in_sight(tmp_path: Path) -> None:
    """Files the user puts into the checkpoint directory (notes, a folder of plots, a link)
    stay there, visible, across checkpoints; changed, they show the change; removed, they stay
    removed. The two generations are exchanged at every checkpoint, so such a file went into
    the hidden spare at the next checkpoint and was deleted at the one after (found by an
    attack)."""
    td = make(50).memmap(tmp_path / "live")
    dest = tmp_path / "ckpt"
    td.checkpoint(dest)
    (dest / "notes.txt").write_text("v1")
    (dest / "plots").mkdir()
    (dest / "plots" / "loss.csv").write_text("1,2,3")
    (dest / "latest").symlink_to("notes.txt")
    spare = tmp_path / spare_name(dest)
    mine = {"notes.txt", "plots/loss.csv", "latest"}

    def tree_only(files: dict[str, bytes]) -> dict[str, bytes]:
        return {k: v for k, v in files.items() if k not in mine}

    for step in range(4):
        td[step] = make(1)[0]
        td.checkpoint(dest)
        assert (dest / "notes.txt").read_text() == ("v1" if step < 2 else "v2"), step
        assert (dest / "plots" / "loss.csv").read_text() == "1,2,3"
        assert os.readlink(dest / "latest") == "notes.txt"
        full = tmp_path / f"full{step}"
        td.memmap(full, copy_existing=True)
        assert tree_only(tree_files(dest)) == tree_files(full)
        assert tensordict.TensorDict.load_memmap(dest)["obs"].shape == (50, 64)
        if step == 1:  # the user replaces the file (a new one renamed over it)
            (dest / "notes.new").write_text("v2")
            os.replace(dest / "notes.new", dest / "notes.txt")
    (dest / "notes.txt").unlink()
    for step in range(2):
        td[step] = make(1)[0]
        td.checkpoint(dest)
        assert not (dest / "notes.txt").exists(), step
        assert not (spare / "notes.txt").exists(), step
        assert (dest / "plots" / "loss.csv").read_text() == "1,2,3"
    # a file the tree no longer has is the tree's, not the user's: it goes from both
    # generations (it was carried over as the user's, and stayed for good)
    (dest / "latest").unlink()  # its target is gone
    fewer = make(50).exclude("act").memmap(tmp_path / "live", existsok=True)
    for _ in range(2):
        fewer.checkpoint(dest)
        assert not (dest / "act.memmap").exists()
        assert (dest / "plots" / "loss.csv").read_text() == "1,2,3"
    assert not (spare / "act.memmap").exists()  # the spare, one checkpoint behind, too
    assert tree_only(tree_files(dest)) == tree_files(tmp_path / "live")


def test_the_users_empty_folders_and_dot_files_stay_too(tmp_path: Path) -> None:
    """Empty folders (also inside a folder of the user's) and files named like temporaries
    (``.report.tmp``) or this library's records (``.tdrs%notes``) went into the hidden spare
    at the next checkpoint and were deleted at the one after (found by an attack): only this
    library's own names are taken for its bookkeeping now."""
    td = make(20).memmap(tmp_path / "live")
    dest = tmp_path / "ck"
    td.checkpoint(dest)
    (dest / "plots").mkdir()
    (dest / "runs" / "2026-12-04").mkdir(parents=True)
    (dest / "runs" / "log.txt").write_text("log")
    (dest / ".report.tmp").write_text("draft")
    (dest / ".tdrs%notes").write_text("mine")
    for step in range(3):
        td[step] = make(1)[0]
        td.checkpoint(dest)
        assert (dest / "plots").is_dir() and (dest / "runs" / "2026-12-04").is_dir(), step
        assert (dest / "runs" / "log.txt").read_text() == "log"
        assert (dest / ".report.tmp").read_text() == "draft"
        assert (dest / ".tdrs%notes").read_text() == "mine"
        assert tensordict.TensorDict.load_memmap(dest)["obs"].shape == (20, 64)


def test_keys_named_like_bookkeeping_are_checkpointed(tmp_path: Path) -> None:
    """A key ``.tdrs%x`` (its file ``.tdrs%25x.memmap``) and a nested key ``.cache.tmp`` save
    and load as any key, but checkpoints left them out, so neither loader read the checkpoint
    back whole (found by an attack)."""
    td = TensorDict(
        {"a": torch.arange(6.0), ".tdrs%x": torch.ones(6), ".cache.tmp": {"b": torch.zeros(6)}},
        [6],
    ).memmap(tmp_path / "live")
    dest = tmp_path / "ck"
    for step in range(3):
        td[step] = TensorDict(
            {"a": torch.tensor(9.0), ".tdrs%x": torch.tensor(2.0), ".cache.tmp": {"b": 5.0}}, []
        )
        td.checkpoint(dest)
        assert_same_as_full_copy(td, dest, tmp_path)
        back = TensorDict.load_memmap(dest)
        assert torch.equal(back[".tdrs%x"], td[".tdrs%x"])
        assert torch.equal(back[".cache.tmp", "b"], td[".cache.tmp", "b"])


@pytest.mark.parametrize("writer", ["loaded checkpoint", "tensordict save"])
def test_a_checkpoint_written_by_another_is_copied_again(tmp_path: Path, writer: str) -> None:
    """A checkpoint directory written after its checkpoint (the user writing a loaded
    checkpoint, tensordict saving into it) was trusted: its generation came back as the
    spare two checkpoints later, and only the rows the tree wrote were copied over it, so
    the checkpoint kept the foreign bytes, with ``verify=True`` too (found by an attack).
    Each file's inode, size and change times are recorded; one changed since is copied
    whole."""
    for verify in (False, True):
        live = TensorDict({"x": torch.zeros(64, 32)}, [64]).memmap(tmp_path / f"live{verify}")
        dest = tmp_path / f"ck{verify}"
        live.checkpoint(dest, verify=verify)
        if writer == "loaded checkpoint":
            ck = TensorDict.load_memmap(dest)
            ck["x"][3] = 5.0
            del ck
        else:
            foreign = tensordict.TensorDict({"x": torch.full((64, 32), 7.0)}, [64])
            foreign.memmap(dest, copy_existing=True, existsok=True)
        for _ in range(2):
            live.checkpoint(dest, verify=verify)
            assert_same_as_full_copy(live, dest, tmp_path)


def test_the_other_generation_cannot_be_the_tree(tmp_path: Path) -> None:
    """A tree saved at ``.ck.tdrs%spare`` was taken for the spare of ``ck``: the checkpoint
    renamed the live tree to ``ck`` and failed (found by an attack). It is refused like a
    destination inside the tree; ``live/../ck`` is ``ck`` (it was refused as inside)."""
    td = make(10).memmap(tmp_path / spare_name(tmp_path / "ck"))
    with pytest.raises(ValueError, match="cannot be inside the tree"):
        td.checkpoint(tmp_path / "ck")
    assert TensorDict.load_memmap(tmp_path / spare_name(tmp_path / "ck"))["obs"].shape == (10, 64)
    live = make(10).memmap(tmp_path / "live")
    live.checkpoint(os.path.join(tmp_path, "live", "..", "other"))
    assert_same_as_full_copy(live, tmp_path / "other", tmp_path)


def test_links_put_at_the_trees_names_are_replaced_never_followed(tmp_path: Path) -> None:
    """A link put in the checkpoint where the tree has a directory made the next checkpoints
    write the tree's files into the folder it points to, and one where the tree has a file
    made every checkpoint fail with ELOOP naming the hidden spare (found by an attack). The
    tree's names hold the tree's files and folders; the links go, their targets untouched."""
    (tmp_path / "victim.txt").write_text("mine")
    (tmp_path / "victimdir").mkdir()
    (tmp_path / "victimdir" / "keep.txt").write_text("keep")
    live = TensorDict({"x": torch.ones(8, 4), "s": {"y": torch.ones(8)}}, [8]).memmap(
        tmp_path / "live"
    )
    dest = tmp_path / "ck"
    live.checkpoint(dest)
    (dest / "meta.json").unlink()
    (dest / "meta.json").symlink_to(tmp_path / "victim.txt")
    for name in os.listdir(dest / "s"):
        (dest / "s" / name).unlink()
    (dest / "s").rmdir()
    (dest / "s").symlink_to(tmp_path / "victimdir")
    for step in range(3):
        live[step] = TensorDict({"x": torch.full((4,), 5.0), "s": {"y": torch.tensor(5.0)}}, [])
        live.checkpoint(dest, verify=step == 2)
        assert (tmp_path / "victim.txt").read_text() == "mine"
        assert os.listdir(tmp_path / "victimdir") == ["keep.txt"]
    assert_same_as_full_copy(live, dest, tmp_path)


def test_a_record_that_cannot_be_written_names_it_and_leaves_nothing(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A full disk while the checkpoint record was written raised an error naming no file and
    left its temporary behind (found by an attack)."""
    import errno
    import json

    from tensordict_rs.io import checkpoint as ckpt

    live = make(10).memmap(tmp_path / "live")

    def full(*_: Any, **__: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(json, "dump", full)
    with pytest.raises(OSError) as err:
        live.checkpoint(tmp_path / "ck")
    assert err.value.errno == errno.ENOSPC
    assert ckpt.RECORD in os.fspath(err.value.filename)
    leftovers = [n for _, _, names in os.walk(tmp_path) for n in names if n.endswith(".tmp")]
    assert leftovers == []


def test_a_loaded_tree_is_checkpointed(tmp_path: Path) -> None:
    """Resuming after a restart: the live buffer loaded with ``load_memmap`` (not locked, so
    ``is_memmap()`` is False, as in tensordict) keeps growing and checkpoints into the same
    destination (it raised "call memmap_ first"). A leaf set in memory since the load is not
    in the directory: refused, naming the key, the checkpoint left as it was."""
    live = tmp_path / "live"
    dest = tmp_path / "ckpt"
    make(400).exclude("next").memmap(live).checkpoint(dest)  # flat: it grows
    td = TensorDict.load_memmap(live)
    assert not td.is_memmap()
    td[3] = make(1)[0].exclude("next")
    td.extend_(make(5).exclude("next"))
    stats = td.checkpoint(dest)
    assert_same_as_full_copy(td, dest, tmp_path)
    assert stats["bytes_written"] < sum(v.nbytes for v in td.values(True, True)) // 2
    before = tree_files(dest)
    td["obs"] = torch.ones(405, 64)
    with pytest.raises(RuntimeError, match=r"key 'obs' is not memory-mapped"):
        td.checkpoint(dest)
    assert tree_files(dest) == before
    # nested: the key named with its path
    make(10).memmap(tmp_path / "nested")
    nested = TensorDict.load_memmap(tmp_path / "nested")
    nested.checkpoint(tmp_path / "nested-ckpt")
    nested["next", "obs"] = torch.ones(10, 64)
    with pytest.raises(RuntimeError, match=r"key 'next.obs' is not memory-mapped"):
        nested.checkpoint(tmp_path / "nested-ckpt")


def test_non_tensor_changes_of_a_loaded_tree_are_checkpointed(tmp_path: Path) -> None:
    """A loaded tree's non-tensor entries set in memory (a value replaced, a stack assigned,
    a new key, a key deleted, a sub-tree of strings) were ignored: the checkpoint paired the
    current tensors with the directory's old strings, silently. It now holds them as a full
    copy does, byte for byte (tensordict reads them); a tensor in a sub-tree set in memory is
    refused by name, as any tensor leaf set in memory."""
    live, dest = tmp_path / "live", tmp_path / "ckpt"
    td = make(20)
    td["s"] = [f"r{i}" for i in range(20)]
    td.set_non_tensor("split", "train")
    td.set_non_tensor(("next", "tag"), "old")
    td.set_non_tensor("gone", "x")
    td.memmap(live)
    loaded = TensorDict.load_memmap(live)
    loaded.checkpoint(dest)
    loaded.set_at_("act", torch.tensor(7), 0)
    loaded.get("s")[1] = "in place"  # bound to its meta.json: already in the directory
    loaded.set_non_tensor("split", "test")
    loaded["s"] = [f"new{i}" for i in range(20)]
    loaded.set_non_tensor("added", "hello")
    loaded.set_non_tensor(("next", "tag"), "new")
    del loaded["gone"]
    del loaded["next", "done"]  # a tensor key deleted: not in the checkpoint either
    loaded["strings"] = TensorDict({"w": "word"}, [20])
    loaded.checkpoint(dest)
    full = tmp_path / "full"
    loaded.memmap(full, copy_existing=True)
    assert tree_files(dest) == tree_files(full)
    ref = tensordict.TensorDict.load_memmap(dest)
    assert ref["split"] == "test" and ref["added"] == "hello" and ref["next", "tag"] == "new"
    assert ref.get("s").tolist() == [f"new{i}" for i in range(20)]
    assert "gone" not in ref.keys() and ("next", "done") not in ref.keys(True)
    assert ref["strings", "w"] == "word" and ref["act"][0] == 7
    assert not [p for p in os.listdir(tmp_path) if "staging" in p]  # its layout is removed
    # the directory of the tree itself is untouched (the values are in memory only)
    assert TensorDict.load_memmap(live)["split"] == "train"
    # nothing changed since: the next checkpoint is the same again (from the other generation)
    loaded.checkpoint(dest)
    assert tree_files(dest) == tree_files(full)
    before = tree_files(dest)
    loaded["more"] = TensorDict({"t": torch.ones(20)}, [20])
    with pytest.raises(RuntimeError, match=r"key 'more.t' is not memory-mapped"):
        loaded.checkpoint(dest)
    assert tree_files(dest) == before


def _grow_until(prefix: str, stop: Any) -> None:
    td = TensorDict.load_memmap(prefix)
    while not stop.is_set():
        n = td.batch_size[0]
        idx = torch.arange(n, n + 50)
        td.extend_({"act": -idx, "obs": idx.float()[:, None].expand(50, 64).clone()})


def test_a_checkpoint_while_another_process_grows_the_tree(tmp_path: Path) -> None:
    """A collector process appends while the trainer checkpoints: every checkpoint must load,
    here and in tensordict, with whole rows. The checkpoint copied the data files' committed
    rows, then a meta.json committed by a growth meanwhile, claiming more rows than it had
    copied: our load refused it as truncated, tensordict's loaded wrong data (found by an
    attack). The checkpoint now holds the lock growths take while it reads the tree."""
    live, dest = tmp_path / "live", tmp_path / "ckpt"
    idx = torch.arange(1000)
    td = TensorDict({"act": -idx, "obs": idx.float()[:, None].expand(1000, 64).clone()}, [1000])
    td.memmap(live).checkpoint(dest)
    ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
    stop = ctx.Event()
    child = ctx.Process(target=_grow_until, args=(os.fspath(live), stop))
    child.start()
    try:
        seen = set()
        for _ in range(12):
            TensorDict.load_memmap(live).checkpoint(dest)
            for lib in (TensorDict, tensordict.TensorDict):
                c = lib.load_memmap(dest)
                n = c.batch_size[0]
                seen.add(n)
                ix = torch.arange(n)
                assert torch.equal(c["act"], -ix), (lib, n)
                assert torch.equal(c["obs"], ix.float()[:, None].expand(n, 64)), (lib, n)
    finally:
        stop.set()
        child.join(60)
    assert child.exitcode == 0
    assert len(seen) > 3  # the tree grew between checkpoints


def _write_row_when_told(td: Any, prefix: str, row: int, ready: Any, go: Any, done: Any) -> None:
    if td is None:
        td = TensorDict.load_memmap(prefix)
    ready.set()
    go.wait(60)
    td[row] = TensorDict({"x": torch.full((256,), 5.0)}, [])
    done.set()


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("how", ["sent", "loaded"])
def test_writes_of_processes_started_before_the_first_checkpoint_are_tracked(
    tmp_path: Path, method: str, how: str
) -> None:
    """Collectors start with the buffer, checkpoints come later: a process that had the tree
    (forked with it, sent it pickled, or loaded it) before the first checkpoint made the dirty
    map stamped nothing, and a tree sent to a spawned process never did, so every later
    checkpoint missed its writes (found by an attack). They now look for the map after each
    write (``PendingMap``) and a received tree takes up its directory's map."""
    if method == "fork" and sys.platform != "linux":
        pytest.skip("fork is Linux's")
    td = TensorDict({"x": torch.zeros(2048, 256)}, [2048]).memmap(tmp_path / "live")
    dest = tmp_path / "ckpt"
    ctx = mp.get_context(method)
    ready, go, done = ctx.Event(), ctx.Event(), ctx.Event()
    child = ctx.Process(
        target=_write_row_when_told,
        args=(td if how == "sent" else None, os.fspath(tmp_path / "live"), 7, ready, go, done),
    )
    child.start()
    try:
        assert ready.wait(120)
        td.checkpoint(dest)  # the first: makes the map while the child holds the tree
        td.checkpoint(dest)
        go.set()
        assert done.wait(60)
    finally:
        child.join(60)
    assert child.exitcode == 0
    stats = td.checkpoint(dest)
    assert stats["bytes_written"] < 2048 * 256 * 4 // 8  # still incremental
    assert tensordict.TensorDict.load_memmap(dest)["x"][7, 0] == 5.0
    assert_same_as_full_copy(td, dest, tmp_path)


def test_a_write_during_which_the_map_appears_is_stamped(tmp_path: Path) -> None:
    """The race the look after each write closes: a write announced while the directory had
    no map, the first checkpoint made in the middle of it (after it copied the row), the
    write finished: its rows are stamped when it ends, so the next checkpoint copies them."""
    from tensordict_rs.io.dirty import DirtyMap, PendingMap

    live = tmp_path / "live"
    TensorDict({"x": torch.zeros(4096, 256)}, [4096]).memmap(live)
    td = TensorDict.load_memmap(live)
    assert isinstance(td._tracker, PendingMap)
    other = TensorDict.load_memmap(live)
    token = td._tracker.mark(slice(100, 101), 4096)  # announced: no map yet
    other.checkpoint(tmp_path / "ckpt")  # makes the map, copies row 100 as it was
    td["x"][100] = 3.0  # the write itself (through its leaf, as the library's methods do)
    td._tracker.confirm(slice(100, 101), 4096, token)
    assert isinstance(td._tracker.real, DirtyMap)
    stats = other.checkpoint(tmp_path / "ckpt")
    assert stats["bytes_written"] < 4096 * 256 * 4 // 8
    assert tensordict.TensorDict.load_memmap(tmp_path / "ckpt")["x"][100, 0] == 3.0


_UNARY = (
    "abs_ acos_ asin_ atan_ ceil_ cos_ cosh_ erf_ erfc_ exp_ expm1_ floor_ frac_ lgamma_ log10_ "
    "log1p_ log2_ log_ neg_ reciprocal_ round_ sigmoid_ sign_ sin_ sinh_ sqrt_ tan_ tanh_ trunc_"
).split()


def _half(td: TensorDict) -> TensorDict:
    return TensorDict({"x": torch.full((256, 16), 0.25)}, [256])


_WRITES: dict[str, Any] = {
    **{name: operator.methodcaller(name) for name in _UNARY},
    "add_": lambda td: td.add_(1.0),
    "sub_": lambda td: td.sub_(_half(td)),
    "mul_": lambda td: td.mul_(3.0),
    "div_": lambda td: td.div_(_half(td)),
    "pow_": lambda td: td.pow_(2.0),
    "clamp_max_": lambda td: td.clamp_max_(0.1),
    "clamp_min_": lambda td: td.clamp_min_(0.9),
    "maximum_": lambda td: td.maximum_(0.9),
    "minimum_": lambda td: td.minimum_(0.1),
    "lerp_": lambda td: td.lerp_(_half(td), 0.5),
    "addcmul_": lambda td: td.addcmul_(_half(td), _half(td)),
    "addcdiv_": lambda td: td.addcdiv_(_half(td), _half(td)),
    "masked_fill_": lambda td: td.masked_fill_(torch.ones(256, dtype=torch.bool), 2.0),
    "copy_at_": lambda td: td.copy_at_(TensorDict({"x": torch.ones(16)}, []), 5),
    "update_": lambda td: td.update_({"x": torch.ones(256, 16)}),
    "fill_": lambda td: td.fill_("x", 3.0),
    "zero_": lambda td: td.zero_(),
    "apply_": lambda td: td.apply_(lambda t: t.add_(1)),
}


@pytest.mark.parametrize("name", sorted(_WRITES))
def test_every_in_place_method_is_seen_by_the_next_checkpoint(tmp_path: Path, name: str) -> None:
    """Each in-place method of TensorDict stamps the rows it writes: the checkpoint after it
    equals a full copy (maximum_, minimum_, lerp_, addcmul_ and addcdiv_ stamped nothing,
    so the checkpoints after them kept the old values; found by an attack)."""
    td = TensorDict({"x": torch.full((256, 16), 0.5)}, [256]).memmap(tmp_path / "live")
    td.checkpoint(tmp_path / "ckpt")
    td.checkpoint(tmp_path / "ckpt")
    _WRITES[name](td)
    td.checkpoint(tmp_path / "ckpt")
    assert_same_as_full_copy(td, tmp_path / "ckpt", tmp_path)


_VIEW_WRITES: dict[str, tuple[Any, int | None]] = {
    # name: (write through a view of the tree, rows the next checkpoint copies at most)
    "select": (lambda td: td.select("x")[3].zero_(), 1),
    "exclude": (lambda td: td.exclude("y").add_(1), None),
    "slice": (lambda td: td[5:10].zero_(), 5),
    "row": (lambda td: td[7].zero_(), 1),
    "unbind": (lambda td: td.unbind(0)[3].zero_(), 1),
    "split": (lambda td: td.split(100)[2].zero_(), 100),
    "clone(False)": (lambda td: td.clone(False)[9].zero_(), 1),
    "detach": (lambda td: td.detach()[11].zero_(), 1),
    "data": (lambda td: td.data[13].zero_(), 1),
    "reshape": (lambda td: td.reshape(2, 2048)[0, 5].zero_(), None),
    "unsqueeze": (lambda td: td.unsqueeze(0)[:, 6].zero_(), None),
    "nested": (lambda td: td["n"][15].zero_(), 1),
}


@pytest.mark.parametrize("name", sorted(_VIEW_WRITES))
def test_writes_through_views_of_the_tree_are_seen(tmp_path: Path, name: str) -> None:
    """A write through a tree that views the saved one (select, exclude, an index, unbind,
    split, detach, a reshape) is a write of the tree's rows: the next checkpoint equals a full
    copy. They stamped nothing, and checkpoints kept the old values (found by an attack). A
    view of rows stamps those rows only; a shape operation's view stamps every row."""
    td = TensorDict(
        {
            "x": torch.full((4096, 1024), 0.5),
            "y": torch.zeros(4096, 2),
            "n": {"z": torch.ones(4096)},
        },
        [4096],
    ).memmap(tmp_path / "live")
    dest = tmp_path / "ckpt"
    td.checkpoint(dest)
    td.checkpoint(dest)
    td.checkpoint(dest)  # both generations up to date: the next copies this write's rows only
    write, most = _VIEW_WRITES[name]
    write(td)
    stats = td.checkpoint(dest)
    assert_same_as_full_copy(td, dest, tmp_path)
    if most is not None:
        assert stats["bytes_written"] <= (most + 1) * 4096 * 2 + 4096, stats


@pytest.mark.skipif(sys.platform != "linux", reason="forks a child that kills itself")
def test_a_checkpoint_after_a_save_killed_inside_its_commit(tmp_path: Path) -> None:
    """Another process's save into the tree's directory died inside its commit, at every step
    in turn: the checkpoint finishes that commit first (as a load does) and copies the tree it
    committed. It raised FileNotFoundError (the half-moved directory had no meta.json) at 7 of
    the steps, and copied the tree from before the commit point at another (found by an
    attack)."""
    from ..robustness._attack_helpers import JOURNAL, killed_save, tree, versions

    journals = 0
    for step in range(12):
        base = tmp_path / str(step)
        live = tree(1).memmap(base / "live")
        live.checkpoint(base / "ckpt")
        killed_save(
            lambda base=base: tree(2, keys=("obs",)).memmap(base / "live", existsok=True), step
        )
        journals += (base / "live" / JOURNAL).exists()
        live.checkpoint(base / "ckpt")
        for load in (TensorDict.load_memmap, tensordict.TensorDict.load_memmap):
            assert set(versions(load(base / "ckpt")).values()) == {2.0}, (step, load)
    assert journals >= 8  # the kills landed inside commits


@tensorclass_rs
class _Step:
    obs: torch.Tensor
    reward: torch.Tensor


def test_a_tensorclass_is_checkpointed_with_its_class(tmp_path: Path) -> None:
    """A memory-mapped tensorclass checkpointed its TensorDict only: the checkpoint was a plain
    TensorDict directory (no meta.json naming the class), which both libraries loaded without
    the class, unlike memmap(dest, copy_existing=True). It now holds the whole tensorclass
    directory, incrementally."""
    step = _Step(obs=torch.zeros(1000, 16), reward=torch.arange(1000.0), batch_size=[1000])
    step = step.memmap(tmp_path / "live")
    step.checkpoint(tmp_path / "ckpt")
    step[7] = _Step(obs=torch.ones(16), reward=torch.tensor(-1.0), batch_size=[])
    written = step.checkpoint(tmp_path / "ckpt")["bytes_written"]
    assert 0 < written <= 2 * 4096 + 4096  # the block of row 7 in each file, not the whole
    step.memmap(tmp_path / "full", copy_existing=True)
    assert tree_files(tmp_path / "ckpt") == tree_files(tmp_path / "full")
    back = _Step.load_memmap(tmp_path / "ckpt")
    assert type(back) is _Step and back.reward[7] == -1 and back.obs[7].eq(1).all()
