"""Tests of the tree itself: ``_core`` (node types, walker, locking, batch indexing, repr),
``memmap.py`` (MemoryMappedTensor) and ``tensordict.py`` (construction, entries, get/set),
plus the exception hierarchy and the typed usage program."""
