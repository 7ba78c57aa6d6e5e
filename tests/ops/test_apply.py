"""apply and clone."""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict_rs import TensorDict

from .._trees import META, SOURCE_A, file_floats, make_td

# --------------------------------------------------------------------------------- apply / clone


def test_apply() -> None:
    td = make_td()
    out = td.apply(lambda t: t * 2)
    assert out is not td
    assert out.batch_size == td.batch_size
    assert torch.equal(out["a"], SOURCE_A * 2)
    assert torch.equal(out["n", "x"], torch.arange(12).reshape(4, 3) * 2)
    assert out["n", "deep"].batch_size == torch.Size([4, 3, 5])
    assert out["s"] == "text"
    assert torch.equal(td["a"], SOURCE_A)


def test_apply_with_others() -> None:
    td = TensorDict({"a": torch.ones(3), "n": {"b": torch.ones(3, 2)}}, [3])
    o1 = TensorDict({"a": torch.full((3,), 2.0), "n": {"b": torch.full((3, 2), 3.0)}}, [3])
    o2 = TensorDict({"a": torch.full((3,), 10.0), "n": {"b": torch.full((3, 2), 20.0)}}, [3])
    out = td.apply(lambda x, y, z: x + y * z, o1, o2)
    assert torch.equal(out["a"], torch.full((3,), 21.0))
    assert torch.equal(out["n", "b"], torch.full((3, 2), 61.0))


def test_apply_none_drops_and_batch_size_and_device() -> None:
    td = TensorDict({"a": torch.ones(3, 2), "b": torch.ones(3, 2, dtype=torch.int64)}, [3])
    out = td.apply(lambda t: t if t.is_floating_point() else None)
    assert out.keys() == ["a"]
    reduced = td.apply(lambda t: t.sum(0), batch_size=[2])
    assert reduced.batch_size == torch.Size([2])
    assert torch.equal(reduced["a"], torch.full((2,), 3.0))
    on_meta = td.apply(lambda t: t, device="meta")
    assert on_meta.device == META and on_meta["a"].device == META


def test_apply_inplace() -> None:
    td = TensorDict({"a": torch.ones(3), "n": {"b": torch.ones(3, 2)}}, [3])
    other = TensorDict({"a": torch.full((3,), 2.0), "n": {"b": torch.full((3, 2), 3.0)}}, [3])
    a, b = td["a"], td["n", "b"]
    assert td.apply(lambda x, y: x + y, other, inplace=True) is td
    assert td["a"] is a and torch.equal(a, torch.full((3,), 3.0))
    assert td["n", "b"] is b and torch.equal(b, torch.full((3, 2), 4.0))


def test_apply_inplace_on_locked_memmap(tmp_prefix: Path) -> None:
    td = TensorDict({"a": torch.ones(3)}, [3]).memmap_(tmp_prefix)
    td.apply(lambda t: t * 5, inplace=True)
    td.flush()
    assert file_floats(tmp_prefix / "a.memmap") == [5.0, 5.0, 5.0]


def test_clone(tmp_prefix: Path) -> None:
    td = make_td(device="cpu")
    c = td.clone()
    assert c is not td
    assert c.batch_size == td.batch_size and c.device == td.device
    assert c.keys(include_nested=True) == td.keys(include_nested=True)
    for key in td.keys(include_nested=True, leaves_only=True):
        if key == "s":
            assert c[key] == "text"
            continue
        assert c[key] is not td[key]
        assert torch.equal(c[key], td[key])
        assert c[key].data_ptr() != td[key].data_ptr()
    c["a"].fill_(0)
    assert torch.equal(td["a"], SOURCE_A)
    shallow = td.clone(recurse=False)
    assert shallow is not td and shallow["a"] is td["a"]
    shallow["new"] = torch.zeros(4, 3)
    assert "new" not in td
    # A memory-mapped source gives plain, unlocked tensors.
    mm = td.memmap_(tmp_prefix)
    c = mm.clone()
    assert type(c["a"]) is torch.Tensor
    assert not c.is_locked and not c.is_memmap()
    assert torch.equal(c["a"], SOURCE_A)
    c["a"].fill_(0)
    assert torch.equal(mm["a"], SOURCE_A)


def test_apply_batch_size_sets_nested_batch_size_as_tensordict() -> None:
    # a batch_size given to apply is the nested TensorDicts' batch size too (no extra dims)
    import tensordict as ref
    import tensordict_rs as ours

    def run(pkg: object) -> object:
        nested = pkg.TensorDict(  # type: ignore[attr-defined]
            {"b": torch.zeros(2, 3, 1, 5), "m": {"c": torch.zeros(2, 3, 1, 2)}}, [2, 3, 1]
        )
        td = pkg.TensorDict({"a": torch.zeros(2, 3, 4), "n": nested}, [2, 3])  # type: ignore[attr-defined]
        results = []
        for batch_size in ([3], [], None):
            fn = (lambda x: x.sum(0)) if batch_size == [3] else (lambda x: x)
            out = td.apply(fn, batch_size=batch_size)
            results.append(
                {
                    str(k): v.batch_size
                    for k, v in out.items(True)
                    if isinstance(v, pkg.TensorDict)  # type: ignore[attr-defined]
                }
            )
        return results

    assert run(ours) == run(ref)
