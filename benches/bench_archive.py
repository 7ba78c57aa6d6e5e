"""``.tdz`` archives: W3 (10,000 x 1 KiB leaves in 100 groups) and W1 (1 GiB in 4 leaves).

Saves are ``memmap(prefix.tdz)`` in both libraries (tensordict's ``save`` is that call), to
/dev/shm; loads read an archive the reference wrote. The limit of the W3 save is our own
directory save of the same tree (the target: an archive save faster than it); of the W1
save, ``write(2)`` of the same bytes with 2 threads; of the W3 load, one ``read(2)`` of the
whole archive; of the W1 load + read, reading the resident source.
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
    Case,
    build_w1,
    build_w3,
    byte_views,
    flat_leaves,
    fresh_dir,
    measure,
    nbytes,
    read_all,
    ref_td,
    remove,
    replay,
    rs_td,
    split_two,
    td_leaves,
    w1_rows,
    write_two,
)
from _workloads import CASES, LIMIT, REF, RS


@pytest.fixture(scope="module")
def w3():
    src = build_w3()
    yield src
    del src
    gc.collect()


@pytest.fixture(scope="module")
def w1():
    src = build_w1()
    yield src
    del src
    gc.collect()


def _archive_path() -> os.PathLike:
    base = fresh_dir(SHM_BASE)
    base.mkdir(parents=True)
    return base / "td.tdz"


def _drop_archive(path) -> None:
    if path is not None:
        remove(path.parent)


def _save_cases(ref_src, rs_src, limit: Case) -> dict[str, Case]:
    def setup_with(source):
        return lambda: (source, _archive_path())

    def save(state):
        td, path = state
        return td.memmap(path)

    def drop(state, result):
        if state is not None:
            _drop_archive(state[1])

    return {
        REF: Case(setup=setup_with(ref_src), call=save, cleanup=drop),
        RS: Case(setup=setup_with(rs_src), call=save, cleanup=drop),
        LIMIT: limit,
    }


def _dir_save_limit(rs_src) -> Case:
    """Our own directory save of the same tree (a copy per call: memmap_ works in place)."""

    def setup():
        return rs_src.clone(recurse=False), fresh_dir(SHM_BASE)

    def call(state):
        td, path = state
        return td.memmap_(path)

    def drop(state, result):
        if state is not None:
            remove(state[1])

    return Case(setup=setup, call=call, cleanup=drop)


@pytest.mark.parametrize("case", CASES)
def test_tdz_w3_save(benchmark, case, w3):
    n = len(flat_leaves(w3))
    ref_src, rs_src = ref_td(w3, []), rs_td(w3, [])
    measure("tdz_w3_save", n, lambda: _save_cases(ref_src, rs_src, _dir_save_limit(rs_src)))
    replay(benchmark, "tdz_w3_save", case)


@pytest.mark.parametrize("case", CASES)
def test_tdz_w1_save(benchmark, case, w1):
    batch = [w1_rows()]
    ref_src, rs_src = ref_td(w1, batch), rs_td(w1, batch)
    groups = split_two(byte_views(w1.values()))
    limit = Case(
        setup=lambda: fresh_dir(SHM_BASE),
        call=lambda path: write_two(groups, path),
        cleanup=lambda path, _: remove(path),
    )
    measure("tdz_w1_save", nbytes(w1.values()), lambda: _save_cases(ref_src, rs_src, limit))
    replay(benchmark, "tdz_w1_save", case)


@pytest.fixture(scope="module")
def w3_archive(w3):
    """W3 saved once by the reference as an archive; both libraries load this file."""
    path = _archive_path()
    ref_td(w3, []).memmap(path)
    gc.collect()
    yield path
    _drop_archive(path)


@pytest.fixture(scope="module")
def w1_archive(w1):
    path = _archive_path()
    ref_td(w1, [w1_rows()]).memmap(path)
    gc.collect()
    yield path
    _drop_archive(path)


def _read_file(path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return len(os.read(fd, os.fstat(fd).st_size))
    finally:
        os.close(fd)


@pytest.mark.parametrize("case", CASES)
def test_tdz_w3_load(benchmark, case, w3, w3_archive):
    n = len(flat_leaves(w3))
    cases = {
        REF: Case(call=lambda _: tensordict.TensorDict.load_memmap(w3_archive)),
        RS: Case(call=lambda _: tensordict_rs.TensorDict.load_memmap(w3_archive)),
        LIMIT: Case(call=lambda _: _read_file(w3_archive)),
    }
    measure("tdz_w3_load", n, lambda: cases)
    replay(benchmark, "tdz_w3_load", case)


@pytest.mark.parametrize("case", CASES)
def test_tdz_w1_load_first_read(benchmark, case, w1, w1_archive):
    resident = list(w1.values())

    def ref_call(_):
        return read_all(td_leaves(tensordict.TensorDict.load_memmap(w1_archive)))

    def rs_call(_):
        return read_all(td_leaves(tensordict_rs.TensorDict.load_memmap(w1_archive)))

    cases = {
        REF: Case(call=ref_call),
        RS: Case(call=rs_call),
        LIMIT: Case(call=lambda _: read_all(resident)),
    }
    measure("tdz_w1_load_read", nbytes(w1.values()), lambda: cases)
    replay(benchmark, "tdz_w1_load_read", case)


def test_tdz_roundtrip_sanity(w3, w3_archive, w1, w1_archive, tmp_path):
    """Both libraries read both archives back with the source's values (not timed)."""
    for lib in (tensordict, tensordict_rs):
        td = lib.TensorDict.load_memmap(w3_archive)
        assert torch.equal(
            td["a9", "b9", f"leaf{len(w3['a9']['b9']) - 1}"],
            w3["a9"]["b9"][f"leaf{len(w3['a9']['b9']) - 1}"],
        )
        td = lib.TensorDict.load_memmap(w1_archive)
        for key, value in w1.items():
            assert torch.equal(td[key], value), (lib.__name__, key)
    ours = rs_td(w3, []).memmap(tmp_path / "ours.tdz")
    ref = tensordict.TensorDict.load_memmap(tmp_path / "ours.tdz")
    assert torch.equal(ref["a0", "b0", "leaf0"], ours["a0", "b0", "leaf0"])
