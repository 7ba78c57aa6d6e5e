"""Locking: lock_/unlock_, locked writes, context managers, the nested-lock rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict_rs import TensorDict

from .._trees import SOURCE_A, locked_error, make_td

# --------------------------------------------------------------------------------- locking


def test_lock_unlock() -> None:
    td = make_td()
    assert not td.is_locked
    assert td.lock_() is td
    assert td.is_locked and td["n"].is_locked and td["n", "deep"].is_locked
    assert td.unlock_() is td
    assert not td.is_locked and not td["n"].is_locked and not td["n", "deep"].is_locked
    td.is_locked = True
    assert td.is_locked and td["n"].is_locked
    td.is_locked = False
    assert not td.is_locked and not td["n"].is_locked


def test_locked_writes() -> None:
    td = make_td().lock_()
    with locked_error():
        td["new"] = torch.zeros(4, 3)
    with locked_error():
        td.set("new", torch.zeros(4, 3))
    with locked_error():
        td["a"] = torch.zeros(4, 3, 2)  # existing key, not in place
    with locked_error():
        td.set("a", torch.zeros(4, 3, 2))
    with locked_error():
        td.set(("n", "new"), torch.zeros(4, 3))
    with locked_error():
        td["n", "x"] = torch.zeros(4, 3)
    with locked_error():
        td.update({"new": torch.zeros(4, 3)})
    with locked_error():
        td.update({"a": torch.zeros(4, 3, 2)})
    with locked_error():
        del td["a"]
    with locked_error():
        td.pop("a")
    with locked_error():
        td["n"]["new"] = torch.zeros(4, 3)
    with locked_error():
        td.set("new", torch.zeros(4, 3), inplace=True)
    with locked_error():
        td.update({"new": torch.zeros(4, 3)}, inplace=True)
    assert td.keys(include_nested=True) == make_td().keys(include_nested=True)
    assert torch.equal(td["a"], SOURCE_A)


def test_locked_new_nested_path_refused() -> None:
    td = make_td().lock_()
    with locked_error():
        td.set(("brand", "new"), torch.zeros(4, 3))
    assert "brand" not in td


def test_locked_in_place_writes_allowed() -> None:
    td = make_td().lock_()
    a = td["a"]
    td.set_("a", torch.ones(4, 3, 2))
    assert td["a"] is a and torch.equal(a, torch.ones(4, 3, 2))
    td.set_("a", torch.full((4, 3, 2), 2, dtype=torch.int64))  # cast to the existing dtype
    assert a.dtype == torch.float32 and torch.equal(a, torch.full((4, 3, 2), 2.0))
    td.set("a", torch.full((4, 3, 2), 3.0), inplace=True)
    assert torch.equal(a, torch.full((4, 3, 2), 3.0))
    td.update({"a": torch.full((4, 3, 2), 4.0)}, inplace=True)
    assert torch.equal(a, torch.full((4, 3, 2), 4.0))
    td.update_({"n": {"x": torch.zeros(4, 3, dtype=torch.int64)}})
    assert torch.equal(td["n", "x"], torch.zeros(4, 3, dtype=torch.int64))
    td["a"][:] = 5.0
    assert torch.equal(a, torch.full((4, 3, 2), 5.0))
    td[0] = td[1].clone()
    with pytest.raises(KeyError):
        td.set_("missing", torch.zeros(4, 3))
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        td.set_("a", torch.zeros(5, 3, 2))
    # Changing the batch size is allowed while locked.
    td.batch_size = [4]
    assert td.batch_size == torch.Size([4])


def test_lock_context_managers() -> None:
    td = make_td()
    with td.lock_() as same:
        assert same is td
        assert td.is_locked and td["n"].is_locked
    assert not td.is_locked and not td["n"].is_locked
    td.lock_()
    with td.unlock_():
        assert not td.is_locked
        td["added"] = torch.zeros(4, 3)
    assert td.is_locked and td["n"].is_locked
    assert "added" in td


def test_lock_context_managers_keep_an_unchanged_state(tmp_prefix: Path) -> None:
    """``with td.lock_()`` on a locked TensorDict (or ``unlock_`` on an unlocked one) changes
    nothing, so leaving the block must not change anything either."""
    td = make_td().memmap_(tmp_prefix)
    with td.lock_():
        assert td.is_locked
    assert td.is_locked and td.is_memmap()
    free = make_td()
    with free.unlock_():
        assert not free.is_locked
    assert not free.is_locked
    free["added"] = torch.zeros(4, 3)


def test_nested_lock_rule() -> None:
    td = make_td().lock_()
    with pytest.raises(RuntimeError, match="Cannot unlock a tensordict that is part of a locked"):
        td["n"].unlock_()
    with pytest.raises(RuntimeError, match="Unlock the root tensordict first"):
        td["n", "deep"].unlock_()
    assert td["n"].is_locked and td["n", "deep"].is_locked
    td.unlock_()
    assert not td["n"].is_locked
    # A sub-TensorDict held by two locked parents stays locked until both let go.
    sub = TensorDict({"x": torch.zeros(3)}, [3])
    p1 = TensorDict({"s": sub}, [3])
    p2 = TensorDict({"s": sub}, [3])
    p1.lock_()
    p2.lock_()
    p1.unlock_()
    assert sub.is_locked
    with pytest.raises(RuntimeError, match="part of a locked graph"):
        sub.unlock_()
    p2.unlock_()
    assert not sub.is_locked
    # A nested TensorDict locked on its own can be unlocked on its own.
    free = make_td()
    free["n"].lock_()
    assert free["n"].is_locked and not free.is_locked
    free["n"].unlock_()
    assert not free["n"].is_locked


def test_unlock_ends_memmap(tmp_prefix: Path) -> None:
    td = make_td().memmap_(tmp_prefix)
    assert td.is_memmap() and td["n"].is_memmap()
    td.unlock_()
    assert not td.is_memmap() and not td["n"].is_memmap()
    with pytest.raises(AttributeError, match="no saved path"):
        _ = td.saved_path
    td.lock_()
    assert not td.is_memmap()  # relocking does not restore it
    with td.unlock_():
        pass
    assert td.is_locked and not td.is_memmap()
