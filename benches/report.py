"""Runs the benchmark suite and prints one markdown table (for docs/reference/performance.md).

    python benches/report.py                      # runs the suite, prints the table
    python benches/report.py --docs               # ... and writes it into the docs page
    python benches/report.py --json run.json      # renders a saved --benchmark-json file
    TDRS_BENCH_SCALE=0.02 python benches/report.py   # a quick, shrunk run

Options: ``--save-json FILE`` keeps pytest-benchmark's JSON of the run; ``--docs [PAGE]``
replaces the table of the performance page (``docs/reference/performance.md`` by default)
between its two marker comments, and nothing else of the page; ``--out FILE`` also writes the
table alone to FILE. Anything after ``--`` goes to pytest (e.g. ``-- -k w3``). pytest's own
output goes to stderr, the table to stdout. Exit status: pytest's (or 1 when the page cannot
be written).

Every figure is the median of interleaved rounds of one run; ratios are the reference's median
time over tensordict_rs's, "fraction of limit" is the limit's median time over
tensordict_rs's (1.0 = as fast as the machine's plain method).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workloads import LIMIT, REF, RS, WORKLOADS, Workload

BENCHES = Path(__file__).resolve().parent
DOCS_PAGE = BENCHES.parent / "docs" / "reference" / "performance.md"
TABLE_START = "<!-- benches/report.py: table start -->"
TABLE_END = "<!-- benches/report.py: table end -->"

HEADER = (
    "| workload | tensordict 0.15.3 median | tensordict-rs median | ratio | limit "
    "| fraction of limit | target | met? |"
)
RULE = "|---|---|---|---|---|---|---|---|"


# ---------------------------------------------------------------------------- numbers


def _value(unit: str, amount: float, seconds: float) -> float:
    if unit == "GB/s":
        return amount / seconds / 1e9
    if unit == "us/leaf":
        return seconds / amount * 1e6
    if unit == "M rows/s":
        return amount / seconds / 1e6
    if unit == "batches/s":
        return amount / seconds
    return seconds


def _num(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:,.{min(digits, 4)}f}"


def _unit_text(unit: str) -> str:
    return "µs/leaf" if unit == "us/leaf" else unit


def _cell(wl: Workload, amount: float, times: list[float], spread: bool = True) -> str:
    med = statistics.median(times)
    text = f"{_num(_value(wl.unit, amount, med))} {_unit_text(wl.unit)}"
    if spread and len(times) > 1:
        lo, hi = sorted(_value(wl.unit, amount, t) for t in (min(times), max(times)))
        text += f" ({_num(lo)}-{_num(hi)})"
    return text


def _case(entry: dict[str, Any], case: str) -> tuple[list[float], str | None]:
    c = entry["cases"].get(case)
    if c is None:
        return [], None
    return c["times"], c["error"]


def _short(error: str) -> str:
    return error if len(error) <= 70 else error[:67] + "..."


# ---------------------------------------------------------------------------- rows


def _timed_row(wl: Workload, entry: dict[str, Any]) -> list[str]:
    amount = entry["amount"]
    cells = []
    meds: dict[str, float | None] = {}
    for case in (REF, RS):
        times, error = _case(entry, case)
        if error:
            cells.append(f"error: {_short(error)}")
            meds[case] = None
        elif times:
            text = _cell(wl, amount, times)
            fds = entry.get("fds", {}).get(case)
            if fds is not None:
                text += f", +{fds} fds"
            growth = entry.get("rss_growth", {}).get(case)
            if growth is not None:
                text += f", RSS +{growth / 2**20:,.0f} MiB"
            cells.append(text)
            meds[case] = statistics.median(times)
        else:
            cells.append("-")
            meds[case] = None
    ref, rs = meds[REF], meds[RS]
    ratio = ref / rs if ref and rs else None
    limit_times, limit_error = _case(entry, LIMIT)
    limit = statistics.median(limit_times) if limit_times and not limit_error else None
    fraction = limit / rs if limit and rs else None
    cells.append(f"{ratio:.2f}x" if ratio else "-")
    cells.append(_cell(wl, amount, limit_times, spread=False) if limit else "-")
    cells.append(f"{fraction:.2f}" if fraction else "-")
    cells.append(wl.target)
    if wl.info:
        met = "(context)"
    elif rs is None:
        met = "**no** (error)"
    elif wl.absolute_if_ref_fails and ref is None and wl.max_value is not None:
        ok = _value(wl.unit, amount, rs) <= wl.max_value
        met = f"{'yes' if ok else '**no**'} (the reference fails; <= {_num(wl.max_value)} s)"
    else:
        checks = []
        if wl.min_ratio is not None:
            checks.append(ratio is not None and ratio >= wl.min_ratio)
        if wl.min_fraction is not None:
            checks.append(fraction is not None and fraction >= wl.min_fraction)
        absolute_ok = None
        if wl.max_value is not None:
            absolute_ok = _value(wl.unit, amount, rs) <= wl.max_value
            if not wl.absolute_is_alternative:
                checks.append(absolute_ok)
        met = "yes" if all(checks) else "**no**"
        if wl.absolute_is_alternative and absolute_ok is not None:
            bound = f"<= {_num(wl.max_value)} {_unit_text(wl.unit)}"
            met += f" ({bound}: {'yes' if absolute_ok else 'no'})"
    fds = entry.get("fds", {}).get(RS)
    if wl.max_fds is not None and fds is not None and fds > wl.max_fds:
        met = f"**no** ({fds} new fds)"
    return cells + [met]


def _import_row(wl: Workload, entry: dict[str, Any]) -> list[str]:
    """Net import cost after torch: in the child itself, and as a paired process difference.

    The target is checked on the in-process figure (the paired difference of whole processes
    carries ~0.1-0.4 s of start-up noise on a busy machine; it is shown beside it).
    """
    net = entry.get("net", {})
    inproc = entry.get("inproc", {})
    cells = []
    meds: dict[str, float | None] = {}
    for case in (REF, RS):
        _, error = _case(entry, case)
        values = inproc.get(case) or net.get(case) or []
        paired = net.get(case) or []
        if error:
            cells.append(f"error: {_short(error)}")
            meds[case] = None
        elif values:
            meds[case] = statistics.median(values)
            text = f"+{meds[case]:.3f} s"
            if inproc.get(case) and paired:
                text += f" (process pair: {statistics.median(paired):+.2f} s)"
            cells.append(text)
        else:
            cells.append("-")
            meds[case] = None
    ref, rs = meds[REF], meds[RS]
    torch_times, _ = _case(entry, LIMIT)
    base = statistics.median(torch_times) if torch_times else None
    # The ratio of whole start-up times: python + torch + the library, reference / ours.
    ratio = (base + ref) / (base + rs) if base and ref is not None and rs is not None else None
    cells.append(f"{ratio:.2f}x (start-up)" if ratio else "-")
    cells.append(
        f"`import torch` alone: {statistics.median(torch_times):.2f} s" if torch_times else "-"
    )
    cells.append("-")
    cells.append(wl.target)
    ok = rs is not None and wl.max_value is not None and rs <= wl.max_value
    cells.append("yes" if ok else "**no**")
    return cells


def _outcome_cell(outcome: dict[str, Any] | None) -> str:
    if outcome is None:
        return "-"
    if outcome.get("ok"):
        fds = outcome.get("open_fds")
        return f"works ({outcome['seconds']:.2f} s" + (f", {fds} fds open)" if fds else ")")
    return f"fails: {_short(str(outcome.get('error')))}"


def _fd_row(wl: Workload, entry: dict[str, Any]) -> list[str]:
    outcomes = entry.get("outcomes", {})
    rs = outcomes.get(RS)
    return [
        _outcome_cell(outcomes.get(REF)),
        _outcome_cell(rs),
        "-",
        "-",
        "-",
        wl.target,
        "yes" if rs and rs.get("ok") else "**no**",
    ]


def render(data: dict[str, Any]) -> str:
    """The markdown table (with its date/machine line and notes) of one run's results."""
    machine = data.get("machine", {})
    results = data.get("results", {})
    lines = [_machine_line(machine), ""]
    other = machine.get("other_cpus")
    if isinstance(other, (int, float)) and other >= 0.1:
        lines += [
            f"**Warning: other processes used {other} of {machine.get('cpus')} CPUs during this "
            "run. On a 2-core machine that makes these figures unreliable (2-thread copies and "
            "OpenMP barriers wait for descheduled threads); measure again on a quiet machine.**",
            "",
        ]
    lines += [HEADER, RULE]
    for wl in WORKLOADS:
        if wl.id not in results or wl.id == "ctx_memcpy":
            continue
        entry = results[wl.id]
        if wl.id == "import":
            cells = _import_row(wl, entry)
        elif wl.id == "fd_limit":
            cells = _fd_row(wl, entry)
        else:
            cells = _timed_row(wl, entry)
        title = wl.title
        if machine.get("scale", 1) != 1 or entry.get("resized"):
            title += f" [this run: {_size(wl, entry)}]"
        lines.append("| " + " | ".join([title, *cells]) + " |")
    lines.append("")
    lines.append(
        "Medians of interleaved rounds (min-max in brackets); ratio = reference time / "
        "tensordict-rs time; fraction of limit = limit time / tensordict-rs time."
    )
    lines += ["", "Limits:", ""]  # blank lines: Markdown (MkDocs) needs them around a list
    for wl in WORKLOADS:
        if wl.id in results and wl.limit and not wl.info:
            lines.append(f"- {wl.title}: {wl.limit}.")
    big = [
        wl
        for wl in WORKLOADS
        if wl.id in results and ("plain" in results[wl.id] or "variants" in results[wl.id])
    ]
    if big:
        lines += ["", "One big leaf, plain methods and the kernel's dirty pages:", ""]
    for wl in big:
        entry = results[wl.id]
        plain = ", ".join(
            f"{name} {_num(entry['amount'] / t / 1e9)} GB/s"
            for name, t in sorted(
                {**entry.get("plain", {}), **entry.get("variants", {})}.items(),
                key=lambda kv: kv[1],
            )
        )
        dirty = entry.get("dirty", {})
        counters = ", ".join(
            f"{case} {d}/{w}" for case, (d, w) in sorted(dirty.items()) if case in (REF, RS)
        )
        load = entry.get("load")
        cpu = ", ".join(
            f"{case} {t:.2f}"
            for case, t in sorted(entry.get("cpu", {}).items(), key=lambda kv: kv[1])
        )
        text = f"- {wl.title}: {plain or 'no plain method'}"
        if cpu:
            text += f"; CPU seconds per call (medians, all threads): {cpu}"
        if counters:
            text += f"; Dirty/Writeback MiB before the calls (medians): {counters}"
        reported = entry.get("reported", {})
        if reported:
            text += "; MiB reported to the host during a call (most of the rounds): " + ", ".join(
                f"{case} {m}" for case, m in sorted(reported.items())
            )
        if load:
            text += f"; load average {load[0]:.1f}-{load[2]:.1f} (median {load[1]:.1f})"
        lines.append(text + ".")
    memcpy = results.get("ctx_memcpy")
    if memcpy:
        times, _ = _case(memcpy, LIMIT)
        if times:
            wl = next(w for w in WORKLOADS if w.id == "ctx_memcpy")
            lines.append(f"- {wl.title}: {_cell(wl, memcpy['amount'], times)}.")
    return "\n".join(lines)


