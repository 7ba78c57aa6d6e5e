#!/usr/bin/env python3
"""Fails on an import that runs up the layers drawn in ``tools/layers/*.toml``.

    python tools/check_layers.py                      # tools/layers/rust.toml and python.toml
    python tools/check_layers.py --base DIR A.toml    # another tree, another map

A map names a ``root`` folder (relative to ``--base``, by default the repository root), the
``top`` files that may import everything, and ``[[layers]]`` from the bottom up, each a
``level`` and its ``modules`` (a file, or a folder: everything under it). A module may import
itself (anything under its own file or folder) and any module of a strictly lower level; the
same level (another module) or a higher one is a violation, and so is importing a ``top`` file
from below. Also reported: a ``.rs``/``.py``/``.pyi`` file under the root that belongs to no
module (new files must be placed), a module listed twice (or one inside another), a module
that does not exist, an import that leads to no module under the root, and ``#[path]`` in Rust.

What counts as an import:

- Python (parsed with ``ast``): every ``import`` and ``from ... import`` of the package,
  absolute or relative (``from . import x``, ``from .x import y``, ``from ..x import y``), at
  any depth (inside functions, under ``if TYPE_CHECKING:``), and ``importlib.import_module``
  with a constant name. ``from . import x`` resolves to the sibling module ``x`` when there is
  one, else to the package's ``__init__``.
- Rust (comments, strings and char literals stripped first): every path that starts with
  ``crate::`` or ``$crate::``, in ``use`` lines (groups ``{a, b::c}`` expanded) and inline in
  code, and every ``super::`` / ``self::`` path, resolved from the module it is written in
  (inline ``mod x { ... }`` blocks included): a path that stays inside its own module is free.
  A path is mapped to the deepest ``a/b.rs`` or ``a/b/mod.rs`` that exists, else to the crate
  root (``lib.rs``).

Each violation is printed as ``path:line: <module> (level N) imports <module> (level M)`` (the
other findings as ``path:line: message``); the exit status is 1 when there is any, 2 for a map
that cannot be read, 0 otherwise. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MAPS = ("tools/layers/rust.toml", "tools/layers/python.toml")
SOURCE_SUFFIXES = (".rs", ".py", ".pyi")
TOP = "top"


class MapError(Exception):
    """A layer map that cannot be used (unreadable, or not of the documented schema)."""


@dataclass
class LayerMap:
    """One parsed ``tools/layers/*.toml``: where the tree is and which module sits where."""

    source: str  # the map's path, for messages
    root: Path  # the folder the modules are relative to
    root_text: str  # ``root`` as written, for messages
    levels: dict[str, int | str] = field(default_factory=dict)  # module -> level or TOP
    problems: list[str] = field(default_factory=list)  # listed twice, missing

    def owner(self, rel: str) -> str | None:
        """The module (a key of ``levels``) that a path relative to the root belongs to."""
        for module in self.levels:
            if rel == module or rel.startswith(module + "/"):
                return module
            # Rust's `x.rs` owns its child folder `x/`; a module named without a suffix
            # (the extension `_native`) owns its files `_native.pyi`, `_native.abi3.so`, ...
            if module.endswith(".rs") and rel.startswith(module[: -len(".rs")] + "/"):
                return module
            if "." not in PurePosixPath(module).name and rel.startswith(module + "."):
                return module
        return None

    def level(self, module: str) -> int | str:
        return self.levels[module]


def _clean(module: object, where: str) -> str:
    if not isinstance(module, str) or not module.strip("/"):
        raise MapError(f"{where}: a module must be a non-empty string, got {module!r}")
    path = PurePosixPath(module.strip("/"))
    if path.is_absolute() or ".." in path.parts or "." in path.parts:
        raise MapError(f"{where}: a module is a path under the root, got {module!r}")
    return str(path)


def load_map(path: Path, base: Path) -> LayerMap:
    """Reads and checks one map; raises ``MapError`` when it is not of the schema."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise MapError(f"{path}: cannot read the layer map: {err}") from err
    unknown = set(data) - {"root", "top", "layers"}
    if unknown:
        raise MapError(f"{path}: unknown keys {sorted(unknown)} (root, top, layers)")
    root = data.get("root")
    if not isinstance(root, str) or not root:
        raise MapError(f'{path}: `root` must be a folder name, such as "rust"')
    top = data.get("top", [])
    layers = data.get("layers")
    if not isinstance(top, list):
        raise MapError(f"{path}: `top` must be a list of files")
    if not isinstance(layers, list) or not layers:
        raise MapError(f"{path}: no [[layers]]")
    result = LayerMap(str(path), base / root, root)
    placed: list[tuple[str, int | str]] = [(_clean(m, f"{path}: top"), TOP) for m in top]
    seen_levels: set[int] = set()
    for layer in layers:
        if not isinstance(layer, dict) or set(layer) - {"level", "modules"}:
            raise MapError(f"{path}: each [[layers]] has `level` and `modules`, got {layer!r}")
        level, modules = layer.get("level"), layer.get("modules")
        if not isinstance(level, int) or isinstance(level, bool) or level < 0:
            raise MapError(f"{path}: `level` must be an integer >= 0, got {level!r}")
        if level in seen_levels:
            raise MapError(f"{path}: level {level} is given twice")
        seen_levels.add(level)
        if not isinstance(modules, list):
            raise MapError(f"{path}: level {level}: `modules` must be a list")
        placed += [(_clean(m, f"{path}: level {level}"), level) for m in modules]

    def show(level: int | str) -> str:
        return "top" if level == TOP else f"level {level}"

    for module, level in placed:
        if module in result.levels:
            result.problems.append(
                f"{path}: module {module} is listed twice "
                f"({show(result.levels[module])} and {show(level)})"
            )
            continue
        for other, other_level in result.levels.items():
            if module.startswith(other + "/") or other.startswith(module + "/"):
                result.problems.append(
                    f"{path}: module {module} ({show(level)}) and {other} "
                    f"({show(other_level)}) overlap: a module is listed twice"
                )
        result.levels[module] = level
        stem = PurePosixPath(module)
        if not (result.root / module).exists() and not any(
            (result.root / stem.parent).glob(stem.name + ".*")
        ):
            result.problems.append(
                f"{path}: module {module} ({show(level)}) does not exist under {root}"
            )
    # The longest module first, so that ``owner`` finds the most specific one.
    result.levels = dict(sorted(result.levels.items(), key=lambda kv: -len(kv[0])))
    return result


# ---------------------------------------------------------------------------- finding imports


@dataclass(frozen=True)
class Import:
    """One reference from a file to another file (both relative to the root)."""

    line: int
    target: str | None  # None: leads to no file under the root
    text: str  # what was written, for the messages of unresolved imports


def _python_module(rel: PurePosixPath) -> tuple[list[str], bool]:
    """The module path of a file (inside the package) and whether it is a package."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        return parts[:-1], True
    return parts, False


def _python_exact(root: Path, parts: list[str]) -> str | None:
    """The file (or folder) of the module ``parts`` when it is one, else None."""
    name = "/".join(parts)
    if not parts:
        candidates = ["__init__.py", "__init__.pyi"]
    else:
        candidates = [f"{name}.py", f"{name}/__init__.py", f"{name}.pyi", f"{name}/__init__.pyi"]
    for candidate in candidates:
        if (root / candidate).is_file():
            return candidate
    if parts and (root / name).is_dir():
        return name  # a namespace package
    if parts:
        folder = root.joinpath(*parts[:-1])
        if folder.is_dir():
            for ext in sorted(folder.glob(f"{parts[-1]}.*")):
                if ext.suffix in (".so", ".pyd"):
                    pyi = f"{name}.pyi"
                    return pyi if (root / pyi).is_file() else str(ext.relative_to(root))
    return None


def _python_resolve(root: Path, parts: list[str]) -> str | None:
    """The deepest module along ``parts`` (``a.b.name`` where ``name`` is no module: ``a.b``)."""
    for k in range(len(parts), -1, -1):
        found = _python_exact(root, parts[:k])
        if found is not None:
            return found
    return None


def python_imports(root: Path, rel: PurePosixPath, package: str) -> Iterator[Import]:
    """Every import of the package (``package`` is its name) made by the file ``rel``."""
    text = (root / rel).read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(root / rel))
    module, is_package = _python_module(rel)
    here = module if is_package else module[:-1]  # the package that `.` means

    def absolute(name: str) -> list[str] | None:
        if name == package:
            return []
        if name.startswith(package + "."):
            return name[len(package) + 1 :].split(".")
        return None

    def relative(level: int, name: str | None) -> list[str] | None:
        if level - 1 > len(here):
            return None
        base = here[: len(here) - (level - 1)]
        return base + (name.split(".") if name else [])

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = absolute(alias.name)
                if parts is not None:
                    yield Import(node.lineno, _python_resolve(root, parts), alias.name)
        elif isinstance(node, ast.ImportFrom):
            written = "from " + "." * node.level + (node.module or "") + " import "
            if node.level:
                parts = relative(node.level, node.module)
                if parts is None:
                    names = ", ".join(alias.name for alias in node.names)
                    yield Import(node.lineno, None, written + names)
                    continue
            else:
                parts = absolute(node.module or "")
                if parts is None:
                    continue
            for alias in node.names:
                sub = None if alias.name == "*" else _python_exact(root, [*parts, alias.name])
                target = sub if sub is not None else _python_resolve(root, parts)
                yield Import(node.lineno, target, written + alias.name)
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            name = node.args[0]
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                continue
            if name.value.startswith("."):
                dots = len(name.value) - len(name.value.lstrip("."))
                parts = relative(dots, name.value[dots:] or None)
            else:
                parts = absolute(name.value)
                if parts is None:
                    continue
            target = None if parts is None else _python_resolve(root, parts)
            yield Import(node.lineno, target, f"import_module({name.value!r})")


def _is_import_module(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


_RUST_TOKEN = re.compile(
    r"""
    (?P<line>//[^\n]*)
  | (?P<block>/\*)
  | (?P<raw>b?r(?P<hashes>\#*)")
  | (?P<str>b?"(?:\\.|[^"\\])*")
  | (?P<char>b?'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F_]*\}|.)|[^\\'\n])')
  | (?P<lifetime>'[A-Za-z_][A-Za-z0-9_]*)
    """,
    re.VERBOSE | re.DOTALL,
)


def strip_rust(text: str) -> str:
    """``text`` with comments, string and char literals blanked (newlines kept)."""

    def blank(s: str) -> str:
        return re.sub(r"[^\n]", " ", s)

    out: list[str] = []
    pos = 0
    while True:
        m = _RUST_TOKEN.search(text, pos)
        if m is None:
            out.append(text[pos:])
            return "".join(out)
        out.append(text[pos : m.start()])
        kind = next(k for k in ("line", "block", "raw", "str", "char", "lifetime") if m.group(k))
        end = m.end()
        if kind == "block":  # nested /* /* */ */
            depth, i = 1, m.end()
            while depth and i < len(text):
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            end = i
        elif kind == "raw":
            close = '"' + (m.group("hashes") or "")
            found = text.find(close, m.end())
            end = len(text) if found == -1 else found + len(close)
        elif kind == "lifetime":
            out.append(m.group())
            pos = end
            continue
        out.append(blank(text[m.start() : end]))
        pos = end


