"""``MetaData``: a non-tensor value kept as one object through the shape operations.

As in tensordict (``tensordict.tensorclass.MetaData``), a ``MetaData`` is a ``NonTensorData``
except that ``expand``, ``unsqueeze`` and ``torch.stack`` keep one ``MetaData`` (with the new
batch size) instead of making a ``NonTensorStack``: stacking gives one ``MetaData`` when every
entry holds the very same object (``is``, not ``==``) and a ``NonTensorStack`` otherwise.
``MetaData[T]`` is a subclass (cached, one per ``T``) whose values must be instances of ``T``.

The tree's checks read ``type(value) in NTD_TYPES`` (``_core/nodes.py``): each class here adds
itself to that set, so a ``MetaData`` leaf goes wherever a ``NonTensorData`` goes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from .nodes import NTD_TYPES, NonTensorData


class _MetaDataMeta(type):
    """The metaclass of ``MetaData``: ``MetaData[T]`` makes (once) the typed subclass."""

    _typed: dict[Any, type]

    def __getitem__(cls, item: Any) -> type:
        if cls.__name__ != "MetaData":
            raise TypeError(f"Cannot specify type for {cls.__name__}")
        typed = cls._typed.get(item)
        if typed is None:
            name = f"MetaData[{getattr(item, '__name__', str(item))}]"
            typed = _MetaDataMeta(name, (cls,), {"__slots__": (), "_expected_type": item})
            typed.__qualname__ = name
            cls._typed[item] = typed
            NTD_TYPES.add(typed)
        return typed


class MetaData(NonTensorData, metaclass=_MetaDataMeta):
    """A non-tensor value kept as one object through stacking and shape operations.

    Behaves as ``NonTensorData`` except that ``expand``, ``unsqueeze`` and ``torch.stack``
    of entries holding the same object (identity) give one ``MetaData``; stacking entries
    holding different objects gives a ``NonTensorStack``, as in tensordict.

    >>> MetaData("cfg", batch_size=[3]).expand(2, 3).batch_size
    torch.Size([2, 3])
    >>> MetaData[int](4).data
    4
    """

    __slots__ = ()
    _typed: ClassVar[dict[Any, type]] = {}
    _expected_type: ClassVar[Any] = None

    def __init__(self, data: Any, batch_size: Any = None, device: Any = None) -> None:
        super().__init__(data, batch_size, device)
        expected = type(self)._expected_type
        if expected is not None and not isinstance(self._value, expected):
            raise TypeError(
                f"Expected data of type {getattr(expected, '__name__', str(expected))}, "
                f"got {type(self._value).__name__}"
            )

    def __reduce__(self) -> Any:
        """Pickled by value, with its type (``MetaData[T]`` by its ``T``)."""
        return (_rebuild, (type(self)._expected_type, self.data, self.batch_size, self.device))

    def stacked(self, fn: Any) -> MetaData:
        """The same object with the batch size ``fn`` gives a tensor of this one's shape:
        ``expand`` and ``unsqueeze`` (of the entry or of its tree) keep one ``MetaData``
        where a ``NonTensorData`` makes a ``NonTensorStack``."""
        batch = fn(torch.empty(self.batch_size, device="meta")).shape
        return type(self)(self.data, batch_size=batch, device=self.device)

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        """``torch.stack`` of entries that hold the very same object (``is``) and have one
        class gives one of them with the new dim; anything else goes as for
        ``NonTensorData`` (a ``NonTensorStack``)."""
        if func is torch.stack:
            kw = dict(kwargs or {})
            values = list(args[0]) if args else list(kw.pop("tensors", ()))
            dim = args[1] if len(args) > 1 else kw.pop("dim", 0)
            first = values[0] if values else None
            if (
                isinstance(first, MetaData)
                and not kw
                and all(type(v) is type(first) and v.data is first.data for v in values)
            ):
                batch = [*first.batch_size]
                batch.insert(dim if dim >= 0 else dim + len(batch) + 1, len(values))
                return type(first)(first.data, batch_size=batch, device=first.device)
        return super().__torch_function__(func, types, args, kwargs)


def kind_of(value: NonTensorData) -> tuple[Any] | None:
    """What a message carries to rebuild ``value``'s class in another process: None for a
    ``NonTensorData``, ``(T,)`` for a ``MetaData[T]`` (``(None,)`` for ``MetaData``)."""
    if not isinstance(value, MetaData):
        return None
    return (type(value)._expected_type,)


def of_kind(kind: tuple[Any] | None, data: Any, batch_size: Any = None) -> NonTensorData:
    """The entry ``kind_of`` described, holding ``data`` (not checked against ``T``: the
    sender's entry was)."""
    if kind is None:
        return NonTensorData(data, batch_size)
    cls: Any = MetaData if kind[0] is None else MetaData[kind[0]]
    out: NonTensorData = cls.__new__(cls)
    NonTensorData.__init__(out, data, batch_size)
    return out


def _rebuild(expected: Any, data: Any, batch_size: Any, device: Any) -> MetaData:
    """Unpickles a ``MetaData`` (``MetaData[expected]`` when ``expected`` is not None)."""
    cls: Any = MetaData if expected is None else MetaData[expected]
    result: MetaData = cls(data, batch_size, device)
    return result


NTD_TYPES.add(MetaData)
