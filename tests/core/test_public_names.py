"""Every public name of the package resolves, in a fresh interpreter (they are imported lazily,
so a name whose module moved fails only when it is first used), and has a docstring."""

from __future__ import annotations

import json
import subprocess
import sys

import tensordict as ref
import tensordict_rs as rs
import torch

PROBE = """
import inspect, json, tensordict_rs
out = {}
for name in tensordict_rs.__all__:
    try:
        value = getattr(tensordict_rs, name)
    except Exception as err:
        out[name] = f"{type(err).__name__}: {err}"
        continue
    if not (inspect.ismodule(value) or (getattr(value, "__doc__", None) or "").strip()):
        out[name] = "no docstring"
print(json.dumps(out))
"""


def test_every_public_name_resolves_with_a_docstring() -> None:
    """(``set_list_to_stack`` and three other names of ``_core/nontensor_options.py`` raised
    AttributeError: the lazy table still named the module they had moved out of.)"""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == {}
    assert len(rs.__all__) >= 40


def test_set_list_to_stack_side_by_side() -> None:
    """tensordict's test_set_list_in_constructor: with ``set_list_to_stack(True)`` a list of
    values per row is a stack, a list of tensors is stacked."""
    seen = []
    for lib in (rs, ref):

        @lib.tensorclass
        class Row:
            a: str
            b: torch.Tensor

        with lib.set_list_to_stack(True):
            row = Row(a=["x", "y"], b=[torch.ones(3), torch.zeros(3)], batch_size=2)
            td = lib.TensorDict(a=["x", "y"], batch_size=2)
        seen.append((row[0].a, row[1].a, row.b.shape, td[1]["a"], bool(lib.list_to_stack())))
    assert seen[0] == seen[1]
