"""The ``tensordict.utils`` names that user code imports: directory listing, key helpers and
predicates.

>>> from tensordict_rs.utils import unravel_key
>>> unravel_key(("a", ("b", "c")))
('a', 'b', 'c')
"""

from __future__ import annotations

import logging
import os
from typing import Any, TypeAlias

import torch

from ._core.classes import is_tensor_collection, is_tensorclass
from ._core.nodes import TreeNode
from ._core.unbatched import is_unbatched

__all__ = [
    "KEY_SEPARATOR",
    "NestedKey",
    "assert_allclose_td",
    "assert_close",
    "default_is_leaf",
    "is_bool",
    "is_floating",
    "is_inexact",
    "is_integer",
    "is_leaf_nontensor",
    "is_non_tensor",
    "is_tensor_collection",
    "is_tensorclass",
    "logger",
    "print_directory_tree",
    "strtobool",
    "unravel_key",
    "unravel_key_list",
    "unravel_key_to_tuple",
]

#: A key of a TensorDict: a str, or a tuple of keys for a nested entry.
NestedKey: TypeAlias = str | tuple[Any, ...]
#: The separator of nested keys in flat names (``flatten_keys``, ``state_dict``).
KEY_SEPARATOR: str = "."

logger = logging.getLogger("tensordict_rs")


def print_directory_tree(
    path: str | os.PathLike[str], indent: str = "", display_metadata: bool = True
) -> str:
    """Logs the tree of files and directories under ``path`` (INFO, logger ``tensordict_rs``)
    and returns it: the total size first (with ``display_metadata``), then one line per entry,
    four more spaces per level, in ``os.listdir`` order — tensordict's lines.

    >>> import tempfile, torch
    >>> from tensordict_rs import TensorDict
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = TensorDict(a=torch.zeros(3), batch_size=[3]).memmap(d)
    ...     tree = print_directory_tree(d, display_metadata=False)
    >>> sorted(line.strip() for line in tree.splitlines()[1:])
    ['a.memmap', 'meta.json']
    """
    path = os.fspath(path)
    lines = []
    if display_metadata:
        total = sum(
            os.path.getsize(os.path.join(root, name))
            for root, _, names in os.walk(path)
            for name in names
        )
        lines.append(f"Directory size: {_format_size(float(total))}")
        logger.info(lines[-1])
    if os.path.isdir(path):
        lines.append(indent + os.path.basename(path) + "/")
        logger.info(lines[-1])
        for item in os.listdir(path):
            lines.append(
                print_directory_tree(
                    os.path.join(path, item), indent + "    ", display_metadata=False
                )
            )
    else:
        lines.append(indent + os.path.basename(path))
        logger.info(lines[-1])
    return "\n".join(lines)


def _format_size(size: float) -> str:
    """``1.17 KB``: tensordict's rendering of a byte count."""
    for unit in ["B", "KB", "MB", "GB"]:
        if size < 1024.0:
            return f"{size:.2f} {unit}"
        size /= 1024.0
    return f"{size:.2f} TB"


def strtobool(value: str) -> bool:
    """``"y", "yes", "t", "true", "on", "1"`` -> True; ``"n", "no", "f", "false", "off", "0"``
    -> False (any case); anything else raises ValueError (distutils' rule, which the tutorials
    use through ``tensordict.utils``).

    >>> strtobool("False"), strtobool("1")
    (False, True)
    """
    lowered = value.lower()
    if lowered in ("y", "yes", "t", "true", "on", "1"):
        return True
    if lowered in ("n", "no", "f", "false", "off", "0"):
        return False
    raise ValueError(f"invalid truth value {value!r}")


def is_non_tensor(obj: Any) -> bool:
    """True for a non-tensor entry (``NonTensorData``, or a stack of them).

    >>> from tensordict_rs import NonTensorData
    >>> is_non_tensor(NonTensorData("x")), is_non_tensor(1)
    (True, False)
    """
    return bool(getattr(type(obj), "_is_non_tensor", False))


