"""Shared by the tensorclass tests (``core/``, ``io/``, ``share/``): tensorclass, side by side
with tensordict 0.15.3: the same program runs with both packages and must print / return the
same things (reprs, values, errors).

Each scenario takes the package (``tensordict_rs`` or ``tensordict``) and defines its classes
through ``define``: the same ``__module__`` and ``__qualname__`` in both packages, so that the
class names recorded on disk are the same and directories move between the two.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import tensordict as ref
import tensordict_rs as rs
import torch

PKGS = [rs, ref]
MODULE = "tc_shared"  # the module name both packages' classes claim


def define(pkg: Any, name: str, fields: dict[str, Any], *, base: bool = False, **flags: Any) -> Any:
    """A tensorclass ``tc_shared.<name>`` with ``fields`` ({name: annotation or (annotation,
    default)}), through ``@tensorclass(**flags)`` or, with ``base``, ``TensorClass``."""
    annotations = {}
    ns: dict[str, Any] = {"__module__": MODULE, "__qualname__": name}
    for field, spec in fields.items():
        if isinstance(spec, tuple):
            annotations[field], ns[field] = spec
        else:
            annotations[field] = spec
    ns["__annotations__"] = annotations
    if base:
        flagged = [k for k, v in flags.items() if v]
        parent = pkg.TensorClass[tuple(flagged)] if flagged else pkg.TensorClass
        return type(name, (parent,), ns)
    return pkg.tensorclass(**flags)(type(name, (), ns))


def both(scenario: Any, *args: Any) -> tuple[Any, Any]:
    """Runs ``scenario(pkg, *args)`` with each package; returns (ours, theirs) as (printed,
    returned) pairs."""
    results = []
    for pkg in PKGS:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            value = scenario(pkg, *args)
        results.append((out.getvalue(), value))
    return results[0], results[1]


def same(a: Any, b: Any) -> None:
    """Deep equality of returned values (tensors by value, dtype and shape)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
        assert torch.equal(a, b), (a, b)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (a, b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (a, b)
        for key in a:
            same(a[key], b[key])
    else:
        assert a == b, (a, b)


def check(scenario: Any, *args: Any) -> Any:
    (out_rs, res_rs), (out_ref, res_ref) = both(scenario, *args)
    assert out_rs == out_ref
    same(res_rs, res_ref)
    return res_rs


def error(fn: Any) -> str:
    """The exception class name ``fn()`` raises ("" when it returns)."""
    try:
        fn()
    except Exception as err:
        return type(err).__name__
    return ""


# ---------------------------------------------------------------------------------- on disk


def files(root: Path) -> dict[str, Any]:
    """Every file under ``root``: meta.json files parsed, others by size."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            rel = path.relative_to(root).as_posix()
            found[rel] = (
                json.loads(path.read_text()) if path.name == "meta.json" else path.stat().st_size
            )
    return found


_SAMPLE_CLASSES: dict[str, Any] = {}


def sample(pkg: Any) -> Any:
    """An ``Outer`` holding an ``Inner``: the classes are made once per package (tensordict
    finds a saved class among all the classes ever defined under that name)."""
    if pkg.__name__ not in _SAMPLE_CLASSES:
        Inner = define(pkg, "Inner", {"y": torch.Tensor})
        _SAMPLE_CLASSES[pkg.__name__] = define(
            pkg, "Outer", {"x": torch.Tensor, "inner": Inner, "name": str, "opt": (Any, None)}
        )
    Outer = _SAMPLE_CLASSES[pkg.__name__]
    Inner = Outer.__annotations__["inner"]
    return Outer(
        x=torch.arange(12.0).view(4, 3),
        inner=Inner(y=torch.arange(4, dtype=torch.int16), batch_size=[4]),
        name="sample",
        batch_size=[4],
    )
