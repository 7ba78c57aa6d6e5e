"""A program that uses the public API, type-checked with ``mypy --strict`` by ``make lint``.

It is also run by ``tests/core/test_typing.py``, so every line here must work, not only
type-check.
``assert_type`` fails the type check when a public signature's type changes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, assert_type

import tensordict_rs
import torch
import torch.distributed as dist
from tensordict_rs import (
    FileExistsRuntimeError,
    InvalidDirectoryError,
    InvalidTreeError,
    LockedError,
    MemoryMappedTensor,
    NonTensorData,
    SymlinkError,
    TensorDict,
    TensorDictError,
    TensorDictFuture,
    UnsupportedFormatError,
    is_memmap_archive,
    pack_memmap,
    refresh_archive_checksums,
    unpack_memmap,
    verify,
)
from tensordict_rs.cli import main as cli_main


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
    assert_type(td.apply(lambda t: t * 2), TensorDict | None)  # None: every result None
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


def ops(td: TensorDict) -> None:
    """The element-wise, key and shape methods."""
    assert_type(td.exclude("label") + 1, TensorDict)
    assert_type(td.exclude("label") * td.exclude("label"), TensorDict)
    num = td.exclude("label")
    assert_type(-num, TensorDict)
    assert_type(2 - num, TensorDict)
    assert_type(num.exp(), TensorDict)
    assert_type(num.clone().mul_(2), TensorDict)
    assert_type(td.exclude("label").float(), TensorDict)
    assert_type(td.abs(), TensorDict)
    assert_type(td.clamp_min(0.0), TensorDict)
    assert_type(td.masked_fill(torch.zeros(8, dtype=torch.bool), 0.0), TensorDict)
    assert_type(td.select("obs"), TensorDict)
    assert_type(td.exclude("label"), TensorDict)
    assert_type(td.flatten_keys("."), TensorDict)
    assert_type(td.update({"extra": torch.zeros(8)}), TensorDict)
    assert_type(td.named_apply(lambda key, t: t), TensorDict | None)
    assert isinstance(td.to_dict(), dict)
    assert_type(td.is_shared(), bool)
    assert_type(td.clone().share_memory_(), TensorDict)
    assert_type(td.clone().zero_(), TensorDict)
    assert_type(td.select("obs").view(2, 4), TensorDict)


def persist(td: TensorDict, root: Path) -> None:
    saved = td.memmap(root / "a", num_threads=2, durable=True, progress=False)
    assert_type(saved, TensorDict)
    assert_type(saved.is_memmap(), bool)
    assert_type(saved.saved_path, Path | None)
    maybe = td.memmap_like(root / "b", return_early=True, num_threads=2)
    assert_type(maybe, TensorDict | TensorDictFuture[TensorDict])
    done = maybe.result() if isinstance(maybe, TensorDictFuture) else maybe
    assert_type(done, TensorDict)
    assert done.is_memmap()
    loaded = TensorDict.load_memmap(root / "a", progress=False)
    assert_type(loaded, TensorDict)
    assert_type(TensorDict.load(root / "a", device="cpu"), TensorDict)
    assert_type(td.save(root / "c"), TensorDict)
    assert_type(td.clone().memmap_(root / "d"), TensorDict)
    assert_type(verify(root / "a"), list[str])
    assert_type(tensordict_rs.verify(str(root / "a")), list[str])
    loaded.flush()
    td.to_safetensors(root / "a.safetensors", metadata={"format": "pt"})
    back = TensorDict.from_safetensors(root / "a.safetensors", separator=".")
    assert_type(back, TensorDict)


def archives(td: TensorDict, root: Path) -> None:
    """``.tdz`` archives: saved by suffix, packed, unpacked, checked."""
    td.memmap(root / "t.tdz", compression="deflate")
    assert_type(is_memmap_archive(root / "t.tdz"), bool)
    packed = pack_memmap(root / "a", root / "p.tdz")
    assert_type(packed, Path)
    assert_type(unpack_memmap(packed, root / "u"), Path)
    assert_type(refresh_archive_checksums(packed), Path)
    shared = TensorDict.load_memmap(packed, mode="r+")
    assert (shared == TensorDict.load_memmap(root / "u")).all()
    assert_type(cli_main(["verify", "--json", os.fspath(packed)]), int)


def distributed(td: TensorDict, root: Path) -> None:
    """The torch.distributed methods, on a one-process gloo group."""
    dist.init_process_group("gloo", init_method=f"file://{root / 'store'}", rank=0, world_size=1)
    try:
        x = td.select("obs").clone()
        assert_type(x.broadcast(0), TensorDict)
        assert_type(x.all_reduce(), list[Any] | None)
        assert_type(x.all_gather(), list[Any])
        rows = TensorDict({"obs": torch.zeros(0, 3)}, [0])  # a row per other rank: none
        assert_type(rows.gather_and_stack(0), TensorDict | None)
        assert_type(x.scatter(0, [x]), TensorDict)
    finally:
        dist.destroy_process_group()


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
        LockedError,
        SymlinkError,
    ]
    assert all(issubclass(e, TensorDictError) for e in out)
    # the OSError of an existing target, a RuntimeError too where tensordict raises one
    assert issubclass(FileExistsRuntimeError, FileExistsError)
    assert issubclass(FileExistsRuntimeError, RuntimeError)
    out.append(FileExistsRuntimeError)
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        td = build()
        ops(td)
        persist(td, root)
        archives(td, root)
        distributed(td, root)
        tensors(root)
        errors()
    print("ok")


if __name__ == "__main__":
    main()