def _size(wl: Workload, entry: dict[str, Any]) -> str:
    """The size of a workload in a run that shrank or grew it (TDRS_BENCH_SCALE != 1, or a
    workload's own size variable such as TDRS_BENCH_BIG_GIB)."""
    amount = entry["amount"]
    if wl.unit == "GB/s":
        return f"{amount / 2**20:,.0f} MiB"
    if wl.unit == "us/leaf":
        return f"{amount:,.0f} leaves"
    if wl.unit in ("M rows/s", "batches/s"):
        rows = entry.get("dataset_rows")
        return f"{rows:,} rows" if rows else "shrunk"
    return "full size"  # imports and the fd-limit check do not shrink


def _machine_line(m: dict[str, Any]) -> str:
    if not m:
        return "(no machine information)"
    other = m.get("other_cpus")
    scale = m.get("scale")
    parts = [
        f"{m.get('date')}",
        f"{m.get('cpus')} CPUs ({m.get('cpu_model')}), {m.get('mem_gib')} GiB RAM, "
        f"kernel {m.get('kernel')}",
        f"Python {m.get('python')}, torch {m.get('torch')} ({m.get('torch_threads')} threads), "
        f"numpy {m.get('numpy')}, tensordict {m.get('tensordict')}, "
        f"tensordict-rs {m.get('tensordict_rs')}",
        f"/dev/shm {m.get('shm_fs')}, /tmp {m.get('tmp_fs')}",
        f"TDRS_BENCH_SCALE={scale}" + (" (full size)" if scale == 1 else " (SHRUNK)"),
        f"{m.get('rounds')} timed rounds after {m.get('warmup')} warm-up "
        f"({m.get('import_rounds')} for imports)",
        f"load average {m.get('loadavg_start'):.2f} -> {m.get('loadavg_end'):.2f}"
        if m.get("loadavg_start") is not None
        else "",
        f"CPU used by other processes meanwhile: {other} of {m.get('cpus')} CPUs"
        if other is not None
        else "",
        f"suite wall time {m.get('wall_s')} s",
        _page_reporting(m.get("page_reporting")),
    ]
    return "Run: " + "; ".join(p for p in parts if p) + "."


