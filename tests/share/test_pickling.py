"""Pickling TensorDicts: plain, file-backed, loaded, anonymous (refused), to a spawned process."""

from __future__ import annotations

import base64
import multiprocessing
import pickle
from pathlib import Path

import pytest
import torch
from tensordict_rs import MemoryMappedTensor, NonTensorData, TensorDict

from .._trees import CPU, make_td

# --------------------------------------------------------------------------------- pickling


def test_pickle_plain_tensordict() -> None:
    td = make_td(device="cpu").lock_()
    u = pickle.loads(pickle.dumps(td))
    assert (u == td).all()
    assert u.batch_size == td.batch_size and u.device == CPU
    assert u.is_locked and u["n"].is_locked
    assert u["s"] == "text"
    assert u["n", "deep"].batch_size == torch.Size([4, 3, 5])


def test_pickle_file_backed_tensordict(tmp_prefix: Path) -> None:
    td = make_td().memmap_(tmp_prefix)
    data = pickle.dumps(td)
    assert len(data) < 8192
    u = pickle.loads(data)
    assert u.is_memmap() and u.is_locked
    assert u.saved_path == tmp_prefix
    assert u["a"].filename == td["a"].filename
    assert (u == td).all()
    td["a"][0, 0, 0] = 50.0
    assert u["a"][0, 0, 0].item() == 50.0
    view = td[1:3]
    u_view = pickle.loads(pickle.dumps(view))
    assert u_view.batch_size == torch.Size([2, 3])
    assert isinstance(u_view["a"], MemoryMappedTensor)
    assert torch.equal(u_view["a"], td["a"][1:3])
    td["a"][2, 0, 1] = -8.0
    assert u_view["a"][1, 0, 1].item() == -8.0


def test_pickle_loaded_tensordict(tmp_prefix: Path) -> None:
    make_td().memmap_(tmp_prefix)
    loaded = TensorDict.load_memmap(tmp_prefix)  # leaves not touched before pickling
    u = pickle.loads(pickle.dumps(loaded))
    assert (u == make_td()).all()
    assert u["a"].filename == str(tmp_prefix / "a.memmap")
    assert not u.is_locked and not u.is_memmap()


def test_pickle_anonymous_tensordict_raises() -> None:
    td = make_td().memmap_()
    with pytest.raises(RuntimeError, match="anonymous MemoryMappedTensor cannot be pickled"):
        pickle.dumps(td)


def _spawn_child(td, to_parent, to_child) -> None:
    to_parent.put(
        (
            type(td).__name__,
            td.is_locked,
            td.is_memmap(),
            type(td["a"]).__name__,
            td["a"].tolist(),
            td["s"],
        )
    )
    assert to_child.get(timeout=60) == "written"
    to_parent.put(td["a"][0].tolist())
    td["n", "x"][1] = -5
    td.flush()


def test_pickle_to_spawned_process(tmp_prefix: Path) -> None:
    td = TensorDict(
        {"a": torch.arange(6.0).reshape(3, 2), "n": {"x": torch.arange(3)}, "s": "text"}, [3]
    ).memmap_(tmp_prefix)
    ctx = multiprocessing.get_context("spawn")
    to_parent, to_child = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_spawn_child, args=(td, to_parent, to_child))
    proc.start()
    try:
        first = to_parent.get(timeout=120)
        assert first == (
            "TensorDict",
            True,
            True,
            "MemoryMappedTensor",
            [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]],
            "text",
        )
        td["a"][0] = torch.tensor([10.0, 11.0])
        to_child.put("written")
        assert to_parent.get(timeout=60) == [10.0, 11.0]
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert td["n", "x"].tolist() == [0, -5, 2]


