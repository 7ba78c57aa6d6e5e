"""Command line: ``python -m tensordict_rs verify DIR [DIR ...]`` and ``... demo``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tensordict-rs`` command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tensordict_rs")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("verify", help="check saved directories without loading them")
    check.add_argument("dirs", nargs="+")
    sub.add_parser("demo", help="run the replay-buffer demo (see python -m tensordict_rs.demo -h)")
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from .verify import verify

    status = 0
    for d in args.dirs:
        problems = verify(d)
        if problems:
            status = 1
            print(f"{d}: {len(problems)} problem(s)")
            for p in problems:
                print(f"  - {p}")
        else:
            print(f"{d}: OK")
    return status


if __name__ == "__main__":
    sys.exit(main())
