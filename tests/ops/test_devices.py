"""to, cpu, cuda, clear_device_."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict_rs import MemoryMappedTensor, TensorDict

from .._trees import CPU, SOURCE_A, locked_error, make_td

# --------------------------------------------------------------------------------- to / cpu / cuda


def test_to_same_device_returns_self() -> None:
    td = make_td(device="cpu")
    assert td.to("cpu") is td
    assert td.to(torch.device("cpu")) is td
    assert td.to(device="cpu") is td
    assert td.cpu() is td


def test_to_device(accel_device: torch.device) -> None:
    td = make_td(device="cpu")
    out = td.to(accel_device)
    assert out is not td
    assert out.device == accel_device
    for key in out.keys(include_nested=True, leaves_only=True):
        if key != "s":
            assert out[key].device == accel_device
            assert out[key].shape == td[key].shape and out[key].dtype == td[key].dtype
    assert out["n"].device == accel_device and out["n", "deep"].device == accel_device
    assert out["s"] == "text"
    assert td.device == CPU and td["a"].device == CPU  # unchanged
    assert out.to(accel_device) is out
    assert td.to(str(accel_device)).device == accel_device
    # A TensorDict without device gets one.
    no_device = make_td()
    assert no_device.to("cpu") is not no_device
    assert no_device.to("cpu").device == CPU
    assert no_device.device is None


def test_to_dtype() -> None:
    td = make_td(device="cpu")
    out = td.to(torch.float64)
    assert out is not td
    assert out.device == CPU
    assert out["a"].dtype == torch.float64 and out["n", "x"].dtype == torch.float64
    assert torch.equal(out["n", "x"], torch.arange(12.0, dtype=torch.float64).reshape(4, 3))
    assert td["n", "x"].dtype == torch.int64
    ints = td.to(torch.int32)
    assert ints["a"].dtype == torch.int32
    assert torch.equal(ints["a"], SOURCE_A.to(torch.int32))
    assert td.to(dtype=torch.float16)["a"].dtype == torch.float16


def test_to_device_and_dtype(accel_device: torch.device) -> None:
    td = make_td(device="cpu")
    out = td.to(accel_device, torch.float64)
    assert out.device == accel_device
    assert out["a"].device == accel_device and out["a"].dtype == torch.float64
    out = td.to("cpu", torch.int32)
    assert out is not td and out.device == CPU and out["a"].dtype == torch.int32
    out = td.to(device="cpu:1", dtype=torch.float64)
    assert out.device == torch.device("cpu:1")
    assert td.to("cpu:1").device == torch.device("cpu:1")


def test_to_tensor(accel_device: torch.device) -> None:
    td = make_td(device="cpu")
    out = td.to(torch.zeros(1, dtype=torch.int16, device=accel_device))
    assert out.device == accel_device
    assert out["a"].dtype == torch.int16 and out["n", "x"].dtype == torch.int16
    assert out["a"].device == accel_device


def test_to_other(accel_device: torch.device) -> None:
    td = make_td(device="cpu")
    single = TensorDict({"z": torch.zeros(2, dtype=torch.float64)}, [2], device=accel_device)
    out = td.to(other=single)
    assert out.device == accel_device
    assert out["a"].dtype == torch.float64 and out["n", "x"].dtype == torch.float64
    mixed = TensorDict(
        {"z": torch.zeros(2), "i": torch.zeros(2, dtype=torch.int64)}, [2], device=accel_device
    )
    out = td.to(other=mixed)
    assert out.device == accel_device
    assert out["a"].dtype == torch.float32 and out["n", "x"].dtype == torch.int64
    assert td.to(mixed).device is None  # positional: per-leaf attrs, as tensordict
    with pytest.raises(ValueError, match="other and device cannot be both passed"):
        td.to(other=mixed, device="cpu")


def test_to_batch_size() -> None:
    td = TensorDict({"a": torch.zeros(3, 4), "b": torch.zeros(3, 4, 2)}, [3])
    assert td.to(batch_size=[3, 4]) is td
    assert td.batch_size == torch.Size([3, 4])
    assert td[0].batch_size == torch.Size([4])
    nested = TensorDict({"a": torch.zeros(3, 4), "n": {"b": torch.zeros(3, 4, 2)}}, [3])
    assert nested.to(batch_size=[]) is nested
    assert nested.batch_size == torch.Size([])
    assert nested["n"].batch_size == torch.Size([3])
    with pytest.raises(RuntimeError):
        td.to(batch_size=[5])
    assert td.batch_size == torch.Size([3, 4])


def test_to_errors() -> None:
    td = make_td()
    with pytest.raises(TypeError):
        td.to()
    with pytest.raises(RuntimeError):
        td.to("foo")


def test_to_locked_and_memmap(tmp_prefix: Path, accel_device: torch.device) -> None:
    td = make_td().memmap_(tmp_prefix)
    out = td.to(accel_device)
    assert out.is_locked
    assert not out.is_memmap()
    assert out["a"].device == accel_device
    assert not isinstance(out["a"], MemoryMappedTensor)
    cast = td.to(torch.float64)
    assert cast.is_locked and not cast.is_memmap()
    assert type(cast["a"]) is torch.Tensor
    assert torch.equal(cast["a"], SOURCE_A.double())
    assert td.is_memmap() and td.to("cpu") is td


def test_to_inplace(accel_device: torch.device) -> None:
    td = make_td(device="cpu")
    n = td["n"]
    assert td.to(accel_device, inplace=True) is td
    assert td.device == accel_device
    assert td["n"] is n and n.device == accel_device
    assert td["a"].device == accel_device and td["n", "deep", "y"].device == accel_device
    locked = make_td(device="cpu").lock_()
    with locked_error():
        locked.to(torch.float64, inplace=True)
    assert locked.to("cpu", inplace=True) is locked


def test_cpu(accel_device: torch.device) -> None:
    td = make_td(device="cpu")
    assert td.cpu() is td
    if accel_device.type == "cuda":
        on_accel = td.to(accel_device)
        back = on_accel.cpu()
        assert back.device == CPU and torch.equal(back["a"], SOURCE_A)
    else:
        with pytest.raises(NotImplementedError):
            td.to(accel_device).cpu()
    assert make_td().cpu().device == CPU


def test_cuda() -> None:
    td = make_td()
    if torch.cuda.is_available():
        for out in (td.cuda(), td.cuda(0), td.cuda("cuda:0")):
            assert out.device == torch.device("cuda:0")
            assert out["a"].device == torch.device("cuda:0")
            assert torch.equal(out["a"].cpu(), SOURCE_A)
        assert td.to("cuda").device == torch.device("cuda:0")
        on_cuda = td.cuda()
        assert on_cuda.cuda() is on_cuda
        assert on_cuda.cpu().device == CPU
    else:
        with pytest.raises(Exception) as torch_error:
            torch.zeros(1).cuda()
        with pytest.raises(type(torch_error.value)) as error:
            td.cuda()
        assert str(error.value) == str(torch_error.value)
        with pytest.raises(type(torch_error.value)):
            td.to("cuda")


def test_clear_device_(accel_device: torch.device) -> None:
    td = make_td(device=accel_device)
    a = td["a"]
    assert td.clear_device_() is td
    assert td.device is None
    assert td["n"].device is None and td["n", "deep"].device is None
    assert td["a"] is a and a.device == accel_device  # no data moved
    td["c"] = torch.zeros(4, 3)
    assert td["c"].device == CPU
    td["n", "c"] = torch.zeros(4, 3)
    assert td["n", "c"].device == CPU


@pytest.mark.parametrize("lock", [False, True])
def test_to_positional_tensordict_is_per_leaf_attrs_as_tensordict(lock: bool) -> None:
    # A positional tensordict is tensordict's per-leaf attrs tree: plain leaves set nothing,
    # so no leaf is cast (other= casts to the single dtype of other's leaves).
    import tensordict as ref
    import tensordict_rs as ours

    results = []
    for lib in (ref, ours):
        data = {"f": torch.ones(2), "n": {"b": torch.tensor([True, False]), "i": torch.arange(2)}}
        td = lib.TensorDict(data, [2], device="cpu")
        if lock:
            td.lock_()
        other = lib.TensorDict({"x": torch.zeros(1, dtype=torch.float64)}, [])
        out = td.to(other)
        kw = td.to(other=other)
        results.append(
            (
                out is td,
                out.device,
                out.is_locked,
                out["f"] is td["f"],
                {k: (v.dtype, v.tolist()) for k, v in out.items(True, True)},
                {k: v.dtype for k, v in kw.items(True, True)},
            )
        )
        with pytest.raises(TypeError):
            td.to(other, torch.float64)
    assert results[0] == results[1]
    assert results[1][4]["f"][0] == torch.float32
