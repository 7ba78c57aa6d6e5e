"""tensorclass side by side with tensordict 0.15.3: construction, indexing, row assignment,
operations, nesting, options, DataLoader batches, the helpers (stack/cat/pad/...) and utils."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import pytest
import tensordict as ref
import tensordict_rs as rs
import torch

from .._tensorclasses import check, define, error, same

# ---------------------------------------------------------------------------------- construction


def construction(pkg: Any, base: bool) -> list[Any]:
    Point = define(
        pkg,
        "Point",
        {"x": torch.Tensor, "y": (torch.Tensor, None), "label": (str, "none")},
        base=base,
    )
    p = Point(x=torch.arange(6.0).view(3, 2), batch_size=[3])
    print(p)
    q = Point(torch.zeros(3), torch.ones(3), "pos", batch_size=[3])
    print(q)
    print(Point(x=torch.zeros(2, 4), batch_size=[2], device="cpu"))
    print(p.y, p.label, q.label)
    p.y = torch.ones(3)
    p.label = "new"
    print(p)
    out = [p.x, p.y, p.batch_size, p.shape, p.device, p.batch_dims, len(p), p.numel()]
    out.append(error(lambda: setattr(p, "z", 1)))
    out.append(error(lambda: Point(x=torch.zeros(2), batch_size=[3])))
    out.append(error(lambda: p["x"]))
    p.batch_size = [3]
    out.append(p.batch_size)
    out.append([f.name for f in dataclasses.fields(Point)])
    out.append(dataclasses.is_dataclass(p))
    out.append((pkg.is_tensorclass(p), pkg.is_tensorclass(Point), pkg.is_tensor_collection(p)))
    out.append(isinstance(p, pkg.TensorDictBase))
    out.append(pkg.is_tensorclass(pkg.TensorDict({}, [])))
    return out


@pytest.mark.parametrize("base", [False, True], ids=["decorator", "base_class"])
def test_construction(base: bool) -> None:
    check(construction, base)


def post_init_and_methods(pkg: Any) -> list[Any]:
    @pkg.tensorclass
    class Scaled:
        vals: torch.Tensor
        scale: float = 2.0

        def __post_init__(self) -> None:
            self.vals = self.vals * self.scale

        def total(self) -> torch.Tensor:
            return self.vals.sum()

        @classmethod
        def ones(cls, n: int) -> Any:
            return cls(vals=torch.ones(n), batch_size=[n])

    s = Scaled.ones(4)
    print(s)
    return [s.vals, s.total(), s[1:].total(), s.scale]


def test_post_init_and_methods() -> None:
    check(post_init_and_methods)


def non_tensor_fields(pkg: Any) -> list[Any]:
    Tagged = define(pkg, "Tagged", {"x": torch.Tensor, "name": str, "meta": dict})
    t = Tagged(x=torch.zeros(4, 2), name="run-1", meta={"a": [1, 2]}, batch_size=[4])
    print(t)
    print(t[0])
    print(t[1:3])
    return [t.name, t.meta, t[2].name, t.clone().name]


def test_non_tensor_fields() -> None:
    check(non_tensor_fields)


# ---------------------------------------------------------------------------------- indexing


def indexing(pkg: Any) -> list[Any]:
    Data = define(pkg, "IdxData", {"images": torch.Tensor, "targets": torch.Tensor})
    n = 10
    d = Data(
        images=torch.arange(n * 12, dtype=torch.uint8).view(n, 3, 2, 2),
        targets=torch.arange(n),
        batch_size=[n],
    )
    out = []
    for index in [
        3,
        slice(2, 7),
        slice(None, None, 3),
        [1, 4, 4],
        torch.tensor([9, 0]),
        torch.arange(n) % 2 == 0,
        (Ellipsis,),
        -1,
    ]:
        sub = d[index]
        print(sub)
        out += [sub.images, sub.targets, type(sub).__name__]
    out.append(d.__getitems__([0, 5, 2]).targets)
    out.append(error(lambda: d[n]))
    return out


def test_indexing() -> None:
    check(indexing)


def row_assignment(pkg: Any) -> list[Any]:
    Data = define(pkg, "RowData", {"images": torch.Tensor, "targets": torch.Tensor})
    n = 8
    d = Data(
        images=torch.zeros(n, 3, dtype=torch.uint8),
        targets=torch.zeros(n, dtype=torch.int64),
        batch_size=[n],
    )
    d[2:5] = Data(
        images=torch.ones(3, 3, dtype=torch.uint8), targets=torch.arange(3), batch_size=[3]
    )
    d[torch.tensor([0, 7])] = Data(
        images=torch.full((2, 3), 9, dtype=torch.uint8),
        targets=torch.tensor([5, 6]),
        batch_size=[2],
    )
    d[1] = Data(
        images=torch.full((3,), 4, dtype=torch.uint8), targets=torch.tensor(4), batch_size=[]
    )
    d[6] = 3  # a scalar into every field
    d[5:6] = pkg.TensorDict(
        {"images": torch.full((1, 3), 7, dtype=torch.uint8), "targets": torch.tensor([8])}, [1]
    )
    print(d)
    Other = define(pkg, "RowOther", {"a": torch.Tensor})
    bad = error(lambda: d.__setitem__(slice(0, 1), Other(a=torch.zeros(1), batch_size=[1])))
    return [d.images, d.targets, bad, error(lambda: d.__setitem__(0, "text"))]


def test_row_assignment() -> None:
    check(row_assignment)


# ---------------------------------------------------------------------------------- operations


def operations(pkg: Any) -> list[Any]:
    # (no non-tensor field: stacking equal strings gives a NonTensorStack in tensordict 0.15.3,
    # issue 21's subject)
    Pair = define(pkg, "OpPair", {"a": torch.Tensor, "b": torch.Tensor, "tag": (Any, None)})
    p = Pair(a=torch.arange(6.0).view(3, 2), b=torch.ones(3, dtype=torch.int64), batch_size=[3])
    out: list[Any] = []
    for result in [
        torch.stack([p, p]),
        torch.stack([p, p], 1),
        torch.cat([p, p[:1]]),
        p.to("cpu"),
        p.to(torch.float64),
        p.clone(),
        p.apply(lambda t: t * 2),
        p.apply(lambda x, y: x + y, p),
        p.unsqueeze(0),
        p.reshape(3, 1),
        p.expand(2, 3),
        p.float(),
        p.exclude("b"),
        p.select("a"),
        p.detach(),
        p.contiguous(),
        p.unbind(0)[1],
        p.split(2)[0],
        p.chunk(3)[2],
        p == p.clone(),
        p + 1,
        torch.zeros_like(p),
    ]:
        print(result)
        out += [type(result).__name__, result.a, result.batch_size]
    clone = p.clone()
    out.append(clone.a is p.a)
    inplace = p.clone()
    out.append(inplace.zero_() is inplace)
    out.append(inplace.a)
    out.append(bool((p == p).all()))
    out.append(p.to_tensordict()["a"])
    print(p.to_tensordict())
    out.append(type(p.to_tensordict()).__name__)
    td = pkg.TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [2])
    from_td = Pair.from_tensordict(td)
    print(from_td)
    from_td.a = torch.full((2,), 5.0)
    out.append(td["a"])
    out += [from_td.tag, pkg.stack([p, p]).a, pkg.cat([p, p]).a]
    return out


def test_operations() -> None:
    check(operations)


def nested(pkg: Any) -> list[Any]:
    Inner = define(pkg, "NestInner", {"y": torch.Tensor})
    Outer = define(pkg, "NestOuter", {"x": torch.Tensor, "inner": Inner, "td": Any})
    o = Outer(
        x=torch.arange(4.0),
        inner=Inner(y=torch.arange(8).view(4, 2), batch_size=[4]),
        td=pkg.TensorDict({"z": torch.ones(4, 1)}, [4]),
        batch_size=[4],
    )
    print(o)
    print(o[1:3])
    s = torch.stack([o, o])
    print(s)
    out = [type(o.inner).__name__, type(o[0].inner).__name__, type(s.inner).__name__]
    out += [o.inner.y, o[2].inner.y, s.inner.y, o.clone().inner.y]
    o.inner.y = torch.zeros(4, 2, dtype=torch.int64)
    out.append(o.inner.y)
    td = pkg.TensorDict({"tc": o}, [4])
    print(td)
    out += [type(td["tc"]).__name__, type(td[0]["tc"]).__name__]
    return out


def test_nested() -> None:
    check(nested)


def options(pkg: Any) -> list[Any]:
    out: list[Any] = []
    Plain = define(pkg, "Plain", {"y": int})
    out.append(Plain(torch.ones(())).y)
    Auto = define(pkg, "Auto", {"y": int}, autocast=True)
    out.append(Auto(torch.ones(())).y)
    NoCast = define(pkg, "NoCast", {"y": Any}, nocast=True)
    out.append(NoCast(1).y)
    Cast = define(pkg, "Cast", {"y": Any})
    out.append(Cast(1).y)
    Frozen = define(pkg, "Frozen", {"x": torch.Tensor}, frozen=True)
    f = Frozen(x=torch.zeros(2), batch_size=[2])
    out.append(error(lambda: setattr(f, "x", torch.ones(2))))
    out.append(f.x)
    FrozenBase = define(pkg, "FrozenBase", {"x": torch.Tensor}, base=True, frozen=True)
    g = FrozenBase(x=torch.zeros(2), batch_size=[2])
    out.append(error(lambda: setattr(g, "x", torch.ones(2))))
    NoCastBase = define(pkg, "NoCastBase", {"y": Any}, base=True, nocast=True)
    out.append(NoCastBase(1).y)
    out.append(error(lambda: define(pkg, "Clash", {"reshape": torch.Tensor})))
    return out


def test_options() -> None:
    check(options)


def member_named_fields(pkg: Any) -> list[Any]:
    """Fields named ``data`` and ``fields`` replace those members without ``shadow=True``, as
    in tensordict 0.15.3 (found by its test_tensorclass.py: refused here before); any other
    member's name is refused."""
    Holder = define(pkg, "Holder", {"data": torch.Tensor, "fields": (Any, None)})
    h = Holder(data=torch.arange(6.0).view(3, 2), fields="f", batch_size=[3])
    h.data = h.data + 1
    rows = h[1:]
    stacked = torch.stack([h, h])
    return [
        h.data, h.fields, rows.data, stacked.data.shape, sorted(h.to_tensordict().keys()),
        error(lambda: define(pkg, "Bad", {"apply": torch.Tensor})),
        error(lambda: define(pkg, "BadToo", {"batch_size": torch.Tensor})),
    ]  # fmt: skip


