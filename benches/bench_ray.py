"""Trees through Ray's object store: ``ray.put`` and ``ray.get`` on one node.

One local Ray for the module (2 CPUs, no dashboard, a 4 GiB object store, on 127.0.0.1). Workloads:
a tree of 64 float32 leaves, 256 MiB in all (``put`` and ``get`` timed apart), W1's 1 GiB in
4 leaves (the same two), and W3's 10,000 leaves of 1 KiB (``ray.get(ray.put(td))``). Cases:
tensordict 0.15.3's TensorDict over the same tensors; ours, consolidated beforehand (one
arena, as a tree received, consolidated or memory-mapped is); and the limit, one uint8 NumPy
array of the same bytes (Ray's own zero-copy path: ``put`` is one copy into the store, ``get``
a view). The ``get`` cases record the growth of this process's resident memory while it holds
what ``get`` returned (the largest over the rounds): a copy per get shows as the payload.

Ray's opt-in ``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS`` is not a case here: it is read once, at
``import ray``, and registers a reducer for every ``torch.Tensor`` of the process, which
would change the reference's path too (see docs/guide/ray.md).
"""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before import ray: node IP 127.0.0.1
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from typing import Any

import numpy as np
import pytest
import tensordict
import tensordict_rs
import torch
from _harness import (
    RESULTS,
    Case,
    build_w1,
    build_w3,
    flat_leaves,
    measure,
    nbytes,
    replay,
    w1_rows,
)
from _workloads import CASES, LIMIT, REF, RS

ray = pytest.importorskip("ray")

STORE = 4 << 30
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=STORE,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    assert all(node["NodeManagerAddress"] == "127.0.0.1" for node in ray.nodes())
    yield
    ray.shutdown()


def build_64() -> dict[str, torch.Tensor]:
    """64 float32 leaves of [rows, 256], 256 MiB in all (scaled like W1)."""
    rows = max(64, w1_rows() // 1024 * 4)
    gen = torch.Generator().manual_seed(0)
    return {f"f{i}": torch.rand(rows, 256, generator=gen) for i in range(64)}


def _trees(tree: dict[str, Any], batch: list[int]) -> dict[str, Any]:
    leaves = flat_leaves(tree)
    whole = torch.cat([t.reshape(-1).view(torch.uint8) for t in leaves])
    return {
        REF: tensordict.TensorDict(dict(tree), batch_size=batch),
        RS: tensordict_rs.TensorDict(dict(tree), batch).consolidate(),
        LIMIT: whole.numpy(),
    }


def _put_cases(objects: dict[str, Any]) -> dict[str, Case]:
    # the harness drops the returned reference after each call: Ray frees the object with it
    return {name: Case(call=lambda _, obj=obj: ray.put(obj)) for name, obj in objects.items()}


_GROWTH: dict[str, dict[str, int]] = {}


def _get_cases(workload: str, objects: dict[str, Any]) -> dict[str, Case]:
    growth = _GROWTH.setdefault(workload, {})
    cases = {}
    for name, obj in objects.items():

        def setup(obj: Any = obj) -> tuple[Any, int]:
            ref = ray.put(obj)
            return ref, rss()

        def cleanup(state: Any, got: Any, name: str = name) -> None:
            if state is None:
                return
            ref, before = state
            if got is not None:
                growth[name] = max(growth.get(name, 0), rss() - before)
            del got, ref  # Ray frees the object with its last reference

        cases[name] = Case(call=lambda state: ray.get(state[0]), setup=setup, cleanup=cleanup)
    return cases


def _check(objects: dict[str, Any]) -> None:
    """Every case gives back what went in (checked once, untimed)."""
    ours = ray.get(ray.put(objects[RS]))
    ref = ray.get(ray.put(objects[REF]))
    for key in objects[REF].keys(include_nested=True, leaves_only=True):
        assert torch.equal(ours[key], objects[REF][key]) and torch.equal(ref[key], ours[key])
    limit = ray.get(ray.put(objects[LIMIT]))
    assert np.array_equal(limit, objects[LIMIT])


def _measure(workload: str, build: Any, batch: list[int], kind: str) -> None:
    if workload in RESULTS:
        return
    tree = build()
    objects = _trees(tree, batch)
    del tree
    _check(objects)
    amount = nbytes(flat_leaves(objects[REF].to_dict()))
    if kind == "put":
        measure(workload, amount, lambda: _put_cases(objects))
    elif kind == "get":
        measure(workload, amount, lambda: _get_cases(workload, objects))
        RESULTS[workload]["rss_growth"] = dict(_GROWTH.get(workload, {}))
    else:
        leaves = len(flat_leaves(objects[REF].to_dict()))
        cases = {
            name: Case(call=lambda _, obj=obj: ray.get(ray.put(obj)))
            for name, obj in objects.items()
        }
        measure(workload, leaves, lambda: cases)
    RESULTS[workload]["loadavg"] = os.getloadavg()[0]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", ["put", "get"])
def test_ray_64_leaves(benchmark, local_ray, case, kind):
    workload = f"ray_{kind}_64"
    _measure(workload, build_64, [build_64()["f0"].shape[0]], kind)
    replay(benchmark, workload, case)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", ["put", "get"])
def test_ray_w1(benchmark, local_ray, case, kind):
    workload = f"ray_{kind}_w1"
    _measure(workload, build_w1, [w1_rows()], kind)
    replay(benchmark, workload, case)


@pytest.mark.parametrize("case", CASES)
def test_ray_w3_round_trip(benchmark, local_ray, case):
    _measure("ray_rt_w3", build_w3, [], "round_trip")
    replay(benchmark, "ray_rt_w3", case)
