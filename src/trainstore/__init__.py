"""trainstore: the storage layer of an AI training pipeline.

Imports are lazy: ``import trainstore`` stays cheap (no torch, no pyarrow) until a part is
used.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import errors
from .errors import TrainstoreError
from .store import open_store

__version__ = "0.1.0"

_LAZY = {
    "ChunkStore": "trainstore.chunks",
    "ChunkRef": "trainstore.chunks",
    "HotCache": "trainstore.cache",
    "CheckpointManager": "trainstore.checkpoint",
    "CheckpointPolicy": "trainstore.checkpoint",
    "CheckpointInfo": "trainstore.checkpoint",
    "Registry": "trainstore.lifecycle.registry",
    "RetentionPolicy": "trainstore.lifecycle.retention",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainstore' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["TrainstoreError", "errors", "open_store", "__version__", *_LAZY]
