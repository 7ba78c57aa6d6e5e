"""Devices: moving and casting every entry, and the device normalisation tensordict applies."""

from __future__ import annotations

from typing import Any, Self

import torch

from .._core.classes import is_tensor_collection
from .._core.locking import locked_error
from .._core.nodes import TreeNode
from .._core.walk import leaves, map_leaves


def _normalize_device(device: Any) -> torch.device | None:
    """torch.device with an index where tensordict adds one (``cuda`` -> ``cuda:<current>``)."""
    if device is None:
        return None
    device = torch.device(device)
    if device.index is None and device.type not in ("cpu", "meta"):
        index = torch.cuda.current_device() if device.type == "cuda" else 0
        device = torch.device(device.type, index)
    return device


class DeviceMoves(TreeNode):
    """``to``, ``cuda``, ``cpu`` and ``clear_device_`` for TensorDict."""

    def to(self, *args: Any, **kwargs: Any) -> Self:
        """Moves and/or casts every entry: ``to(device)``, ``to(dtype)``, ``to(device, dtype)``,
        ``to(tensor)``, ``to(other=td)``, ``to(batch_size=...)``.

        Returns ``self`` when only a device is given and it is already this device; otherwise a
        new TensorDict on the target device (locked if this one is). ``inplace=True`` changes
        this TensorDict instead. ``batch_size=`` alone sets this TensorDict's batch size and
        returns it, as tensordict does; with a device or dtype the new TensorDict gets it.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3])
        >>> td.to(torch.float64)["a"].dtype, td.to("cpu").device
        (torch.float64, device(type='cpu'))
        """
        if args and not isinstance(args[0], torch.Tensor) and is_tensor_collection(args[0]):
            return self._to_per_leaf(args, kwargs)
        device, dtype, non_blocking, inplace, batch_size, pin = _parse_to(args, kwargs)
        device = _normalize_device(device)
        if dtype is None and (device is None or device == self._device):
            if batch_size is not None:
                self.batch_size = batch_size
            return self
        target = self._device if device is None else device

        tree: Any = self

        pin = pin and target is not None and target.type == "cuda"

        def move(t: torch.Tensor) -> torch.Tensor:
            if pin and t.device.type == "cpu" and not t.is_pinned():
                t = t.pin_memory()
            return t.to(device=target, dtype=dtype, non_blocking=non_blocking)

        if inplace:
            if self._is_locked:
                raise locked_error()
            for td, key, leaf in list(leaves(tree)):
                td._tensordict[key] = move(leaf)
            self._set_device_tree(target)
            if batch_size is not None:
                self.batch_size = batch_size
            return self
        out = None
        if dtype is None and self._is_memmap and target is not None and target.type == "cuda":
            # a memory-mapped tree: one device allocation, streamed (see stream.py)
            from .stream import stream_tree

            out = stream_tree(self, target)
        if out is None:
            out = map_leaves(tree, move, device=target, check=True)
        if (
            non_blocking
            and target is not None
            and target.type != "cuda"
            and torch.cuda.is_available()
        ):
            torch.cuda.synchronize()
        if batch_size is not None:
            out.batch_size = batch_size
        if self._is_locked:
            out.lock_()
        return out

    def _to_per_leaf(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Self:
        """``to(attrs_td)``: a positional tensor collection gives each leaf its own target.

        As tensordict, the collection is read as a tree of per-leaf attributes (``TensorAttrs``
        entries, with ``tgt_device`` / ``tgt_dtype``): the leaf at the same key
        is moved / cast to them, every other leaf passes through unchanged (a plain tensor of
        the collection sets nothing). The result is a new TensorDict sharing the unchanged
        leaves, with no device, locked if this one is; ``inplace=True`` changes this one.
        """
        if len(args) > 1:
            raise TypeError("to(attrs_td) does not accept additional positional arguments.")
        non_blocking = kwargs.pop("non_blocking", None)
        inplace = bool(kwargs.pop("inplace", False))
        kwargs.pop("num_threads", None)
        kwargs.pop("cast_filter", None)
        if kwargs.pop("non_blocking_pin", False):
            raise NotImplementedError(
                "non_blocking_pin is not yet supported when an attrs tensordict is passed to "
                "`to()`."
            )
        if kwargs:
            raise TypeError(f"to(attrs_td) got unexpected keyword arguments {sorted(kwargs)}")
        spec: dict[tuple[str, ...], tuple[Any, Any]] = {}
        _attrs_spec(args[0], (), spec)
        blocking = non_blocking is not None and not non_blocking

        def cast(path: tuple[str, ...], t: torch.Tensor) -> torch.Tensor:
            device, dtype = spec[path]
            return t.to(device=device, dtype=dtype, non_blocking=not blocking)

        if inplace:
            if self._is_locked:
                raise locked_error()
            out: Any = self
        else:
            out = map_leaves(self, lambda t: t, device=None)
        for path in spec:
            node = out
            for part in path[:-1]:
                node = node._tensordict.get(part) if isinstance(node, TreeNode) else None
            if not isinstance(node, TreeNode) or path[-1] not in node._tensordict:
                continue
            leaf = node._get_str(path[-1])
            if isinstance(leaf, torch.Tensor):
                node._tensordict[path[-1]] = cast(path, leaf)
        if blocking and torch.cuda.is_available():
            torch.cuda.synchronize()
        if not inplace and self._is_locked:
            out.lock_()
        return out

    def _set_device_tree(self, device: torch.device | None) -> None:
        self._device = device
        for value in self._tensordict.values():
            if isinstance(value, DeviceMoves):
                value._set_device_tree(device)

    def cuda(self, device: Any = None, **kwargs: Any) -> Self:
        """``to("cuda")`` (or ``to(f"cuda:{device}")``).

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2)}, [2])
        >>> moved = td.cuda(0) if torch.cuda.is_available() else None  # needs a CUDA device
        >>> moved is None or (moved.device, moved["a"].device) == (torch.device("cuda", 0),) * 2
        True
        """
        return self.to(
            torch.device("cuda")
            if device is None
            else torch.device("cuda", device)
            if isinstance(device, int)
            else device,
            **kwargs,
        )

    def cpu(self, **kwargs: Any) -> Self:
        """``to("cpu")``.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3])
        >>> td.cpu().device
        device(type='cpu')
        """
        return self.to("cpu", **kwargs)

    def clear_device_(self) -> Self:
        """Removes the device of this TensorDict and its nested ones; no data moves.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> TensorDict({"a": torch.zeros(2)}, [2], device="cpu").clear_device_().device is None
        True
        """
        self._set_device_tree(None)
        return self

    def auto_device_(self) -> Self:
        """Sets the device to the device of the leaves if they all share one (else None);
        returns self.

        >>> import torch; from tensordict_rs import TensorDict
        >>> TensorDict({"a": torch.zeros(2)}, [2]).auto_device_().device
        device(type='cpu')
        """
        devices = {leaf.device for _, _, leaf in leaves(self)}
        self._set_device_tree(devices.pop() if len(devices) == 1 else None)
        return self

    def record_stream(self, stream: Any) -> Self:
        """Marks every tensor leaf as used by the CUDA ``stream`` (``Tensor.record_stream``);
        returns self. A tree with no leaves records nothing (CUDA is needed otherwise):

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({}, [2])
        >>> td.record_stream(None) is td
        True
        """
        for _, _, leaf in list(leaves(self)):
            leaf.record_stream(stream)
        return self


def _attrs_spec(tree: Any, path: tuple[str, ...], spec: dict[Any, Any]) -> None:
    """Collects ``path -> (tgt_device, tgt_dtype)`` for the per-leaf attribute entries of
    ``tree`` (tensorclasses named ``TensorAttrs``, as tensordict's; a target of two ``None``
    is left out)."""
    if not isinstance(tree, TreeNode):  # a tensorclass: its TensorDict
        tree = getattr(tree, "_tensordict", None)
        if not isinstance(tree, TreeNode):
            return
    for key in list(tree._tensordict):
        value = tree.get(key)
        if type(value).__name__ == "TensorAttrs":
            device, dtype = value.tgt_device, value.tgt_dtype
            if device is not None or dtype is not None:
                spec[(*path, key)] = (device, dtype)
        elif isinstance(value, TreeNode):
            _attrs_spec(value, (*path, key), spec)


def _parse_to(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, torch.dtype | None, bool, bool, Any, bool]:
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    non_blocking = bool(kwargs.pop("non_blocking", False))
    inplace = bool(kwargs.pop("inplace", False))
    batch_size = kwargs.pop("batch_size", None)
    other = kwargs.pop("other", None)
    if kwargs.pop("non_blocking_pin", False):
        # pin first, then copy asynchronously: the host side of the copy never blocks
        non_blocking = True
        kwargs["_pin"] = True
    kwargs.pop("num_threads", None)  # the copies run in torch; no thread pool to size
    pin = kwargs.pop("_pin", False)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    for arg in args:
        if isinstance(arg, torch.dtype):
            dtype = arg
        elif isinstance(arg, torch.Tensor):
            device, dtype = arg.device, arg.dtype
        elif isinstance(arg, DeviceMoves):
            other = arg
        elif isinstance(arg, (str, int, torch.device)):
            device = arg
        else:
            raise TypeError(f"to() cannot use {arg!r}")
    if other is not None:
        if device is not None and _normalize_device(device) != other.device:
            raise ValueError("other and device cannot be both passed")
        device = other.device
        dtypes = {leaf.dtype for _, _, leaf in leaves(other)}
        if len(dtypes) == 1 and dtype is None:
            dtype = dtypes.pop()
    if device is None and dtype is None and batch_size is None:
        raise TypeError("to() needs a device, a dtype, a tensor, other= or batch_size=")
    return device, dtype, non_blocking or pin, inplace, batch_size, pin
