"""Property tests: random TensorDicts round-trip through saves and loads unchanged.

Random trees: every storable dtype (bool, bfloat16, complex, unsigned...), random bytes as
values (NaNs and odd bit patterns included: compared bit for bit), shapes with 0 and 1 dims,
nesting up to depth 3, odd keys (``/``, ``%``, spaces, unicode, empty, ``.``, ``..``), JSON
non-tensor values.

* ``memmap_(prefix)`` then ``load_memmap(prefix)``: same keys (in order), dtypes, shapes,
  bytes, non-tensor values, batch sizes; ``verify`` finds nothing.
* anonymous ``memmap_()``: same again, in place.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import tensordict_rs
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict_rs import MemoryMappedTensor, NonTensorData, TensorDict

# torch itself warns (once) when any complex32 tensor is made; that is not under test here
pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")

DTYPES = [
    getattr(torch, name)
    for name in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    )
    if hasattr(torch, name)
]  # fmt: skip

RESERVED = {"shape", "device", "_type", "_class", "_format_version", "_names"}
ODD_KEYS = [
    "", ".", "..", "../x", "/etc/passwd", "a/b", "a%2Fb", "%", "%%41", " ", "two words",
    "é ü*?", "日本語", "x\ty", "nul\x00byte", "back\\slash", "c:x", "meta", "meta.json",
    "x.memmap", "x.shape", "type", "🙂",
]  # fmt: skip

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

keys = st.one_of(
    st.sampled_from(ODD_KEYS),
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=8),
).filter(lambda k: k not in RESERVED)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)

dims = st.integers(0, 3)


@st.composite
def tensors(draw: st.DrawFn, batch: tuple[int, ...]) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = (*batch, *draw(st.lists(dims, max_size=2)))
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for d in shape:
        numel *= d
    raw = draw(st.binary(min_size=numel * itemsize, max_size=numel * itemsize))
    if dtype is torch.bool:  # only 0 and 1 are valid bools
        raw = bytes(b & 1 for b in raw)
    flat = (
        torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if raw
        else torch.empty(0, dtype=torch.uint8)
    )
    out = flat.view(dtype).reshape(shape)
    if draw(st.booleans()) and out.dim() >= 2 and out.numel():
        out = out.transpose(-1, -2).contiguous().transpose(-1, -2)  # a non-contiguous source
    return out


def encode(key: str) -> str:
    """tensordict's file-name encoding of a key (reference document §1.7), written anew."""
    if key in ("", ".", ".."):
        return {"": "%", ".": "%2E", "..": "%2E%2E"}[key]
    special = set('/<>:"|?*\\ %')
    return "".join(
        f"%{ord(c):02X}" if c in special or ord(c) < 32 or ord(c) == 127 else c for c in key
    )


@st.composite
def trees(draw: st.DrawFn, batch: tuple[int, ...] | None = None, depth: int = 0) -> TensorDict:
    if batch is None:
        batch = tuple(draw(st.lists(dims, max_size=2)))
    entries: dict[str, Any] = {}
    for key in draw(st.lists(keys, max_size=4, unique=True)):
        kind = draw(
            st.sampled_from(["leaf", "leaf", "node", "json"] if depth < 3 else ["leaf", "json"])
        )
        if kind == "leaf":
            entries[key] = draw(tensors(batch))
        elif kind == "node":
            sub_batch = (*batch, *draw(st.lists(dims, max_size=1)))
            entries[key] = draw(trees(sub_batch, depth + 1))
        else:
            entries[key] = NonTensorData(draw(json_values))
    # keys must not collide on disk ("a" next to a sub-tree "a.memmap"; a sub-tree "meta.json")
    names = [
        encode(k) + (".memmap" if isinstance(v, torch.Tensor) else "") for k, v in entries.items()
    ]
    if len(set(names)) != len(names) or "meta.json" in names:
        entries = {k: v for k, v in entries.items() if isinstance(v, torch.Tensor)}
    td = TensorDict({}, batch)
    for key, value in entries.items():
        td[key] = value
    return td


def describe(td: TensorDict) -> list[tuple[Any, ...]]:
    """Keys in order with kind, dtype, shape and exact bytes (or the JSON value)."""
    out: list[tuple[Any, ...]] = [("batch", tuple(td.batch_size))]
    for key in td.keys():
        value = td.get(key)
        if isinstance(value, TensorDict):
            out.append((key, "node", describe(value)))
        elif isinstance(value, torch.Tensor):
            raw = value.contiguous().flatten().view(torch.uint8) if value.numel() else None
            out.append(
                (
                    key,
                    "leaf",
                    value.dtype,
                    tuple(value.shape),
                    None if raw is None else bytes(raw.numpy()),
                )
            )
        else:
            out.append((key, "json", repr(value.data)))
    return out


def mapped_leaves(td: TensorDict) -> list[Any]:
    out = []
    for key in td.keys():
        value = td.get(key)
        if isinstance(value, TensorDict):
            out += mapped_leaves(value)
        elif isinstance(value, torch.Tensor) and value.numel():
            out.append(value)
    return out


@SETTINGS
@given(td=trees())
def test_directory_round_trip(td: TensorDict) -> None:
    expected = describe(td)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "tree"
        td.memmap_(prefix)
        assert describe(td) == expected, "memmap_ changed the values"
        assert td.is_memmap() and td.is_locked
        assert tensordict_rs.verify(prefix) == []
        loaded = TensorDict.load_memmap(prefix)
        assert describe(loaded) == expected
        assert all(isinstance(t, MemoryMappedTensor) for t in mapped_leaves(loaded))
        del loaded
        td.unlock_()


@SETTINGS
@given(td=trees())
def test_anonymous_round_trip(td: TensorDict) -> None:
    expected = describe(td)
    td.memmap_()
    assert td.is_memmap() and td.is_locked
    assert describe(td) == expected
    assert all(isinstance(t, MemoryMappedTensor) for t in mapped_leaves(td))


@SETTINGS
@given(td=trees())
def test_memmap_copy_round_trip(td: TensorDict) -> None:
    """memmap(prefix) leaves the source alone; memmap_like gives zeros of the same layout."""
    expected = describe(td)
    with tempfile.TemporaryDirectory() as tmp:
        out = td.memmap(Path(tmp) / "copy")
        assert describe(out) == expected and describe(td) == expected
        assert not td.is_memmap()
        like = td.memmap_like(Path(tmp) / "like")
        loaded = TensorDict.load_memmap(Path(tmp) / "like")
        for layout in (like, loaded):
            for leaf in mapped_leaves(layout):
                assert not leaf.view(-1).view(torch.uint8).any()
        strip = [(e[0], e[1], *e[2:4]) if e[1] == "leaf" else e[:2] for e in expected[1:]]
        assert [
            (e[0], e[1], *e[2:4]) if e[1] == "leaf" else e[:2] for e in describe(loaded)[1:]
        ] == strip
        del out, like, loaded
