"""The core of a tree, below everything else: node types, dtypes, the one walker, locking,
batch indexing and the repr.

Owns: what a tree is and how it is walked. Uses: torch and ``_native`` only (no I/O, no memory
maps, and never ``tensordict.py``: ``TreeNode`` is the base that ``TensorDict`` fills in).
"""
