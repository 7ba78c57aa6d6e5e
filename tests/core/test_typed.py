"""``TypedTensorDict``, side by side with tensordict 0.15.3's: classes declared the same way in
both packages (``_classes``), the same calls, compared structurally."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any, NotRequired

import pytest
import tensordict as ref
import tensordict_rs as rs
import torch
from torch.utils import _pytree

PKGS = [rs, ref]


def _classes(P: Any) -> Any:
    class State(P.TypedTensorDict):
        obs: torch.Tensor
        reward: torch.Tensor
        done: NotRequired[torch.Tensor]

    class Step(State):  # a subclass adds fields
        action: torch.Tensor
        scale: float = 1.0  # a default: optional

    class Frozen(P.TypedTensorDict["frozen"]):
        x: torch.Tensor

    return State, Step, Frozen


def _state(State: Any, n: int = 4) -> Any:
    return State(obs=torch.arange(n * 3.0).view(n, 3), reward=torch.ones(n), batch_size=[n])


def _plain(value: Any) -> Any:
    if isinstance(value, (rs.TensorDict, ref.TensorDictBase)):
        return {
            "class": type(value).__name__,
            "batch": tuple(value.batch_size),
            "locked": value.is_locked,
            "entries": {
                k: _plain(v)
                for k, v in value.items(include_nested=False)
                if not isinstance(v, (rs.NonTensorData, ref.NonTensorData))
            },
        }
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return value


def _outcome(call: Any) -> Any:
    try:
        return _plain(call())
    except Exception as err:  # compared by type: the same failure in both packages
        return ("raised", type(err).__name__)


def side_by_side(case: Any) -> None:
    ours, theirs = (case(P) for P in PKGS)
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert _outcome(a) == _outcome(b), f"call {i}"


def _construction(P: Any) -> list[Any]:
    State, Step, Frozen = _classes(P)
    s = _state(State)
    return [
        lambda: s,
        lambda: (s.obs.shape, s.reward.sum()),
        lambda: (State.__required_keys__, State.__optional_keys__, State.__expected_keys__),
        lambda: (Step.__required_keys__, Step.__optional_keys__, Step.__field_defaults__),
        lambda: State(obs=torch.zeros(2)),  # a required field missing: TypeError
        lambda: State(obs=torch.zeros(2), reward=torch.zeros(2), other=1),  # unknown: TypeError
        lambda: Step(obs=torch.zeros(2), reward=torch.zeros(2), action=torch.zeros(2)).scale,
        lambda: Frozen(x=torch.zeros(2), batch_size=[2]),  # locked by its constructor
        lambda: s.done,  # declared, not set: AttributeError
        lambda: State.from_tensordict(P.TensorDict(obs=torch.zeros(2))),  # missing: TypeError
    ]


def test_construction_and_fields() -> None:
    side_by_side(_construction)


def _operations(P: Any) -> list[Any]:
    State, _, _ = _classes(P)
    s = _state(State)
    s.done = torch.zeros(4, dtype=torch.bool)  # a field set as an attribute
    return [
        lambda: s[1:3],
        lambda: s[0],
        lambda: s.clone(),
        lambda: s.apply(lambda t: t * 2),
        lambda: s.to_tensordict(),
        lambda: s.exclude("reward"),
        lambda: s.reshape(2, 2),
        lambda: s.unsqueeze(0),
        lambda: P.stack([s, s]),
        lambda: P.cat([s, s]),
        lambda: s + 1,
        lambda: s.select("obs"),
        lambda: dict(**s).keys(),
    ]


def test_operations_keep_the_class() -> None:
    side_by_side(_operations)


def test_from_tensordict_shares_entries() -> None:
    """Both hold the same entries: a write or a new key through one is seen by the other."""
    for P in PKGS:
        State, _, _ = _classes(P)
        td = P.TensorDict(obs=torch.zeros(3, 2), reward=torch.zeros(3), batch_size=[3])
        state = State.from_tensordict(td)
        assert state.obs is td["obs"]
        state.obs += 1
        state["extra"] = torch.ones(3)
        assert (td["obs"] == 1).all() and "extra" in td.keys()
        assert type(state).__name__ == "State"


def test_from_tensordict_of_a_memory_map(tmp_path: Path) -> None:
    for i, P in enumerate(PKGS):
        State, _, _ = _classes(P)
        td = P.TensorDict(obs=torch.zeros(3, 2), reward=torch.zeros(3), batch_size=[3])
        td.memmap_(tmp_path / str(i))
        state = State.from_tensordict(td)
        assert state.is_memmap() and state.is_locked


def test_options() -> None:
    for P in PKGS:
        with pytest.raises(AttributeError, match="shadows"):

            class Bad(P.TypedTensorDict):
                sum: torch.Tensor

        class Shadow(P.TypedTensorDict["shadow"]):
            sum: torch.Tensor

        assert (Shadow(sum=torch.ones(2)).sum == 1).all()  # the field hides the method

        class Locked(P.TypedTensorDict, frozen=True):
            x: torch.Tensor

        assert Locked(x=torch.zeros(1)).is_locked
        with pytest.raises(ValueError, match="Unknown TypedTensorDict option"):
            P.TypedTensorDict["wrong"]
        with pytest.warns(DeprecationWarning, match="no effect"):
            P.TypedTensorDict["autocast"]


def test_dict_source_warns_for_missing_fields() -> None:
    for P in PKGS:
        State, _, _ = _classes(P)
        with pytest.warns(FutureWarning, match="misses the required field"):
            State({"obs": torch.zeros(2)}, batch_size=[2])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = State.from_dict({"obs": torch.zeros(2)}, batch_size=[2], check=False)
        assert type(got).__name__ == "State"


def test_pytree_and_vmap_keep_the_class() -> None:
    State, _, _ = _classes(rs)
    s = _state(State)
    leaves, spec = _pytree.tree_flatten(s)
    back = _pytree.tree_unflatten(leaves, spec)
    assert type(back) is State and (back.obs == s.obs).all()
    out = torch.vmap(lambda t: t * 2)(s)
    assert type(out) is State and (out.obs == s.obs * 2).all()


class _Pickled(rs.TypedTensorDict):
    """Module level: pickles by reference."""

    obs: torch.Tensor
    reward: torch.Tensor


def test_memmap_round_trip_and_pickle(tmp_path: Path) -> None:
    s = _state(_Pickled)
    s.memmap(tmp_path / "s")
    loaded = rs.TensorDict.load_memmap(tmp_path / "s")
    assert (loaded["obs"] == s.obs).all()
    back = pickle.loads(pickle.dumps(s))
    assert type(back) is _Pickled and (back.obs == s.obs).all()
