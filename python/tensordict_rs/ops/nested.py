"""``to_padded_tensor``: nested-tensor leaves (ragged sequences) made padded tensors."""

from __future__ import annotations

from typing import Any

import torch

from .._core.nodes import TD
from .._core.walk import map_leaves
from .keys import _max_batch


def to_padded_tensor(td: TD, padding: float = 0.0, mask_key: Any = None) -> TD:
    """Every nested-tensor leaf made a padded tensor (``torch.nested.to_padded_tensor``); the
    other leaves are kept. A ragged (``-1``) batch dim gets its size from the padded leaves
    (as tensordict's ``auto_batch_size_``), and ``mask_key`` then writes there a bool mask of
    the elements that are not padding; without a ragged batch dim ``mask_key`` raises, as
    tensordict does.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> seq = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    >>> TensorDict({"seq": seq}, [2]).to_padded_tensor(padding=-1.0)["seq"]
    tensor([[ 1.,  1., -1.],
            [ 1.,  1.,  1.]])
    """
    ragged = any(size == -1 for size in td.batch_size)
    if mask_key is not None and not ragged:
        raise RuntimeError(
            "mask_key should only be provided if the heterogenous dimension is part of the "
            "batch-size."
        )
    padded: list[torch.Tensor] = []

    def pad(t: torch.Tensor) -> torch.Tensor:
        if not t.is_nested:
            return t
        padded.append(t)
        return torch.nested.to_padded_tensor(t, padding)

    if not ragged:
        return map_leaves(td, pad)
    # a ragged (-1) batch dim: the batch size is found again from the padded leaves, as
    # tensordict's auto_batch_size_(batch_dims=...) (names dropped)
    out = map_leaves(td, pad, names=None)
    _max_batch(out, td.batch_dims)
    if mask_key is not None and padded:
        mask = torch.nested.to_padded_tensor(
            torch.ones_like(padded[0], dtype=torch.bool), padding=False
        )
        if mask.ndim > out.batch_dims:
            mask = mask.flatten(out.batch_dims, -1)[..., -1].clone()
        out.set(mask_key, mask)
    return out
