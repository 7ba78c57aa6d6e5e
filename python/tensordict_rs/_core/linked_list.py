"""``LinkedList``, the values of a ``NonTensorStack`` as a list whose item writes go into the
stack, and the shape of nested lists (``list_shape``, ``flatten_list``, ``_nest``), which stacks
are made from and read into.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .nontensor import NonTensorStack


def list_shape(values: Any) -> list[int]:
    """The shape of nested lists: the dims as deep as every list at a level has one length."""
    shape: list[int] = []
    level = [values]
    while all(type(v) is list or type(v) is LinkedList for v in level) and level:
        lengths = {len(v) for v in level}
        if len(lengths) != 1:
            break
        (n,) = lengths
        shape.append(n)
        level = [item for v in level for item in v]
        if not n:
            break
    return shape


def flatten_list(values: Any, depth: int) -> list[Any]:
    """The items of nested lists ``depth`` levels down, row-major."""
    level = [values]
    for _ in range(depth):
        level = [item for v in level for item in v]
    return level


def _nest(flat: list[Any], shape: tuple[int, ...]) -> Any:
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0] if shape[0] else 0
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


class LinkedList(list):  # type: ignore[type-arg]
    """The values of a stack (``td[key]``): a list whose item writes go into the stack (or
    the rows of a TensorDict, ``td.tolist(as_linked_list=True)``).

    ``_td()`` is the stack (a weak reference); a change of the list's length (``append``,
    ``extend``...) unbinds it: the stack keeps its size, the list is then a plain list.

    >>> from tensordict_rs import NonTensorStack
    >>> stack = NonTensorStack("a", "b")
    >>> values = stack.tolist(as_linked_list=True)
    >>> values[0] = "z"
    >>> stack.tolist()
    ['z', 'b']
    """

    __slots__ = ("_td",)

    def __init__(self, *args: Any, td: Any = None, **kwargs: Any) -> None:
        # ``type(values)(iterable)``, as code that rebuilds a sequence calls it, is not linked
        super().__init__(*args, **kwargs)
        self._td: Any = _NO_STACK if td is None else weakref.ref(td)

    @classmethod
    def _bound(cls, values: list[Any], stack: NonTensorStack) -> LinkedList:
        if stack._pos.ndim > 1:
            values = [cls._bound(row, stack[i]) for i, row in enumerate(values)]
        return cls(values, td=stack)

    def tolist(self) -> list[Any]:
        """A plain ``list`` copy of the values, not linked to the stack (nested linked lists,
        of a stack with several batch dims, become nested lists), as tensordict's does.

        >>> from tensordict_rs import NonTensorStack
        >>> values = NonTensorStack("a", "b").tolist(as_linked_list=True)
        >>> type(values.tolist()).__name__, values.tolist()
        ('list', ['a', 'b'])
        """
        return [item.tolist() if isinstance(item, LinkedList) else item for item in self]

    def __setitem__(self, index: Any, value: Any) -> None:
        stack = self._td()
        if stack is not None:
            stack[index] = value
        super().__setitem__(index, value)

    def _unbind(self) -> None:
        self._td = _NO_STACK

    def append(self, value: Any) -> None:
        self._unbind()
        super().append(value)

    def extend(self, values: Iterable[Any]) -> None:
        self._unbind()
        super().extend(values)

    def insert(self, index: Any, value: Any) -> None:
        self._unbind()
        super().insert(index, value)

    def pop(self, index: Any = -1) -> Any:
        self._unbind()
        return super().pop(index)

    def remove(self, value: Any) -> None:
        self._unbind()
        super().remove(value)

    def clear(self) -> None:
        self._unbind()
        super().clear()

    def __delitem__(self, index: Any) -> None:
        self._unbind()
        super().__delitem__(index)

    def __iadd__(self, values: Iterable[Any]) -> LinkedList:  # type: ignore[override,misc]
        self._unbind()
        return super().__iadd__(values)  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"LinkedList({list.__repr__(self)})"

    def __reduce__(self) -> Any:
        """Pickled as its values (a list sent to another process is no longer linked to the
        stack), as the reference does."""
        return type(self), (list(self),)


def _NO_STACK() -> None:
    return None
