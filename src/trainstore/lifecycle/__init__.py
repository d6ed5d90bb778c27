"""Checkpoint lifecycle: retention, garbage collection, tiering, model registry, export, metrics.

Modules (each one job): ``retention`` (which checkpoints to keep, and why), ``gc`` (delete
chunks no manifest references, safe against concurrent saves), ``tiering`` (hot local dir ->
durable object store -> archive), ``registry`` (named model versions and aliases, in the
store itself), ``export`` (safetensors artifacts), ``metrics`` (Prometheus + persisted stats).
See docs/lifecycle.md.
"""

from __future__ import annotations

import lazy_loader

# Every other public name is listed in __init__.pyi and imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
