"""Ragged sequences: nested-tensor leaves (strided and jagged) in memmap directories and .tdz
archives, both ways with tensordict 0.15.3; row indexing and random batches of sequences;
``to_padded_tensor``; anonymous maps, processes, consolidate."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as ours
import torch
import torch.multiprocessing as mp
from tensordict_rs import TensorDict

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")


def strided(*lengths: int, rest: tuple[int, ...] = (), dtype: torch.dtype = torch.float32) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor(
            [
                (torch.arange(n * max(1, _prod(rest))) + 100 * i).reshape(n, *rest).to(dtype)
                for i, n in enumerate(lengths)
            ]
        )


def jagged(*lengths: int, rest: tuple[int, ...] = (), dtype: torch.dtype = torch.float32) -> Any:
    return torch.nested.nested_tensor(
        [
            (torch.arange(n * max(1, _prod(rest))) + 100 * i).reshape(n, *rest).to(dtype)
            for i, n in enumerate(lengths)
        ],
        layout=torch.jagged,
    )


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def components(nt: torch.Tensor) -> list[list[Any]]:
    return [t.tolist() for t in nt.unbind(0)]


# ------------------------------------------------------------------------------------------
# Strided nested leaves: the reference's layout, both ways


def test_reference_strided_nested_loads_here(tmp_path: Path) -> None:
    nt = strided(3, 5, 0, 2, rest=(2,), dtype=torch.int16)
    ref.TensorDict({"seq": nt, "x": torch.zeros(4)}, [4]).memmap(tmp_path / "d")
    loaded = TensorDict.load_memmap(tmp_path / "d")["seq"]
    assert loaded.is_nested and loaded.layout == torch.strided and loaded.dtype == torch.int16
    assert components(loaded) == components(nt)


def test_strided_nested_written_here_is_the_references_layout(tmp_path: Path) -> None:
    nt = strided(3, 5, 2, rest=(2,))
    TensorDict({"seq": nt}, [3]).memmap(tmp_path / "ours")
    ref.TensorDict({"seq": nt}, [3]).memmap(tmp_path / "ref")
    for name in ("seq.memmap", "seq.shape.memmap"):
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    mine = json.loads((tmp_path / "ours" / "meta.json").read_bytes())["seq"]
    theirs = json.loads((tmp_path / "ref" / "meta.json").read_bytes())["seq"]
    assert (
        mine
        == theirs
        == {
            "device": "cpu",
            "shape": [3, 2],
            "dtype": "torch.float32",
            "is_nested": True,
        }
    )
    assert components(ref.TensorDict.load_memmap(tmp_path / "ours")["seq"]) == components(nt)


def test_save_td_with_nested_batch_dims_into_the_components(tmp_path: Path) -> None:
    """The reference's TestNestedTensor::test_save_td_with_nested: batch [2, 3] runs into the
    components' first dim."""
    nt = torch.nested.nested_tensor(
        [
            torch.arange(12, dtype=torch.float64).view(3, 4),
            torch.arange(15, dtype=torch.float64).view(3, 5),
        ]
    )
    td = TensorDict({"a": nt}, batch_size=[2, 3])
    saved = td.clone()
    td.memmap(tmp_path / "d")
    for loaded in (TensorDict.load(tmp_path / "d"), ref.TensorDict.load(tmp_path / "d")):
        for i in range(2):
            for j in range(3):
                assert torch.equal(loaded[i, j]["a"], saved[i, j]["a"])


# ------------------------------------------------------------------------------------------
# Jagged leaves: saved so that the reference reads them, loaded back jagged here


@pytest.mark.parametrize("rest", [(), (3,)], ids=["1d", "2d"])
def test_jagged_round_trip_keeps_offsets(tmp_path: Path, rest: tuple[int, ...]) -> None:
    nt = jagged(3, 5, 0, 2, rest=rest)
    TensorDict({"tokens": nt}, [4]).memmap(tmp_path / "d")
    back = TensorDict.load_memmap(tmp_path / "d")["tokens"]
    assert back.layout == torch.jagged and back._ragged_idx == 1
    assert torch.equal(back.offsets(), nt.offsets())
    assert torch.equal(back.values(), nt.values())


