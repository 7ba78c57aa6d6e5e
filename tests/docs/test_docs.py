"""Runnable docs: every docstring example in the package runs as a doctest, and the README's
"Recipes" run as they are written (Python blocks, then the shell block), in one empty dir."""

from __future__ import annotations

import doctest
import importlib
import inspect
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tensordict_rs
from tensordict_rs.ops import pointwise

README = Path(__file__).resolve().parent.parent / "README.md"
MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(tensordict_rs.__path__, "tensordict_rs.")
    if m.name != "tensordict_rs._native"
)


@pytest.mark.parametrize("name", ["tensordict_rs", *MODULES])
def test_doctests(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(module, optionflags=flags, verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} doctest(s) of {name} failed (see above)"


def test_method_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples of TensorDict's methods, wherever they are defined (the operator methods
    that ``ops/pointwise`` makes at import are in no module's namespace, so testmod misses
    them)."""
    monkeypatch.chdir(tmp_path)
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    ran = 0
    for name, member in vars(tensordict_rs.TensorDict).items():
        if callable(member) and ">>> " in (getattr(member, "__doc__", None) or ""):
            for test in finder.find(member, f"TensorDict.{name}", globs={}):
                runner.run(test)
                ran += 1
    assert ran >= 60 and runner.failures == 0, f"{runner.failures} of {ran} examples failed"


# The public names whose docstrings must show an example (checked: the examples run above).
EXAMPLES = [
    "TensorDict",
    "TensorDict.memmap_",
    "TensorDict.memmap",
    "TensorDict.memmap_like",
    "TensorDict.load_memmap",
    "TensorDict.save",
    "TensorDict.load",
    "TensorDict.from_safetensors",
    "TensorDict.to_safetensors",
    "TensorDict.share_memory_",
    "TensorDict.all_reduce",  # the torch.distributed group (its class docstring)
    "TensorDictFuture",
    "MemoryMappedTensor",
    "NonTensorData",
    "verify",
    "is_memmap_archive",
    "pack_memmap",
    "unpack_memmap",
    "refresh_archive_checksums",
    *(f"TensorDict.{name}" for name in pointwise.methods()),
    *(f"TensorDict.{name}" for name in pointwise.CASTS),
    # ops/shape, ops/keys, ops/apply and the named element-wise methods
    *(
        f"TensorDict.{name}"
        for name in (
            "chunk expand expand_as flatten permute reshape split squeeze transpose unbind "
            "unflatten unsqueeze view empty exclude flatten_keys from_dict fromkeys is_empty "
            "rename_key_ select to_dict unflatten_keys apply apply_ named_apply add add_ sub "
            "sub_ clamp clamp_min clamp_max lerp masked_fill masked_fill_ fill_ zero_ copy_ "
            "set_at_ update_at_ detach detach_ contiguous to_tensordict to cpu clear_device_ "
            "is_locked lock_ unlock_ is_memmap load_memmap_ memmap_refresh_ flush is_shared "
            "where"
        ).split()
    ),
    # entries, shape and device, indexing (tensordict.py, ops/indexing), devices, sharing
    *(
        f"TensorDict.{name}"
        for name in (
            "keys values items get set set_ update update_ pop clone numel dim batch_size "
            "batch_dims ndim shape names device is_cuda is_cpu sorted_keys index_select "
            "__getitem__ __setitem__ cuda swapaxes swapdims all any pin_memory saved_path"
        ).split()
    ),
    # torch.distributed: point to point (shown, not run: they need a second rank), reduce,
    # gather_and_stack, scatter; all_gather and broadcast are shown by the group's class docstring
    *(
        f"TensorDict.{name}"
        for name in (
            "send recv isend irecv init_remote from_remote_init reduce gather_and_stack "
            "all_gather broadcast scatter"
        ).split()
    ),
]


def _doc_with_class(obj: object, owner: object) -> str:
    """The docstring of ``obj``, or of the class that defines it when it is a group's method
    (a mixin such as ``Distributed``; never ``owner`` itself, whose class example shows none
    of its methods)."""
    doc = inspect.getdoc(obj) or ""
    if ">>> " in doc or not inspect.isclass(owner):
        return doc
    name = getattr(obj, "__name__", "")
    for base in inspect.getmro(owner):
        if name in vars(base):
            return doc if base is owner else doc + (inspect.getdoc(base) or "")
    return doc


@pytest.mark.parametrize("name", EXAMPLES)
def test_public_names_have_examples(name: str) -> None:
    obj: object = tensordict_rs
    owner: object = None
    for part in name.split("."):
        owner, obj = obj, getattr(obj, part)
    doc = _doc_with_class(obj, owner)
    assert ">>> " in doc, f"{name} has no example in its docstring"


def test_every_public_name_has_an_example() -> None:
    """Every public method and property of TensorDict, not only those listed above."""
    missing = []
    for name, member in inspect.getmembers(tensordict_rs.TensorDict):
        static = inspect.getattr_static(tensordict_rs.TensorDict, name)
        if name.startswith("_") or not (callable(member) or isinstance(static, property)):
            continue
        shown = member if callable(member) else static
        if ">>> " not in _doc_with_class(shown, tensordict_rs.TensorDict):
            missing.append(name)
    assert missing == []


def test_every_public_method_has_a_docstring() -> None:
    missing = [
        name
        for name, member in inspect.getmembers(tensordict_rs.TensorDict)
        if not name.startswith("_") and callable(member) and not inspect.getdoc(member)
    ]
    assert missing == []


def recipes() -> list[tuple[str, str]]:
    text = README.read_text()
    start = text.index("\n## Recipes\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    return re.findall(r"```(python|bash)\n(.*?)```", section, flags=re.S)


def test_readme_recipes_run(tmp_path: Path) -> None:
    blocks = recipes()
    assert [lang for lang, _ in blocks].count("python") >= 4 and blocks[-1][0] == "bash"
    env = {**os.environ, "TENSORDICT_RS_NO_PROGRESS": "1"}
    for lang, code in blocks:
        if lang == "python":  # as a script, so that ``if __name__ == "__main__"`` blocks run
            (tmp_path / "recipe.py").write_text(code)
            cmd = [sys.executable, "recipe.py"]
        else:
            alias = f'tensordict-rs() {{ "{sys.executable}" -m tensordict_rs "$@"; }}\n'
            cmd = ["bash", "-euo", "pipefail", "-c", alias + code]
        out = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, f"this README recipe failed:\n{code}\n{out.stderr}"
    assert (tmp_path / "dataset-copy" / "meta.json").is_file()
    assert (tmp_path / "model-again.tdz").is_file()
    assert json.loads((tmp_path / "dataset.json").read_text())["leaves"] == 2
