"""Growth in place along the first batch dim (issue 24): extend_, append_, resize_.

Every grown directory is loaded here and by the reference ``tensordict`` 0.15.3, which must see
the same rows; growths from several processes take turns and append after each other.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest
import tensordict
import tensordict_rs
import torch
from tensordict_rs import TensorDict


def rows(start: int, stop: int) -> TensorDict:
    """Rows ``start:stop``, each holding its own index (so a torn or misplaced row shows)."""
    idx = torch.arange(start, stop)
    return TensorDict(
        {
            "obs": idx[:, None].float().expand(-1, 3).clone(),
            "act": (-idx).to(torch.int64),
            "flag": (idx % 2 == 0),
        },
        [stop - start],
    )


def check_rows(td: object, n: int) -> None:
    idx = torch.arange(n)
    assert td.batch_size == torch.Size([n])  # type: ignore[attr-defined]
    assert torch.equal(td["obs"], idx[:, None].float().expand(-1, 3))  # type: ignore[index]
    assert torch.equal(td["act"], -idx)  # type: ignore[index]
    assert torch.equal(td["flag"], idx % 2 == 0)  # type: ignore[index]


def test_extend_on_disk_loads_here_and_in_reference(tmp_path: Path) -> None:
    td = rows(0, 5).memmap(tmp_path / "buf")
    for start in range(5, 500, 37):
        td.extend_(rows(start, start + 37))
    n = 5 + 37 * len(range(5, 500, 37))
    check_rows(td, n)
    check_rows(TensorDict.load_memmap(tmp_path / "buf"), n)
    check_rows(tensordict.TensorDict.load_memmap(tmp_path / "buf"), n)
    assert tensordict_rs.verify(tmp_path / "buf") == []
    # the reservation lives in the same files: longer than the leaf
    assert os.path.getsize(tmp_path / "buf" / "obs.memmap") >= n * 3 * 4


def test_append_and_mapping_rows(tmp_path: Path) -> None:
    td = rows(0, 0).memmap(tmp_path / "buf")  # no rows: no data files yet
    for i in range(20):
        td.append_(
            {
                "obs": torch.full((3,), float(i)),
                "act": torch.tensor(-i),
                "flag": torch.tensor(i % 2 == 0),
            }
        )
    check_rows(td, 20)
    check_rows(tensordict.TensorDict.load_memmap(tmp_path / "buf"), 20)
    td.extend_(
        {"obs": rows(20, 22)["obs"], "act": rows(20, 22)["act"], "flag": rows(20, 22)["flag"]}
    )
    check_rows(TensorDict.load_memmap(tmp_path / "buf"), 22)


def test_resize_shrinks_and_grows_with_zeros(tmp_path: Path) -> None:
    td = rows(0, 10).memmap(tmp_path / "buf")
    td.resize_(4)
    check_rows(td, 4)
    check_rows(tensordict.TensorDict.load_memmap(tmp_path / "buf"), 4)
    td.resize_(7)
    assert td.batch_size == torch.Size([7])
    assert td["obs"][4:].abs().sum() == 0 and td["act"][4:].abs().sum() == 0  # not the old rows
    loaded = tensordict.TensorDict.load_memmap(tmp_path / "buf")
    assert torch.equal(loaded["obs"], td["obs"])
    with pytest.raises(ValueError, match="negative"):
        td.resize_(-1)


def test_anonymous_growth(tmp_path: Path) -> None:
    td = rows(0, 3).memmap_()
    before = td["obs"]
    for start in range(3, 300, 9):
        td.extend_(rows(start, start + 9))
    check_rows(td, 300)
    assert td.is_memmap() and td.batch_size == torch.Size([300])
    assert before.shape == (3, 3) and torch.equal(before, rows(0, 3)["obs"])  # still valid


def test_views_taken_before_a_growth_stay_valid_and_shared(tmp_path: Path) -> None:
    td = rows(0, 4).memmap(tmp_path / "buf")
    view = td["obs"]
    batch = td[1:3]
    for start in range(4, 4000, 100):  # well past any reservation: the file is mapped again
        td.extend_(rows(start, start + 100))
    view[0] = 42.0  # the old map and the new one are the same file
    assert td["obs"][0].tolist() == [42.0] * 3
    td["obs"][2] = -1.0
    assert batch["obs"][1].tolist() == [-1.0] * 3


def test_refused_trees(tmp_path: Path) -> None:
    nested = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}}, [2]).memmap(
        tmp_path / "n"
    )
    with pytest.raises(tensordict_rs.UnsupportedFormatError, match="'n'"):
        nested.extend_({"a": torch.zeros(1), "n": {"b": torch.zeros(1)}})
    with pytest.raises(RuntimeError, match="memmap_"):
        rows(0, 2).extend_(rows(2, 3))
    td = rows(0, 2).memmap(tmp_path / "k")
    with pytest.raises(KeyError, match="obs"):
        td.extend_(
            TensorDict(
                {
                    "act": torch.zeros(1, dtype=torch.int64),
                    "flag": torch.zeros(1, dtype=torch.bool),
                },
                [1],
            )
        )
    with pytest.raises(ValueError, match="batch size"):
        td.extend_(TensorDict({"obs": torch.zeros(1, 2, 3)}, [1, 2]))
    check_rows(TensorDict.load_memmap(tmp_path / "k"), 2)  # nothing changed


def _grow_in_child(prefix: str, start: int, count: int) -> None:
    td = TensorDict.load_memmap(prefix)
    td.extend_(rows(start, start + count))


def test_growth_from_several_processes_in_turn(tmp_path: Path) -> None:
    prefix = tmp_path / "buf"
    td = rows(0, 10).memmap(prefix)
    ctx = mp.get_context("spawn")
    n = 10
    for _ in range(3):
        p = ctx.Process(target=_grow_in_child, args=(os.fspath(prefix), n, 25))
        p.start()
        p.join(120)
        assert p.exitcode == 0
        n += 25
        # this process's view is stale; a growth here appends after the others' rows
        td.extend_(rows(n, n + 5))
        n += 5
    check_rows(td, n)
    check_rows(TensorDict.load_memmap(prefix), n)
    check_rows(tensordict.TensorDict.load_memmap(prefix), n)


def test_memmap_refresh_sees_new_rows(tmp_path: Path) -> None:
    a = rows(0, 4).memmap(tmp_path / "buf")
    b = rows(0, 4).memmap(tmp_path / "buf", existsok=True, copy_existing=True)
    c = TensorDict.load_memmap(tmp_path / "buf")
    a = TensorDict.load_memmap(tmp_path / "buf")
    a.extend_(rows(4, 9))
    assert b.batch_size == torch.Size([4]) and c.batch_size == torch.Size([4])
    check_rows(b.memmap_refresh_(), 9)  # a memory-mapped tree: refreshed from its directory
    check_rows(c.load_memmap_(tmp_path / "buf"), 9)  # a loaded one: loaded again in place
    ref = tensordict.TensorDict.load_memmap(tmp_path / "buf")
    check_rows(ref, 9)
