"""Runnable docs: every docstring example of the package runs as a doctest, and every code
block of ``docs/`` and of the README runs (or parses) as the page shows it.

How a page's blocks run (``docs/development.md`` says the same for writers of pages):

- Fences start at column 0 (MkDocs renders no fence inside a list item; an indented fence
  fails the page) and name their language.
- ``python`` blocks of a page run in order, in one namespace (a fresh ``__main__``), in one
  new interpreter whose current directory is an empty temporary directory; ``bash`` blocks run
  in their place in that order, in that directory, with ``bash -euo pipefail``; ``python`` and
  ``tensordict-rs`` on their PATH are the interpreter under test.
- A python block right after ``<!-- run: script -->`` is a whole program: it is written to a
  file and run as ``python FILE`` (its own ``__main__``, for spawned workers).
- A python block right after ``<!-- run: ranks=N -->`` is one rank of a torch.distributed
  job: N processes start it with torchrun's variables (``RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``), and every rank must exit 0.
- A ``text`` block right after a python or bash block (nothing but blank lines between) is
  that block's output: what the block prints must be it, line for line (trailing spaces and
  blank lines aside).
- ``toml`` and ``json`` blocks are parsed; other ``text`` blocks and ``console`` blocks are
  output or transcripts, not code (a ``$ make TARGET`` line of a console block must name a
  target that ``make -n`` accepts). Any other language fails the page.

A block that fails fails its page's test, which names the page, the block's number and line
(tracebacks point at the page's own lines).
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import json
import os
import pkgutil
import re
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import tensordict_rs
from tensordict_rs.ops import casts, pointwise

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README = REPO / "README.md"
RUNNER = Path(__file__).resolve().parent / "_page_runner.py"
PAGES = [*sorted(DOCS.rglob("*.md")), README]
MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(tensordict_rs.__path__, "tensordict_rs.")
    if m.name != "tensordict_rs._native"
)


@pytest.mark.parametrize("name", ["tensordict_rs", *MODULES])
def test_doctests(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(module, optionflags=flags, verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} doctest(s) of {name} failed (see above)"


def test_method_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples of TensorDict's methods, wherever they are defined (the operator methods
    that ``ops/pointwise`` makes at import are in no module's namespace, so testmod misses
    them)."""
    monkeypatch.chdir(tmp_path)
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    ran = 0
    for name, member in vars(tensordict_rs.TensorDict).items():
        if callable(member) and ">>> " in (getattr(member, "__doc__", None) or ""):
            for test in finder.find(member, f"TensorDict.{name}", globs={}):
                runner.run(test)
                ran += 1
    assert ran >= 60 and runner.failures == 0, f"{runner.failures} of {ran} examples failed"


# The public names whose docstrings must show an example (checked: the examples run above).
EXAMPLES = [
    "TensorDict",
    "TensorDict.memmap_",
    "TensorDict.memmap",
    "TensorDict.memmap_like",
    "TensorDict.load_memmap",
    "TensorDict.save",
    "TensorDict.load",
    "TensorDict.from_safetensors",
    "TensorDict.to_safetensors",
    "TensorDict.share_memory_",
    "TensorDict.all_reduce",  # the torch.distributed group (its class docstring)
    "TensorDictFuture",
    "MemoryMappedTensor",
    "NonTensorData",
    "verify",
    "is_memmap_archive",
    "pack_memmap",
    "unpack_memmap",
    "refresh_archive_checksums",
    *(f"TensorDict.{name}" for name in pointwise.methods()),
    *(f"TensorDict.{name}" for name in casts.CASTS),
    # ops/shape, ops/keys, ops/apply and the named element-wise methods
    *(
        f"TensorDict.{name}"
        for name in (
            "chunk expand expand_as flatten permute reshape split squeeze transpose unbind "
            "unflatten unsqueeze view empty exclude flatten_keys from_dict fromkeys is_empty "
            "rename_key_ select to_dict unflatten_keys apply apply_ named_apply add add_ sub "
            "sub_ clamp clamp_min clamp_max lerp masked_fill masked_fill_ fill_ zero_ copy_ "
            "set_at_ update_at_ detach detach_ contiguous to_tensordict to cpu clear_device_ "
            "is_locked lock_ unlock_ is_memmap load_memmap_ memmap_refresh_ flush is_shared "
            "where"
        ).split()
    ),
    # entries, shape and device, indexing (tensordict.py, ops/indexing), devices, sharing
    *(
        f"TensorDict.{name}"
        for name in (
            "keys values items get set set_ update update_ pop clone numel dim batch_size "
            "batch_dims ndim shape names device is_cuda is_cpu sorted_keys index_select "
            "__getitem__ __setitem__ cuda swapaxes swapdims all any pin_memory saved_path"
        ).split()
    ),
    # torch.distributed: point to point (shown, not run: they need a second rank), reduce,
    # gather_and_stack, scatter; all_gather and broadcast are shown by the group's class docstring
    *(
        f"TensorDict.{name}"
        for name in (
            "send recv isend irecv init_remote from_remote_init reduce gather_and_stack "
            "all_gather broadcast scatter"
        ).split()
    ),
]


