"""tools/check_layers.py: small fake trees (a Rust crate, a Python package) in temporary
folders, each with its layer map; the check passes on the clean tree and fails, naming the
file, the line and both modules, on each planted violation."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "check_layers.py"


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_layers", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_layers"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


check_layers = _load_tool()

RUST_MAP = """\
# bottom first
root = "rust"
top = ["lib.rs"]
[[layers]]
level = 0
modules = ["error.rs"]
[[layers]]
level = 1
modules = ["sys", "format"]
[[layers]]
level = 2
modules = ["tree", "packed.rs"]
[[layers]]
level = 3
modules = ["py"]
"""

RUST_TREE = {
    "lib.rs": """
        //! The crate root: exports only.
        mod error;
        mod format;
        mod packed;
        mod py;
        mod sys;
        mod tree;
        pub use crate::py::module;
        """,
    "error.rs": """
        /// One error type; `crate::py::x` in a doc comment is no import.
        pub struct Error;
        const HELP: &str = "see crate::tree::save for the plan";
        const RAW: &str = r#"crate::py "quoted" too"#;
        const QUOTE: char = '"';
        /* a block comment: crate::py::module() /* nested: crate::tree */ still a comment */
        fn tick<'a>(x: &'a str) -> &'a str { x }
        #[cfg(test)]
        mod tests {
            use super::*; // this file's own module: free
            #[test]
            fn t() { let _ = Error; }
        }
        """,
    "sys/mod.rs": """
        //! The OS. May use: error.
        pub mod maps;
        use self::maps::Map; // inside its own folder
        use crate::error::Error;
        pub fn open() -> Result<Map, Error> { Ok(maps::Map) }
        """,
    "sys/maps.rs": """
        use super::super::error::Error; // sys -> error: downward
        pub struct Map;
        pub fn fail() -> Error { crate::error::Error }
        """,
    "format/mod.rs": """
        use crate::error::{self, Error};
        pub fn parse() -> Result<(), Error> { Ok(()) }
        """,
    "tree/mod.rs": """
        pub mod save;
        use crate::{error::Error, format, sys::{self, maps::Map}};
        """,
    "tree/save.rs": """
        use super::super::format::parse;
        macro_rules! fail { () => { $crate::error::Error } }
        pub fn save() { let _ = crate::sys::open(); let _ = fail!(); }
        """,
    "packed.rs": """
        use crate::format;
        pub fn pack() { crate::sys::open().ok(); }
        """,
    "py/mod.rs": """
        use crate::tree::save::save;
        use crate::{packed, error::Error};
        pub fn module() { save(); packed::pack(); }
        """,
}

PYTHON_MAP = """\
root = "python/pkg"
top = ["__init__.py", "tensordict.py"]
[[layers]]
level = 0
modules = ["_native.pyi", "errors.py"]
[[layers]]
level = 1
modules = ["_core"]
[[layers]]
level = 2
modules = ["ops/shape.py"]
[[layers]]
level = 3
modules = ["ops/keys.py", "io"]
[[layers]]
level = 4
modules = ["ops/__init__.py"]
"""

PYTHON_TREE = {
    "__init__.py": """
        from .tensordict import TensorDict
        from . import io, ops
        """,
    "tensordict.py": """
        from ._core import walk
        from .ops import keys, shape
        from .io import files

        class TensorDict(walk.Node):
            pass
        """,
    "_native.pyi": """
        def load(path: str) -> bytes: ...
        """,
    "errors.py": """
        class TensorDictError(Exception):
            pass
        """,
    "_core/__init__.py": """
        from . import walk
        """,
    "_core/walk.py": """
        from __future__ import annotations

        from typing import TYPE_CHECKING

        from .. import errors
        from . import nodes  # the sibling module of this folder

        if TYPE_CHECKING:
            from .nodes import Leaf

        class Node:
            pass
        """,
    "_core/nodes.py": """
        import pkg.errors
        from pkg import _native

        class Leaf:
            pass
        """,
    "ops/__init__.py": """
        from . import keys, shape
        """,
    "ops/shape.py": """
        from .._core.walk import Node
        from pkg._core import nodes
        """,
    "ops/keys.py": """
        import importlib

        from . import shape  # the sibling module: level 2, below keys' 3

        def select(node):
            from .._core import walk
            return importlib.import_module("pkg.ops.shape")
        """,
    "io/__init__.py": "",
    "io/files.py": """
        from .. import _native, errors
        from ..ops import shape
        """,
}


def write_tree(base: Path, root: str, files: dict[str, str], layer_map: str) -> Path:
    for rel, text in files.items():
        path = base / root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    (base / "layers.toml").write_text(layer_map)
    return base / "layers.toml"


def run(base: Path, *maps: Path) -> subprocess.CompletedProcess[str]:
    """The tool's ``main`` on these maps, its output captured (in this process: the tool is
    run as `make lint` runs it by ``test_runs_on_the_standard_library_alone``)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = check_layers.main(["--base", str(base), *map(str, maps)])
    return subprocess.CompletedProcess(["check_layers"], rc, out.getvalue(), err.getvalue())


