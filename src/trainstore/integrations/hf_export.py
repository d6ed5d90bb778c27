"""Hugging Face formats both ways: a registered model out as a ``from_pretrained`` folder, a
safetensors/HF folder in as a trainstore checkpoint to fine-tune from.

    from trainstore.integrations.hf_export import export_pretrained, import_pretrained
    export_pretrained(Registry(store), "llm@stable", "out/llm", max_shard_size="2GB")
    AutoModelForCausalLM.from_pretrained("out/llm")             # identical parameters

    import_pretrained("models/base", CheckpointManager(store, job="ft-1"), step=0)
    TrainstoreTrainer(model=..., checkpoints=CheckpointManager(store, job="ft-1")).train(
        resume_from_checkpoint=True)                              # starts from the imported weights

Export writes ``model-0000i-of-0000n.safetensors`` shards, ``model.safetensors.index.json``,
``config.json`` and ``SHA256SUMS`` (``lifecycle.export.write_safetensors_folder``: atomic,
read through the verified restore path). The config is the one given, else the one the
checkpoint recorded (``config["hf_config"]``: ``import_pretrained`` and ``TrainstoreTrainer``
record it). Tensors under ``prefix`` (``model/``) are exported without it.

Import reads ``model.safetensors`` or the shards an index names (never ``*.bin``: pickle),
checks ``SHA256SUMS`` when present, and commits one full checkpoint ``{"model": tensors}`` with
the config recorded. A fine-tune in the same job then saves incrementals against it, so each
costs only the weights that changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import torch
from safetensors.torch import load_file

from ..checkpoint import CheckpointInfo, CheckpointManager
from ..errors import ChunkCorruptError, ConfigError, NotFoundError, UnsupportedTypeError
from ..lifecycle import export as ex
from ..lifecycle.registry import Registry

PRETRAINED_FORMAT = "trainstore.hf-pretrained/1"
CONFIG_NAME = "config.json"
SINGLE_NAME = "model.safetensors"


def _config_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, dict):
        return config
    if callable(getattr(config, "to_json_string", None)):  # a transformers PretrainedConfig
        return json.loads(config.to_json_string(use_diff=False))
    raise ConfigError(f"config must be a dict or a transformers config, got {type(config).__name__}")


def export_pretrained(registry: Registry, ref: str, folder: str | os.PathLike[str], *,
                      max_shard_size: int | str = "5GB", dtype: str | None = None, config: Any = None,
                      prefix: str = "model/", workers: int = 4) -> ex.FolderExportResult:
    """Export registered model ``ref`` (``"llm@stable"``) as a folder ``from_pretrained`` loads."""
    mv = ex.registered_checkpoint(registry, ref)
    hf_config = _config_dict(config) if config is not None else mv.config.get("hf_config")
    if hf_config is None:
        raise ConfigError(f"{mv.ref}: the checkpoint records no Hugging Face config (config['hf_config']); "
                          "pass config= (a dict or the model's config)")
    files = {CONFIG_NAME: (json.dumps(hf_config, indent=2, sort_keys=True) + "\n").encode()}
    return ex.export_folder(registry.store, mv.job, mv.step, folder, model_version=mv.ref, workers=workers,
                            max_shard_size=max_shard_size, dtype=dtype, only=prefix, files=files)


def _check_sums(folder: str, names: list[str]) -> None:
    sums = os.path.join(folder, ex.SUMS_NAME)
    if not os.path.isfile(sums):
        return
    with open(sums) as f:
        expected = dict(reversed(line.rstrip("\n").split("  ", 1)) for line in f if line.strip())
    for name in names:
        if name not in expected:
            continue
        h = hashlib.sha256()
        with open(os.path.join(folder, name), "rb") as f:
            for block in iter(lambda: f.read(8 << 20), b""):
                h.update(block)
        if h.hexdigest() != expected[name]:
            raise ChunkCorruptError(f"{os.path.join(folder, name)}: sha256 {h.hexdigest()} does not match "
                                    f"{ex.SUMS_NAME} ({expected[name]})")


def read_pretrained(folder: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """The tensors of a safetensors/HF folder (single file or index + shards) and its config."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise NotFoundError(f"no model folder {folder}")
    index_path = os.path.join(folder, ex.INDEX_NAME)
    if os.path.isfile(index_path):
        with open(index_path) as f:
            try:
                weight_map = json.load(f)["weight_map"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{index_path}: not a safetensors index ({exc})") from None
        shards = sorted(set(weight_map.values()))
    elif os.path.isfile(os.path.join(folder, SINGLE_NAME)):
        weight_map, shards = None, [SINGLE_NAME]
    else:
        pickled = [n for n in os.listdir(folder) if n.endswith((".bin", ".pt", ".pth"))]
        if pickled:
            raise UnsupportedTypeError(f"{folder} holds only pickled weights ({', '.join(sorted(pickled)[:3])}); "
                                       "trainstore imports safetensors only (convert with save_pretrained)")
        raise NotFoundError(f"{folder}: no {SINGLE_NAME} and no {ex.INDEX_NAME}")
    for name in shards:
        if os.path.basename(name) != name or not os.path.isfile(os.path.join(folder, name)):
            raise NotFoundError(f"{folder}: shard {name!r} named by the index is missing")
    _check_sums(folder, shards)
    tensors: dict[str, torch.Tensor] = {}
    for name in shards:
        for k, t in load_file(os.path.join(folder, name)).items():
            if weight_map is not None and weight_map.get(k) != name:
                raise ConfigError(f"{folder}/{name}: tensor {k!r} is not mapped to this shard by the index")
            tensors[k] = t
    if weight_map is not None and set(weight_map) != set(tensors):
        missing = sorted(set(weight_map) - set(tensors))[:5]
        raise ConfigError(f"{folder}: tensors named by the index but in no shard: {missing}")
    config = None
    if os.path.isfile(os.path.join(folder, CONFIG_NAME)):
        with open(os.path.join(folder, CONFIG_NAME)) as f:
            config = json.load(f)
    return tensors, config


def import_pretrained(folder: str | os.PathLike[str], checkpoints: CheckpointManager, step: int = 0, *,
                      metrics: dict | None = None) -> CheckpointInfo:
    """Commit the weights of ``folder`` as full checkpoint ``step`` of ``checkpoints.job``
    (waits until it is committed); its config is recorded as ``config["hf_config"]``."""
    tensors, hf_config = read_pretrained(folder)
    config: dict[str, Any] = {"source": os.path.abspath(os.fspath(folder))}
    if hf_config is not None:
        config["hf_config"] = hf_config
    handle = checkpoints.save(step, {"format": PRETRAINED_FORMAT, "model": tensors}, metrics=metrics,
                              config=config, kind="full", blocking=True)
    info = handle.wait()
    assert info is not None
    return info


def load_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Load ``tensors`` into ``model``: every key must match; a parameter may be missing only
    when it shares storage with a loaded one (tied weights, which HF files store once)."""
    result = model.load_state_dict(tensors, strict=False)
    if result.unexpected_keys:
        raise ConfigError(f"weights do not fit {type(model).__name__}: unexpected {result.unexpected_keys[:5]}")
    state = model.state_dict()
    loaded = {state[k].data_ptr() for k in tensors if k in state}
    untied = [k for k in result.missing_keys if state[k].data_ptr() not in loaded]
    if untied:
        raise ConfigError(f"weights do not fit {type(model).__name__}: missing {untied[:5]}")


__all__ = ["export_pretrained", "import_pretrained", "read_pretrained", "load_weights", "PRETRAINED_FORMAT"]
