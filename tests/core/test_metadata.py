"""``MetaData`` (issue 21), side by side with tensordict 0.15.3.

Each scenario is a function of the package (``ours`` or ``ref``) that builds the same input and
returns what it observes (``observe``: the class name, batch size and value of a non-tensor
entry, and whether it still holds the input's very object), so that "one MetaData" and "a
stack" are told apart, not only the values. Saved directories differ (see the last tests):
the writer here records a MetaData as a NonTensorData and refuses the reference's "MetaData"
directories, which needs a change of the Rust format code.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as ours
import torch

OBJ = {"config": [1, 2]}  # the shared object of the identity scenarios


def observe(x: Any) -> Any:
    """A comparable description of an entry or a tree (trees: every entry)."""
    if isinstance(x, (ours.TensorDict, ref.TensorDict)):
        return {k: observe(x.get(k)) for k in sorted(x.keys())}
    name = type(x).__name__
    if name.startswith("MetaData") or name == "NonTensorData":
        return (name, tuple(x.batch_size), x.data, x.data is OBJ)
    if name == "NonTensorStack":
        return (name, tuple(x.batch_size), x.tolist())
    if isinstance(x, torch.Tensor):
        return ("Tensor", tuple(x.shape), x.tolist())
    return (name, x)


def both(fn: Any) -> None:
    assert observe(fn(ours)) == observe(fn(ref))


def test_exported_where_the_reference_exports_it() -> None:
    from tensordict.tensorclass import MetaData as RefMetaData
    from tensordict_rs.tensorclass import MetaData

    assert ours.MetaData is MetaData and ref.MetaData is RefMetaData
    assert issubclass(ours.MetaData, ours.NonTensorData)
    assert ours.is_non_tensor(ours.MetaData(3)) == ref.is_non_tensor(ref.MetaData(3))


@pytest.mark.parametrize(
    "scenario",
    [
        lambda m: m.MetaData(OBJ, batch_size=[3]),
        lambda m: m.MetaData(OBJ, batch_size=[3]).expand(2, 3),
        lambda m: m.MetaData(OBJ, batch_size=[1]).expand((2, 3)),
        lambda m: m.MetaData(OBJ, batch_size=[3]).unsqueeze(0),
        lambda m: m.MetaData(OBJ, batch_size=[3])[1:],
        lambda m: m.MetaData(OBJ, batch_size=[3])[0],
        lambda m: m.MetaData(OBJ, batch_size=[1, 3]).squeeze(0),
        lambda m: m.MetaData(OBJ, batch_size=[2, 3]).reshape(6),
        lambda m: m.MetaData[dict](OBJ, batch_size=[2]).unsqueeze(1),
        lambda m: torch.stack([m.MetaData(OBJ), m.MetaData(OBJ)]),
        lambda m: torch.stack([m.MetaData(OBJ), m.MetaData({"config": [1, 2]})]),
        lambda m: torch.stack(
            [m.MetaData(OBJ, batch_size=[2]), m.MetaData(OBJ, batch_size=[2])], 1
        ),
        lambda m: m.MetaData(OBJ).clone(recurse=False),
    ],
)
def test_entry(scenario: Any) -> None:
    both(scenario)


def _td(m: Any, value: Any, batch: Any = ()) -> Any:
    return m.TensorDict(a=torch.zeros(*batch, 2), foo=value, batch_size=batch)


@pytest.mark.parametrize(
    "scenario",
    [
        lambda m: _td(m, m.MetaData(OBJ)).unsqueeze(0),
        lambda m: _td(m, m.MetaData(OBJ)).unsqueeze(0).squeeze(0),
        lambda m: _td(m, m.MetaData(OBJ, batch_size=[3]), [3]).expand(2, 3),
        lambda m: _td(m, m.MetaData(OBJ, batch_size=[3]), [3])[1],
        lambda m: _td(m, m.MetaData(OBJ, batch_size=[3]), [3])[torch.tensor([0, 2])],
        lambda m: torch.stack([_td(m, m.MetaData(OBJ)), _td(m, m.MetaData(OBJ))]),
        # equal values, distinct objects: a stack (identity, not equality)
        lambda m: torch.stack([_td(m, m.MetaData(OBJ)), _td(m, m.MetaData(dict(OBJ)))]),
        lambda m: torch.stack([_td(m, m.MetaData(OBJ)), _td(m, m.MetaData("other"))]),
        lambda m: torch.stack([_td(m, m.MetaData[dict](OBJ)), _td(m, m.MetaData[dict](OBJ))]),
    ],
)
def test_tree(scenario: Any) -> None:
    both(scenario)


def test_getitem_gives_the_value() -> None:
    for m in (ours, ref):
        td = _td(m, m.MetaData(OBJ)).unsqueeze(0)
        assert td["foo"] is OBJ
        assert td.squeeze(0)["foo"] is OBJ


def test_typed() -> None:
    for m in (ours, ref):
        cls = m.MetaData[int]
        assert cls is m.MetaData[int]  # cached
        assert cls.__name__ == "MetaData[int]"
        assert issubclass(cls, m.MetaData)
        assert isinstance(cls(0, batch_size=(3,)), m.MetaData)
        assert not isinstance(m.MetaData(0), cls)
        with pytest.raises(TypeError, match="Expected data of type int, got str"):
            cls("a string")
        with pytest.raises(TypeError, match="Cannot specify type"):
            cls[str]


def test_repr() -> None:
    assert repr(ours.MetaData[int](4)).startswith("MetaData[int](data=4, batch_size=")
    assert repr(ref.MetaData[int](4)).startswith("MetaData[int](data=4, batch_size=")


@pytest.mark.parametrize("typed", [False, True])
def test_pickle(typed: bool) -> None:
    def scenario(m: Any) -> Any:
        value = m.MetaData[dict](OBJ) if typed else m.MetaData(OBJ)
        td = pickle.loads(pickle.dumps(_td(m, value)))
        return observe(td)["foo"][:3]  # a copy: no longer the same object

    assert scenario(ours) == scenario(ref)


def test_shared_memory_keeps_the_class() -> None:
    td = _td(ours, ours.MetaData({"k": 1})).share_memory_()
    assert type(td.get("foo")) is ours.MetaData
    assert td["foo"] == {"k": 1}


def _child(queue: Any, result: Any) -> None:
    td = queue.get()
    result.put([(type(td.get(k)).__name__, td[k]) for k in ("m", "t")])


@pytest.mark.parametrize("share", [False, True])
def test_other_process_keeps_the_class(share: bool) -> None:
    def scenario(m: Any) -> Any:
        td = m.TensorDict(
            a=torch.zeros(2), m=m.MetaData({"k": 1}), t=m.MetaData[int](3), batch_size=[2]
        )
        if share:
            td.share_memory_()
        queue, result = torch.multiprocessing.Queue(), torch.multiprocessing.Queue()
        proc = torch.multiprocessing.Process(target=_child, args=(queue, result))
        proc.start()
        queue.put(td)
        out = result.get(timeout=60)
        proc.join(timeout=60)
        return out

    expected = [("MetaData", {"k": 1}), ("MetaData[int]", 3)]
    assert scenario(ours) == expected
    if not share:  # tensordict 0.15.3 shares the value in a multiprocessing Value, which a
        # Queue refuses ("Synchronized objects should only be shared ... through inheritance")
        assert scenario(ref) == expected


def test_saved_directory_records_a_non_tensor_data(tmp_path: Path) -> None:
    """What differs: a MetaData saved here comes back, here and in the reference, as a
    NonTensorData with its value (the writer, in Rust, knows one class name)."""
    _td(ours, ours.MetaData({"k": 1}), [2]).memmap(tmp_path / "d")
    for m in (ours, ref):
        back = m.TensorDict.load_memmap(tmp_path / "d")
        assert type(back.get("foo")).__name__ == "NonTensorData"
        assert back["foo"] == {"k": 1}


def test_reference_metadata_directory_is_refused(tmp_path: Path) -> None:
    """What differs: the reference's "MetaData" entries are refused with a clear error (the
    loader, in Rust, reads "NonTensorData" entries only)."""
    _td(ref, ref.MetaData({"k": 1}), [2]).memmap(tmp_path / "d")
    with pytest.raises(ours.UnsupportedFormatError, match="MetaData"):
        ours.TensorDict.load_memmap(tmp_path / "d")
