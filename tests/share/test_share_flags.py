"""``is_shared()`` of the leaves of a shared tree, side by side with tensordict 0.15.3 (issue 28).

After ``td.share_memory_()`` each leaf of the reference answers ``is_shared()`` True. Ours
answered False (the leaves are MemoryMappedTensors over shared anonymous memory), so code that
checks a leaf before sharing it (``if not t.is_shared(): t.share_memory_()``) moved the leaf out
of the tree's memory: the tree and the leaf no longer saw each other's writes.
"""

from __future__ import annotations

import multiprocessing as mp

import tensordict
import torch
from tensordict_rs import MemoryMappedTensor, TensorDict


def source() -> dict[str, object]:
    return {"a": torch.zeros(4, 3), "b": {"c": torch.ones(4), "d": torch.arange(4)}}


def leaf_flags(td: object) -> dict[str, bool]:
    return {
        "/".join(k): td.get(k).is_shared()  # type: ignore[attr-defined]
        for k in (("a",), ("b", "c"), ("b", "d"))
    }


def test_leaves_of_a_shared_tree_are_shared_as_in_the_reference() -> None:
    ours = TensorDict(source(), [4]).share_memory_()
    ref = tensordict.TensorDict(source(), [4]).share_memory_()
    assert leaf_flags(ours) == leaf_flags(ref) == {"a": True, "b/c": True, "b/d": True}
    assert ours.is_shared() == ref.is_shared() is True
    # views of a shared leaf are shared too, in both
    assert ours["a"][1:].is_shared() == ref["a"][1:].is_shared() is True


def test_sharing_a_shared_leaf_again_keeps_it_in_the_tree() -> None:
    td = TensorDict(source(), [4]).share_memory_()
    leaf = td["b", "c"]
    address = leaf.data_ptr()
    if not leaf.is_shared():  # the idiom the flag exists for
        leaf.share_memory_()
    assert leaf.share_memory_() is leaf and leaf.data_ptr() == address
    leaf.fill_(7.0)
    assert float(td["b", "c"][0]) == 7.0  # still the tree's memory

    def write(t: torch.Tensor) -> None:
        t.fill_(9.0)

    child = mp.get_context("fork").Process(target=write, args=(leaf,))
    child.start()
    child.join()
    assert child.exitcode == 0 and float(td["b", "c"][0]) == 9.0


def test_unshared_tensors_stay_unshared() -> None:
    # an anonymous MemoryMappedTensor of its own is not shared, in either
    ref = tensordict.MemoryMappedTensor.empty((3,))
    assert MemoryMappedTensor.empty((3,)).is_shared() == ref.is_shared() is False
    td = TensorDict(source(), [4])
    assert leaf_flags(td) == leaf_flags(tensordict.TensorDict(source(), [4]))
    copied = TensorDict(source(), [4]).share_memory_().clone()
    ref_copied = tensordict.TensorDict(source(), [4]).share_memory_().clone()
    assert leaf_flags(copied) == leaf_flags(ref_copied) == {"a": False, "b/c": False, "b/d": False}


def _received_flags(td: object, queue: object) -> None:
    queue.put(leaf_flags(td))  # type: ignore[attr-defined]


def test_received_leaves_are_shared_as_in_the_reference() -> None:
    """A tree sent to another process: its leaves there answer True, in both."""
    ctx = mp.get_context("spawn")
    for td in (TensorDict(source(), [4]), tensordict.TensorDict(source(), [4])):
        queue = ctx.Queue()
        child = ctx.Process(target=_received_flags, args=(td, queue))
        child.start()
        flags = queue.get(timeout=120)
        child.join(timeout=60)
        assert flags == {"a": True, "b/c": True, "b/d": True}, type(td)