def unravel_key(key: Any) -> Any:
    """A nested key flattened: ``("a", ("b", "c"))`` -> ``("a", "b", "c")``; a str or a 1-tuple
    -> the str.

    >>> unravel_key(("a",))
    'a'
    """
    if isinstance(key, str):
        return key
    if not isinstance(key, tuple):
        raise ValueError(f"keys are str or tuples of str, got {key!r}")
    flat: list[str] = []
    for part in key:
        inner = unravel_key(part)
        flat.extend((inner,) if isinstance(inner, str) else inner)
    return flat[0] if len(flat) == 1 else tuple(flat)


def unravel_key_list(keys: Any) -> list[Any]:
    """``unravel_key`` of every key of a list.

    >>> unravel_key_list(["a", ("b", ("c",))])
    ['a', ('b', 'c')]
    """
    return [unravel_key(key) for key in keys]


def _pass_through(value: Any) -> bool:
    """True for an entry that batch operations carry whole: non-tensor data and
    ``UnbatchedTensor`` (tensordict's ``_pass_through``).

    >>> import torch
    >>> from tensordict_rs import NonTensorData, UnbatchedTensor
    >>> _pass_through(UnbatchedTensor(torch.zeros(2))), _pass_through(torch.zeros(2))
    (True, False)
    """
    return is_non_tensor(value) or is_unbatched(value)


def _check_recursive_properties(td: Any) -> bool:
    """Checks that every node of ``td`` agrees with its parent (tensordict's test helper, its
    default checks): a nested tree's batch size starts with its parent's and has its device
    and lock, a tensor's shape starts with its tree's batch size, and an ``UnbatchedTensor``'s
    ``batch_size`` is its tree's. Raises ``AssertionError`` naming the key; True otherwise.
    """
    node = td._tensordict if isinstance(td._tensordict, TreeNode) else td
    _check_node(node, ())
    return True


def _check_node(td: TreeNode, path: tuple[str, ...]) -> None:
    batch = tuple(td._batch_size)
    for key in list(td._tensordict):
        value, where = td._get_str(key), (*path, key)
        if isinstance(value, TreeNode):
            if tuple(value._batch_size[: len(batch)]) != batch:
                raise AssertionError(f"{where}: batch size {value._batch_size} under {batch}")
            if td._device is not None and value._device != td._device:
                raise AssertionError(f"{where}: device {value._device} under {td._device}")
            if td._is_locked and not value._is_locked:
                raise AssertionError(f"{where}: unlocked under a locked tree")
            _check_node(value, where)
        elif is_unbatched(value):
            if tuple(value.batch_size) != batch:
                raise AssertionError(f"{where}: unbatched batch_size {value.batch_size} != {batch}")
        elif hasattr(value, "shape") and not is_non_tensor(value):
            if tuple(value.shape[: len(batch)]) != batch:
                raise AssertionError(f"{where}: shape {tuple(value.shape)} under batch {batch}")


def unravel_key_to_tuple(key: Any) -> tuple[str, ...]:
    """A nested key as a flat tuple of str (a str gives a 1-tuple); ``()`` for anything that
    is no key.

    >>> unravel_key_to_tuple(("a", ("b", ("c",)))), unravel_key_to_tuple(("a", 1))
    (('a', 'b', 'c'), ())
    """
    try:
        flat = unravel_key(key)
    except ValueError:
        return ()
    return (flat,) if isinstance(flat, str) else flat


def _last_dtype(args: tuple[Any, ...]) -> torch.dtype:
    return args[-1].dtype  # type: ignore[no-any-return]


def is_inexact(*args: Any) -> bool:
    """Whether the last argument is a floating-point or complex tensor (``fn(value)`` or
    ``fn(key, value)``, as a ``cast_filter``).

    >>> import torch
    >>> is_inexact(torch.zeros(3)), is_inexact("a", torch.zeros(3, dtype=torch.long))
    (True, False)
    """
    dtype = _last_dtype(args)
    return dtype.is_floating_point or dtype.is_complex


