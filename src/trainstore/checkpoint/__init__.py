"""Checkpoints: async, incremental, verified saves with automatic recovery.

Modules: ``manifest`` (format, layout, listing), ``state`` (flatten state to tensors + JSON),
``rng`` (RNG capture/restore), ``staging`` (reusable host buffers), ``writer`` (background
chunk writes), ``delta`` (incremental XOR deltas), ``reader`` (restore), ``verify``,
``manager`` (the public ``CheckpointManager``).
"""

from __future__ import annotations

import lazy_loader

# Every other public name is listed in __init__.pyi and imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
