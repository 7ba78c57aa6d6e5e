"""A replay finishes a commit only once it can prove each step (issue 28, defect 1).

A save killed past its commit point leaves a journal; the next save or load replays it. A
replay that cannot see a step's staged file (the staging directory cannot be opened: another
user, the descriptor limit, a file system inside the tree that is not mounted) must refuse,
changing nothing, and the commit must come out whole once a process that can see it replays
it. Before the fix such a replay took every step it could not see as done, ran the removals
and deleted the journal: the committed save was lost.

Each case kills a save of version 2 (which drops the key ``gone``) at several steps of its
commit, then runs the replay that cannot see, then checks that nothing changed, then that a
full replay gives version 2 to both loaders.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from ._attack_helpers import JOURNAL, assert_whole, killed_save, snapshot, tree

ROOT = os.geteuid() == 0
NEW_KEYS = {"obs", "sub/x", "sub/deep/y"}  # version 2: "gone" dropped
ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def interrupted(prefix: Path, step: int) -> None:
    """Version 1 saved at ``prefix``, then version 2's save killed after ``step`` commit steps."""
    tree(1).memmap(prefix)
    assert killed_save(lambda: tree(2, keys=("obs",)).memmap(prefix), step)
    assert (prefix / JOURNAL).exists()


# ------------------------------------------------------------------------ another user


NOBODY = textwrap.dedent(
    """
    import json, os, sys, torch
    os.setgid(65534); os.setuid(65534)
    import tensordict_rs
    from tensordict_rs import TensorDict
    for line in sys.stdin:
        prefix = line.strip()
        try:
            td = TensorDict.load_memmap(prefix)
            out = {"loaded": sorted(td.keys(include_nested=True, leaves_only=True))}
        except Exception as err:
            out = {"error": type(err).__name__, "message": str(err)}
        out["verify"] = tensordict_rs.verify(prefix)
        print(json.dumps(out, default=str), flush=True)
    """
)


def test_replay_by_another_user_refuses_and_keeps_the_commit() -> None:
    """A shared, writable tree (every directory 0777, every file 0666) whose save by root was
    killed in its commit: ``nobody`` cannot open root's 0700 staging directory, so its load
    must refuse and change nothing; root's next load then finishes the commit."""
    if not ROOT:
        pytest.skip("needs root to run a load as nobody")
    base = Path(tempfile.mkdtemp(prefix="tdrs-shared-", dir="/tmp"))  # pytest's tmp is 0700
    os.chmod(base, 0o755)
    loader = subprocess.Popen(
        [sys.executable, "-c", NOBODY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert loader.stdin is not None and loader.stdout is not None
    try:
        for step in (0, 2, 5):
            prefix = base / f"tree{step}"
            tree(1).memmap(prefix)
            for dirpath, _, filenames in os.walk(prefix):
                os.chmod(dirpath, 0o777)
                for name in filenames:
                    os.chmod(os.path.join(dirpath, name), 0o666)
            assert killed_save(lambda p=prefix: tree(2, keys=("obs",)).memmap(p), step)
            before = snapshot(prefix)
            loader.stdin.write(f"{prefix}\n")
            loader.stdin.flush()
            line = loader.stdout.readline()
            assert line, loader.stderr.read()[-3000:]
            seen = json.loads(line)
            assert "error" in seen, f"step {step}: nobody loaded {seen}"
            assert "PermissionError" in seen["error"] or "denied" in seen["message"], seen
            assert seen["verify"], "verify must report the interrupted commit"
            assert snapshot(prefix) == before, f"step {step}: a refused replay changed the tree"
            assert_whole(prefix, 2, NEW_KEYS)
            assert not (prefix / "gone.memmap").exists()
    finally:
        loader.communicate(timeout=60)
        shutil.rmtree(base)


# ----------------------------------------------------------------- the descriptor limit


def test_replay_near_the_descriptor_limit(tmp_path: Path) -> None:
    """Loads with 0 to 15 free descriptors, each on a freshly interrupted commit: each
    either finishes the commit or refuses; none may lose it (before the fix, a load that
    could not open the staging directory dropped the journal and the tree went back to
    version 1)."""
    outcomes = []
    for free in range(16):
        prefix = tmp_path / f"t{free}"
        interrupted(prefix, 0)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 2
            try:
                from tensordict_rs import TensorDict

                soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))
                fillers = []
                try:
                    while True:
                        fillers.append(os.open("/dev/null", os.O_RDONLY))
                except OSError:
                    pass
                for fd in fillers[len(fillers) - free :]:
                    os.close(fd)
                try:
                    TensorDict.load_memmap(prefix)
                    code = 0
                except Exception:
                    code = 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, 1), status
        outcomes.append(os.WEXITSTATUS(status))
        assert_whole(prefix, 2, NEW_KEYS)
    # the limit really was in the way for the first few, and out of it for the last ones
    assert outcomes[0] == 1 and outcomes[-1] == 0, outcomes


# -------------------------------------------------------------- a mount that is not there


