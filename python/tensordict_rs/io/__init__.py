"""Trees on disk: directories, ``.tdz`` archives, safetensors files, progress bars, and the
memory-map methods of ``TensorDict`` (``memmap_``, ``load_memmap``, ...).

Owns: everything that reads or writes files. Uses: ``_core``, ``memmap``, ``ops`` and the Rust
core (``_native``), which does the file-system work in one call per tree.
"""
