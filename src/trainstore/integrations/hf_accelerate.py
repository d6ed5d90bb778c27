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

Why not ``register_save_state_pre_hook``: those hooks see only the model weights;
``save_state`` still writes optimizer, scheduler, sampler and RNG files (pickled) to a local
folder. This class replaces the call instead, through accelerate's public API only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from accelerate import Accelerator

from ..checkpoint import CheckpointManager, RestoreResult, SaveHandle, capture_rng, restore_rng
from ..errors import ConfigError, NoCheckpointError

log = logging.getLogger("trainstore.integrations.hf_accelerate")

STATE_FORMAT = "trainstore.hf-accelerate/1"
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
        if accelerator.num_processes > 1:
            raise ConfigError(f"AcceleratorCheckpoints supports single-process training only "
                              f"({accelerator.num_processes} processes)")
        for name, obj in (objects or {}).items():
            if not callable(getattr(obj, "state_dict", None)) or not callable(getattr(obj, "load_state_dict", None)):
                raise ConfigError(f"objects[{name!r}] needs state_dict() and load_state_dict()")
        self.accelerator = accelerator
        self.checkpoints = checkpoints
        self.models = list(models)
        self.optimizers = list(optimizers)
        self.schedulers = list(schedulers)
        self.objects = dict(objects or {})

    def state(self, position: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The state one checkpoint holds (live tensors: the save copies them)."""
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

    def save(self, step: int, *, metrics: dict | None = None, position: Mapping[str, Any] | None = None,
             kind: str | None = None) -> SaveHandle:
        """Checkpoint the loop as ``step``; returns once the state is copied to host buffers.
        ``kind``: the manager's policy decides (a step it does not name: incremental)."""
        kind = kind or self.checkpoints.should_save(step) or \
            ("incremental" if self.checkpoints.policy.incremental_every else "full")
        return self.checkpoints.save(step, self.state(position), metrics=metrics, kind=kind)

    def load(self, step: int | None = None) -> Resumed:
        """Restore ``step`` (None: the newest checkpoint that verifies) into the models,
        optimizers, schedulers, scaler, objects and RNG. ``Resumed(0)`` when the job has none."""
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


__all__ = ["AcceleratorCheckpoints", "Resumed", "Stateful", "STATE_FORMAT"]
