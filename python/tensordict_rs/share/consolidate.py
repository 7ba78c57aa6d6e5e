"""``consolidate`` and ``is_consolidated``: a tree whose leaves are views of one buffer.

The buffer holds the leaves in the packed layout of ``packed.py`` (the message of
``send(consolidated=True)``), so a consolidated tree is sent and received without a copy; on
the CPU it is one anonymous shared-memory arena, which crosses to other processes as one
descriptor. The new tree is built from the tree's own description, as ``from_remote_init``
builds a received one, and the leaves are packed into it by the Rust core (GIL released,
parallel).
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

import torch

from .. import _native
from .._core.nodes import TreeNode
from .._core.walk import refuse_unbatched
from ..ops import as_classmethod
from . import consolidated_file as _file
from . import packed as _packed
from . import packed_description as _desc

_CPU = torch.device("cpu")


class Consolidation(TreeNode):
    """The consolidation methods of TensorDict (mixed into the class)."""

    from_consolidated = as_classmethod(_file.from_consolidated)

    def consolidate(
        self,
        filename: Path | str | None = None,
        *,
        num_threads: int = 0,
        device: torch.device | str | int | None = None,
        non_blocking: bool = False,
        inplace: bool = False,
        return_early: bool = False,
        use_buffer: bool = False,
        share_memory: bool = False,
        pin_memory: bool = False,
        metadata: bool = False,
    ) -> Self:
        """Copies every leaf into one buffer; returns a locked tree of views of it.

        On the CPU the buffer is one anonymous shared-memory arena (so ``share_memory`` holds
        always; with it the leaves answer ``is_shared()`` True, as tensordict's); ``device``
        puts it on another device. ``inplace=True`` replaces this tree's
        leaves by the views and returns ``self``. An already consolidated tree is returned as
        it is. The copy runs in parallel in the Rust core whatever ``num_threads``; the
        structure always travels with the buffer (``metadata`` changes nothing).
        With ``filename`` the buffer is that file (the reference's single-file layout: the
        leaves, their description as JSON, its length), mapped shared: the returned tree's
        leaves are views of the file, and ``from_consolidated(filename)`` reads it back, here
        or in tensordict. ``return_early``, ``use_buffer`` and ``pin_memory`` are refused with
        ``ValueError``. Nested-tensor leaves (strided or jagged) are kept: a jagged leaf's
        values, offsets and lengths, a strided one's components, are views of the buffer
        (``filename`` refuses them).

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0), "n": {"b": torch.ones(3, 2)}}, [3])
        >>> c = td.consolidate()
        >>> c.is_consolidated(), td.is_consolidated(), c.is_locked
        (True, False, True)
        >>> c["n", "b"].sum().item(), c.consolidate() is c
        (6.0, True)
        """
        refuse_unbatched(self, "consolidated")
        if filename is not None:
            if device is not None and torch.device(device).type != "cpu":
                raise ValueError("consolidate(filename=...) writes a file: device must be the CPU")
            return _file.consolidate_to_file(self, filename)  # type: ignore[return-value]
        refused = [
            name
            for name, asked in (
                ("return_early", return_early),
                ("use_buffer", use_buffer),
                ("pin_memory", pin_memory),
            )
            if asked
        ]
        if refused:
            raise ValueError(
                f"consolidate: {', '.join(refused)} not supported by tensordict_rs (the "
                "consolidated buffer lives in shared memory or on `device`; to keep a tree in "
                "a file, use memmap_ or save)"
            )
        target = None if device is None else torch.device(device)
        plan = _packed.plan(self)
        if plan.consolidated and (target is None or plan.whole is None or _same(plan, target)):
            return self
        on_cpu = target is None or target.type == "cpu"
        td, whole = _packed.build(
            type(self),
            plan.description(),
            plan.total,
            None if on_cpu else target,
            shared=share_memory,
        )
        if plan.total:
            if on_cpu and whole.device == _CPU:
                plan.pack_range(whole, 0, plan.total)
            else:
                whole[: plan.total].copy_(plan.pack(fresh=True), non_blocking=non_blocking)
        _packed.settle(td)
        if not inplace:
            classes = _desc.node_classes(self)
            if classes is not None:  # tensorclasses inside keep their class
                _desc.retype(td, classes)
            return td.lock_()
        if self.is_locked:
            self.unlock_()
        for key in td.keys(include_nested=True, leaves_only=True):
            self.set(key, td.get(key))
        new = _packed.plan(self)
        new.consolidated = new.whole is not None
        return self.lock_()

    def is_consolidated(self) -> bool:
        """Whether the leaves are views of one buffer made by ``consolidate`` (or received as
        one: ``from_remote_init``, ``broadcast``, ``all_gather``), in the packed layout.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(3)}, [3])
        >>> td.is_consolidated(), td.consolidate().is_consolidated()
        (False, True)
        """
        try:
            return _packed.plan(self).consolidated
        except _native.InvalidTreeError:  # a tree consolidate refuses is not
            return False


def _same(plan: _packed.Plan, device: torch.device) -> bool:
    assert plan.whole is not None
    have = plan.whole.device
    return have.type == device.type and (device.index is None or have.index == device.index)