def _doc_with_class(obj: object, owner: object) -> str:
    """The docstring of ``obj``, or of the class that defines it when it is a group's method
    (a mixin such as ``Distributed``; never ``owner`` itself, whose class example shows none
    of its methods)."""
    doc = inspect.getdoc(obj) or ""
    if ">>> " in doc or not inspect.isclass(owner):
        return doc
    name = getattr(obj, "__name__", "")
    for base in inspect.getmro(owner):
        if name in vars(base):
            return doc if base is owner else doc + (inspect.getdoc(base) or "")
    return doc


@pytest.mark.parametrize("name", EXAMPLES)
def test_public_names_have_examples(name: str) -> None:
    obj: object = tensordict_rs
    owner: object = None
    for part in name.split("."):
        owner, obj = obj, getattr(obj, part)
    doc = _doc_with_class(obj, owner)
    assert ">>> " in doc, f"{name} has no example in its docstring"


def test_every_public_name_has_an_example() -> None:
    """Every public method and property of TensorDict, not only those listed above."""
    missing = []
    for name, member in inspect.getmembers(tensordict_rs.TensorDict):
        static = inspect.getattr_static(tensordict_rs.TensorDict, name)
        if name.startswith("_") or not (callable(member) or isinstance(static, property)):
            continue
        shown = member if callable(member) else static
        if ">>> " not in _doc_with_class(shown, tensordict_rs.TensorDict):
            missing.append(name)
    assert missing == []


def test_every_public_method_has_a_docstring() -> None:
    missing = [
        name
        for name, member in inspect.getmembers(tensordict_rs.TensorDict)
        if not name.startswith("_") and callable(member) and not inspect.getdoc(member)
    ]
    assert missing == []


# ---------------------------------------------------------------------------- pages

RUN = {"python", "bash"}  # blocks that run
PARSE = {"toml", "json"}  # blocks that are parsed
OUTPUT = {"text", "console"}  # blocks that are shown only
FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
MARKER = re.compile(r"^<!-- run: (script|ranks=(\d+)) -->$")


@dataclass
class Block:
    """One fenced block of a page."""

    kind: str  # python, bash, script, ranks, toml, json, text, console
    line: int  # the page's line of the block's first line of code (1-based)
    code: str
    ranks: int = 0
    expect: str | None = None  # a python or bash block's stdout: the text block right after it


def shown(page: Path) -> str:
    """The page's path as the messages name it: relative to the repository when inside it."""
    return page.relative_to(REPO).as_posix() if page.is_relative_to(REPO) else str(page)


def parse_page(page: Path) -> tuple[list[Block], list[str]]:
    """The page's fenced blocks and what is wrong with its fences."""
    lines = page.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    errors: list[str] = []
    i = 0
    while i < len(lines):
        text = lines[i]
        opening = FENCE.match(text)
        if opening is None:
            if FENCE.match(text.lstrip()) is not None:
                errors.append(f"line {i + 1}: a fence must start at column 0 (MkDocs)")
            i += 1
            continue
        fence, info = opening.group(1), opening.group(2).strip()
        lang = info.split()[0] if info else ""
        end = i + 1
        while end < len(lines) and not re.fullmatch(
            re.escape(fence[0]) + f"{{{len(fence)},}}\\s*", lines[end]
        ):
            end += 1
        if end == len(lines):
            errors.append(f"line {i + 1}: the fence is never closed")
            break
        code = "\n".join(lines[i + 1 : end]) + "\n"
        before = next((t for t in reversed(lines[:i]) if t.strip()), "")
        marker = MARKER.match(before.strip())
        block = Block(lang, i + 2, code)
        if marker is not None:
            if lang != "python":
                errors.append(f"line {i + 1}: {before.strip()} must come before a python block")
            block.kind = "ranks" if marker.group(2) else "script"
            block.ranks = int(marker.group(2) or 0)
        elif before.strip().startswith("<!-- run"):
            errors.append(f"line {i}: unknown marker {before.strip()}")
        if lang not in RUN | PARSE | OUTPUT:
            errors.append(
                f"line {i + 1}: a fence must name one of {sorted(RUN | PARSE | OUTPUT)}, "
                f"not {lang or 'nothing'}"
            )
        between = lines[blocks[-1].line + blocks[-1].code.count("\n") : i] if blocks else []
        if (
            lang == "text"
            and blocks
            and blocks[-1].kind in RUN
            and not any(map(str.strip, between))
        ):
            blocks[-1].expect = code  # the output of the block just above
        blocks.append(block)
        i = end + 1
    return blocks, errors


