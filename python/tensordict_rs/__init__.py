"""tensordict-rs: TensorDict with devices and memory-mapped tensors, on a Rust core.

Directories are in the format of PyTorch's ``tensordict`` (0.15) and move both ways.

The torch-dependent names (``TensorDict``, ``MemoryMappedTensor``, ``NonTensorData``) are
imported on first use (PEP 562), so that the command line (``tensordict_rs.cli``) and
``verify`` read directories without importing torch:

>>> from tensordict_rs import TensorDict
>>> TensorDict({"a": [1.0, 2.0]}, batch_size=[2])["a"]
tensor([1., 2.])
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
from typing import TYPE_CHECKING, Any

from ._native import (
    FileExistsRuntimeError,
    InvalidDirectoryError,
    InvalidTreeError,
    LockedError,
    SymlinkError,
    TensorDictError,
    UnsupportedFormatError,
)
from .verify import verify

if TYPE_CHECKING:
    from ._core.classes import (
        TensorCollection,
        TensorDictBase,
        is_tensor_collection,
        is_tensorclass,
    )
    from ._core.linked_list import LinkedList
    from ._core.metadata import MetaData
    from ._core.nodes import NonTensorData
    from ._core.nontensor import NonTensorStack, is_non_tensor
    from ._core.nontensor_options import (
        capture_non_tensor_stack,
        get_defaults_to_none,
        list_to_stack,
        set_capture_non_tensor_stack,
        set_get_defaults_to_none,
        set_list_to_stack,
    )
    from ._core.unbatched import UnbatchedTensor
    from .functional import (
        cat,
        dense_stack_tds,
        from_any,
        from_consolidated,
        from_dict,
        from_h5,
        from_module,
        from_modules,
        from_namedtuple,
        from_pytree,
        from_safetensors,
        from_struct_array,
        from_tuple,
        fromkeys,
        lazy_stack,
        load,
        load_memmap,
        make_tensordict,
        maybe_dense_stack,
        merge_tensordicts,
        pad,
        pad_sequence,
        save,
        stack,
        to_safetensors,
    )
    from .io.archive import is_memmap_archive, pack_memmap, refresh_archive_checksums, unpack_memmap
    from .io.saving import TensorDictFuture
    from .memmap import MemoryMappedTensor
    from .nn import TensorDictParams
    from .share.pool_watch import WorkerDiedError
    from .tensorclass import TensorClass, from_dataclass, tensorclass
    from .tensordict import TensorDict
    from .typed import TypedTensorDict
    from .utils import (
        KEY_SEPARATOR,
        NestedKey,
        assert_allclose_td,
        assert_close,
        default_is_leaf,
        is_bool,
        is_floating,
        is_inexact,
        is_integer,
        is_leaf_nontensor,
        unravel_key,
        unravel_key_list,
        unravel_key_to_tuple,
    )

#: The installed distribution's version (its metadata: the wheel's, or the editable install's),
#: so that it cannot drift from what ``pip`` reports; ``tensordict-rs --version`` prints the same.
__version__: str = importlib.metadata.version("tensordict-rs")

__all__ = [
    "KEY_SEPARATOR",
    "FileExistsRuntimeError",
    "InvalidDirectoryError",
    "InvalidTreeError",
    "LinkedList",
    "LockedError",
    "MemoryMappedTensor",
    "MetaData",
    "NestedKey",
    "NonTensorData",
    "NonTensorStack",
    "SymlinkError",
    "TensorClass",
    "TensorCollection",
    "TensorDict",
    "TensorDictBase",
    "TensorDictError",
    "TensorDictFuture",
    "TensorDictParams",
    "TypedTensorDict",
    "UnbatchedTensor",
    "UnsupportedFormatError",
    "WorkerDiedError",
    "__version__",
    "assert_allclose_td",
    "assert_close",
    "capture_non_tensor_stack",
    "cat",
    "default_is_leaf",
    "dense_stack_tds",
    "from_any",
    "from_consolidated",
    "from_dataclass",
    "from_dict",
    "from_h5",
    "from_module",
    "from_modules",
    "from_namedtuple",
    "from_pytree",
    "from_safetensors",
    "from_struct_array",
    "from_tuple",
    "fromkeys",
    "get_defaults_to_none",
    "is_bool",
    "is_floating",
    "is_inexact",
    "is_integer",
    "is_leaf_nontensor",
    "is_memmap_archive",
    "is_non_tensor",
    "is_tensor_collection",
    "is_tensorclass",
    "lazy_stack",
    "list_to_stack",
    "load",
    "load_memmap",
    "make_tensordict",
    "maybe_dense_stack",
    "merge_tensordicts",
    "pack_memmap",
    "pad",
    "pad_sequence",
    "refresh_archive_checksums",
    "save",
    "set_capture_non_tensor_stack",
    "set_get_defaults_to_none",
    "set_list_to_stack",
    "stack",
    "tensorclass",
    "to_safetensors",
    "unpack_memmap",
    "unravel_key",
    "unravel_key_list",
    "unravel_key_to_tuple",
    "verify",
]

_LAZY = {
    "TensorCollection": "._core.classes",
    "TensorDictBase": "._core.classes",
    "is_tensor_collection": "._core.classes",
    "is_tensorclass": "._core.classes",
    "cat": ".functional",
    "dense_stack_tds": ".functional",
    "lazy_stack": ".functional",
    "make_tensordict": ".functional",
    "merge_tensordicts": ".functional",
    "pad": ".functional",
    "pad_sequence": ".functional",
    "stack": ".functional",
    "from_any": ".functional",
    "from_consolidated": ".functional",
    "from_dict": ".functional",
    "from_h5": ".functional",
    "from_module": ".functional",
    "from_modules": ".functional",
    "from_namedtuple": ".functional",
    "from_pytree": ".functional",
    "from_safetensors": ".functional",
    "from_struct_array": ".functional",
    "from_tuple": ".functional",
    "fromkeys": ".functional",
    "load": ".functional",
    "load_memmap": ".functional",
    "maybe_dense_stack": ".functional",
    "save": ".functional",
    "to_safetensors": ".functional",
    "KEY_SEPARATOR": ".utils",
    "NestedKey": ".utils",
    "default_is_leaf": ".utils",
    "is_leaf_nontensor": ".utils",
    "assert_allclose_td": ".utils",
    "assert_close": ".utils",
    "is_bool": ".utils",
    "is_floating": ".utils",
    "is_inexact": ".utils",
    "is_integer": ".utils",
    "unravel_key": ".utils",
    "unravel_key_list": ".utils",
    "unravel_key_to_tuple": ".utils",
    "TensorDictParams": ".nn",
    "TensorClass": ".tensorclass",
    "from_dataclass": ".tensorclass",
    "tensorclass": ".tensorclass",
    "TypedTensorDict": ".typed",
    "utils": ".utils",
    "MemoryMappedTensor": ".memmap",
    "MetaData": "._core.metadata",
    "NonTensorData": "._core.nodes",
    "LinkedList": "._core.linked_list",
    "NonTensorStack": "._core.nontensor",
    "capture_non_tensor_stack": "._core.nontensor_options",
    "is_non_tensor": "._core.nontensor",
    "list_to_stack": "._core.nontensor_options",
    "set_capture_non_tensor_stack": "._core.nontensor_options",
    "set_list_to_stack": "._core.nontensor_options",
    "get_defaults_to_none": "._core.nontensor_options",
    "set_get_defaults_to_none": "._core.nontensor_options",
    "TensorDict": ".tensordict",
    "UnbatchedTensor": "._core.unbatched",
    "WorkerDiedError": ".share.pool_watch",
    "TensorDictFuture": ".io.saving",
    "is_memmap_archive": ".io.archive",
    "pack_memmap": ".io.archive",
    "refresh_archive_checksums": ".io.archive",
    "unpack_memmap": ".io.archive",
}


def __getattr__(name: str) -> Any:
    """Imports a torch-dependent name on first access and caches it in the module."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    imported = importlib.import_module(module, __name__)
    value = imported if name == "utils" else getattr(imported, name)
    if name == "TensorDict":  # registers TensorDictParams for from_module(as_module=True)
        importlib.import_module(".nn", __name__)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# Modules of the flat layout (before the subpackages) that pickles name: a pickled TensorDict
