"""Moving a memory-mapped tree to a device in one stream: ``load_memmap(device=)``, ``to()``.

Every leaf goes into ONE device allocation (the leaves are views of it), through two staging
buffers of at most ``CHUNK_BYTES`` each (pinned when the device is CUDA): while the device
copies one buffer, the native core fills the other from the maps (parallel copies, GIL
released). The byte stream is the device allocation's own layout (leaves at 64-byte aligned
offsets), cut into chunks regardless of leaf boundaries, so a leaf may span several chunks and
a chunk may hold many leaves. The same code runs with a CPU destination (unpinned staging, plain
copies), which is how the tests exercise it.
"""

from __future__ import annotations

import array
from typing import Any

import torch

from .. import _native
from .._core.nodes import NTD_TYPES, TreeNode
from ..memmap import _LazyLeaf

CHUNK_BYTES = 64 << 20  # two of them: <= 128 MiB of host staging (the issue allows 512 MiB)
ALIGN = 64  # every leaf starts at a multiple of this in the device allocation


def _leaf_source(value: Any) -> tuple[int, int, Any] | None:
    """(address, nbytes, keep-alive) of a leaf's host bytes, or None when it cannot stream."""
    if type(value) is _LazyLeaf:
        return value.buffer.address, value.buffer.nbytes, value.buffer
    if isinstance(value, torch.Tensor):
        if not (value.is_cpu and value.is_contiguous()) or value.is_conj() or value.is_neg():
            return None
        if value.layout is not torch.strided or value.is_nested:
            return None
        return value.data_ptr(), value.nbytes, value
    return None


def _collect(td: Any, out: list[tuple[Any, str, Any]]) -> bool:
    """Every (node, key, value) of the tree; False if a leaf cannot stream."""
    for key, value in td._tensordict.items():
        if isinstance(value, TreeNode):
            if not _collect(value, out):
                return False
        elif type(value) in NTD_TYPES:
            continue
        elif _leaf_source(value) is None:
            return False
        else:
            out.append((td, key, value))
    return True


def _stage_and_copy(
    pieces: list[tuple[int, int, int]],
    total: int,
    dest: torch.Tensor,
    device: torch.device,
    chunk_bytes: int,
) -> None:
    """Streams ``pieces`` ((source address, dest offset, nbytes)) into ``dest`` by chunks."""
    cuda = device.type == "cuda"
    size = max(1, min(chunk_bytes, total))
    staging = [torch.empty(size, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
    stream = torch.cuda.Stream(device) if cuda else None
    events: list[Any] = [None, None]
    piece = 0
    offset_in_piece = 0
    start = 0
    turn = 0
    while start < total:
        end = min(start + size, total)
        table = array.array("Q")
        # every piece overlapping [start, end), cut to it
        while piece < len(pieces):
            address, at, nbytes = pieces[piece]
            lo = max(at + offset_in_piece, start)
            hi = min(at + nbytes, end)
            if lo >= end:
                break
            table.extend((address + (lo - at), lo - start, hi - lo))
            if at + nbytes <= end:
                piece += 1
                offset_in_piece = 0
            else:
                offset_in_piece = hi - at
                break
        buffer = staging[turn]
        if events[turn] is not None:
            events[turn].synchronize()  # the device is done reading this buffer
        if table:
            _native.copy_packed(table, buffer.data_ptr(), end - start, True)
        target = dest[start:end]
        if stream is not None:
            with torch.cuda.stream(stream):
                target.copy_(buffer[: end - start], non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            events[turn] = event
        else:
            target.copy_(buffer[: end - start])
        start = end
        turn ^= 1
    for event in events:
        if event is not None:
            event.synchronize()  # the staging buffers are freed on return


def stream_tree(
    td: Any, device: torch.device | str, *, chunk_bytes: int = CHUNK_BYTES
) -> Any | None:
    """A copy of ``td`` on ``device`` whose leaves are views of one allocation, streamed
    through two staging buffers (see the module docstring). Returns None when a leaf is not
    plain host memory (the caller then moves leaves one by one)."""
    device = torch.device(device)
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
    found: list[tuple[Any, str, Any]] = []
    if not _collect(td, found):
        return None
    pieces: list[tuple[int, int, int]] = []
    keep: list[Any] = []
    offsets: dict[tuple[int, str], int] = {}
    total = 0
    for node, key, value in found:
        address, nbytes, alive = _leaf_source(value)  # type: ignore[misc]
        keep.append(alive)
        if nbytes == 0:
            continue
        total = -(-total // ALIGN) * ALIGN
        offsets[(id(node), key)] = total
        pieces.append((address, total, nbytes))
        total += nbytes
    dest = torch.empty(total, dtype=torch.uint8, device=device)
    if total:
        _stage_and_copy(pieces, total, dest, device, chunk_bytes)
    del keep
    return _rebuild(td, dest, offsets, device)


def _rebuild(td: Any, dest: torch.Tensor, offsets: dict[tuple[int, str], int], device: Any) -> Any:
    out = td._new_unchecked(td._batch_size, device)
    out._memmap_prefix = td._memmap_prefix
    items = out._tensordict
    for key, value in td._tensordict.items():
        if isinstance(value, TreeNode):
            items[key] = _rebuild(value, dest, offsets, device)
        elif type(value) in NTD_TYPES:
            items[key] = type(value)(value.data, value.batch_size, device)
        else:
            shape = tuple(value.shape)
            at = offsets.get((id(td), key))
            if at is None:
                items[key] = torch.empty(shape, dtype=value.dtype, device=device)
            else:
                nbytes = value.buffer.nbytes if type(value) is _LazyLeaf else value.nbytes
                items[key] = dest[at : at + nbytes].view(value.dtype).view(shape)
    return out
