"""Checkpoints: async, incremental, verified saves with automatic recovery.

``manager`` (the public ``CheckpointManager``) and its save backends (``backend``, ``single``;
the DCP one is ``trainstore.dcp``), ``recovery`` (which checkpoint a restore loads), ``types``,
``listing``, ``objectives``, ``rng``; below them ``format`` (what a checkpoint is in a store),
``save`` (the write path) and ``restore`` (the read path).
"""

from __future__ import annotations

import lazy_loader

# Every other public name is listed in __init__.pyi and imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
