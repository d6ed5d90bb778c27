"""torchtitan: its checkpoint manager, saving to and loading from trainstore.

``TrainstoreCheckpointManager`` subclasses torchtitan's ``CheckpointManager`` (torchtitan
0.3, ``torchtitan.components.checkpoint``). A job switches by naming its config class::

    from trainstore.integrations.torchtitan import TrainstoreCheckpointManager
    checkpoint=TrainstoreCheckpointManager.Config(enable=True, interval=500, keep_latest_k=3,
                                                  store="s3://bucket/ckpt", job="llama-8b")

torchtitan keeps deciding *when* to save and *what* (model flattened by its ``ModelWrapper``,
``OptimizersContainer``, LR schedulers, dataloader, train state); these overrides decide *where*:

* ``_create_checkpoint_id(step)`` -> ``"trainstore:<store url>#<job>@<step>"``;
* ``dcp_save``: ``trainstore.checkpoint.CheckpointManager.save`` (in a multi-rank job DCP with
  ``trainstore.dcp.StorageWriter`` underneath: chunked, deduplicated, compressed, verified,
  XOR incrementals every save between ``full_every`` steps, one manifest committed by the
  coordinator). ``async_mode="async"``/``"async_with_pinned_mem"``: returns after the host
  copy, torchtitan waits for the previous save before the next one as usual;
* ``_load(step=-1)``: the newest checkpoint that loads and verifies (a corrupt or unfinished
  one is skipped; ``last_restore`` says which and why); ``load(step=N)``: exactly N;
* ``keep_latest_k`` -> the retention rule ``LatestN(k)``, applied by the coordinator after each
  commit (torchtitan's folder purge is off);
* HF exports (``last_save_in_hf``) and initial loads from a folder (``initial_load_path``)
  still go through torchtitan's own code, to ``<folder>/step-N``.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.stateful import Stateful
from torchtitan.components.checkpoint import MODEL, AsyncMode, CheckpointManager
from torchtitan.tools import filesystem
from torchtitan.tools.utils import GarbageCollection

from ..checkpoint import (
    CheckpointManager as TrainstoreManager,
    CheckpointPolicy,
    RestoreResult,
    SaveHandle,
)
from ..dcp import format_checkpoint_id, parse_checkpoint_id
from ..errors import ConfigError, NotFoundError
from ..lifecycle.deletion import delete_checkpoint
from ..lifecycle.retention import retention_hook
from ..lifecycle.retention_rules import LatestN

log = logging.getLogger("trainstore.integrations.torchtitan")

#: ``extra`` field of a checkpoint's manifest: how torchtitan saved it
EXTRA_KEY = "torchtitan"


def is_trainstore_id(checkpoint_id: object) -> bool:
    return isinstance(checkpoint_id, str) and checkpoint_id.startswith("trainstore:")


class TrainstoreCheckpointManager(CheckpointManager):
    """torchtitan's ``CheckpointManager`` with trainstore as its storage (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        store: str | None = None
        """trainstore store URL (s3://, gs://, file://, a path); default: the checkpoint folder."""

        job: str = "torchtitan"
        """trainstore job name: checkpoints are steps of this job."""

        full_every: int = 0
        """0: every save is full; N: saves at multiples of N are full, the others incremental."""

        store_options: dict[str, Any] = field(default_factory=dict)
        """Keyword options of ``trainstore.store.open_store`` (endpoint, credentials...)."""

        def __post_init__(self) -> None:
            CheckpointManager.Config.__post_init__(self)
            if not isinstance(self.full_every, int) or self.full_every < 0:
                raise ConfigError(f"checkpoint.full_every must be an int >= 0, got {self.full_every!r}")

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.last_restore: RestoreResult | None = None
        if not self.enable:
            return
        policy = CheckpointPolicy(full_every=config.full_every or 1,
                                  incremental_every=1 if config.full_every else None)
        hooks = [retention_hook(LatestN(self.keep_latest_k))] if self.keep_latest_k > 0 else []
        self.checkpoints = TrainstoreManager(config.store or self.folder, config.job, policy, hooks=hooks,
                                             store_options=config.store_options or None)

    # -- where checkpoints live ----------------------------------------------------------------
    def _create_checkpoint_id(self, step: int, folder: str = "") -> str:
        if folder:
            return super()._create_checkpoint_id(step, folder)
        return format_checkpoint_id(self.checkpoints.store.url, self.checkpoints.job, step)

    def _find_load_step(self, folder: str = "") -> int:
        if folder:
            return super()._find_load_step(folder)
        latest = self.checkpoints.latest_step()
        return -1 if latest is None else latest

    def _purge_stale_checkpoints(self) -> None:
        """Retention runs as a trainstore hook after each commit (``LatestN(keep_latest_k)``)."""

    # -- saving --------------------------------------------------------------------------------
    @torch.no_grad()
    def dcp_save(self, state_dict: dict[str, Any], checkpoint_id: str, async_mode: AsyncMode,
                 enable_garbage_collection: bool = False, to_hf: bool = False) -> Future | AsyncSaveResponse | None:
        if not is_trainstore_id(checkpoint_id):
            return super().dcp_save(state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf)
        step = parse_checkpoint_id(checkpoint_id).step
        if to_hf:  # safetensors export for HF: torchtitan's own writer, into <folder>/step-N
            return super().dcp_save(state_dict, filesystem.join(self.folder, f"step-{step}"), async_mode,
                                    enable_garbage_collection, to_hf)
        model_only = not any(k in state_dict for k in self.states if k != MODEL)  # e.g. last_save_model_only
        handle = self.checkpoints.save(step, plain_state(state_dict), blocking=async_mode == AsyncMode.DISABLED,
                                       extra={EXTRA_KEY: {"model_only": model_only}})
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        if async_mode == AsyncMode.DISABLED:
            return None
        done = future_of(handle)
        if async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:  # staged already (host copy, pinned with CUDA)
            staged: Future = Future()
            staged.set_result(None)
            return AsyncSaveResponse(staging_completion=staged, upload_completion=done)
        return done

    # -- loading -------------------------------------------------------------------------------
    @torch.no_grad()
    def _load(self, step: int = -1) -> bool:
        latest = self._find_load_step()
        if latest == -1:
            if step != -1:
                raise NotFoundError(f"checkpoint.load_step={step}: job {self.checkpoints.job!r} has no checkpoints "
                                    f"in {self.checkpoints.store.url}")
            return super()._load(step)  # fresh start, or torchtitan's initial_load_path
        wanted = latest if step == -1 else step
        self.restore(self._states_to_load(self._model_only(wanted)), None if step == -1 else step)
        GarbageCollection.collect("GC collection for checkpoint loading.")
        return True

    def dcp_load(self, state_dict: dict[str, Any], checkpoint_id: str, from_hf: bool, from_quantized: bool) -> None:
        if from_hf or not is_trainstore_id(checkpoint_id):
            return super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)
        self.restore(state_dict, parse_checkpoint_id(checkpoint_id).step)
        return None

    def restore(self, states: dict[str, Any], step: int | None) -> RestoreResult:
        """Load ``step`` (None: the newest that verifies) into torchtitan's ``states`` in place,
        as ``dcp.load`` would: ``Stateful`` entries through their state dicts, then the model."""
        statefuls = {k: v for k, v in states.items() if isinstance(v, Stateful)}
        target = plain_state(states)
        result = self.checkpoints.restore_into(target, step)
        loaded = result.state if isinstance(result.state, dict) else target
        for key, obj in statefuls.items():
            obj.load_state_dict(loaded[key])
        if MODEL in self.states:  # model keys are flattened into the top level (as torchtitan saves them)
            self.states[MODEL].load_state_dict(loaded)
        self.last_restore = result
        if step is None:
            self._rewind_past(result)
        log.info("torchtitan resumed from trainstore: %s", result)  # step, tier, what was skipped
        return result

    def _rewind_past(self, result: RestoreResult) -> None:
        """Delete the newer checkpoints ``restore`` skipped (integrity failures only: any other
        error is raised): the run continues from ``result.step`` and saves those steps again,
        and a committed step is never overwritten. Coordinator only; every rank skipped the same."""
        newer = sorted({s for s, _why in result.skipped if s > result.step})
        if newer and (not dist.is_initialized() or dist.get_rank() == 0):
            existing = set(self.checkpoints.steps())
            for s in newer:
                if s in existing:
                    log.warning("torchtitan load: deleting checkpoint step %d of job %r (failed to restore; "
                                "training resumes from step %d and saves it again)", s, self.checkpoints.job,
                                result.step)
                    delete_checkpoint(self.checkpoints.store, self.checkpoints.job, s)
        if newer and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # no rank saves a deleted step again before it is gone

    def _model_only(self, step: int) -> bool:
        """torchtitan's rule (step 0 is a model-only seed checkpoint) or what the save recorded."""
        if step == 0:
            return True
        try:
            extra = self.checkpoints.manifest(step).metadata.get("extra") or {}
        except NotFoundError:
            return False
        return bool((extra.get(EXTRA_KEY) or {}).get("model_only"))

    # -- waiting and closing ---------------------------------------------------------------------
    def _close(self) -> None:
        try:
            super()._close()
        finally:
            checkpoints = getattr(self, "checkpoints", None)
            if checkpoints is not None:
                checkpoints.close()  # waits for the last save; raises its error if it failed


def plain_state(states: dict[str, Any]) -> dict[str, Any]:
    """torchtitan's states as a plain state dict (what ``dcp.save`` does with ``Stateful``
    entries); ``None`` entries (no dataloader) are left out on save and load alike."""
    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in states.items() if v is not None}


def future_of(handle: SaveHandle) -> Future:
    """A ``concurrent.futures.Future`` done when ``handle``'s save is (torchtitan waits on one)."""
    fut: Future = Future()
    if handle.skipped or handle.done():
        _settle(fut, handle)
    else:
        threading.Thread(target=_settle, args=(fut, handle), name=f"trainstore-titan-wait-{handle.step}",
                         daemon=True).start()
    return fut


def _settle(fut: Future, handle: SaveHandle) -> None:
    try:
        fut.set_result(handle.wait())
    except BaseException as exc:  # noqa: BLE001 - delivered to torchtitan's maybe_wait_for_saving
        fut.set_exception(exc)


__all__ = ["TrainstoreCheckpointManager", "plain_state", "future_of", "is_trainstore_id", "EXTRA_KEY"]
