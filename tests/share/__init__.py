"""Tests of ``share/``: processes (multiprocessing, DataLoader), pickling, consolidate,
packed trees and torch.distributed (the spawned jobs are in ``_dist_*jobs.py``)."""