def in_namespace(script: str, tmp_path: Path) -> str:
    """Runs ``script`` as root in a private mount namespace; returns its stdout, or skips."""
    if not ROOT or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here")
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    result = subprocess.run(
        ["unshare", "-m", sys.executable, os.fspath(path), os.fspath(tmp_path), ROOT_DIR],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def test_replay_while_a_nested_mount_is_absent(tmp_path: Path) -> None:
    """``sub`` is a bind mount (its own staging directory). With it unmounted, a load must
    refuse and change nothing; once it is back, the tree is version 2 throughout (before the
    fix: the root's steps ran, ``sub``'s were taken as done, the journal went, and the tree
    mixed version 2 at the root with version 1 in ``sub``)."""
    out = in_namespace(
        """
        import os, subprocess, sys
        from pathlib import Path
        sys.path.insert(0, sys.argv[2])
        from tests.robustness._attack_helpers import (
            JOURNAL, assert_whole, killed_save, snapshot, tree
        )
        from tensordict_rs import TensorDict
        tmp = Path(sys.argv[1])
        for step in (0, 2, 4):
            prefix, src = tmp / f"t{step}", tmp / f"src{step}"
            (prefix / "sub").mkdir(parents=True)
            src.mkdir()
            subprocess.run(["mount", "--bind", src, prefix / "sub"], check=True)
            tree(1).memmap(prefix)
            assert killed_save(lambda: tree(2, keys=("obs",)).memmap(prefix), step)
            assert (prefix / JOURNAL).exists()
            subprocess.run(["umount", prefix / "sub"], check=True)
            before = snapshot(prefix)
            try:
                TensorDict.load_memmap(prefix)
                raise AssertionError(f"step {step}: loaded with sub unmounted")
            except AssertionError:
                raise
            except Exception as err:
                print(f"step {step}: refused: {type(err).__name__}: {err}")
            assert snapshot(prefix) == before, f"step {step}: the refused replay changed the tree"
            subprocess.run(["mount", "--bind", src, prefix / "sub"], check=True)
            assert_whole(prefix, 2, {"obs", "sub/x", "sub/deep/y"})
        print("ok")
        """,
        tmp_path,
    )
    assert out.strip().endswith("ok"), out


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_staged_entry_swapped_for_another_kind_is_not_proven(tmp_path: Path, kind: str) -> None:
    """A pending staged data file removed and replaced by an entry of another kind: the file
    system often gives the new entry the freed inode number, so its identity matches the
    journal's. The replay must still refuse and change nothing (the fresh attack of issue 28
    found that it moved a symlink into the tree and dropped the journal)."""
    import tensordict_rs
    from tensordict_rs import TensorDict

    outside = tmp_path / "outside"
    outside.write_text("not ours")
    for step in (0, 2):
        prefix = tmp_path / f"t{step}"
        interrupted(prefix, step)
        journal = json.loads((prefix / JOURNAL).read_text())
        stage = prefix / f".tdrs%staging-{journal['token']}"
        pending = [
            op["name"]
            for op in journal["ops"]
            if op["op"] == "rename" and op["name"].startswith("f") and (stage / op["name"]).exists()
        ]
        assert pending, f"step {step}: no staged data file left"
        victim = stage / pending[0]
        victim.unlink()
        if kind == "symlink":
            victim.symlink_to(outside)
        elif kind == "fifo":
            os.mkfifo(victim)
        else:
            victim.mkdir()
        before = snapshot(prefix)
        refused = "neither done nor still staged"
        with pytest.raises(tensordict_rs.InvalidDirectoryError, match=refused):
            TensorDict.load_memmap(prefix)
        assert snapshot(prefix) == before, f"step {step}: the refused replay changed the tree"
        assert outside.read_text() == "not ours"


@pytest.mark.parametrize("exchanged", [0, 1, 3])
def test_journals_of_older_saves_are_replayed_whole(tmp_path: Path, exchanged: int) -> None:
    """Journals without a version: those of saves before journal v2 (no identities), and those
    of issue 29's saves, whose ``replaces`` is the staged file's own identity and whose step
    exchanges the staged file with the old one (the old file then waits at the staged name).
    A replay of such a journal, with ``exchanged`` data steps already exchanged, must give the
    new version whole: a staged name that holds the *old* file is not a pending step."""
    for with_ids in (False, True):
        prefix = tmp_path / f"t{with_ids}"
        interrupted(prefix, 0)
        journal = json.loads((prefix / JOURNAL).read_text())
        stage = prefix / f".tdrs%staging-{journal['token']}"
        ops, done = [], 0
        for op in journal["ops"]:
            if op["op"] == "aside":
                continue
            staged_id = op.pop("id", None)
            op.pop("replaces", None)
            if op["op"] == "rename" and op["name"].startswith("f") and with_ids:
                op["replaces"] = staged_id
                if done < exchanged:  # the exchange, as RENAME_EXCHANGE leaves it
                    target = prefix.joinpath(*op["to"])
                    os.rename(stage / op["name"], stage / "swap")
                    os.rename(target, stage / op["name"])
                    os.rename(stage / "swap", target)
                    done += 1
            ops.append(op)
        old = {"token": journal["token"], "stagings": journal["stagings"], "ops": ops}
        (prefix / JOURNAL).write_text(json.dumps(old))
        assert_whole(prefix, 2, NEW_KEYS)
        assert not [n for n in os.listdir(prefix) if n.startswith(".tdrs")]
