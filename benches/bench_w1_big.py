"""W1, big leaves (4 x float32 [1048576, 64] = 1 GiB at full scale): saves, load + first read.

Every workload interleaves the reference, tensordict_rs and the limit (see ``_harness``).
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import tensordict
import tensordict_rs
import torch
from _harness import (
    SHM_BASE,
    Case,
    build_w1,
    byte_views,
    copy_two,
    fresh_dir,
    measure,
    nbytes,
    read_all,
    ref_copy,
    ref_td,
    remove,
    replay,
    rs_copy,
    rs_td,
    split_two,
    td_leaves,
    w1_rows,
    write_two,
)
from _workloads import CASES, LIMIT, REF, RS


@pytest.fixture(scope="module")
def w1():
    src = build_w1()
    yield src
    del src
    gc.collect()


def _save_cases(src: dict, anonymous: bool) -> dict[str, Case]:
    batch = [w1_rows()]
    ref_src, rs_src = ref_td(src, batch), rs_td(src, batch)
    groups = split_two(byte_views(src.values()))

    def ref_setup():
        return ref_copy(ref_src), None if anonymous else fresh_dir(SHM_BASE)

    def rs_setup():
        return rs_copy(rs_src), None if anonymous else fresh_dir(SHM_BASE)

    def save(state):
        td, path = state
        return td.memmap_() if path is None else td.memmap_(path)

    def drop(state, result):
        if state is not None:
            remove(state[1])

    if anonymous:
        limit = Case(
            call=lambda _: write_two(groups, None),
            cleanup=lambda _, fds: [os.close(fd) for fd in fds or ()],
        )
    else:
        limit = Case(
            setup=lambda: fresh_dir(SHM_BASE),
            call=lambda path: write_two(groups, path),
            cleanup=lambda path, _: remove(path),
        )
    return {
        REF: Case(setup=ref_setup, call=save, cleanup=drop),
        RS: Case(setup=rs_setup, call=save, cleanup=drop),
        LIMIT: limit,
    }


@pytest.mark.parametrize("case", CASES)
def test_w1_save_shm(benchmark, case, w1):
    measure("w1_save_shm", nbytes(w1.values()), lambda: _save_cases(w1, anonymous=False))
    replay(benchmark, "w1_save_shm", case)


@pytest.mark.parametrize("case", CASES)
def test_w1_save_anon(benchmark, case, w1):
    measure("w1_save_anon", nbytes(w1.values()), lambda: _save_cases(w1, anonymous=True))
    replay(benchmark, "w1_save_anon", case)


@pytest.fixture(scope="module")
def w1_saved(w1):
    """W1 saved once by the reference under /dev/shm; both libraries load this directory."""
    path = fresh_dir(SHM_BASE)
    ref_td(w1, [w1_rows()]).memmap_(path)
    gc.collect()
    yield path
    remove(path)


def _load_read_cases(src: dict, path) -> dict[str, Case]:
    resident = list(src.values())

    def ref_call(_):
        td = tensordict.TensorDict.load_memmap(path)
        return read_all(td_leaves(td))

    def rs_call(_):
        td = tensordict_rs.TensorDict.load_memmap(path)
        return read_all(td_leaves(td))

    return {
        REF: Case(call=ref_call),
        RS: Case(call=rs_call),
        LIMIT: Case(call=lambda _: read_all(resident)),
    }


@pytest.mark.parametrize("case", CASES)
def test_w1_load_first_read(benchmark, case, w1, w1_saved):
    measure("w1_load_read", nbytes(w1.values()), lambda: _load_read_cases(w1, w1_saved))
    replay(benchmark, "w1_load_read", case)


def _like_cases(src: dict, reserve: bool) -> dict[str, Case]:
    batch = [w1_rows()]
    ref_src, rs_src = ref_td(src, batch), rs_td(src, batch)
    leaves = list(src.values())

    def drop(state, result):
        if state is not None:
            remove(state[1])

    return {
        REF: Case(
            setup=lambda: (ref_copy(ref_src), fresh_dir(SHM_BASE)),
            call=lambda state: state[0].memmap_like(state[1]),
            cleanup=drop,
        ),
        RS: Case(
            setup=lambda: (rs_copy(rs_src), fresh_dir(SHM_BASE)),
            call=lambda state: state[0].memmap_like(state[1], reserve=reserve),
            cleanup=drop,
        ),
        LIMIT: Case(call=lambda _: [torch.empty_like(t) for t in leaves]),
    }


@pytest.mark.parametrize("case", CASES)
def test_w1_memmap_like_sparse(benchmark, case, w1):
    measure("w1_like_sparse", nbytes(w1.values()), lambda: _like_cases(w1, reserve=False))
    replay(benchmark, "w1_like_sparse", case)


@pytest.mark.parametrize("case", CASES)
def test_w1_memmap_like_reserved(benchmark, case, w1):
    measure("w1_like_reserved", nbytes(w1.values()), lambda: _like_cases(w1, reserve=True))
    replay(benchmark, "w1_like_reserved", case)


def _memcpy_cases(src: dict) -> dict[str, Case]:
    sources = [v.numpy() for v in src.values()]
    targets = [np.ones_like(s) for s in sources]  # resident, already faulted
    pairs = list(zip(targets, sources, strict=True))
    return {LIMIT: Case(call=lambda _: copy_two(pairs))}


def test_memcpy_resident(benchmark, w1):
    measure("ctx_memcpy", nbytes(w1.values()), lambda: _memcpy_cases(w1))
    replay(benchmark, "ctx_memcpy", LIMIT)


def test_w1_roundtrip_sanity(w1, w1_saved):
    """Both libraries read the directory back with the source's values (not timed)."""
    for lib in (tensordict, tensordict_rs):
        td = lib.TensorDict.load_memmap(w1_saved)
        for key, value in w1.items():
            assert torch.equal(td[key], value), (lib.__name__, key)