def test_jagged_written_here_loads_in_reference(tmp_path: Path) -> None:
    nt = jagged(3, 5, 2, rest=(2,))
    TensorDict({"tokens": nt}, [3]).memmap(tmp_path / "d")
    theirs = ref.TensorDict.load_memmap(tmp_path / "d")["tokens"]
    assert theirs.is_nested and components(theirs) == components(nt)
    entry = json.loads((tmp_path / "d" / "meta.json").read_bytes())["tokens"]
    assert entry["is_nested"] is True and entry["shape"] == [3, 2]
    assert entry["layout"] == "torch.jagged"


def test_jagged_view_with_holes_is_saved_compact(tmp_path: Path) -> None:
    values = torch.arange(10.0)
    nt = torch.nested.nested_tensor_from_jagged(
        values, offsets=torch.tensor([0, 4, 8]), lengths=torch.tensor([2, 3])
    )
    TensorDict({"t": nt}, [2]).memmap(tmp_path / "d")
    assert (tmp_path / "d" / "t.memmap").stat().st_size == 5 * 4
    back = TensorDict.load_memmap(tmp_path / "d")["t"]
    assert components(back) == [[0.0, 1.0], [4.0, 5.0, 6.0]]
    assert back.offsets().tolist() == [0, 2, 5]


def test_jagged_with_another_ragged_dim_is_refused(tmp_path: Path) -> None:
    nt = jagged(3, 5, rest=(2,)).transpose(1, 2)  # ragged dim 2
    with pytest.raises(ours.UnsupportedFormatError, match=r"""['"]t['"]"""):
        TensorDict({"t": nt}, [2]).memmap(tmp_path / "d")
    assert not (tmp_path / "d" / "t.memmap").exists()


def test_nested_tensor_without_components_is_refused_naming_the_key(tmp_path: Path) -> None:
    """A strided nested tensor of no components raised a bare IndexError (tensordict: a
    TypeError from from_file); it is refused naming the key, and nothing is written."""
    empty = torch.nested.nested_tensor([], dtype=torch.float32)
    with pytest.raises(ours.UnsupportedFormatError, match=r"'z'.*without components"):
        TensorDict({"z": empty}, [0]).memmap(tmp_path / "d")
    assert not (tmp_path / "d" / "meta.json").exists()


# ------------------------------------------------------------------------------------------
# Rows of a nested leaf


@pytest.mark.parametrize("make", [strided, jagged], ids=["strided", "jagged"])
@pytest.mark.parametrize("saved", [False, True], ids=["memory", "memmap"])
def test_indexing_rows_of_a_nested_leaf(tmp_path: Path, make: Any, saved: bool) -> None:
    nt = make(3, 5, 0, 2, 4)
    td = TensorDict({"seq": nt, "i": torch.arange(5)}, [5])
    if saved:
        td = td.memmap(tmp_path / "d")
    want = components(nt)
    assert td[1]["seq"].tolist() == want[1]
    for index in (
        torch.tensor([4, 0, 4, 2]),
        [3, 1],
        slice(1, 4),
        slice(None, None, 2),
        torch.tensor([True, False, True, False, True]),
    ):
        rows = td[index]
        got = rows["seq"]
        assert got.is_nested and got.layout == nt.layout
        assert components(got) == [want[int(i)] for i in rows["i"]]


def test_random_batch_of_sequences_equals_the_padded_alternative(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 40, (2000,), generator=g)
    nt = torch.nested.nested_tensor_from_jagged(
        torch.arange(int(lengths.sum()), dtype=torch.int32), lengths=None, offsets=_offsets(lengths)
    )
    TensorDict({"tokens": nt}, [2000]).memmap(tmp_path / "d")
    data = TensorDict.load_memmap(tmp_path / "d")
    padded = torch.nested.to_padded_tensor(nt, -1)
    rows = torch.randint(0, 2000, (256,), generator=g)
    batch = data[rows]
    assert torch.equal(batch.to_padded_tensor(padding=-1)["tokens"], _pad_rows(padded, rows))


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])


