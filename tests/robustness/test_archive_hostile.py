"""`.tdz` archives that must not load: a table of hostile and damaged archives (truncated,
overlapping entries, bad offsets, names that escape, zip bombs, wrong CRCs, lying local
headers), random corruption, and the parse-ahead of meta.json entries; built byte by byte.
"""

from __future__ import annotations

import json
import random
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch


def local(
    name: bytes, data: bytes, *, method: int = 0, crc: int | None = None, size: int | None = None
) -> bytes:
    crc = zlib.crc32(data) if crc is None else crc
    size = len(data) if size is None else size
    head = struct.pack(
        "<4s5H3I2H", b"PK\x03\x04", 20, 0, method, 0, 33, crc, len(data), size, len(name), 0
    )
    return head + name + data


def central(
    name: bytes,
    data: bytes,
    offset: int,
    *,
    method: int = 0,
    crc: int | None = None,
    size: int | None = None,
    flags: int = 0,
) -> bytes:
    crc = zlib.crc32(data) if crc is None else crc
    size = len(data) if size is None else size
    head = struct.pack(
        "<4s6H3I5H2I",
        b"PK\x01\x02",
        20,
        20,
        flags,
        method,
        0,
        33,
        crc,
        len(data),
        size,
        len(name),
        0,
        0,
        0,
        0,
        0,
        offset,
    )
    return head + name


def eocd(count: int, size: int, offset: int) -> bytes:
    return struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, count, count, size, offset, 0)


def build(entries: list[dict[str, Any]], *, offsets: dict[int, int] | None = None) -> bytes:
    """A zip from entries {name, data, [stored_as], [method], [crc], [size]}, with override
    of central offsets (entry index -> header offset)."""
    body, cd, at = b"", b"", []
    for e in entries:
        at.append(len(body))
        stored = e.get("stored_as", e["data"])
        body += local(
            e["name"],
            stored,
            method=e.get("method", 0),
            crc=e.get("crc", zlib.crc32(e["data"])),
            size=e.get("size", len(e["data"])),
        )
    for i, e in enumerate(entries):
        stored = e.get("stored_as", e["data"])
        offset = (offsets or {}).get(i, at[i])
        cd += central(
            e["name"],
            stored,
            offset,
            method=e.get("method", 0),
            crc=e.get("crc", zlib.crc32(e["data"])),
            size=e.get("size", len(e["data"])),
            flags=e.get("flags", 0),
        )
    return body + cd + eocd(len(entries), len(cd), len(body))


META = json.dumps(
    {
        "a": {"device": "cpu", "shape": [4], "dtype": "torch.float32", "is_nested": False},
        "shape": [4],
        "device": "cpu",
        "_type": "<class 'tensordict._td.TensorDict'>",
        "_format_version": 1,
        "_class": "tensordict:TensorDict",
    }
).encode()
DATA = struct.pack("<4f", 1, 2, 3, 4)


def good() -> list[dict[str, Any]]:
    return [{"name": b"meta.json", "data": META}, {"name": b"a.memmap", "data": DATA}]