def plant(base: Path, rel: str, text: str) -> int:
    """Appends ``text`` to a file of the tree and returns the line it starts at."""
    path = base / rel
    before = path.read_text() if path.exists() else ""
    if before and not before.endswith("\n"):
        before += "\n"
    path.write_text(before + textwrap.dedent(text).lstrip("\n"))
    return before.count("\n") + 1


@pytest.fixture
def rust(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path, write_tree(tmp_path, "rust", RUST_TREE, RUST_MAP)


@pytest.fixture
def python(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path, write_tree(tmp_path, "python/pkg", PYTHON_TREE, PYTHON_MAP)


def violations(base: Path, layer_map: Path) -> list[str]:
    out = run(base, layer_map)
    assert out.returncode == (1 if out.stdout else 0), out.stderr
    return out.stdout.splitlines()


# ---------------------------------------------------------------------------- clean trees


def test_clean_rust_tree_passes(rust: tuple[Path, Path]) -> None:
    base, layer_map = rust
    out = run(base, layer_map)
    assert (out.returncode, out.stdout) == (0, ""), out.stdout + out.stderr
    assert "9 files" in out.stderr and "no import runs up the layers" in out.stderr


def test_clean_python_tree_passes(python: tuple[Path, Path]) -> None:
    base, layer_map = python
    out = run(base, layer_map)
    assert (out.returncode, out.stdout) == (0, ""), out.stdout + out.stderr
    assert "12 files" in out.stderr


def test_the_clean_trees_really_import(rust: tuple[Path, Path], tmp_path: Path) -> None:
    """The clean trees pass because their imports go down, not because none is seen: the
    imports found in them, as (file, line) -> target file."""
    base, _ = rust
    root = base / "rust"
    found = {
        (str(rel), imp.line, imp.target)
        for rel in map(Path, ["py/mod.rs", "tree/save.rs", "error.rs", "sys/mod.rs"])
        for imp in check_layers.rust_imports(root, rel, "lib.rs")
    }
    assert found == {
        ("py/mod.rs", 1, "tree/save.rs"),
        ("py/mod.rs", 2, "packed.rs"),
        ("py/mod.rs", 2, "error.rs"),
        ("tree/save.rs", 1, "format/mod.rs"),
        ("tree/save.rs", 2, "error.rs"),  # $crate:: in a macro
        ("tree/save.rs", 3, "sys/mod.rs"),  # an inline path
        ("error.rs", 10, "error.rs"),  # `use super::*` of the inline test module
        ("sys/mod.rs", 3, "sys/maps.rs"),
        ("sys/mod.rs", 4, "error.rs"),
    }
    pkg = base / "py" / "pkg"
    write_tree(base / "py", "pkg", PYTHON_TREE, PYTHON_MAP)
    walk = {
        (imp.line, imp.target)
        for imp in check_layers.python_imports(pkg, Path("_core/walk.py"), "pkg")
    }
    assert walk == {(5, "errors.py"), (6, "_core/nodes.py"), (9, "_core/nodes.py")}


# ---------------------------------------------------------------------------- Python


def test_python_plain_upward_import(python: tuple[Path, Path]) -> None:
    base, layer_map = python
    line = plant(base, "python/pkg/_core/nodes.py", "from pkg.ops import keys\n")
    assert violations(base, layer_map) == [
        f"python/pkg/_core/nodes.py:{line}: _core (level 1) imports ops/keys.py (level 3)"
    ]


def test_python_import_inside_a_function(python: tuple[Path, Path]) -> None:
    base, layer_map = python
    line = plant(
        base,
        "python/pkg/_core/walk.py",
        """
        def late():
            import pkg.io.files
            return pkg.io.files
        """,
    )
    assert violations(base, layer_map) == [
        f"python/pkg/_core/walk.py:{line + 1}: _core (level 1) imports io (level 3)"
    ]


def test_python_type_checking_import_of_the_top(python: tuple[Path, Path]) -> None:
    """`TensorDict` imported for annotations is still an import of the top module."""
    base, layer_map = python
    line = plant(
        base,
        "python/pkg/ops/shape.py",
        """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from ..tensordict import TensorDict
        """,
    )
    assert violations(base, layer_map) == [
        f"python/pkg/ops/shape.py:{line + 2}: ops/shape.py (level 2) imports tensordict.py "
        "(level top)"
    ]


def test_python_relative_import_two_levels_up(python: tuple[Path, Path]) -> None:
    base, layer_map = python
    line = plant(base, "python/pkg/_core/nodes.py", "from ..io.files import shape\n")
    assert violations(base, layer_map) == [
        f"python/pkg/_core/nodes.py:{line}: _core (level 1) imports io (level 3)"
    ]


def test_python_sibling_in_a_folder_split_across_levels(python: tuple[Path, Path]) -> None:
    """`from . import keys` in ops/shape.py is the sibling module ops/keys.py (level 3), not
    ops/__init__.py; keys importing shape (above) is allowed."""
    base, layer_map = python
    line = plant(base, "python/pkg/ops/shape.py", "from . import keys\n")
    assert violations(base, layer_map) == [
        f"python/pkg/ops/shape.py:{line}: ops/shape.py (level 2) imports ops/keys.py (level 3)"
    ]


def test_python_same_level_import(python: tuple[Path, Path]) -> None:
    base, layer_map = python
    line = plant(base, "python/pkg/io/files.py", "from ..ops.keys import select\n")
    assert violations(base, layer_map) == [
        f"python/pkg/io/files.py:{line}: io (level 3) imports ops/keys.py (level 3)"
    ]


def test_python_package_root_and_import_module(python: tuple[Path, Path]) -> None:
    """`from pkg import X` is an import of the package's __init__ (the top) unless X is a
    module; `importlib.import_module` with a constant name counts too."""
    base, layer_map = python
    line = plant(
        base,
        "python/pkg/errors.py",
        """
        from pkg import TensorDict
        from pkg import _native
        import importlib
        importlib.import_module("._core.walk", __package__)
        """,
    )
    assert violations(base, layer_map) == [
        f"python/pkg/errors.py:{line}: errors.py (level 0) imports __init__.py (level top)",
        f"python/pkg/errors.py:{line + 1}: errors.py (level 0) imports _native.pyi (level 0)",
        f"python/pkg/errors.py:{line + 3}: errors.py (level 0) imports _core (level 1)",
    ]


def test_python_unplaced_file_and_unknown_module(python: tuple[Path, Path]) -> None:
    base, layer_map = python
    plant(base, "python/pkg/io/new.py", "x = 1\n")  # inside a placed folder: placed
    plant(base, "python/pkg/stray.py", "from .io import new\n")
    line = plant(base, "python/pkg/errors.py", "from . import nothing_here\n")
    assert violations(base, layer_map) == [
        f"python/pkg/errors.py:{line}: errors.py (level 0) imports __init__.py (level top)",
        "python/pkg/stray.py:1: stray.py belongs to no layer (place it in the map)",
    ]
    (base / "python/pkg/errors.py").write_text("from ... import beyond\n")
    assert violations(base, layer_map)[0] == (
        "python/pkg/errors.py:1: errors.py imports from ... import beyond: no module under the root"
    )


# ---------------------------------------------------------------------------- Rust


def test_rust_use_line_upward(rust: tuple[Path, Path]) -> None:
    base, layer_map = rust
    line = plant(base, "rust/sys/maps.rs", "use crate::tree::save::save;\n")
    assert violations(base, layer_map) == [
        f"rust/sys/maps.rs:{line}: sys (level 1) imports tree (level 2)"
    ]


def test_rust_inline_path_upward(rust: tuple[Path, Path]) -> None:
    base, layer_map = rust
    line = plant(base, "rust/packed.rs", "fn x() {\n    crate::py::module();\n}\n")
    assert violations(base, layer_map) == [
        f"rust/packed.rs:{line + 1}: packed.rs (level 2) imports py (level 3)"
    ]


def test_rust_grouped_use_and_super_escaping_the_file(rust: tuple[Path, Path]) -> None:
    base, layer_map = rust
    line = plant(
        base,
        "rust/error.rs",
        """
        use crate::{
            format::parse, // the second line of the group
        };
        use super::tree::save;
        """,
    )
    assert violations(base, layer_map) == [
        f"rust/error.rs:{line}: error.rs (level 0) imports format (level 1)",
        f"rust/error.rs:{line + 3}: error.rs (level 0) imports tree (level 2)",
    ]


def test_rust_same_level_and_the_crate_root(rust: tuple[Path, Path]) -> None:
    base, layer_map = rust
    line = plant(base, "rust/format/mod.rs", "use crate::sys::open;\nuse crate::module;\n")
    assert violations(base, layer_map) == [
        f"rust/format/mod.rs:{line}: format (level 1) imports sys (level 1)",
        f"rust/format/mod.rs:{line + 1}: format (level 1) imports lib.rs (level top)",
    ]


def test_rust_comments_and_strings_are_not_imports(rust: tuple[Path, Path]) -> None:
    """The clean tree's error.rs holds `crate::py` in a doc comment, a string, a raw string
    and nested block comments, and a '"' char literal; adding more changes nothing."""
    base, layer_map = rust
    plant(base, "rust/sys/maps.rs", 'const S: &[u8] = b"crate::py";\n// crate::py::module()\n')
    assert violations(base, layer_map) == []


def test_rust_path_attribute_and_unplaced_file(rust: tuple[Path, Path]) -> None:
    base, layer_map = rust
    line = plant(base, "rust/tree/mod.rs", '#[path = "save_plan.rs"]\nmod plan;\n')
    plant(base, "rust/tree/save_plan.rs", "")  # inside `tree`: placed
    plant(base, "rust/gather.rs", "pub fn rows() {}\n")
    assert violations(base, layer_map) == [
        "rust/gather.rs:1: gather.rs belongs to no layer (place it in the map)",
        f"rust/tree/mod.rs:{line}: #[path] attribute: a module lives at its own path",
    ]


# ---------------------------------------------------------------------------- the map


def test_module_listed_twice_overlapping_or_missing(rust: tuple[Path, Path]) -> None:
    base, layer_map = rust
    text = RUST_MAP.replace('modules = ["py"]', 'modules = ["py", "sys", "tree/save.rs", "zip"]')
    layer_map.write_text(text)
    assert violations(base, layer_map) == [
        f"{layer_map}: module sys is listed twice (level 1 and level 3)",
        f"{layer_map}: module tree/save.rs (level 3) and tree (level 2) overlap: a module is "
        "listed twice",
        f"{layer_map}: module zip (level 3) does not exist under rust",
        "rust/py/mod.rs:1: py (level 3) imports tree/save.rs (level 3)",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("root = 'rust'\n", "no [[layers]]"),
        ("root = 'rust'\nlayers = [{level = 'one', modules = []}]\n", "`level` must be"),
        ("root = 'rust'\nlayers = [{level = 0, module = ['x']}]\n", "each [[layers]] has"),
        ("root = 'rust'\nlevels = []\n", "unknown keys ['levels']"),
        ("root = 'rust'\n[[layers]]\nlevel = 0\nmodules = ['../up']\n", "a path under the root"),
        ("root = 'rust\n", "cannot read the layer map"),
    ],
)
def test_a_map_off_the_schema_is_refused(rust: tuple[Path, Path], text: str, message: str) -> None:
    base, layer_map = rust
    layer_map.write_text(text)
    out = run(base, layer_map)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_both_maps_in_one_run(rust: tuple[Path, Path], tmp_path: Path) -> None:
    """Both maps are checked in one run and a finding in either fails it."""
    base, rust_map = rust
    write_tree(base, "python/pkg", PYTHON_TREE, PYTHON_MAP)
    python_map = base / "python.toml"
    (base / "layers.toml").rename(python_map)
    rust_map = base / "rust.toml"
    rust_map.write_text(RUST_MAP)
    assert run(base, rust_map, python_map).returncode == 0
    plant(base, "python/pkg/errors.py", "from .io import files\n")
    out = run(base, rust_map, python_map)
    assert out.returncode == 1 and out.stdout.count("\n") == 1, out.stdout


def test_runs_on_the_standard_library_alone(rust: tuple[Path, Path]) -> None:
    """As a script, in an isolated interpreter without site-packages (``-I -S``): the tool
    needs nothing beyond the standard library, and its exit status says what it found."""
    base, layer_map = rust

    def script() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-I", "-S", str(TOOL), "--base", str(base), str(layer_map)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    clean = script()
    assert (clean.returncode, clean.stdout) == (0, ""), clean.stderr
    line = plant(base, "rust/error.rs", "use crate::py::module;\n")
    dirty = script()
    assert dirty.returncode == 1
    assert dirty.stdout == f"rust/error.rs:{line}: error.rs (level 0) imports py (level 3)\n"


def test_rust_file_module_owns_its_child_folder(rust: tuple[Path, Path]) -> None:
    """`packed.rs` and its child `packed/tests.rs` are one module (Rust's own layout): the child
    is placed with it, and an upward import from the child is still caught."""
    base, layer_map = rust
    (base / "rust" / "packed").mkdir()
    child = base / "rust" / "packed" / "tests.rs"
    child.write_text("use super::*;\nuse crate::format::Meta;\n")
    assert violations(base, layer_map) == []
    line = plant(base, "rust/packed/tests.rs", "use crate::py::module;\n")
    assert violations(base, layer_map) == [
        f"rust/packed/tests.rs:{line}: packed.rs (level 2) imports py (level 3)"
    ]


def test_python_extension_module_owns_its_files(python: tuple[Path, Path]) -> None:
    """A module listed without a suffix (the compiled extension) owns its stub and binaries;
    without any of them it does not exist."""
    base, _ = python
    pkg = base / "python" / "pkg"
    (pkg / "_ext.pyi").write_text("def f() -> int: ...\n")
    (pkg / "_ext.abi3.so").write_bytes(b"")
    text = PYTHON_MAP.replace('"_native.pyi", "errors.py"]', '"_native.pyi", "errors.py", "_ext"]')
    assert text != PYTHON_MAP
    layer_map = base / "ext.toml"
    layer_map.write_text(text)
    assert violations(base, layer_map) == []
    (pkg / "_ext.pyi").unlink()
    (pkg / "_ext.abi3.so").unlink()
    out = run(base, layer_map)
    assert any(
        "_ext" in v and "does not exist" in v for v in (out.stdout + out.stderr).splitlines()
    )
