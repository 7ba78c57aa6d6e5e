"""Every example and printed line of the tutorial "Devices and memory-mapped tensors".

The CUDA section runs on ``cuda:0`` when CUDA is available and on ``meta`` otherwise (the
``accel_device`` fixture); the printed lines are the tutorial's with the device name put in.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from tensordict_rs import MemoryMappedTensor, TensorDict


def printed(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The lines printed since the last call."""
    return capsys.readouterr().out.splitlines()


# --------------------------------------------------------------------------------- Devices


def test_devices(accel_device: torch.device, capsys: pytest.CaptureFixture[str]) -> None:
    dev = str(accel_device)
    cpu = torch.device("cpu")

    # The device keyword moves every entry; the repr shows the device once.
    a = torch.rand(10)
    tensordict = TensorDict({"a": a}, [10], device=dev)
    print(tensordict)
    assert printed(capsys) == [f"TensorDict(batch_size=[10], device={dev}, fields={{a: f32[]}})"]
    assert tensordict["a"].device == accel_device
    assert tensordict["a"].shape == (10,)
    assert a.device == cpu  # the source is not changed

    # New entries are moved to the device too.
    tensordict["b"] = torch.rand(10, 10)
    print(tensordict)
    assert printed(capsys) == [
        f"TensorDict(batch_size=[10], device={dev}, fields={{a: f32[], b: f32[10]}})"
    ]
    assert tensordict["b"].device == accel_device
    assert tensordict["b"].shape == (10, 10)

    print(tensordict.device)
    assert printed(capsys) == [dev]
    assert tensordict.device == accel_device

    # to(cpu) returns a new TensorDict and leaves the original alone.
    original = tensordict
    if accel_device.type == "meta":
        with pytest.raises(NotImplementedError):
            tensordict.to(torch.device("cpu"))
        tensordict = TensorDict({"a": torch.rand(10), "b": torch.rand(10, 10)}, [10], device="cpu")
    else:
        tensordict = tensordict.to(torch.device("cpu"))
        assert tensordict is not original
        assert torch.equal(tensordict["a"], original["a"].cpu())
        assert torch.equal(tensordict["b"], original["b"].cpu())
    assert original.device == accel_device
    assert original["a"].device == accel_device
    print(tensordict)
    assert printed(capsys) == [
        "TensorDict(batch_size=[10], device=cpu, fields={a: f32[], b: f32[10]})"
    ]
    assert tensordict["a"].device == cpu and tensordict["b"].device == cpu

    # cuda() (on meta: to(meta)) returns a new TensorDict on the device.
    on_cpu = tensordict
    values = {k: on_cpu[k].clone() for k in ("a", "b")}
    tensordict = tensordict.cuda() if accel_device.type == "cuda" else tensordict.to(dev)
    assert tensordict is not on_cpu
    print(tensordict)
    assert printed(capsys) == [
        f"TensorDict(batch_size=[10], device={dev}, fields={{a: f32[], b: f32[10]}})"
    ]
    assert tensordict.device == accel_device
    assert tensordict["a"].device == accel_device and tensordict["b"].device == accel_device
    assert on_cpu.device == cpu and on_cpu["a"].device == cpu
    if accel_device.type == "cuda":
        assert torch.equal(tensordict["a"].cpu(), values["a"])
        assert torch.equal(tensordict["b"].cpu(), values["b"])

    # clear_device_ removes the device in place; the entries stay where they are.
    same = tensordict
    tensordict = tensordict.clear_device_()
    assert tensordict is same
    print(tensordict)
    assert printed(capsys) == [
        f"TensorDict(batch_size=[10], fields={{a: f32[]@{dev}, b: f32[10]@{dev}}})"
    ]
    assert tensordict.device is None
    assert tensordict["a"].device == accel_device and tensordict["b"].device == accel_device

    # Without a device, entries on different devices can live side by side.
    tensordict["c"] = torch.zeros(10)
    assert tensordict["c"].device == cpu
    print(tensordict)
    assert printed(capsys) == [
        f"TensorDict(batch_size=[10], fields={{a: f32[]@{dev}, b: f32[10]@{dev}, c: f32[]}})"
    ]


# --------------------------------------------------------------------------------- memmap_