_IDENT = re.compile(r"\s*(r#)?([A-Za-z_][A-Za-z0-9_]*)")
_SEP = re.compile(r"\s*::")
_PATH_START = re.compile(r"(?<![\w$])(\$crate|crate|super|self)(?=\s*::)")
_INLINE_MOD = re.compile(r"(?<![\w])mod\s+(r#)?([A-Za-z_][A-Za-z0-9_]*)\s*\{")
_SUPER = re.compile(r"\s*super\s*::")
_PATH_ATTR = re.compile(r"#!?\s*\[\s*(?:cfg_attr\s*\([^\]]*?,\s*)?path\s*=")


def _use_tree(text: str, pos: int, prefix: list[str]) -> tuple[list[list[str]], int]:
    """The paths of a path or use tree starting at ``pos`` (just after a ``::``)."""
    m = re.compile(r"\s*\{").match(text, pos)
    if m is not None:  # a group: {a, b::c, self}
        paths: list[list[str]] = []
        pos = m.end()
        while True:
            close = re.compile(r"\s*\}").match(text, pos)
            if close is not None:
                return paths or [prefix], close.end()
            sub, pos = _use_tree(text, pos, prefix)
            paths += sub
            comma = re.compile(r"\s*,").match(text, pos)
            if comma is not None:
                pos = comma.end()
            elif re.compile(r"\s*\}").match(text, pos) is None:
                return paths or [prefix], pos  # not a use tree after all
    ident = _IDENT.match(text, pos)
    if ident is None:
        return [prefix], pos  # `*`, `<T>`, ...
    name = ident.group(2)
    path = prefix if name == "self" else [*prefix, name]
    sep = _SEP.match(text, ident.end())
    if sep is None:
        return [path], ident.end()
    return _use_tree(text, sep.end(), path)


