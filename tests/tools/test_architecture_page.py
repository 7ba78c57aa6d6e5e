"""docs/architecture.md draws the same layer map that tools/check_layers.py enforces: every
``- **level N: `a`, `b`**`` (or ``top``) line of a section names exactly the modules the
toml map puts at that level, so the page cannot drift from the check."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"
ITEM = re.compile(r"^- \*\*(top|level (\d+)): (.+?)\*\*", re.M)


def page_levels(section: str) -> dict[str, set[str]]:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(section)
    end = text.find("\n## ", start + len(section))
    levels: dict[str, set[str]] = {}
    for match in ITEM.finditer(text[start : end if end > 0 else None]):
        level = "top" if match.group(1) == "top" else match.group(2)
        names = {n.rstrip("/") for n in re.findall(r"`([^`]+)`", match.group(3))}
        levels.setdefault(level, set()).update(names)
    return levels


def map_levels(name: str) -> dict[str, set[str]]:
    data = tomllib.loads((REPO / "tools" / "layers" / name).read_text(encoding="utf-8"))
    levels = {"top": set(data.get("top", []))}
    for layer in data["layers"]:
        levels.setdefault(str(layer["level"]), set()).update(layer["modules"])
    return levels


@pytest.mark.parametrize(
    ("section", "toml"),
    [
        ("## The Rust crate, `rust/`", "rust.toml"),
        ("## The Python package, `python/tensordict_rs/`", "python.toml"),
    ],
)
def test_page_and_map_agree(section: str, toml: str) -> None:
    assert page_levels(section) == map_levels(toml)
