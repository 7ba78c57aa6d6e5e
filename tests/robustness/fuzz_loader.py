"""Fuzzing of the loader: mutated meta.json bytes and data-file lengths of a small valid tree.

Oracle, for every input: ``TensorDict.load_memmap`` either

* raises a tensordict_rs exception, ``OSError``, ``ValueError`` or ``KeyError``; or
* succeeds, and then every leaf has exactly the dtype and shape its meta.json declares, its
  file holds at least that many bytes, every byte can be read (no SIGBUS), and no key that
  meta.json declares was silently dropped.

Anything else (another exception, a wrong-size tensor, a crash) is a finding.

Two drivers share the oracle:

* ``python fuzz_loader.py [libFuzzer flags] [corpus dir]``: coverage-guided, with atheris.
  Input layout: byte 0 picks the meta.json to replace, byte 1 the number ``m`` (mod 4) of
  data-file length changes, then ``m`` x 3 bytes (file, new length), then the meta.json bytes.
* ``python fuzz_loader.py --pure RUNS SEED``: a seeded mutation fuzzer in pure Python (bit
  flips, truncations, splices, random JSON values in fields, renamed/added/removed keys, file
  lengths), for machines without atheris.

The pure driver prints ``executions: N`` at the end, libFuzzer ``Done N runs``.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

warnings.simplefilter("error")
# torch warns once when a complex32 tensor is made; a mutated dtype may ask for one
warnings.filterwarnings("ignore", "ComplexHalf support is experimental", UserWarning)

if __name__ == "__main__" and sys.argv[1:2] != ["--pure"]:
    # coverage-guided run: instrument the Python side of the loader (the Rust core is not
    # instrumented; torch is left alone, instrumenting it takes minutes)
    import atheris

    with atheris.instrument_imports(include=["tensordict_rs"]):
        import tensordict_rs

import tensordict_rs  # noqa: E402
import torch  # noqa: E402
from tensordict_rs import TensorDict  # noqa: E402

ALLOWED = (tensordict_rs.TensorDictError, OSError, ValueError, KeyError)
RESERVED = {"shape", "device", "_type", "_class", "_format_version", "_names"}
ITEMSIZE = {
    f"torch.{n}": torch.empty((), dtype=getattr(torch, n)).element_size()
    for n in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    )
    if hasattr(torch, n)
}  # fmt: skip


def encode(key: str) -> str:
    """tensordict's file-name encoding of a key (reference document §1.7), written anew."""
    if key in ("", ".", ".."):
        return {"": "%", ".": "%2E", "..": "%2E%2E"}[key]
    special = set('/<>:"|?*\\ %')
    return "".join(
        f"%{ord(c):02X}" if c in special or ord(c) < 32 or ord(c) == 127 else c for c in key
    )


class Tree:
    """A small valid tree on disk, with its pristine bytes, restored before every input."""

    def __init__(self, root: Path) -> None:
        self.prefix = root / "tree"
        td = TensorDict(
            {
                "a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
                "b": torch.tensor([True, False, True]),
                "odd key/%": torch.arange(3, dtype=torch.int16),
                "e": torch.empty(3, 0),
                "n": {
                    "x": torch.ones(3, 2, dtype=torch.float64),
                    "deep": {"y": torch.arange(3, dtype=torch.int64), "z": torch.zeros(3, 1, 2)},
                },
            },
            [3],
        )
        td["s"] = "hello"
        td.memmap_(self.prefix)
        del td
        self.metas: list[str] = []
        self.datas: list[str] = []
        self.pristine: dict[str, bytes] = {}
        for dirpath, _, files in sorted(os.walk(self.prefix)):
            for name in sorted(files):
                rel = os.path.relpath(os.path.join(dirpath, name), self.prefix)
                (self.metas if name == "meta.json" else self.datas).append(rel)
                self.pristine[rel] = (self.prefix / rel).read_bytes()
        self.dirty: set[str] = set()

    def _write(self, rel: str, data: bytes) -> None:
        fd = os.open(self.prefix / rel, os.O_WRONLY)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def apply(self, meta_index: int, meta: bytes, lengths: list[tuple[int, int]]) -> None:
        """Restores what the last input changed, then writes this input's changes."""
        for rel in self.dirty:
            self._write(rel, self.pristine[rel])
        rel = self.metas[meta_index % len(self.metas)]
        self._write(rel, meta)
        self.dirty = {rel}
        for file_index, length in lengths:
            rel = self.datas[file_index % len(self.datas)]
            os.truncate(self.prefix / rel, length)
            self.dirty.add(rel)


class Finding(AssertionError):
    pass


def check(prefix: Path) -> bool:
    """Runs the oracle once; True when the load succeeded."""
    try:
        td = TensorDict.load_memmap(prefix)
    except ALLOWED:
        return False
    check_loaded(td, prefix)
    return True


