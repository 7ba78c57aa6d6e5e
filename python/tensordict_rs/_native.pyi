"""Type stubs of the Rust core: its Python boundary, ``rust/py/`` (exported by ``rust/lib.rs``)."""

from typing import Any, final

__all__ = [
    "ALIGN",
    "BULK_ROW",
    "DESCRIPTION_LIMIT",
    "DTYPES",
    "FORMAT_VERSION",
    "JSON_DEPTH",
    "LEAF",
    "MAGIC",
    "MAX_DEPTH",
    "NODE",
    "NON_TENSOR",
    "NUMBER_KEY",
    "PARALLEL_BYTES",
    "PIECE_BYTES",
    "REFUSED",
    "RESERVED_KEYS",
    "STACK",
    "TENSORCLASS_DIR",
    "Buffer",
    "FileExistsRuntimeError",
    "InvalidDirectoryError",
    "InvalidTreeError",
    "LockedError",
    "PackedTable",
    "ProgressCounter",
    "SymlinkError",
    "TensorDictError",
    "UnsupportedFormatError",
    "anonymous_buffers",
    "borrow_buffer",
    "build_packed_tree",
    "chunk_hashes",
    "copy_packed",
    "decode_strings",
    "describe_tree",
    "encode_key",
    "exchange_dirs",
    "flush_buffers",
    "gather_prepare",
    "gather_rows",
    "group_shared",
    "grow_rows",
    "is_archive",
    "load_archive",
    "load_stack_dir",
    "load_tree",
    "open_file",
    "open_files",
    "packed_arena",
    "read_safetensors",
    "receive_shared",
    "refresh_archive_checksums",
    "rename_new",
    "reopen_archive",
    "reserve_file",
    "rewrite_non_tensor",
    "rewrite_stack",
    "ring_acquire",
    "ring_state",
    "ring_transition",
    "same_entries",
    "shared_regions",
    "shared_value_header",
    "shared_value_lock",
    "shared_value_read",
    "shared_value_unlock",
    "shared_value_version",
    "shared_value_write",
    "shared_value_write_if",
    "str_list_json",
    "strings_json",
    "sync_file",
    "tree_report",
    "tree_summary",
    "value_meta_token",
    "verify_archive",
    "verify_tree",
    "wait_freed",
    "write_archive",
    "write_file",
    "write_safetensors",
    "write_stack_dir",
    "write_tree",
]

FORMAT_VERSION: int
# Constants shared with the Rust core, defined there once (rust/format, rust/packed.rs,
# rust/py/tree.rs, rust/sys/gather.rs).
RESERVED_KEYS: tuple[str, ...]  # the keys meta.json uses for itself
MAX_DEPTH: int  # the deepest nesting of a tree (directories, safetensors key paths)
TENSORCLASS_DIR: str  # the sub-directory of a tensorclass directory that holds its TensorDict
DTYPES: tuple[str, ...]  # the dtype names of the format, "torch.bool" ... "torch.complex128"
LEAF: int  # entry tags of the tree tuples: a tensor,
NODE: int  # a nested TensorDict,
NON_TENSOR: int  # a non-tensor (JSON) value,
STACK: int  # a NonTensorStack (its cells: a packed string column or JSON text)
ALIGN: int  # every leaf of a packed tree (and of an arena) starts at a multiple of this
DESCRIPTION_LIMIT: int  # the longest tree description a receiver accepts
JSON_DEPTH: int  # the JSON nesting a receiver parses, the root object being one level
NUMBER_KEY: str  # the key serde_json gives a number's text: no description may hold it
MAGIC: int  # the first int64 of a one-message tree's header
REFUSED: int  # the description length of a header whose sender refused its own tree
PIECE_BYTES: int  # the bytes of each piece a packed tree travels in
PARALLEL_BYTES: int  # from this many bytes in rows of at least BULK_ROW, copies run in parallel
BULK_ROW: int

class TensorDictError(Exception): ...
class InvalidDirectoryError(TensorDictError): ...
class UnsupportedFormatError(TensorDictError): ...
class InvalidTreeError(TensorDictError): ...

