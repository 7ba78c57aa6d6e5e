"""What a packed tree's cached plan (``packed.Plan``) was made for, beyond its entries: every
node's batch size and device (the description holds them), every tensor leaf's address, size
and strides. A plan is reused only while all of them are as recorded: ``t.data = x`` or
``t.share_memory_()`` move a leaf's bytes, ``t.unsqueeze_()``, ``t.t_()`` or ``t.resize_()``
change its shape or layout in place, ``td.batch_size = ...`` a node's batch size, all without
changing the tree's entries; a stale plan sent, pickled and consolidated the old shapes.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .._core.nodes import NTD_TYPES
from .._core.nontensor import NonTensorStack
from ..memmap import _LazyLeaf

_DATA_PTR = torch.Tensor.data_ptr
_SIZE = torch.Tensor.size
_STRIDE = torch.Tensor.stride


class Watch:
    """The state of a tree's nodes and tensor leaves when its plan was made.

    ``nodes`` are the plan's ``(dict, keys, values)`` per node; the nodes themselves are held
    weakly (a cached plan must not keep its tree alive).
    """

    __slots__ = ("at", "nodes", "sizes", "strides", "tensors")

    def __init__(self, td: Any, nodes: list[tuple[dict[str, Any], Any, tuple[Any, ...]]]) -> None:
        """Records ``td``'s nodes' batch sizes and devices, and its tensor leaves."""
        states: list[tuple[Any, Any, Any]] = []
        stack = [td]
        while stack:
            node = stack.pop()
            states.append((weakref.ref(node), node._batch_size, node._device))
            for value in node._tensordict.values():
                kind = type(value)
                if not (
                    kind is _LazyLeaf
                    or isinstance(value, torch.Tensor)
                    or kind in NTD_TYPES
                    or kind is NonTensorStack
                ):
                    stack.append(value)
        self.nodes = states
        self.leaves(nodes)

    def leaves(self, nodes: list[tuple[dict[str, Any], Any, tuple[Any, ...]]]) -> None:
        """Records the tensor leaves among the nodes' values (again after lazy leaves were
        made tensors), with their address, size and strides."""
        tensors = self.tensors = [
            value
            for _, _, values in nodes
            for value in values
            if isinstance(value, torch.Tensor) and not value.is_nested
        ]
        self.at = list(map(_DATA_PTR, tensors))
        self.sizes = list(map(_SIZE, tensors))
        self.strides = list(map(_STRIDE, tensors))

    def current(self) -> bool:
        """Whether every node and tensor leaf is as recorded."""
        for ref, batch, device in self.nodes:
            node = ref()
            if node is None or node._batch_size is not batch or node._device != device:
                return False
        tensors = self.tensors
        # data_ptr(), size() and stride() per leaf, called by map (10,000 leaves: ~2 ms here;
        # a Rust loop measured slower under abi3)
        return not tensors or (
            list(map(_DATA_PTR, tensors)) == self.at
            and list(map(_SIZE, tensors)) == self.sizes
            and list(map(_STRIDE, tensors)) == self.strides
        )
