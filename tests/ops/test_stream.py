"""The streaming device path (``ops/stream.py``): one allocation per tree, two staging buffers.

Run with a CPU destination and chunks small enough that the double buffer wraps many times,
with leaves larger and smaller than a chunk, leaves across chunk edges, empty leaves, nested
trees and non-tensor values. CUDA itself is checked where a GPU is present.
"""

from __future__ import annotations

import pytest
import torch
from tensordict_rs import TensorDict
from tensordict_rs.ops import stream as _stream


def _tree(tmp_path):
    gen = torch.Generator().manual_seed(0)
    td = TensorDict(
        {
            "big": torch.rand(1000, 7, generator=gen),  # 28,000 B: many chunks
            "small": torch.arange(3, dtype=torch.int16),
            "scalar": torch.tensor(2.5, dtype=torch.float64),
            "flags": torch.rand(13, generator=gen) < 0.5,
            "empty": torch.empty(0, 4),
            "nested": {
                "a": torch.randint(0, 255, (517,), dtype=torch.uint8, generator=gen),
                "deeper": {"c": torch.rand(2, 3, 4, generator=gen).to(torch.bfloat16)},
            },
            "note": "kept",
        },
        [],
    )
    return td, td.memmap(tmp_path / "saved")


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000, 4096, 1 << 20])
def test_stream_to_cpu_matches_and_is_one_allocation(tmp_path, chunk):
    src, mapped = _tree(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path / "saved")
    for tree in (mapped, loaded):
        out = _stream.stream_tree(tree, "cpu", chunk_bytes=chunk)
        assert out is not None
        storages = set()
        for key in ("big", "small", "scalar", "flags", ("nested", "a"), ("nested", "deeper", "c")):
            assert torch.equal(out[key], src[key]), (chunk, key)
            assert out[key].dtype == src[key].dtype and out[key].shape == src[key].shape
            storages.add(out[key].untyped_storage().data_ptr())
            assert out[key].data_ptr() % _stream.ALIGN == 0
        assert len(storages) == 1, "every leaf is a view of one allocation"
        assert out["empty"].shape == (0, 4)
        assert out["note"] == "kept"
        # the copy is independent of the files
        out["big"].zero_()
        assert torch.equal(TensorDict.load_memmap(tmp_path / "saved")["big"], src["big"])


def test_stream_refuses_what_cannot_stream(tmp_path):
    td = TensorDict({"t": torch.rand(4, 4).t()}, [])  # not contiguous
    assert _stream.stream_tree(td, "cpu") is None
    with pytest.raises(ValueError):
        _stream.stream_tree(TensorDict({"x": torch.zeros(2)}, []), "cpu", chunk_bytes=0)


def test_stream_of_an_empty_tree():
    out = _stream.stream_tree(TensorDict({"e": torch.empty(0)}, []), "cpu", chunk_bytes=8)
    assert out is not None and out["e"].numel() == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_stream_to_cuda(tmp_path):
    src, mapped = _tree(tmp_path)
    for out in (
        TensorDict.load_memmap(tmp_path / "saved", device="cuda"),
        mapped.to("cuda", non_blocking=True),
    ):
        assert out["big"].is_cuda
        assert out["big"].untyped_storage().data_ptr() == out["small"].untyped_storage().data_ptr()
        assert torch.equal(out["nested", "a"].cpu(), src["nested", "a"])
        assert torch.equal(out["big"].cpu(), src["big"])