# names ``tensordict_rs._tree.NonTensorData`` for its non-tensor entries, a pickled ``keys()``
# ``tensordict_rs._walk.KeyList``. Each old path is a module whose names resolve, on first use
# (torch is not imported here), in the module that holds them now, so those pickles still load.
_MOVED_MODULES = {"_tree": "._core.nodes", "_walk": "._core.walk"}


def _alias(old: str, new: str) -> None:
    module = types.ModuleType(f"{__name__}.{old}", f"Moved to {__name__}{new} (old pickles).")

    def moved(name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            # (``inspect`` asks every module in sys.modules for ``__file__``, torch's import
            # does so: answering would import the new module in the middle of that import)
            raise AttributeError(name)
        return getattr(importlib.import_module(new, __name__), name)

    module.__dict__["__getattr__"] = moved  # PEP 562: looked up on each missing name
    sys.modules.setdefault(module.__name__, module)


for _old, _new in _MOVED_MODULES.items():
    _alias(_old, _new)


class _Package(types.ModuleType):
    """This package's module type: ``tensordict_rs.tensorclass`` is the decorator, as
    ``tensordict.tensorclass`` is, also after the submodule of that name is imported (the
    import system then sets the package attribute to the submodule; it gets the decorator).
    ``from tensordict_rs.tensorclass import ...`` still reads the submodule."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "tensorclass" and isinstance(value, types.ModuleType):
            value = value.tensorclass
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
