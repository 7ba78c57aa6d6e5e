"""Sharing across processes: fork, spawn and forkserver; Process arguments, Queues, Pools and
DataLoader workers; 1, 300 and 10,000 leaves; descriptor counts before and after; writes seen
both ways; a small /dev/shm; plain pickle refused at the caller; share_memory_/is_shared side
by side with tensordict.

Every wait on another process has a timeout, so that nothing here can hang CI.
``TDRS_SHARING_ROUNDS`` sets the round trips of the leak test (default 1,000).
"""

from __future__ import annotations

import errno
import gc
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch
from tensordict_rs import MemoryMappedTensor, TensorDict, _native
from torch.utils.data import DataLoader

METHODS = ["fork", "spawn", "forkserver"]
# ``default``: no context named (``mp.Process``, ``mp.Queue``, a DataLoader without
# ``multiprocessing_context``), whatever the process default is: fork on Linux before 3.14,
# forkserver from 3.14 on (and under TDRS_START_METHOD=forkserver, see conftest.py), as users'
# programs run on those versions. No forkserver preload is set for it: its children import
# torch and tensordict_rs themselves, as they do in a program that sets nothing.
WITH_DEFAULT = [*METHODS, "default"]
ROUNDS = int(os.environ.get("TDRS_SHARING_ROUNDS", "1000"))
WAIT = 120  # seconds any one wait on a child may take (a spawn child imports torch)

_preloaded = False


