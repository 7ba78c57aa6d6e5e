"""``map`` of a memory-mapped dataset with 2 workers into a ``memmap_like`` output (issue 23).

The dataset: one float32 leaf ``x`` of [rows, 256] (1 KiB per row; 1 GiB at full scale) saved
under /dev/shm by the reference and opened by each library with ``load_memmap``. A timed round
is the preprocessing recipe of tensordict's docs,
``data.map(double, dim=0, num_workers=2, chunksize=C, out=out)``, where ``out`` is
``example.expand(rows).memmap_like(dest)`` (made in the untimed setup, a fresh directory per
round); ``double`` returns ``{"y": 2 * x}`` (as many bytes out as in). The pool is made by
``map`` (the default start method), so its start is in the timed round, as a user pays it.

The limit is the same function applied serially in this process, chunk by chunk, writing each
result into a preallocated memory-mapped output (``torch.mul(x, 2, out=y)``): the work with no
workers at all. The target: ``map`` at least 2x the reference's, and at most 1.2x the limit's
time (the workers cost close to nothing).
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import tensordict
import tensordict_rs
import torch
from _harness import SCALE, SHM_BASE, Case, fresh_dir, measure, remove, replay
from _workloads import CASES, LIMIT, REF, RS

WIDTH = 256  # float32 columns: 1 KiB per row
WORKERS = 2


def rows() -> int:
    return max(4096, int((1 << 30) // (WIDTH * 4) * SCALE))


def chunk() -> int:
    return max(256, rows() // 64)  # 64 tasks: 16 MiB each at full scale


def double(td: Any) -> Any:
    """The preprocessing function (module level: the workers import it by name)."""
    return td.empty().set("y", td["x"] * 2)


@pytest.fixture(scope="module")
def dataset_path():
    path = fresh_dir(SHM_BASE)
    n = rows()
    x = torch.arange(WIDTH, dtype=torch.float32).expand(n, WIDTH).clone()
    tensordict.TensorDict({"x": x}, batch_size=[n]).memmap_(path / "src")
    del x
    gc.collect()
    yield path
    remove(path)


def _map_case(lib: Any, path: Any) -> Case:
    data = lib.TensorDict.load_memmap(path / "src")
    example = double(data[:1])[0]
    n = rows()

    def setup() -> Any:
        dest = fresh_dir(SHM_BASE)
        return dest, example.expand(n).memmap_like(dest / "out")

    def call(state: Any) -> None:
        _, out = state
        data.map(
            double,
            dim=0,
            num_workers=WORKERS,
            chunksize=chunk(),
            out=out,
            generator=torch.Generator().manual_seed(0),
        )

    def cleanup(state: Any, _: Any) -> None:
        dest, out = state
        first, last = out["y"][0, 1].item(), out["y"][-1, -1].item()
        assert (first, last) == (2.0, 2.0 * (WIDTH - 1)), (first, last)
        del out
        remove(dest)

    return Case(call=call, setup=setup, cleanup=cleanup)


def _limit_case(path: Any) -> Case:
    data = tensordict_rs.TensorDict.load_memmap(path / "src")
    x = data["x"].as_subclass(torch.Tensor)
    n = rows()

    def setup() -> Any:
        dest = fresh_dir(SHM_BASE)
        like = tensordict_rs.TensorDict({"y": torch.zeros(()).expand(n, WIDTH)}, [n])
        return dest, like.memmap_like(dest / "out")

    def call(state: Any) -> None:
        _, out = state
        y = out["y"].as_subclass(torch.Tensor)
        step = chunk()
        for start in range(0, n, step):
            torch.mul(x[start : start + step], 2, out=y[start : start + step])

    def cleanup(state: Any, _: Any) -> None:
        dest, out = state
        del out
        remove(dest)

    return Case(call=call, setup=setup, cleanup=cleanup)


@pytest.mark.parametrize("case", CASES)
def test_map_memmap_like(benchmark, case, dataset_path):
    n = rows()
    measure(
        "map_w2",
        n * WIDTH * 4,
        lambda: {
            REF: _map_case(tensordict, dataset_path),
            RS: _map_case(tensordict_rs, dataset_path),
            LIMIT: _limit_case(dataset_path),
        },
        rows=n,
        chunksize=chunk(),
        workers=WORKERS,
    )
    replay(benchmark, "map_w2", case)
