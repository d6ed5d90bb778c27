"""Export a checkpoint (or a registered model version) to a deployable safetensors file, or to
a sharded safetensors folder in the Hugging Face layout (``write_safetensors_folder``:
``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json`` + ``SHA256SUMS``).

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
import re
import shutil
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..checkpoint.format import manifest as mf
from ..checkpoint.format.state import flatten
from ..checkpoint.restore.reader import load_state
from ..chunks import ChunkStore
from ..errors import AlreadyExistsError, ConfigError, NotFoundError, StoreError
from ..fileio import create_temp_dir, replacing, write_atomic
from ..store.base import Store

#: top-level state keys that hold training state, not model weights (optimizer, RNG, schedulers,
#: data position, per-rank entries): left out of an export with ``weights_only``
TRAINING_STATE = frozenset({"optim", "optimizer", "optimizers", "optimizer_states", "rng", "rngs", "lr_scheduler",
                            "lr_schedulers", "scheduler", "schedulers", "scaler", "loader", "loaders", "data",
                            "dataloader", "ranks", "callbacks", "loops"})

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
                       workers: int = 4, weights_only: bool = False) -> ExportResult:
    """Write the tensors of ``job``@``step`` to ``path`` (safetensors) plus ``path.sha256``;
    ``weights_only``: without the training state (``TRAINING_STATE``: optimizer, RNG, ...)."""
    if dtype not in CASTS:
        raise ConfigError(f"dtype must be one of bf16, fp16 (or None), got {dtype!r}")
    m, leaves = _load_tensors(store, job, step, workers)
    meta = {"trainstore.checkpoint_id": mf.checkpoint_id(store, m.job, m.step),
            "trainstore.metrics": json.dumps(m.metrics)[:4096]}
    if model_version:
        meta["trainstore.model_version"] = model_version
    if weights_only:
        leaves = {k: v for k, v in leaves.items() if k.split("/", 1)[0] not in TRAINING_STATE}
    return write_safetensors(leaves, path, job=job, step=step, dtype=dtype, only=only, metadata=meta)


def write_safetensors(leaves: dict[str, Any], path: str | os.PathLike[str], *, job: str, step: int,
                      dtype: str | None = None, only: str | None = None,
                      metadata: dict[str, str] | None = None) -> ExportResult:
    """Write named tensors/arrays (``{name: tensor}``, e.g. a restored state's leaves) as a
    safetensors file with a ``.sha256`` next to it; atomically (temp file + rename)."""
    from safetensors.torch import save_file

    tensors = _prepare(leaves, job=job, step=step, dtype=dtype, only=only)
    path = os.fspath(path)
    meta = {"trainstore.job": job, "trainstore.step": str(step), "trainstore.cast": CASTS[dtype] or "none",
            **(metadata or {})}
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with replacing(path) as tmp:  # exclusive temp file beside the target, then rename
            save_file(tensors, tmp, metadata=meta)
        digest = _sha256(path)
        write_atomic(f"{path}.sha256", f"{digest}  {os.path.basename(path)}\n")
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc}") from exc
    return ExportResult(path, f"{path}.sha256", digest, len(tensors), os.path.getsize(path), CASTS[dtype],
                        job, step)


def _prepare(leaves: dict[str, Any], *, job: str, step: int, dtype: str | None, only: str | None) -> dict:
    """``{export name: contiguous torch tensor}``: filtered by ``only`` (stripped), cast by ``dtype``."""
    import torch

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
    return tensors


# -- sharded folder (Hugging Face layout) ---------------------------------------------------
INDEX_NAME = "model.safetensors.index.json"
SUMS_NAME = "SHA256SUMS"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


def parse_size(value: int | str) -> int:
    """Bytes of ``5_000_000``, ``"5GB"`` (decimal, as Hugging Face) or ``"500MiB"``."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", value.upper())
        if m is None or m.group(2) not in _UNITS:
            raise ConfigError(f"max_shard_size must be bytes or like '5GB'/'500MiB', got {value!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2)])
    else:
        raise ConfigError(f"max_shard_size must be bytes or like '5GB'/'500MiB', got {value!r}")
    if n < 1:
        raise ConfigError(f"max_shard_size must be positive, got {value!r}")
    return n


@dataclass(frozen=True)
class FolderExportResult:
    """A sharded export: ``shards`` (file names, in order), the index, ``SHA256SUMS``."""

    path: str
    index_path: str
    checksum_path: str
    shards: tuple[str, ...]
    sha256: dict[str, str]  # file name -> digest (shards, index and extra files)
    tensors: int
    bytes: int  # tensor bytes (the index's total_size)
    dtype: str | None
    job: str
    step: int

    def to_json(self) -> dict:
        return {**self.__dict__, "shards": list(self.shards)}


def plan_shards(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Names grouped into shards in order, each at most ``max_bytes`` (a bigger tensor alone)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if shards[-1] and used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def write_safetensors_folder(leaves: dict[str, Any], folder: str | os.PathLike[str], *, job: str, step: int,
                             max_shard_size: int | str = "5GB", dtype: str | None = None, only: str | None = None,
                             metadata: dict[str, str] | None = None,
                             files: dict[str, bytes] | None = None) -> FolderExportResult:
    """Write named tensors as ``model-0000i-of-0000n.safetensors`` shards of at most
    ``max_shard_size`` bytes, ``model.safetensors.index.json`` (``weight_map``, ``total_size``),
    the extra ``files`` (e.g. ``config.json``) and ``SHA256SUMS``. The folder appears
    complete or not at all (built under a temporary name, then renamed); an existing
    non-empty folder is never overwritten."""
    from safetensors.torch import save_file

    limit = parse_size(max_shard_size)
    tensors = _prepare(leaves, job=job, step=step, dtype=dtype, only=only)
    folder = os.path.abspath(os.fspath(folder))
    if os.path.exists(folder) and (not os.path.isdir(folder) or os.listdir(folder)):
        raise AlreadyExistsError(f"export target {folder} exists and is not an empty folder")
    for name in files or {}:
        if os.path.basename(name) != name or name in (INDEX_NAME, SUMS_NAME) or name.endswith(".safetensors"):
            raise ConfigError(f"extra export file name {name!r} is not a plain file name or clashes with the export")
    groups = plan_shards({k: t.numel() * t.element_size() for k, t in tensors.items()}, limit)
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    meta = {"format": "pt", "trainstore.job": job, "trainstore.step": str(step),
            "trainstore.cast": CASTS[dtype] or "none", **(metadata or {})}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total, **{k: v for k, v in meta.items() if k != "format"}},
             "weight_map": {k: names[i] for i, group in enumerate(groups) for k in group}}
    digests: dict[str, str] = {}
    tmp = ""
    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        tmp = create_temp_dir(os.path.dirname(folder), os.path.basename(folder))
        for fname, group in zip(names, groups):
            save_file({k: tensors[k] for k in group}, os.path.join(tmp, fname), metadata=meta)
        extra = {INDEX_NAME: (json.dumps(index, indent=2, sort_keys=True) + "\n").encode(), **(files or {})}
        for fname, data in extra.items():
            with open(os.path.join(tmp, fname), "wb") as f:
                f.write(data)
        for fname in [*names, *extra]:
            digests[fname] = _sha256(os.path.join(tmp, fname))
        with open(os.path.join(tmp, SUMS_NAME), "w") as f:
            f.writelines(f"{d}  {n}\n" for n, d in digests.items())
        for fname in os.listdir(tmp):
            with open(os.path.join(tmp, fname), "rb") as f:
                os.fsync(f.fileno())
        if os.path.isdir(folder):
            os.rmdir(folder)  # empty (checked above); rename needs it gone
        os.rename(tmp, folder)
    except OSError as exc:
        raise StoreError(f"cannot write export folder {folder}: {exc}") from exc
    finally:
        if tmp and os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return FolderExportResult(folder, os.path.join(folder, INDEX_NAME), os.path.join(folder, SUMS_NAME),
                              tuple(names), digests, len(tensors), total, CASTS[dtype], job, step)


