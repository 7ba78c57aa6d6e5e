"""Nested-tensor leaves (ragged sequences): rows gathered by index.

torch indexes a nested tensor by an int only (``nt[3]``); a TensorDict's batch index may be a
slice, a list, an index tensor or a mask. Rows of a nested leaf are then its components, picked
by their positions and gathered into one new buffer (``gather_components``): the result has the
same layout (strided or jagged) and its components back to back.
"""

from __future__ import annotations

from typing import Any

import torch


def is_nested(value: Any) -> bool:
    """True for a nested tensor (strided or jagged)."""
    return isinstance(value, torch.Tensor) and value.is_nested


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
    if not value.is_contiguous():
        value = value.contiguous()
    flat_values = value.values() if hasattr(value, "values") else value.view(-1)
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
                f"a jagged tensor whose ragged dim is {value._ragged_idx} (not 1)"  # type: ignore[attr-defined]
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
    if not value.is_contiguous():
        value = value.contiguous()
    table = value._nested_tensor_size().to(torch.int64).contiguous()
    return value.values().reshape(-1), table, False


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
    return torch._nested_view_from_buffer(values, table, _contiguous_strides(table), starts)
