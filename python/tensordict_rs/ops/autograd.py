"""Autograd over trees: ``data``, ``grad``, ``requires_grad``, ``requires_grad_``,
``zero_grad`` and ``backward``, each a walk of the tensor leaves (``map_leaves``/``leaves``).
"""

from __future__ import annotations

from typing import Any

import torch

from .._core.nodes import TD, TreeNode
from .._core.walk import leaves, map_leaves, zip_leaves


def data(td: TD) -> TD:
    """A tree of the leaves' ``.data``: the same storage, no autograd.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2, requires_grad=True)}, [2])
    >>> td.data["a"].requires_grad, td.data["a"].data_ptr() == td["a"].data_ptr()
    (False, True)
    """
    return map_leaves(td, lambda t: t.data, lock=True)


def set_data(td: TreeNode, other: Any) -> None:
    """``td.data = other``: rebinds every leaf's ``.data`` to the matching leaf of ``other``."""
    if not isinstance(other, TreeNode):
        raise TypeError(f"td.data takes a TensorDict, got {type(other).__name__}")
    _check_batch(td, other)
    for leaf, value in list(zip_leaves(td, other)):
        leaf.data = value


def _check_batch(td: Any, other: Any) -> None:
    if td.batch_size != other.batch_size:
        raise RuntimeError(
            f"the batch size of the new data {other.batch_size} does not match the batch size "
            f"{td.batch_size}"
        )


def grad(td: TreeNode) -> TreeNode | None:
    """A tree of the leaves' ``.grad`` (leaves without one left out), or None if no leaf has
    one.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.ones(2, requires_grad=True)}, [2])
    >>> td.grad is None
    True
    >>> (td["a"] * 3).sum().backward()
    >>> td.grad["a"]
    tensor([3., 3.])
    """
    if not any(t.grad is not None for _, _, t in leaves(td)):
        return None
    return map_leaves(td, lambda t: t.grad, lock=True)


def set_grad(td: TreeNode, other: Any) -> None:
    """``td.grad = other``: sets each leaf's ``.grad`` (copies into an existing one)."""
    for leaf, value in list(zip_leaves(td, other)):
        if leaf.grad is None:
            leaf.grad = value
        else:
            leaf.grad.copy_(value)


def requires_grad(td: TreeNode) -> bool:
    """True if any leaf requires gradients.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict({"a": torch.zeros(2, requires_grad=True)}, [2]).requires_grad
    True
    """
    return any(t.requires_grad for _, _, t in leaves(td))


def requires_grad_(td: TD, requires_grad: bool = True) -> TD:
    """Sets ``requires_grad`` on every tensor leaf in place; returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2)}, [2]).requires_grad_()
    >>> td["a"].requires_grad
    True
    """
    for _, _, t in list(leaves(td)):
        t.requires_grad_(requires_grad)  # an integer leaf raises, as in tensordict
    return td


def zero_grad(td: TD, set_to_none: bool = True) -> TD:
    """Resets the ``.grad`` of every leaf (to None, or zeroed in place); returns ``td``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.ones(2, requires_grad=True)}, [2])
    >>> td["a"].sum().backward()
    >>> td.zero_grad().grad is None
    True
    """
    for _, _, t in list(leaves(td)):
        if t.grad is None:
            continue
        if set_to_none:
            t.grad = None
        else:
            if t.grad.grad_fn is not None:
                t.grad.detach_()
            else:
                t.grad.requires_grad_(False)
            t.grad.zero_()
    return td


def backward(
    td: TreeNode,
    gradient: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    inputs: Any = None,
) -> None:
    """``torch.autograd.backward`` of every leaf that requires gradients (a batch of
    ``[]``: each leaf a scalar, or ``gradient`` a tree of matching gradients).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> x = torch.ones(3, requires_grad=True)
    >>> TensorDict(loss=(x * 2).sum()).backward()
    >>> x.grad
    tensor([2., 2., 2.])
    """
    tensors = [t for _, _, t in leaves(td) if t.requires_grad]
    if not tensors:
        raise RuntimeError("backward: no leaf of the tensordict requires gradients")
    grads = None
    if gradient is not None:
        grads = [g for t, g in zip_leaves(td, gradient) if t.requires_grad]
    if isinstance(inputs, TreeNode):
        inputs = [t for _, _, t in leaves(inputs)]  # type: ignore[arg-type]
    torch.autograd.backward(
        tensors,
        grad_tensors=grads,
        retain_graph=retain_graph,
        create_graph=create_graph,
        inputs=inputs,
    )


class Autograd(TreeNode):
    """Autograd over every leaf (a mixin of TensorDict): ``data``, ``grad``,
    ``requires_grad``, ``requires_grad_``, ``zero_grad``, ``backward``."""

    data = property(data, set_data, doc=data.__doc__)
    grad = property(grad, set_grad, doc=grad.__doc__)
    requires_grad = property(requires_grad, doc=requires_grad.__doc__)
    requires_grad_ = requires_grad_
    zero_grad = zero_grad
    backward = backward