def export_folder(store: Store, job: str, step: int, folder: str | os.PathLike[str], *,
                  model_version: str | None = None, workers: int = 4, **kw: Any) -> FolderExportResult:
    """``write_safetensors_folder`` of the tensors of ``job``@``step`` (read verified)."""
    m, leaves = _load_tensors(store, job, step, workers)
    meta = {"trainstore.checkpoint_id": mf.checkpoint_id(store, m.job, m.step)}
    if model_version:
        meta["trainstore.model_version"] = model_version
    return write_safetensors_folder(leaves, folder, job=job, step=step, metadata=meta, **kw)


def registered_checkpoint(registry: Any, ref: str) -> Any:
    """The ``ModelVersion`` of ``ref``, checked to still name the checkpoint it registered."""
    mv = registry.get(ref)
    if mf.checkpoint_id(registry.store, mv.job, mv.step) != mv.checkpoint_id:
        raise ConfigError(f"{mv.ref}: checkpoint {mv.job}@{mv.step} changed since it was registered "
                          "(checkpoint id mismatch)")
    return mv


def export_version_folder(registry: Any, ref: str, folder: str | os.PathLike[str], **kw: Any) -> FolderExportResult:
    """Export a registered model version as a sharded safetensors folder."""
    mv = registered_checkpoint(registry, ref)
    return export_folder(registry.store, mv.job, mv.step, folder, model_version=mv.ref, **kw)


def state_tensors(state: Any) -> dict[str, Any]:
    """``{manifest name: tensor}`` of a restored state (the names a checkpoint uses)."""
    _skel, leaves = flatten(state)
    return {leaf.name: leaf.obj for leaf in leaves}


def export_version(registry: Any, ref: str, path: str | os.PathLike[str], **kw: Any) -> ExportResult:
    """Export a registered model version (``"llm@stable"``, ``"llm@3"``)."""
    mv = registered_checkpoint(registry, ref)
    return export_safetensors(registry.store, mv.job, mv.step, path, model_version=mv.ref, **kw)


__all__ = ["TRAINING_STATE", "export_safetensors", "export_version", "write_safetensors", "state_tensors", "ExportResult", "CASTS",
           "write_safetensors_folder", "export_folder", "export_version_folder", "FolderExportResult",
           "registered_checkpoint", "parse_size", "plan_shards", "INDEX_NAME", "SUMS_NAME"]
