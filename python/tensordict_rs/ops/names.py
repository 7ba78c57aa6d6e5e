"""Names of the batch dims (tensordict's named dims), as a mixin of TensorDict.

A tree stores its names in ``_names`` (None when no dim is named: nothing to carry on the
common path). The walker (``_core.walk.map_leaves``) keeps them where the batch dims stay;
shape ops that move dims pass the moved names; reshapes drop them, as tensordict does.

>>> import torch; from tensordict_rs import TensorDict
>>> TensorDict({"a": torch.zeros(2, 3)}, [2, 3], names=["x", None]).names
['x', None]
"""

from __future__ import annotations

from typing import Any, Self

from .._core.nodes import TreeNode


class Names(TreeNode):
    """``names``, ``refine_names``, ``rename`` and ``rename_``."""

    @property
    def names(self) -> list[str | None]:
        """Names of the batch dims (None for an unnamed dim), as in tensordict: set by
        ``names=`` or ``td.names = [...]``, kept by element-wise operations, slices, ``permute``
        and the like, dropped by reshapes; nested TensorDicts share their parent's.

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3], names=["x", None])
        >>> td.names, td.refine_names("x", "y").names, td.permute(1, 0).names
        (['x', None], ['x', 'y'], ['y', 'x'])
        """
        return list(self._names) if self._names is not None else [None] * len(self._batch_size)

    @names.setter
    def names(self, value: Any) -> None:
        self._set_names(None if value is None else list(value))

    def _has_names(self) -> bool:
        """Whether any batch dim is named (tensordict's internal check, which code written
        against it calls)."""
        return self._names is not None and any(n is not None for n in self._names)

    def _set_names(self, value: list[str | None] | None) -> None:
        """Sets the names of the batch dims here and on the leading dims of nested trees."""
        if value is not None:
            if len(value) != len(self._batch_size):
                raise ValueError(
                    "the length of the dimension names must equate the tensordict batch_dims "
                    f"attribute. Got {value} for batch_dims {len(self._batch_size)}."
                )
            named = [n for n in value if n is not None]
            if len(set(named)) != len(named):
                raise ValueError(f"Some dimension names are non-unique: {value}.")
            if not named:
                value = None
        self._names = value
        for child in self._tensordict.values():
            if isinstance(child, TreeNode):
                extra = child.names[len(self._batch_size) :]
                child._set_names(None if value is None else [*value, *extra])

    def refine_names(self, *names: Any) -> Self:
        """Names the unnamed batch dims and checks the named ones, in place; ``...`` stands
        for the dims not listed. Returns self.

        >>> import torch; from tensordict_rs import TensorDict
        >>> TensorDict({"a": torch.zeros(2, 3)}, [2, 3]).refine_names(..., "y").names
        [None, 'y']
        """
        if len(names) == 1 and isinstance(names[0], (list, tuple)):
            names = tuple(names[0])
        wanted = list(names)
        if Ellipsis in wanted:
            at = wanted.index(Ellipsis)
            fill = len(self._batch_size) - (len(wanted) - 1)
            wanted = [*wanted[:at], *self.names[at : at + fill], *wanted[at + 1 :]]
        if len(wanted) != len(self._batch_size):
            raise ValueError(
                "the length of the dimension names must equate the tensordict batch_dims "
                f"attribute. Got {wanted} for batch_dims {len(self._batch_size)}."
            )
        current = self.names
        new = []
        for have, want in zip(current, wanted, strict=True):
            if have is not None and want is not None and have != want:
                raise RuntimeError(
                    f"refine_names: cannot coerce TensorDict names {current} with {wanted}."
                )
            new.append(have if want is None else want)
        self._set_names(new)
        return self

    def rename(self, *names: Any, **rename_map: Any) -> Self:
        """A shallow copy whose batch dims have new names: given in order (``None`` unnames),
        or as ``old=new`` pairs.

        >>> import torch; from tensordict_rs import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3], names=["x", "y"])
        >>> td.rename(x="t").names, td.names
        (['t', 'y'], ['x', 'y'])
        """
        return self.copy().rename_(*names, **rename_map)

    def rename_(self, *names: Any, **rename_map: Any) -> Self:
        """``rename`` in place; returns self.

        >>> import torch
        >>> from tensordict_rs import TensorDict
        >>> td = TensorDict({"x": torch.zeros(2, 3)}, [2, 3], names=["a", "b"])
        >>> td.rename_(b="c").names
        ['a', 'c']
        """
        if names and rename_map:
            raise ValueError("rename takes names or a mapping, not both")
        if len(names) == 1 and isinstance(names[0], (list, tuple)):
            names = tuple(names[0])
        if rename_map:
            current = self.names
            for old in rename_map:
                if old not in current:
                    raise ValueError(f"rename: no batch dim is named {old!r} (names: {current})")
            self._set_names([rename_map.get(n, n) if n is not None else None for n in current])
        elif len(names) == 1 and names[0] is None:
            self._set_names(None)
        else:
            self._set_names(list(names))
        return self
