"""Shared fixtures of the test suite.

``TDRS_START_METHOD=forkserver`` (or ``spawn``, ``fork``) makes that the process-wide default
start method (``multiprocessing.set_start_method(..., force=True)``) before any test runs, as
Python 3.14 does with forkserver on Linux: every ``mp.Process``, ``Queue``, ``Pool`` and
DataLoader that names no context then uses it. CI runs ``tests/share`` and the DataLoader tests
once that way (``.ci/run``).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()

# the smoke suite runs against an installed wheel in its own virtual environments (.ci/wheels)
collect_ignore = ["smoke"]

START_METHOD = os.environ.get("TDRS_START_METHOD", "").strip()
if START_METHOD:
    if START_METHOD not in multiprocessing.get_all_start_methods():
        raise pytest.UsageError(
            f"TDRS_START_METHOD={START_METHOD!r}: this platform has "
            f"{multiprocessing.get_all_start_methods()}"
        )
    multiprocessing.set_start_method(START_METHOD, force=True)


def pytest_report_header() -> str:
    """The default start method, on the header of every run (``fork`` on Linux before 3.14)."""
    return f"multiprocessing default start method: {START_METHOD or 'the platform default'}"


requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@pytest.fixture
def tmp_prefix(tmp_path: Path) -> Path:
    """A fresh, absolute directory path that does not exist yet (its parent does)."""
    path = tmp_path / "prefix"
    assert not path.exists()
    return path


@pytest.fixture(params=["cuda:0" if CUDA else "meta"])
def accel_device(request: pytest.FixtureRequest) -> torch.device:
    """The non-CPU device of the device tests: ``cuda:0`` when CUDA is available, else ``meta``.

    ``meta`` tensors have shapes and dtypes but no data, so every test that uses this fixture
    runs on a CPU-only machine too; copying out of ``meta`` raises ``NotImplementedError``.
    """
    return torch.device(request.param)


@pytest.fixture
def run_python(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs a Python snippet in a new interpreter (``sys.executable``) and returns the result.

    The snippet is dedented; a non-zero exit status fails the test with the child's stderr.
    The timeout (300 s) bounds a hung child, not a slow one: a new interpreter's first
    ``import torch`` in a fresh environment (the wheel smoke runs) reads 1.5 GB from disk, and
    a busy 2-CPU machine has taken over 60 s for it.
    """

    def run(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=tmp_path,
            env={**os.environ, "PYTHONWARNINGS": "error"},
        )
        assert result.returncode == 0, f"child failed:\n{result.stdout}\n{result.stderr}"
        return result

    return run
