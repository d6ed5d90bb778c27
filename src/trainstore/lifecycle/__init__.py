"""Checkpoint lifecycle: retention, garbage collection, tiering, model registry, export, metrics.

Modules (each one job): ``retention`` (which checkpoints to keep, and why), ``gc`` (delete
chunks no manifest references, safe against concurrent saves), ``tiering`` (hot local dir ->
durable object store -> archive), ``registry`` (named model versions and aliases, in the
store itself), ``export`` (safetensors artifacts), ``metrics`` (Prometheus + persisted stats).
See docs/lifecycle.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "RetentionPolicy": "trainstore.lifecycle.retention",
    "KeepBest": "trainstore.lifecycle.retention",
    "Rule": "trainstore.lifecycle.retention_rules",
    "LatestN": "trainstore.lifecycle.retention_rules",
    "Within": "trainstore.lifecycle.retention_rules",
    "FullWithin": "trainstore.lifecycle.retention_rules",
    "EveryNSteps": "trainstore.lifecycle.retention_rules",
    "BestN": "trainstore.lifecycle.retention_rules",
    "Registered": "trainstore.lifecycle.retention_rules",
    "AnyOf": "trainstore.lifecycle.retention_rules",
    "AllOf": "trainstore.lifecycle.retention_rules",
    "RetentionPlan": "trainstore.lifecycle.retention",
    "plan_retention": "trainstore.lifecycle.retention",
    "apply_retention": "trainstore.lifecycle.retention",
    "collect_garbage": "trainstore.lifecycle.gc",
    "GcOptions": "trainstore.lifecycle.gc",
    "GcReport": "trainstore.lifecycle.gc",
    "Tiering": "trainstore.lifecycle.tiering",
    "TierPolicy": "trainstore.lifecycle.tiering",
    "TieredStore": "trainstore.lifecycle.tiering",
    "Registry": "trainstore.lifecycle.registry",
    "ModelVersion": "trainstore.lifecycle.registry",
    "export_safetensors": "trainstore.lifecycle.export",
    "CheckpointMetrics": "trainstore.lifecycle.metrics",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainstore.lifecycle' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = list(_LAZY)
