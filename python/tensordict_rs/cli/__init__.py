"""The ``tensordict-rs`` command (also ``python -m tensordict_rs``).

Trees are tensordict directories or ``.tdz`` archives (one zip file). ``info`` and ``verify``
read them without importing torch (the Rust core reads the meta.json files or entries);
``copy`` and ``convert`` go through the library's save path and import torch only when they
run. Exit status: 0 success, 1 problems found (or a directory that cannot be
read as a tree), 2 usage or I/O errors.

>>> main(["verify", "/nonexistent/dir"])
2
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import _native

if TYPE_CHECKING:
    import argparse

OK, PROBLEMS, USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    import argparse  # not for the plain ``info`` command: see ``_plain_info``

    parser = argparse.ArgumentParser(
        prog="tensordict-rs",
        description="Inspect, check, copy and convert tensordict memory-mapped directories "
        "and .tdz archives.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=version_line(),
        help="print the installed version (and its Python and platform) and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = sub.add_parser(
        "info", help="the tree, dtypes, shapes and byte sizes of a directory or .tdz archive"
    )
    info.add_argument("dir", metavar="path")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    check = sub.add_parser(
        "verify", help="check saved directories or .tdz archives without loading them"
    )
    check.add_argument("dirs", nargs="+", metavar="path")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    copy = sub.add_parser(
        "copy",
        help="re-save a tree atomically (the save path's guarantees), between directories "
        "and .tdz archives either way",
    )
    copy.add_argument("src", help="a tensordict directory or .tdz archive")
    copy.add_argument("dst", help="the directory or archive (a .tdz name) to write")
    copy.add_argument(
        "--progress", action="store_true", help="show a progress bar in bytes on stderr"
    )
    copy.add_argument("--durable", action="store_true", help="fsync everything before returning")
    copy.add_argument("--overwrite", action="store_true", help="replace an existing tree at dst")
    convert = sub.add_parser(
        "convert",
        help="between a directory, a .tdz archive and a .safetensors file (any way)",
    )
    convert.add_argument("src", help="a tensordict directory, .tdz archive or .safetensors file")
    convert.add_argument(
        "dst", help="what to write: a .safetensors or .tdz name, anything else a directory"
    )
    convert.add_argument(
        "--separator", default=".", help="joins nested keys into safetensors names (default '.')"
    )
    convert.add_argument("--overwrite", action="store_true", help="replace an existing dst")
    convert.add_argument(
        "--progress", action="store_true", help="show a progress bar in bytes on stderr"
    )
    sub.add_parser("demo", help="run the replay-buffer demo (see python -m tensordict_rs.demo -h)")
    return parser


def version_line() -> str:
    """``tensordict-rs X.Y.Z (Python A.B.C, platform)``: the version of the installed
    distribution, read from its metadata like ``tensordict_rs.__version__``, and the interpreter
    that runs it (a wheel serves every Python from 3.11 up; the line says which one this is).
    Torch is not imported for it."""
    import importlib.metadata
    import platform

    version = importlib.metadata.version("tensordict-rs")
    return f"tensordict-rs {version} (Python {platform.python_version()}, {sys.platform})"


def _error(message: str) -> None:
    print(f"tensordict-rs: {message}", file=sys.stderr)


def cmd_info(path: str, as_json: bool) -> int:
    """Prints what the directory or archive holds; 1 if it is not a readable tree, 2 on I/O
    errors."""
    from .info import report

    try:
        text = report(path, as_json)
    except OSError as err:
        _error(str(err))
        return USAGE
    except _native.TensorDictError as err:
        _error(str(err))
        return PROBLEMS
    print(text)
    return OK


def cmd_verify(dirs: Sequence[str], as_json: bool) -> int:
    """Checks each directory or archive (every CRC of an archive too); prints every problem.
    0 clean, 1 problems, 2 unreadable paths."""
    status = OK
    results = []
    for d in dirs:
        if not os.path.exists(d) or not (os.path.isdir(d) or os.path.isfile(d)):
            why = (
                "no such file or directory" if not os.path.exists(d) else "not a directory or file"
            )
            results.append({"path": d, "ok": False, "error": why, "problems": []})
            status = USAGE
            if not as_json:
                _error(f"{d}: {why}")
            continue
        if os.path.isfile(d):
            problems = _native.verify_archive(os.fspath(d))
        else:
            problems = _native.verify_tree(os.fspath(d))
        results.append({"path": d, "ok": not problems, "problems": problems})
        if problems:
            status = max(status, PROBLEMS)
        if not as_json:
            if problems:
                print(f"{d}: {len(problems)} problem(s)")
                for p in problems:
                    print(f"  - {p}")
            else:
                print(f"{d}: OK")
    if as_json:
        import json

        print(json.dumps({"ok": status == OK, "results": results}, ensure_ascii=False))
    return status


def _plain_info(argv: Sequence[str]) -> tuple[str, bool] | None:
    """``(path, as_json)`` for ``info PATH`` and ``info --json PATH`` (either order, spelled in
    full), which argparse reads the same way; None for anything else. Building the parser and
    its translated help costs a few ms of the 100 ms that ``info`` has, imports included."""
    if len(argv) not in (2, 3) or argv[0] != "info":
        return None
    rest = list(argv[1:])
    as_json = "--json" in rest
    if as_json:
        rest.remove("--json")
    if len(rest) != 1 or rest[0].startswith("-"):
        return None
    return rest[0], as_json


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tensordict-rs`` command; returns the exit status."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader of the output went away (`| head`): stop quietly, as other tools do, with
        # the status of a SIGPIPE (stdout pointed at /dev/null: the exit's flush cannot fail)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13


def _main(argv: Sequence[str] | None) -> int:
    plain = _plain_info(sys.argv[1:] if argv is None else argv)
    if plain is not None:
        return cmd_info(*plain)
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from ..demo import main as demo_main

        return demo_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "info":
        return cmd_info(args.dir, args.json)
    if args.command == "verify":
        return cmd_verify(args.dirs, args.json)
    from . import transfer

    try:
        if args.command == "copy":
            transfer.copy(
                args.src,
                args.dst,
                progress=args.progress,
                durable=args.durable,
                overwrite=args.overwrite,
            )
        else:
            transfer.convert(
                args.src,
                args.dst,
                separator=args.separator,
                overwrite=args.overwrite,
                progress=args.progress,
            )
    except (transfer.UsageError, ImportError) as err:
        _error(str(err))
        return USAGE
    except OSError as err:
        _error(str(err))
        return USAGE
    except (_native.TensorDictError, ValueError, TypeError, RuntimeError) as err:
        _error(str(err))
        return PROBLEMS
    return OK