@final
class ProgressCounter:
    """A byte counter; as a context manager it counts the native calls this thread makes."""

    def __init__(self) -> None: ...
    @property
    def value(self) -> int: ...
    def add(self, n: int) -> None: ...
    def __enter__(self) -> ProgressCounter: ...
    def __exit__(self, *_args: object) -> bool: ...

class FileExistsRuntimeError(FileExistsError, RuntimeError): ...
class SymlinkError(InvalidDirectoryError, InvalidTreeError, RuntimeError): ...
class LockedError(TensorDictError, RuntimeError): ...

@final
class Buffer:
    """A mapped region exported through the buffer protocol as flat uint8 bytes."""

    @property
    def nbytes(self) -> int: ...
    @property
    def address(self) -> int: ...
    @property
    def file_id(self) -> tuple[int, int] | None: ...
    @property
    def filename(self) -> str | None: ...
    @property
    def share_handle(self) -> tuple[int, int, int] | None: ...
    @property
    def region_id(self) -> int: ...
    @property
    def writable(self) -> bool: ...
    @property
    def archive(self) -> tuple[str, tuple[int, int], int, bool] | None: ...
    def arena_span(self, address: int, nbytes: int) -> Buffer | None: ...
    def write_through(self, address: int, data_ptr: int, nbytes: int) -> None: ...
    def flush(self) -> None: ...
    def __len__(self) -> int: ...

def borrow_buffer(source: Any, writable: bool = True) -> Buffer: ...
def write_tree(
    prefix: str,
    tree: Any,
    *,
    existsok: bool = True,
    durable: bool = False,
    num_threads: int = 0,
    sparse: bool = False,
) -> list[Buffer | None]: ...
def anonymous_buffers(sources: list[tuple[int, int]], *, num_threads: int = 0) -> list[Buffer]: ...
def load_tree(prefix: str, *, tokens: bool = False) -> tuple[Any, list[Buffer | None]]: ...

# Packed string columns of NonTensorStack (rust/py/nontensor.rs): addresses of buffers the
# caller keeps alive for the call.
def decode_strings(
    values: int, nbytes: int, offsets: int, count: int, ids: int, n_ids: int
) -> list[str]: ...
def strings_json(values: int, nbytes: int, offsets: int, count: int, shape: list[int]) -> bytes: ...
def str_list_json(cells: list[Any], shape: list[int]) -> bytes | None: ...
def rewrite_stack(
    parent: str,
    key: str,
    stack_dim: int,
    device: str | None,
    data: bytes,
    shape: list[int] | None,
    *,
    durable: bool = False,
    expected: int | None = None,
) -> int: ...
def rewrite_non_tensor(
    parent: str, key: str, data: bytes, *, durable: bool = False, expected: int | None = None
) -> int: ...
def value_meta_token(parent: str, key: str) -> int: ...
def write_stack_dir(
    prefix: str,
    stack_dim: int,
    device: str | None,
    data: bytes,
    shape: list[int] | None,
    *,
    durable: bool = False,
) -> None: ...
def load_stack_dir(prefix: str) -> tuple[list[int], str | None, int, Any]: ...

# Non-tensor values shared between processes (rust/py/shared_value.rs)
def shared_value_header() -> int: ...
def shared_value_version(buffer: Buffer) -> int: ...
def shared_value_read(buffer: Buffer) -> tuple[int, bytes]: ...
def shared_value_write(buffer: Buffer, data: bytes) -> int: ...
def shared_value_write_if(buffer: Buffer, expected: int, data: bytes) -> int | None: ...
def shared_value_lock(buffer: Buffer) -> tuple[int, bytes]: ...
def shared_value_unlock(buffer: Buffer, before: int, data: bytes | None = None) -> int: ...
def verify_tree(prefix: str) -> list[str]: ...
def write_file(path: str, data_ptr: int, nbytes: int, *, existsok: bool = False) -> Buffer: ...
def open_file(path: str, nbytes: int, *, private: bool = False) -> Buffer: ...
def flush_buffers(buffers: list[Buffer]) -> None: ...
def wait_freed() -> int: ...
def encode_key(key: str) -> str: ...
def tree_summary(prefix: str) -> tuple[Any, ...]: ...
def tree_report(prefix: str, shown: str, *, json: bool = False) -> str: ...
def read_safetensors(
    path: str,
) -> tuple[list[tuple[str, str, list[int], Buffer | None]], dict[str, str]]: ...
def write_safetensors(
    path: str, tensors: list[tuple[str, str, list[int], int, int]], metadata: dict[str, str]
) -> None: ...
def gather_rows(
    index_address: int,
    index_len: int,
    leaves: list[tuple[int, int, int, int]],
    parallel: bool = True,
) -> None: ...
def gather_prepare() -> None: ...
def copy_packed(table: Any, buffer_address: int, buffer_len: int, pack: bool) -> None: ...

