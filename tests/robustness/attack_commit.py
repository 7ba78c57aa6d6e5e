"""An adversarial run against the save commit (issue 28): not collected by pytest; run it by hand.

    python tests/robustness/attack_commit.py DIR [--seconds 300] [--seed 28] [--concurrent 60]

Phase 1 (sequential, ``--seconds``): a random schedule of our saves of the tree and of its
sub-trees as their own prefixes (``P``, ``P/s``, ``P/s/d``; ``memmap``/``memmap_``, durable or
not, key sets that change), each killed with SIGKILL at a random instant or at a random step of
its commit, or left to finish; loads killed inside the replays they run; tensordict 0.15.3
saving ``P`` or ``P/s`` over an interrupted commit; obstacles (directory, file, symlink, FIFO)
planted at the names a killed commit creates. After each action the tree is loaded by us and by
the reference, and checked:

* every saved unit is whole: the leaves of ``P``'s root hold ``P``'s note, those of ``s`` hold
  ``s``'s note, those of ``d`` hold ``d``'s (each save writes the notes of every level it saves);
* nothing rolls back: a save that passed its commit point (a journal was left) or finished is
  what the load shows for what it wrote, unless a later save wrote over it;
* no wedge: the load succeeds (a clean refusal is recorded separately, and must be rare);
* obstacles stay as planted;
* ``verify`` is clean after a load, and no ``.tdrs%`` entry survives the next finished save.

A save of tensordict's that an obstacle stops half-way has written some leaves in place and
not the others: the tree is then mixed by tensordict itself, whatever a replay of ours does
later, so mixes are counted (not failed) from such a failure until our next whole save.

Phase 2 (concurrent, ``--concurrent`` seconds): writer processes save ``P``, ``P/s`` and
``P/s/d`` in loops while our loaders check wholeness and tensordict's loader counts what it sees
(whole, mixed, failed): the reference knows no journal, so its mixes are reported, not failed.

Prints one JSON summary line; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

STEP = "TENSORDICT_RS_KILL_AT_STEP"


def build(lib: Any, version: int, levels: tuple[str, ...], keys: dict[str, list[str]]) -> Any:
    """A tree for the save unit at ``levels`` (``()``: P, ``("s",)``, ``("s", "d")``)."""
    import torch

    v = float(version)

    def node(depth: int) -> Any:
        name = ("P", "s", "d")[depth]
        src: dict[str, Any] = {k: torch.full((4, 3 + i), v) for i, k in enumerate(keys[name])}
        if depth < 2:
            src[("s", "d")[depth]] = node(depth + 1)
        td = lib.TensorDict(src, [4])
        td[f"note_{name}"] = str(version)
        return td

    return node(len(levels))


def check(td: Any) -> tuple[dict[str, int], list[str]]:
    """The note of each level, and the problems (leaves that disagree with their level's note)."""
    import torch

    notes: dict[str, int] = {}
    problems: list[str] = []
    node, path = td, []
    for name in ("P", "s", "d"):
        note_key = f"note_{name}"
        if note_key not in node.keys():
            problems.append(f"{'/'.join(path) or 'root'}: no {note_key}")
            break
        note = int(node[note_key])
        notes[name] = note
        for key in node.keys():
            value = node.get(key)
            if isinstance(value, torch.Tensor):
                lo, hi = (float(x) for x in torch.aminmax(value.flatten().float()))
                if lo != hi or lo != float(note):
                    problems.append(f"{'/'.join([*path, key])}: {lo}..{hi}, note {note}")
        child = {"P": "s", "s": "d"}.get(name)
        if child is None or child not in node.keys():
            break
        node, path = node.get(child), [*path, child]
    return notes, problems


# The paths named by the FileExistsError of the last refused child (``kill_child``).
REFUSED: list[str] = []


def kill_child(fn: Any, *, step: int | None, delay: float | None) -> str:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        code = 0
        try:
            if step is not None:
                os.environ[STEP] = str(step)
            fn()
        except FileExistsError as err:
            code = 4  # something the tree does not own is in the way (obstacles, orphans)
            os.write(write, os.fsencode(err.filename or ""))
        except BaseException:
            code = 3
        os._exit(code)
    os.close(write)
    if delay is not None:
        time.sleep(delay)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as pipe:
        named = os.fsdecode(pipe.read())
    REFUSED[:] = [named] if named else []
    if os.WIFSIGNALED(status):
        return "killed"
    return {0: "ok", 4: "refused"}.get(os.WEXITSTATUS(status), "failed")


def leftovers(prefix: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(prefix):
        out += [os.path.join(dirpath, n) for n in dirnames + filenames if n.startswith(".tdrs")]
    return out


def sequential(root: Path, seconds: float, rng: random.Random, summary: dict[str, Any]) -> None:
    import tensordict
    import tensordict_rs
    import torch

    torch.set_num_threads(1)
    prefix = root / "P"
    keys = {"P": ["a", "b"], "s": ["x"], "d": ["z"]}
    version = 1
    build(tensordict_rs, version, (), keys).memmap(prefix)
    expect = {"P": 1, "s": 1, "d": 1}  # what each level must show at least (no rollback)
    obstacles: dict[Path, str] = {}
    orphans: set[Path] = set()  # files tensordict left that a save of ours refused to replace
    counts: dict[str, int] = {}
    torn_by_reference = False  # a failed save of tensordict left the tree mixed
    violations: list[str] = summary["violations"]
    end = time.monotonic() + seconds

    def bump(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    while time.monotonic() < end:
        action = rng.choices(["ours", "nested", "reference", "unplant"], [5, 4, 1, 1])[0]
        bump(action)
        version += 1
        if action in ("ours", "nested"):
            levels = () if action == "ours" else rng.choice([("s",), ("s", "d")])
            new_keys = {k: list(v) for k, v in keys.items()}
            level = ("P", "s", "d")[len(levels)]
            pool = {"P": ["a", "b", "c"], "s": ["x", "y"], "d": ["z", "w"]}
            for name in ("P", "s", "d")[len(levels) :]:
                new_keys[name] = sorted(rng.sample(pool[name], rng.randint(1, len(pool[name]))))
            td = build(tensordict_rs, version, levels, new_keys)
            target = prefix.joinpath(*levels)
            durable = rng.random() < 0.25
            inplace = rng.random() < 0.5

            save = functools.partial(td.memmap_ if inplace else td.memmap, target, durable=durable)

            how = rng.choice(["step", "delay", "finish"])
            step = rng.randrange(0, 20) if how == "step" else None
            delay = rng.uniform(0, 0.01) if how == "delay" else None
            outcome = kill_child(save, step=step, delay=delay)
            journal = (target / ".tdrs%journal").exists()
            if outcome == "ok" and not levels:
                torn_by_reference = False
            bump(f"{action}-{outcome}{'-in-commit' if journal else ''}")
            if outcome == "refused":
                # what the FileExistsError named: a planted obstacle, or a file a save of
                # tensordict's left behind when it dropped a key (listed in no meta.json),
                # which the user moves away as the message says (at the next "unplant")
                named = Path(REFUSED[0]) if REFUSED else None
                if named is not None and named in obstacles:
                    bump("refused-for-an-obstacle")
                elif named is not None and named.name.endswith(".memmap"):
                    orphans.add(named)
                    bump("refused-for-tensordict's-orphan")
                else:
                    bump(f"refused-for-{named}")
            if outcome == "ok" or journal:
                for name in ("P", "s", "d")[len(levels) :]:
                    expect[name] = version
                keys.update(
                    {k: v for k, v in new_keys.items() if k in ("P", "s", "d")[len(levels) :]}
                )
                if journal and action == "ours":
                    # plant an obstacle at a name the interrupted commit creates
                    fresh = [k for k in new_keys[level] if not (target / f"{k}.memmap").exists()]
                    if fresh:
                        at = target / f"{rng.choice(fresh)}.memmap"
                        kind = rng.choice(["dir", "file", "symlink", "fifo"])
                        if kind == "dir":
                            at.mkdir()
                        elif kind == "file":
                            at.write_bytes(b"mine")
                        elif kind == "symlink":
                            at.symlink_to(root)
                        else:
                            os.mkfifo(at)
                        obstacles[at] = kind
                        bump(f"obstacle-{kind}")
                # loads killed inside the replay they run (of the prefix, or of a nested one
                # reached through the walk)
                for _ in range(rng.randint(0, 3) if journal else 0):
                    outcome = kill_child(
                        lambda: tensordict_rs.TensorDict.load_memmap(prefix),
                        step=rng.randrange(0, 12),
                        delay=None,
                    )
                    bump(f"replay-{outcome}")
            elif outcome == "failed":
                violations.append(f"v{version}: a saving child failed on its own")
            # "refused": FileExistsError, an obstacle or a file the tree does not own in the way;
            # the tree is then the old version or the new one without that key (both checked)
        elif action == "reference":
            levels = rng.choice([(), ("s",)])
            td = build(tensordict, version, levels, keys)
            try:
                td.memmap(prefix.joinpath(*levels), existsok=True)
            except Exception as err:  # an obstacle we planted can stop the reference
                # tensordict writes its leaves in place, one by one: the leaves it wrote
                # before failing are its version, the rest are not, and no later replay of
                # ours can tell its partial write from a finished one (it is never rolled
                # back), so the tree stays mixed until a whole save of ours at the prefix
                bump(f"reference-failed-{type(err).__name__}")
                torn_by_reference = True
                continue
            for name in ("P", "s", "d")[len(levels) :]:
                expect[name] = version
            # tensordict writes its files over whatever is at their names: an obstacle at a
            # name it saved is its leaf's data now, the tree's to replace (not the user's)
            for at in [at for at in obstacles if at.name.endswith(".memmap")]:
                meta = at.parent / "meta.json"
                if meta.exists() and at.name[: -len(".memmap")] in json.loads(meta.read_text()):
                    obstacles.pop(at)
                    bump("obstacle-taken-by-the-reference")
        else:  # "unplant": the user moves the obstacles away
            for at in list(obstacles):
                if at.is_dir() and not at.is_symlink():
                    shutil.rmtree(at)
                else:
                    at.unlink()
                obstacles.pop(at)
            # and the files a refusal named, once no commit is pending (a file still listed
            # by its meta.json is the tree's again: kept)
            if not any(prefix.rglob(".tdrs%journal")):
                for at in orphans:
                    meta = at.parent / "meta.json"
                    listed = meta.exists() and at.name[: -len(".memmap")] in json.loads(
                        meta.read_text()
                    )
                    if at.exists() and not listed:
                        at.unlink()
                        bump("orphan-moved-away")
                orphans.clear()
            continue

        # the check after each action
        try:
            ours = tensordict_rs.TensorDict.load_memmap(prefix)
        except (tensordict_rs.TensorDictError, OSError) as err:
            bump(f"load-refused-{type(err).__name__}")
            if not obstacles:
                violations.append(f"v{version}: load refused without an obstacle: {err}")
            continue
        notes, problems = check(ours)
        if problems and torn_by_reference:
            bump("mixed-by-the-reference's-failed-save")
        elif problems:
            violations.append(f"v{version} ({action}): MIXED {problems[:3]}")
        for name, want in expect.items():
            if name in notes and notes[name] < want:
                violations.append(
                    f"v{version} ({action}): {name} rolled back to {notes[name]} < {want}"
                )
        for at, kind in obstacles.items():
            st = os.lstat(at) if os.path.lexists(at) else None
            ok = st is not None and {
                "dir": stat.S_ISDIR,
                "file": stat.S_ISREG,
                "symlink": stat.S_ISLNK,
                "fifo": stat.S_ISFIFO,
            }[kind](st.st_mode)
            if not ok:
                violations.append(f"v{version}: obstacle {at} ({kind}) was not kept")
        problems = tensordict_rs.verify(prefix)
        if problems:
            violations.append(f"v{version}: verify after a load: {problems[:2]}")
        try:
            ref = tensordict.TensorDict.load_memmap(prefix)
            ref_notes, ref_problems = check(ref)
            if (ref_problems and not torn_by_reference) or ref_notes != notes:
                violations.append(
                    f"v{version}: the reference read {ref_notes} {ref_problems[:2]}, we {notes}"
                )
        except Exception as err:
            bump(f"reference-load-failed-{type(err).__name__}")
    # a last save leaves nothing of ours behind
    for at in list(obstacles):
        if at.is_dir() and not at.is_symlink():
            shutil.rmtree(at)
        else:
            at.unlink()
    version += 1
    build(tensordict_rs, version, (), keys).memmap(prefix)
    if leftovers(prefix):
        violations.append(f"leftovers after the last save: {leftovers(prefix)}")
    summary["sequential"] = counts


WRITER = """
import sys, time, torch
sys.path.insert(0, sys.argv[1])
import tensordict_rs
from attack_commit import build
torch.set_num_threads(1)
target, level, seconds, base = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
keys = {"P": ["a", "b"], "s": ["x", "y"], "d": ["z"]}
levels = (("s", "d")[:level])
version, end = base, time.monotonic() + seconds
while time.monotonic() < end:
    td = build(tensordict_rs, version, levels, keys)
    (td.memmap_ if version % 2 else td.memmap)(target)
    version += 1
print(version - base, flush=True)
"""


def concurrent(root: Path, seconds: float, summary: dict[str, Any]) -> None:
    import subprocess

    import tensordict
    import tensordict_rs

    prefix = root / "C"
    keys = {"P": ["a", "b"], "s": ["x", "y"], "d": ["z"]}
    build(tensordict_rs, 1, (), keys).memmap(prefix)
    here = os.path.dirname(os.path.abspath(__file__))
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, here, os.fspath(prefix.joinpath(*lv)), str(len(lv)),
             str(seconds), str(base)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for lv, base in (((), 10**6), ((), 2 * 10**6), (("s",), 3 * 10**6), (("s", "d"), 4 * 10**6))
    ]  # fmt: skip
    counts = {"loads": 0, "torn": 0, "refused": 0, "ref-whole": 0, "ref-mixed": 0, "ref-failed": 0}
    violations: list[str] = summary["violations"]
    while any(w.poll() is None for w in writers):
        try:
            td = tensordict_rs.TensorDict.load_memmap(prefix)
            counts["loads"] += 1
            _, problems = check(td)
            if problems:
                counts["torn"] += 1
                violations.append(f"concurrent: torn load {problems[:3]}")
        except (tensordict_rs.TensorDictError, OSError):
            counts["refused"] += 1
        try:
            _, problems = check(tensordict.TensorDict.load_memmap(prefix))
            counts["ref-mixed" if problems else "ref-whole"] += 1
        except Exception:
            counts["ref-failed"] += 1
    saves = [int(w.communicate()[0].strip() or 0) for w in writers]
    counts["saves"] = sum(saves)
    if counts["refused"] > counts["loads"] // 5:
        violations.append(f"concurrent: too many refused loads {counts}")
    summary["concurrent"] = counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--concurrent", type=float, default=60)
    parser.add_argument("--seed", type=int, default=28)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"seed": args.seed, "violations": []}
    started = time.monotonic()
    sequential(args.dir, args.seconds, random.Random(args.seed), summary)
    if args.concurrent > 0:
        concurrent(args.dir, args.concurrent, summary)
    summary["elapsed"] = round(time.monotonic() - started, 1)
    summary["violations"] = summary["violations"][:50]
    print(json.dumps(summary))
    sys.exit(1 if summary["violations"] else 0)


if __name__ == "__main__":
    main()