def check_loaded(td: TensorDict, directory: Path) -> None:
    raw = (directory / "meta.json").read_bytes()
    try:
        meta = json.loads(raw)
    except ValueError as err:
        raise Finding(
            f"{directory}: loaded, but meta.json is not JSON ({err}): {raw[:200]!r}"
        ) from err
    if not isinstance(meta, dict):
        raise Finding(f"{directory}: loaded a meta.json that is not an object")
    if list(td.batch_size) != meta.get("shape", []):
        raise Finding(
            f"{directory}: batch size {td.batch_size} but meta.json says {meta.get('shape')}"
        )
    declared = {k: v for k, v in meta.items() if k not in RESERVED and isinstance(v, dict)}
    loaded = set(td.keys())
    if loaded != set(declared):
        raise Finding(
            f"{directory}: keys {sorted(loaded)} but meta.json declares {sorted(declared)}"
        )
    for key, entry in declared.items():
        value = td.get(key)
        if "type" in entry:
            if isinstance(value, TensorDict):
                check_loaded(value, directory / encode(key))
            continue
        if not isinstance(value, torch.Tensor):
            raise Finding(f"{directory}: {key!r} declared as a leaf, loaded as {type(value)}")
        if str(value.dtype) != entry.get("dtype") or list(value.shape) != entry.get("shape"):
            raise Finding(
                f"{directory}: {key!r} loaded as {value.dtype}{list(value.shape)}, "
                f"declared {entry.get('dtype')}{entry.get('shape')}"
            )
        nbytes = value.numel() * ITEMSIZE[entry["dtype"]]
        if nbytes:
            size = os.lstat(directory / (encode(key) + ".memmap")).st_size
            if size < nbytes:
                raise Finding(f"{directory}: {key!r} needs {nbytes} bytes, its file has {size}")
            value.clone()  # reads every byte: a map past the end of the file would SIGBUS here
            if value.untyped_storage().nbytes() < nbytes:
                raise Finding(f"{directory}: {key!r} has a storage smaller than its shape")


# --------------------------------------------------------------------------- pure mutations

POOL: list[Any] = [
    None, True, False, 0, 1, -1, 3, 2**31, 2**63 - 1, 2**63, 2**64, 2**64 + 1, -(2**63), 10**30,
    1.5, -0.0, 1e308, 3.0, "", "torch.float32", "torch.bool", "torch.complex32", "torch.foo",
    "float32", "../x", "/etc/passwd", "..", "TensorDict", "NonTensorData", "cpu", "cuda:0",
    [], [3], [3, 4], [3, -1], [3, 2**40], [0, 2**64 - 1], [3, 0, 2**63], [3, 1.5], [[3]],
    ["3"], [3, 2**62, 2**62], {}, {"type": "TensorDict"}, {"type": "NonTensorData"},
    {"dtype": "torch.float32", "shape": [3]}, {"dtype": "torch.uint8", "shape": [3, 16]},
    {"dtype": "torch.float32", "shape": [3], "is_nested": True},
]  # fmt: skip
KEYS = ["a", "b", "x", "y", "n", "deep", "s", "e", "z", "..", ".", "", "../a", "/etc/passwd",
        "a.memmap", "meta.json", "odd key/%", "shape", "_type", "_class", "_format_version",
        "device", "type", "dtype", "is_nested", "new"]  # fmt: skip


def mutate_json(meta: Any, rng: random.Random) -> Any:
    if not isinstance(meta, dict) or rng.random() < 0.05:
        return rng.choice(POOL)
    meta = dict(meta)
    op = rng.randrange(5)
    key = rng.choice(list(meta) or ["new"])
    if op == 0:  # replace a whole entry
        meta[key] = rng.choice(POOL)
    elif op == 1 and isinstance(meta.get(key), dict):  # one field of an entry
        entry = dict(meta[key])
        entry[rng.choice(["dtype", "shape", "type", "is_nested", "device", rng.choice(KEYS)])] = (
            rng.choice(POOL)
        )
        meta[key] = entry
    elif op == 2:  # rename an entry (maybe to a hostile key)
        meta[rng.choice(KEYS)] = meta.pop(key, None)
    elif op == 3:  # remove one
        meta.pop(key, None)
    else:  # add one
        meta[rng.choice(KEYS)] = rng.choice(POOL)
    return meta


def mutate_bytes(data: bytes, others: list[bytes], rng: random.Random) -> bytes:
    buf = bytearray(data)
    op = rng.randrange(5)
    if op == 0 and buf:  # bit flips
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
    elif op == 1:  # truncation
        del buf[rng.randint(0, len(buf)) :]
    elif op == 2:  # splice from another file
        other = rng.choice(others)
        i, j = sorted(rng.randint(0, len(other)) for _ in range(2))
        at = rng.randint(0, len(buf))
        buf[at : at + rng.randint(0, j - i)] = other[i:j]
    elif op == 3 and buf:  # byte replacement with JSON-significant bytes
        for _ in range(rng.randint(1, 3)):
            buf[rng.randrange(len(buf))] = rng.choice(b'{}[]",:-.0123456789eE \\/\x00\xff')
    else:  # duplicate a chunk
        i, j = sorted(rng.randint(0, len(buf)) for _ in range(2))
        buf[j:j] = buf[i:j]
    return bytes(buf)