def test_fields_named_data_and_fields() -> None:
    check(member_named_fields)


def list_fields(pkg: Any) -> list[Any]:
    """A list given to a field is taken as a TensorDict takes it (tensordict 0.15.3, its
    test_set_list_in_constructor): strings per row a stack, numbers a tensor, tensors their
    stack, a length that is not the batch size an error (a NonTensorData of the list here
    before)."""
    Row = define(pkg, "ListRow", {"a": str, "z": list, "n": (Any, None)})
    out: list[Any] = []
    for kwargs, batch in [
        ({"a": ["x", "y"], "z": ["p", "q"]}, [2]),
        ({"a": ["x"], "z": ["p", "q", "r"]}, []),
        ({"a": "s", "z": [1, 2], "n": [torch.ones(2), torch.zeros(2)]}, [2]),
        ({"a": "s", "z": ["p", "q", "r"]}, [2]),
    ]:
        try:
            row = Row(**kwargs, batch_size=batch)
        except Exception as err:
            out.append(type(err).__name__)
            continue
        # (each package's LinkedList as a plain list: they do not compare equal across packages)
        values = [row.a, row.z, row.n, row[0].a if batch else None]
        out.append([list(v) if isinstance(v, list) else v for v in values])
    return out


def test_list_fields() -> None:
    check(list_fields)


