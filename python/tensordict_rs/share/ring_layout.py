"""What both sides of a DataLoader worker's ring share (see ``ring``): the slot states of its
header and the views of a slot's leaves, made in runs (a few torch calls for many leaves)."""

from __future__ import annotations

from typing import Any

import torch

# The states of a slot in the ring's header (one 64-bit word per slot: generation and state,
# changed only by compare-and-swap in the Rust core, ``sys/ring.rs``). A slot is free only when
# both sides have dropped it: HELD is the worker's half alone (it fills the slot, or holds its
# batch unsent, or still holds a batch the main process has freed), SENT the main process's half
# alone, SHARED both halves (the batch crossed and the worker still holds it: a ``collate_fn``
# that keeps the batches it returns). Each side clears only its own half.
FREE, HELD, SENT, SHARED = 0, 1, 2, 3
# Slots of one worker's ring at most (the header has a word for each).
MAX_SLOTS = 16
HEADER_BYTES = 8 * MAX_SLOTS


# A run of leaves viewing one storage: ``(dtype, offset, shape, stride, count, step)``
# (offset, stride and step in elements): ``count`` leaves of one dtype, shape and stride,
# ``step`` elements apart, made with one ``set_`` and one ``unbind``.
Run = tuple[torch.dtype, int, tuple[int, ...], tuple[int, ...], int, int]


def runs(specs: list[tuple[torch.dtype, tuple[int, ...], tuple[int, ...], int]]) -> list[Run]:
    """The runs of leaves ``(dtype, shape, stride, offset)`` of one storage, in order: a
    batch's leaves of one kind, back to back, are one run."""
    out: list[Run] = []
    i, n = 0, len(specs)
    while i < n:
        dtype, shape, stride, offset = specs[i]
        j = i + 1
        step = specs[j][3] - offset if j < n else 0
        while (
            j < n
            and step > 0
            and specs[j][0] == dtype
            and specs[j][1] == shape
            and specs[j][2] == stride
            and specs[j][3] == offset + (j - i) * step
        ):
            j += 1
        out.append((dtype, offset, shape, stride, j - i, step))
        i = j
    return out


def run_views(storage: Any, planned: list[Run]) -> list[torch.Tensor]:
    """The tensors of the runs ``planned`` over ``storage``: a few torch calls for many leaves."""
    out: list[torch.Tensor] = []
    for dtype, offset, shape, stride, count, step in planned:
        if count == 1:
            out.append(torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride))
        else:
            run = torch.empty(0, dtype=dtype).set_(
                storage, offset, (count, *shape), (step, *stride)
            )
            out.extend(run.unbind(0))
    return out


def views(
    specs: list[tuple[Any, torch.dtype, tuple[int, ...], tuple[int, ...], int]],
) -> list[torch.Tensor]:
    """Tensors over storages: ``(storage, dtype, shape, stride, offset)`` each (offset and
    stride in elements). A run of leaves of one dtype, shape and stride at evenly spaced
    offsets of one storage (a batch's leaves of one kind, back to back) is made with one
    ``set_`` and one ``unbind``: a 64-leaf batch costs a few torch calls, not 64."""
    out: list[torch.Tensor] = []
    i, n = 0, len(specs)
    while i < n:
        storage = specs[i][0]
        j = i + 1
        while j < n and specs[j][0] is storage:
            j += 1
        out.extend(run_views(storage, runs([spec[1:] for spec in specs[i:j]])))
        i = j
    return out
