"""Consolidated messages without a copy: trees memory-mapped without a prefix.

``memmap_()`` lays out a tree's small leaves in its anonymous arena in packed order at the
message's alignment, so the arena is the message: ``send(consolidated=True)`` posts it as it
is and ``recv(consolidated=True)`` receives straight into it. The 2-rank gloo job is in
``_dist_zero_copy_jobs.py``; the layout and its recognition are checked here without a group.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest
import tensordict_rs
import torch
from tensordict_rs import TensorDict, _native
from tensordict_rs.share import packed as _packed
from tensordict_rs.share import wire as _dist_wire
from torch import distributed as dist

from . import _dist_zero_copy_jobs as jobs
from ._dist_jobs import same
from .test_distributed import run_job


def _offsets_in_arena(td: TensorDict) -> list[int]:
    table = _packed.plan(td)._addresses
    base = table[0] - table[1]
    return [table[i] - base for i in range(0, len(table), 3)]


def _packed_copy(td: TensorDict) -> bytes:
    """The bytes of every leaf, each at its packed offset, by plain torch copies."""
    plan = _packed.plan(td)
    out = bytearray(plan.total)
    for t, off in zip(plan.materialized(), plan.offsets, strict=True):
        if t.numel():
            raw = bytes(t.contiguous().view(torch.uint8).reshape(-1).numpy())
            out[off : off + len(raw)] = raw
    return bytes(out)


def _without_padding(td: TensorDict, data: bytes) -> list[bytes]:
    plan = _packed.plan(td)
    return [
        data[off : off + t.nbytes] for t, off in zip(plan.materialized(), plan.offsets, strict=True)
    ]


def test_an_anonymous_arena_is_the_packed_layout() -> None:
    td = jobs.small_tree(tensordict_rs, 1).memmap_()
    plan = _packed.plan(td)
    table = plan._addresses
    packed_offsets = [table[i + 1] for i in range(0, len(table), 3)]
    assert _offsets_in_arena(td) == packed_offsets  # every leaf at arena start + its offset
    assert all(off % 64 == 0 for off in plan.offsets) and _packed.ALIGN == 64
    assert plan.whole is not None
    assert plan.whole.data_ptr() == jobs.arena_start(td) and plan.whole.numel() == plan.total
    assert plan.pack() is plan.whole and plan.receive_buffer() is plan.whole  # no copy
    expected = _without_padding(td, _packed_copy(jobs.small_tree(tensordict_rs, 1)))
    assert _without_padding(td, bytes(plan.whole.numpy())) == expected
    # the one tensor is the arena: writing it (a receive) writes the leaves
    plan.whole.zero_()
    assert all(not t.any() for t in plan.materialized())
    # memmap() and memmap_like() (a receiver's usual start) lay out their arenas the same way
    for made in (jobs.small_tree(tensordict_rs, 1).memmap(), td.memmap_like()):
        whole = _packed.plan(made).whole
        assert whole is not None and whole.data_ptr() == jobs.arena_start(made)


def test_leaves_materialized_or_nested_alone_stay_zero_copy() -> None:
    td = jobs.small_tree(tensordict_rs, 2).memmap_()
    start = jobs.arena_start(td)
    first = _packed.plan(td)
    td["m", "x", "deep"]  # a lazy leaf becomes a MemoryMappedTensor: a new plan
    again = _packed.plan(td)
    assert again is not first and again.whole is not None
    assert again.whole.data_ptr() == start
    # a nested node is a contiguous run of the arena in packed order, at a 64-byte offset
    sub = _packed.plan(td["m"])
    assert sub.whole is not None
    assert _without_padding(td["m"], bytes(sub.pack().numpy())) == _without_padding(
        td["m"], _packed_copy(td["m"])
    )
    # a selection with a leaf left out between two others is no run: packed, correct
    picked = td.select("a", "one")
    assert _packed.plan(picked).whole is None
    got = bytes(_packed.plan(picked).pack().numpy())
    assert _without_padding(picked, got) == _without_padding(picked, _packed_copy(picked))


def test_large_leaves_swapped_leaves_and_files_fall_back_to_packing(tmp_path: Path) -> None:
    big = jobs.small_tree(tensordict_rs, 3, large=True).memmap_()
    plan = _packed.plan(big)
    assert plan.whole is None and plan.table is not None
    assert _without_padding(big, bytes(plan.pack().numpy())) == _without_padding(
        big, _packed_copy(jobs.small_tree(tensordict_rs, 3, large=True))
    )
    td = jobs.small_tree(tensordict_rs, 4).memmap_()
    assert _packed.plan(td).whole is not None
    td.unlock_()
    td["m", "b"] = torch.full((3,), 2.5, dtype=torch.float64)
    plan = _packed.plan(td)
    assert plan.whole is None
    ref = jobs.small_tree(tensordict_rs, 4)
    ref["m", "b"] = torch.full((3,), 2.5, dtype=torch.float64)
    assert _without_padding(td, bytes(plan.pack().numpy())) == _without_padding(
        td, _packed_copy(ref)
    )
    # file-backed saves keep one file per leaf (the on-disk format is unchanged): packed
    saved = jobs.small_tree(tensordict_rs, 5).memmap_(tmp_path / "saved")
    assert _packed.plan(saved).whole is None
    same(TensorDict.load_memmap(tmp_path / "saved"), jobs.small_tree(tensordict_rs, 5))
    assert (tmp_path / "saved" / "m" / "x" / "deep.memmap").stat().st_size == 70


def test_memmap_keeps_the_insertion_order_of_keys() -> None:
    # memmap_() without a prefix lays out the arena in sorted keys; the tree keeps its order
    td = jobs.small_tree(tensordict_rs, 6)
    keys = list(td.keys(include_nested=True, leaves_only=True))
    mapped = jobs.small_tree(tensordict_rs, 6).memmap_()
    assert list(mapped.keys(include_nested=True, leaves_only=True)) == keys  # insertion order
    same(mapped, td)


def test_arena_span_is_checked_natively(tmp_path: Path) -> None:
    td = jobs.small_tree(tensordict_rs, 7).memmap_()
    buffer = td._tensordict["a"].buffer
    span = buffer.arena_span(buffer.address, buffer.nbytes)
    assert (
        span is not None and span.address == buffer.address and span.region_id == (buffer.region_id)
    )
    assert buffer.arena_span(buffer.address - (1 << 40), 8) is None
    assert buffer.arena_span(buffer.address, 1 << 40) is None
    assert buffer.arena_span(buffer.address, 0) is None
    file_backed = jobs.small_tree(tensordict_rs, 7).memmap_(tmp_path / "f")
    leaf = file_backed._tensordict["a"]
    leaf = leaf.buffer if hasattr(leaf, "buffer") else leaf._buffer
    assert leaf.arena_span(leaf.address, leaf.nbytes) is None  # a file: never sent as an arena
    whole = _packed.plan(td).whole
    assert whole is not None
    del td, buffer, span  # the one tensor keeps the arena mapped
    whole[:1] = 7
    assert ctypes.string_at(whole.data_ptr(), 1) == b"\x07"


def test_tiny_leaves_take_64_bytes_each_in_a_message() -> None:
    td = TensorDict({f"k{i:03d}": torch.ones(1, dtype=torch.uint8) for i in range(100)}, [])
    assert _packed.plan(td).total == 99 * 64 + 1


def test_a_sender_of_the_previous_protocol_is_refused() -> None:
    old = torch.tensor([0x7464_7273_3031, 10, 64], dtype=torch.int64)
    with pytest.raises(_native.TensorDictError, match="description protocol"):
        _dist_wire.check_header(old)
    assert _dist_wire.check_header(_dist_wire.header(b"x" * 10, 64, torch.device("cpu"))) == (
        10,
        64,
    )


@pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch has no gloo backend"
)
def test_memmapped_trees_travel_without_a_copy_two_ranks(tmp_path: Path) -> None:
    run_job(jobs.zero_copy, ["tensordict_rs"] * 2, tmp_path)


def test_a_read_only_tree_is_refused_before_its_arena_is_used() -> None:
    # no anonymous arena is ever read-only, but the refusal must come before the arena path
    from tensordict_rs.share import distributed

    td = jobs.small_tree(tensordict_rs, 8).memmap_()
    plan = _packed.plan(td)
    assert plan.whole is not None and plan.receive_buffer() is plan.whole
    plan.writable = False  # as a plan over a read-only map is
    with pytest.raises(RuntimeError, match="read-only memory map"):
        plan.receive_buffer()
    with pytest.raises(RuntimeError, match="read-only memory map"):
        distributed._recv(td, None, 0, False, True, False)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="read-only memory map"):
        plan.unpack(torch.empty(plan.total, dtype=torch.uint8))


@pytest.mark.parametrize("mapped", [True, False])
def test_bytes_between_leaves_that_another_tensor_views_are_never_received_over(
    mapped: bool,
) -> None:
    """Leaves in one buffer at their packed offsets, but slices of bigger tensors: the bytes
    between them belong to those tensors. They are sent from the buffer in place (reading is
    harmless) but received through a scatter, so the message's padding never lands on them."""
    if mapped:
        base = TensorDict({"a": torch.arange(16.0), "b": torch.ones(16)}, []).memmap_()
        a, b = base["a"], base["b"]
    else:
        flat = torch.arange(48.0)
        a, b = flat[:16], flat[16:32]  # b at byte 64: the packed offset after an 8-byte "a"
    before = a.clone()
    td = TensorDict({"a": a[:2], "b": b}, [])
    plan = _packed.plan(td)
    assert plan.whole is not None and plan.whole.data_ptr() == a.data_ptr()  # sent in place
    message = torch.full((plan.total,), 0xAB, dtype=torch.uint8)
    message[:8] = torch.tensor([7.0, 8.0]).view(torch.uint8)
    message[64:] = torch.full((16,), 3.0).view(torch.uint8)
    into = plan.receive_buffer()
    assert into.data_ptr() != plan.whole.data_ptr()
    into.copy_(message)
    plan.unpack(into)
    assert td["a"].tolist() == [7.0, 8.0] and td["b"].eq(3.0).all()
    assert a[2:].tolist() == before[2:].tolist()  # untouched by the padding
    whole_parts = TensorDict({"a": a, "b": b}, [])  # every byte belongs to a leaf, or is padding
    plan = _packed.plan(whole_parts)
    assert plan.receive_buffer().data_ptr() == plan.whole.data_ptr() == a.data_ptr()


