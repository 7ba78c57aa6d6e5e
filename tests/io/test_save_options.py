"""The save methods' keyword options, written once (io/options.py): the same names, kinds and
defaults as the ten-parameter signatures they replace, and the same errors for other names."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch
from tensordict_rs import TensorDict
from tensordict_rs.io.options import COPY, LIKE, SaveOptions

KW, POS = inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
HEAD = [
    ("self", POS, inspect.Parameter.empty),
    ("prefix", POS, None),
    ("copy_existing", POS, False),
]
COMMON = [("num_threads", KW, 0), ("return_early", KW, False), ("existsok", KW, True)]
# added by issue 23 (the reference's names; share_non_tensor=True is refused by name)
NEWER = [("share_non_tensor", KW, False), ("robust_key", KW, None)]
# tensordict-rs 0.1.0's signatures (fba7fba), parameter by parameter, then NEWER
COPY_SIGNATURE = [
    *HEAD,
    *COMMON,
    ("durable", KW, False),
    ("archive", KW, None),
    ("compression", KW, None),
    ("progress", KW, False),
    *NEWER,
]
LIKE_SIGNATURE = [
    *HEAD,
    *COMMON,
    ("durable", KW, False),
    ("reserve", KW, True),
    ("archive", KW, None),
    ("progress", KW, False),
    *NEWER,
]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("memmap_", COPY_SIGNATURE),
        ("memmap", COPY_SIGNATURE),
        ("save", COPY_SIGNATURE),
        ("dumps", COPY_SIGNATURE),
        ("memmap_like", LIKE_SIGNATURE),
    ],
)
def test_signatures_are_unchanged(name: str, expected: list[tuple[str, object, object]]) -> None:
    params = inspect.signature(getattr(TensorDict, name)).parameters.values()
    assert [(p.name, p.kind, p.default) for p in params] == expected
    assert ">>> " in (inspect.getdoc(getattr(TensorDict, name)) or "")  # help() keeps its example


def test_every_option_is_accepted_by_a_method() -> None:
    assert {f.name for f in dataclasses.fields(SaveOptions)} == COPY | LIKE
    assert COPY ^ LIKE == {"compression", "reserve"}


@pytest.mark.parametrize(
    ("method", "args", "kwargs", "message"),
    [
        (
            "memmap_",
            (),
            {"reserve": False},
            "memmap_() got an unexpected keyword argument 'reserve'",
        ),
        ("memmap", (), {"nope": 1}, "memmap() got an unexpected keyword argument 'nope'"),
        ("save", (), {"nope": 1}, "save() got an unexpected keyword argument 'nope'"),
        ("dumps", (), {"nope": 1}, "save() got an unexpected keyword argument 'nope'"),
        (
            "memmap_like",
            (),
            {"compression": "deflate"},
            "memmap_like() got an unexpected keyword argument 'compression'",
        ),
        ("memmap", (False, 2), {}, "positional argument"),
    ],
)
def test_other_names_are_refused_before_anything_is_written(
    method: str, args: tuple[object, ...], kwargs: dict[str, object], message: str, tmp_path: Path
) -> None:
    td = TensorDict({"a": torch.zeros(3)}, [3])
    with pytest.raises(TypeError, match=re.escape(message)):
        getattr(td, method)(tmp_path / "t", *args, **kwargs)
    assert not (tmp_path / "t").exists() and not td.is_memmap()


def test_options_reach_the_save(tmp_path: Path) -> None:
    td = TensorDict({"a": torch.arange(3.0)}, [3])
    td.memmap(tmp_path / "t")
    with pytest.raises(FileExistsError):
        td.memmap(tmp_path / "t", existsok=False)
    future = td.save(tmp_path / "u", return_early=True, num_threads=2)
    assert future.result().saved_path == tmp_path / "u"
    sparse = TensorDict({"a": torch.empty(1 << 20, device="meta")}, [1 << 20])
    made = sparse.memmap_like(tmp_path / "s", reserve=False)
    stat = (
        tmp_path / "s" / "a.memmap"
    ).stat()  # reserve=False: sparse, as io/test_ownership checks
    assert stat.st_size == 4 << 20 and stat.st_blocks * 512 < 2 << 20 and made["a"].sum() == 0
