"""The installed wheel: where it is imported from, its version, its dependencies, its command.

Run by ``.ci/wheels`` in a fresh virtual environment, from a directory outside the repository.
``TDRS_SMOKE_WHEEL`` names the wheel that was installed, ``TDRS_SMOKE_SOURCE`` the repository.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import sysconfig
from pathlib import Path

import tensordict_rs
import torch
from tensordict_rs import TensorDict

WHEEL = Path(os.environ["TDRS_SMOKE_WHEEL"])
SOURCE = Path(os.environ["TDRS_SMOKE_SOURCE"]).resolve()
SITE = {Path(sysconfig.get_path(key)).resolve() for key in ("purelib", "platlib")}
SCRIPT = Path(sys.executable).parent / "tensordict-rs"


def isolated() -> bool:
    """Whether this virtual environment sees no system site-packages (its pyvenv.cfg)."""
    cfg = (Path(sys.prefix) / "pyvenv.cfg").read_text()
    return "include-system-site-packages = false" in cfg


def test_the_installed_wheel_is_imported() -> None:
    assert sys.prefix != sys.base_prefix, "not a virtual environment"
    package = Path(tensordict_rs.__file__).resolve().parent
    assert package.parent in SITE, (package, SITE)
    native = Path(tensordict_rs._native.__file__).resolve()
    assert native.parent == package and native.name.endswith(".abi3.so"), native
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if name.startswith("tensordict_rs") and where:
            assert not Path(where).resolve().is_relative_to(SOURCE), (name, where)
    # installed from the wheel's file, not from a directory, not editable
    direct = json.loads(
        importlib.metadata.distribution("tensordict-rs").read_text("direct_url.json") or "{}"
    )
    assert direct.get("url") == WHEEL.resolve().as_uri(), direct
    assert "dir_info" not in direct, direct


def test_version_is_the_wheels() -> None:
    version = importlib.metadata.version("tensordict-rs")
    assert tensordict_rs.__version__ == version
    assert WHEEL.name.startswith(f"tensordict_rs-{version}-cp311-abi3-"), WHEEL.name


def test_declared_dependencies_are_installed() -> None:
    """Every plain requirement of the wheel is met here; tqdm came with it (no extra)."""
    requires = importlib.metadata.requires("tensordict-rs") or []
    plain = [r.split(";")[0].strip() for r in requires if "extra ==" not in r]
    names = {r.split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in plain}
    assert {"torch", "numpy", "tqdm"} <= names, plain
    for name in names:
        importlib.metadata.version(name)  # PackageNotFoundError if missing
    if isolated():
        import tqdm

        assert Path(tqdm.__file__).resolve().parent.parent in SITE, tqdm.__file__


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_console_script_version() -> None:
    assert SCRIPT.exists(), f"{SCRIPT}: the wheel's console script is not installed"
    expected = (
        f"tensordict-rs {tensordict_rs.__version__} "
        f"(Python {platform.python_version()}, {sys.platform})"
    )
    for command in ([str(SCRIPT), "--version"], [sys.executable, "-m", "tensordict_rs", "-h"]):
        out = run(*command)
        assert out.returncode == 0, out.stderr
    assert run(str(SCRIPT), "--version").stdout.strip() == expected


def test_console_script_copy_verify_info(tmp_path: Path) -> None:
    td = TensorDict(
        {"obs": torch.arange(4096.0).reshape(64, 64), "next": {"done": torch.zeros(64, 1).bool()}},
        [64],
    )
    td.memmap(tmp_path / "src")
    archive = tmp_path / "copy.tdz"
    out = run(str(SCRIPT), "copy", str(tmp_path / "src"), str(archive), "--progress")
    assert out.returncode == 0, out.stderr
    assert "100%" in out.stderr, out.stderr  # the bar, drawn by the tqdm pip installed
    out = run(str(SCRIPT), "verify", str(archive))
    assert out.returncode == 0 and out.stdout.strip() == f"{archive}: OK", out
    out = run(str(SCRIPT), "info", "--json", str(archive))
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["leaves"] == 2 and info["nbytes"] == 4096 * 4 + 64
    assert torch.equal(TensorDict.load_memmap(archive)["obs"], td["obs"])
