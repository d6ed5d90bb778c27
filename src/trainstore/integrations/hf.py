"""Hugging Face ``Trainer``: checkpoints go to trainstore (async, incremental, verified).

    from trainstore.integrations.hf import TrainstoreTrainer
    trainer = TrainstoreTrainer(model=model, args=args, train_dataset=ds,
                                checkpoints=CheckpointManager("s3://bucket/ckpts", job="run-1"))
    trainer.train(resume_from_checkpoint=True)   # newest checkpoint that verifies (or a fresh start)

Every save the Trainer decides on (``save_steps``/``save_strategy``) becomes trainstore
checkpoint ``global_step`` instead of a ``checkpoint-N`` folder: model, optimizer, scheduler,
grad scaler, RNG (python, numpy, torch) and the ``TrainerState`` (global step, log history,
best metric, stateful callbacks) as JSON. The save returns once the state is copied to host
buffers; hashing, compression and writes run in the background. Its kind (full or
incremental) follows the manager's ``CheckpointPolicy`` by step; a step the policy does not
name is incremental (full when ``incremental_every`` is 0/None). Eval metrics logged at the
step are recorded as the checkpoint's metrics (``restore(best="eval_loss")``, ``BestN``).
``save_total_limit`` becomes the retention rule ``LatestN(limit)`` (plus ``BestN(1, metric)``
with ``metric_for_best_model``), applied after each save has committed.

``resume_from_checkpoint=True`` restores the newest checkpoint that loads and verifies
(falling back past corrupt or unfinished ones) and starts fresh when the job has none;
``"trainstore:<step>"`` restores exactly that step. A checkpoint made by
``hf_export.import_pretrained`` only loads its weights: the fine-tune starts at step 0 from them. The Trainer's own resume logic then runs
unchanged (it skips the batches already trained in the epoch and restores the RNG after
them), so the resumed run sees exactly the batches the uninterrupted run would. Only the
``trainer_state.json`` it reads is written, to a temporary folder; no weights touch local disk.

The hooks are private ``Trainer`` methods (``_save_checkpoint``, ``_load_from_checkpoint``,
``_load_optimizer_and_scheduler``, ``_load_scaler``, ``_load_rng_state``), overridden in
``TrainstoreTrainerMixin`` so any ``Trainer`` subclass (TRL's included) can take it first in its
bases. A callback cannot do this: it runs after the Trainer wrote its folder, and cannot
feed a resume. Single process only (``world_size`` 1); ``trainer.checkpoints.wait()`` runs at
the end of ``train`` so a background error is raised there, never lost.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
from typing import Any

import torch
from transformers import Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState

from ..checkpoint import CheckpointManager, RestoreResult, SaveHandle, capture_rng, restore_rng
from ..errors import ConfigError, NoCheckpointError
from ..lifecycle.retention import retention_hook
from ..lifecycle.retention_rules import AnyOf, BestN, LatestN, Rule
from .hf_export import PRETRAINED_FORMAT, load_weights

log = logging.getLogger("trainstore.integrations.hf")

PREFIX = "trainstore:"
STATE_FORMAT = "trainstore.hf-trainer/1"


def parse_resume(value: str | bool | None) -> int | None | bool:
    """``True``/``"trainstore:latest"`` -> None (newest valid); ``"trainstore:<step>"`` -> step;
    anything else -> False (not ours: a folder path for the Trainer's own loader)."""
    if value is True or value == f"{PREFIX}latest":
        return None
    if isinstance(value, str) and value.startswith(PREFIX):
        tail = value[len(PREFIX):]
        if not tail.isdigit():
            raise ConfigError(f"resume_from_checkpoint {value!r}: expected '{PREFIX}latest' or '{PREFIX}<step>'")
        return int(tail)
    return False


def step_metrics(log_history: list[dict[str, Any]], step: int) -> dict[str, float]:
    """Numeric values logged at ``step`` (eval metrics, loss): the checkpoint's metrics."""
    out: dict[str, float] = {}
    for entry in log_history:
        if entry.get("step") != step:
            continue
        for k, v in entry.items():
            if k not in ("step", "epoch") and isinstance(v, (int, float)) and not isinstance(v, bool) \
                    and math.isfinite(v):
                out[k] = float(v)
    return out


def retention_rule(save_total_limit: int | None, metric_for_best_model: str | None,
                   greater_is_better: bool | None) -> Rule | None:
    """The trainstore rule for the Trainer's ``save_total_limit`` (None: keep everything)."""
    if not save_total_limit:
        return None
    rules: list[Rule] = [LatestN(save_total_limit)]
    if metric_for_best_model:
        metric = metric_for_best_model if metric_for_best_model.startswith("eval_") \
            else f"eval_{metric_for_best_model}"
        rules.append(BestN(metric, 1, "max" if greater_is_better else "min"))
    return AnyOf(*rules)


class TrainstoreTrainerMixin:
    """Put before ``Trainer`` (or a subclass of it) in the bases; see the module docstring."""

    checkpoints: CheckpointManager
    last_restore: RestoreResult | None
    last_save: SaveHandle | None

    def __init__(self, *args: Any, checkpoints: CheckpointManager, **kwargs: Any) -> None:
        if not isinstance(checkpoints, CheckpointManager):
            raise ConfigError(f"checkpoints must be a trainstore CheckpointManager, got {type(checkpoints).__name__}")
        super().__init__(*args, **kwargs)
        if self.args.world_size > 1:
            raise ConfigError(f"TrainstoreTrainer supports single-process training only (world_size is "
                              f"{self.args.world_size})")
        self.checkpoints = checkpoints
        self.last_restore = None
        self.last_save = None
        self._resume_dir: str | None = None
        self._resume_state: dict[str, Any] | None = None
        rule = retention_rule(self.args.save_total_limit, self.args.metric_for_best_model,
                              self.args.greater_is_better)
        if rule is not None:
            checkpoints.hooks.append(retention_hook(rule))

    # -- saving ------------------------------------------------------------------------------
    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """Replaces the ``checkpoint-N`` folder with an async trainstore save of the same state."""
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        for cb in [cb for cb in self.callback_handler.callbacks + [self.control] if isinstance(cb, ExportableState)]:
            name, cb_state = cb.__class__.__name__, cb.state()
            if isinstance(self.state.stateful_callbacks.get(name), list):
                self.state.stateful_callbacks[name].append(cb_state)
            else:
                self.state.stateful_callbacks[name] = cb_state
        step = self.state.global_step
        state: dict[str, Any] = {"format": STATE_FORMAT,
                                 "model": self.accelerator.unwrap_model(self.model).state_dict(),
                                 "trainer_state": json.dumps(dataclasses.asdict(self.state), sort_keys=True)}
        if not self.args.save_only_model:
            state["optimizer"] = self.optimizer.state_dict()
            if self.lr_scheduler is not None:
                state["scheduler"] = self.lr_scheduler.state_dict()
            if self.accelerator.scaler is not None:
                state["scaler"] = self.accelerator.scaler.state_dict()
            state["rng"] = capture_rng()
        kind = self.checkpoints.should_save(step) or \
            ("incremental" if self.checkpoints.policy.incremental_every else "full")
        config: dict[str, Any] = {"training_args": json.loads(self.args.to_json_string())}
        model_config = getattr(self.accelerator.unwrap_model(self.model), "config", None)
        if callable(getattr(model_config, "to_json_string", None)):  # for export_pretrained
            config["hf_config"] = json.loads(model_config.to_json_string(use_diff=False))
        self.last_save = self.checkpoints.save(step, state, metrics=step_metrics(self.state.log_history, step),
                                               config=config, kind=kind)

    # -- resuming ----------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; ``True`` or ``"trainstore:<step>"`` resume from the store."""
        target = parse_resume(resume_from_checkpoint)
        if target is not False:
            resume_from_checkpoint = self._prepare_resume(target)
        try:
            output = super().train(resume_from_checkpoint, *args, **kwargs)
        except BaseException:
            try:
                self.checkpoints.wait()
            except Exception as exc:  # noqa: BLE001 - the training error is the one to raise
                log.error("a background checkpoint save failed as well: %s", exc)
            raise
        finally:
            self._resume_state = None
            if self._resume_dir is not None:
                shutil.rmtree(self._resume_dir, ignore_errors=True)
                self._resume_dir = None
        self.checkpoints.wait()  # the last save is durable, or its error is raised here
        return output

    def _prepare_resume(self, step: int | None) -> str | None:
        """Restore ``step`` (None: newest valid) and lay out the one file the Trainer reads."""
        try:
            result = self.checkpoints.restore_with_info(step)
        except NoCheckpointError:
            if step is not None:
                raise
            log.info("job %r has no checkpoint yet: training from the start", self.checkpoints.job)
            return None
        state = result.state
        if isinstance(state, dict) and state.get("format") == PRETRAINED_FORMAT:  # import_pretrained
            load_weights(self.accelerator.unwrap_model(self.model), state["model"])
            self.last_restore = result
            log.info("fine-tuning from imported weights: %s", result)
            return None
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ConfigError(f"step {result.step} of job {self.checkpoints.job!r} was not saved by "
                              "TrainstoreTrainer (no Trainer state in it)")
        self.last_restore = result
        self._resume_state = state
        self._resume_dir = tempfile.mkdtemp(prefix=f"trainstore-resume-{result.step}-")
        with open(os.path.join(self._resume_dir, TRAINER_STATE_NAME), "w") as f:
            f.write(state["trainer_state"])
        log.info("resuming from trainstore: %s", result)
        return self._resume_dir

    def _ours(self, checkpoint: str | None) -> bool:
        return checkpoint is not None and checkpoint == self._resume_dir and self._resume_state is not None

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        if not self._ours(resume_from_checkpoint):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        target = self.accelerator.unwrap_model(model if model is not None else self.model)
        target.load_state_dict(self._resume_state.pop("model"), strict=True)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if not self._ours(checkpoint):
            return super()._load_optimizer_and_scheduler(checkpoint)
        if "optimizer" in self._resume_state:
            self.optimizer.load_state_dict(self._resume_state.pop("optimizer"))
        if "scheduler" in self._resume_state and self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(self._resume_state.pop("scheduler"))

    def _load_scaler(self, checkpoint: str | None) -> None:
        if not self._ours(checkpoint):
            return super()._load_scaler(checkpoint)
        if "scaler" in self._resume_state and self.accelerator.scaler is not None:
            self.accelerator.scaler.load_state_dict(self._resume_state.pop("scaler"))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if not self._ours(checkpoint):
            return super()._load_rng_state(checkpoint)
        if "rng" in self._resume_state:
            restore_rng(self._resume_state["rng"])  # kept: the Trainer may call this once per resume


class TrainstoreTrainer(TrainstoreTrainerMixin, Trainer):
    """``transformers.Trainer`` checkpointing to trainstore (see the module docstring)."""


__all__ = ["TrainstoreTrainer", "TrainstoreTrainerMixin", "parse_resume", "step_metrics", "retention_rule",
           "PREFIX", "STATE_FORMAT"]
