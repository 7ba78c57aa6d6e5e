"""The typed usage program (``tests/core/typing_usage.py``, checked by ``mypy --strict`` in
``make lint``) also runs: its type assertions describe code that works."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import tensordict_rs


def test_typing_usage_runs(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location(
        "typing_usage", Path(__file__).with_name("typing_usage.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "ok" and '"ok": true' in lines[0]  # the verify command's JSON


def test_py_typed_is_shipped() -> None:
    assert (Path(tensordict_rs.__file__).parent / "py.typed").is_file()
