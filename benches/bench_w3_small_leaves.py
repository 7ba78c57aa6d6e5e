"""W3, many small leaves (10 x 10 x 100 = 10,000 leaves of 1 KiB at full scale, batch []).

memmap_ to /dev/shm and /tmp (ext4), load_memmap, memmap_like. Per-leaf costs.
"""

from __future__ import annotations

import gc
import os

import pytest
import tensordict
import tensordict_rs
import torch
from _harness import (
    SHM_BASE,
    TMP_BASE,
    Case,
    build_w3,
    byte_views,
    flat_leaves,
    fresh_dir,
    leaf_files,
    measure,
    read_files,
    ref_copy,
    ref_td,
    remove,
    replay,
    rs_copy,
    rs_td,
    split_two,
    td_leaves,
    write_two,
)
from _workloads import CASES, LIMIT, REF, RS


@pytest.fixture(scope="module")
def w3():
    src = build_w3()
    yield src
    del src
    gc.collect()


def _flat(tree: dict, prefix: str = "") -> dict:
    """The same leaves as W3 in one flat TensorDict (keys joined with '_')."""
    out: dict = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}_"))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.fixture(scope="module")
def w3_flat(w3):
    return _flat(w3)


def _save_cases(src: dict, base, sync: bool, done: list | None = None) -> dict[str, Case]:
    """The three save cases. With ``done`` (a list) output directories are not deleted after
    each call but collected there, for the caller to delete after all rounds: on ext4
    (mounted with ``discard``) deleting 10,000 files makes the next creations stall at random.
    """
    ref_src, rs_src = ref_td(src, []), rs_td(src, [])
    groups = split_two(byte_views(flat_leaves(src)))

    def dispose(path):
        if done is None:
            remove(path)
        else:
            done.append(path)

    def setup_with(copy, source):
        def setup():
            if sync:
                os.sync()  # ext4: start every call with no dirty pages left by the last one
            return copy(source), fresh_dir(base)

        return setup

    def save(state):
        td, path = state
        return td.memmap_(path)

    def drop(state, result):
        if state is not None:
            dispose(state[1])

    def limit_setup():
        if sync:
            os.sync()
        return fresh_dir(base)

    return {
        REF: Case(setup=setup_with(ref_copy, ref_src), call=save, cleanup=drop),
        RS: Case(setup=setup_with(rs_copy, rs_src), call=save, cleanup=drop),
        LIMIT: Case(
            setup=limit_setup,
            call=lambda path: write_two(groups, path),
            cleanup=lambda path, _: dispose(path),
        ),
    }


@pytest.mark.parametrize("case", CASES)
def test_w3_save_shm(benchmark, case, w3):
    n = len(flat_leaves(w3))
    measure("w3_save_shm", n, lambda: _save_cases(w3, SHM_BASE, sync=False))
    replay(benchmark, "w3_save_shm", case)


@pytest.mark.parametrize("case", CASES)
def test_w3_save_tmp(benchmark, case, w3):
    n = len(flat_leaves(w3))
    done: list = []
    try:
        measure("w3_save_tmp", n, lambda: _save_cases(w3, TMP_BASE, sync=True, done=done))
    finally:
        for path in done:
            remove(path)
    replay(benchmark, "w3_save_tmp", case)


@pytest.mark.parametrize("case", CASES)
def test_w3_flat_save_shm(benchmark, case, w3_flat):
    measure("w3f_save_shm", len(w3_flat), lambda: _save_cases(w3_flat, SHM_BASE, sync=False))
    replay(benchmark, "w3f_save_shm", case)


@pytest.fixture(scope="module")
def w3_flat_saved(w3_flat):
    """Flat W3 saved once by the reference under /dev/shm."""
    path = fresh_dir(SHM_BASE)
    ref_td(w3_flat, []).memmap_(path)
    gc.collect()
    yield path
    remove(path)


@pytest.mark.parametrize("case", CASES)
def test_w3_flat_load(benchmark, case, w3_flat, w3_flat_saved):
    measure("w3f_load", len(w3_flat), lambda: _load_cases(w3_flat_saved, get_leaves=False))
    replay(benchmark, "w3f_load", case)


@pytest.mark.parametrize("case", CASES)
def test_w3_flat_memmap_like(benchmark, case, w3_flat):
    measure("w3f_like", len(w3_flat), lambda: _like_cases(w3_flat))
    replay(benchmark, "w3f_like", case)


@pytest.fixture(scope="module")
def w3_saved(w3):
    """W3 saved once by the reference under /dev/shm; both libraries load this directory."""
    path = fresh_dir(SHM_BASE)
    ref_td(w3, []).memmap_(path)
    gc.collect()
    yield path
    remove(path)


def _load_cases(path, get_leaves: bool) -> dict[str, Case]:
    files = leaf_files(path)

    def loader(lib):
        def call(_):
            td = lib.TensorDict.load_memmap(path)
            if get_leaves:
                td_leaves(td)
            return td

        return call

    return {
        REF: Case(call=loader(tensordict)),
        RS: Case(call=loader(tensordict_rs)),
        LIMIT: Case(call=lambda _: read_files(files)),
    }


@pytest.mark.parametrize("case", CASES)
def test_w3_load(benchmark, case, w3, w3_saved):
    n = len(flat_leaves(w3))
    measure("w3_load", n, lambda: _load_cases(w3_saved, get_leaves=False))
    replay(benchmark, "w3_load", case)


@pytest.mark.parametrize("case", CASES)
def test_w3_load_get_leaves(benchmark, case, w3, w3_saved):
    n = len(flat_leaves(w3))
    measure("w3_load_get", n, lambda: _load_cases(w3_saved, get_leaves=True))
    replay(benchmark, "w3_load_get", case)


def _like_cases(src: dict) -> dict[str, Case]:
    ref_src, rs_src = ref_td(src, []), rs_td(src, [])
    leaves = flat_leaves(src)

    def like(state):
        td, path = state
        return td.memmap_like(path)

    def drop(state, result):
        if state is not None:
            remove(state[1])

    return {
        REF: Case(setup=lambda: (ref_copy(ref_src), fresh_dir(SHM_BASE)), call=like, cleanup=drop),
        RS: Case(setup=lambda: (rs_copy(rs_src), fresh_dir(SHM_BASE)), call=like, cleanup=drop),
        LIMIT: Case(call=lambda _: [torch.empty_like(t) for t in leaves]),
    }


@pytest.mark.parametrize("case", CASES)
def test_w3_memmap_like(benchmark, case, w3):
    n = len(flat_leaves(w3))
    measure("w3_like", n, lambda: _like_cases(w3))
    replay(benchmark, "w3_like", case)


def test_w3_roundtrip_sanity(w3, w3_saved):
    """tensordict_rs reads the reference's directory and its own back correctly (not timed)."""
    path = fresh_dir(SHM_BASE)
    try:
        rs_td(w3, []).memmap_(path)
        for saved in (w3_saved, path):
            for lib in (tensordict, tensordict_rs):
                td = lib.TensorDict.load_memmap(saved)
                assert len(td_leaves(td)) == len(flat_leaves(w3))
                for a, level_a in w3.items():
                    for b, level_b in level_a.items():
                        for c, want in level_b.items():
                            assert torch.equal(td[a, b, c], want), (lib.__name__, a, b, c)
    finally:
        remove(path)