def _page_reporting(state: dict[str, Any] | None) -> str:
    """The machine line's words on free page reporting (see _harness.held_free_pages)."""
    if not state:
        return ""
    if "held" in state:
        words = f"free page reporting held ({state['held']})"
    else:
        words = state.get("note", "")
    if "reported_mib" in state:
        words += f", {state['reported_mib']:,} MiB reported to the host during the run"
    return words


# ---------------------------------------------------------------------------- the page


def write_into_page(page: Path, table: str) -> None:
    """Replaces what lies between the page's two marker lines with ``table``.

    Raises ``ValueError`` (naming the page) unless each marker is there exactly once, start
    before end; the page is replaced atomically (a file beside it, then a rename).
    """
    text = page.read_text(encoding="utf-8")
    if text.count(TABLE_START) != 1 or text.count(TABLE_END) != 1:
        raise ValueError(f"{page} must hold each of {TABLE_START} and {TABLE_END} exactly once")
    start = text.index(TABLE_START) + len(TABLE_START)
    end = text.index(TABLE_END)
    if end < start:
        raise ValueError(f"{page}: {TABLE_END} comes before {TABLE_START}")
    new = text[:start] + "\n\n" + table.strip("\n") + "\n\n" + text[end:]
    tmp = page.with_name(f".{page.name}.tmp")
    tmp.write_text(new, encoding="utf-8")
    os.replace(tmp, page)