@final
class PackedTable:
    """The checked copy plan of one tree's packed layout."""

    def __new__(cls, table: Any, total: int) -> PackedTable: ...
    def pack(
        self, address: int, nbytes: int, start: int = 0, end: int | None = None, more: bool = False
    ) -> None: ...
    def unpack(self, address: int, nbytes: int, start: int = 0, end: int | None = None) -> None: ...
    @property
    def total(self) -> int: ...

def same_entries(nodes: list[tuple[dict[str, Any], tuple[Any, ...], tuple[Any, ...]]]) -> bool: ...
def describe_tree(node: tuple[Any, ...]) -> bytes: ...
def build_packed_tree(
    text: bytes,
    capacity: int | None,
    arena: bool,
    dtypes: dict[str, Any],
    make_node: Any,
    make_leaf: Any,
    make_empty: Any,
    make_value: Any,
    on_buffer: Any = None,
    into: Buffer | None = None,
    untrack_leaves: bool = False,
) -> tuple[Any, int, Buffer | None, list[Any]]: ...
def packed_arena(nbytes: int, populate: bool = True) -> Buffer: ...
def ring_acquire(header: Buffer, count: int) -> tuple[int, int] | None: ...
def ring_transition(
    header: Buffer, slot: int, generation: int, from_state: int, to_state: int
) -> bool: ...
def ring_state(header: Buffer, slot: int) -> tuple[int, int]: ...
def receive_shared(fd: int, nbytes: int, slices: list[tuple[int, int]]) -> list[Buffer]: ...
def shared_regions() -> int: ...
def group_shared(
    buffers: list[Buffer],
) -> tuple[list[tuple[int, int, list[tuple[int, int]], list[int]]], list[int]]: ...
def open_files(files: list[tuple[str, int]]) -> list[Buffer]: ...
def write_archive(
    path: str,
    tree: Any,
    *,
    existsok: bool = True,
    durable: bool = False,
    num_threads: int = 0,
    shared: bool = False,
    compression: int = 0,
    level: int = 6,
    dos_time: tuple[int, int] | None = None,
) -> list[Buffer | None]: ...
def load_archive(
    path: str, *, shared: bool = False
) -> tuple[Any, list[Buffer | None], list[str]]: ...
def is_archive(path: str) -> bool: ...
def refresh_archive_checksums(path: str, *, num_threads: int = 0) -> list[str]: ...
def verify_archive(path: str) -> list[str]: ...
def reopen_archive(
    path: str, identity: tuple[int, int], offset: int, nbytes: int, shared: bool
) -> Buffer: ...
def reserve_file(path: str, nbytes: int) -> int: ...
def grow_rows(
    prefix: str,
    expect: int,
    rows: int,
    leaves: list[tuple[str, str, list[int]]],
    writes: list[tuple[str, int, int, int, tuple[int, int] | None]],
    *,
    durable: bool = False,
) -> int | None: ...
def sync_file(
    src: str, dst: str, ranges: list[tuple[int, int]] | None, nbytes: int, *, durable: bool = False
) -> int: ...
def chunk_hashes(path: str, nbytes: int, chunk: int) -> bytes: ...
def exchange_dirs(parent: str, a: str, b: str, *, durable: bool = False) -> None: ...
def rename_new(parent: str, a: str, b: str, *, durable: bool = False) -> None: ...
