"""Nested-tensor leaves (ragged sequences): rows gathered by index.

torch indexes a nested tensor by an int only (``nt[3]``); a TensorDict's batch index may be a
slice, a list, an index tensor or a mask. Rows of a nested leaf are then its components, picked
by their positions and gathered into one new buffer (``gather_components``): the result has the
same layout (strided or jagged) and its components back to back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def is_nested(value: Any) -> bool:
    """True for a nested tensor (strided or jagged)."""
    return isinstance(value, torch.Tensor) and value.is_nested


def leaf_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    """The shape of a tensor; a nested tensor's ragged dims are -1 (torch has no size for them)."""
    if not tensor.is_nested:
        return tuple(tensor.shape)
    sizes = []
    for dim in range(tensor.dim()):
        try:
            sizes.append(tensor.size(dim))
        except RuntimeError:
            sizes.append(-1)
    return tuple(sizes)


def moved(fn: Any, value: torch.Tensor, batch_dims: int) -> torch.Tensor:
    """``fn`` (a row-moving function of a leaf: an index, a shape operation) applied to a nested
    leaf: run by torch when it can (an int index), else on the positions of the components along
    the first dim (a slice, a list, an index tensor, a mask)."""
    try:
        return fn(value)  # type: ignore[no-any-return]
    except (NotImplementedError, RuntimeError, IndexError, TypeError):
        if batch_dims != 1:
            raise
    n = value.size(0)
    picked = fn(torch.arange(n))
    if picked.ndim == 0:
        return value[int(picked)]
    if picked.ndim != 1:
        raise NotImplementedError(
            "a nested-tensor leaf takes indices along its first batch dim only"
        )
    return gather_components(value, picked)