# ---------------------------------------------------------------------------- main


def _run_suite(json_path: Path, extra: list[str]) -> int:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(BENCHES),
        "-p",
        "no:cacheprovider",
        "--benchmark-only",
        f"--benchmark-json={json_path}",
        *extra,
    ]
    print("running:", " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, cwd=BENCHES.parent, stdout=sys.stderr).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="render this --benchmark-json file, run nothing")
    parser.add_argument("--save-json", type=Path, help="keep the run's --benchmark-json here")
    parser.add_argument("--out", type=Path, help="also write the table alone to this file")
    parser.add_argument(
        "--docs",
        type=Path,
        nargs="?",
        const=DOCS_PAGE,
        help=f"write the table into this page, between its markers (default: {DOCS_PAGE})",
    )
    args = parser.parse_args(argv)

    rc = 0
    if args.json is not None:
        json_path = args.json
    else:
        fd, name = tempfile.mkstemp(prefix="tdrs-bench-", suffix=".json")
        os.close(fd)
        json_path = args.save_json or Path(name)
        rc = _run_suite(json_path, extra)
        if args.save_json:
            os.unlink(name)
    try:
        with open(json_path) as f:
            data = json.load(f)
    except (OSError, ValueError) as err:
        print(f"cannot read {json_path}: {err}", file=sys.stderr)
        return rc or 1
    finally:
        if args.json is None and args.save_json is None:
            json_path.unlink(missing_ok=True)
    if "tdrs_bench" not in data:
        print(f"{json_path} has no tdrs_bench section (not written by benches/)", file=sys.stderr)
        return rc or 1
    table = render(data["tdrs_bench"])
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    if args.docs:
        try:
            write_into_page(args.docs, table)
        except (OSError, ValueError) as err:
            print(f"cannot write the table into the page: {err}", file=sys.stderr)
            return rc or 1
        print(f"wrote the table into {args.docs}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