LIST_ITEM = re.compile(r"^(- |\* |\d+\. )")


def layout_errors(page: Path) -> list[str]:
    """Markdown that GitHub renders and MkDocs (Python-Markdown) does not: a list or a table
    that starts right under a paragraph line (MkDocs wants a blank line before it)."""
    errors = []
    previous = ""
    in_fence = False
    for number, text in enumerate(page.read_text(encoding="utf-8").split("\n"), 1):
        if FENCE.match(text):
            in_fence = not in_fence
        elif not in_fence and previous.strip():
            starts_list = LIST_ITEM.match(text) and not LIST_ITEM.match(previous)
            if starts_list and not previous.startswith(" "):
                errors.append(f"line {number}: a list needs a blank line before it")
            if text.startswith("|") and not previous.startswith("|"):
                errors.append(f"line {number}: a table needs a blank line before it")
        previous = "" if in_fence else text
    return errors


def runnable(page: Path) -> list[Block]:
    return [b for b in parse_page(page)[0] if b.kind in RUN | {"script", "ranks"}]


RUN_PAGES = [page for page in PAGES if runnable(page)]


@pytest.mark.parametrize("page", PAGES, ids=shown)
def test_page_fences_are_well_formed(page: Path) -> None:
    blocks, errors = parse_page(page)
    errors += layout_errors(page)
    assert errors == [], f"{shown(page)}: " + "; ".join(errors)
    for block in blocks:
        where = f"{shown(page)}:{block.line}"
        try:
            if block.kind == "toml":
                tomllib.loads(block.code)
            elif block.kind == "json":
                json.loads(block.code)
        except ValueError as err:  # TOMLDecodeError and JSONDecodeError are ValueErrors
            raise AssertionError(f"{where}: the {block.kind} block does not parse: {err}") from err


