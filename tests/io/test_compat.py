"""Compatibility with the reference ``tensordict==0.15.3``: memmap directories move both ways.

Every tree is described once as a plain spec (``Node``), built with both libraries from the same
source tensors, written by one and loaded by the other, and compared against the spec itself.
The expected file layout comes from the format description (reference document §1), coded here
independently of both libraries.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tensordict_rs as tr
import torch

# --------------------------------------------------------------------------------------------
# The reference, imported lazily (it takes seconds). It is a declared test dependency: an import
# failure must fail these tests, never skip them, so no importorskip. None of the reference calls
# below warns (checked with 0.15.3 under filterwarnings=error), so none is wrapped.


@pytest.fixture(scope="module")
def ref() -> Any:
    import tensordict

    assert tensordict.__version__ == "0.15.3", tensordict.__version__
    return tensordict


# --------------------------------------------------------------------------------------------
# Tree specs


@dataclass
class Node:
    """A TensorDict: its batch size and its entries in insertion order."""

    batch: list[int]
    items: list[tuple[str, Any]]  # value: torch.Tensor | Node | NonTensor


@dataclass
class NonTensor:
    """A non-tensor value: a str is set with ``td[key] = s``, anything else as non-tensor data."""

    data: Any


DTYPES = [
    torch.float16,
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    # The reference also stores these (checked with 0.15.3); complex32 is left out because
    # torch itself warns that it is experimental.
    *(getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)),
]

ODD_KEYS = ["a/b", "with space", "pc%t", "a%2Fb", ".", "..", "", "é ü*?", "x\ty", "a.b", "日本"]


def sample(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Deterministic values covering each dtype; integers use random bytes (the full range)."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=gen)
    if dtype.is_floating_point:
        return (torch.randn(shape, dtype=torch.float64, generator=gen) * 100).to(dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = math.prod(shape)
    raw = torch.randint(0, 256, (numel * itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def rich_spec() -> Node:
    """Batch [3]: every dtype, odd keys, 4 levels, wider nested batches, empties, views, strings."""
    gen = torch.Generator().manual_seed(0)
    items: list[tuple[str, Any]] = [
        (f"dtype_{dtype_name(d)}", sample(d, (3, 2), gen)) for d in DTYPES
    ]
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    items += [
        ("noncontig", base.t()[:3]),  # shape (3, 3), stride (1, 4)
        ("strided_int16", torch.arange(18, dtype=torch.int16).reshape(3, 6)[:, ::2]),
        ("permuted_complex", torch.randn(2, 3, dtype=torch.complex128, generator=gen).t()),
        ("expanded", torch.tensor(7.25, dtype=torch.float64).expand(3)),  # stride (0,)
        ("expanded_bool", torch.tensor([True, False, False, True]).expand(3, 4)),
        ("empty", torch.zeros(3, 0)),
        ("empty_int", torch.empty(3, 0, 5, dtype=torch.int64)),
    ]
    items += [(key, sample(torch.float32, (3,), gen)) for key in ODD_KEYS]
    items += [
        (
            "nested",
            Node(
                [3],
                [
                    ("x", sample(torch.float64, (3, 5), gen)),
                    ("empty", torch.zeros(3, 0, 2, dtype=torch.bfloat16)),
                    (
                        "deeper",
                        Node(
                            [3],
                            [
                                ("y", sample(torch.int32, (3,), gen)),
                                (
                                    "deepest",
                                    Node(
                                        [3],
                                        [
                                            ("z", sample(torch.bfloat16, (3, 2, 2), gen)),
                                            ("msg", NonTensor("deep string")),
                                        ],
                                    ),
                                ),
                            ],
                        ),
                    ),
                ],
            ),
        ),
        (
            "wide",
            Node(
                [3, 4],
                [
                    ("w", sample(torch.float32, (3, 4, 2), gen)),
                    ("wider", Node([3, 4, 5], [("v", sample(torch.int8, (3, 4, 5), gen))])),
                ],
            ),
        ),
        (
            "sub dir/%é",
            Node(
                [3],
                [("a b", sample(torch.uint8, (3,), gen)), ("..", sample(torch.int16, (3, 1), gen))],
            ),
        ),
        ("name", NonTensor("hello")),
        ("unicode text", NonTensor("héllo wörld ✓\t日本")),
        ("json_list", NonTensor([1, 2.5, "x", True, None, [3, 4], {"k": "v"}])),
        ("json_int", NonTensor(42)),
        ("json_float", NonTensor(0.5)),
        ("json_dict", NonTensor({"zeta": 1, "alpha": [1, 2], "mid": {"b": None, "a": "é"}})),
    ]
    return Node([3], items)


def scalar_spec() -> Node:
    """Batch []: a 0-d leaf of every dtype, plus nested tds with more batch dims."""
    gen = torch.Generator().manual_seed(1)
    items: list[tuple[str, Any]] = [(f"scalar_{dtype_name(d)}", sample(d, (), gen)) for d in DTYPES]
    items += [
        ("vec", sample(torch.float32, (4,), gen)),
        ("empty", torch.zeros(0)),
        (
            "sub",
            Node(
                [],
                [
                    ("s", torch.tensor(-5, dtype=torch.int64)),
                    ("sub2", Node([2], [("t", sample(torch.float16, (2, 3), gen))])),
                ],
            ),
        ),
        ("name", NonTensor("hello")),
        ("json_float", NonTensor(3.5)),
    ]
    return Node([], items)


SPECS = {"rich": rich_spec, "scalar": scalar_spec}
METHODS = ["memmap_", "memmap", "memmap_like"]


def build_ref(ref: Any, node: Node) -> Any:
    td = ref.TensorDict({}, batch_size=node.batch)
    for key, value in node.items:
        if isinstance(value, Node):
            td[key] = build_ref(ref, value)
        elif isinstance(value, NonTensor):
            if isinstance(value.data, str):
                td[key] = value.data  # becomes NonTensorData in the reference
            else:
                td.set_non_tensor(key, value.data)
        else:
            td[key] = value
    return td


def build_ours(node: Node) -> tr.TensorDict:
    td = tr.TensorDict({}, batch_size=node.batch)
    for key, value in node.items:
        if isinstance(value, Node):
            td[key] = build_ours(value)
        elif isinstance(value, NonTensor):
            td[key] = value.data if isinstance(value.data, str) else tr.NonTensorData(value.data)
        else:
            td[key] = value
    return td


def write(td: Any, method: str, prefix: Path) -> Any:
    return getattr(td, method)(prefix)


# --------------------------------------------------------------------------------------------
# Checks


def raw_bytes(tensor: torch.Tensor) -> bytes:
    plain = tensor.as_subclass(torch.Tensor).detach().cpu().contiguous().reshape(-1)
    return plain.view(torch.uint8).numpy().tobytes()


def json_repr(data: Any) -> str:
    """Exact text of a JSON value: catches type, key order, precision and -0.0 differences."""
    return json.dumps(data, ensure_ascii=False)


def expected_tensor(value: torch.Tensor, like: bool) -> torch.Tensor:
    return torch.zeros(value.shape, dtype=value.dtype) if like else value


def check_tree(got: Any, node: Node, td_type: type, like: bool, path: tuple[str, ...] = ()) -> None:
    """``got`` holds exactly the spec: batch sizes, keys, dtypes, shapes and values."""
    assert isinstance(got, td_type), (path, type(got))
    assert tuple(got.batch_size) == tuple(node.batch), path
    assert sorted(got.keys()) == sorted(key for key, _ in node.items), path
    for key, exp in node.items:
        where = (*path, key)
        value = got[key]
        if isinstance(exp, Node):
            check_tree(value, exp, td_type, like, where)
        elif isinstance(exp, NonTensor):
            assert not isinstance(value, (torch.Tensor, td_type)), (where, type(value))
            assert json_repr(value) == json_repr(exp.data), where
        else:
            assert isinstance(value, torch.Tensor), (where, type(value))
            assert value.dtype == exp.dtype, where
            assert tuple(value.shape) == tuple(exp.shape), where
            want = expected_tensor(exp, like)
            assert raw_bytes(value) == raw_bytes(want), (where, value, want)


_ESCAPED = set('/<>:"|?*\\ %') | {chr(i) for i in range(32)} | {chr(127)}


def encode(key: str) -> str:
    """File-name component of a key (reference document §1.7)."""
    if key == "":
        return "%"
    if key in (".", ".."):
        return "%2E" * len(key)
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in key)


def expected_files(node: Node, prefix: str = "") -> dict[str, int | None]:
    """Relative path -> byte size (None for meta.json) that a directory of ``node`` holds."""
    files: dict[str, int | None] = {f"{prefix}meta.json": None}
    for key, value in node.items:
        if isinstance(value, Node):
            files.update(expected_files(value, f"{prefix}{encode(key)}/"))
        elif isinstance(value, NonTensor):
            files[f"{prefix}{encode(key)}/meta.json"] = None
        elif value.numel() > 0:  # empty tensors get no file
            files[f"{prefix}{encode(key)}.memmap"] = value.numel() * value.element_size()
    return files


def files_under(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}


def check_layout(root: Path, node: Node) -> None:
    want = expected_files(node)
    have = files_under(root)
    assert sorted(have) == sorted(want)
    for rel, size in want.items():
        if size is not None:
            assert have[rel].stat().st_size == size, rel


def ordered_json(path: Path) -> Any:
    """meta.json as nested lists of (key, value) pairs, so that key order is compared too."""
    return json.loads(path.read_bytes(), object_pairs_hook=list)


# --------------------------------------------------------------------------------------------
# Reference writes, we load


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("spec", SPECS)
def test_reference_directory_loads_in_ours(
    ref: Any, tmp_path: Path, spec: str, method: str
) -> None:
    node = SPECS[spec]()
    prefix = tmp_path / "ref"
    write(build_ref(ref, node), method, prefix)
    check_layout(prefix, node)
    loaded = tr.TensorDict.load_memmap(prefix)
    check_tree(loaded, node, tr.TensorDict, like=method == "memmap_like")


# --------------------------------------------------------------------------------------------
# We write, the reference loads


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("spec", SPECS)
def test_our_directory_loads_in_reference(ref: Any, tmp_path: Path, spec: str, method: str) -> None:
    node = SPECS[spec]()
    prefix = tmp_path / "ours"
    write(build_ours(node), method, prefix)
    check_layout(prefix, node)
    loaded = ref.TensorDict.load_memmap(prefix)
    check_tree(loaded, node, ref.TensorDictBase, like=method == "memmap_like")


# --------------------------------------------------------------------------------------------
# Byte level: same data, same files


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("spec", SPECS)
def test_files_match_reference(ref: Any, tmp_path: Path, spec: str, method: str) -> None:
    node = SPECS[spec]()
    write(build_ref(ref, node), method, tmp_path / "ref")
    write(build_ours(node), method, tmp_path / "ours")
    theirs, ours = files_under(tmp_path / "ref"), files_under(tmp_path / "ours")
    assert sorted(ours) == sorted(theirs)
    for rel, path in theirs.items():
        if rel.endswith(".memmap"):
            assert ours[rel].read_bytes() == path.read_bytes(), rel
        else:
            # Same JSON object, entries in the same order. The bytes may differ: the reference
            # (stdlib json) escapes non-ASCII as \uXXXX where we write UTF-8, as orjson would.
            assert ordered_json(ours[rel]) == ordered_json(path), rel


# --------------------------------------------------------------------------------------------
# Non-tensor numbers must keep their exact value and type (Python json semantics)

PRECISE_NUMBERS = [
    2**70,
    -(2**70),
    2**64 - 1,
    -(2**63),
    123456789.123456789,
    0.1,
    1e-300,
    5e-324,
    1.7976931348623157e308,
    1e20,
    -0.0,
    [2**65, 2.000000000000001],
]


def number_spec(value: Any) -> Node:
    return Node([], [("number", NonTensor(value))])


@pytest.mark.parametrize("value", PRECISE_NUMBERS, ids=repr)
def test_non_tensor_number_from_reference(ref: Any, tmp_path: Path, value: Any) -> None:
    node = number_spec(value)
    build_ref(ref, node).memmap_(tmp_path / "ref")
    check_tree(tr.TensorDict.load_memmap(tmp_path / "ref"), node, tr.TensorDict, like=False)


@pytest.mark.parametrize("value", PRECISE_NUMBERS, ids=repr)
def test_non_tensor_number_from_ours(ref: Any, tmp_path: Path, value: Any) -> None:
    node = number_spec(value)
    build_ours(node).memmap_(tmp_path / "ours")
    build_ref(ref, node).memmap_(tmp_path / "ref")
    rel = "number/meta.json"
    assert ordered_json(tmp_path / "ours" / rel) == ordered_json(tmp_path / "ref" / rel)
    check_tree(ref.TensorDict.load_memmap(tmp_path / "ours"), node, ref.TensorDictBase, like=False)


# --------------------------------------------------------------------------------------------
# Writes through our loaded leaves reach the files


@pytest.mark.parametrize("writer", ["reference", "ours"])
def test_writes_through_loaded_leaves_reach_reference(
    ref: Any, tmp_path: Path, writer: str
) -> None:
    node = rich_spec()
    prefix = tmp_path / "dir"
    if writer == "reference":
        build_ref(ref, node).memmap_(prefix)
    else:
        build_ours(node).memmap_(prefix)
    loaded = tr.TensorDict.load_memmap(prefix)

    loaded["dtype_float32"][1, 0] = 123.5
    loaded["dtype_bfloat16"].fill_(-2.0)
    loaded["dtype_int64"][2] = torch.tensor([-(2**62), 2**62 - 1])
    loaded["nested", "deeper", "deepest", "z"][0] = 4.0
    loaded.set_("with space", torch.tensor([1.0, 2.0, 3.0]))
    loaded["wide", "wider", "v"] += 1

    items = dict(node.items)
    items["dtype_float32"] = items["dtype_float32"].clone()
    items["dtype_float32"][1, 0] = 123.5
    items["dtype_bfloat16"] = torch.full((3, 2), -2.0, dtype=torch.bfloat16)
    items["dtype_int64"] = items["dtype_int64"].clone()
    items["dtype_int64"][2] = torch.tensor([-(2**62), 2**62 - 1])
    items["with space"] = torch.tensor([1.0, 2.0, 3.0])
    deepest = items["nested"].items[2][1].items[1][1]
    deepest.items[0] = ("z", deepest.items[0][1].clone())
    deepest.items[0][1][0] = 4.0
    wider = items["wide"].items[1][1]
    wider.items[0] = ("v", wider.items[0][1] + 1)
    node.items = list(items.items())

    check_tree(ref.TensorDict.load_memmap(prefix), node, ref.TensorDictBase, like=False)


# --------------------------------------------------------------------------------------------
# The reference's test artifact (reference document §1.10), rebuilt by hand

ARTIFACT_META = {
    "meta.json": '{"nested": {"type": "TensorDict"}, "shape": [2, 1], "device": "cpu", '
    '"_type": "<class \'tensordict._td.TensorDict\'>"}',
    "nested/meta.json": '{"int64": {"device": "cpu", "shape": [2, 1], "dtype": "torch.int64", '
    '"is_nested": false}, "string": {"type": "NonTensorData"}, "bfloat16": {"device": "cpu", '
    '"shape": [2, 1], "dtype": "torch.bfloat16", "is_nested": false}, "shape": [2, 1], '
    '"device": "cpu", "_type": "<class \'tensordict._td.TensorDict\'>"}',
    "nested/string/meta.json": '{"_type": "<class \'tensordict.tensorclass.NonTensorData\'>", '
    '"data": ["a string!"], "_metadata": null}',
}
ARTIFACT_INT64 = torch.tensor([[3], [-5]], dtype=torch.int64)


def make_artifact(root: Path) -> None:
    for rel, text in ARTIFACT_META.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode())
    # 16 data bytes and a trailing 00; two bfloat16 ones (803f 803f) and a trailing 0a00.
    (root / "nested/int64.memmap").write_bytes(raw_bytes(ARTIFACT_INT64) + b"\x00")
    (root / "nested/bfloat16.memmap").write_bytes(bytes.fromhex("803f803f0a00"))


def check_artifact(td: Any, td_type: type) -> None:
    assert isinstance(td, td_type)
    assert tuple(td.batch_size) == (2, 1)
    assert list(td.keys()) == ["nested"]
    nested = td["nested"]
    assert isinstance(nested, td_type)
    assert tuple(nested.batch_size) == (2, 1)
    assert sorted(nested.keys()) == ["bfloat16", "int64", "string"]
    assert nested["int64"].dtype == torch.int64
    assert torch.equal(nested["int64"].as_subclass(torch.Tensor), ARTIFACT_INT64)
    assert nested["bfloat16"].dtype == torch.bfloat16
    assert torch.equal(
        nested["bfloat16"].as_subclass(torch.Tensor), torch.ones(2, 1, dtype=torch.bfloat16)
    )
    assert td["nested", "string"] == ["a string!"]


def test_reference_artifact_with_trailing_bytes_loads_in_ours(ref: Any, tmp_path: Path) -> None:
    make_artifact(tmp_path)
    check_artifact(tr.TensorDict.load_memmap(tmp_path), tr.TensorDict)
    # Loading neither truncates nor grows the files.
    assert (tmp_path / "nested/int64.memmap").stat().st_size == 17
    assert (tmp_path / "nested/bfloat16.memmap").stat().st_size == 6
    # The hand-built artifact is what the reference itself accepts.
    check_artifact(ref.TensorDict.load_memmap(tmp_path), ref.TensorDictBase)
