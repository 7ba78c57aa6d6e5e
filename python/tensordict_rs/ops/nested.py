"""``to_padded_tensor``: nested-tensor leaves (ragged sequences) made padded tensors."""

from __future__ import annotations

from typing import Any

import torch

from .._core.nodes import TD
from .._core.walk import map_leaves


def to_padded_tensor(td: TD, padding: float = 0.0, mask_key: Any = None) -> TD:
    """Every nested-tensor leaf made a padded tensor (``torch.nested.to_padded_tensor``); the
    other leaves are kept. ``mask_key`` needs a ragged batch dim, which a TensorDict here never
    has: it raises, as tensordict does without one.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> seq = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    >>> TensorDict({"seq": seq}, [2]).to_padded_tensor(padding=-1.0)["seq"]
    tensor([[ 1.,  1., -1.],
            [ 1.,  1.,  1.]])
    """
    if mask_key is not None:
        raise RuntimeError(
            "mask_key should only be provided if the heterogenous dimension is part of the "
            "batch-size."
        )
    return map_leaves(
        td,
        lambda t: torch.nested.to_padded_tensor(t, padding) if t.is_nested else t,
    )