def run_page(page: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Runs the page's python, bash, script and rank blocks, in order, in an empty directory,
    through ``_page_runner.py``; its output is stdout and stderr together."""
    blocks = runnable(page)
    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    work.mkdir(parents=True)
    bin_dir.mkdir(parents=True)
    for name, command in [
        ("python", f'exec "{sys.executable}" "$@"'),
        ("python3", f'exec "{sys.executable}" "$@"'),
        ("tensordict-rs", f'exec "{sys.executable}" -m tensordict_rs "$@"'),
    ]:
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\n{command}\n")
        shim.chmod(0o755)
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps({"page": str(page), "shown": shown(page), "blocks": [asdict(b) for b in blocks]})
    )
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONWARNINGS": "error",  # an example that warns is an example to fix
    }
    return subprocess.run(
        [sys.executable, str(RUNNER), str(plan)],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )


@pytest.mark.parametrize("page", RUN_PAGES, ids=shown)
def test_page_code_runs(page: Path, tmp_path: Path) -> None:
    out = run_page(page, tmp_path)
    failed = re.findall(r"^FAILED: (.*)$", out.stdout, flags=re.M)
    assert out.returncode == 0, (
        f"{failed[0] if failed else shown(page)} failed; its output:\n{out.stdout[-6000:]}"
    )
    assert f"ran {len(runnable(page))} blocks of {shown(page)}" in out.stdout


FAILING_PAGE = """\
# A page whose third block fails

```python
made = 41
```

```bash
test -f nothing-yet || touch made-by-bash
```

```python
assert made + 1 == 42 and open("made-by-bash").read() == ""
raise ValueError("the example is wrong")
```

```python
print("never runs")
```
"""


def test_a_failing_block_fails_its_page(tmp_path: Path) -> None:
    """The harness itself: state is shared between blocks, and the first block that fails
    stops the page, named by page, number and line; the traceback points at the page."""
    page = tmp_path / "page.md"
    page.write_text(FAILING_PAGE)
    out = run_page(page, tmp_path)
    assert out.returncode == 1
    assert f"FAILED: {page} block 3 of 4 (line 12, python)" in out.stdout
    assert f'File "{page}", line 13' in out.stdout and "the example is wrong" in out.stdout
    assert "never runs" not in out.stdout


@pytest.mark.parametrize(
    ("marker", "code", "message"),
    [
        ("", "exit 3", "bash exited with status 3"),
        ("<!-- run: script -->", "import sys\nsys.exit(4)", "exited with status 4"),
        (
            "<!-- run: ranks=2 -->",
            "import os, sys\nsys.exit(int(os.environ['RANK']) * 5)",
            "rank 1 exited with status 5",
        ),
    ],
)
def test_a_failing_program_fails_its_page(
    tmp_path: Path, marker: str, code: str, message: str
) -> None:
    """A bash block, a whole program and a job of ranks fail their page the same way."""
    lang = "bash" if not marker else "python"
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\n{marker}\n\n```{lang}\n{code}\n```\n")
    out = run_page(page, tmp_path)
    assert out.returncode == 1 and message in out.stdout, out.stdout
    assert f"FAILED: {page} block 1 of 1 (line 6, " in out.stdout


def test_a_text_block_after_code_is_its_output(tmp_path: Path) -> None:
    """The text block under a python or bash block is what it prints; another text block (or
    one after prose) is only shown."""
    page = tmp_path / "page.md"
    shown_output = "```text\nhello  \nworld\n\n```\n"
    page.write_text(
        "# Page\n\n```python\nprint('hello')\nprint('world')\n```\n\n"
        + shown_output
        + "\nJust shown:\n\n```text\nanything\n```\n\n```bash\necho bash\n```\n"
        "```text\nbash\n```\n"
    )
    blocks, errors = parse_page(page)
    assert errors == [] and [b.expect for b in blocks if b.kind in RUN] == [
        "hello  \nworld\n\n",
        "bash\n",
    ]
    assert run_page(page, tmp_path / "good").returncode == 0
    page.write_text(page.read_text().replace("world\n\n```", "world!\n```"))
    out = run_page(page, tmp_path / "bad")
    assert out.returncode == 1 and "the output is not the one the page shows" in out.stdout
    assert "-world!" in out.stdout and "+world" in out.stdout


def test_ranks_get_torchruns_environment(tmp_path: Path) -> None:
    """Each rank sees torchrun's variables, a loopback master and the page's directory."""
    code = (
        "import os, pathlib\n"
        "assert os.environ['MASTER_ADDR'] == '127.0.0.1' and os.environ['WORLD_SIZE'] == '3'\n"
        "pathlib.Path(f\"rank-{os.environ['RANK']}-{os.environ['LOCAL_RANK']}\").touch()\n"
    )
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\n<!-- run: ranks=3 -->\n\n```python\n{code}```\n")
    out = run_page(page, tmp_path)
    assert out.returncode == 0, out.stdout
    assert sorted(p.name for p in (tmp_path / "work").glob("rank-*")) == [
        "rank-0-0",
        "rank-1-1",
        "rank-2-2",
    ]


def test_the_docs_show_code() -> None:
    """Every page of the user guide shows code that runs, and the whole set is not small."""
    guide = sorted((DOCS / "guide").glob("*.md"))
    assert len(guide) >= 7
    assert [shown(p) for p in guide if not runnable(p)] == []
    assert sum(len(runnable(p)) for p in PAGES) >= 40
    kinds = {b.kind for p in PAGES for b in runnable(p)}
    assert kinds == {"python", "bash", "script", "ranks"}


def test_console_make_targets_exist() -> None:
    """`$ make X` in a transcript (the README's two commands) names a target of the Makefile."""
    targets = sorted(
        {
            m.group(1)
            for page in PAGES
            for b in parse_page(page)[0]
            if b.kind == "console"
            for m in re.finditer(r"^\$ make ([\w.-]+)", b.code, flags=re.M)
        }
    )
    assert {"demo", "test"} <= set(targets)
    out = subprocess.run(
        ["make", "-n", *targets], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr


def _slug(heading: str) -> str:
    """The anchor of a heading, as GitHub and MkDocs' toc both make it for plain headings."""
    text = re.sub(r"[`*_\[\]()]", "", heading.strip().lower())
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"\s+", "-", text.strip())


def test_readme_links_resolve() -> None:
    """The README's links into docs/ lead to pages that exist, and to headings they have
    (MkDocs checks the links between the pages of docs/ when it builds)."""
    text = README.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        path, _, anchor = link.partition("#")
        target = (README.parent / path) if path else README
        assert target.is_file(), f"README links to {link}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", target.read_text(), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, f"README links to {link}: no heading"