def context(method: str) -> Any:
    """The start method's context; forkserver children fork from a server that has torch.

    ``default`` is the ``multiprocessing`` module itself: its Process, Queue and Pool follow
    the process's default start method.
    """
    global _preloaded
    if method == "default":
        return mp
    ctx = mp.get_context(method)
    if method == "forkserver" and not _preloaded:
        ctx.set_forkserver_preload(["torch", "tensordict_rs", "test_sharing"])
        _preloaded = True
    return ctx


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def memfds() -> int:
    """Descriptors of this process that are tensordict-rs shared memory."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:tensordict-rs"):
                count += 1
        except OSError:
            pass
    return count


def steady(count: Any, seconds: float = 5.0, still: float = 0.2) -> int:
    """``count()`` once it has stopped changing for ``still`` seconds (at most ``seconds``):
    the starting figure of a descriptor count, taken after the garbage of earlier tests (Process
    and Popen objects, trees holding arenas) is collected and resource_sharer's thread has closed
    what it sent, so that nothing closed during the test shifts the figure it is compared with
    (a count taken at once failed twice under a load of 7-8)."""
    gc.collect()
    deadline = time.monotonic() + seconds
    last, since = count(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still:
            break
    return last


def settles(count: Any, expected: int, seconds: float = 5.0, slack: int = 0) -> bool:
    """Whether ``count()`` reaches ``expected`` (up to ``slack`` more) within ``seconds``
    (resource_sharer's thread closes the duplicate it sent a moment after it was fetched)."""
    gc.collect()  # Process and Popen objects of earlier tests may still hold arenas
    deadline = time.monotonic() + seconds
    while not expected <= count() <= expected + slack:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# A DataLoader worker's batch crosses in a slot of the worker's ring (share/ring.py): the main
# process holds one descriptor per slab it was sent, and a worker's ring may hold
# prefetch_factor (2) + 1 slots more than the batches kept (docs/guide/sharing.md)
RING_SPARE = 2 * (2 + 1)  # two workers


def regions(td: Any) -> set[Any]:
    """The mapped regions the leaves of ``td`` view: an arena (memory-mapped leaves) or a ring
    slot's slab (plain tensors of a DataLoader batch)."""
    found: set[Any] = set()
    for t in td.values(True, True):
        buffer = getattr(t, "_buffer", None)
        found.add(buffer.region_id if buffer is not None else t.untyped_storage().data_ptr())
    return found


def ring_batch(td: Any) -> bool:
    """Whether ``td`` came back through a worker's ring (its leaves are plain tensors)."""
    return all(getattr(t, "_buffer", None) is None for t in td.values(True, True))


def tree(leaves: int, value: float = 0.0) -> TensorDict:
    """``leaves`` leaves of float32 [4, 2] under two levels, batch [4]; leaf i holds value + i."""
    td = TensorDict({}, [4])
    for i in range(leaves):
        td[f"g{i % 10}", f"k{i}"] = torch.full((4, 2), value + i)
    return td


def leaf(td: TensorDict, i: int) -> torch.Tensor:
    return td[f"g{i % 10}", f"k{i}"]


def identity(batch: Any) -> Any:
    """The DataLoader collate_fn of the tests (module level: spawn children import it)."""
    return batch


# ------------------------------------------------------------------------ child functions


def child_main(trees: dict[str, Any], inbox: Any, outbox: Any) -> None:
    """Checks what it received, writes into it, echoes what comes in until None."""
    report: dict[str, Any] = {"memfds": memfds()}
    for name, td in trees.items():
        if isinstance(td, TensorDict):
            report[name] = (
                tuple(td.batch_size),
                td.is_locked,
                len(td.keys(include_nested=True, leaves_only=True)),
                td.is_memmap(),
                td.is_shared(),
            )
    small = trees["small"]
    leaf(small, 0).add_(1)  # the parent must see this
    big = trees["big"]
    leaf(big, 9999).fill_(-1)
    trees["mmt"][3] = 42
    trees["file"]["x"][0] = 7
    trees["shared"]["a"][1] = 5
    outbox.put(report)
    # the parent wrote after our report: read it back
    assert inbox.get(timeout=WAIT) == "written"
    outbox.put((float(leaf(small, 0)[0, 0]), float(leaf(big, 1)[3, 1])))
    del trees, small, big
    start = None
    while True:
        item = inbox.get(timeout=WAIT)
        if item is None:
            break
        if isinstance(item, str) and item == "mark":
            start = open_fds()
            outbox.put("marked")
            continue
        outbox.put(item)
    outbox.put((start, open_fds(), memfds()))


def pool_fill(td: TensorDict, value: float) -> TensorDict:
    for _, sub in td.items():
        for t in sub.values():
            t.fill_(value)
    return td


def pool_sum(t: MemoryMappedTensor) -> float:
    return float(t.sum())


# ------------------------------------------------------------------------ tests


@pytest.mark.parametrize("method", WITH_DEFAULT)
def test_process_queue_and_pool(method: str, tmp_path: Path) -> None:
    ctx = context(method)
    method = ctx.get_start_method()  # what ``default`` is in this process
    gc.collect()
    memfds_before = steady(memfds)
    small = tree(1).memmap_()
    mid = tree(300).memmap_()
    big = tree(10_000).memmap_()
    mmt = MemoryMappedTensor.from_tensor(torch.zeros(10))
    file = TensorDict({"x": torch.zeros(3)}, [3]).memmap_(tmp_path / "f")
    shared = TensorDict({"a": torch.zeros(3)}, [3]).share_memory_()
    trees = {"small": small, "mid": mid, "big": big, "mmt": mmt, "file": file, "shared": shared}
    assert memfds() - memfds_before == 5  # one per tree, whatever its number of leaves
    inbox, outbox = ctx.Queue(), ctx.Queue()
    # a fork child inherits every memfd this process holds (earlier tests' too), others get ours
    inherited = memfds() if method == "fork" else 5
    child = ctx.Process(target=child_main, args=(trees, inbox, outbox), daemon=True)
    child.start()
    try:
        report = outbox.get(timeout=WAIT)
        assert report["small"] == ((4,), True, 1, True, False)
        assert report["mid"] == ((4,), True, 300, True, False)
        assert report["big"] == ((4,), True, 10_000, True, False)
        assert report["file"] == ((3,), True, 1, True, False)
        assert report["shared"] == ((3,), True, 1, False, True)
        assert report["memfds"] <= inherited, report
        # the child's writes, seen here
        assert leaf(small, 0)[0, 0] == 1 and leaf(big, 9999)[3, 1] == -1
        assert mmt[3] == 42 and file["x"][0] == 7 and shared["a"][1] == 5
        # our writes, seen there
        leaf(small, 0).fill_(11)
        leaf(big, 1).fill_(123)
        inbox.put("written")
        assert outbox.get(timeout=WAIT) == (11.0, 123.0)
        # round trips over the queues: no descriptor left behind on either side
        payload = tree(3).memmap_()
        for _ in range(2):  # warm-up: queue feeder threads, resource_sharer listeners
            inbox.put(payload)
            outbox.get(timeout=WAIT)
        inbox.put("mark")
        assert outbox.get(timeout=WAIT) == "marked"
        start = open_fds()
        for i in range(ROUNDS):
            inbox.put(payload)
            back = outbox.get(timeout=WAIT)
            if i == 0:
                leaf(back, 2).fill_(9)  # the echo maps the very same memory
                assert leaf(payload, 2)[0, 0] == 9
            del back
        assert settles(open_fds, start), (start, open_fds())
        inbox.put(None)
        child_start, child_end, child_memfds = outbox.get(timeout=WAIT)
        # fewer at the end is fine (transients of the mark closed since); more would be a leak
        assert child_end <= child_start, (child_start, child_end)
        # the trees it was started with (its Process object keeps its arguments), plus at most
        # the payload's arena: the round trips added nothing
        assert child_memfds <= report["memfds"] + 1, (report["memfds"], child_memfds)
        child.join(WAIT)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
    # a Pool worker: the task and its result cross as one descriptor each
    with ctx.Pool(1) as pool:
        back = pool.apply_async(pool_fill, (mid, 2.5)).get(WAIT)
        assert float(leaf(mid, 299)[0, 0]) == 2.5  # written by the worker into our memory
        assert back.batch_size == (4,) and back.is_locked
        assert float(leaf(back, 7)[1, 1]) == 2.5
        assert pool.apply_async(pool_sum, (mmt[2:5],)).get(WAIT) == 42.0
    del trees, small, mid, big, mmt, file, shared, back, payload
    assert settles(memfds, memfds_before)  # every arena freed with its last user


def test_received_leaves_are_views_of_the_same_memory() -> None:
    td = tree(300).memmap_()
    before = steady(open_fds)
    back = pickle.loads(ForkingPickler.dumps(td))
    assert settles(open_fds, before, slack=1)  # + resource_sharer's listener, started once
    leaf(back, 17).fill_(3.5)
    assert leaf(td, 17).eq(3.5).all()
    assert back.keys(include_nested=True) == td.keys(include_nested=True)
    # views and single MemoryMappedTensors keep their geometry
    mmt = MemoryMappedTensor.from_tensor(torch.arange(24.0).reshape(4, 6))
    view = mmt[1:, ::2]
    got = pickle.loads(ForkingPickler.dumps(view))
    assert isinstance(got, MemoryMappedTensor) and torch.equal(got, view)
    got.fill_(-1)
    assert mmt[1:, ::2].eq(-1).all() and mmt[0].eq(torch.arange(6.0)).all()


@pytest.mark.parametrize("how", ["share_memory_", "memmap_", "memmap_dir"])
@pytest.mark.parametrize(
    "view",
    [
        lambda t: t.transpose(0, 1),
        lambda t: t.permute(1, 0),
        lambda t: t.unsqueeze(0),
        lambda t: t.view(-1),
        lambda t: t.reshape(6),
        lambda t: t.expand(2, 3, 2)[1],
    ],
    ids=["transpose", "permute", "unsqueeze", "view", "reshape", "expand"],
)
def test_shape_views_cross_processes_as_views(how: str, view: Any, tmp_path: Path) -> None:
    """A transposed (permuted, reshaped, ...) view of a shared or memory-mapped tree crossed
    processes as a copy: its leaves were plain tensors, so the receiver's writes were lost
    (tensordict shares them). The tree's leaves now stay MemoryMappedTensors of the same map,
    as its rows do."""
    td = TensorDict({"f": torch.zeros(3, 2)}, [3, 2])
    td = td.memmap_(tmp_path / "t") if how == "memmap_dir" else getattr(td, how)()
    sent = view(td)
    assert isinstance(sent["f"], MemoryMappedTensor)
    got = pickle.loads(ForkingPickler.dumps(sent))
    got["f"].fill_(1.0)
    assert td["f"].eq(1.0).all()
    # (a MemoryMappedTensor's own shape operations give plain tensors, as tensordict's do)
    assert type(td["f"].transpose(0, 1)) is torch.Tensor


def test_plain_leaves_cross_as_one_arena() -> None:
    td = TensorDict(
        {
            "a": torch.arange(12).reshape(4, 3),
            "b": {"c": torch.rand(4, 2, 2).transpose(1, 2), "d": torch.ones(4, dtype=torch.bool)},
            "e": torch.zeros(4, 0),
            "s": "text",
        },
        [4],
    )
    before = steady(memfds)
    data = ForkingPickler.dumps(td)
    back = pickle.loads(data)
    for key in [("a",), ("b", "c"), ("b", "d"), ("e",)]:
        assert torch.equal(back[key], td[key]), key
    assert back["s"] == "text"
    regions = {back[k]._buffer.region_id for k in [("a",), ("b", "c"), ("b", "d")]}
    assert len(regions) == 1  # one arena for every plain leaf
    assert settles(memfds, before + 1)
    del back, data
    assert settles(memfds, before)


def test_plain_pickle_refuses_anonymous_memory_at_the_caller(tmp_path: Path) -> None:
    td = tree(3).memmap_()
    with pytest.raises(RuntimeError, match="multiprocessing"):
        pickle.dumps(td)
    with pytest.raises(RuntimeError, match="anonymous MemoryMappedTensor cannot be pickled"):
        pickle.dumps(MemoryMappedTensor.from_tensor(torch.ones(2)))
    # file-backed trees still pickle by path
    saved = tree(3).memmap_(tmp_path / "t")
    assert torch.equal(leaf(pickle.loads(pickle.dumps(saved)), 2), leaf(saved, 2))


def test_spawn_queue_of_anonymous_tree_does_not_hang() -> None:
    # The reference's anonymous maps fail in the Queue's feeder thread and the getter waits
    # forever; here the tree crosses, and a failure would surface as the timeout below.
    ctx = context("spawn")
    q = ctx.Queue()
    td = tree(300).memmap_()
    q.put(td)
    back = q.get(timeout=10)
    assert leaf(back, 299)[0, 0] == 299
    q.close()
    q.join_thread()


def test_share_memory_like_the_reference() -> None:
    ref = tensordict.TensorDict({"a": torch.zeros(3), "n": {"b": torch.ones(3, 2)}}, [3])
    ours = TensorDict({"a": torch.zeros(3), "n": {"b": torch.ones(3, 2)}}, [3])
    for td in (ref, ours):
        assert not td.is_shared()
        assert td.share_memory_() is td
        assert td.is_shared() and td.is_locked and not td.is_memmap()
        assert td["n"].is_shared()
        assert td[0].is_shared() and td[:2].is_shared()
        assert not td[torch.tensor([0, 1])].is_shared()
        assert torch.equal(td["n", "b"], torch.ones(3, 2))
        td.unlock_()
        assert not td.is_shared()
    for td in (
        tensordict.TensorDict({"a": torch.zeros(3)}, [3]).memmap_(),
        TensorDict({"a": torch.zeros(3)}, [3]).memmap_(),
    ):
        assert not td.is_shared()
        with pytest.raises(RuntimeError, match="mutually exclusive"):
            td.share_memory_()


def test_getitems_is_one_gather() -> None:
    ref = tensordict.TensorDict({"x": torch.arange(40.0).reshape(20, 2)}, [20])
    ours = TensorDict({"x": torch.arange(40.0).reshape(20, 2)}, [20]).memmap_()
    idx = [3, 0, 19, 3]
    assert torch.equal(ours.__getitems__(idx)["x"], ref.__getitems__(idx)["x"])
    batches = list(DataLoader(ours, batch_size=8, collate_fn=identity))
    assert [b.batch_size for b in batches] == [(8,), (8,), (4,)]
    assert torch.equal(torch.cat([b["x"] for b in batches]), ours["x"])


@pytest.mark.parametrize("method", WITH_DEFAULT)
def test_dataloader_workers(method: str, tmp_path: Path) -> None:
    rows = 64
    data = TensorDict({}, [rows])
    for i in range(300):  # more than forkserver's 252 fds per message, were it one per leaf
        data[f"g{i % 10}", f"k{i}"] = torch.arange(rows, dtype=torch.float32) * i
    data.memmap_()
    saved = data.memmap(tmp_path / "saved")
    # anonymous and file-backed leaves in one dataset: one fd per arena, paths for the files
    dataset = TensorDict({"anon": data, "file": saved}, [rows])
    loader = DataLoader(
        dataset,
        batch_size=16,
        shuffle=True,
        num_workers=2,
        collate_fn=identity,
        multiprocessing_context=None if method == "default" else context(method),
        persistent_workers=False,
        timeout=WAIT,
    )
    gc.collect()
    before = steady(memfds)
    batches = list(loader)
    assert len(batches) == rows // 16
    # one region (one descriptor: a ring slot's slab, or an arena with the ring off) per batch,
    # not one per leaf; a ring may hold a few spare slabs besides
    held = set().union(*(regions(b) for b in batches))
    assert len(held) == len(batches)
    spare = RING_SPARE if all(ring_batch(b) for b in batches) else 0
    assert settles(memfds, before + len(held), slack=spare)
    for b in batches:
        assert isinstance(b, TensorDict) and b.batch_size == (16,)
        rows_seen = b["anon", "g1", "k1"].long()
        assert torch.equal(b["anon", "g7", "k297"], rows_seen.float() * 297)
        assert torch.equal(b["file", "g7", "k297"], rows_seen.float() * 297)
        assert len(regions(b)) == 1
    seen = torch.cat([b["anon", "g1", "k1"] for b in batches]).sort().values
    assert torch.equal(seen, torch.arange(rows, dtype=torch.float32))
    del batches, b
    assert settles(memfds, before)


def test_dataloader_without_workers() -> None:
    data = tree(64).memmap_()
    batches = list(DataLoader(data, batch_size=3, collate_fn=identity, num_workers=0))
    assert [b.batch_size for b in batches] == [(3,), (1,)]
    assert torch.equal(leaf(batches[1], 63), leaf(data, 63)[3:])


def test_memfd_beyond_memory_is_an_oserror() -> None:
    if not Path("/proc/meminfo").exists():
        pytest.skip("no /proc/meminfo: the memory check cannot run")
    with pytest.raises(OSError) as info:
        MemoryMappedTensor.empty(1 << 50, dtype=torch.uint8)
    assert info.value.errno in (errno.ENOMEM, errno.ENOSPC, errno.EFBIG)


SMALL_SHM = textwrap.dedent(
    """
    import errno, os, torch
    from tensordict_rs import MemoryMappedTensor, TensorDict
    mib = 1 << 20
    # memfds are not bounded by the /dev/shm mount: 32 MiB work with an 8 MiB /dev/shm
    t = MemoryMappedTensor.empty(32 * mib, dtype=torch.uint8)
    t.fill_(1)
    assert int(t[-1]) == 1
    del t
    os.environ["TENSORDICT_RS_ANON_DIR"] = "/dev/shm"
    try:
        MemoryMappedTensor.empty(32 * mib, dtype=torch.uint8)
    except OSError as err:
        assert err.errno == errno.ENOSPC and "/dev/shm" in str(err), err
    else:
        raise AssertionError("no OSError")
    td = TensorDict({f"k{i}": torch.ones(mib // 4) for i in range(16)}, [])
    try:
        td.memmap_()
    except OSError as err:
        assert err.errno == errno.ENOSPC, err
    else:
        raise AssertionError("no OSError")
    assert not td.is_memmap() and type(td["k3"]) is torch.Tensor  # left as it was
    small = TensorDict({"a": torch.ones(1024)}, []).memmap_()  # what fits still works
    assert float(small["a"].sum()) == 1024
    print("ok")
    """
)


def test_small_dev_shm_gives_oserror_not_sigbus() -> None:
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) to mount a small /dev/shm")
    probe = subprocess.run(
        [unshare, "-m", "sh", "-c", "mount -t tmpfs -o size=8m tmpfs /dev/shm"],
        capture_output=True,
        timeout=30,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace: {probe.stderr.decode()[:200]}")
    script = 'mount -t tmpfs -o size=8m tmpfs /dev/shm && exec "$0" -c "$1"'
    result = subprocess.run(
        [unshare, "-m", "sh", "-c", script, sys.executable, SMALL_SHM],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env={k: v for k, v in os.environ.items() if k != "TENSORDICT_RS_ANON_DIR"},
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])  # -7: SIGBUS
    assert result.stdout.strip() == "ok"


