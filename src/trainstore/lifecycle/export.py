"""Export a checkpoint (or a registered model version) to a deployable safetensors file.

The file holds the checkpoint's tensors under their manifest names (``model/layer.weight``),
optionally only those under a prefix (``only="model/"``, stripped from the names), and
optionally with floating tensors cast to bf16/fp16. Next to it, ``<file>.sha256`` in
``sha256sum`` format lets any deployment check the artifact with standard tools. The
header metadata records where it came from (job, step, checkpoint id, model version).

Reading goes through the verified restore path (every chunk re-hashed). Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..checkpoint import manifest as mf
from ..checkpoint.reader import load_state
from ..checkpoint.state import flatten
from ..chunks import ChunkStore, content_hash
from ..errors import ConfigError, NotFoundError, StoreError
from ..store.base import Store

CASTS = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", None: None}


@dataclass(frozen=True)
class ExportResult:
    path: str
    checksum_path: str
    sha256: str
    tensors: int
    bytes: int
    dtype: str | None
    job: str
    step: int

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_tensors(store: Store, job: str, step: int, workers: int) -> tuple[mf.Manifest, dict[str, Any]]:
    key = mf.manifest_key(job, step)
    if not store.exists(key):
        steps = mf.list_steps(store, job)
        raise NotFoundError(f"no checkpoint step {step} of job {job!r} in {store.url} "
                            f"(steps: {steps[-10:] if steps else 'none'})")
    m = mf.load_manifest(store, job, step)
    if m.metadata.get("dcp"):
        raise ConfigError(f"step {step} of job {job!r} was saved with torch.distributed.checkpoint; "
                          "restore it with CheckpointManager and export the state instead")
    return m, state_tensors(load_state(ChunkStore(store), m, workers))


def export_safetensors(store: Store, job: str, step: int, path: str | os.PathLike[str], *,
                       dtype: str | None = None, only: str | None = None, model_version: str | None = None,
                       workers: int = 4) -> ExportResult:
    """Write the tensors of ``job``@``step`` to ``path`` (safetensors) plus ``path.sha256``."""
    if dtype not in CASTS:
        raise ConfigError(f"dtype must be one of bf16, fp16 (or None), got {dtype!r}")
    m, leaves = _load_tensors(store, job, step, workers)
    meta = {"trainstore.checkpoint_id": content_hash(memoryview(store.get(m.key))),
            "trainstore.metrics": json.dumps(m.metrics)[:4096]}
    if model_version:
        meta["trainstore.model_version"] = model_version
    return write_safetensors(leaves, path, job=job, step=step, dtype=dtype, only=only, metadata=meta)


def write_safetensors(leaves: dict[str, Any], path: str | os.PathLike[str], *, job: str, step: int,
                      dtype: str | None = None, only: str | None = None,
                      metadata: dict[str, str] | None = None) -> ExportResult:
    """Write named tensors/arrays (``{name: tensor}``, e.g. a restored state's leaves) as a
    safetensors file with a ``.sha256`` next to it; atomically (temp file + rename)."""
    import torch
    from safetensors.torch import save_file

    if dtype not in CASTS:
        raise ConfigError(f"dtype must be one of bf16, fp16 (or None), got {dtype!r}")
    target = getattr(torch, CASTS[dtype]) if CASTS[dtype] else None
    tensors: dict[str, torch.Tensor] = {}
    for name, obj in leaves.items():
        if only is not None:
            if not name.startswith(only):
                continue
            name = name[len(only):] or name
        t = obj if isinstance(obj, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(obj))
        if target is not None and t.is_floating_point():
            t = t.to(target)
        tensors[name] = t.contiguous()
    if not tensors:
        raise ConfigError(f"nothing to export: step {step} of job {job!r} has no tensors"
                          + (f" under {only!r}" if only else ""))
    path = os.fspath(path)
    meta = {"trainstore.job": job, "trainstore.step": str(step), "trainstore.cast": CASTS[dtype] or "none",
            **(metadata or {})}
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, path)
        digest = _sha256(path)
        with open(f"{path}.sha256.tmp", "w") as f:
            f.write(f"{digest}  {os.path.basename(path)}\n")
        os.replace(f"{path}.sha256.tmp", f"{path}.sha256")
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return ExportResult(path, f"{path}.sha256", digest, len(tensors), os.path.getsize(path), CASTS[dtype],
                        job, step)


def state_tensors(state: Any) -> dict[str, Any]:
    """``{manifest name: tensor}`` of a restored state (the names a checkpoint uses)."""
    _skel, leaves = flatten(state)
    return {leaf.name: leaf.obj for leaf in leaves}


def export_version(registry: Any, ref: str, path: str | os.PathLike[str], **kw: Any) -> ExportResult:
    """Export a registered model version (``"llm@stable"``, ``"llm@3"``)."""
    mv = registry.get(ref)
    raw = registry.store.get(mf.manifest_key(mv.job, mv.step))
    if content_hash(memoryview(raw)) != mv.checkpoint_id:
        raise ConfigError(f"{mv.ref}: checkpoint {mv.job}@{mv.step} changed since it was registered "
                          "(checkpoint id mismatch)")
    return export_safetensors(registry.store, mv.job, mv.step, path, model_version=mv.ref, **kw)


__all__ = ["export_safetensors", "export_version", "write_safetensors", "state_tensors", "ExportResult", "CASTS"]
