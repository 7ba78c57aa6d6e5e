"""The batch shape and device of a TensorDict: ``batch_size`` (settable to any leading dims of
every entry), ``shape``, ``batch_dims``/``ndim``, ``dim()``, ``numel()``, ``device`` (not
settable: ``to(device)`` makes a new tree), ``is_cuda``, ``is_cpu`` (a mixin of TensorDict)."""

from __future__ import annotations

from typing import Any

import torch

from .._core.nodes import TreeNode

_DEVICE_SET_ERROR = (
    "device cannot be set using tensordict.device = device, because device cannot be updated "
    "in-place. To update device, use tensordict.to(new_device), which will return a new "
    "tensordict on the new device."
)


def as_batch_size(value: Any) -> torch.Size:
    """A batch size as tensordict takes one: ``None`` (no batch dims), an int (one dim) or a
    sequence of ints."""
    if value is None:
        return torch.Size([])
    if isinstance(value, int):
        return torch.Size([value])
    return torch.Size(value)


def _check_fits(td: Any, new: torch.Size) -> list[Any]:
    """Raises ``RuntimeError`` naming the first entry of ``td`` whose shape does not start with
    ``new``; returns the nested trees of fewer batch dims than ``new`` (tensordict sets theirs
    to ``new`` too), checked all the way down first so that nothing changes on a failure."""
    grown = []
    for key, value in td._tensordict.items():
        if isinstance(value, TreeNode) and len(value._batch_size) < len(new):
            _check_fits(value, new)
            grown.append(value)
            continue
        shape = td._entry_shape(key)
        if shape is not None and tuple(shape[: len(new)]) != tuple(new):
            raise RuntimeError(
                f"the batch size {new} does not fit key {key!r} of shape {torch.Size(shape)}"
            )
    return grown


class BatchShape(TreeNode):
    """``batch_size``, ``shape``, ``batch_dims``, ``ndim``, ``dim``, ``numel``, ``device``,
    ``is_cuda``, ``is_cpu`` (a mixin of TensorDict, first among its bases)."""

    @property
    def batch_size(self) -> torch.Size:
        """The leading dimensions shared by every entry.

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3])
        >>> td.batch_size = [2]  # any leading dims of every entry
        >>> td.batch_size
        torch.Size([2])
        """
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        new = torch.Size(value)
        grown = _check_fits(self, new)
        for child in grown:  # as tensordict: a nested tree of fewer dims takes the new ones
            child.batch_size = new
        names = self._names
        self._batch_size = new
        if names is not None:  # the names of the dims that stay; new dims unnamed
            self._set_names([*names[: len(new)], *[None] * (len(new) - len(names))])

    @property
    def shape(self) -> torch.Size:
        """Same as ``batch_size``.

        >>> import torch; from tensordict_rs import TensorDict
        >>> TensorDict({"a": torch.zeros(2, 3)}, [2]).shape
        torch.Size([2])
        """
        return self._batch_size

    @property
    def batch_dims(self) -> int:
        """Number of batch dimensions.

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3])
        >>> td.batch_dims, td.ndim
        (2, 2)
        """
        return len(self._batch_size)

    ndim = batch_dims

    def dim(self) -> int:
        """Number of batch dimensions (same as ``batch_dims``).

        >>> import torch; from tensordict_rs import TensorDict
        >>> TensorDict({"a": torch.zeros(2, 3)}, [2, 3]).dim()
        2
        """
        return len(self._batch_size)

    def numel(self) -> int:
        """Number of elements of the batch (product of ``batch_size``).

        >>> import torch; from tensordict_rs import TensorDict
        >>> TensorDict({"a": torch.zeros(2, 3)}, [2, 3]).numel()
        6
        """
        return self._batch_size.numel()

    @property
    def device(self) -> torch.device | None:
        """The device of every entry, or None when entries may be on different devices.

        >>> import torch; from tensordict_rs import TensorDict
        >>> TensorDict({"a": torch.zeros(2)}, [2], device="cpu").device
        device(type='cpu')
        >>> TensorDict({"a": torch.zeros(2)}, [2]).device is None
        True
        """
        return self._device

    @device.setter
    def device(self, value: Any) -> None:
        raise RuntimeError(_DEVICE_SET_ERROR)

    @property
    def is_cuda(self) -> bool:
        """True when the TensorDict's device is a CUDA device.

        >>> import torch; from tensordict_rs import TensorDict
        >>> TensorDict({}, [], device="cpu").is_cuda
        False
        """
        return self._device is not None and self._device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        """True when the TensorDict's device is the CPU.

        >>> import torch; from tensordict_rs import TensorDict
        >>> TensorDict({}, [], device="cpu").is_cpu, TensorDict({}, []).is_cpu
        (True, False)
        """
        return self._device is not None and self._device.type == "cpu"
