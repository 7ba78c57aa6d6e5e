"""benches/report.py writes its table into the performance page of the docs, between the page's
markers, and leaves the rest of the page as it is (it is run on a saved run here: ``--json``
renders without running the suite)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REPORT = REPO / "benches" / "report.py"
PAGE = REPO / "docs" / "reference" / "performance.md"
START = "<!-- benches/report.py: table start -->"
END = "<!-- benches/report.py: table end -->"

RUN = {
    "tdrs_bench": {
        "machine": {"date": "2030-01-02 03:04:05 UTC", "cpus": 2, "scale": 1.0, "rounds": 5},
        "results": {
            "w1_save_shm": {
                "amount": 2**30,
                "cases": {
                    "tensordict": {"times": [0.5, 0.4, 0.6], "error": None},
                    "tensordict_rs": {"times": [0.25, 0.2, 0.3], "error": None},
                    "limit": {"times": [0.23, 0.22, 0.24], "error": None},
                },
            }
        },
    }
}


def report(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPORT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def saved_run(tmp_path: Path) -> Path:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(RUN))
    return path


def test_the_page_has_one_table_between_its_markers() -> None:
    text = PAGE.read_text()
    assert text.count(START) == 1 and text.count(END) == 1
    table = text[text.index(START) + len(START) : text.index(END)].strip()
    assert table.startswith("Run: ") and "(full size)" in table
    assert "| workload | tensordict 0.15.3 median | tensordict-rs median |" in table


def test_docs_replaces_only_the_table(saved_run: Path, tmp_path: Path) -> None:
    page = tmp_path / "performance.md"
    page.write_text(PAGE.read_text())
    before, after = PAGE.read_text().split(START)[0], PAGE.read_text().split(END)[1]
    out = report("--json", saved_run, "--docs", page)
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    assert text.startswith(before + START) and text.endswith(END + after)
    table = text[text.index(START) + len(START) : text.index(END)]
    assert table.strip() == out.stdout.strip()  # what it printed is what it wrote
    assert "Run: 2030-01-02 03:04:05 UTC" in table
    row = next(line for line in table.splitlines() if line.startswith("| memmap_(prefix) W1"))
    # medians: 0.5 s, 0.25 s and 0.23 s: ratio 2.00, fraction of the limit 0.92, both met
    assert "| 2.00x |" in row and "| 0.92 |" in row and row.endswith("| yes |")
    assert report("--json", saved_run, "--docs", page).returncode == 0
    assert page.read_text() == text  # a second run of the same data changes nothing


def test_a_page_without_markers_is_left_alone(saved_run: Path, tmp_path: Path) -> None:
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n\nno markers here\n")
    out = report("--json", saved_run, "--docs", page)
    assert out.returncode == 1 and "exactly once" in out.stderr
    assert page.read_text() == "# Performance\n\nno markers here\n"
    assert sorted(tmp_path.iterdir()) == sorted([saved_run, page])  # no file left beside it


def test_a_resized_row_says_its_size(tmp_path: Path) -> None:
    """A workload run at another size than its title (TDRS_BENCH_BIG_GIB=8) says so in its
    row, and the MiB reported to the host per case are printed under the table."""
    run = json.loads(json.dumps(RUN))
    entry = run["tdrs_bench"]["results"].pop("w1_save_shm")
    entry.update(
        amount=8 * 2**30,
        resized=True,
        plain={"write1": 2.0},
        reported={"tensordict_rs": 888, "write1": 1392},
    )
    run["tdrs_bench"]["results"]["big1_save_tmp"] = entry
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    done = report("--json", path)
    assert done.returncode == 0, done.stderr
    row = next(
        line for line in done.stdout.splitlines() if line.startswith("| memmap_(prefix) one")
    )
    assert "[this run: 8,192 MiB]" in row
    assert "MiB reported to the host during a call" in done.stdout
    assert "tensordict_rs 888, write1 1392" in done.stdout
