"""The data pipeline: ingestion, cleaning, feature engineering, versions and serving."""

from __future__ import annotations

import importlib
from typing import Any

from .versions import DatasetVersion, ShardInfo, list_versions, load_version

_LAZY = {
    "Ingestor": "trainstore.data.ingest",
    "clean": "trainstore.data.cleaning",
    "transform": "trainstore.data.transforms",
    "Loader": "trainstore.data.loader",
    "Dataset": "trainstore.data.dataset",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainstore.data' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["DatasetVersion", "ShardInfo", "list_versions", "load_version", *_LAZY]