def gather_components(value: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The components ``rows`` (int64, negative from the end) of a nested tensor, copied into
    one buffer, in the layout of ``value``."""
    n = value.size(0)
    rows = rows.to(torch.int64)
    if rows.numel():
        low, high = int(rows.min()), int(rows.max())
        if low < -n or high >= n:
            bad = high if high >= n else low
            raise IndexError(f"index {bad} is out of bounds for dimension 0 with size {n}")
    rows = torch.where(rows < 0, rows + n, rows)
    if value.layout == torch.jagged:
        return _gather_jagged(value, rows)
    return _gather_strided(value, rows)


def _gather_jagged(value: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    if value._ragged_idx != 1:  # type: ignore[attr-defined]
        raise NotImplementedError("rows of a jagged tensor whose ragged dim is not 1")
    jag: Any = value  # torch's NestedTensor (offsets, lengths) has no stubs
    offsets = jag.offsets()
    lengths = jag.lengths()
    starts = offsets[:-1]
    lens = (offsets[1:] - offsets[:-1]) if lengths is None else lengths
    values = value.values()
    picked_lens = lens[rows]
    new_offsets = torch.zeros(rows.numel() + 1, dtype=torch.int64)
    torch.cumsum(picked_lens, 0, out=new_offsets[1:])
    flat = _ranges(starts[rows], picked_lens, int(new_offsets[-1]))
    low, high = _seqlens(picked_lens)
    return torch.nested.nested_tensor_from_jagged(
        values.index_select(0, flat), offsets=new_offsets, min_seqlen=low, max_seqlen=high
    )


def _seqlens(lengths: torch.Tensor) -> tuple[int | None, int | None]:
    """The min/max sequence lengths a jagged tensor caches: torch sizes a padded tensor by the
    cached max (without one, ``to_padded_tensor`` pads to the length of all values together)."""
    if lengths.numel() == 0:
        return None, None
    return int(lengths.min()), int(lengths.max())


def _gather_strided(value: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    sizes = value._nested_tensor_size()  # (n, k)
    counts = sizes.prod(1) if sizes.shape[1] else torch.ones(sizes.shape[0], dtype=torch.int64)
    flat_values = _strided_values(value, counts)
    starts = torch.zeros_like(counts)
    torch.cumsum(counts[:-1], 0, out=starts[1:])
    picked_counts = counts[rows]
    total = int(picked_counts.sum())
    flat = _ranges(starts[rows], picked_counts, total)
    buffer = flat_values.reshape(-1).index_select(0, flat)
    picked_sizes = sizes[rows]
    strides = _contiguous_strides(picked_sizes)
    offsets = torch.zeros(rows.numel(), dtype=torch.int64)
    if rows.numel() > 1:
        torch.cumsum(picked_counts[:-1], 0, out=offsets[1:])
    return torch._nested_view_from_buffer(buffer, picked_sizes, strides, offsets)


def _contiguous_strides(sizes: torch.Tensor) -> torch.Tensor:
    """The C-contiguous strides of each row of a sizes table (n, k)."""
    if sizes.shape[1] == 0:
        return sizes.clone()
    strides = torch.ones_like(sizes)
    for dim in range(sizes.shape[1] - 2, -1, -1):
        strides[:, dim] = strides[:, dim + 1] * sizes[:, dim + 1]
    return strides


def _ranges(starts: torch.Tensor, lengths: torch.Tensor, total: int) -> torch.Tensor:
    """``cat([arange(s, s + n) for s, n in zip(starts, lengths)])`` without a Python loop."""
    if total == 0:
        return torch.zeros(0, dtype=torch.int64)
    ends = torch.cumsum(lengths, 0)
    base = torch.repeat_interleave(starts - (ends - lengths), lengths, output_size=total)
    return base + torch.arange(total)


# ---------------------------------------------------------------------- flat form (saving)


def flat_parts(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """A nested tensor as its storage form: the components back to back (a contiguous 1-D
    tensor), the table of their shapes (int64 ``[n, dims]``) and whether it is jagged. A jagged
    tensor that is a view with holes or an offset start is made compact first; one whose
    ragged dim is not 1 raises ``NotImplementedError``."""
    if value.layout == torch.jagged:
        if value._ragged_idx != 1:  # type: ignore[attr-defined]
            raise NotImplementedError(
                f"a jagged tensor whose ragged dim is {value._ragged_idx} (not 1): "  # type: ignore[attr-defined]
                "transpose it back (ragged dim 1) first"
            )
        jag: Any = value  # torch's NestedTensor (offsets, lengths) has no stubs
        offsets = jag.offsets()
        if jag.lengths() is not None or int(offsets[0]) != 0:
            jag = value = gather_components(value, torch.arange(value.size(0)))
            offsets = jag.offsets()
        values = value.values()
        lengths = (offsets[1:] - offsets[:-1]).to(torch.int64)
        rest = torch.tensor(values.shape[1:], dtype=torch.int64)
        table = torch.cat([lengths.unsqueeze(1), rest.expand(lengths.numel(), -1)], 1)
        return values.contiguous().reshape(-1), table.contiguous(), True
    table = value._nested_tensor_size().to(torch.int64).contiguous()
    if table.ndim != 2:  # torch's table of a nested tensor without components
        raise NotImplementedError("a nested tensor without components (no dims to record)")
    counts = table.prod(1) if table.shape[1] else torch.ones(table.shape[0], dtype=torch.int64)
    return _strided_values(value, counts), table, False


def _strided_values(value: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """A strided nested tensor's components back to back, 1-D (a view when they already lie
    so). torch's ``values()`` is its buffer from the start of the storage: a nested tensor
    that views a buffer at an offset (``from_flat`` of a slice) starts further in."""
    if not value.is_contiguous():
        value = value.contiguous()
    flat = value.values().reshape(-1)
    if not counts.numel():
        return flat[:0]
    start = int(value._nested_tensor_storage_offsets()[0]) - flat.storage_offset()
    return flat[start : start + int(counts.sum())]


def from_flat(values: torch.Tensor, table: torch.Tensor, jagged: bool) -> torch.Tensor:
    """The nested tensor (a view of ``values``, 1-D) whose component shapes are the rows of
    ``table`` (int64 ``[n, dims]``), strided or jagged."""
    values = values.as_subclass(torch.Tensor)
    counts = table.prod(1) if table.shape[1] else torch.ones(table.shape[0], dtype=torch.int64)
    if jagged:
        offsets = torch.zeros(table.shape[0] + 1, dtype=torch.int64)
        torch.cumsum(table[:, 0], 0, out=offsets[1:])
        rest = [int(d) for d in table[0, 1:]] if table.shape[0] else []
        low, high = _seqlens(table[:, 0])
        return torch.nested.nested_tensor_from_jagged(
            values.view(int(offsets[-1]), *rest), offsets=offsets, min_seqlen=low, max_seqlen=high
        )
    starts = torch.zeros(table.shape[0], dtype=torch.int64)
    if table.shape[0] > 1:
        torch.cumsum(counts[:-1], 0, out=starts[1:])
    # torch reads the offsets from the start of the values' storage, not of the view
    starts += int(values.storage_offset())
    return torch._nested_view_from_buffer(values, table, _contiguous_strides(table), starts)


# ------------------------------------------------------------- packed form (one message)

JAGGED = "jagged"
STRIDED = "strided"
# the parts of a nested leaf in one message, in the order they are packed (sorted names):
# a jagged leaf's values with its offsets (and lengths, for a view with holes), as torch
# holds them; a strided leaf's components back to back with its table of component shapes
JAGGED_PARTS = (("offsets", "values"), ("lengths", "offsets", "values"))
STRIDED_PARTS = ("sizes", "values")
_INDEX_DTYPES = (torch.int64, torch.int32)


def packed_parts(value: torch.Tensor) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A nested leaf as one message carries it: its description (``layout``, and a jagged
    leaf's ``ragged_idx``) and its dense parts by name (see ``JAGGED_PARTS``,
    ``STRIDED_PARTS``).

    A jagged leaf's parts are its own ``values``, ``offsets`` and ``lengths`` tensors (no
    copy), except that one without lengths whose offsets do not span its values exactly (a
    slice) is narrowed to the span first; a strided leaf's are ``flat_parts``'s."""
    if value.layout == torch.jagged:
        jag: Any = value  # torch's NestedTensor (offsets, lengths) has no stubs
        ragged = int(jag._ragged_idx)
        values, offsets, lengths = jag._values, jag._offsets, jag._lengths
        if lengths is None and offsets.numel():
            first, last = int(offsets[0]), int(offsets[-1])
            if first != 0 or last != values.size(ragged - 1):
                values = values.narrow(ragged - 1, first, last - first)
                offsets = offsets - first
        parts = {"offsets": offsets, "values": values}
        if lengths is not None:
            parts["lengths"] = lengths
        return {"layout": JAGGED, "ragged_idx": ragged}, parts
    flat, table, _ = flat_parts(value)
    return {"layout": STRIDED}, {"sizes": table, "values": flat}


