"""torch.distributed for TensorDict (public path): the ``Distributed`` methods that
``TensorDict`` has (``send``, ``recv``, ``init_remote``, ``broadcast``, ``all_reduce``, ...).

They live in ``share/distributed.py`` (point to point, first contact, broadcast) and
``share/collectives.py`` (the other collectives), over the wire of ``share/wire.py``.
"""

from __future__ import annotations

from .share.distributed import Distributed

__all__ = ["Distributed"]