def _rust_module(rel: PurePosixPath) -> list[str]:
    parts = list(rel.with_suffix("").parts)
    if len(parts) == 1 and parts[0] in ("lib", "main"):
        return []
    if parts[-1] == "mod":
        return parts[:-1]
    return parts


def _rust_resolve(root: Path, parts: list[str], crate_root: str) -> str:
    for k in range(len(parts), 0, -1):
        name = "/".join(parts[:k])
        for candidate in (f"{name}.rs", f"{name}/mod.rs"):
            if (root / candidate).is_file():
                return candidate
    return crate_root


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def rust_imports(root: Path, rel: PurePosixPath, crate_root: str) -> Iterator[Import]:
    """Every ``crate::``, ``super::`` and ``self::`` path of one file, as the file it reaches;
    a ``#[path]`` attribute as an import of nothing."""
    code = strip_rust((root / rel).read_text(encoding="utf-8"))
    for m in _PATH_ATTR.finditer(code):
        yield Import(_line(code, m.start()), None, "#[path]")
    module = _rust_module(rel)
    # inline `mod name { ... }` blocks: (start, end, name)
    blocks: list[tuple[int, int, str]] = []
    for m in _INLINE_MOD.finditer(code):
        depth, i = 1, m.end()
        while depth and i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        blocks.append((m.start(), i, m.group(2)))
    for m in _PATH_START.finditer(code):
        if code[max(0, m.start() - 200) : m.start()].rstrip().endswith("::"):
            continue  # `a::self::b`, `a::super`: not the start of a path
        start = m.group(1)
        sep = _SEP.match(code, m.end())
        assert sep is not None  # the pattern's lookahead saw it
        after = sep.end()
        if start in ("crate", "$crate"):
            base: list[str] = []
        else:  # from the module the path is written in, inline `mod x { }` included
            base = module + [name for s, e, name in blocks if s < m.start() < e]
            if start == "super":
                base = base[:-1]
                while (more := _SUPER.match(code, after)) is not None:
                    base, after = base[:-1], more.end()
        for path in _use_tree(code, after, base)[0]:
            written = "::".join([start, *path[len(base) :]])
            yield Import(_line(code, m.start()), _rust_resolve(root, path, crate_root), written)


