"""The compact repr, as tensordict 0.15 prints it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict_rs import TensorDict

# --------------------------------------------------------------------------------- repr


@pytest.mark.parametrize(
    ("td", "expected"),
    [
        (TensorDict({}, []), "TensorDict(batch_size=[], fields={})"),
        (
            TensorDict({}, [2, 3], device="cpu"),
            "TensorDict(batch_size=[2,3], device=cpu, fields={})",
        ),
        (
            TensorDict({"a": torch.zeros(3, 4)}, [3]),
            "TensorDict(batch_size=[3], fields={a: f32[4]})",
        ),
        (
            TensorDict({"b": torch.zeros(3), "a": torch.zeros(3, 2, 5)}, [3], device="cpu"),
            "TensorDict(batch_size=[3], device=cpu, fields={a: f32[2,5], b: f32[]})",
        ),
        (
            TensorDict(
                {
                    "f64": torch.zeros(2, dtype=torch.float64),
                    "f16": torch.zeros(2, dtype=torch.float16),
                    "bf": torch.zeros(2, dtype=torch.bfloat16),
                },
                [2],
            ),
            "TensorDict(batch_size=[2], fields={bf: bf16[], f16: f16[], f64: f64[]})",
        ),
        (
            TensorDict(
                {"i32": torch.zeros(2, dtype=torch.int32), "i8": torch.zeros(2, dtype=torch.int8)},
                [2],
            ),
            "TensorDict(batch_size=[2], fields={i32: i32[], i8: i8[]})",
        ),
        (
            TensorDict(
                {
                    "u8": torch.zeros(2, dtype=torch.uint8),
                    "ok": torch.zeros(2, dtype=torch.bool),
                    "c": torch.zeros(2, dtype=torch.complex64),
                    "i": torch.zeros(2, dtype=torch.int64),
                },
                [2],
            ),
            "TensorDict(batch_size=[2], fields={c: c64[], i: i64[], ok: bool[], u8: u8[]})",
        ),
        (
            TensorDict({"n": TensorDict({"x": torch.zeros(3, 4, 2)}, [3, 4])}, [3]),
            "TensorDict(batch_size=[3], fields={n: [4]{x: f32[2]}})",
        ),
        (
            TensorDict({"n": {"m": {"x": torch.zeros(3, dtype=torch.int64)}}}, [3]),
            "TensorDict(batch_size=[3], fields={n: {m: {x: i64[]}}})",
        ),
        (
            TensorDict({"s": "hello", "a": torch.zeros(2)}, [2]),
            "TensorDict(batch_size=[2], fields={a: f32[], s: str})",
        ),
        (
            TensorDict({"x": torch.zeros(2), "m": torch.zeros(2, 2, device="meta")}, [2]),
            "TensorDict(batch_size=[2], fields={m: f32[2]@meta, x: f32[]})",
        ),
        (
            TensorDict({"m": torch.zeros(2, 2, device="meta")}, [2], device="meta"),
            "TensorDict(batch_size=[2], device=meta, fields={m: f32[2]})",
        ),
        (
            TensorDict({"n": TensorDict({"m": torch.zeros(2, device="meta")}, [2])}, [2]),
            "TensorDict(batch_size=[2], fields={n: {m: f32[]@meta}})",
        ),
    ],
    ids=lambda x: "" if isinstance(x, str) else None,
)
def test_repr(td: TensorDict, expected: str) -> None:
    assert repr(td) == expected
    assert str(td) == expected


def test_repr_multiline() -> None:
    td = TensorDict(
        {"a": torch.zeros(3, 2), "n": {"x": torch.zeros(3, dtype=torch.int64)}, "s": "str"},
        [3],
        device="cpu",
    )
    assert repr(td) == (
        "TensorDict(batch_size=[3], device=cpu, fields={\n"
        "    a: f32[2],\n"
        "    n: {x: i64[]},\n"
        "    s: str})"
    )


def test_repr_multiline_nested() -> None:
    td = TensorDict(
        {
            "observation_pixels": torch.zeros(2, 84, 84, 3, dtype=torch.uint8),
            "action": torch.zeros(2, 6),
            "next": {
                "observation_pixels": torch.zeros(2, 84, 84, 3, dtype=torch.uint8),
                "reward": torch.zeros(2, 1),
                "done": torch.zeros(2, 1, dtype=torch.bool),
                "truncated": torch.zeros(2, 1, dtype=torch.bool),
            },
        },
        [2],
    )
    assert repr(td) == (
        "TensorDict(batch_size=[2], fields={\n"
        "    action: f32[6],\n"
        "    next: {\n"
        "        done: bool[1],\n"
        "        observation_pixels: u8[84,84,3],\n"
        "        reward: f32[1],\n"
        "        truncated: bool[1]},\n"
        "    observation_pixels: u8[84,84,3]})"
    )


def test_repr_width_boundary() -> None:
    head = "TensorDict(batch_size=[3], fields={"
    # One line is at most 80 columns: "<head><key>: f32[]})".
    fits = "k" * (80 - len(head) - len(": f32[]})"))
    one_line = repr(TensorDict({fits: torch.zeros(3)}, [3]))
    assert one_line == f"{head}{fits}: f32[]}})"
    assert len(one_line) == 80
    too_long = fits + "k"
    assert repr(TensorDict({too_long: torch.zeros(3)}, [3])) == (
        f"TensorDict(batch_size=[3], fields={{\n    {too_long}: f32[]}})"
    )


def test_repr_memmap_and_loaded(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.zeros(10), "b": {"c": torch.zeros(10)}}, [10])
    expected = "TensorDict(batch_size=[10], device=cpu, fields={a: f32[], b: {c: f32[]}})"
    assert repr(td.memmap(tmp_prefix)) == expected
    assert repr(TensorDict.load_memmap(tmp_prefix)) == expected
    assert repr(td.memmap_like()) == expected
    assert repr(td) == "TensorDict(batch_size=[10], fields={a: f32[], b: {c: f32[]}})"
