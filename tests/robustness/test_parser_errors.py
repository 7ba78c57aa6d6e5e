"""Every parser error names the file (issue 28, defect 7).

``from_safetensors`` on a file whose ``__metadata__`` nests JSON deeply raised a bare
``RecursionError`` that named no file. Each hostile input below, for each reader (safetensors
header and metadata, a directory's meta.json, an archive's meta.json, a commit journal), must
raise a tensordict_rs exception whose message names the file.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

DEEP = "[" * 100_000 + "]" * 100_000


def safetensors_file(path: Path, header: dict[str, object] | bytes, data: bytes = b"") -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def deep_non_tensor(tmp: Path) -> Path:
    return safetensors_file(
        tmp / "v.safetensors", {"__metadata__": {"tensordict_rs.non_tensor": DEEP}}
    )


def deep_batch_sizes(tmp: Path) -> Path:
    return safetensors_file(
        tmp / "b.safetensors", {"__metadata__": {"tensordict_rs.batch_sizes": DEEP}}
    )


def deep_non_tensor_value(tmp: Path) -> Path:
    value = '{"k": ' + "[" * 5000 + "]" * 5000 + "}"
    return safetensors_file(
        tmp / "w.safetensors", {"__metadata__": {"tensordict_rs.non_tensor": value}}
    )


def deep_names(tmp: Path) -> Path:
    name = ".".join(["a"] * 5000)
    entry = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    return safetensors_file(tmp / "n.safetensors", {name: entry}, b"\0" * 4)


def deep_header(tmp: Path) -> Path:
    return safetensors_file(tmp / "h.safetensors", b'{"a": ' + DEEP.encode() + b"}")


def deep_meta_json(tmp: Path) -> Path:
    from tensordict_rs import TensorDict

    prefix = tmp / "tree"
    TensorDict({"a": torch.ones(2)}, [2]).memmap(prefix)
    text = (prefix / "meta.json").read_text()
    (prefix / "meta.json").write_text(text[:-1] + ', "zz": ' + DEEP + "}")
    return prefix


def deep_journal(tmp: Path) -> Path:
    from tensordict_rs import TensorDict

    prefix = tmp / "tree"
    TensorDict({"a": torch.ones(2)}, [2]).memmap(prefix)
    (prefix / ".tdrs%journal").write_text('{"token": ' + DEEP + "}")
    return prefix


def deep_archive_meta(tmp: Path) -> Path:
    import zipfile

    from tensordict_rs import TensorDict

    path = tmp / "a.tdz"
    TensorDict({"a": torch.ones(2)}, [2]).memmap(path)
    with zipfile.ZipFile(path) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    entries["meta.json"] = entries["meta.json"][:-1] + b', "zz": ' + DEEP.encode() + b"}"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


def load_safetensors(path: Path) -> object:
    from tensordict_rs import TensorDict

    return TensorDict.from_safetensors(path)


def load_memmap(path: Path) -> object:
    from tensordict_rs import TensorDict

    return TensorDict.load_memmap(path)


CASES: dict[str, tuple[Callable[[Path], Path], Callable[[Path], object]]] = {
    "safetensors-deep-non-tensor": (deep_non_tensor, load_safetensors),
    "safetensors-deep-batch-sizes": (deep_batch_sizes, load_safetensors),
    "safetensors-deep-non-tensor-value": (deep_non_tensor_value, load_safetensors),
    "safetensors-deep-names": (deep_names, load_safetensors),
    "safetensors-deep-header": (deep_header, load_safetensors),
    "meta-json-deep": (deep_meta_json, load_memmap),
    "journal-deep": (deep_journal, load_memmap),
    "archive-meta-deep": (deep_archive_meta, load_memmap),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_parser_error_names_the_file(tmp_path: Path, case: str) -> None:
    import tensordict_rs

    make, load = CASES[case]
    path = make(tmp_path)
    with pytest.raises(tensordict_rs.TensorDictError) as caught:
        load(path)
    message = str(caught.value)
    assert str(path) in message, message
    assert "recursion" not in type(caught.value).__name__.lower()
