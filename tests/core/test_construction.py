"""Constructing a TensorDict: sources, batch sizes, devices."""

from __future__ import annotations

import pytest
import torch
from tensordict_rs import TensorDict

from .._trees import CPU, META, locked_error, make_td

# --------------------------------------------------------------------------------- constructor


def test_constructor_nested_dicts_become_tensordicts() -> None:
    td = make_td()
    assert td.batch_size == torch.Size([4, 3])
    assert td.device is None
    assert isinstance(td["n"], TensorDict)
    assert td["n"].batch_size == torch.Size([4, 3])
    assert td["n", "deep"].batch_size == torch.Size([4, 3, 5])
    assert torch.equal(td["n", "x"], torch.arange(12).reshape(4, 3))
    assert td["s"] == "text"
    assert td.shape == td.batch_size
    assert td.batch_dims == 2 and td.ndim == 2
    assert td.numel() == 12


@pytest.mark.parametrize("batch_size", [[3], (3,), torch.Size([3])])
def test_constructor_batch_size_forms(batch_size) -> None:
    td = TensorDict({"a": torch.zeros(3, 2)}, batch_size)
    assert td.batch_size == torch.Size([3])
    assert isinstance(td.batch_size, torch.Size)


def test_constructor_defaults() -> None:
    td = TensorDict({"a": torch.zeros(3, 2)})
    assert td.batch_size == torch.Size([])
    assert td.device is None
    assert not td.is_locked
    empty = TensorDict()
    assert empty.keys() == [] and empty.batch_size == torch.Size([])
    assert TensorDict(batch_size=[5]).batch_size == torch.Size([5])


@pytest.mark.parametrize(
    ("source", "batch_size", "key"),
    [
        ({"a": torch.zeros(3, 4)}, [4], "a"),
        ({"a": torch.zeros(3)}, [3, 1], "a"),
        ({"a": torch.zeros(3)}, [2], "a"),
        ({"ok": torch.zeros(2), "bad": torch.zeros(3)}, [2], "bad"),
        ({"n": {"b": torch.zeros(3, 4)}}, [4], "b"),
        ({"n": TensorDict({"b": torch.zeros(5)}, [5])}, [4], "n"),
    ],
)
def test_constructor_batch_size_mismatch(source, batch_size, key) -> None:
    with pytest.raises(RuntimeError, match=rf"batch dimension mismatch.*{key}"):
        TensorDict(source, batch_size)


def test_constructor_python_scalars_and_strings() -> None:
    td = TensorDict({"f": 1.5, "i": 3, "b": True, "s": "hello"}, [])
    assert torch.equal(td["f"], torch.tensor(1.5))
    assert td["f"].dtype == torch.float32
    assert torch.equal(td["i"], torch.tensor(3))
    assert td["i"].dtype == torch.int64
    assert torch.equal(td["b"], torch.tensor(True))
    assert td["s"] == "hello"
    assert TensorDict({"s": "hello"}, [4])["s"] == "hello"


def test_constructor_device_moves_entries(accel_device: torch.device) -> None:
    a = torch.rand(3, 2)
    td = TensorDict({"a": a, "n": {"x": torch.zeros(3)}}, [3], device=accel_device)
    assert td.device == accel_device
    assert td["a"].device == accel_device
    assert td["n"].device == accel_device
    assert td["n", "x"].device == accel_device
    assert a.device == CPU
    # Later entries move too, nested dicts included.
    td["b"] = torch.zeros(3)
    td["m"] = {"y": torch.zeros(3, 1)}
    td.set(("n", "z"), torch.ones(3))
    for key in ("b", ("m", "y"), ("n", "z")):
        assert td[key].device == accel_device
    assert td["m"].device == accel_device


def test_constructor_device_moves_tensordict_values(accel_device: torch.device) -> None:
    sub = TensorDict({"x": torch.zeros(3)}, [3])
    td = TensorDict({"sub": sub}, [3], device=accel_device)
    assert td["sub"].device == accel_device
    assert td["sub", "x"].device == accel_device
    assert sub.device is None and sub["x"].device == CPU


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("cpu", torch.device("cpu")),
        ("cpu:0", torch.device("cpu:0")),
        (torch.device("cpu"), torch.device("cpu")),
        ("meta", torch.device("meta")),
    ],
)
def test_constructor_device_normalized(given, expected) -> None:
    td = TensorDict({"a": torch.zeros(2)}, [2], device=given)
    assert td.device == expected
    assert isinstance(td.device, torch.device)


def test_constructor_invalid_device() -> None:
    with pytest.raises(RuntimeError, match="device type at start of device string: foo"):
        TensorDict({"a": torch.zeros(2)}, [2], device="foo")


def test_no_device_allows_mixed_devices() -> None:
    td = TensorDict({"a": torch.zeros(2), "m": torch.empty(2, device="meta")}, [2])
    assert td.device is None
    assert td["a"].device == CPU and td["m"].device == META
    td["c"] = torch.zeros(2)
    assert td.device is None


def test_constructor_lock_and_non_blocking() -> None:
    td = TensorDict({"a": torch.zeros(2)}, [2], lock=True, non_blocking=True)
    assert td.is_locked
    with locked_error():
        td["b"] = torch.zeros(2)


def test_device_is_read_only() -> None:
    td = TensorDict({"a": torch.zeros(2)}, [2], device="cpu")
    with pytest.raises(RuntimeError, match=r"^device cannot be set using tensordict\.device = "):
        td.device = "meta"
    assert td.device == CPU
    assert td["a"].device == CPU
    with pytest.raises(RuntimeError, match=r"use tensordict\.to"):
        TensorDict({}, []).device = None


def test_is_cpu_is_cuda(accel_device: torch.device) -> None:
    assert TensorDict({}, [], device="cpu").is_cpu
    assert not TensorDict({}, []).is_cpu
    on_accel = TensorDict({}, [], device=accel_device)
    assert on_accel.is_cuda == (accel_device.type == "cuda")
    assert not on_accel.is_cpu
