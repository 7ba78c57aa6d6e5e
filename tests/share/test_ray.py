"""Trees through Ray's object store: one local Ray per test session, on loopback only.

``ray.put``/``ray.get``, task arguments and return values, actor calls; the tree ``ray.get``
gives on this node views one object-store buffer, read-only, without a copy. The reference's
trees go through the same calls for comparison. Ray comes with the ``test`` extra; the module
is skipped only where Ray cannot be imported (it has no wheel for the platform).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

# before ``import ray``: the node address resolves to 127.0.0.1, not the network interface
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import pytest
import tensordict
import torch
from tensordict_rs import TensorDict
from tensordict_rs._native import LockedError
from tensordict_rs.share import packed

ray = pytest.importorskip("ray")

LOOPBACK = "127.0.0.1"


@pytest.fixture(scope="session")
def local_ray() -> Iterator[Any]:
    """One small local Ray (2 CPUs, 256 MiB object store, no dashboard) on 127.0.0.1."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=256 << 20,
        _node_ip_address=LOOPBACK,
        log_to_driver=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()


def test_every_node_is_on_loopback(local_ray: Any) -> None:
    nodes = ray.nodes()
    assert nodes and all(node["NodeManagerAddress"] == LOOPBACK for node in nodes)
    assert ray.get_runtime_context().gcs_address.startswith(LOOPBACK + ":")
    assert ray.get(_node_ip.remote()) == LOOPBACK


@ray.remote
def _node_ip() -> str:
    return str(ray.util.get_node_ip_address())


def batch(rows: int = 8, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "obs": torch.randn(rows, 64, generator=g),
            "action": torch.randint(0, 6, (rows,), generator=g),
            "reward": torch.randn(rows, generator=g).to(torch.bfloat16),
            "next": {"obs": torch.randn(rows, 64, generator=g), "done": torch.zeros(rows, 1)},
            "meta": {"policy": "ppo", "tag": f"seed-{seed}"},
        },
        [rows],
    )


def same(a: TensorDict, b: TensorDict) -> bool:
    keys = a.keys(include_nested=True, leaves_only=True)
    if a.batch_size != b.batch_size or set(map(str, keys)) != set(
        map(str, b.keys(include_nested=True, leaves_only=True))
    ):
        return False
    for key in keys:
        x, y = a.get(key), b.get(key)
        if isinstance(x, torch.Tensor):
            if not (x.dtype == y.dtype and torch.equal(x, y)):
                return False
        elif x != y:
            return False
    return True


def span(td: TensorDict) -> tuple[int, int]:
    whole = packed.plan(td).whole
    assert whole is not None
    return whole.data_ptr(), whole.numel()


def test_put_get_views_one_object_store_buffer(local_ray: Any) -> None:
    td = batch().consolidate()
    ref = ray.put(td)
    got = ray.get(ref)
    assert same(got, td)
    assert got.is_read_only and got["meta", "policy"] == "ppo"
    start, nbytes = span(got)
    leaves = got.values(include_nested=True, leaves_only=True)
    assert all(start <= t.data_ptr() and t.data_ptr() + t.nbytes <= start + nbytes for t in leaves)
    again = ray.get(ref)  # the same object-store memory, not a copy per get
    assert span(again) == (start, nbytes)
    assert [t.data_ptr() for t in again.values(True, True)] == [t.data_ptr() for t in leaves]
    assert "plasma" in _mapping_of(start)  # the object store's shared memory (/dev/shm/plasma*)
    assert "plasma" not in _mapping_of(packed.plan(td).whole.data_ptr())


def _mapping_of(address: int) -> str:
    """The /proc/self/maps line that holds ``address`` (its range and path)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            low, high = (int(x, 16) for x in line.split()[0].split("-"))
            if low <= address < high:
                return line.strip()
    return ""


def test_a_plain_tree_goes_packed(local_ray: Any) -> None:
    td = batch(seed=1)
    got = ray.get(ray.put(td))
    assert same(got, td) and got.is_read_only


def test_writes_are_refused_and_clone_is_writable(local_ray: Any) -> None:
    got = ray.get(ray.put(batch(seed=2).consolidate()))
    with pytest.raises(LockedError, match=r"read-only buffer.*clone"):
        got.zero_()
    with pytest.raises(LockedError, match="read-only buffer"):
        got[0] = 0.0
    mine = got.clone()
    mine.unlock_()["obs"].zero_()
    assert got["obs"].abs().sum() > 0 and mine["obs"].abs().sum() == 0


@ray.remote
def _rollout(rows: int, seed: int) -> TensorDict:
    return batch(rows, seed).consolidate()


@ray.remote
def _learn(td: TensorDict) -> tuple[float, bool, str]:
    return float(td["obs"].sum()), td.is_read_only, td["meta", "policy"]


def test_task_arguments_and_return_values(local_ray: Any) -> None:
    got = ray.get(_rollout.remote(16, 3))
    assert same(got, batch(16, 3)) and got.is_read_only
    total, read_only, policy = ray.get(_learn.remote(_rollout.remote(16, 3)))
    assert total == pytest.approx(float(batch(16, 3)["obs"].sum()), rel=1e-5)
    assert read_only and policy == "ppo"
    total, _, _ = ray.get(_learn.remote(batch(4, 5)))  # a tree as a direct argument
    assert total == pytest.approx(float(batch(4, 5)["obs"].sum()), rel=1e-5)


@ray.remote
class _Replay:
    """A replay buffer actor: trees in, trees of sampled rows out."""

    def __init__(self) -> None:
        self.storage: list[TensorDict] = []

    def extend(self, td: TensorDict) -> int:
        # a writable copy of the object-store view (the per-batch tag left out: one value
        # per non-tensor entry survives a cat)
        self.storage.append(td.exclude("meta").clone())
        return sum(t.batch_size[0] for t in self.storage)

    def sample(self, rows: torch.Tensor) -> TensorDict:
        return torch.cat(self.storage)[rows].consolidate()


def test_actor_calls(local_ray: Any) -> None:
    replay = _Replay.remote()
    assert ray.get(replay.extend.remote(batch(8, 6))) == 8
    assert ray.get(replay.extend.remote(_rollout.remote(8, 7))) == 16
    rows = torch.tensor([0, 9, 15])
    got = ray.get(replay.sample.remote(rows))
    expected = torch.cat([batch(8, 6).exclude("meta"), batch(8, 7).exclude("meta")])[rows]
    assert torch.equal(got["obs"], expected["obs"])
    assert torch.equal(got["next", "done"], expected["next", "done"])
    assert got.batch_size == torch.Size([3])


def test_reference_trees_through_the_same_calls(local_ray: Any) -> None:
    """tensordict 0.15.3's TensorDict crosses too, its leaves pickled in-band: each get is a
    copy (different memory each time), where ours are views of the object store."""
    ours = batch(seed=8).consolidate()
    ref = tensordict.TensorDict(
        {"obs": ours["obs"].clone(), "next": {"obs": ours["next", "obs"].clone()}},
        batch_size=[8],
    )
    ref_obj = ray.put(ref)
    a, b = ray.get(ref_obj), ray.get(ref_obj)
    assert torch.equal(a["obs"], ours["obs"]) and torch.equal(a["next", "obs"], ref["next", "obs"])
    assert a["obs"].data_ptr() != b["obs"].data_ptr()
    ours_obj = ray.put(ours)
    assert span(ray.get(ours_obj)) == span(ray.get(ours_obj))
