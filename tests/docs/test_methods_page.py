"""docs/reference/methods.md lists every public TensorDict name of tensordict 0.15.3 that
tensordict_rs lacks, with the reason; this test keeps the list equal to the two classes."""

from __future__ import annotations

import re
from pathlib import Path

import tensordict
import tensordict_rs

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "methods.md"


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_every_missing_method_is_listed_with_its_section() -> None:
    text = PAGE.read_text()
    listed = set(re.findall(r"`([a-z_][a-z0-9_]*)`", text.split("## Owned by", 1)[1]))
    ours = _public(tensordict_rs.TensorDict)
    ref = _public(tensordict.TensorDict)
    missing = ref - ours
    assert missing <= listed, f"not on the page: {sorted(missing - listed)}"
    # a name the page lists as missing that exists now must leave the page (neighbours' work
    # landing shrinks the list); the counts in the first paragraph follow
    assert not (listed & ours), f"on the page but present: {sorted(listed & ours)}"
    counts = f"has 356 public names; tensordict-rs has {len(ref & ours)} of them"
    assert len(ref) == 356 and counts in text.replace("\n", " ")
    assert f"The {len(missing)} it" in text.replace("\n", " ")