def _write_into_received(td: TensorDict, outbox: Any) -> None:
    """Spawned child: reports what it got, writes into a leaf (shared with the parent)."""
    outbox.put((len(td.keys(include_nested=True, leaves_only=True)), td["m", "b"].tolist()))
    td["m", "b"][0] = -5


def test_a_received_tree_crosses_to_a_spawned_child_as_its_arena() -> None:
    """A tree built as ``from_remote_init`` builds it (its leaves lazy slices of one received
    arena) goes to a spawned process (DataLoader workers, collectors) as that arena, and the
    child's writes are the parent's: nothing is copied out of the received buffer."""
    import multiprocessing as mp

    src = jobs.small_tree(tensordict_rs, 3)
    plan = _packed.plan(src)
    received, whole = _packed.build(type(src), plan.description(), plan.total)
    whole.copy_(plan.pack())
    same(received, src)
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    child = ctx.Process(target=_write_into_received, args=(received, outbox))
    child.start()
    try:
        count, first = outbox.get(timeout=120)
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert count == len(received.keys(include_nested=True, leaves_only=True))
    assert first == src["m", "b"].tolist()  # what the child read: the received values
    assert received["m", "b"][0] == -5  # the child's write, in the received arena
    assert _packed.plan(received).whole.data_ptr() == whole.data_ptr()  # still one buffer