def deflated(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def overlapping() -> bytes:
    # meta.json's stored data covers a.memmap's local header and data: the classic overlap
    inner = local(b"a.memmap", DATA)
    meta_and_pad = META + b" " * 3
    blob = meta_and_pad + inner
    outer = local(b"meta.json", blob)
    meta_at, inner_at = 0, len(outer) - len(inner)
    cd = central(b"meta.json", blob, meta_at) + central(b"a.memmap", DATA, inner_at)
    return outer + cd + eocd(2, len(cd), len(outer))


def local_renamed() -> bytes:
    # the central directory says a.memmap, the local header says b.memmap
    blob = bytearray(build(good()))
    at = blob.index(b"a.memmap")  # the first occurrence is the local header's
    blob[at] = ord("b")
    return bytes(blob)


def local_method_differs() -> bytes:
    blob = bytearray(build(good()))
    at = blob.index(b"PK\x03\x04", 1)  # a.memmap's local header
    blob[at + 8] = 8  # deflate, where the directory says stored
    return bytes(blob)


def stored_past_the_end() -> bytes:
    # a.memmap's record claims 4096 bytes: its data would run into the central directory
    first, second = local(b"meta.json", META), local(b"a.memmap", DATA)
    cd = central(b"meta.json", META, 0) + central(b"a.memmap", b"\0" * 4096, len(first))
    return first + second + cd + eocd(2, len(cd), len(first) + len(second))


def too_many_entries() -> bytes:
    blob = bytearray(build(good()))
    struct.pack_into("<2H", blob, len(blob) - 22 + 8, 900, 900)
    return bytes(blob)


def hostile_cases() -> dict[str, tuple[bytes, str]]:
    valid = build(good())
    bomb = deflated(b"\0" * (4 << 20))
    cases = {
        "empty file": (b"", "too short"),
        "not a zip": (b"x" * 100, "not a zip"),
        "truncated end": (valid[:-5], "not a zip"),
        "truncated middle": (valid[: len(valid) // 2] + valid[-22:], "central directory"),
        "garbage before": (b"junk" + valid, "central directory"),
        "overlapping entries": (overlapping(), "overlap"),
        "offset past the file": (build(good(), offsets={1: 10**6}), "no local header"),
        "offset into another entry": (build(good(), offsets={1: 7}), "no local header"),
        "dotdot name": (build([*good(), {"name": b"../evil", "data": b"x"}]), "escape"),
        "dotdot in the middle": (build([*good(), {"name": b"x/../../e", "data": b"x"}]), "escape"),
        "absolute name": (build([*good(), {"name": b"/etc/passwd", "data": b"x"}]), "escape"),
        "backslash name": (build([*good(), {"name": b"..\\evil", "data": b"x"}]), "escape"),
        "duplicate names": (build([*good(), {"name": b"a.memmap", "data": DATA}]), "twice"),
        "missing leaf": (build(good()[:1]), "missing"),
        "missing meta.json": (build(good()[1:]), "meta.json is missing"),
        "short leaf": (build([good()[0], {"name": b"a.memmap", "data": DATA[:8]}]), "truncated"),
        "bad meta CRC": (build([{"name": b"meta.json", "data": META, "crc": 1}, good()[1]]), "CRC"),
        "stored sizes differ": (
            build([good()[0], {"name": b"a.memmap", "data": DATA, "size": 99}]),
            "sizes differ",
        ),
        "deflate bomb (declared size)": (
            build(
                [
                    good()[0],
                    {
                        "name": b"a.memmap",
                        "data": b"\0" * 16,
                        "stored_as": deflated(b"\0" * 16),
                        "method": 8,
                        "size": 0xFFFF_FFF0,
                    },
                ]
            ),
            "zip bomb",
        ),
        "deflate stream longer than declared": (
            build(
                [
                    good()[0],
                    {
                        "name": b"a.memmap",
                        "data": DATA,
                        "stored_as": bomb,
                        "method": 8,
                        "size": 16,
                        "crc": zlib.crc32(DATA),
                    },
                ]
            ),
            "deflate",
        ),
        "deflate garbage": (
            build(
                [
                    good()[0],
                    {"name": b"a.memmap", "data": DATA, "stored_as": b"\xff" * 20, "method": 8},
                ]
            ),
            "deflate",
        ),
        "bad CRC of a compressed leaf": (
            build(
                [
                    good()[0],
                    {
                        "name": b"a.memmap",
                        "data": DATA,
                        "stored_as": deflated(DATA),
                        "method": 8,
                        "crc": 5,
                    },
                ]
            ),
            "CRC",
        ),
        "drive letter name": (build([*good(), {"name": b"C:/evil", "data": b"x"}]), "escape"),
        "NUL in a name": (build([*good(), {"name": b"a\0.memmap", "data": b"x"}]), "escape"),
        "local header names another file": (local_renamed(), "names another file"),
        "local method differs": (local_method_differs(), "method differs"),
        "stored data past the entries": (stored_past_the_end(), "runs past"),
        "more entries than the directory holds": (too_many_entries(), "too small"),
        "meta.json not JSON": (
            build([{"name": b"meta.json", "data": b"{nope"}, good()[1]]),
            "JSON",
        ),
    }
    # zip64 records that point nowhere
    z64 = bytearray(valid)
    cd_end = len(z64) - 22
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, 10**9, 1)
    cases["zip64 locator to nowhere"] = (
        bytes(z64[:cd_end]) + locator + bytes(z64[cd_end:]),
        "zip64",
    )
    return cases


CASES = hostile_cases()


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_archive_is_refused(case: str, tmp_path: Path) -> None:
    import tensordict_rs
    from tensordict_rs import TensorDict

    data, message = CASES[case]
    path = tmp_path / "hostile.tdz"
    path.write_bytes(data)
    with pytest.raises(tensordict_rs.InvalidDirectoryError, match=message) as info:
        TensorDict.load_memmap(path)
    assert str(path) in str(info.value)
    assert tensordict_rs.verify(path)  # verify reports it too, without raising


def test_hostile_errors_name_the_entry(tmp_path: Path) -> None:
    import tensordict_rs
    from tensordict_rs import TensorDict

    path = tmp_path / "h.tdz"
    path.write_bytes(CASES["short leaf"][0])
    with pytest.raises(tensordict_rs.InvalidDirectoryError, match=r"h\.tdz::a\.memmap"):
        TensorDict.load_memmap(path)


def test_the_builder_makes_valid_archives(tmp_path: Path) -> None:
    # the hostile table's baseline: the same builder's unmodified archive loads
    from tensordict_rs import TensorDict

    path = tmp_path / "ok.tdz"
    path.write_bytes(build(good()))
    assert TensorDict.load_memmap(path)["a"].tolist() == [1, 2, 3, 4]  # unaligned: copied
    with pytest.raises(RuntimeError, match=r"a\.memmap' is not aligned"):
        TensorDict.load_memmap(path, mode="r+")
    path.write_bytes(
        build(
            [
                good()[0],
                {"name": b"a.memmap", "data": DATA, "stored_as": deflated(DATA), "method": 8},
            ]
        )
    )
    assert TensorDict.load_memmap(path)["a"].tolist() == [1, 2, 3, 4]
    with pytest.raises(RuntimeError, match=r"a\.memmap' is compressed"):
        TensorDict.load_memmap(path, mode="r+")


def test_meta_json_parsed_ahead_fails_only_where_the_tree_reaches(tmp_path: Path) -> None:
    # with many meta.json entries the loader parses them ahead, in parallel: a bad one the
    # tree reaches still fails naming it; a stray one it never reaches does not matter
    import tensordict_rs
    from tensordict_rs import TensorDict

    td = TensorDict({f"g{i}": {"x": torch.full((2,), float(i))} for i in range(24)}, [2])
    td.memmap(tmp_path / "dir")

    def pack(name: str, extra: dict[str, bytes]) -> Path:
        out = tmp_path / name
        with zipfile.ZipFile(out, "w") as zf:
            for f in sorted((tmp_path / "dir").rglob("*")):
                if f.is_file():
                    rel = f.relative_to(tmp_path / "dir").as_posix()
                    zf.writestr(rel, extra.get(rel, f.read_bytes()))
            for rel, data in extra.items():
                if not (tmp_path / "dir" / rel).exists():
                    zf.writestr(rel, data)
        return out

    stray = pack("stray.zip", {"stray/meta.json": b"{nope"})
    assert TensorDict.load_memmap(stray)["g23", "x"].tolist() == [23.0, 23.0]
    bad = pack("bad.zip", {"g7/meta.json": b"{nope"})
    with pytest.raises(tensordict_rs.InvalidDirectoryError, match=r"bad\.zip::g7/meta\.json"):
        TensorDict.load_memmap(bad)


def test_encrypted_entries_are_unsupported(tmp_path: Path) -> None:
    import tensordict_rs
    from tensordict_rs import TensorDict

    path = tmp_path / "enc.tdz"
    path.write_bytes(build([good()[0], {**good()[1], "flags": 1}]))
    with pytest.raises(tensordict_rs.UnsupportedFormatError, match="encrypted"):
        TensorDict.load_memmap(path)


def test_random_corruption_never_loads_wrong_data(tmp_path: Path) -> None:
    import tensordict_rs
    from tensordict_rs import TensorDict

    td = TensorDict({"a": torch.arange(64.0), "n": {"b": torch.arange(16)}}, [])
    td.memmap(tmp_path / "x.tdz", compression="deflate")
    original = (tmp_path / "x.tdz").read_bytes()
    rng = random.Random(7)
    path = tmp_path / "c.tdz"
    for _ in range(300):
        data = bytearray(original)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        try:
            loaded = TensorDict.load_memmap(path)
        except (tensordict_rs.TensorDictError, OSError):
            continue
        # anything that loads must have the saved values (meta.json and payloads are CRC-checked)
        assert torch.equal(loaded["a"], td["a"]) and torch.equal(loaded["n", "b"], td["n", "b"])


def test_zip64_archive_with_more_than_65535_entries(tmp_path: Path) -> None:
    import tensordict_rs
    from tensordict_rs import TensorDict

    n = 66_000
    td = TensorDict({f"k{i}": torch.tensor([i], dtype=torch.int32) for i in range(n)}, [1])
    td.memmap(tmp_path / "big.tdz")
    with zipfile.ZipFile(tmp_path / "big.tdz") as zf:
        assert len(zf.infolist()) == n + 1
        assert zf.read("k65999.memmap") == struct.pack("<i", 65999)
    data = (tmp_path / "big.tdz").read_bytes()
    assert data.rfind(b"PK\x06\x06") > 0 and data.rfind(b"PK\x06\x07") > 0  # zip64 records
    loaded = TensorDict.load_memmap(tmp_path / "big.tdz")
    assert loaded["k65999"].item() == 65999 and loaded["k0"].item() == 0
    assert tensordict_rs.verify(tmp_path / "big.tdz") == []
