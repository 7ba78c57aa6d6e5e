"""A program that uses the public API, type-checked with ``mypy --strict`` by ``make lint``.

It is also run by ``tests/test_typing.py``, so every line here must work, not only type-check.
``assert_type`` fails the type check when a public signature's type changes.
"""

from __future__ import annotations

import concurrent.futures
import tempfile
from pathlib import Path
from typing import assert_type

import tensordict_rs
import torch
from tensordict_rs import (
    InvalidDirectoryError,
    InvalidTreeError,
    MemoryMappedTensor,
    NonTensorData,
    TensorDict,
    TensorDictError,
    UnsupportedFormatError,
    verify,
)


def build() -> TensorDict:
    td = TensorDict({"obs": torch.rand(8, 3), "next": {"done": torch.zeros(8, 1)}}, [8])
    td.set(("next", "reward"), torch.ones(8, 1))
    td["label"] = "run-1"
    assert_type(td.batch_size, torch.Size)
    assert_type(td.batch_dims, int)
    assert_type(td.device, torch.device | None)
    assert_type(td.numel(), int)
    assert_type(td.is_locked, bool)
    assert_type(td.clone(), TensorDict)
    assert_type(td.to("cpu"), TensorDict)
    assert_type(td.cpu(), TensorDict)
    assert_type(td.apply(lambda t: t * 2), TensorDict)
    assert_type(td.index_select(0, torch.arange(4)), TensorDict)
    assert_type(td.reshape(2, 4), TensorDict)
    assert_type(td.unsqueeze(0), TensorDict)
    assert_type(td.split(4), tuple[TensorDict, ...])
    assert_type(td.unbind(0), tuple[TensorDict, ...])
    assert_type((td == td).all(), bool)
    assert_type(td.lock_(), TensorDict)
    assert_type(td.unlock_(), TensorDict)
    keys = td.keys(include_nested=True, leaves_only=True)
    assert_type(keys, list[str | tuple[str, ...]])
    assert isinstance(NonTensorData("x").data, str)
    return td


def persist(td: TensorDict, root: Path) -> None:
    saved = td.memmap(root / "a", num_threads=2, durable=True, progress=False)
    assert_type(saved, TensorDict)
    assert_type(saved.is_memmap(), bool)
    assert_type(saved.saved_path, Path | None)
    future = td.memmap_like(root / "b", return_early=True)
    assert_type(future, concurrent.futures.Future[TensorDict])
    assert future.result().is_memmap()
    loaded = TensorDict.load_memmap(root / "a")
    assert_type(loaded, TensorDict)
    assert_type(TensorDict.load(root / "a", device="cpu"), TensorDict)
    assert_type(verify(root / "a"), list[str])
    assert_type(tensordict_rs.verify(str(root / "a")), list[str])
    loaded.flush()
    td.to_safetensors(root / "a.safetensors", metadata={"format": "pt"})
    back = TensorDict.from_safetensors(root / "a.safetensors", separator=".")
    assert_type(back, TensorDict)


def tensors(root: Path) -> None:
    t = MemoryMappedTensor.from_tensor(torch.arange(6.0), filename=root / "t.memmap")
    assert_type(t, MemoryMappedTensor)
    assert_type(t.filename, str)
    z = MemoryMappedTensor.zeros(2, 3, dtype=torch.int64)
    assert_type(z, MemoryMappedTensor)
    again = MemoryMappedTensor.from_filename(root / "t.memmap", dtype=torch.float32, shape=[6])
    assert_type(again, MemoryMappedTensor)
    assert torch.equal(again, t)


def errors() -> list[type[Exception]]:
    out: list[type[Exception]] = [
        TensorDictError,
        InvalidDirectoryError,
        InvalidTreeError,
        UnsupportedFormatError,
    ]
    assert all(issubclass(e, TensorDictError) for e in out)
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        persist(build(), root)
        tensors(root)
        errors()
    print("ok")


if __name__ == "__main__":
    main()
