"""Checkpoints: async, incremental, verified saves with automatic recovery.

Modules: ``manifest`` (format, layout, listing), ``state`` (flatten state to tensors + JSON),
``rng`` (RNG capture/restore), ``staging`` (reusable host buffers), ``writer`` (background
chunk writes), ``delta`` (incremental XOR deltas), ``reader`` (restore), ``verify``,
``manager`` (the public ``CheckpointManager``).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "CheckpointManager": "trainstore.checkpoint.manager",
    "CheckpointPolicy": "trainstore.checkpoint.manager",
    "CheckpointInfo": "trainstore.checkpoint.manager",
    "SaveHandle": "trainstore.checkpoint.manager",
    "RestoreResult": "trainstore.checkpoint.manager",
    "Manifest": "trainstore.checkpoint.manifest",
    "capture_rng": "trainstore.checkpoint.rng",
    "restore_rng": "trainstore.checkpoint.rng",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainstore.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = list(_LAZY)
