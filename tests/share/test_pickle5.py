"""Pickle protocol 5: one out-of-band buffer per tree, the description in-band, leaves rebuilt
as views of the buffer given back (read-only buffers give read-only trees)."""

from __future__ import annotations

import gc
import mmap
import pickle
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch
from tensordict_rs import TensorDict
from tensordict_rs._native import InvalidTreeError, LockedError
from tensordict_rs.share import packed

from .._trees import make_td


def dumps5(td: Any) -> tuple[bytes, list[pickle.PickleBuffer]]:
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(td, protocol=5, buffer_callback=buffers.append)
    return data, buffers


def leaf_ptrs(td: TensorDict) -> list[int]:
    return [t.data_ptr() for t in td.values(include_nested=True, leaves_only=True)]


def inside(td: TensorDict, start: int, nbytes: int) -> bool:
    return all(
        start <= t.data_ptr() and t.data_ptr() + t.nbytes <= start + nbytes
        for t in td.values(include_nested=True, leaves_only=True)
    )


def big_tree(leaves: int = 4, floats: int = 1 << 16) -> TensorDict:
    return TensorDict(
        {f"k{i}": torch.full((4, floats // 4), float(i)) for i in range(leaves)}
        | {"nested": {"x": torch.arange(4), "note": "hello"}},
        [4],
    )


def lent_read_only(raw: memoryview) -> memoryview:
    """The bytes of ``raw`` in page-aligned memory, lent read-only (as an object store does)."""
    pages = mmap.mmap(-1, raw.nbytes)
    pages[:] = raw
    return memoryview(pages).toreadonly()


def assert_same_values(a: TensorDict, b: TensorDict) -> None:
    assert a.batch_size == b.batch_size
    assert sorted(map(str, a.keys(True, True))) == sorted(map(str, b.keys(True, True)))
    for key in a.keys(include_nested=True, leaves_only=True):
        x, y = a.get(key), b.get(key)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), key
        else:
            assert x == y, key


@pytest.mark.parametrize("make", ["consolidate", "memmap_"])
def test_arena_tree_is_one_buffer_in_place(make: str) -> None:
    td = getattr(make_td(), make)()
    data, buffers = dumps5(td)
    assert len(buffers) == 1
    assert len(data) < 4096
    raw = buffers[0].raw()
    assert inside(td, raw_address(raw), raw.nbytes)  # the sender's own bytes, not a copy
    again = pickle.loads(data, buffers=buffers)
    assert_same_values(again, td)
    assert leaf_ptrs(again) == leaf_ptrs(td)  # views of the same memory
    assert again.is_locked == td.is_locked
    assert again["s"] == "text" and again["n", "deep"].batch_size == torch.Size([4, 3, 5])


def raw_address(raw: memoryview) -> int:
    return torch.frombuffer(raw, dtype=torch.uint8).data_ptr()


def test_plain_tree_is_packed_into_one_buffer() -> None:
    td = big_tree()
    data, buffers = dumps5(td)
    assert len(buffers) == 1 and len(data) < 4096
    raw = buffers[0].raw()
    assert raw.nbytes >= 4 * (1 << 16) * 4
    assert not inside(td, raw_address(raw), raw.nbytes)  # a packed copy
    again = pickle.loads(data, buffers=buffers)
    assert_same_values(again, td)
    assert inside(again, raw_address(raw), raw.nbytes)
    assert again["nested", "note"] == "hello"
    assert not again.is_read_only  # the PickleBuffer lends the arena writable


def test_tree_of_several_arenas_goes_as_one_buffer() -> None:
    td = big_tree(leaves=6, floats=1 << 19).memmap_()  # 2 MiB leaves: parts of several arenas
    data, buffers = dumps5(td)
    assert len(buffers) == 1 and len(data) < 4096
    assert_same_values(pickle.loads(data, buffers=buffers), td)


def test_read_only_buffer_gives_a_read_only_tree() -> None:
    td = make_td().consolidate()
    data, buffers = dumps5(td)
    view = lent_read_only(buffers[0].raw())  # what an object store lends
    frozen = bytes(view)
    again = pickle.loads(data, buffers=[view])
    assert again.is_read_only and again["n"].is_read_only
    assert inside(again, raw_address(view), len(frozen))
    assert_same_values(again, td)
    writes = [
        lambda: again.zero_(),
        lambda: again.fill_("a", 1.0),
        lambda: again.set_("a", torch.ones(4, 3, 2)),
        lambda: again.update_({"a": torch.ones(4, 3, 2)}),
        lambda: again.apply_(lambda t: t + 1),
        lambda: again.add_(1),
        lambda: again.copy_(td),
        lambda: again.__setitem__(0, 0.0),
        lambda: again[1:].zero_(),  # a view of the same read-only bytes
        lambda: again["n"].zero_(),
        lambda: again.masked_fill_(torch.ones(4, 3, dtype=torch.bool), 0.0),
        lambda: again.maximum_(td),  # these five were not refused
        lambda: again.minimum_(td),
        lambda: again.lerp_(td, 0.5),
        lambda: again.addcmul_(td, td),
        lambda: again.addcdiv_(td, td + 1),
    ]
    for write in writes:
        with pytest.raises(LockedError, match=r"read-only buffer.*td\.clone\(\)"):
            write()
    assert bytes(view) == frozen
    copy = again.clone()
    assert not copy.is_read_only
    assert_same_values(copy, td)
    assert not inside(copy, raw_address(view), len(frozen))
    copy.zero_()
    assert again["a"].sum().item() == td["a"].sum().item()


def test_clone_of_an_arena_tree_is_one_copy() -> None:
    td = make_td().consolidate()
    copy = td.clone()
    whole = packed.plan(copy).whole
    assert whole is not None and whole.data_ptr() != packed.plan(td).whole.data_ptr()
    assert inside(copy, whole.data_ptr(), whole.numel())
    assert all(type(t) is torch.Tensor for t in copy.values(True, True))
    assert not copy.is_locked
    assert_same_values(copy, td)


def test_the_buffer_lives_as_long_as_a_leaf() -> None:
    td = big_tree(leaves=2)
    data, buffers = dumps5(td)
    raw = buffers[0].raw()
    pages = mmap.mmap(-1, raw.nbytes)  # page-aligned: viewed in place, not copied
    pages[:] = raw
    del buffers, raw
    again = pickle.loads(data, buffers=[memoryview(pages)])
    assert inside(again, raw_address(memoryview(pages)), len(pages))
    leaf = again["k1"]
    del again
    gc.collect()
    with pytest.raises(BufferError):  # still exported: the leaf holds the view
        pages.close()
    assert leaf.eq(1.0).all()
    del leaf
    gc.collect()
    pages.close()  # every view released


def test_in_band_protocol_5_loads_a_writable_copy() -> None:
    td = make_td().consolidate()
    data = pickle.dumps(td, protocol=5)
    assert len(data) > td["a"].nbytes
    again = pickle.loads(data)
    assert_same_values(again, td)
    assert not again.is_read_only
    again.unlock_()["a"].zero_()
    assert td["a"].sum().item() > 0


def test_unaligned_buffer_is_copied_into_an_arena() -> None:
    td = big_tree(leaves=2)
    data, buffers = dumps5(td)
    raw = buffers[0].raw()
    store = bytearray(raw.nbytes + 1)
    store[1:] = raw
    again = pickle.loads(data, buffers=[memoryview(store)[1:]])
    assert_same_values(again, td)
    assert all(p % packed.ALIGN == 0 for p in leaf_ptrs(again))


def test_short_buffer_is_refused() -> None:
    data, _ = dumps5(big_tree(leaves=2))
    with pytest.raises(InvalidTreeError, match="more than the 16 of the buffer"):
        pickle.loads(data, buffers=[memoryview(bytes(16))])


def test_read_only_tree_pickles_again_without_a_copy() -> None:
    td = make_td().consolidate()
    data, buffers = dumps5(td)
    view = lent_read_only(buffers[0].raw())
    again = pickle.loads(data, buffers=[view])
    data2, buffers2 = dumps5(again)
    assert len(buffers2) == 1 and raw_address(buffers2[0].raw()) == raw_address(view)
    third = pickle.loads(data2, buffers=buffers2)
    assert third.is_read_only
    assert_same_values(third, td)


def test_lower_protocols_keep_the_per_leaf_pickle() -> None:
    td = big_tree(leaves=2)
    assert_same_values(pickle.loads(pickle.dumps(td)), td)
    with pytest.raises(RuntimeError, match="cannot be pickled with plain pickle"):
        pickle.dumps(td.consolidate(), protocol=4)


def test_file_backed_tree_pickles_by_path(tmp_prefix: Path) -> None:
    td = make_td().memmap_(tmp_prefix)
    data, buffers = dumps5(td)
    assert buffers == [] and len(data) < 8192
    again = pickle.loads(data)
    assert again.is_memmap() and again["a"].filename == td["a"].filename


def test_empty_tree_and_empty_leaves() -> None:
    for td in (TensorDict({}, [3]), TensorDict({"e": torch.zeros(3, 0), "s": "x"}, [3])):
        data, buffers = dumps5(td)
        assert buffers == []
        again = pickle.loads(data)
        assert again.batch_size == td.batch_size and again.keys() == td.keys()


def test_trees_the_layout_does_not_hold_go_leaf_by_leaf() -> None:
    td = TensorDict({"w": torch.ones(3, requires_grad=True), "o": object.__new__(_Odd)}, [3])
    data, buffers = dumps5(td)
    assert buffers == []
    again = pickle.loads(data)
    assert again["w"].requires_grad and isinstance(again["o"], _Odd)


class _Odd:
    """A non-JSON value (pickled leaf by leaf)."""


def test_reference_pickles_its_leaves_in_band() -> None:
    """Side by side with tensordict 0.15.3: the same tree, the same call."""
    ours = big_tree()
    ref = tensordict.TensorDict({k: ours[k] for k in ours.keys() if k != "nested"}, batch_size=[4])
    data, buffers = dumps5(ours)
    ref_data, ref_buffers = dumps5(ref)
    payload = sum(ours[k].nbytes for k in ref.keys())
    assert len(buffers) == 1 and len(data) < 4096
    assert ref_buffers == [] and len(ref_data) > payload  # every leaf's bytes in-band
    again = pickle.loads(ref_data)
    assert all(torch.equal(again[k], ours[k]) for k in ref.keys())