def is_floating(*args: Any) -> bool:
    """Whether the last argument is a floating-point tensor.

    >>> import torch
    >>> is_floating(torch.zeros(3)), is_floating(torch.zeros(3, dtype=torch.complex64))
    (True, False)
    """
    return _last_dtype(args).is_floating_point


def is_integer(*args: Any) -> bool:
    """Whether the last argument is an integer tensor (bool excluded).

    >>> import torch
    >>> is_integer(torch.zeros(3, dtype=torch.int8)), is_integer(torch.zeros(3, dtype=torch.bool))
    (True, False)
    """
    dtype = _last_dtype(args)
    return not dtype.is_floating_point and not dtype.is_complex and dtype is not torch.bool


def is_bool(*args: Any) -> bool:
    """Whether the last argument is a bool tensor.

    >>> import torch
    >>> is_bool(torch.zeros(3, dtype=torch.bool)), is_bool(torch.zeros(3))
    (True, False)
    """
    return _last_dtype(args) is torch.bool


def assert_close(
    actual: Any,
    expected: Any,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = True,
    intersection: bool = False,
    msg: str = "",
    prefix: Any = (),
) -> bool:
    """Asserts that two trees (TensorDicts or tensorclasses) hold the same keys and close
    tensors (``torch.testing.assert_close`` per leaf: dtypes, shapes and devices too);
    non-tensor entries are not compared. ``intersection`` compares the keys both hold.

    >>> import torch; from tensordict_rs import TensorDict
    >>> a = TensorDict(x=torch.zeros(3), y=torch.ones(3))
    >>> assert_close(a, a.clone())
    True
    """
    trees = []
    for value in (actual, expected):
        if is_tensorclass(value):
            value = value._tensordict
        if not isinstance(value, TreeNode):
            raise TypeError(
                "assert_allclose inputs must be of TensorDict type, got "
                f"{type(actual)} and {type(expected)}"
            )
        trees.append(value)
    mine, theirs = ({k: v for k, v in t.items(True, True)} for t in trees)
    if not intersection and set(mine) != set(theirs):
        raise KeyError(
            f"actual and expected tensordict keys mismatch, got {sorted(map(str, mine))} and "
            f"{sorted(map(str, theirs))}."
        )
    base = unravel_key_to_tuple(prefix)
    for key in (k for k in mine if k in theirs):
        a, b = mine[key], theirs[key]
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            continue
        full = (*base, *unravel_key_to_tuple(key))
        try:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
        except AssertionError as err:
            mse = (a.double() - b.double()).pow(2).mean().sqrt().item()
            raise AssertionError(
                f"key {full} does not match, got mse = {mse:.4f}\n{err}\n{msg}".rstrip()
            ) from None
    return True


#: tensordict's other name of ``assert_close``.
assert_allclose_td = assert_close


def default_is_leaf(cls: type) -> bool:
    """The default ``is_leaf`` of the walks: anything but a TensorDict, a tensorclass or
    non-tensor data (``leaves_only`` then skips the non-tensor entries).

    >>> import torch; from tensordict_rs import TensorDict, NonTensorData
    >>> default_is_leaf(torch.Tensor), default_is_leaf(NonTensorData), default_is_leaf(TensorDict)
    (True, False, False)
    """
    return not is_tensor_collection(cls)


def is_leaf_nontensor(cls: type) -> bool:
    """An ``is_leaf`` that takes non-tensor data (``NonTensorData``, ``NonTensorStack``) as
    leaves beside the tensors; other trees are not leaves.

    >>> import torch; from tensordict_rs import TensorDict, NonTensorData
    >>> is_leaf_nontensor(torch.Tensor), is_leaf_nontensor(NonTensorData)
    (True, True)
    >>> is_leaf_nontensor(TensorDict)
    False
    """
    return not is_tensor_collection(cls) or bool(getattr(cls, "_is_non_tensor", False))
