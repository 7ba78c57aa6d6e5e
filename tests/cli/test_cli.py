"""The ``tensordict-rs`` command line, run as a subprocess; JSON output parsed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tensordict
import torch
from tensordict_rs import TensorDict

from ._cli_helpers import cli, sample


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "td"
    sample().memmap(path)
    return path


def test_info_json_matches_the_loaded_tree(saved: Path) -> None:
    out = cli("info", str(saved), "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    loaded = TensorDict.load_memmap(saved)
    assert info["repr"] == repr(loaded)
    assert info["format_version"] == 1
    leaves = list(loaded.values(include_nested=True, leaves_only=True))
    tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
    assert info["leaves"] == len(tensors) == 4
    assert info["nbytes"] == sum(t.nbytes for t in tensors) == 40 * 4 + 10 + 60 * 2
    assert info["sub_trees"] == 2
    tree = info["tree"]
    assert tree["batch_size"] == [10] and tree["device"] == "cpu"
    assert tree["entries"]["obs"] == {
        "kind": "tensor",
        "dtype": "torch.float32",
        "shape": [10, 4],
        "nbytes": 160,
    }
    nxt = tree["entries"]["next"]
    assert nxt["kind"] == "tensordict" and nxt["nbytes"] == 10 + 120 and nxt["leaves"] == 2
    assert nxt["entries"]["deep"]["batch_size"] == [10, 3]
    assert nxt["entries"]["deep"]["entries"]["x"]["dtype"] == "torch.int16"
    assert tree["entries"]["label"] == {"kind": "non_tensor", "value": "hello"}
    assert tree["entries"]["empty"]["nbytes"] == 0


def test_info_text(saved: Path) -> None:
    out = cli("info", str(saved))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert repr(TensorDict.load_memmap(saved)) in text
    assert "format version 1; 4 tensors, 2 sub-trees; 290 B (290 bytes)" in text
    table = text.split("\n\n", 1)[1].splitlines()
    rows = {line.split()[-1]: line.split() for line in table if "/  (" not in line}
    assert rows["obs"][:4] == ["160", "B", "float32", "[10,"]
    assert rows["next/deep/x"][:3] == ["120", "B", "int16"]
    assert any(
        "next/  (2 leaves)" in line and line.split()[0] == "130" for line in text.splitlines()
    )
    assert 'label = "hello"' in text


def test_info_of_a_reference_directory(tmp_path: Path) -> None:
    """A tree written by tensordict 0.15.3 is summarized like ours."""
    path = tmp_path / "ref"
    ref = tensordict.TensorDict(
        {"a": torch.rand(5, 3), "b": {"c": torch.zeros(5, dtype=torch.int64)}}, [5]
    )
    ref.memmap(path)
    info = json.loads(cli("info", str(path), "--json").stdout)
    assert info["nbytes"] == ref["a"].nbytes + ref["b", "c"].nbytes
    assert info["repr"] == repr(TensorDict.load_memmap(path))
    assert info["tree"]["entries"]["b"]["entries"]["c"]["shape"] == [5]


def test_info_errors(tmp_path: Path, saved: Path) -> None:
    missing = cli("info", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "nope" in missing.stderr
    (saved / "meta.json").write_text("{not json")
    bad = cli("info", str(saved))
    assert bad.returncode == 1 and "meta.json" in bad.stderr and "JSON" in bad.stderr
    assert cli("info").returncode == 2  # usage


def test_verify_exit_codes_and_json(tmp_path: Path, saved: Path) -> None:
    clean = cli("verify", str(saved), "--json")
    assert clean.returncode == 0
    assert json.loads(clean.stdout) == {
        "ok": True,
        "results": [{"path": str(saved), "ok": True, "problems": []}],
    }
    assert cli("verify", str(saved)).stdout.strip() == f"{saved}: OK"

    other = tmp_path / "other"
    sample().memmap(other)
    os.truncate(other / "obs.memmap", 3)
    (other / "next" / "done.memmap").unlink()
    out = cli("verify", str(saved), str(other), "--json")
    assert out.returncode == 1
    report = json.loads(out.stdout)
    assert report["ok"] is False
    assert report["results"][0]["ok"] is True
    problems = report["results"][1]["problems"]
    assert len(problems) == 2
    assert any("truncated" in p and "obs" in p for p in problems)
    assert any("missing" in p and "done" in p for p in problems)
    text = cli("verify", str(other))
    assert text.returncode == 1 and "2 problem(s)" in text.stdout

    gone = cli("verify", str(saved), str(tmp_path / "nope"), "--json")
    assert gone.returncode == 2
    assert json.loads(gone.stdout)["results"][1]["error"] == "no such file or directory"
    assert cli("verify").returncode == 2  # usage: argparse


def test_copy_is_a_whole_new_tree(tmp_path: Path, saved: Path) -> None:
    dst = tmp_path / "copy"
    out = cli("copy", str(saved), str(dst), "--durable")
    assert out.returncode == 0, out.stderr
    copied = TensorDict.load_memmap(dst)
    original = TensorDict.load_memmap(saved)
    assert repr(copied) == repr(original)
    assert (copied == original).all()
    assert copied["label"] == "hello"
    assert cli("verify", str(dst)).returncode == 0
    # the copy owns its files: writing it leaves the source as it was
    copied["obs"][0, 0] = -1
    copied.flush()
    assert TensorDict.load_memmap(saved)["obs"][0, 0] == 0

    again = cli("copy", str(saved), str(dst))
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert TensorDict.load_memmap(dst)["obs"][0, 0] == -1
    assert cli("copy", str(saved), str(dst), "--overwrite").returncode == 0
    assert TensorDict.load_memmap(dst)["obs"][0, 0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "td"]  # no staging left


def test_copy_of_a_damaged_tree_fails_and_writes_nothing(tmp_path: Path, saved: Path) -> None:
    os.truncate(saved / "obs.memmap", 3)
    dst = tmp_path / "copy"
    out = cli("copy", str(saved), str(dst))
    assert out.returncode == 1 and "truncated" in out.stderr
    assert not dst.exists()
    assert cli("copy", str(tmp_path / "nope"), str(dst)).returncode == 2


def test_cli_does_not_import_torch(saved: Path) -> None:
    """``import tensordict_rs.cli`` and ``info``/``verify`` never load torch."""
    code = textwrap.dedent(
        f"""
        import sys
        import tensordict_rs.cli
        import tensordict_rs.cli.info
        assert "torch" not in sys.modules, "torch was imported"
        sys.modules["torch"] = None  # any later import of torch now fails
        for args in (["info", {str(saved)!r}], ["info", "--json", {str(saved)!r}],
                     ["verify", {str(saved)!r}]):
            assert tensordict_rs.cli.main(args) == 0
        print("no torch")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("no torch")


