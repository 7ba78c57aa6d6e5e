"""The DataLoader's default collate for trees: the entry this library puts in torch's
``default_collate_fn_map`` for TensorDict and every tensorclass, as tensordict does.

``DataLoader(dataset, batch_size=B)`` with torch's default ``collate_fn`` then gives a batch
tree: a dataset whose ``__getitem__`` returns one tree per sample has the samples stacked (a
tree of batch size ``[B, ...]``); a dataset whose ``__getitems__`` returns the batch itself (a
TensorDict, memory-mapped or not) has it passed through untouched. Samples that do not stack
(other keys or shapes, other numbers of batch dims, different tensorclasses) raise
``TypeError``, as tensordict's collate does, naming why.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data._utils.collate import default_collate_fn_map

from .._core.classes import is_tensorclass
from .._core.walk import is_tree


def collate(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """A batch of trees as one tree: a batch already read whole is returned as it is, a list
    of samples is stacked along a new first dim."""
    if is_tree(batch) or is_tensorclass(batch):
        return batch
    items = list(batch)
    kinds = {type(item) for item in items}
    classes = [cls for cls in kinds if is_tensorclass(cls)]
    if len(classes) > 1:
        raise TypeError(
            "Cannot collate a batch of different tensorclasses: got "
            f"{sorted(cls.__name__ for cls in classes)}."
        )
    if classes and len(kinds) > 1:
        raise TypeError(
            "Cannot collate a batch that mixes tensorclass instances with other types: got "
            f"{sorted(cls.__name__ for cls in kinds)}."
        )
    dims = {len(item.batch_size) for item in items}
    if len(dims) > 1:
        raise TypeError(
            "Cannot collate a batch of tensordicts or tensorclasses with different numbers of "
            f"batch dims: got {sorted(dims)}."
        )
    try:
        return torch.stack(items)
    except (RuntimeError, KeyError, ValueError) as err:
        raise TypeError(
            f"Cannot collate a batch of tensordicts or tensorclasses that do not stack: {err}"
        ) from err


class _AnyTensorClassMeta(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        return is_tensorclass(type(instance))


class AnyTensorClass(metaclass=_AnyTensorClassMeta):
    """A key of torch's collate map that every tensorclass instance is an instance of (one
    entry for all of them: the map is global, classes made at run time do not pile up)."""


def register(cls: type) -> None:
    """Makes torch's ``default_collate`` stack instances of ``cls`` with ``collate``."""
    default_collate_fn_map.setdefault(cls, collate)