# ---------------------------------------------------------------------------------- data loading


def loading(pkg: Any, calls: list[Any]) -> list[Any]:
    Data = define(pkg, "LoadData", {"images": torch.Tensor, "targets": torch.Tensor})
    n = 20
    data = Data(
        images=torch.arange(n * 3, dtype=torch.uint8).view(n, 3),
        targets=torch.arange(n),
        batch_size=[n],
    )
    data.memmap_()

    def collate(batch: Any) -> Any:
        calls.append(type(batch).__name__)
        return batch

    loader = torch.utils.data.DataLoader(data, batch_size=6, collate_fn=collate)
    out = []
    for batch in loader:
        out += [type(batch).__name__, batch.batch_size, batch.images, batch.targets]
    shuffled = torch.utils.data.DataLoader(
        data,
        batch_size=6,
        collate_fn=collate,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    for batch in shuffled:
        out += [batch.targets, batch.numel()]
    return out


def test_dataloader_batches() -> None:
    calls_rs: list[Any] = []
    calls_ref: list[Any] = []
    same(loading(rs, calls_rs), loading(ref, calls_ref))
    assert calls_rs == calls_ref == ["LoadData"] * 8  # one tensorclass per batch, no per-row list


# ---------------------------------------------------------------------------------- helpers


def helpers(pkg: Any) -> list[Any]:
    a = pkg.TensorDict({"x": torch.arange(3.0), "n": {"y": torch.ones(3, 2)}}, [3])
    b = pkg.TensorDict({"x": torch.arange(2.0), "n": {"y": torch.zeros(2, 2)}}, [2])
    out: list[Any] = []
    for result in [
        pkg.pad(a, [1, 2], value=-1.0),
        pkg.pad_sequence([a, b]),
        pkg.pad_sequence([a, b], return_mask=True),
        pkg.merge_tensordicts(
            pkg.TensorDict({"p": torch.zeros(3)}, [3]), pkg.TensorDict({"q": torch.ones(3)}, [3])
        ),
        pkg.dense_stack_tds([a, a.clone()], 0),
        pkg.dense_stack_tds(pkg.lazy_stack([a, a.clone()])),
        pkg.lazy_stack([a, a.clone()]).contiguous(),
        pkg.stack([a, a]),
        pkg.cat([a, b]),
    ]:
        print(result)
        out.append(result.to_dict() if hasattr(result, "to_dict") else result)
    return out


def test_helpers() -> None:
    check(helpers)


def test_utils_names() -> None:
    from tensordict_rs import utils

    for name in ["print_directory_tree", "is_tensorclass", "is_non_tensor", "unravel_key"]:
        assert callable(getattr(utils, name)), name
    assert utils.strtobool("True") is True and utils.strtobool("0") is False
    with pytest.raises(ValueError):
        utils.strtobool("maybe")


def cast_filter(pkg: Any) -> list[Any]:
    Mesh = define(
        pkg,
        "Mesh",
        {"points": torch.Tensor, "cells": torch.Tensor},
        cast_filter=lambda key, value: value.is_floating_point(),
    )
    m = Mesh(points=torch.zeros(4, 3), cells=torch.zeros(2, 3, dtype=torch.long))
    return [
        m.bfloat16().points.dtype,
        m.bfloat16().cells.dtype,
        m.bfloat16(cast_filter=None).cells.dtype,
        m.double().cells.dtype,
    ]


def test_cast_filter() -> None:
    check(cast_filter)


def tensor_only(pkg: Any) -> list[Any]:
    Strict = define(pkg, "Strict", {"x": torch.Tensor, "y": (torch.Tensor, None)}, tensor_only=True)
    s = Strict(x=1.5, y=[1, 2])
    bad = error(lambda: define(pkg, "Loose", {"x": torch.Tensor, "name": str}, tensor_only=True))
    return [s.x, s.y, Strict(x=torch.zeros(2)).y, bad]


def test_tensor_only() -> None:
    check(tensor_only)


def _state_dict_round_trip(pkg: Any, flatten: bool) -> Any:
    """A tensorclass's state dict: tensor fields as entries; its class name and non-tensor
    fields (None ones too) in the ``_metadata`` record of its level; loaded back."""
    cls = define(pkg, "Sd", {"x": torch.Tensor, "z": str, "y": (Any, None), "w": (Any, None)})
    tc = cls(x=torch.arange(3.0), z="top", y=cls(x=torch.ones(3), z="in", batch_size=[]))
    sd = tc.state_dict(flatten=flatten)
    records = sd._metadata if flatten else {"": sd._metadata[""], "y": sd["y"]._metadata[""]}
    out = [sorted(sd), {k: (r.get("_type"), r.get("_non_tensor")) for k, r in records.items()}]
    dst = cls(x=torch.zeros(3), z="old", y=cls(x=torch.zeros(3), z="old", batch_size=[]))
    dst.load_state_dict(sd)
    out += [dst.x, dst.y.x, dst.z, dst.y.z, dst.w]
    sd = tc.state_dict()
    sd["unexpected"] = torch.zeros(())
    out.append(error(lambda: dst.load_state_dict(sd)))
    return out


@pytest.mark.parametrize("flatten", [True, False])
def test_state_dict_round_trip(flatten: bool) -> None:
    """(Non-tensor fields were entries among the tensors, and loading them back raised.)"""
    check(_state_dict_round_trip, flatten)


def test_state_dict_legacy_format() -> None:
    """tensordict before 0.11 saved a tensorclass as ``_tensordict`` and ``_non_tensordict``."""

    def scenario(pkg: Any) -> Any:
        cls = define(pkg, "Legacy", {"x": torch.Tensor, "y": torch.Tensor})
        tc = cls(x=torch.zeros(3), y=torch.zeros(3), batch_size=[3])
        legacy = collections.OrderedDict(
            _tensordict=collections.OrderedDict(
                x=torch.arange(3.0), y=torch.ones(3), __batch_size=torch.Size([3]), __device=None
            ),
            _non_tensordict={},
        )
        tc.load_state_dict(legacy)
        return [tc.x, tc.y, tc.batch_size]

    check(scenario)
    # a non-tensor field too (tensordict 0.15.3's legacy loader raises for one: its strict
    # check counts the field among the tensors)
    cls = define(rs, "LegacyNamed", {"x": torch.Tensor, "name": str})
    tc = cls(x=torch.zeros(3), name="old", batch_size=[3])
    tc.load_state_dict(
        collections.OrderedDict(
            _tensordict=collections.OrderedDict(x=torch.arange(3.0), __batch_size=torch.Size([3])),
            _non_tensordict={"name": "new"},
        )
    )
    assert tc.name == "new" and torch.equal(tc.x, torch.arange(3.0))


def test_frozen_is_locked_and_hashable() -> None:
    """As tensordict's: a frozen tensorclass is locked from its construction and hashable; an
    other one is unhashable (a dataclass with ``==``). (Ours was neither locked nor unhashable.)"""

    def scenario(pkg: Any) -> Any:
        frozen = define(pkg, "Frozen", {"y": torch.Tensor}, frozen=True, autocast=True)
        plain = define(pkg, "Plain", {"y": torch.Tensor}, autocast=True)
        x = frozen(y=1)
        try:
            x.set("y", torch.tensor(2))
            refused: Any = None
        except RuntimeError as err:  # LockedError here, a RuntimeError subclass
            refused = isinstance(err, RuntimeError)
        out = [x.is_locked, {x: 0}[x], refused]
        out.append(error(lambda: hash(plain(y=1))))
        out.append(error(lambda: hash(define(pkg, "Based", {"y": torch.Tensor}, base=True)(y=1))))
        return out

    assert check(scenario)[0] is True


def test_classmethods_return_the_class() -> None:
    """TensorDict's classmethods called on a tensorclass (and a subclass) give an instance of
    it, as tensordict's (they were missing)."""

    def scenario(pkg: Any) -> Any:
        cls = define(pkg, "Mc", {"foo": Any, "bar": Any}, base=True)
        child = type("McChild", (cls,), {"__module__": "tc_shared", "__qualname__": "McChild"})
        mc = cls(foo=torch.zeros(3), bar=torch.ones(3), batch_size=[3])
        made = [
            cls.from_list([{"foo": 1, "bar": 2}, {"foo": 3, "bar": 4}]),
            child.from_list([{"foo": 1, "bar": 2}]),
            cls.fromkeys(["foo", "bar"], 0),
            *(getattr(cls, name)([mc, mc]) for name in ("stack", "cat", "maybe_dense_stack")),
        ]
        return [[type(m).__qualname__, tuple(m.batch_size), m.foo] for m in made]

    check(scenario)


def test_select_as_tensordict() -> None:
    def scenario(pkg: Any) -> Any:
        cls = define(pkg, "Sel", {"obs": torch.Tensor, "action": torch.Tensor, "label": str})
        t = cls(obs=torch.zeros(2), action=torch.ones(2), label="cat", batch_size=[2])
        kept = t.select("obs", "action")
        plain = t.select("obs", "action", as_tensordict=True)
        return [
            type(kept).__qualname__,
            kept.label,
            type(plain).__name__,
            sorted(plain.keys()),
            t.select("obs", inplace=True) is t,
            t.action,
            type(pkg.TensorDict(a=torch.zeros(3)).select("a", as_tensordict=True)).__name__,
        ]

    check(scenario)


def test_tensordict_operand_of_tensorclass() -> None:
    """``td == tc`` (and arithmetic) pairs the tensorclass's entries with the TensorDict's, as
    ``tc == td`` does (each leaf was compared with the whole tensorclass)."""

    def scenario(pkg: Any) -> Any:
        cls = define(pkg, "Eq", {"x": torch.Tensor, "z": str, "y": (Any, None)})
        a = cls(
            torch.zeros(3), "z0", cls(torch.ones(3), "z1", None, batch_size=[3]), batch_size=[3]
        )
        c = pkg.TensorDict(
            {"x": torch.zeros(3), "z": "z0", "y": {"x": torch.ones(3), "z": "z1"}}, batch_size=[3]
        )
        return [
            bool((c == a).all()),
            bool((c[:2] == a[:2]).all()),
            bool((c != a).any()),
            (c + a)["y", "x"],
            type(c == a).__name__,
        ]

    check(scenario)


def test_metadata_field_kept() -> None:
    """A ``MetaData`` field stays a ``MetaData`` (it was wrapped in a plain NonTensorData), so
    stacking the tensorclass keeps one value, as tensordict's."""

    def scenario(pkg: Any) -> Any:
        cls = define(pkg, "WithMeta", {"custom_data": pkg.MetaData}, base=True)
        tc = cls(custom_data=pkg.MetaData("abc"))
        stacked = torch.stack([tc, tc], 0)
        entry = stacked._tensordict._tensordict.get("custom_data")
        return [
            type(tc._tensordict._tensordict.get("custom_data")).__name__,
            type(entry).__name__,
            stacked.custom_data,
            tuple(stacked.batch_size),
        ]

    check(scenario)


def test_non_tensor_names_of_the_tensorclass_module() -> None:
    """``from tensordict.tensorclass import NonTensorData, NonTensorDataBase, NonTensorStack``
    (the reference's own tests import them so): the same isinstance answers as there."""
    import importlib

    answers = []
    for name in ("tensordict_rs", "tensordict"):
        P = importlib.import_module(name)
        module = importlib.import_module(f"{name}.tensorclass")
        td = P.TensorDict({"s": "x", "m": P.MetaData(3), "a": torch.zeros(2), "l": ["p", "q"]}, [2])
        answers.append(
            [
                (k, isinstance(v, module.NonTensorDataBase), isinstance(v, module.NonTensorStack))
                for k, v in td.items(True)
            ]
        )
    assert answers[0] == answers[1]


def test_in_memory_behaviours_as_tensordict() -> None:
    """Found by an attack, side by side with tensordict 0.15.3: ``to_tensordict`` makes a
    nested tensorclass a TensorDict (it stayed one of the class), iterating a tensorclass
    without batch dims raises TypeError (it gave nothing), and an empty list index picks no
    rows (torch refused ``torch.as_tensor([])``, a float tensor)."""
    import tensordict
    import tensordict_rs

    for lib in (tensordict, tensordict_rs):

        @lib.tensorclass
        class Inner:
            x: torch.Tensor

        @lib.tensorclass
        class Outer:
            a: torch.Tensor
            inner: Inner | None = None

        s = Outer(a=torch.zeros(2), inner=Inner(x=torch.ones(2), batch_size=[2]), batch_size=[2])
        plain = s.to_tensordict()
        assert type(plain["inner"]) is lib.TensorDict, lib.__name__
        assert type(s.inner) is Inner and torch.equal(plain["inner", "x"], torch.ones(2))
        with pytest.raises(TypeError, match="0-d"):
            list(Outer(a=torch.zeros(3), batch_size=[]))
        assert s[[]].batch_size == torch.Size([0]), lib.__name__
        assert lib.TensorDict(a=torch.zeros(4, 3), batch_size=[4])[[]].batch_size == (0,)


def test_stack_and_cat_of_another_tensorclass_raise() -> None:
    """Found by an attack: ``torch.stack``/``torch.cat`` (and ``stack``/``cat``) of two
    tensorclasses of different classes raise TypeError, as in tensordict, even when their
    fields are the same (ours stacked them as the first class)."""

    def scenario(pkg: Any) -> Any:
        obs = define(pkg, "StObs", {"a": torch.Tensor})
        act = define(pkg, "StAct", {"a": torch.Tensor})
        o, a = obs(a=torch.zeros(2), batch_size=[2]), act(a=torch.ones(2), batch_size=[2])
        return [
            error(lambda: torch.stack([o, a])),
            error(lambda: torch.cat([o, a])),
            error(lambda: pkg.stack([a, o])),
            error(lambda: torch.where(torch.ones(2, dtype=torch.bool), o, a)),
            type(torch.stack([o, o])).__name__,
            torch.cat([a, a]).a,
        ]

    assert check(scenario)[:4] == ["TypeError"] * 4


def test_nested_dict_into_a_tensorclass_field() -> None:
    """Found by an attack: ``from_dict``, ``from_tensordict`` and ``update`` with a nested dict
    for a field annotated with a tensorclass build that class, as tensordict's (ours kept a
    TensorDict); an entry with keys that are no fields of the class stays a TensorDict."""

    def scenario(pkg: Any) -> Any:
        inner = define(pkg, "NdInner", {"x": torch.Tensor, "y": (torch.Tensor | None, None)})
        outer = define(
            pkg,
            "NdOuter",
            {"a": torch.Tensor, "inner": (inner | None, None), "other": (Any, None)},
        )
        x = torch.ones(2)
        made = [
            outer.from_dict({"a": torch.zeros(2), "inner": {"x": x}}, batch_size=[2]),
            outer.from_dict({"a": torch.zeros(2), ("inner", "x"): x}, auto_batch_size=True),
            outer.from_tensordict(pkg.TensorDict(a=torch.zeros(2), inner={"x": x}, batch_size=[2])),
            outer.from_dict({"a": torch.zeros(2), "inner": {"x": x, "z": x}}, batch_size=[2]),
        ]
        for update in ({"inner": {"x": x}}, {("inner", "x"): x}, {"other": {"x": x}}):
            made.append(outer(a=torch.zeros(2), batch_size=[2]).update(update))
        stacked = torch.stack([outer(a=torch.zeros(2), batch_size=[2])] * 2)
        made.append(stacked.update({"inner": {"x": torch.ones(2, 2)}}))
        out = []
        for m in made:
            nested = m.inner if m.inner is not None else m.other
            out.append([type(nested).__name__, tuple(nested.batch_size), nested.get("x")])
        plain = pkg.TensorDict(a=torch.zeros(2), inner={"x": x}, batch_size=[2])
        outer.from_tensordict(plain).inner.y = x  # the source's nested TensorDict is not changed
        out.append(sorted(plain["inner"].keys()))
        return out

    out = check(scenario)
    assert [row[0] for row in out[:-1]] == ["NdInner"] * 3 + ["TensorDict"] + ["NdInner"] * 2 + [
        "TensorDict",
        "NdInner",
    ]


def test_max_and_min_along_a_dim_keep_the_class() -> None:
    """Found by an attack: ``max``/``min``/``cummax``/``cummin(dim=...)`` give values and
    indices of the tensorclass, as tensordict's (ours gave its internal TensorDict class)."""

    def scenario(pkg: Any) -> Any:
        cls = define(pkg, "MaxDim", {"a": torch.Tensor})
        s = cls(a=torch.tensor([[1.0, 5.0], [7.0, 2.0]]), batch_size=[2, 2])
        out = []
        for op in ("max", "min", "cummax", "cummin"):
            r = getattr(s, op)(dim=0)
            out.append([type(r).__name__, type(r.values).__qualname__, r.values.a, r.indices.a])
        return out

    check(scenario)


def test_to_dict_keeps_the_fields_that_hold_nothing() -> None:
    """Found by an attack: ``to_dict()`` has the fields set to None (nested ones too), as
    tensordict's (ours left them out); ``retain_none=False`` leaves them out."""

    def scenario(pkg: Any) -> Any:
        inner = define(pkg, "TdInner", {"x": torch.Tensor, "y": (torch.Tensor | None, None)})
        cls = define(
            pkg,
            "TdNone",
            {"a": torch.Tensor, "inner": (Any, None), "b": (Any, None), "name": (Any, None)},
        )
        s = cls(a=torch.zeros(2), inner=inner(x=torch.ones(2), batch_size=[2]), batch_size=[2])
        kept = cls.from_tensordict(
            pkg.TensorDict(a=torch.zeros(2), batch_size=[2]), non_tensordict={"name": "hey"}
        )
        return [
            s.to_dict(),
            s.to_dict(retain_none=False),
            s.to_dict(convert_tensors=True),
            list(s.to_dict()),
            kept.to_dict(),
            kept.to_dict(retain_none=False),
        ]

    check(scenario)


def test_del_field_sets_it_to_none() -> None:
    """Found by an attack: ``del tc.field`` makes the field None, as tensordict's (ours
    raised AttributeError); locked, frozen, or not a field: tensordict's errors."""

    def scenario(pkg: Any) -> Any:
        cls = define(pkg, "DelF", {"a": torch.Tensor, "b": (Any, None), "name": (Any, None)})
        frozen = define(pkg, "DelFrozen", {"a": torch.Tensor}, frozen=True)
        s = cls(a=torch.zeros(2), b=torch.ones(2), name="hi", batch_size=[2])
        del s.b
        del s.name
        out: list[Any] = [s.b, s.name, sorted(s._tensordict.keys()), s.to_dict()]
        del s.b  # already None
        locked = cls(a=torch.zeros(2), batch_size=[2]).lock_()
        for key in ("a", "b"):  # (tensordict's RuntimeError, our LockedError is one)
            with pytest.raises(RuntimeError, match="locked"):
                delattr(locked, key)
        out.append(error(lambda: s.__delattr__("zz")))
        out.append(error(lambda: frozen(a=torch.zeros(2), batch_size=[2]).__delattr__("a")))
        return out

    assert check(scenario)[4:] == ["KeyError", "FrozenInstanceError"]


def test_empty_does_not_run_post_init() -> None:
    """Found by an attack: ``empty()`` gives the shell without running ``__post_init__``, as
    tensordict's (ours ran it, which failed on the missing fields)."""

    def scenario(pkg: Any) -> Any:
        @pkg.tensorclass
        class WithPost:
            a: torch.Tensor
            b: Any = None

            def __post_init__(self) -> None:
                if self.b is None:
                    self.b = torch.zeros_like(self.a)

        p = WithPost(a=torch.ones(4), batch_size=[4])
        e = p.empty()
        return [type(e).__name__, tuple(e.batch_size), e.a, e.b, p.b, p.clone().b]

    check(scenario)


def test_fields_classmethod_deprecated() -> None:
    """Found by an attack: tensordict's deprecated ``fields()`` classmethod (ours had none):
    ``dataclasses.fields`` of the class, with a DeprecationWarning."""
    for pkg in (rs, ref):
        cls = define(pkg, "WithFields", {"a": torch.Tensor, "name": (str, "x")})
        with pytest.warns(DeprecationWarning, match="dataclasses.fields"):
            names = [f.name for f in cls.fields()]
        assert names == ["a", "name"], pkg.__name__
        with pytest.warns(DeprecationWarning):
            assert cls(a=torch.zeros(1), batch_size=[1]).fields() == dataclasses.fields(cls)


def test_error_types_of_unknown_keys() -> None:
    """Found by an attack: an unknown constructor keyword raises AttributeError (TypeError
    while an argument is also missing), ``update``/``update_`` with a key that is no field
    raise ValueError naming it, as tensordict's (ours: TypeError, KeyError, or the key was
    added)."""

    def scenario(pkg: Any) -> Any:
        cls = define(pkg, "ErrKeys", {"a": torch.Tensor, "b": (Any, None)})
        s = cls(a=torch.zeros(4), batch_size=[4])
        out = [
            error(lambda: cls(a=torch.zeros(4), zz=1, batch_size=[4])),
            error(lambda: cls(zz=1, batch_size=[4])),
            error(lambda: cls(torch.zeros(4), None, 1, batch_size=[4])),
            error(lambda: s.update({"zz": torch.zeros(4)})),
            error(lambda: s.update_({"zz": torch.zeros(4)})),
            error(lambda: s.update({("zz", "y"): torch.zeros(4)})),
            error(lambda: s.update_({"b": torch.zeros(4)})),
            sorted(s._tensordict.keys()),
        ]
        s.update({"b": torch.ones(4)})
        s.update_({"b": torch.zeros(4)})
        out.append(s.b)
        return out

    out = check(scenario)
    assert out[:6] == ["AttributeError", "TypeError", "TypeError"] + ["ValueError"] * 3
    with pytest.raises(ValueError, match="zz"):
        define(rs, "ErrKeys", {"a": torch.Tensor})(a=torch.zeros(1), batch_size=[1]).update_(
            {"zz": torch.zeros(1)}
        )


def test_own_init_taking_any_keyword() -> None:
    """A tensorclass whose own ``__init__`` takes ``**kwargs`` is made (the signature with the
    TensorDict's keywords failed) and takes any keyword, as tensordict's."""

    def scenario(pkg: Any) -> Any:
        @pkg.tensorclass
        class OwnInit:
            a: torch.Tensor

            def __init__(self, **kwargs: Any) -> None:
                self.a = kwargs.get("a", torch.zeros(2))

        made = OwnInit(a=torch.ones(2), extra=3, batch_size=[2])
        return [made.a, tuple(made.batch_size), OwnInit(batch_size=[2]).a]

    check(scenario)
