"""The sharded ("dcp") state layout of the Hugging Face integrations, and which layout a step has.

In a multi-process run (DDP or FSDP2) ``TrainstoreTrainer`` and ``AcceleratorCheckpoints`` save
model and optimizer through ``torch.distributed.checkpoint.state_dict.get_state_dict`` (fully
qualified names, ``full_state_dict=False``): under DDP plain tensors, equal on every rank, that
DCP writes once across the ranks; under FSDP2 DTensor shards that each rank writes for its
own part. ``CheckpointManager`` saves such a state through its ``dcp`` backend (one manifest,
committed after every rank wrote) and ``restore_into`` reshards it to the current world
(2 -> 1, 2 -> 3). Per-rank values (RNG) go under ``ranks.rank<r>`` (``integrations.ranks``).

Every save records its layout in the checkpoint's config (``trainstore_format``), so a resume
can refuse a checkpoint of another framework or layout before touching the model, with a
message that says which (``check_layout``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..checkpoint import CheckpointManager
from ..checkpoint.format import manifest as mf
from ..errors import ConfigError, TrainstoreError

FORMAT_KEY = "trainstore_format"  # in the checkpoint's config
_OPTS = StateDictOptions(full_state_dict=False)

#: who writes which layout, for the messages of ``check_layout``
WRITERS = {
    "trainstore.hf-trainer/1": "TrainstoreTrainer, single process (whole tensors)",
    "trainstore.hf-trainer/dcp-1": "TrainstoreTrainer, multi-process (DCP sharded state)",
    "trainstore.hf-accelerate/1": "AcceleratorCheckpoints, single process (whole tensors)",
    "trainstore.hf-accelerate/dcp-1": "AcceleratorCheckpoints, multi-process (DCP sharded state)",
    "trainstore.hf-pretrained/1": "hf_export.import_pretrained (weights only)",
}


def torch_optimizer(opt: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` (or ``opt`` itself)."""
    inner = getattr(opt, "optimizer", opt)
    if not isinstance(inner, torch.optim.Optimizer):
        raise ConfigError(f"a distributed checkpoint needs torch optimizers, got {type(inner).__name__}")
    return inner


def model_state(model: torch.nn.Module) -> dict[str, Any]:
    """Sharded model state (FQN keys; DTensor shards under FSDP2, plain tensors under DDP)."""
    return get_model_state_dict(model, options=_OPTS)


def optimizer_state(model: torch.nn.Module, opt: Any) -> dict[str, Any]:
    """Sharded optimizer state keyed by parameter FQN (initialised if the optimizer has not stepped,
    so a fresh run's target has every entry a checkpoint holds)."""
    return get_optimizer_state_dict(model, torch_optimizer(opt), options=_OPTS)


def load_model(model: torch.nn.Module, state: dict[str, Any]) -> None:
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=False, strict=True))


def load_optimizer(model: torch.nn.Module, opt: Any, state: dict[str, Any]) -> None:
    set_optimizer_state_dict(model, torch_optimizer(opt), state, options=_OPTS)


def check_engine(deepspeed: bool, fsdp_plugin: Any) -> None:
    """``ConfigError`` for the engines the sharded layout does not cover: DeepSpeed, FSDP1."""
    if deepspeed:
        raise ConfigError("DeepSpeed is not supported by trainstore's Hugging Face integration (its engine keeps "
                          "model and optimizer in DeepSpeed's own checkpoint files): use FSDP2 (accelerate's FSDP "
                          "plugin with fsdp_version=2) or DDP, or DeepSpeed's own save_checkpoint")
    if fsdp_plugin is not None and getattr(fsdp_plugin, "fsdp_version", 1) != 2:
        raise ConfigError("FSDP1 is not supported by trainstore's Hugging Face integration: set fsdp_version=2 "
                          "(TrainingArguments(fsdp_config={'version': 2}) or FullyShardedDataParallelPlugin("
                          "fsdp_version=2)), whose sharded state DCP saves and reshards")


def step_layout(mgr: CheckpointManager, step: int | None) -> tuple[int, str | None, bool] | None:
    """``(step, trainstore_format or None, is a DCP save)`` of ``step`` or, for None, of the newest
    step whose manifest reads (the one a restore tries first); None when the job has none."""
    steps = [mf.check_step(step)] if step is not None else list(reversed(mgr.steps()))
    for s in steps:
        try:
            m = mgr.manifest(s)
        except TrainstoreError:
            if step is not None:
                raise
            continue
        fmt = m.config.get(FORMAT_KEY)
        return s, (fmt if isinstance(fmt, str) else None), "dcp" in m.metadata
    return None


def check_layout(job: str, step: int, found: str | None, accepted: Sequence[str], who: str) -> None:
    """``ConfigError`` naming the layout/framework of ``step`` when ``who`` cannot resume from it."""
    if found is None or found in accepted:
        return
    raise ConfigError(f"step {step} of job {job!r} was saved by {WRITERS.get(found, found)} "
                      f"(layout {found!r}); {who} resumes only from "
                      + " or ".join(f"{WRITERS.get(a, a)} ({a!r})" for a in accepted)
                      + ". Use the framework that wrote it, or a new job name")


__all__ = ["FORMAT_KEY", "WRITERS", "torch_optimizer", "model_state", "optimizer_state", "load_model",
           "load_optimizer", "check_engine", "step_layout", "check_layout"]