# Made by tensordict-rs 0.1.0 before the package moved into subpackages (fba7fba):
# pickle.dumps(TensorDict({"a": torch.arange(3), "b": {"label": NonTensorData("hi")}}, [3]),
# protocol=4), and of that tree's keys(include_nested=True). They name the old private modules
# tensordict_rs._tree (NonTensorData) and tensordict_rs._walk (KeyList).
OLD_LAYOUT_TREE = (
    "gASVrQIAAAAAAACMGHRlbnNvcmRpY3RfcnMudGVuc29yZGljdJSMClRlbnNvckRpY3SUk5QpgZR9lCiMBWl0ZW1zlH2U"
    "KIwBYZSMDHRvcmNoLl91dGlsc5SMEl9yZWJ1aWxkX3RlbnNvcl92MpSTlCiMDXRvcmNoLnN0b3JhZ2WUjBBfbG9hZF9m"
    "cm9tX2J5dGVzlJOUQhIBAACAAooKbPycRvkgaqhQGS6AAk3pAy6AAn1xAChYEAAAAHByb3RvY29sX3ZlcnNpb25xAU3p"
    "A1gNAAAAbGl0dGxlX2VuZGlhbnECiFgKAAAAdHlwZV9zaXplc3EDfXEEKFgFAAAAc2hvcnRxBUsCWAMAAABpbnRxBksE"
    "WAQAAABsb25ncQdLBHV1LoACKFgHAAAAc3RvcmFnZXEAY3RvcmNoCkxvbmdTdG9yYWdlCnEBWA4AAAA5NDU5Njc4Mzky"
    "NjU2MHECWAMAAABjcHVxA0sDTnRxBFEugAJdcQBYDgAAADk0NTk2NzgzOTI2NTYwcQFhLgMAAAAAAAAAAAAAAAAAAAAB"
    "AAAAAAAAAAIAAAAAAAAAlIWUUpRLAEsDhZRLAYWUiYwLY29sbGVjdGlvbnOUjAtPcmRlcmVkRGljdJSTlClSlHSUUpSM"
    "AWKUaAIpgZR9lChoBX2UjAVsYWJlbJSME3RlbnNvcmRpY3RfcnMuX3RyZWWUjA1Ob25UZW5zb3JEYXRhlJOUKYGUTn2U"
    "KIwKYmF0Y2hfc2l6ZZSMBXRvcmNolIwEU2l6ZZSTlCmFlFKUjARkYXRhlIwCaGmUjAZkZXZpY2WUTnWGlGJzaCNoJksD"
    "hZSFlFKUaCtOjAlpc19sb2NrZWSUiYwJaXNfbWVtbWFwlImMBnByZWZpeJROdWJ1aCNoJksDhZSFlFKUaCtOaDCJaDGJ"
    "aDJOdWIu"
)
OLD_LAYOUT_KEYS = (
    "gASVPAAAAAAAAACME3RlbnNvcmRpY3RfcnMuX3dhbGuUjAdLZXlMaXN0lJOUKYGUKIwBYZSMAWKUjAVs"
    "YWJlbJSGlGgFZS4="
)


def test_pickles_of_the_flat_layout_still_load() -> None:
    td = pickle.loads(base64.b64decode(OLD_LAYOUT_TREE))
    assert type(td) is TensorDict and td.batch_size == torch.Size([3])
    assert td["a"].tolist() == [0, 1, 2] and td["b", "label"] == "hi"
    assert type(td.get(("b", "label"))) is NonTensorData
    keys = pickle.loads(base64.b64decode(OLD_LAYOUT_KEYS))
    assert keys == ["a", ("b", "label"), "b"] and type(keys) is type(td.keys())
    assert ("b", "label") in keys and "label" not in keys


def test_memory_mapped_tensor_alone_crosses_a_queue(run_python) -> None:
    """A program that imports MemoryMappedTensor and never TensorDict sends an anonymous one
    through a multiprocessing Queue (the reducer was registered with TensorDict's module only:
    the send failed in the Queue's thread and the receiver waited forever)."""
    run_python(
        """
        import multiprocessing as mp, sys
        from tensordict_rs.memmap import MemoryMappedTensor

        def child(q, r):
            t = q.get()
            t.fill_(1.0)
            r.put("done")

        if __name__ == "__main__":
            assert "tensordict_rs.tensordict" not in sys.modules
            t = MemoryMappedTensor.zeros(3)
            ctx = mp.get_context("fork")  # (the Queue pickles what is put, as under spawn)
            q, r = ctx.Queue(), ctx.Queue()
            p = ctx.Process(target=child, args=(q, r))
            p.start()
            q.put(t)
            assert r.get(timeout=120) == "done"
            p.join(60)
            assert t.tolist() == [1.0, 1.0, 1.0], t  # the child wrote into the same memory
        """
    )


def test_a_file_replaced_since_it_was_sent_is_refused(tmp_path: Path) -> None:
    """A tree loaded before a re-save of its directory, sent to another process, arrived as the
    new files (other data than the sender's tensors), and the receiver's writes never reached
    the sender. Files sent through multiprocessing now carry their identity, and the receiver
    refuses one replaced since; plain pickles keep naming the path, as tensordict's."""
    from multiprocessing.reduction import ForkingPickler

    from tensordict_rs import InvalidDirectoryError

    TensorDict({"a": torch.zeros(3)}, [3]).memmap(tmp_path / "t")
    old = TensorDict.load_memmap(tmp_path / "t")
    same = pickle.loads(bytes(ForkingPickler.dumps(old)))  # unchanged: sent and shared
    same["a"].fill_(2.0)
    assert old["a"].tolist() == [2.0] * 3
    TensorDict({"a": torch.ones(3)}, [3]).memmap(tmp_path / "t")  # new files
    with pytest.raises(InvalidDirectoryError, match="replaced"):
        pickle.loads(bytes(ForkingPickler.dumps(old)))
    with pytest.raises(InvalidDirectoryError, match="replaced"):
        pickle.loads(bytes(ForkingPickler.dumps(old["a"])))
    assert pickle.loads(pickle.dumps(old["a"])).tolist() == [1.0] * 3  # by path
    a = MemoryMappedTensor.from_tensor(torch.zeros(3), filename=tmp_path / "x.memmap")
    MemoryMappedTensor.from_tensor(torch.ones(3), filename=tmp_path / "x.memmap", existsok=True)
    with pytest.raises(InvalidDirectoryError, match="replaced"):
        pickle.loads(bytes(ForkingPickler.dumps(a)))
