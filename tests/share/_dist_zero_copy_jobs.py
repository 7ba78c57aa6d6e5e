"""The rank side of share/test_dist_zero_copy.py: consolidated sends of memory-mapped trees.

A tree memory-mapped without a prefix keeps its small leaves in one anonymous arena, laid out
as its packed message: it is sent from that arena and received into it, with no pack and no
scatter. Every rank counts the copies the Rust core makes (a counting ``PackedTable``), so
that a zero-copy case asserts none happened and a fallback case asserts some did.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import torch

from ._dist_jobs import P2P_DTYPES, _values, same

COPIES = {"pack": 0, "unpack": 0}
LARGE_PART = 1 << 20  # rust/sys/storage.rs: leaves from this size on live in arenas of their own


class CountingTable:
    """``_native.PackedTable`` that counts its copies (installed in the rank process only)."""

    real: Any = None

    def __init__(self, table: Any, total: int) -> None:
        self._table = self.real(table, total)

    def pack(self, *args: Any) -> None:
        COPIES["pack"] += 1
        self._table.pack(*args)

    def unpack(self, *args: Any) -> None:
        COPIES["unpack"] += 1
        self._table.unpack(*args)


def _count_copies() -> None:
    from tensordict_rs import _native

    if CountingTable.real is None:
        CountingTable.real = _native.PackedTable
        _native.PackedTable = CountingTable  # type: ignore[misc]


def copies() -> tuple[int, int]:
    """(packs, scatters) since the last call."""
    out = (COPIES["pack"], COPIES["unpack"])
    COPIES["pack"] = COPIES["unpack"] = 0
    return out


def small_tree(T: Any, fill: int, *, large: bool = False) -> Any:
    """A nested tree of small leaves: every dtype, keys inserted out of sorted order, 1-byte and
    0-element leaves, sizes that are no multiple of 64; with ``large`` one leaf of 1 MiB."""
    source: dict[str, Any] = {}
    for i, d in enumerate(reversed(P2P_DTYPES)):
        source[f"k{len(P2P_DTYPES) - i:02d}"] = _values(d, (3, 1 + i % 5), fill + i)
    source["one"] = _values(torch.uint8, (1,), fill)  # 1 byte
    source["m"] = {
        "y": _values(torch.bool, (1,), fill + 1),  # 1 byte
        "empty": torch.zeros(0, 3),
        "x": {"deep": _values(torch.int16, (5, 7), fill + 2)},  # 70 bytes
        "b": _values(torch.float64, (3,), fill + 3),  # 24 bytes
    }
    source["a"] = _values(torch.complex64, (9,), fill + 4)  # 72 bytes
    if large:
        source["huge"] = _values(torch.float32, (LARGE_PART // 4 + 3,), fill + 5)
    return T.TensorDict(source, batch_size=[])


def arena_start(td: Any) -> int:
    """Address of the first leaf in packed order (the start of its message in the arena)."""
    from tensordict_rs.share import packed as _packed

    plan = _packed.plan(td)
    return int(plan._addresses[0] - plan._addresses[1])


def _forked_reader(td: Any) -> tuple[int, int, int]:
    """A forked child that maps ``td``'s arena as a worker process would: once told, it sends
    back the bytes of every leaf it sees there. Returns (pid, go fd, result fd)."""
    from tensordict_rs.share import packed as _packed

    table = _packed.plan(td)._addresses
    ranges = [(table[i], table[i + 2]) for i in range(0, len(table), 3)]
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: plain Python only (the parent has gloo threads)
        status = 1
        try:
            os.close(go_w)
            os.close(out_r)
            os.read(go_r, 1)
            data = b"".join(ctypes.string_at(address, n) for address, n in ranges)
            view = memoryview(data)
            while view:
                view = view[os.write(out_w, view) :]
            status = 0
        finally:
            os._exit(status)
    os.close(go_r)
    os.close(out_w)
    return pid, go_w, out_r


def _read_child(pid: int, go: int, result: int) -> bytes:
    os.write(go, b"x")
    os.close(go)
    chunks = []
    while chunk := os.read(result, 1 << 16):
        chunks.append(chunk)
    os.close(result)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return b"".join(chunks)


def _leaf_bytes(td: Any) -> bytes:
    from tensordict_rs.share import packed as _packed

    return b"".join(
        bytes(t.contiguous().view(torch.uint8).reshape(-1).numpy()) if t.numel() else b""
        for t in _packed.plan(td).materialized()
    )


def zero_copy(T: Any, rank: int, world: int, tmp: Path) -> None:
    """memmap_() sender and receiver in every pairing, fallbacks, a leaf swapped between sends."""
    from tensordict_rs.share import packed as _packed

    _count_copies()
    peer = 1 - rank
    if rank == 0:
        # 1. memmap_() sender to a plain receiver: sent from the arena as it is
        src = small_tree(T, 1).memmap_()
        plan = _packed.plan(src)
        assert plan.whole is not None and plan.whole.data_ptr() == arena_start(src)
        copies()
        src.send(dst=peer, consolidated=True)
        assert copies() == (0, 0)
        # 2. plain sender to a memmap_() receiver: packed here (the counter sees it)
        small_tree(T, 2).send(dst=peer, consolidated=True)
        assert copies()[0] > 0
        # 3. memmap_() to memmap_(), twice (the second after an in-place change)
        src = small_tree(T, 3).memmap_()
        src.send(dst=peer, consolidated=True)
        src["m", "x", "deep"].add_(1)  # materializes lazy leaves: a new plan, same arena
        src.send(dst=peer, consolidated=True)
        assert copies() == (0, 0)
        # 4. a 1 MiB leaf lives in another arena: packed, still correct
        big = small_tree(T, 4, large=True).memmap_()
        assert _packed.plan(big).whole is None
        big.send(dst=peer, consolidated=True)
        assert copies()[0] > 0
        # 5. a leaf swapped after the first send: the tree falls back to packing
        src = small_tree(T, 5).memmap_()
        src.send(dst=peer, consolidated=True)
        assert copies() == (0, 0)
        src.unlock_()
        src["m", "b"] = torch.full((3,), -7.5, dtype=torch.float64)
        assert _packed.plan(src).whole is None
        src.send(dst=peer, consolidated=True)
        src.send(dst=peer, consolidated=True)
        assert copies()[0] > 0
        return
    # 1.
    out = small_tree(T, 0)
    copies()
    out.recv(src=peer, consolidated=True)
    same(out, small_tree(T, 1))
    assert copies()[1] > 0  # a plain receiver scatters
    # 2. into the arena, seen by a forked child mapping it
    out = small_tree(T, 0).memmap_()
    plan = _packed.plan(out)
    assert plan.whole is not None and plan.whole.data_ptr() == arena_start(out)
    child = _forked_reader(out)
    out.recv(src=peer, consolidated=True)
    assert copies() == (0, 0)
    same(out, small_tree(T, 2))
    assert _read_child(*child) == _leaf_bytes(small_tree(T, 2))
    # 3.
    out = small_tree(T, 0).memmap_()
    out.recv(src=peer, consolidated=True)
    same(out, small_tree(T, 3))
    out.recv(src=peer, consolidated=True)
    ref = small_tree(T, 3)
    ref["m", "x", "deep"].add_(1)
    same(out, ref)
    assert copies() == (0, 0)
    # 4.
    out = small_tree(T, 0, large=True).memmap_()
    assert _packed.plan(out).whole is None
    out.recv(src=peer, consolidated=True)
    same(out, small_tree(T, 4, large=True))
    assert copies()[1] > 0
    # 5. received into the arena, then a leaf of the receiver swapped too
    out = small_tree(T, 0).memmap_()
    out.recv(src=peer, consolidated=True)
    assert copies() == (0, 0)
    same(out, small_tree(T, 5))
    ref = small_tree(T, 5)
    ref["m", "b"] = torch.full((3,), -7.5, dtype=torch.float64)
    out.recv(src=peer, consolidated=True)  # the sender packs; into the arena here
    same(out, ref)
    assert copies() == (0, 0)
    out.unlock_()
    out["k03"] = torch.zeros_like(out["k03"])  # a plain tensor now: scattered into it
    plan = _packed.plan(out)
    assert plan.whole is None
    out.recv(src=peer, consolidated=True)
    same(out, ref)
    assert type(out._tensordict["k03"]) is torch.Tensor
    assert copies()[1] > 0