def part_names(meta: dict[str, Any]) -> tuple[tuple[str, ...], ...]:
    """The sets of part names a nested leaf of description ``meta`` may have."""
    return JAGGED_PARTS if meta.get("layout") == JAGGED else (STRIDED_PARTS,)


def from_packed_parts(
    meta: dict[str, Any], parts: dict[str, torch.Tensor], batch: tuple[int, ...], key: str
) -> torch.Tensor:
    """The nested leaf ``key`` made from its parts (``packed_parts``), views of them, after
    checking the parts against each other and the batch size ``batch`` of its node: offsets
    in range and ordered, lengths within the values, a table of shapes whose components
    fill the values exactly. Anything else raises ``ValueError`` naming ``key``."""

    def bad(why: str) -> ValueError:
        return ValueError(f"nested leaf {key!r}: {why}")

    layout = meta.get("layout")
    names = tuple(sorted(parts))
    if layout not in (JAGGED, STRIDED) or names not in part_names(meta):
        raise bad(f"layout {layout!r} with parts {list(names)} is not one this library writes")
    parts = {k: v.as_subclass(torch.Tensor) for k, v in parts.items()}
    values = parts["values"]
    if layout == STRIDED:
        return _strided_from_parts(values, parts["sizes"], batch, bad)
    ragged = meta.get("ragged_idx")
    if type(ragged) is not int or not 1 <= ragged <= values.ndim:
        raise bad(f"ragged_idx {ragged!r} does not fit values of {values.ndim} dims")
    offsets, lengths = parts["offsets"], parts.get("lengths")
    for name, t in (("offsets", offsets), ("lengths", lengths)):
        if t is not None and (t.dtype not in _INDEX_DTYPES or t.ndim != 1):
            raise bad(f"its {name} are {t.dtype} of {t.ndim} dims, not a 1-D int64 or int32")
    n = offsets.numel() - 1
    if n < 0 or (batch and n != batch[0]) or (lengths is not None and lengths.numel() != n):
        got = "no" if lengths is None else lengths.numel()
        raise bad(
            f"{offsets.numel()} offsets and {got} lengths do not make the rows of the batch "
            f"size {list(batch)}"
        )
    # batch dims after the first are dims of the values before the ragged one
    if len(batch) > 1 and (
        ragged < len(batch) or list(values.shape[: len(batch) - 1]) != list(batch[1:])
    ):
        raise bad(
            f"values of shape {list(values.shape)} ragged along dim {ragged} do not fit the "
            f"batch size {list(batch)}"
        )
    size = values.size(ragged - 1)
    # checked with numpy (one thread: torch's intra-op threads cost more than the work on a
    # busy machine), on a CPU copy of the offsets for a leaf on another device
    off = _numpy(offsets)
    if lengths is None:
        lens = np.diff(off)
        if off[0] != 0 or off[-1] != size or (n and lens.min() < 0):
            raise bad(
                f"its offsets must rise from 0 to the {size} values of its ragged dim "
                f"(they run from {int(off[0])} to {int(off[-1])})"
            )
    else:
        lens = _numpy(lengths)
        starts = off[:-1]
        # each bound first, so that no sum overflows
        if n and (
            lens.min() < 0
            or starts.min() < 0
            or lens.max() > size
            or starts.max() > size
            or (starts + lens).max() > size
        ):
            raise bad(f"its offsets and lengths reach past the {size} values of its ragged dim")
    low, high = (int(lens.min()), int(lens.max())) if n else (None, None)
    return torch.nested.nested_tensor_from_jagged(
        values,
        offsets=offsets,
        lengths=lengths,
        jagged_dim=ragged,
        min_seqlen=low,
        max_seqlen=high,
    )


