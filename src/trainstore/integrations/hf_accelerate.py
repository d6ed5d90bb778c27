"""Hugging Face ``accelerate``: ``save_state``/``load_state`` to trainstore (async, incremental, verified).

    from trainstore.integrations.hf_accelerate import AcceleratorCheckpoints
    ckpt = AcceleratorCheckpoints(accelerator, CheckpointManager("s3://bucket/ckpts", job="run-1"),
                                  models=[model], optimizers=[opt], schedulers=[sched])
    start = ckpt.load()              # instead of accelerator.load_state(dir): 0 when there is none
    ...  ckpt.save(step)             # instead of accelerator.save_state(dir): returns after the host copy

One checkpoint holds what ``Accelerator.save_state`` writes: every model's weights (unwrapped),
optimizer and scheduler states, the grad scaler, ``accelerator.step`` (gradient-accumulation
counter), RNG (python, numpy, torch), the ``state_dict()`` of each extra ``objects`` entry
(``register_for_checkpointing``'s role) and a JSON ``position`` of the caller's choosing.

Data position: ``load`` returns the restored step; with ``DataLoaderConfiguration(
use_seedable_sampler=True)`` the order of an epoch depends only on the seed and
``set_epoch(epoch)``, so ``ckpt.batches(dl, resumed)`` (``skip_first_batches`` of the
``step % len(dl)`` batches already trained, then the RNG re-applied) resumes mid-epoch on
exactly the batches and random draws the uninterrupted run would see.

Multi-process (``accelerate launch``/``torchrun``; DDP, or FSDP2 with ``fsdp_version=2``): the
models and optimizers are saved in the sharded layout of ``integrations.hf_dist`` through the
manager's ``dcp`` backend (DDP: written once across the ranks; FSDP2: each rank its shards;
one manifest after all ranks wrote), ``load`` reshards to the current world. Each rank's RNG
and ``position`` go under its own key (``integrations.ranks``): ``Resumed.position`` is this
rank's; a rank the saved world did not have gets ``{}`` and no RNG, said in ``Resumed.result``
and logged. Optimizer ``i`` belongs to model ``i`` (or to the only model). ``objects`` are
saved as replicated values (one rank's copy): give per-rank state to ``position`` instead.
DeepSpeed and FSDP1 raise ``ConfigError``. A checkpoint of another layout or framework is
refused with a message saying which.

Why not ``register_save_state_pre_hook``: those hooks see only the model weights;
``save_state`` still writes optimizer, scheduler, sampler and RNG files (pickled) to a local
folder. This class replaces the call instead, through accelerate's public API only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from accelerate import Accelerator

from ..checkpoint import CheckpointManager, RestoreResult, SaveHandle, capture_rng, restore_rng
from ..errors import ConfigError, NoCheckpointError
from . import hf_dist as hd
from .ranks import RANKS_KEY, own_entry, restore_rank_state, rng_state

log = logging.getLogger("trainstore.integrations.hf_accelerate")

STATE_FORMAT = "trainstore.hf-accelerate/1"
DIST_FORMAT = "trainstore.hf-accelerate/dcp-1"
_END = object()


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


@dataclass(frozen=True)
class Resumed:
    """What ``load`` restored: the step, the caller's ``position`` and the ``RestoreResult``."""

    step: int
    position: dict[str, Any] = field(default_factory=dict)
    result: RestoreResult | None = None
    rng: dict[str, Any] | None = None  # the RNG snapshot, for ``batches`` to re-apply


