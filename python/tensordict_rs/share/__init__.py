"""Trees between processes and ranks: multiprocessing (one descriptor per arena), packed
one-message trees, ``consolidate``, and the ``torch.distributed`` methods (the wire, point to
point, first contact, collectives).

Owns: everything that hands a tree to another process. Uses: ``_core``, ``memmap``, ``ops``,
``io`` and ``_native``.
"""