def _numpy(t: torch.Tensor) -> Any:
    """An int tensor as an int64 numpy array (a view on the CPU when it is int64 already)."""
    return t.detach().cpu().numpy().astype(np.int64, copy=False)


def _strided_from_parts(
    values: torch.Tensor, sizes: torch.Tensor, batch: tuple[int, ...], bad: Any
) -> torch.Tensor:
    if sizes.dtype != torch.int64 or sizes.ndim != 2 or values.ndim != 1:
        raise bad(
            f"its table of shapes is {sizes.dtype} of {sizes.ndim} dims and its values "
            f"{values.ndim}-D: a 2-D int64 table and 1-D values are expected"
        )
    rows = _numpy(sizes)
    if batch and rows.shape[0] != batch[0]:
        raise bad(f"{rows.shape[0]} components for the batch size {list(batch)}")
    tail = list(batch[1:])
    if tail and (rows.shape[1] < len(tail) or bool((rows[:, : len(tail)] != tail).any())):
        raise bad(f"its components do not all start with the batch dims {tail}")
    if rows.size and rows.min() < 0:
        raise bad("a component has a negative size")
    # exact in int64 once the float sum (no overflow) is small enough
    if rows.size and not rows.astype(np.float64).prod(1).sum() <= 2.0**52:  # NaN: inf * 0
        raise bad("its components hold more values than any buffer")
    total = int(rows.prod(1).sum()) if rows.size else 0
    if rows.shape[1] == 0:
        total = rows.shape[0]  # components of 0 dims: one value each
    if total != values.numel():
        raise bad(f"its components hold {total} values, its buffer {values.numel()}")
    return from_flat(values, sizes, False)