def _pad_rows(padded: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    picked = padded[rows]
    width = int((picked != -1).sum(1).max()) if picked.numel() else 0
    return picked[:, :width]


# ------------------------------------------------------------------------------------------
# to_padded_tensor, side by side


@pytest.mark.parametrize("make", [strided, jagged], ids=["strided", "jagged"])
def test_to_padded_tensor_matches_reference(make: Any) -> None:
    def build(pkg: Any) -> Any:
        return pkg.TensorDict(
            {"seq": make(3, 1, 4, rest=(2,)), "x": torch.arange(3.0), "sub": {"s": make(2, 0, 1)}},
            [3],
        )

    mine, theirs = build(ours).to_padded_tensor(padding=-1.0), build(ref).to_padded_tensor(-1.0)
    assert mine.batch_size == theirs.batch_size
    for key in theirs.keys(include_nested=True, leaves_only=True):
        assert not mine[key].is_nested
        assert torch.equal(mine[key], theirs[key]), key
    with pytest.raises(RuntimeError, match="mask_key"):
        build(ours).to_padded_tensor(mask_key="mask")


# ------------------------------------------------------------------------------------------
# Archives, anonymous maps, processes, consolidate


def test_strided_nested_archive_both_ways(tmp_path: Path) -> None:
    nt = strided(3, 5, 2)
    ref.TensorDict({"seq": nt}, [3]).memmap(tmp_path / "ref.tdz")
    assert components(TensorDict.load_memmap(tmp_path / "ref.tdz")["seq"]) == components(nt)
    TensorDict({"seq": nt}, [3]).memmap(tmp_path / "ours.tdz")
    assert components(ref.TensorDict.load_memmap(tmp_path / "ours.tdz")["seq"]) == components(nt)
    assert ours.verify(tmp_path / "ours.tdz") == []


def test_jagged_archive_round_trip(tmp_path: Path) -> None:
    nt = jagged(3, 5, 2)
    TensorDict({"seq": nt}, [3]).memmap(tmp_path / "ours.tdz")
    back = TensorDict.load_memmap(tmp_path / "ours.tdz")["seq"]
    assert back.layout == torch.jagged and torch.equal(back.offsets(), nt.offsets())
    assert components(ref.TensorDict.load_memmap(tmp_path / "ours.tdz")["seq"]) == components(nt)


@pytest.mark.parametrize("make", [strided, jagged], ids=["strided", "jagged"])
def test_anonymous_memmap_of_nested(make: Any) -> None:
    nt = make(3, 5, 2)
    td = TensorDict({"seq": nt}, [3]).memmap_()
    assert td.is_memmap() and td["seq"].layout == nt.layout
    assert components(td["seq"]) == components(nt)


def _child_sums(queue: Any, back: Any) -> None:
    td = queue.get()
    back.put((td["seq"].layout == torch.jagged, [float(t.sum()) for t in td["seq"].unbind(0)]))


@pytest.mark.parametrize("how", ["anonymous", "directory"])
def test_process_receives_jagged_leaf(tmp_path: Path, how: str) -> None:
    nt = jagged(3, 5, 2)
    td = TensorDict({"seq": nt}, [3])
    td = td.memmap_() if how == "anonymous" else td.memmap(tmp_path / "d")
    ctx = mp.get_context("spawn")
    queue, back = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_child_sums, args=(queue, back))
    child.start()
    queue.put(td)
    got = back.get(timeout=120)
    child.join(60)
    assert got == (True, [float(t.sum()) for t in nt.unbind(0)])


def test_pickle_keeps_jagged_offsets() -> None:
    nt = jagged(3, 0, 2)
    back = pickle.loads(pickle.dumps(TensorDict({"seq": nt}, [3])))["seq"]
    assert back.layout == torch.jagged and torch.equal(back.offsets(), nt.offsets())


@pytest.mark.parametrize("make", [strided, jagged], ids=["strided", "jagged"])
def test_consolidate_keeps_nested_leaves(make: Any) -> None:
    """consolidate (and torch.distributed, the same one-message path) carries nested leaves:
    their components come back exact, views of the one buffer
    (tests/share/test_nested_packed.py has the rest: layouts, hostile data, distributed)."""
    nt = make(3, 0, 5)
    c = TensorDict({"seq": nt, "x": torch.arange(3.0)}, [3]).consolidate()
    assert c.is_consolidated() and c["seq"].layout == nt.layout
    for a, b in zip(c["seq"].unbind(), nt.unbind(), strict=True):
        assert torch.equal(a, b)


def test_nested_leaf_name_collision_is_refused(tmp_path: Path) -> None:
    """A nested leaf ``x`` keeps its sizes in ``x.shape.memmap``: a dense leaf named ``x.shape``
    would write the same file, so the save is refused before anything is written."""
    td = TensorDict({"x": strided(2, 3), "x.shape": torch.zeros(2)}, [2])
    with pytest.raises(ours.InvalidTreeError, match=r"""['"]x\.shape['"]"""):
        td.memmap(tmp_path / "d")
    assert not (tmp_path / "d").exists() or not list((tmp_path / "d").glob("*.memmap"))