# ---------------------------------------------------------------------------- checking


def _sources(root: Path) -> list[PurePosixPath]:
    files = []
    for path in sorted(root.rglob("*")):
        rel = PurePosixPath(path.relative_to(root).as_posix())
        if any(part == "__pycache__" or part.startswith(".") for part in rel.parts):
            continue
        if path.is_file() and path.suffix in SOURCE_SUFFIXES:
            files.append(rel)
    return files


def check(layer_map: LayerMap, base: Path) -> tuple[list[str], int, int]:
    """The findings of one map (sorted), the number of files and of imports checked."""
    root = layer_map.root
    if not root.is_dir():
        return [f"{layer_map.source}: root {layer_map.root_text} is not a folder"], 0, 0
    findings: list[tuple[str, int, str]] = []

    def shown(rel: PurePosixPath | str) -> str:
        path = root / rel
        try:
            return path.relative_to(base).as_posix()
        except ValueError:
            return path.as_posix()

    def level_text(module: str) -> str:
        level = layer_map.level(module)
        return "level top" if level == TOP else f"level {level}"

    crate_root = "lib.rs" if (root / "lib.rs").is_file() else "main.rs"
    package = root.name
    files = _sources(root)
    count = 0
    for rel in files:
        owner = layer_map.owner(str(rel))
        if owner is None:
            findings.append((shown(rel), 1, f"{rel} belongs to no layer (place it in the map)"))
            continue
        try:
            if rel.suffix == ".rs":
                imports = list(rust_imports(root, rel, crate_root))
            else:
                imports = list(python_imports(root, rel, package))
        except (SyntaxError, UnicodeDecodeError) as err:
            findings.append((shown(rel), 1, f"cannot be parsed: {err}"))
            continue
        for imp in imports:
            count += 1
            if imp.text == "#[path]":
                findings.append(
                    (shown(rel), imp.line, "#[path] attribute: a module lives at its own path")
                )
                continue
            if imp.target is None:
                findings.append(
                    (shown(rel), imp.line, f"{owner} imports {imp.text}: no module under the root")
                )
                continue
            target = layer_map.owner(imp.target)
            if target is None:
                continue  # a file of no layer: reported as such
            src_level, dst_level = layer_map.level(owner), layer_map.level(target)
            if target == owner or src_level == TOP:
                continue
            if isinstance(dst_level, int) and isinstance(src_level, int) and dst_level < src_level:
                continue
            findings.append(
                (
                    shown(rel),
                    imp.line,
                    f"{owner} ({level_text(owner)}) imports {target} ({level_text(target)})",
                )
            )
    lines = sorted(set(findings))
    return layer_map.problems + [f"{p}:{n}: {msg}" for p, n, msg in lines], len(files), count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("maps", nargs="*", help=f"layer maps (default: {' '.join(DEFAULT_MAPS)})")
    parser.add_argument(
        "--base", type=Path, default=REPO, help="the folder `root` is relative to (the repo)"
    )
    args = parser.parse_args(argv)
    base: Path = args.base
    maps = [Path(m) for m in args.maps] or [base / m for m in DEFAULT_MAPS]
    failed = False
    for path in maps:
        try:
            layer_map = load_map(path, base)
        except MapError as err:
            print(err, file=sys.stderr)
            return 2
        findings, files, imports = check(layer_map, base)
        for finding in findings:
            print(finding)
        failed = failed or bool(findings)
        verdict = f"{len(findings)} problem(s)" if findings else "no import runs up the layers"
        print(f"{path}: {files} files, {imports} imports: {verdict}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
