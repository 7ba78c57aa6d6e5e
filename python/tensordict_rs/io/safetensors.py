"""safetensors files both ways: ``TensorDict.from_safetensors`` and ``TensorDict.to_safetensors``.

The Rust core reads and writes the files with the ``safetensors`` crate (the format's own
validating parser and serializer), with the GIL released. Reading maps the file once,
copy-on-write: every tensor is a view of that map (no copy, and writes never reach the file).
Nested keys are joined with a separator (``"."`` by default) into safetensors names, and split
again on reading. What safetensors has no place for (batch sizes, non-tensor values) goes into
the file's ``__metadata__`` under ``tensordict_rs.*`` keys, so a tree comes back whole; other
readers ignore those keys.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from .. import _native
from .._core.nodes import TD, NonTensorData, _json_text
from .._core.tensor_bytes import _source_bytes, _tensor_from_buffer
from .._core.unbatched import UnbatchedTensor
from ..memmap import _LazyLeaf

PathLike = str | os.PathLike[str]
BATCH_SIZES = "tensordict_rs.batch_sizes"
NON_TENSOR = "tensordict_rs.non_tensor"
UNBATCHED = "tensordict_rs.unbatched"  # the names of the UnbatchedTensor entries (a JSON list)

_DTYPES: dict[str, torch.dtype] = {
    f"torch.{name}": getattr(torch, name)
    for name in (
        "bool", "uint8", "int8", "int16", "uint16", "float16", "bfloat16", "int32", "uint32",
        "float32", "complex64", "float64", "int64", "uint64", "float8_e5m2", "float8_e4m3fn",
        "float8_e4m3fnuz", "float8_e5m2fnuz",
    )
    if hasattr(torch, name)
}  # fmt: skip


def _split(name: str, separator: str | None) -> list[str]:
    return name.split(separator) if separator else [name]


def _insert(root: dict[str, Any], parts: list[str], value: Any, path: str, name: str) -> None:
    node = root
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise _native.InvalidTreeError(
                f"{path}: {name!r} needs {'.'.join(parts[: i + 1])!r} to be a sub-tree, but a "
                "tensor has that name; pass another separator (or separator=None for flat keys)"
            )
        node = child
    if parts[-1] in node:
        raise _native.InvalidTreeError(
            f"{path}: {name!r} is both a tensor and a sub-tree with this separator; pass "
            "another separator (or separator=None for flat keys)"
        )
    node[parts[-1]] = value


def _build(
    cls: type[TD],
    entries: dict[str, Any],
    prefix: str,
    separator: str,
    sizes: dict[str, Any],
    batch_size: Any,
    parent: Any,
) -> TD:
    batch = batch_size if batch_size is not None else sizes.get(prefix, parent)
    items: dict[Any, Any] = {}
    for key, value in entries.items():
        if isinstance(value, dict):
            sub_prefix = f"{prefix}{separator}{key}" if prefix else key
            value = _build(cls, value, sub_prefix, separator, sizes, batch_size, batch)
        items[key] = value
    return cls(items, batch_size=batch)


def from_safetensors(
    cls: type[TD], path: PathLike, separator: str | None = ".", batch_size: Any = None
) -> TD:
    """Reads a ``.safetensors`` file, memory-mapped (copy-on-write: the file never changes).

    Names are split on ``separator`` into nested keys (``None``: flat keys). The batch
    sizes and non-tensor values that ``to_safetensors`` stored come back; ``batch_size``
    overrides them for every level. A damaged file raises ``InvalidDirectoryError``.

    >>> import tempfile, torch
    >>> from tensordict_rs import TensorDict
    >>> path = tempfile.mkdtemp() + "/model.safetensors"
    >>> td = TensorDict({"w": torch.ones(2, 3), "b": {"x": torch.zeros(2)}}, [2])
    >>> td.to_safetensors(path)
    >>> TensorDict.from_safetensors(path)
    TensorDict(batch_size=[2], fields={b: {x: f32[]}, w: f32[3]})
    """
    name = os.fspath(path)
    entries, metadata = _native.read_safetensors(name)
    try:
        sizes = json.loads(metadata[BATCH_SIZES]) if BATCH_SIZES in metadata else {}
        values = json.loads(metadata[NON_TENSOR]) if NON_TENSOR in metadata else {}
        unbatched = json.loads(metadata[UNBATCHED]) if UNBATCHED in metadata else []
        if not isinstance(sizes, dict) or not isinstance(values, dict):
            raise ValueError("not a JSON object")
        if not isinstance(unbatched, list) or not all(isinstance(n, str) for n in unbatched):
            raise ValueError(f"{UNBATCHED} is not a list of names")
    except RecursionError:
        raise _native.InvalidDirectoryError(
            f"{name}: the __metadata__ entries {BATCH_SIZES}/{NON_TENSOR} nest too deeply"
        ) from None
    except ValueError as err:
        raise _native.InvalidDirectoryError(
            f"{name}: the __metadata__ entries {BATCH_SIZES}/{NON_TENSOR}/{UNBATCHED} are "
            f"damaged ({err})"
        ) from None
    root: dict[str, Any] = {}
    for key in [row[0] for row in entries] + list(values):
        if separator and key.count(separator) >= _native.MAX_DEPTH:
            raise _native.InvalidDirectoryError(
                f"{name}: {key[:80]!r}... nests more than {_native.MAX_DEPTH} levels with the "
                f"separator {separator!r}; pass another separator (or separator=None for flat keys)"
            )
    names = {row[0] for row in entries}
    for key in unbatched:
        if key not in names:
            raise _native.InvalidDirectoryError(
                f"{name}: the __metadata__ entry {UNBATCHED} names {key[:80]!r}, which is not a "
                "tensor of the file"
            )
    wrapped = set(unbatched)
    for key, dtype_name, shape, buffer in entries:
        dtype = _DTYPES[dtype_name]
        tensor = (
            torch.empty(shape, dtype=dtype)
            if buffer is None
            else _tensor_from_buffer(buffer, dtype, shape)
        )
        if key in wrapped:
            tensor = UnbatchedTensor(tensor)
        _insert(root, _split(key, separator), tensor, name, key)
    for key, value in values.items():
        _insert(root, _split(key, separator), NonTensorData(value), name, key)
    for key in sizes if separator else ():  # sub-trees without tensors come back too
        node = root
        for part in _split(key, separator) if key else []:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break  # a tensor of that name: _build refuses the batch size if it must
            node = child
    root_size = batch_size if batch_size is not None else sizes.get("", [])
    try:
        return _build(cls, root, "", separator or "", sizes, batch_size, root_size)
    except (RuntimeError, ValueError, TypeError) as err:
        raise _native.InvalidTreeError(f"{name}: {err}") from None


def _flatten(
    td: Any,
    prefix: str,
    separator: str,
    out: dict[str, Any],
) -> None:
    """Collects ``(name, dtype, shape, data_ptr, nbytes)`` rows, batch sizes and values."""
    if list(td.batch_size) or not td._tensordict:  # (an empty sub-tree: recorded to come back)
        out["sizes"][prefix] = list(td.batch_size)
    for key, value in td._tensordict.items():
        if separator and separator in key:
            raise _native.InvalidTreeError(
                f"key {key!r} contains the separator {separator!r}: its name would not split "
                "back into the same keys; pass another separator"
            )
        name = f"{prefix}{separator}{key}" if prefix else key
        if type(value) is _LazyLeaf:
            out["keep"].append(value.buffer)
            ptr = value.buffer.address
            out["rows"].append(
                (name, str(value.dtype), list(value.shape), ptr, value.buffer.nbytes)
            )
        elif isinstance(value, NonTensorData):
            _json_text(value.data, name)  # only JSON values, never pickles
            out["values"][name] = value.data
        elif isinstance(value, torch.Tensor):
            if type(value) is UnbatchedTensor:
                out["unbatched"].append(name)
                value = value._data  # its payload, marked in the metadata
            if str(value.dtype) not in _DTYPES:
                raise _native.InvalidTreeError(
                    f"key {name!r}: dtype {value.dtype} cannot be stored in a safetensors file"
                )
            src = _source_bytes(value) if value.numel() else value
            out["keep"].append(src)
            ptr = src.data_ptr() if value.numel() else 0
            out["rows"].append((name, str(value.dtype), list(value.shape), ptr, value.nbytes))
        else:
            _flatten(value, name, separator, out)


def to_safetensors(
    td: TD,
    path: PathLike,
    separator: str = ".",
    metadata: dict[str, str] | None = None,
) -> None:
    """Writes every tensor to a ``.safetensors`` file, atomically (beside it, then renamed).

    Nested keys are joined with ``separator``; batch sizes and JSON non-tensor values go
    into ``__metadata__`` (``tensordict_rs.*`` keys) beside the user's ``metadata``, and so do
    the names of the ``UnbatchedTensor`` entries (their payloads are the tensors). Any
    reader of the format (``safetensors.torch.load_file``) opens the file.

    >>> import safetensors.torch, torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"w": torch.ones(2), "sub": {"b": torch.zeros(1)}}, [])
    >>> td.to_safetensors("weights.safetensors", metadata={"format": "pt"})
    >>> sorted(safetensors.torch.load_file("weights.safetensors"))
    ['sub.b', 'w']
    """
    if not separator:
        raise ValueError("separator must be a non-empty string")
    out: dict[str, Any] = {"rows": [], "sizes": {}, "values": {}, "keep": [], "unbatched": []}
    _flatten(td, "", separator, out)
    extra = dict(metadata or {})
    for reserved in (BATCH_SIZES, NON_TENSOR, UNBATCHED):
        if reserved in extra:
            raise ValueError(f"metadata key {reserved!r} is reserved for the tree's structure")
    if out["sizes"]:
        extra[BATCH_SIZES] = json.dumps(out["sizes"], ensure_ascii=False)
    if out["values"]:
        extra[NON_TENSOR] = json.dumps(out["values"], ensure_ascii=False)
    if out["unbatched"]:
        extra[UNBATCHED] = json.dumps(out["unbatched"], ensure_ascii=False)
    _native.write_safetensors(os.fspath(path), out["rows"], extra)
    del out
