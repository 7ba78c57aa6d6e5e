"""The code paths of tensordict's tutorials "Simplifying PyTorch Memory Management",
"Pre-allocating memory with TensorDict" and "Using TensorDict for datasets", written anew and
run with both packages side by side (same seeds, same prints, same values)."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest
import tensordict as ref
import tensordict.tensordict as ref_tensordict_module
import tensordict_rs as rs
import tensordict_rs.tensordict as rs_tensordict_module
import torch
from torch import nn

PACKAGES = [(rs, rs_tensordict_module), (ref, ref_tensordict_module)]


def printed(fn: Any, *args: Any) -> tuple[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = fn(*args)
    return out.getvalue(), result


def memory_tutorial(pkg: Any) -> list[Any]:
    torch.manual_seed(0)
    td = pkg.TensorDict({"a": torch.rand(10), "b": {"c": torch.rand(10)}}, [10])
    td.memmap_()
    print(td)
    td = pkg.TensorDict({"a": torch.rand(10), "b": {"c": torch.rand(10)}}, [10])
    like = td.memmap_like()
    print(like["a"].contiguous())
    return [td.is_memmap(), like.is_memmap(), like.is_locked, type(like["a"]).__name__]


def test_memory_tutorial() -> None:
    (out_rs, res_rs), (out_ref, res_ref) = (printed(memory_tutorial, p) for p, _ in PACKAGES)
    assert out_rs == out_ref
    assert res_rs == res_ref


def preallocation_tutorial(module: Any) -> list[Any]:
    torch.manual_seed(0)

    def make() -> Any:
        return module.TensorDict({"a": torch.rand(3), "b": torch.rand(3, 4)}, [3])

    n = 10
    td = module.TensorDict({}, batch_size=[n, 3])
    for i in range(n):
        td[i] = make()
    print(td)
    td = module.TensorDict({}, batch_size=[n, 3])
    print(td)
    step = make()
    td[0] = step
    assert (td[1:] == 0).all()
    assert (td[0] == step).all()
    print(td)
    a = td["a"]
    td[1] = make()
    assert td["a"] is a
    assert (td[:2] != 0).all()
    return [td["a"].clone(), td["b"].clone()]


def test_preallocation_tutorial() -> None:
    (out_rs, res_rs), (out_ref, res_ref) = (printed(preallocation_tutorial, m) for _, m in PACKAGES)
    assert out_rs == out_ref
    for mine, theirs in zip(res_rs, res_ref, strict=True):
        assert torch.equal(mine, theirs)


class SyntheticFashion(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """FashionMNIST's shapes and dtypes (1x28x28 float images, int labels), learnable."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, 10, (n,), generator=g)
        self.images = torch.rand(n, 1, 28, 28, generator=g) * 0.5
        for i, t in enumerate(self.targets.tolist()):
            self.images[i, 0, :, 2 * t : 2 * t + 3] += 0.5

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], int(self.targets[i])


def dataset_tutorial(pkg: Any, data: SyntheticFashion, batch_size: int) -> list[float]:
    """Fill a memory-mapped TensorDict row by row, then train on its batches."""
    td = pkg.TensorDict(
        {
            "images": pkg.MemoryMappedTensor.empty(
                (len(data), *data[0][0].squeeze().shape), dtype=torch.float32
            ),
            "targets": pkg.MemoryMappedTensor.empty((len(data),), dtype=torch.int64),
        },
        batch_size=[len(data)],
        device="cpu",
    )
    for i, (img, label) in enumerate(data):
        td[i] = pkg.TensorDict({"images": img, "targets": label}, [])
    assert torch.equal(td["images"], data.images.squeeze(1))
    assert torch.equal(td["targets"], data.targets)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for start in range(0, len(td), batch_size):
        batch = td[start : start + batch_size]
        x, y = batch["images"].contiguous(), batch["targets"].contiguous()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_dataset_tutorial() -> None:
    data = SyntheticFashion(512, seed=0)
    ours = dataset_tutorial(rs, data, 64)
    theirs = dataset_tutorial(ref, data, 64)
    assert ours == theirs
    assert ours[-1] < ours[0]  # it learns
