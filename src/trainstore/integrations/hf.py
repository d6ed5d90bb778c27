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

Multi-process (``torchrun``/``accelerate launch``; DDP, or FSDP2 through accelerate's FSDP
plugin with ``fsdp_version=2``): every rank saves, collectively, the sharded state of
``integrations.hf_dist`` through the manager's ``dcp`` backend - under DDP the model and
optimizer are written once across the ranks, under FSDP2 each rank writes its own shards; one
manifest is committed after all ranks wrote. Each rank's RNG is kept under its own key
(``integrations.ranks``). A resume loads model, optimizer and scheduler after the Trainer
wrapped the model and built the optimizer (``_load_optimizer_and_scheduler``), resharded to
the current world size (also 2 -> 1 and 2 -> 3); a rank whose RNG cannot move is said in
``last_restore`` and logged. DeepSpeed and FSDP1 raise ``ConfigError`` (use FSDP2 or DDP). A
checkpoint of another layout or framework (a single-process one under FSDP, an
``AcceleratorCheckpoints`` one) is refused with a message saying which.

The hooks are private ``Trainer`` methods (``_save_checkpoint``, ``_load_from_checkpoint``,
``_load_optimizer_and_scheduler``, ``_load_scaler``, ``_load_rng_state``), overridden in
``TrainstoreTrainerMixin`` so any ``Trainer`` subclass (TRL's included) can take it first in its
bases. A callback cannot do this: it runs after the Trainer wrote its folder, and cannot
feed a resume. ``trainer.checkpoints.wait()`` runs at
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
from ..errors import ConfigError, IntegrityError, NoCheckpointError
from ..lifecycle.retention import retention_hook
from ..lifecycle.retention_rules import AnyOf, BestN, LatestN, Rule
from .hf_dist import (
    FORMAT_KEY,
    check_engine,
    check_layout,
    load_model,
    load_optimizer,
    model_state,
    optimizer_state,
    step_layout,
)
from .hf_export import PRETRAINED_FORMAT, load_weights
from .ranks import RANKS_KEY, own_entry, rank_and_world, restore_rank_state, rng_state

log = logging.getLogger("trainstore.integrations.hf")

PREFIX = "trainstore:"
STATE_FORMAT = "trainstore.hf-trainer/1"
DIST_FORMAT = "trainstore.hf-trainer/dcp-1"


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
        check_engine(self.is_deepspeed_enabled, self.accelerator.state.fsdp_plugin if self.is_fsdp_enabled else None)
        self.checkpoints = checkpoints
        self.last_restore = None
        self.last_save = None
        self._sharded = self.args.world_size > 1 or self.is_fsdp_enabled  # saves through DCP (sharded state)
        self._resume_dir: str | None = None
        self._resume_state: dict[str, Any] | None = None  # single-process layout, loaded at train()
        self._resume_step: int | None | bool = False  # sharded layout: the step to load (None newest), False: none
        self._resume_rng: dict[str, Any] | None = None
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
        state = self._sharded_state() if self._sharded else self._whole_state()
        kind = self.checkpoints.should_save(step) or \
            ("incremental" if self.checkpoints.policy.incremental_every else "full")
        config: dict[str, Any] = {"training_args": json.loads(self.args.to_json_string()),
                                  FORMAT_KEY: state["format"]}
        model_config = getattr(self.accelerator.unwrap_model(self.model), "config", None)
        if callable(getattr(model_config, "to_json_string", None)):  # for export_pretrained
            config["hf_config"] = json.loads(model_config.to_json_string(use_diff=False))
        self.last_save = self.checkpoints.save(step, state, metrics=step_metrics(self.state.log_history, step),
                                               config=config, kind=kind)

    def _whole_state(self) -> dict[str, Any]:
        """Single process: whole tensors, the optimizer's own ``state_dict``."""
        state: dict[str, Any] = {"format": STATE_FORMAT,
                                 "model": self.accelerator.unwrap_model(self.model).state_dict(),
                                 "trainer_state": json.dumps(dataclasses.asdict(self.state), sort_keys=True)}
        if not self.args.save_only_model:
            state["optimizer"] = self.optimizer.state_dict()
            state.update(self._small_parts())
            state["rng"] = capture_rng()
        return state

    def _small_parts(self) -> dict[str, Any]:
        out = {}
        if self.lr_scheduler is not None:
            out["scheduler"] = self.lr_scheduler.state_dict()
        if self.accelerator.scaler is not None:
            out["scaler"] = self.accelerator.scaler.state_dict()
        return out

    def _sharded_state(self, for_load: bool = False) -> dict[str, Any]:
        """Multi-process: the ``hf_dist`` layout (DDP: written once; FSDP2: each rank its shards).
        ``for_load``: the target of a restore (this run's structure, values overwritten)."""
        state: dict[str, Any] = {"format": DIST_FORMAT, "model": model_state(self.model),
                                 "trainer_state": json.dumps(dataclasses.asdict(self.state), sort_keys=True)}
        if not self.args.save_only_model:
            state["optimizer"] = optimizer_state(self.model, self.optimizer)
            state.update(self._small_parts())
            if not for_load:
                state[RANKS_KEY] = own_entry({"rng": rng_state()})
        return state

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
            self._resume_state, self._resume_step, self._resume_rng = None, False, None
            if self._resume_dir is not None:
                shutil.rmtree(self._resume_dir, ignore_errors=True)
                self._resume_dir = None
        self.checkpoints.wait()  # the last save is durable, or its error is raised here
        return output

    def _prepare_resume(self, step: int | None) -> str | None:
        """Restore ``step`` (None: newest valid) and lay out the one file the Trainer reads.
        A sharded checkpoint is chosen here, with its ``TrainerState`` (read before the model is
        wrapped); model and optimizer load from that step once wrapped (``_load_sharded``)."""
        layout = step_layout(self.checkpoints, step)
        if layout is not None and (layout[2] or layout[1] == DIST_FORMAT):
            check_layout(self.checkpoints.job, layout[0], layout[1], (DIST_FORMAT,), "TrainstoreTrainer")
            head = {"format": "", "trainer_state": ""}
            self.last_restore = self.checkpoints.restore_with_info(step, into=head)
            check_layout(self.checkpoints.job, self.last_restore.step, head["format"], (DIST_FORMAT,),
                         "TrainstoreTrainer")
            self._resume_step = self.last_restore.step
            return self._write_trainer_state(self.last_restore.step, head["trainer_state"])
        if layout is not None:
            check_layout(self.checkpoints.job, layout[0], layout[1], (STATE_FORMAT, PRETRAINED_FORMAT),
                         "TrainstoreTrainer")
            if self.is_fsdp_enabled:
                raise ConfigError(f"step {layout[0]} of job {self.checkpoints.job!r} was saved by a single-process "
                                  "run (whole tensors); this FSDP run resumes only from a multi-process "
                                  f"checkpoint ({DIST_FORMAT!r}). Resume it with one process or under DDP")
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
        resume_dir = self._write_trainer_state(result.step, state["trainer_state"])
        if self._sharded:
            log.warning("step %d was saved by one process: every rank restores its RNG", result.step)
        log.info("resuming from trainstore: %s", result)
        return resume_dir

    def _write_trainer_state(self, step: int, trainer_state: str) -> str:
        """The resume folder of ``step``: the one file the Trainer reads (``trainer_state.json``)."""
        self._resume_dir = tempfile.mkdtemp(prefix=f"trainstore-resume-{step}-")
        with open(os.path.join(self._resume_dir, TRAINER_STATE_NAME), "w") as f:
            f.write(trainer_state)
        return self._resume_dir

    def _ours(self, checkpoint: str | None) -> bool:
        return checkpoint is not None and checkpoint == self._resume_dir

    def _load_sharded(self) -> None:
        """Restore the chosen sharded checkpoint into the wrapped model, optimizer, scheduler
        (resharded by DCP), then this rank's RNG; collective: every rank runs it. A step that
        fails its integrity checks here (its TrainerState, read first, was fine) cannot be
        swapped for an older one any more: it is verified and so recorded bad, and the error
        says a restart falls back past it."""
        target = self._sharded_state(for_load=True)
        del target["format"], target["trainer_state"]  # read by _prepare_resume
        step = self._resume_step
        try:
            result = self.checkpoints.restore_with_info(step, into=target)  # type: ignore[arg-type]
        except IntegrityError as exc:
            if rank_and_world()[0] == 0:
                self.checkpoints.verify(step)  # type: ignore[arg-type]  # records it bad for the next restore
            raise IntegrityError(f"checkpoint step {step} of job {self.checkpoints.job!r} was chosen but its model/"
                                 f"optimizer state failed to load ({exc}); it is now recorded bad: restart the "
                                 "job to resume from the newest older checkpoint that verifies") from exc
        load_model(self.model, target["model"])
        if "optimizer" in target:
            load_optimizer(self.model, self.optimizer, target["optimizer"])
        if "scheduler" in target:
            self.lr_scheduler.load_state_dict(target["scheduler"])
        if "scaler" in target:
            self.accelerator.scaler.load_state_dict(target["scaler"])
        entry, ranks = restore_rank_state(self.checkpoints, result.step, {"rng": rng_state()})
        self._resume_rng = entry["rng"] if entry is not None else None
        chosen = self.last_restore or result  # why _prepare_resume chose the step; the time of both loads
        chosen = dataclasses.replace(chosen, seconds=chosen.seconds + result.seconds, repairs=result.repairs)
        self.last_restore = chosen if ranks.moved_all else dataclasses.replace(chosen, reason=f"{chosen.reason}; {ranks}")
        self._resume_step = False
        log.info("resuming from trainstore: %s", self.last_restore)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        if not self._ours(resume_from_checkpoint):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        if self._resume_state is None:  # sharded: loaded with the optimizer, once both are prepared
            return
        target = self.accelerator.unwrap_model(model if model is not None else self.model)
        target.load_state_dict(self._resume_state.pop("model"), strict=True)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if not self._ours(checkpoint):
            return super()._load_optimizer_and_scheduler(checkpoint)
        if self._resume_state is None:  # sharded layout (loaded once)
            return self._load_sharded() if self._resume_step is not False else None
        if "optimizer" in self._resume_state:
            self.optimizer.load_state_dict(self._resume_state.pop("optimizer"))
        if "scheduler" in self._resume_state and self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(self._resume_state.pop("scheduler"))

    def _load_scaler(self, checkpoint: str | None) -> None:
        if not self._ours(checkpoint):
            return super()._load_scaler(checkpoint)
        if self._resume_state is not None and "scaler" in self._resume_state and self.accelerator.scaler is not None:
            self.accelerator.scaler.load_state_dict(self._resume_state.pop("scaler"))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if not self._ours(checkpoint):
            return super()._load_rng_state(checkpoint)
        if self._resume_state is None:  # sharded layout: this rank's own RNG, when it was saved
            if self._resume_rng is not None:
                restore_rng(self._resume_rng)
        elif "rng" in self._resume_state:
            restore_rng(self._resume_state["rng"])  # kept: the Trainer may call this once per resume


class TrainstoreTrainer(TrainstoreTrainerMixin, Trainer):
    """``transformers.Trainer`` checkpointing to trainstore (see the module docstring)."""


__all__ = ["TrainstoreTrainer", "TrainstoreTrainerMixin", "parse_resume", "step_metrics", "retention_rule",
           "PREFIX", "STATE_FORMAT", "DIST_FORMAT"]