def test_package_names_load_lazily() -> None:
    code = textwrap.dedent(
        """
        import sys
        import tensordict_rs
        assert "torch" not in sys.modules
        from tensordict_rs import TensorDict, MemoryMappedTensor, NonTensorData, verify
        assert "torch" in sys.modules
        assert tensordict_rs.TensorDict is TensorDict
        assert {"TensorDict", "verify"} <= set(dir(tensordict_rs))
        try:
            tensordict_rs.nope
        except AttributeError as err:
            assert "nope" in str(err)
        else:
            raise AssertionError("no AttributeError")
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_console_script(saved: Path) -> None:
    script = Path(sys.executable).parent / "tensordict-rs"
    if not script.exists():
        pytest.skip("the package is not installed with its scripts in this interpreter's prefix")
    out = subprocess.run([str(script), "verify", str(saved)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"{saved}: OK"


def _project_version(name: str) -> str:
    """The ``version = "..."`` line of the repository's pyproject.toml or Cargo.toml."""
    import tomllib

    data = tomllib.loads((Path(__file__).parents[2] / name).read_text())
    return str(data["project" if name == "pyproject.toml" else "package"]["version"])


def test_version_comes_from_the_package_metadata() -> None:
    import importlib.metadata

    import tensordict_rs

    installed = importlib.metadata.version("tensordict-rs")
    assert tensordict_rs.__version__ == installed
    # what is built is what the sources say: the wheel's metadata comes from pyproject.toml, and
    # the crate says the same version (one number for the Python package and the Rust core)
    assert installed == _project_version("pyproject.toml") == _project_version("Cargo.toml")


def test_version_option() -> None:
    out = cli("--version")
    assert out.returncode == 0, out.stderr
    import platform

    from tensordict_rs import __version__

    assert out.stdout.strip() == (
        f"tensordict-rs {__version__} (Python {platform.python_version()}, {sys.platform})"
    )
    # the version needs neither torch nor a subcommand
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any import of torch now fails
        import tensordict_rs.cli
        try:
            tensordict_rs.cli.main(["--version"])
        except SystemExit as exit:
            assert exit.code == 0, exit.code
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("tensordict-rs ")


def test_output_cut_short_by_its_reader_is_quiet(tmp_path: Path) -> None:
    """`tensordict-rs info TREE | head -1` ended with a BrokenPipeError traceback; it now stops
    quietly with a SIGPIPE's status (141), as other tools do."""
    TensorDict({f"k{i}": torch.zeros(2) for i in range(3000)}, [2]).memmap(tmp_path / "t")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensordict_rs", "info", str(tmp_path / "t")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away with most of the output unread
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