def test_open_files_releases_gil(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from .._gil_probe import MIN_TURNS, probe_thread

    leaves = 2500
    TensorDict({f"k{i}": torch.full((2,), float(i)) for i in range(leaves)}, [2]).memmap_(
        tmp_path / "t"
    )
    loaded = TensorDict.load_memmap(tmp_path / "t")
    with probe_thread() as probe:
        monkeypatch.setattr(_native, "open_files", probe.watch(_native.open_files))
        back = pickle.loads(ForkingPickler.dumps(loaded))
    assert probe.calls == 1
    assert probe.turns >= MIN_TURNS, probe.turns
    assert back[f"k{leaves - 1}"].tolist() == [leaves - 1.0] * 2


def test_receive_shared_validates_slices() -> None:
    t = MemoryMappedTensor.from_tensor(torch.zeros(16))
    fd, nbytes, offset = t._buffer.share_handle
    with pytest.raises(ValueError, match="outside"):
        _native.receive_shared(os.dup(fd), nbytes, [(offset, nbytes + 1)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_pin_memory_and_a_pinning_dataloader() -> None:
    data = tree(8).memmap_()
    pinned = data.pin_memory()
    assert all(t.is_pinned() for t in pinned.values(True, True))
    assert torch.equal(leaf(pinned, 7), leaf(data, 7))
    loader = DataLoader(data, batch_size=2, collate_fn=identity, num_workers=0, pin_memory=True)
    batch = next(iter(loader))
    assert isinstance(batch, TensorDict) and leaf(batch, 3).is_pinned()


def test_pin_memory_inplace_replaces_every_leaf(monkeypatch: pytest.MonkeyPatch) -> None:
    # pinning needs an accelerator: a stand-in returns a marked copy of each leaf
    pinned: list[torch.Tensor] = []

    def fake_pin_memory(t: torch.Tensor) -> torch.Tensor:
        out = t.clone() + 100
        pinned.append(out)
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin_memory)
    td = TensorDict({"a": torch.zeros(2), "b": {"c": torch.ones(2)}}, [2])
    assert td.pin_memory(inplace=True) is td
    assert td["a"] is pinned[0] and td["b", "c"] is pinned[1]
    assert td["a"].tolist() == [100.0, 100.0] and td["b", "c"].tolist() == [101.0, 101.0]
    copy = TensorDict({"a": torch.zeros(2)}, [2]).pin_memory()
    assert copy["a"] is pinned[2]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_float8_leaves_live_in_memory_maps(dtype: torch.dtype, tmp_path: Path) -> None:
    """8-bit float leaves (FP8 weights) were refused by share_memory_, anonymous memmap_ and
    pickles ("cannot be stored in a memory-mapped directory"), which tensordict does; they now
    live in anonymous maps and cross processes as the same memory. A directory still refuses
    them: tensordict writes float8 directories it cannot load again."""
    from tensordict_rs import UnsupportedFormatError

    x = torch.tensor([0.5, 1.0, -2.0]).to(dtype)
    for td in (
        TensorDict({"x": x}, [3]).share_memory_(),
        TensorDict({"x": x}, [3]).memmap_(),
        TensorDict({"x": x}, [3]).memmap_like(),
    ):
        assert td["x"].dtype == dtype and isinstance(td["x"], MemoryMappedTensor)
        got = pickle.loads(bytes(ForkingPickler.dumps(td)))
        got["x"].fill_(1.0)
        assert td["x"].float().tolist() == [1.0] * 3
    leaf = TensorDict({"x": x}, [3]).memmap_()["x"]
    assert pickle.loads(bytes(ForkingPickler.dumps(leaf))).float().tolist() == [0.5, 1.0, -2.0]
    with pytest.raises((TypeError, UnsupportedFormatError), match="float8"):
        TensorDict({"x": x}, [3]).memmap(tmp_path / "d")
    assert not (tmp_path / "d" / "meta.json").exists()
