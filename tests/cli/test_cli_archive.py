"""The command line with ``.tdz`` archives: info, verify, copy and convert, through subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import safetensors.torch
import tensordict
import torch
from tensordict_rs import TensorDict

from ._cli_helpers import cli, sample


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    path = tmp_path / "td.tdz"
    sample().memmap(path)
    assert path.is_file()
    return path


def same(a: TensorDict, b: TensorDict) -> bool:
    return repr(a) == repr(b) and bool((a == b).all()) and a["label"] == b["label"]


def test_info_of_an_archive_equals_the_directory_form(tmp_path: Path, archive: Path) -> None:
    sample().memmap(tmp_path / "dir")
    of_archive = json.loads(cli("info", str(archive), "--json").stdout)
    of_dir = json.loads(cli("info", str(tmp_path / "dir"), "--json").stdout)
    assert of_archive["repr"] == repr(TensorDict.load_memmap(archive))
    assert of_archive["nbytes"] == 40 * 4 + 10 + 60 * 2
    assert of_archive["leaves"] == 4 and of_archive["sub_trees"] == 2
    assert of_archive["format_version"] == 1
    of_archive.pop("path"), of_dir.pop("path")
    assert of_archive == of_dir
    text = cli("info", str(archive))
    assert text.returncode == 0 and "4 tensors, 2 sub-trees; 290 B" in text.stdout


def test_info_of_a_reference_archive(tmp_path: Path) -> None:
    """An archive written by tensordict 0.15.3 (deflated too) is summarized like ours."""
    ref = tensordict.TensorDict(
        {"a": torch.rand(5, 3), "b": {"c": torch.zeros(5, dtype=torch.int64)}}, [5]
    )
    for name, kwargs in (("stored.tdz", {}), ("deflated.tdz", {"compression": "deflate"})):
        path = tmp_path / name
        ref.memmap(path, **kwargs)
        out = cli("info", str(path), "--json")
        assert out.returncode == 0, out.stderr
        info = json.loads(out.stdout)
        assert info["nbytes"] == ref["a"].nbytes + ref["b", "c"].nbytes
        assert info["repr"] == repr(TensorDict.load_memmap(path))


def test_info_and_verify_of_damaged_archives(tmp_path: Path, archive: Path) -> None:
    # A flipped data byte: info reads meta.json entries only and still answers; verify finds it.
    bad = tmp_path / "bad.tdz"
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as z:
        info = z.getinfo("obs.memmap")
    at = info.header_offset
    name_len, extra_len = (int.from_bytes(data[at + i : at + i + 2], "little") for i in (26, 28))
    data[at + 30 + name_len + extra_len + 1] ^= 0xFF  # a byte of the local header's data
    bad.write_bytes(bytes(data))
    assert cli("info", str(bad)).returncode == 0
    out = cli("verify", str(archive), str(bad), "--json")
    assert out.returncode == 1
    report = json.loads(out.stdout)
    assert report["results"][0] == {"path": str(archive), "ok": True, "problems": []}
    problems = report["results"][1]["problems"]
    assert problems and any("obs.memmap" in p and "CRC" in p for p in problems)
    # A truncated archive: unreadable as a tree (1), named in the message.
    cut = tmp_path / "cut.tdz"
    cut.write_bytes(archive.read_bytes()[:100])
    out = cli("info", str(cut))
    assert out.returncode == 1 and "cut.tdz" in out.stderr
    assert cli("verify", str(cut)).returncode == 1
    assert cli("verify", str(archive)).stdout.strip() == f"{archive}: OK"


@pytest.mark.parametrize(
    ("src_kind", "dst_kind"), [("dir", "tdz"), ("tdz", "dir"), ("tdz", "tdz")]
)  # directory to directory: cli/test_cli.py
def test_copy_between_directories_and_archives(
    tmp_path: Path, src_kind: str, dst_kind: str
) -> None:
    src = tmp_path / ("src.tdz" if src_kind == "tdz" else "src")
    dst = tmp_path / ("dst.tdz" if dst_kind == "tdz" else "dst")
    sample().memmap(src)
    out = cli("copy", str(src), str(dst), "--durable")
    assert out.returncode == 0, out.stderr
    assert dst.is_file() == (dst_kind == "tdz")
    assert same(TensorDict.load_memmap(dst), TensorDict.load_memmap(src))
    assert cli("verify", str(dst)).returncode == 0
    # The reference reads what was written, in either form.
    ref = tensordict.TensorDict.load_memmap(dst)
    assert torch.equal(ref["next", "deep", "x"], sample()["next", "deep", "x"])
    again = cli("copy", str(src), str(dst))
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert cli("copy", str(src), str(dst), "--overwrite").returncode == 0
    leftovers = {p.name for p in tmp_path.iterdir()} - {src.name, dst.name}
    assert leftovers == set()  # no staging file or directory left beside them


def test_copy_refuses_what_it_cannot_write(tmp_path: Path, archive: Path) -> None:
    # A path that exists is what it is: a file there that is no archive is not replaced.
    (tmp_path / "x.tdz").write_bytes(b"junk")
    out = cli("copy", str(archive), str(tmp_path / "x.tdz"), "--overwrite")
    assert out.returncode == 2 and "neither a tensordict archive" in out.stderr
    assert (tmp_path / "x.tdz").read_bytes() == b"junk"
    out = cli("copy", str(archive), str(tmp_path / "w.safetensors"))
    assert out.returncode == 2 and "convert" in out.stderr
    (tmp_path / "junk").write_bytes(b"not a zip")
    out = cli("copy", str(tmp_path / "junk"), str(tmp_path / "d"))
    assert out.returncode == 2 and "junk" in out.stderr
    assert not (tmp_path / "d").exists()


def test_convert_any_way(tmp_path: Path, archive: Path) -> None:
    weights = tmp_path / "w.safetensors"
    out = cli("convert", str(archive), str(weights))
    assert out.returncode == 0, out.stderr
    flat = safetensors.torch.load_file(weights)
    assert sorted(flat) == ["empty", "next.deep.x", "next.done", "obs"]
    assert torch.equal(flat["obs"], sample()["obs"])
    back = tmp_path / "back.tdz"
    out = cli("convert", str(weights), str(back))
    assert out.returncode == 0, out.stderr
    assert back.is_file() and same(TensorDict.load_memmap(back), TensorDict.load_memmap(archive))
    as_dir = tmp_path / "as_dir"
    assert cli("convert", str(back), str(as_dir)).returncode == 0
    assert as_dir.is_dir() and same(TensorDict.load_memmap(as_dir), TensorDict.load_memmap(archive))
    again = tmp_path / "again.tdz"
    assert cli("convert", str(as_dir), str(again)).returncode == 0
    assert same(TensorDict.load_memmap(again), TensorDict.load_memmap(archive))
    out = cli("convert", str(weights), str(tmp_path / "w2.safetensors"))
    assert out.returncode == 2 and "nothing to convert" in out.stderr
    assert cli("convert", str(tmp_path / "nope"), str(tmp_path / "x")).returncode == 2


def test_archive_info_and_verify_without_torch(archive: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # any import of torch now fails
        import tensordict_rs.cli
        for args in (["info", {str(archive)!r}], ["info", "--json", {str(archive)!r}],
                     ["verify", {str(archive)!r}], ["verify", "--json", {str(archive)!r}]):
            assert tensordict_rs.cli.main(args) == 0, args
        print("no torch")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("no torch")


def test_copy_progress_to_an_archive(tmp_path: Path) -> None:
    TensorDict({"x": torch.rand(2**19)}, []).memmap(tmp_path / "src")
    env = {k: v for k, v in os.environ.items() if k != "TENSORDICT_RS_NO_PROGRESS"}
    out = subprocess.run(
        [sys.executable, "-m", "tensordict_rs", "copy", str(tmp_path / "src"),
         str(tmp_path / "dst.tdz"), "--progress"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "100%" in out.stderr and "2.00M" in out.stderr
    assert same_tensor(tmp_path / "dst.tdz", tmp_path / "src")


def same_tensor(a: Path, b: Path) -> bool:
    return torch.equal(TensorDict.load_memmap(a)["x"], TensorDict.load_memmap(b)["x"])


def test_an_empty_separator_is_a_usage_error(tmp_path: Path, archive: Path) -> None:
    """`convert --separator ''` exited 1 (a problem with the data) instead of 2 (usage), and
    wrote nothing either way."""
    out = cli("convert", str(archive), str(tmp_path / "w.safetensors"), "--separator", "")
    assert out.returncode == 2 and "separator" in out.stderr, out.stderr
    assert not (tmp_path / "w.safetensors").exists()