class AcceleratorCheckpoints:
    """Saves and restores an accelerate training loop's state through a ``CheckpointManager``."""

    def __init__(self, accelerator: Accelerator, checkpoints: CheckpointManager, *,
                 models: Sequence[torch.nn.Module], optimizers: Sequence[Stateful] = (),
                 schedulers: Sequence[Stateful] = (), objects: Mapping[str, Stateful] | None = None) -> None:
        if not isinstance(checkpoints, CheckpointManager):
            raise ConfigError(f"checkpoints must be a trainstore CheckpointManager, got {type(checkpoints).__name__}")
        if not models:
            raise ConfigError("AcceleratorCheckpoints needs at least one model")
        hd.check_engine(getattr(accelerator.state, "deepspeed_plugin", None) is not None,
                     getattr(accelerator.state, "fsdp_plugin", None))
        if len(optimizers) > 1 and len(models) not in (1, len(optimizers)):
            raise ConfigError(f"{len(optimizers)} optimizers for {len(models)} models: optimizer i must belong to "
                              "model i, or all to the only model")
        for name, obj in (objects or {}).items():
            if not callable(getattr(obj, "state_dict", None)) or not callable(getattr(obj, "load_state_dict", None)):
                raise ConfigError(f"objects[{name!r}] needs state_dict() and load_state_dict()")
        self.accelerator = accelerator
        self.checkpoints = checkpoints
        self.models = list(models)
        self.optimizers = list(optimizers)
        self.schedulers = list(schedulers)
        self.objects = dict(objects or {})
        #: multi-process, or FSDP: the sharded layout through DCP
        self.sharded = accelerator.num_processes > 1 or getattr(accelerator.state, "fsdp_plugin", None) is not None

    def _owner(self, i: int) -> torch.nn.Module:
        """The (unwrapped) model optimizer ``i`` steps."""
        return self.accelerator.unwrap_model(self.models[0 if len(self.models) == 1 else i])

    def state(self, position: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The state one checkpoint holds (live tensors: the save copies them)."""
        if self.sharded:
            return self._sharded_state(position)
        acc = self.accelerator
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "models": [acc.unwrap_model(m).state_dict() for m in self.models],
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "objects": {k: o.state_dict() for k, o in self.objects.items()},
            "accelerator_step": int(acc.step),
            "rng": capture_rng(),
            "position": dict(position or {}),
        }
        if acc.scaler is not None:
            state["scaler"] = acc.scaler.state_dict()
        return state

    def _sharded_state(self, position: Mapping[str, Any] | None, for_load: bool = False) -> dict[str, Any]:
        """The ``hf_dist`` layout; ``for_load``: a restore target (values overwritten)."""
        acc = self.accelerator
        state: dict[str, Any] = {
            "format": DIST_FORMAT,
            "models": {str(i): hd.model_state(acc.unwrap_model(m)) for i, m in enumerate(self.models)},
            "optimizers": {str(i): hd.optimizer_state(self._owner(i), o) for i, o in enumerate(self.optimizers)},
            "schedulers": {str(i): s.state_dict() for i, s in enumerate(self.schedulers)},
            "objects": {k: o.state_dict() for k, o in self.objects.items()},
            "accelerator_step": int(acc.step),
        }
        if acc.scaler is not None:
            state["scaler"] = acc.scaler.state_dict()
        if not for_load:
            state[RANKS_KEY] = own_entry({"rng": rng_state(), "position": json.dumps(dict(position or {}))})
        return state

    def save(self, step: int, *, metrics: dict | None = None, position: Mapping[str, Any] | None = None,
             kind: str | None = None) -> SaveHandle:
        """Checkpoint the loop as ``step``; returns once the state is copied to host buffers.
        ``kind``: the manager's policy decides (a step it does not name: incremental).
        Multi-process: every rank calls it (a collective save); ``position`` is this rank's."""
        kind = kind or self.checkpoints.should_save(step) or \
            ("incremental" if self.checkpoints.policy.incremental_every else "full")
        state = self.state(position)
        return self.checkpoints.save(step, state, metrics=metrics, kind=kind, config={hd.FORMAT_KEY: state["format"]})

    def load(self, step: int | None = None) -> Resumed:
        """Restore ``step`` (None: the newest checkpoint that verifies) into the models,
        optimizers, schedulers, scaler, objects and RNG. ``Resumed(0)`` when the job has none.
        Multi-process: every rank calls it (a collective load, resharded to this world)."""
        layout = hd.step_layout(self.checkpoints, step)
        if layout is None:
            if step is not None:
                raise NoCheckpointError(f"no checkpoint step {step} for job {self.checkpoints.job!r}")
            return Resumed(0)
        if layout[2] or layout[1] == DIST_FORMAT:
            hd.check_layout(self.checkpoints.job, layout[0], layout[1], (DIST_FORMAT,), "AcceleratorCheckpoints")
            return self._load_sharded(step)
        hd.check_layout(self.checkpoints.job, layout[0], layout[1], (STATE_FORMAT,), "AcceleratorCheckpoints")
        if self.sharded:
            raise ConfigError(f"step {layout[0]} of job {self.checkpoints.job!r} was saved by one process (whole "
                              f"tensors, {STATE_FORMAT!r}); this {self.accelerator.num_processes}-process run "
                              f"resumes only from a multi-process checkpoint ({DIST_FORMAT!r}). Resume it with one "
                              "process")
        try:
            result = self.checkpoints.restore_with_info(step)
        except NoCheckpointError:
            if step is not None:
                raise
            return Resumed(0)
        s = result.state
        if not isinstance(s, dict) or s.get("format") != STATE_FORMAT:
            raise ConfigError(f"step {result.step} of job {self.checkpoints.job!r} was not saved by "
                              "AcceleratorCheckpoints")
        for what, have, saved in (("models", self.models, s["models"]), ("optimizers", self.optimizers, s["optimizers"]),
                                  ("schedulers", self.schedulers, s["schedulers"])):
            if len(have) != len(saved):
                raise ConfigError(f"step {result.step} holds {len(saved)} {what}, this loop passed {len(have)}")
        if set(self.objects) != set(s["objects"]):
            raise ConfigError(f"step {result.step} holds objects {sorted(s['objects'])}, "
                              f"this loop passed {sorted(self.objects)}")
        acc = self.accelerator
        for m, sd in zip(self.models, s["models"]):
            acc.unwrap_model(m).load_state_dict(sd, strict=True)
        for o, sd in zip(self.optimizers, s["optimizers"]):
            o.load_state_dict(sd)
        for sch, sd in zip(self.schedulers, s["schedulers"]):
            sch.load_state_dict(sd)
        for k, o in self.objects.items():
            o.load_state_dict(s["objects"][k])
        if "scaler" in s and acc.scaler is not None:
            acc.scaler.load_state_dict(s["scaler"])
        acc.step = int(s["accelerator_step"])
        restore_rng(s["rng"])
        log.info("accelerate loop resumed from trainstore: %s", result)
        return Resumed(result.step, dict(s["position"]), result, s["rng"])

    def _load_sharded(self, step: int | None) -> Resumed:
        """Collective: every rank loads its part of ``step`` (None: newest valid), resharded."""
        target = self._sharded_state(None, for_load=True)
        result = self.checkpoints.restore_with_info(step, into=target)
        hd.check_layout(self.checkpoints.job, result.step, target["format"], (DIST_FORMAT,), "AcceleratorCheckpoints")
        for what, have, saved in (("models", self.models, target["models"]),
                                  ("optimizers", self.optimizers, target["optimizers"]),
                                  ("schedulers", self.schedulers, target["schedulers"])):
            if len(have) != len(saved):  # a target key the checkpoint lacks fails the load before this
                raise ConfigError(f"step {result.step} holds {len(saved)} {what}, this loop passed {len(have)}")
        acc = self.accelerator
        for i, m in enumerate(self.models):
            hd.load_model(acc.unwrap_model(m), target["models"][str(i)])
        for i, o in enumerate(self.optimizers):
            hd.load_optimizer(self._owner(i), o, target["optimizers"][str(i)])
        for i, sch in enumerate(self.schedulers):
            sch.load_state_dict(target["schedulers"][str(i)])
        for k, o in self.objects.items():
            o.load_state_dict(target["objects"][k])
        if "scaler" in target and acc.scaler is not None:
            acc.scaler.load_state_dict(target["scaler"])
        acc.step = int(target["accelerator_step"])
        entry, ranks = restore_rank_state(self.checkpoints, result.step, {"rng": rng_state(), "position": "{}"})
        if not ranks.moved_all:
            result = dataclasses.replace(result, reason=f"{result.reason}; {ranks}")
        rng = entry["rng"] if entry is not None else None
        if rng is not None:
            restore_rng(rng)
        log.info("accelerate loop resumed from trainstore: %s", result)
        return Resumed(result.step, json.loads(entry["position"]) if entry is not None else {}, result, rng)

    def batches(self, dataloader: Any, resumed: Resumed) -> Iterator[Any]:
        """The rest of the epoch ``resumed`` stopped in: skips the ``step % len(dataloader)``
        batches already trained, then puts the RNG back to the checkpoint's snapshot once the
        iterator has drawn its seed (the uninterrupted run drew it at the epoch's start), as
        the ``Trainer`` does. Without a skip (resume at an epoch boundary) ``dataloader`` is
        returned as is: ``load`` already restored the RNG before the epoch's iterator starts."""
        skip = resumed.step % len(dataloader)
        if skip == 0 or resumed.rng is None:
            yield from dataloader
            return
        it = iter(self.accelerator.skip_first_batches(dataloader, skip))
        first = next(it, _END)
        restore_rng(resumed.rng)
        if first is _END:
            return
        yield first
        yield from it


__all__ = ["AcceleratorCheckpoints", "Resumed", "Stateful", "STATE_FORMAT", "DIST_FORMAT"]