def test_memmap_(capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    tensordict = TensorDict({"a": torch.rand(10), "b": {"c": torch.rand(10)}}, [10])
    a, c = tensordict["a"].clone(), tensordict["b", "c"].clone()
    assert tensordict.memmap_() is tensordict

    print(tensordict)
    assert tensordict.is_locked
    assert printed(capsys) == [
        "TensorDict(batch_size=[10], device=cpu, fields={a: f32[], b: {c: f32[]}})"
    ]

    # The values were copied into memory maps.
    assert isinstance(tensordict["a"], MemoryMappedTensor)
    assert isinstance(tensordict["b", "c"], MemoryMappedTensor)
    assert torch.equal(tensordict["a"], a)
    assert torch.equal(tensordict["b", "c"], c)
    assert tensordict.is_memmap()
    assert tensordict["b"].is_locked

    # You can write into its tensors...
    tensordict["a"][0] = 42.0
    assert tensordict["a"][0].item() == 42.0
    tensordict["b", "c"].fill_(1.0)
    assert torch.equal(tensordict["b", "c"], torch.ones(10))
    # ...but you cannot add or remove keys.
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        tensordict["d"] = torch.zeros(10)
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        del tensordict["a"]
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        tensordict["b", "new"] = torch.zeros(10)
    assert tensordict.keys(include_nested=True) == ["a", ("b", "c"), "b"]


# --------------------------------------------------------------------------------- memmap_like


def test_memmap_like(capsys: pytest.CaptureFixture[str]) -> None:
    tensordict = TensorDict({"a": torch.rand(10), "b": {"c": torch.rand(10)}}, [10])
    a, c = tensordict["a"].clone(), tensordict["b", "c"].clone()
    mm_tensordict = tensordict.memmap_like()

    print(mm_tensordict["a"].contiguous())
    assert printed(capsys) == ["MemoryMappedTensor([0., 0., 0., 0., 0., 0., 0., 0., 0., 0.])"]

    # A new, locked TensorDict with the same keys and shapes; the source is unchanged.
    assert mm_tensordict is not tensordict
    assert mm_tensordict.is_locked
    assert mm_tensordict.is_memmap()
    assert not tensordict.is_locked and not tensordict.is_memmap()
    assert mm_tensordict.batch_size == torch.Size([10])
    assert mm_tensordict.keys(include_nested=True) == ["a", ("b", "c"), "b"]
    assert isinstance(mm_tensordict["b", "c"], MemoryMappedTensor)
    assert torch.equal(mm_tensordict["b", "c"], torch.zeros(10))
    assert mm_tensordict["a"].dtype == torch.float32
    assert torch.equal(tensordict["a"], a) and torch.equal(tensordict["b", "c"], c)

    # Writing into the buffer with an index.
    mm_tensordict[:5] = tensordict[:5]
    assert (mm_tensordict["a"][:5] == tensordict["a"][:5]).all()
    assert torch.equal(mm_tensordict["b", "c"][:5], c[:5])
    assert torch.equal(mm_tensordict["a"][5:], torch.zeros(5))
    assert torch.equal(mm_tensordict["b", "c"][5:], torch.zeros(5))

    # ...or with an in-place operation.
    mm_tensordict["a"][5:].copy_(a[5:])
    assert torch.equal(mm_tensordict["a"], a)


# ------------------------------------------------------------------------------- saving and loading


def test_save_and_load(capsys: pytest.CaptureFixture[str]) -> None:
    prefix = Path(tempfile.mkdtemp())
    try:
        tensordict = TensorDict({"a": torch.rand(10), "b": {"c": torch.rand(10)}}, [10])
        a, c = tensordict["a"].clone(), tensordict["b", "c"].clone()
        tensordict.memmap_(prefix=prefix)
        print(sorted(str(path.relative_to(prefix)) for path in prefix.rglob("*")))
        assert printed(capsys) == ["['a.memmap', 'b', 'b/c.memmap', 'b/meta.json', 'meta.json']"]

        # Each tensor is a raw file of its values; the metadata is in meta.json.
        assert (prefix / "a.memmap").read_bytes() == a.numpy().tobytes()
        assert (prefix / "b" / "c.memmap").read_bytes() == c.numpy().tobytes()
        meta = json.loads((prefix / "meta.json").read_text())
        assert meta["a"]["shape"] == [10] and meta["a"]["dtype"] == "torch.float32"
        assert meta["b"] == {"type": "TensorDict"}
        assert meta["shape"] == [10]
        assert tensordict.is_locked and tensordict.is_memmap()
        assert tensordict.saved_path == prefix
        assert tensordict["a"].filename == str(prefix / "a.memmap")

        loaded = TensorDict.load_memmap(prefix)
        print(loaded)
        assert (loaded == tensordict).all()
        assert printed(capsys) == [
            "TensorDict(batch_size=[10], device=cpu, fields={a: f32[], b: {c: f32[]}})"
        ]

        # The entries of the result read from the files.
        assert isinstance(loaded["a"], MemoryMappedTensor)
        assert isinstance(loaded["b", "c"], MemoryMappedTensor)
        assert loaded["a"].filename == str(prefix / "a.memmap")
        assert loaded["b", "c"].filename == str(prefix / "b" / "c.memmap")
        assert torch.equal(loaded["a"], a) and torch.equal(loaded["b", "c"], c)
        tensordict["a"][3] = -1.0
        assert loaded["a"][3].item() == -1.0
    finally:
        shutil.rmtree(prefix)


def test_load_in_another_process(run_python, tmp_prefix: Path) -> None:
    tensordict = TensorDict({"a": torch.rand(10), "b": {"c": torch.rand(10)}}, [10])
    tensordict.memmap_(prefix=tmp_prefix)
    tensordict.flush()
    expected_a, expected_c = tensordict["a"].tolist(), tensordict["b", "c"].tolist()
    child = run_python(
        """
        import sys
        from tensordict_rs import TensorDict, MemoryMappedTensor

        loaded = TensorDict.load_memmap(sys.argv[1])
        print(loaded)
        assert isinstance(loaded["a"], MemoryMappedTensor)
        print(loaded["a"].tolist())
        print(loaded["b", "c"].tolist())
        loaded["b", "c"][0] = 123.0
        loaded.flush()
        """,
        str(tmp_prefix),
    )
    lines = child.stdout.splitlines()
    assert lines == [
        "TensorDict(batch_size=[10], device=cpu, fields={a: f32[], b: {c: f32[]}})",
        str(expected_a),
        str(expected_c),
    ]
    # The child's write reached the file that this process maps.
    assert tensordict["b", "c"][0].item() == 123.0