def scratch_root() -> str | None:
    """Where scratch trees go: in memory (/dev/shm) where possible, the fuzzer writes a lot."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def pure(runs: int, seed: int) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="tdrs-fuzz-", dir=scratch_root()) as tmp:
        print(f"scratch: {tmp}", flush=True)
        tree = Tree(Path(tmp))
        originals = [tree.pristine[m] for m in tree.metas]
        loaded = 0
        for run in range(runs):
            index = rng.randrange(len(tree.metas))
            meta = originals[index]
            for _ in range(rng.randint(1, 3)):
                if rng.random() < 0.5:
                    try:
                        value = json.loads(meta)
                    except ValueError:
                        value = {}
                    meta = json.dumps(mutate_json(value, rng)).encode()
                else:
                    meta = mutate_bytes(meta, originals, rng)
            lengths = []
            for _ in range(rng.choice([0, 0, 1, 2])):
                f = rng.randrange(len(tree.datas))
                n = len(tree.pristine[tree.datas[f]])
                lengths.append((f, rng.choice([0, 1, n - 1, n + 1, 2 * n, rng.randint(0, 2 * n)])))
            tree.apply(index, meta, lengths)
            try:
                loaded += check(tree.prefix)
            except BaseException:
                print(f"finding at execution {run + 1}: {tree.metas[index]} = {meta!r}")
                print(f"data file lengths changed: {[(tree.datas[f], n) for f, n in lengths]}")
                raise
        print(f"loads that succeeded: {loaded}")
        print(f"executions: {runs}")


# --------------------------------------------------------------------------- atheris


def atheris_main(argv: list[str]) -> None:
    import atheris

    # not a TemporaryDirectory: libFuzzer ends the process, and its implicit clean-up warns
    tmp = tempfile.mkdtemp(prefix="tdrs-fuzz-", dir=scratch_root())
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    print(f"scratch: {tmp}", flush=True)  # a crash skips atexit: the caller removes it then
    tree = Tree(Path(tmp))
    corpus = [a for a in argv[1:] if not a.startswith("-")]
    for directory in corpus:  # seeds: each meta.json unchanged, and with one short file
        if os.path.isfile(directory):
            continue  # a single input to replay
        os.makedirs(directory, exist_ok=True)
        for i, rel in enumerate(tree.metas):
            seed = bytes([i, 0]) + tree.pristine[rel]
            Path(directory, f"seed-{i}").write_bytes(seed)
            Path(directory, f"seed-{i}-short").write_bytes(
                bytes([i, 1, i, 0, 1]) + tree.pristine[rel]
            )

    def split(data: bytes) -> tuple[int, list[tuple[int, int]], bytes]:
        if len(data) < 2:
            return 0, [], b""
        meta_index, m = data[0], data[1] % 4
        lengths = []
        pos = 2
        for _ in range(m):
            if pos + 3 > len(data):
                break
            lengths.append((data[pos], int.from_bytes(data[pos + 1 : pos + 3], "little") % 400))
            pos += 3
        return meta_index, lengths, data[pos:]

    def join(meta_index: int, lengths: list[tuple[int, int]], meta: bytes) -> bytes:
        head = bytes([meta_index % 256, len(lengths)])
        for f, n in lengths:
            head += bytes([f % 256]) + n.to_bytes(2, "little")
        return head + meta

    originals = [tree.pristine[m] for m in tree.metas]

    def mutator(data: bytes, max_size: int, seed: int) -> bytes:
        """Structure-aware mutations (JSON values, keys, file lengths) half of the time."""
        rng = random.Random(seed)
        if rng.random() < 0.5:
            return atheris.Mutate(data, max_size)
        meta_index, lengths, meta = split(data)
        choice = rng.randrange(3)
        if choice == 0:
            try:
                value = json.loads(meta)
            except ValueError:
                value = json.loads(originals[meta_index % len(originals)])
            meta = json.dumps(mutate_json(value, rng)).encode()
        elif choice == 1:
            meta = mutate_bytes(meta, originals, rng)
        else:
            lengths = [*lengths[-2:], (rng.randrange(256), rng.randrange(400))]
        return join(meta_index, lengths, meta)[:max_size]

    def one_input(data: bytes) -> None:
        meta_index, lengths, meta = split(data)
        tree.apply(meta_index, meta, lengths)
        check(tree.prefix)

    atheris.instrument_func(check_loaded)
    atheris.Setup(argv, one_input, custom_mutator=mutator)
    atheris.Fuzz()  # libFuzzer ends the process and prints "Done N runs"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--pure":
        pure(int(sys.argv[2]), int(sys.argv[3]))
    else:
        atheris_main(sys.argv)
