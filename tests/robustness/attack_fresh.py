"""A fresh attack on the commit of issue 28, after its fixes: not collected by pytest; run it by
hand (as root: one part replays as ``nobody``).

    python tests/robustness/attack_fresh.py DIR

It tries what the issue's own suites do not:

* **descriptors**: 40 replays that finish, 40 that refuse (a staged entry removed by hand),
  30 saves whose key is dropped around an obstacle, 30 loads racing a nested save: the
  process's open descriptors must not grow;
* **journals of older saves** (version 0: no identities, no directory states, no ``aside``
  step): a v2 journal killed at step 0 rewritten as v0, with 0..all of its renames already
  done by hand (an older replay cut short), must load as the new version whole;
* **a replay that fails half-way** (a directory of the tree made read-only for the ``nobody``
  who owns the tree and replays it): the load raises, the journal stays, and once the mode is
  back the next load finishes the commit: the new version whole;
* **kills inside obstacle resolution**: a commit killed at step 0, an obstacle planted at a
  new key's name, then a load killed at every step of its replay (the amended journal's steps
  included), then a clean load: no wedge, the obstacle kept, the other keys of the new
  version, ``verify`` clean;
* **hostile entries where the replay looks**: the journal a FIFO or a symlink, a staging
  directory swapped for a symlink to a directory outside, a staged entry swapped for a
  symlink: the load raises or finishes, never hangs, and nothing outside the tree changes.

Prints one JSON line (what held, what broke); exits 1 if anything broke.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

import torch

STEP = "TENSORDICT_RS_KILL_AT_STEP"
JOURNAL = ".tdrs%journal"
broken: list[str] = []
held: dict[str, Any] = {}


def tree(version: int, keys: tuple[str, ...] = ("obs", "gone")) -> Any:
    from tensordict_rs import TensorDict

    v = float(version)
    src: dict[str, Any] = {k: torch.full((4, 3), v) for k in keys}
    src["sub"] = {"x": torch.full((4, 2), v), "deep": {"y": torch.full((4, 5), v)}}
    td = TensorDict(src, [4])
    td["note"] = str(version)
    return td


def values(td: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key in sorted(td.keys()):
        value = td.get(key)
        if isinstance(value, torch.Tensor):
            lo, hi = (float(x) for x in torch.aminmax(value.flatten().float()))
            out[prefix + key] = lo if lo == hi else float("nan")
        elif hasattr(value, "keys"):
            out.update(values(value, f"{prefix}{key}/"))
    return out


def in_child(fn: Any, step: int | None = None) -> str:
    """Runs ``fn`` in a forked child (killed at commit step ``step``): 'killed', 'ok' or
    'error'."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            if step is not None:
                os.environ[STEP] = str(step)
            fn()
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "killed"
    return "ok" if os.WEXITSTATUS(status) == 0 else "error"


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def leftovers(prefix: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(prefix):
        found += [os.path.join(dirpath, n) for n in dirnames + filenames if n.startswith(".tdrs")]
    return found


def check_whole(label: str, prefix: Path, version: int, keys: set[str] | None = None) -> None:
    import tensordict
    import tensordict_rs
    from tensordict_rs import TensorDict

    try:
        ours = TensorDict.load_memmap(prefix)
    except Exception as err:
        broken.append(f"{label}: load failed: {type(err).__name__}: {err}")
        return
    seen = values(ours)
    if set(seen.values()) != {float(version)} or ours["note"] != str(version):
        broken.append(f"{label}: not version {version} whole: {seen} note={ours['note']}")
    if keys is not None and set(seen) != keys:
        broken.append(f"{label}: keys {sorted(seen)} != {sorted(keys)}")
    problems = tensordict_rs.verify(prefix)
    if problems:
        broken.append(f"{label}: verify: {problems}")
    try:
        ref = values(tensordict.TensorDict.load_memmap(prefix))
        if ref != seen:
            broken.append(f"{label}: the reference reads {ref}, ours {seen}")
    except Exception as err:
        broken.append(f"{label}: the reference failed: {type(err).__name__}: {err}")


def interrupted(prefix: Path, step: int = 0) -> bool:
    """Version 1 saved, version 2 (``gone`` dropped) killed after ``step`` commit steps."""
    if prefix.exists():
        shutil.rmtree(prefix)
    tree(1).memmap(prefix)
    return in_child(lambda: tree(2, ("obs",)).memmap(prefix), step) == "killed"


def journal(prefix: Path) -> dict[str, Any]:
    return json.loads((prefix / JOURNAL).read_text())


V2 = {"obs", "sub/x", "sub/deep/y"}


# -- descriptors ------------------------------------------------------------------------------
def attack_descriptors(root: Path) -> None:
    from tensordict_rs import TensorDict

    prefix = root / "fd"
    interrupted(prefix)
    TensorDict.load_memmap(prefix)
    start = fds()
    for _ in range(40):  # replays that finish
        assert interrupted(prefix)
        TensorDict.load_memmap(prefix)
    after_finish = fds()
    refused = 0
    for _ in range(40):  # replays that refuse: a staged entry removed by hand
        assert interrupted(prefix, 1)
        j = journal(prefix)
        stage = prefix / f".tdrs%staging-{j['token']}"
        renames = [op for op in j["ops"] if op["op"] == "rename" and (stage / op["name"]).exists()]
        os.remove(stage / renames[0]["name"]) if not (
            stage / renames[0]["name"]
        ).is_dir() else shutil.rmtree(stage / renames[0]["name"])
        try:
            TensorDict.load_memmap(prefix)
        except Exception:
            refused += 1
    after_refuse = fds()
    shutil.rmtree(prefix)
    dropped = 0
    tree(1).memmap(prefix)
    for i in range(30):  # saves whose new key is dropped around an obstacle
        assert in_child(lambda i=i: tree(2, ("obs", f"k{i}")).memmap(prefix), 0) == "killed"
        (prefix / f"k{i}.memmap").mkdir()
        (prefix / f"k{i}.memmap" / "keep").write_text("user")
        try:
            TensorDict.load_memmap(prefix)
        except Exception as err:
            broken.append(f"descriptors: load around an obstacle failed: {err}")
        try:
            tree(3, ("obs", f"k{i}")).memmap(prefix)
        except FileExistsError:
            dropped += 1
        if (prefix / f"k{i}.memmap" / "keep").read_text() != "user":
            broken.append("descriptors: an obstacle was changed")
    after_drop = fds()
    held["descriptors"] = {
        "start": start,
        "after 40 finished replays": after_finish,
        "after 40 refused replays": after_refuse,
        "refused": refused,
        "after 30 dropped keys": after_drop,
        "save refused for the obstacle": dropped,
    }
    if max(after_finish, after_refuse, after_drop) > start + 2:
        broken.append(f"descriptors grew: {held['descriptors']}")
    if refused != 40:
        broken.append(f"descriptors: only {refused}/40 replays refused without their staged entry")


# -- legacy journals --------------------------------------------------------------------------
def as_v0(prefix: Path, done: int) -> int:
    """Rewrites the journal as an older save wrote it, and performs its first ``done`` renames
    by hand (an older replay cut short). Returns the number of renames."""
    j = journal(prefix)
    stage = prefix / f".tdrs%staging-{j['token']}"
    ops = []
    for op in j["ops"]:
        if op["op"] == "aside":
            continue
        op = {k: v for k, v in op.items() if k not in ("id", "replaces")}
        ops.append(op)
    renames = [op for op in ops if op["op"] in ("rename", "mkdir")]
    for op in renames[:done]:
        if op["op"] == "mkdir":
            (prefix.joinpath(*op["path"])).mkdir(exist_ok=True)
        else:
            os.rename(stage / op["name"], prefix.joinpath(*op["to"]))
    old = {"token": j["token"], "stagings": j["stagings"], "ops": ops}
    (prefix / JOURNAL).write_text(json.dumps(old))
    return len(renames)


def attack_legacy(root: Path) -> None:
    n, tried = 1, 0
    done = 0
    while done <= n:
        prefix = root / f"legacy{done}"
        assert interrupted(prefix)
        n = as_v0(prefix, done)
        check_whole(f"legacy journal, {done} of {n} renames done", prefix, 2, V2)
        if leftovers(prefix):
            broken.append(f"legacy {done}: leftovers {leftovers(prefix)}")
        tried += 1
        done += 1
    held["legacy journals replayed whole"] = tried


# -- a replay that fails half-way -------------------------------------------------------------
def attack_half_way(root: Path) -> None:
    from tensordict_rs import TensorDict

    if os.geteuid() != 0:
        held["half-way"] = "skipped (needs root)"
        return
    base = root / "halfway"
    base.mkdir()
    os.chmod(root, 0o755)
    os.chown(base, 65534, 65534)
    results = []
    for step in range(0, 8):
        prefix = base / f"t{step}"

        def as_nobody(fn: Any) -> str:
            def run() -> None:
                os.setgid(65534)
                os.setuid(65534)
                fn()

            return in_child(run)

        def setup(prefix: Path = prefix) -> None:
            tree(1).memmap(prefix)

        as_nobody(setup)

        def killed(prefix: Path = prefix, step: int = step) -> None:
            os.environ[STEP] = str(step)
            tree(2, ("obs",)).memmap(prefix)

        if as_nobody(killed) != "killed":
            break
        os.chmod(prefix / "sub", 0o555)  # the replay cannot rename into sub
        outcome = as_nobody(lambda prefix=prefix: TensorDict.load_memmap(prefix))
        journal_kept = (prefix / JOURNAL).exists()
        os.chmod(prefix / "sub", 0o755)
        results.append((step, outcome, journal_kept))
        if outcome == "ok" and journal_kept:
            broken.append(f"half-way step {step}: loaded with the journal still there")
        if outcome == "error" and not journal_kept:
            broken.append(f"half-way step {step}: the failed replay dropped the journal")
        check_whole(f"half-way step {step}", prefix, 2, V2)
    held["half-way"] = results


# -- kills inside obstacle resolution ---------------------------------------------------------
def plant(path: Path, kind: str) -> None:
    if kind == "file":
        path.write_text("user")
    elif kind == "dir":
        path.mkdir()
        (path / "keep").write_text("user")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        path.symlink_to("/etc/hostname")


def attack_obstacle_kills(root: Path) -> None:
    from tensordict_rs import TensorDict

    count = 0
    for kind in ("file", "dir", "fifo", "symlink"):
        for where in ("leaf", "subtree"):
            for step in range(0, 10):
                prefix = root / f"ob-{kind}-{where}-{step}"
                tree(1, ("obs",)).memmap(prefix)
                new = tree(2, ("obs",))
                if where == "leaf":
                    new["fresh"] = torch.full((4, 3), 2.0)
                    name = "fresh.memmap"
                else:
                    new["fresh"] = {"z": torch.full((4, 1), 2.0)}
                    name = "fresh"
                if in_child(lambda new=new, prefix=prefix: new.memmap(prefix), 0) != "killed":
                    broken.append(f"obstacle {kind}/{where}: the save was not killed at step 0")
                    continue
                plant(prefix / name, kind)
                before = os.lstat(prefix / name)
                replay = in_child(lambda prefix=prefix: TensorDict.load_memmap(prefix), step)
                try:
                    td = TensorDict.load_memmap(prefix)
                except Exception as err:
                    broken.append(f"obstacle {kind}/{where} kill {step}: wedged: {err}")
                    continue
                after = os.lstat(prefix / name)
                same = (after.st_ino, stat.S_IFMT(after.st_mode))
                if same != (before.st_ino, stat.S_IFMT(before.st_mode)):
                    broken.append(f"obstacle {kind}/{where} kill {step}: the obstacle was replaced")
                seen = values(td)
                # a bare directory at a sub-tree's name receives the sub-tree (its own files
                # kept); every other obstacle keeps the key out
                merged = kind == "dir" and where == "subtree"
                if ("fresh" in td.keys()) != merged or set(seen.values()) != {2.0}:
                    broken.append(f"obstacle {kind}/{where} kill {step} ({replay}): {seen}")
                if kind == "dir" and (prefix / name / "keep").read_text() != "user":
                    broken.append(f"obstacle {kind}/{where} kill {step}: the user's file changed")
                import tensordict_rs

                problems = tensordict_rs.verify(prefix)
                if problems:
                    broken.append(f"obstacle {kind}/{where} kill {step}: verify {problems}")
                try:
                    tree(3, ("obs",)).memmap(prefix)
                    check_whole(f"obstacle {kind}/{where} kill {step}, next save", prefix, 3)
                except Exception as err:
                    broken.append(f"obstacle {kind}/{where} kill {step}: next save failed: {err}")
                left = leftovers(prefix)
                if left:
                    broken.append(f"obstacle {kind}/{where} kill {step}: leftovers {left}")
                count += 1
                if replay != "killed":
                    break  # the replay has fewer steps
    held["obstacle kill rounds"] = count


# -- hostile entries where the replay looks ---------------------------------------------------
def load_with_deadline(prefix: Path, seconds: float = 20.0) -> str:
    from tensordict_rs import TensorDict

    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            TensorDict.load_memmap(prefix)
        except BaseException:
            code = 3
        os._exit(code)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "ok" if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else "error"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


def snapshot(path: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, path)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def attack_hostile(root: Path) -> None:
    outside = root / "outside"
    outside.mkdir()
    (outside / "f0").write_text("outside")
    (outside / "m0").write_text("outside")
    (outside / "d0").mkdir()
    results = {}
    cases = ("journal-fifo", "journal-symlink", "staging-symlink", "staged-symlink")
    for case in cases:
        for step in (0, 2):
            prefix = root / f"host-{case}-{step}"
            assert interrupted(prefix, step)
            j = journal(prefix)
            stage = prefix / f".tdrs%staging-{j['token']}"
            if case == "journal-fifo":
                os.remove(prefix / JOURNAL)
                os.mkfifo(prefix / JOURNAL)
            elif case == "journal-symlink":
                (outside / "journal").write_text(json.dumps(j))
                os.remove(prefix / JOURNAL)
                (prefix / JOURNAL).symlink_to(outside / "journal")
            elif case == "staging-symlink":
                shutil.rmtree(stage)
                stage.symlink_to(outside)
            else:
                names = sorted(n for n in os.listdir(stage) if n.startswith("f"))
                if names:
                    os.remove(stage / names[0])
                    (stage / names[0]).symlink_to(outside / "f0")
            before = snapshot(outside)
            outcome = load_with_deadline(prefix)
            if outcome == "error":
                from tensordict_rs import TensorDict

                try:
                    TensorDict.load_memmap(prefix)
                except Exception as err:
                    outcome = f"{type(err).__name__}: {str(err)[:160]}"
            results[f"{case}@{step}"] = outcome
            if outcome == "hung":
                broken.append(f"hostile {case} step {step}: the load hung")
            if snapshot(outside) != before:
                broken.append(f"hostile {case} step {step}: something outside the tree changed")
            if (outside / "f0").read_text() != "outside":
                broken.append(f"hostile {case} step {step}: a file outside was written")
    held["hostile"] = results


def main() -> int:
    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    chosen = sys.argv[2:] or [
        "descriptors", "legacy", "half_way", "obstacle_kills", "hostile"
    ]  # fmt: skip
    for attack in [globals()[f"attack_{name}"] for name in chosen]:
        began = time.monotonic()
        try:
            attack(root)
        except Exception as err:  # an attack that could not run is a finding too
            import traceback

            trace = traceback.format_exc()
            broken.append(f"{attack.__name__} crashed: {type(err).__name__}: {err}\n{trace}")
        held[f"{attack.__name__} seconds"] = round(time.monotonic() - began, 1)
    print(json.dumps({"held": held, "broken": broken}, indent=1, default=str))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
