"""MemoryMappedTensor: constructors, attributes, views, pickling and sharing between processes."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import re
import shutil
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict_rs import MemoryMappedTensor, TensorDictError

DTYPES = [torch.float16, torch.float32, torch.float64, torch.int32, torch.uint8, torch.int64]


def file_values(path: Path | str, dtype: torch.dtype) -> torch.Tensor:
    """The raw contents of ``path`` read with plain file I/O (no memory map)."""
    return torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=dtype)


def assert_file_backed(t: torch.Tensor, filename: Path | str) -> None:
    assert isinstance(t, MemoryMappedTensor)
    assert t.filename == str(filename)
    assert os.path.isabs(t.filename)


# --------------------------------------------------------------------------------- from_tensor


@pytest.mark.parametrize("dtype", [*DTYPES, torch.bool, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2,), (1, 2), (3, 4, 5), ()])
def test_from_tensor_anonymous_keeps_dtype_shape_values(dtype, shape) -> None:
    source = (torch.arange(int(np.prod(shape))) % 3).reshape(shape).to(dtype)
    t = MemoryMappedTensor.from_tensor(source)
    assert isinstance(t, MemoryMappedTensor)
    assert t.dtype == dtype
    assert t.shape == torch.Size(shape)
    assert t.device == torch.device("cpu")
    assert torch.equal(t, source)
    assert torch.equal(t.contiguous(), source)
    assert torch.equal(t.clone(), source)
    assert t._filename is None
    with pytest.raises(RuntimeError, match="has no file associated"):
        _ = t.filename
    # A copy: writing into it does not change the source.
    t.zero_()
    assert torch.equal(source, (torch.arange(int(np.prod(shape))) % 3).reshape(shape).to(dtype))


def test_from_tensor_with_filename_writes_raw_bytes(tmp_path: Path) -> None:
    source = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    path = tmp_path / "x.memmap"
    t = MemoryMappedTensor.from_tensor(source, filename=path)
    assert_file_backed(t, path)
    assert t.is_shared()
    assert torch.equal(t, source)
    assert path.stat().st_size == 48
    assert torch.equal(file_values(path, torch.float32), source.flatten())
    # Writes reach the file.
    t[1, 2] = -5.0
    t.flush()
    assert file_values(path, torch.float32)[6].item() == -5.0


def test_from_tensor_relative_filename_becomes_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    t = MemoryMappedTensor.from_tensor(torch.ones(3), filename="rel.memmap")
    assert t.filename == str(tmp_path / "rel.memmap")


def test_from_tensor_existsok(tmp_path: Path) -> None:
    path = tmp_path / "x.memmap"
    MemoryMappedTensor.from_tensor(torch.zeros(3), filename=path)
    with pytest.raises(FileExistsError, match=r"x\.memmap"):
        MemoryMappedTensor.from_tensor(torch.ones(3), filename=path)
    assert torch.equal(file_values(path, torch.float32), torch.zeros(3))
    t = MemoryMappedTensor.from_tensor(torch.ones(3), filename=path, existsok=True)
    assert torch.equal(t, torch.ones(3))
    assert torch.equal(file_values(path, torch.float32), torch.ones(3))


def test_from_tensor_missing_parent_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nodir"):
        MemoryMappedTensor.from_tensor(torch.ones(3), filename=tmp_path / "nodir" / "x.memmap")


def test_from_tensor_of_memmap_same_place_returns_input(tmp_path: Path) -> None:
    anonymous = MemoryMappedTensor.from_tensor(torch.arange(4.0))
    assert MemoryMappedTensor.from_tensor(anonymous) is anonymous
    path = tmp_path / "x.memmap"
    backed = MemoryMappedTensor.from_tensor(torch.arange(4.0), filename=path)
    assert MemoryMappedTensor.from_tensor(backed, filename=path) is backed
    assert MemoryMappedTensor.from_tensor(backed, filename=str(path)) is backed


def test_from_tensor_copy_existing(tmp_path: Path) -> None:
    backed = MemoryMappedTensor.from_tensor(torch.arange(4.0), filename=tmp_path / "x.memmap")
    other = tmp_path / "y.memmap"
    with pytest.raises(RuntimeError, match="copy_existing=True"):
        MemoryMappedTensor.from_tensor(backed, filename=other)
    assert not other.exists()
    copy = MemoryMappedTensor.from_tensor(backed, filename=other, copy_existing=True)
    assert_file_backed(copy, other)
    assert torch.equal(copy, torch.arange(4.0))
    copy.fill_(7.0)
    assert torch.equal(backed, torch.arange(4.0))  # independent files
    # A file-backed input without filename is copied to new anonymous memory.
    anonymous = MemoryMappedTensor.from_tensor(backed)
    assert anonymous is not backed
    assert anonymous._filename is None
    assert torch.equal(anonymous, backed)
    anonymous.zero_()
    assert torch.equal(backed, torch.arange(4.0))


def test_from_tensor_copy_data_false(tmp_path: Path) -> None:
    source = torch.arange(1, 7, dtype=torch.int64).reshape(2, 3)
    t = MemoryMappedTensor.from_tensor(source, copy_data=False)
    assert t.shape == (2, 3) and t.dtype == torch.int64
    assert torch.equal(t, torch.zeros(2, 3, dtype=torch.int64))
    f = MemoryMappedTensor.from_tensor(source, filename=tmp_path / "z.memmap", copy_data=False)
    assert torch.equal(f, torch.zeros(2, 3, dtype=torch.int64))
    assert (tmp_path / "z.memmap").stat().st_size == 48


def test_from_tensor_copy_data_false_from_meta() -> None:
    t = MemoryMappedTensor.from_tensor(torch.empty(4, 2, device="meta"), copy_data=False)
    assert t.device == torch.device("cpu")
    assert torch.equal(t, torch.zeros(4, 2))


def test_from_tensor_shape_broadcasts() -> None:
    t = MemoryMappedTensor.from_tensor(torch.tensor([1.0, 2.0, 3.0]), shape=(2, 3))
    assert t.shape == (2, 3)
    assert torch.equal(t, torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]))
    assert t.is_contiguous()


def test_from_tensor_non_contiguous_input() -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    source = base.t()[:3]
    assert not source.is_contiguous()
    t = MemoryMappedTensor.from_tensor(source)
    assert t.stride() == (3, 1)
    assert torch.equal(t, source)


def test_from_tensor_expanded_input(tmp_path: Path) -> None:
    source = torch.tensor(7, dtype=torch.uint8).expand(5)
    t = MemoryMappedTensor.from_tensor(source, filename=tmp_path / "e.memmap")
    assert t.stride() == (1,)
    assert torch.equal(t, torch.full((5,), 7, dtype=torch.uint8))
    assert (tmp_path / "e.memmap").read_bytes() == bytes([7] * 5)
    t[0] = 1  # a real copy: the other elements keep their value
    assert t.tolist() == [1, 7, 7, 7, 7]


def test_from_tensor_offset_view() -> None:
    base = torch.arange(10.0)
    t = MemoryMappedTensor.from_tensor(base[3:7])
    assert torch.equal(t, torch.tensor([3.0, 4.0, 5.0, 6.0]))


def test_from_tensor_requires_grad_raises() -> None:
    with pytest.raises(RuntimeError, match=r"incompatible with tensor\.requires_grad"):
        MemoryMappedTensor.from_tensor(torch.zeros(3, requires_grad=True))


def test_from_tensor_numpy_raises() -> None:
    with pytest.raises(TypeError, match=r"Convert input to torch\.Tensor"):
        MemoryMappedTensor.from_tensor(np.zeros(3))


def test_from_tensor_empty(tmp_path: Path) -> None:
    t = MemoryMappedTensor.from_tensor(torch.zeros(0, 3), filename=tmp_path / "e.memmap")
    assert t.shape == (0, 3)
    assert not (tmp_path / "e.memmap").exists()


def test_constructor(tmp_path: Path) -> None:
    t = MemoryMappedTensor(torch.arange(3.0))
    assert isinstance(t, MemoryMappedTensor)
    assert torch.equal(t, torch.arange(3.0))
    with pytest.raises(ValueError, match="device must be cpu"):
        MemoryMappedTensor(torch.zeros(2), device="meta")
    path = tmp_path / "c.memmap"
    f = MemoryMappedTensor(torch.arange(3.0), filename=path)
    assert_file_backed(f, path)
    opened = MemoryMappedTensor(str(path), dtype=torch.float32, shape=(3,))
    assert torch.equal(opened, torch.arange(3.0))


# --------------------------------------------------------------------------------- from_filename


def test_from_filename(tmp_path: Path) -> None:
    path = tmp_path / "raw.bin"
    data = torch.arange(10, dtype=torch.int32)
    path.write_bytes(data.numpy().tobytes())
    t = MemoryMappedTensor.from_filename(path, dtype=torch.int32, shape=(2, 5))
    assert_file_backed(t, path)
    assert torch.equal(t, data.reshape(2, 5))
    # Shared with the file both ways.
    t[0, 0] = 100
    t.flush()
    assert file_values(path, torch.int32)[0].item() == 100
    with open(path, "r+b") as f:
        f.seek(4 * 9)
        f.write(np.int32(-9).tobytes())
    assert t[1, 4].item() == -9
    # A second map of the same file sees the same bytes.
    again = MemoryMappedTensor.from_filename(str(path), dtype=torch.int32, shape=[10])
    assert again[0].item() == 100
    # index= is applied after mapping.
    row = MemoryMappedTensor.from_filename(path, torch.int32, (2, 5), index=1)
    assert isinstance(row, MemoryMappedTensor)
    assert row.tolist() == [5, 6, 7, 8, -9]
    # A file longer than needed is fine: the extra bytes are ignored.
    head = MemoryMappedTensor.from_filename(path, torch.int32, (3,))
    assert head.tolist() == [100, 1, 2]
    # Another dtype reinterprets the bytes.
    as_bytes = MemoryMappedTensor.from_filename(path, torch.uint8, (8,))
    assert as_bytes.tolist() == list(np.array([100, 1], dtype=np.int32).tobytes())


def test_from_filename_creates_a_missing_file_and_refuses_a_short_one(tmp_path: Path) -> None:
    missing = tmp_path / "missing.memmap"
    made = MemoryMappedTensor.from_filename(missing, dtype=torch.float32, shape=(3,))
    assert missing.stat().st_size == 12 and made.tolist() == [0.0, 0.0, 0.0]
    assert made.filename == str(missing)
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "no" / "dir"))):
        MemoryMappedTensor.from_filename(
            tmp_path / "no" / "dir" / "x", dtype=torch.uint8, shape=(1,)
        )
    short = tmp_path / "short.memmap"
    short.write_bytes(bytes(8))
    with pytest.raises((OSError, TensorDictError), match=re.escape(str(short))):
        MemoryMappedTensor.from_filename(short, dtype=torch.float32, shape=(3,))
    assert short.stat().st_size == 8


def _read_only_scenario(path: str) -> None:
    t = MemoryMappedTensor.from_filename(path, dtype=torch.float32, shape=(4,))
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    t.fill_(9.0)  # copy-on-write: allowed, private to this map
    t.flush()
    assert t.tolist() == [9.0, 9.0, 9.0, 9.0]
    again = MemoryMappedTensor.from_filename(path, dtype=torch.float32, shape=(4,))
    assert again.tolist() == [0.0, 1.0, 2.0, 3.0]


def _read_only_child(path: str, uid: int) -> None:
    os.setgid(uid)
    os.setuid(uid)
    _read_only_scenario(path)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_from_filename_read_only_file_is_copy_on_write(tmp_path: Path) -> None:
    """chmod 444: the map is private; as root (where chmod does not stop writes) the check runs
    in a forked child that drops to the ``nobody`` user after the imports."""
    if os.geteuid() != 0:
        directory = tmp_path
    else:
        directory = Path(tempfile.mkdtemp())
        directory.chmod(0o755)
    try:
        path = directory / "ro.memmap"
        path.write_bytes(torch.arange(4, dtype=torch.float32).numpy().tobytes())
        path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        if os.geteuid() != 0:
            _read_only_scenario(str(path))
        else:
            ctx = multiprocessing.get_context("fork")
            proc = ctx.Process(target=_read_only_child, args=(str(path), 65534))
            proc.start()
            proc.join(30)
            if proc.exitcode != 0:
                # Could the child not drop root (no CAP_SETUID)? Then chmod cannot be tested.
                probe = ctx.Process(target=os.setuid, args=(65534,))
                probe.start()
                probe.join(30)
                if probe.exitcode != 0:
                    pytest.skip("running as root and cannot drop privileges: chmod has no effect")
            assert proc.exitcode == 0
        assert file_values(path, torch.float32).tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        if directory != tmp_path:
            shutil.rmtree(directory)


# ---------------------------------------------------------------------------- empty/zeros/ones/full


@pytest.mark.parametrize("dtype", [None, torch.float64, torch.int32])
@pytest.mark.parametrize("form", ["args", "tuple", "size", "kwarg"])
@pytest.mark.parametrize("from_path", [False, True])
def test_constructors(tmp_path: Path, dtype, form, from_path) -> None:
    shape = (3, 4)
    args, kwargs = {
        "args": ((3, 4), {}),
        "tuple": (((3, 4),), {}),
        "size": ((torch.Size([3, 4]),), {}),
        "kwarg": ((), {"shape": [3, 4]}),
    }[form]
    expected_dtype = dtype or torch.get_default_dtype()
    for name, fill in [("empty", 0), ("zeros", 0), ("ones", 1), ("full", 5)]:
        extra = {"fill_value": 5} if name == "full" else {}
        filename = tmp_path / f"{name}.memmap" if from_path else None
        t = getattr(MemoryMappedTensor, name)(
            *args, dtype=dtype, filename=filename, **kwargs, **extra
        )
        assert isinstance(t, MemoryMappedTensor)
        assert t.shape == torch.Size(shape)
        assert t.dtype == expected_dtype
        if name != "empty":
            assert torch.equal(t, torch.full(shape, fill, dtype=expected_dtype))
        if from_path:
            assert_file_backed(t, filename)
            assert filename.stat().st_size == 12 * t.element_size()
            assert torch.equal(file_values(filename, expected_dtype), t.flatten())
        else:
            assert t._filename is None


def test_constructors_errors(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="Could not find the shape"):
        MemoryMappedTensor.zeros()
    with pytest.raises(TypeError):
        MemoryMappedTensor.full((2,), 7)
    for device in ("meta", "cuda"):
        with pytest.raises(RuntimeError, match="Only CPU tensors are supported"):
            MemoryMappedTensor.zeros(3, device=device)
    assert torch.equal(MemoryMappedTensor.ones(2, device="cpu"), torch.ones(2))
    path = tmp_path / "z.memmap"
    MemoryMappedTensor.zeros(3, filename=path)
    with pytest.raises(FileExistsError):
        MemoryMappedTensor.ones(3, filename=path)
    t = MemoryMappedTensor.ones(3, filename=path, existsok=True)
    assert torch.equal(file_values(path, torch.float32), torch.ones(3))
    assert torch.equal(t, torch.ones(3))


def test_scalar_shape() -> None:
    t = MemoryMappedTensor.full((), fill_value=2.5)
    assert t.shape == () and t.item() == 2.5


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_like_constructors(tmp_path: Path, device: str) -> None:
    source = torch.empty(2, 3, dtype=torch.int16, device=device)
    for name, args, fill in [
        ("empty_like", (), 0),
        ("zeros_like", (), 0),
        ("ones_like", (), 1),
        ("full_like", (-3,), -3),
    ]:
        t = getattr(MemoryMappedTensor, name)(source, *args)
        assert isinstance(t, MemoryMappedTensor)
        assert t.device == torch.device("cpu")
        assert t.shape == (2, 3) and t.dtype == torch.int16
        if name != "empty_like":
            assert torch.equal(t, torch.full((2, 3), fill, dtype=torch.int16))
        path = tmp_path / f"{name}-{device}.memmap"
        f = getattr(MemoryMappedTensor, name)(source, *args, filename=path)
        assert_file_backed(f, path)
        if name != "empty_like":
            assert torch.equal(file_values(path, torch.int16).reshape(2, 3), f)
        with pytest.raises(FileExistsError):
            getattr(MemoryMappedTensor, name)(source, *args, filename=path)


# --------------------------------------------------------------------------------- views and ops


@pytest.fixture(params=["anonymous", "file"])
def mmt(request, tmp_path: Path) -> MemoryMappedTensor:
    source = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    if request.param == "anonymous":
        return MemoryMappedTensor.from_tensor(source)
    return MemoryMappedTensor.from_tensor(source, filename=tmp_path / "v.memmap")


def _same_map(view: torch.Tensor, parent: MemoryMappedTensor) -> None:
    assert isinstance(view, MemoryMappedTensor)
    assert view._filename == parent._filename
    assert view._buffer is parent._buffer


@pytest.mark.parametrize(
    "index",
    [0, -1, slice(1, 3), (1, 2), (slice(None), 2), Ellipsis, (Ellipsis, 1), None, (0, None)],
    ids=str,
)
def test_basic_indexing_keeps_class(mmt: MemoryMappedTensor, index) -> None:
    plain = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = mmt[index]
    _same_map(view, mmt)
    assert torch.equal(view, plain[index])
    # A view: writes go to the parent.
    view.fill_(-1.0)
    plain[index] = -1.0
    assert torch.equal(mmt, plain)


def test_view_of_view_keeps_class(mmt: MemoryMappedTensor) -> None:
    view = mmt[1:3][1]
    _same_map(view, mmt)
    assert torch.equal(view, torch.arange(12.0, 18.0))
    if mmt._filename is not None:
        assert view.filename == mmt.filename


def test_empty_views_keep_class(mmt: MemoryMappedTensor) -> None:
    """An empty slice is still a view of the map, as in tensordict (it came back a plain
    tensor, without ``filename``), and one of a file pickles as one."""
    import pickle

    for view in (mmt[0:0], mmt[4:], mmt[:, 6:], mmt[2:2, 1:3]):
        _same_map(view, mmt)
        assert view.numel() == 0
        if mmt._filename is not None:  # (an anonymous map is refused by plain pickle)
            assert view.filename == mmt.filename
            back = pickle.loads(pickle.dumps(view))
            assert back.shape == view.shape and back.dtype == view.dtype


def test_unbind_split_chunk_iteration_keep_class(mmt: MemoryMappedTensor) -> None:
    plain = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for views, expected in [
        (mmt.unbind(0), plain.unbind(0)),
        (mmt.unbind(1), plain.unbind(1)),
        (mmt.split(3, dim=1), plain.split(3, dim=1)),
        (mmt.split([1, 3]), plain.split([1, 3])),
        (mmt.chunk(2), plain.chunk(2)),
        (list(mmt), list(plain)),
    ]:
        assert len(views) == len(expected)
        for v, e in zip(views, expected, strict=True):
            _same_map(v, mmt)
            assert torch.equal(v, e)
    first = next(iter(mmt))
    first.fill_(100.0)
    assert torch.equal(mmt[0], torch.full((6,), 100.0))


def test_ops_return_plain_tensors(mmt: MemoryMappedTensor) -> None:
    plain = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    results = {
        "add": (mmt + 1, plain + 1),
        "mul": (mmt * mmt, plain * plain),
        "sum": (mmt.sum(), plain.sum()),
        "view": (mmt.view(6, 4), plain.view(6, 4)),
        "reshape": (mmt.reshape(24), plain.reshape(24)),
        "t": (mmt.t(), plain.t()),
        "clone": (mmt.clone(), plain.clone()),
        "to": (mmt.to(torch.int32), plain.to(torch.int32)),
        "stack": (torch.stack([mmt, mmt]), torch.stack([plain, plain])),
        "mask": (mmt[mmt > 10], plain[plain > 10]),
        "gather": (mmt[torch.tensor([0, 2])], plain[torch.tensor([0, 2])]),
        "eq": (mmt == plain, torch.ones(4, 6, dtype=torch.bool)),
    }
    for name, (got, expected) in results.items():
        assert type(got) is torch.Tensor, name
        assert torch.equal(got, expected), name
    # In-place ops return the MemoryMappedTensor itself.
    assert mmt.fill_(2.0) is mmt
    assert mmt.copy_(plain) is mmt
    assert torch.equal(mmt, plain)
    assert mmt.contiguous() is mmt
    assert isinstance(mmt.mul_(2), MemoryMappedTensor)
    assert torch.equal(mmt, plain * 2)


def test_slice_assignment_both_ways(mmt: MemoryMappedTensor) -> None:
    plain = torch.zeros(4, 6)
    plain[:2] = mmt[:2]
    assert torch.equal(plain[:2], torch.arange(12.0).reshape(2, 6))
    mmt[2:] = torch.ones(2, 6)
    assert torch.equal(mmt[2:], torch.ones(2, 6))


def test_repr(mmt: MemoryMappedTensor) -> None:
    text = repr(mmt)
    assert text.startswith("MemoryMappedTensor(")
    assert text == repr(torch.arange(24, dtype=torch.float32).reshape(4, 6)).replace(
        "tensor(", "MemoryMappedTensor("
    ).replace("\n       ", "\n                   ")
    assert repr(mmt[0, 0]) == "MemoryMappedTensor(0.)"


def test_is_shared(tmp_path: Path) -> None:
    assert MemoryMappedTensor.from_tensor(torch.ones(2), filename=tmp_path / "s").is_shared()
    assert not MemoryMappedTensor.from_tensor(torch.ones(2)).is_shared()


def test_flush(tmp_path: Path) -> None:
    path = tmp_path / "f.memmap"
    t = MemoryMappedTensor.zeros(1000, dtype=torch.int64, filename=path)
    t[::2] = torch.arange(500)
    assert t.flush() is None
    expected = torch.zeros(1000, dtype=torch.int64)
    expected[::2] = torch.arange(500)
    assert torch.equal(file_values(path, torch.int64), expected)
    # Flushing a view or an anonymous tensor is fine too.
    t[10:20].flush()
    MemoryMappedTensor.zeros(4).flush()


# --------------------------------------------------------------------------------- pickling


def test_pickle_file_backed_by_path(tmp_path: Path) -> None:
    path = tmp_path / "p.memmap"
    t = MemoryMappedTensor.from_tensor(torch.arange(1 << 18, dtype=torch.float32), filename=path)
    data = pickle.dumps(t)
    assert len(data) < 4096  # the path, not the megabyte of values
    assert str(path).encode() in data
    u = pickle.loads(data)
    assert_file_backed(u, path)
    assert u.shape == t.shape and u.dtype == t.dtype
    assert torch.equal(u, t)
    # Both map the same file.
    t[5] = -1.0
    assert u[5].item() == -1.0
    u[6] = -2.0
    assert t[6].item() == -2.0


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda t: t[2:5][1:2], [3.0]),
        (lambda t: t[2:8][1:5][::2], [3.0, 5.0]),
        (lambda t: t[7], 7.0),
        (lambda t: t[::3], [0.0, 3.0, 6.0, 9.0]),
        (lambda t: t.split(4)[1], [4.0, 5.0, 6.0, 7.0]),
        (lambda t: t.chunk(5)[4][1:], [9.0]),
    ],
)
def test_pickle_views(tmp_path: Path, make, expected) -> None:
    t = MemoryMappedTensor.from_tensor(torch.arange(10.0), filename=tmp_path / "v.memmap")
    view = make(t)
    assert view.tolist() == expected
    u = pickle.loads(pickle.dumps(view))
    assert isinstance(u, MemoryMappedTensor)
    assert u.filename == t.filename
    assert u.tolist() == expected
    assert u.shape == view.shape and u.stride() == view.stride()
    # Still a view into the file: the parent's later writes show.
    t.add_(100)
    assert u.tolist() == (
        [x + 100 for x in expected] if isinstance(expected, list) else expected + 100
    )


def test_pickle_2d_view(tmp_path: Path) -> None:
    t = MemoryMappedTensor.from_tensor(
        torch.arange(20.0).reshape(4, 5), filename=tmp_path / "v.memmap"
    )
    view = t[1:3, 2:4]
    u = pickle.loads(pickle.dumps(view))
    assert torch.equal(u, torch.tensor([[7.0, 8.0], [12.0, 13.0]]))


def test_pickle_anonymous_raises() -> None:
    t = MemoryMappedTensor.from_tensor(torch.arange(3.0))
    with pytest.raises(RuntimeError, match="anonymous MemoryMappedTensor cannot be pickled"):
        pickle.dumps(t)
    with pytest.raises(RuntimeError, match="anonymous MemoryMappedTensor cannot be pickled"):
        pickle.dumps(t[1:])


def test_unpickle_in_another_process(tmp_path: Path, run_python) -> None:
    t = MemoryMappedTensor.from_tensor(
        torch.arange(20.0).reshape(4, 5), filename=tmp_path / "x.memmap"
    )
    (tmp_path / "view.pkl").write_bytes(pickle.dumps(t[2:4][1]))
    child = run_python(
        """
        import pickle, sys
        from tensordict_rs import MemoryMappedTensor, TensorDictError

        view = pickle.loads(open(sys.argv[1], "rb").read())
        assert isinstance(view, MemoryMappedTensor), type(view)
        print(view.filename)
        print(view.tolist())
        view.fill_(-7.0)
        view.flush()
        """,
        str(tmp_path / "view.pkl"),
    )
    assert child.stdout.splitlines() == [t.filename, [15.0, 16.0, 17.0, 18.0, 19.0].__repr__()]
    assert torch.equal(t[3], torch.full((5,), -7.0))
    assert torch.equal(t[:3], torch.arange(15.0).reshape(3, 5))


def _fork_child_writes(t: MemoryMappedTensor, queue) -> None:
    queue.put(t.tolist())
    t[1] = 42.0
    t[2:].fill_(-1.0)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_fork_child_shares_anonymous_map() -> None:
    t = MemoryMappedTensor.from_tensor(torch.zeros(5))
    t[0] = 3.0
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_fork_child_writes, args=(t, queue))
    proc.start()
    seen = queue.get(timeout=30)
    proc.join(30)
    assert proc.exitcode == 0
    assert seen == [3.0, 0.0, 0.0, 0.0, 0.0]
    assert t.tolist() == [3.0, 42.0, -1.0, -1.0, -1.0]


def test_share_memory_keeps_the_map_and_from_storage_keeps_the_file(tmp_path: Path) -> None:
    """share_memory_() of an anonymous MemoryMappedTensor copied it out of its map (its buffer
    no longer its memory, its views plain tensors); from_storage of a torch.from_file storage
    dropped the file's name (pickled as a copy, writes through the copy never reached it)."""
    a = MemoryMappedTensor.from_tensor(torch.zeros(3))
    before = a.data_ptr()
    assert a.share_memory_() is a and a.data_ptr() == before == a._buffer.address
    assert isinstance(a[1:], MemoryMappedTensor)
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(16))
    storage = torch.UntypedStorage.from_file(str(path), True, 16)
    m = MemoryMappedTensor.from_storage(storage, dtype=torch.int32, shape=(4,))
    assert m.filename == str(path)
    pickle.loads(pickle.dumps(m)).fill_(3)
    assert torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.int32).tolist() == [3] * 4


def test_from_filename_modes_like_the_reference(tmp_path: Path) -> None:
    """from_filename(mode=) as tensordict's: "r" maps copy-on-write (writes stay in this
    process), "r+" maps shared, other modes raise ValueError (it raised TypeError: no such
    keyword)."""
    import tensordict

    for lib in (MemoryMappedTensor, tensordict.MemoryMappedTensor):
        path = tmp_path / lib.__module__
        lib.from_tensor(torch.arange(6), filename=path)
        private = lib.from_filename(path, torch.int64, (2, 3), mode="r")
        private[0, 0] = 100
        shared = lib.from_filename(path, torch.int64, (2, 3), mode="r+")
        assert shared.flatten().tolist() == [0, 1, 2, 3, 4, 5], lib
        shared[1, 2] = -1
        assert lib.from_filename(path, torch.int64, (2, 3))[1, 2] == -1, lib
        assert private[0, 0] == 100 and private[1, 2] == 5, lib
        with pytest.raises(ValueError, match="mode must be"):
            lib.from_filename(path, torch.int64, (2, 3), mode="w")
