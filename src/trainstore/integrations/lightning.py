"""PyTorch Lightning: trainstore as the Trainer's ``CheckpointIO`` (async, incremental, verified).

    from trainstore.integrations.lightning import TrainstoreCheckpointIO
    trainer = Trainer(plugins=[TrainstoreCheckpointIO("s3://bucket/ckpts", job="run-1")], ...)
    trainer.fit(model, ckpt_path="last")      # newest checkpoint that verifies

Each Lightning save (``.../epoch=0-step=50.ckpt``, ``last.ckpt``) becomes the trainstore
checkpoint of step ``checkpoint["global_step"]`` (full or incremental per ``policy``), saved in
the background: ``save_checkpoint`` returns once the state is copied to host buffers, so no
``AsyncCheckpointIO`` wrapper is needed. Python values Lightning keeps in the dict
(hyper-parameters, ``Namespace``, enums, dataclasses...) go through ``pyvalues``: no pickle.

Lightning finds checkpoints by file name (``ckpt_path="last"`` lists ``last*.ckpt`` in the
checkpoint directory), so every path Lightning saves gets a small *pointer file* (JSON: store,
job, step) once the checkpoint is committed. Loading a pointer whose name starts with
``last`` restores the newest checkpoint of the job that verifies (falling back past corrupt or
unfinished ones); any other pointer restores exactly its step. Without pointer files (a lost
node) ``ckpt_path="trainstore:latest"`` (``LATEST``) or ``"trainstore:<step>"`` works too.

Two saves of the same global step (``last.ckpt`` right after the top-k file) share one
checkpoint. ``remove_checkpoint`` (``ModelCheckpoint(save_top_k=...)`` dropping a path) deletes
the pointer and forgets the alias; a checkpoint no alias refers to any more is deleted by
trainstore's retention after the next save has committed (the newest full checkpoint and the
bases of kept incrementals stay), never before. The aliases live in the store at
``integrations/lightning/<job>/aliases.json``, so a resumed run keeps managing the files an
earlier run saved.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning_fabric.utilities.types import _PATH

from ..checkpoint import (
    CheckpointInfo,
    CheckpointManager,
    CheckpointPolicy,
    RestoreResult,
    SaveHandle,
)
from ..errors import AlreadyExistsError, ConfigError, NotFoundError
from ..lifecycle.retention import apply_retention, delete_checkpoint
from ..lifecycle.retention_rules import AnyOf, Registered, RetentionView, Rule
from ..store.base import Store
from . import pyvalues

log = logging.getLogger("trainstore.integrations.lightning")

LATEST = "trainstore:latest"
POINTER_FORMAT = "trainstore.lightning-pointer/1"
ALIASES_FORMAT = "trainstore.lightning-aliases/1"


def aliases_key(job: str) -> str:
    return f"integrations/lightning/{job}/aliases.json"


class _LiveAliases(Rule):
    """Keeps every checkpoint except those the plugin created whose Lightning paths were all removed."""

    def __init__(self, dropped: frozenset[int]) -> None:
        self.dropped = dropped

    def keep(self, view: RetentionView) -> dict[int, list[str]]:
        return {m.step: ["a Lightning checkpoint path refers to it"] for m in view.manifests
                if m.step not in self.dropped}

    def miss(self, m: Any, view: RetentionView) -> str:
        return "every Lightning path to it was removed (ModelCheckpoint)"

    def describe(self) -> str:
        return "checkpoints Lightning still refers to"


class TrainstoreCheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO`` saving to a trainstore job (see module docstring).

    ``policy``: full/incremental choice (a full checkpoint when the policy says so for the
    step or ``full_every`` steps have passed since the last full one, else incremental).
    ``keep``: extra retention rules that keep checkpoints Lightning removed (registered
    model versions are always kept). ``allow_pickle_paths``: leaves stored with pickle (at
    save) and unpickled (at load) - see ``pyvalues``.
    """

    def __init__(self, store: str | Store, job: str, *, policy: CheckpointPolicy | None = None,
                 keep: Sequence[Rule] = (), allow_pickle_paths: Sequence[str] = (),
                 store_options: dict | None = None) -> None:
        self.store_arg = store
        self.job = job
        self.policy = policy or CheckpointPolicy()
        self.keep = tuple(keep)
        self.allow_pickle_paths = tuple(allow_pickle_paths)
        self.store_options = store_options
        self.last_restore: RestoreResult | None = None
        self.last_blocked_s: float = 0.0  # caller-blocking time of the last save
        self._lock = threading.RLock()
        self._mgr: CheckpointManager | None = None
        self._aliases: dict[str, int] = {}  # Lightning path -> step
        self._created: set[int] = set()  # steps this plugin saved (only these are ever dropped)
        self._committed: set[int] = set()
        self._saved_here: set[int] = set()  # steps saved through this manager (same-step saves alias them)
        self._unwritten: dict[str, int] = {}  # pointers waiting for their step to commit
        self._last_full: int | None = None
        self._dirty = False

    # -- the manager -----------------------------------------------------------------------
    @property
    def manager(self) -> CheckpointManager:
        """The job's ``CheckpointManager`` (opened on first use, again after ``teardown``)."""
        with self._lock:
            if self._mgr is None:
                mgr = CheckpointManager(self.store_arg, self.job, self.policy, store_options=self.store_options,
                                        hooks=[self._after_commit])
                self._load_aliases(mgr.store)
                self._committed = set(mgr.steps())
                self._saved_here = set()
                self._mgr = mgr
            return self._mgr

    def _load_aliases(self, store: Store) -> None:
        try:
            doc = json.loads(bytes(store.get(aliases_key(self.job))))
        except NotFoundError:
            return
        if not isinstance(doc, dict) or doc.get("format") != ALIASES_FORMAT:
            raise ConfigError(f"{aliases_key(self.job)} in {store.url} is not a Lightning alias record")
        self._aliases = {str(k): int(v) for k, v in doc["aliases"].items()}
        self._created = {int(s) for s in doc["created"]}

    # -- CheckpointIO ----------------------------------------------------------------------
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        """Start saving ``checkpoint`` as step ``checkpoint["global_step"]``; returns after the host copy."""
        t0 = time.perf_counter()
        if storage_options is not None:
            raise ConfigError(f"TrainstoreCheckpointIO takes no storage_options (got {storage_options!r}): "
                              "configure the store with store_options=")
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise ConfigError("TrainstoreCheckpointIO supports single-process training only (no DDP yet)")
        step = checkpoint.get("global_step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ConfigError(f"Lightning checkpoint for {path} has no valid global_step: {step!r}")
        name = _norm(path)
        mgr = self.manager
        with self._lock:
            known = step in self._saved_here
        if not known:
            encoded = pyvalues.encode(checkpoint, self.allow_pickle_paths)
            handle = self._save(mgr, step, encoded, name)
            if handle.skipped:
                log.warning("Lightning checkpoint %s (step %d) was skipped by the policy", name, step)
                return
            with self._lock:
                if handle.kind == "full":
                    self._last_full = step
                self._created.add(step)
                self._saved_here.add(step)
        with self._lock:
            old = self._aliases.get(name)
            self._aliases[name] = step
            self._dirty = True
            if step in self._committed:
                self._write_pointer(name, step)
            else:
                self._unwritten[name] = step
            if old is not None and old != step:
                log.info("Lightning path %s now refers to step %d (was %d)", name, step, old)
        self.last_blocked_s = time.perf_counter() - t0

    def _save(self, mgr: CheckpointManager, step: int, state: Any, name: str) -> SaveHandle:
        """``mgr.save``; a step an earlier run left behind is replaced only if it is recorded bad
        (a resume fell back past it and training reached the step again)."""
        kind = self._kind(step)
        try:
            return mgr.save(step, state, kind=kind, extra={"lightning": {"path": name}})
        except AlreadyExistsError:
            status = next((i.status for i in mgr.list() if i.step == step), None)
            if status not in ("bad", "unreadable"):
                raise AlreadyExistsError(
                    f"step {step} of job {self.job!r} was saved by an earlier run ({status}) and training reached "
                    f"it again on another path ({name}); resume from the newest checkpoint (ckpt_path='last') "
                    "or use a new job") from None
            log.warning("step %d of job %r is recorded %s: deleting it to save the step again", step, self.job, status)
            delete_checkpoint(mgr.store, self.job, step)
            with self._lock:
                self._committed.discard(step)
            return mgr.save(step, state, kind=kind, extra={"lightning": {"path": name}})

    def _kind(self, step: int) -> str:
        p = self.policy
        if p.should_save(step) == "full" or self._last_full is None or step - self._last_full >= p.full_every \
                or not p.incremental_every:
            return "full"
        return "incremental"

    def load_checkpoint(self, path: _PATH, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint a pointer file (or ``trainstore:latest`` / ``trainstore:<step>``) names.

        Tensors come back on the CPU (Lightning moves them to the module's device).
        ``weights_only`` is accepted and needs nothing: the format never unpickles.
        """
        mgr = self.manager
        mgr.wait()  # saves of this process are visible before we pick one
        step, why = self._resolve(path)
        result = mgr.restore_with_info(step)
        self.last_restore = result
        log.info("Lightning load of %s (%s): %s", path, why, result)
        checkpoint = pyvalues.decode(result.state, self.allow_pickle_paths)
        if step is None and not os.fspath(path).startswith("trainstore:"):
            _as_loaded_through(checkpoint, os.fspath(path))
        return checkpoint

    def _resolve(self, path: _PATH) -> tuple[int | None, str]:
        text = os.fspath(path)
        if text.startswith("trainstore:"):
            what = text[len("trainstore:"):]
            if what == "latest":
                return None, "newest checkpoint that verifies"
            if what.isdigit():
                return int(what), f"step {what}"
            raise ConfigError(f"ckpt path {text!r}: use 'trainstore:latest' or 'trainstore:<step>'")
        pointer = _read_pointer(text)
        if pointer.get("job") != self.job:
            raise ConfigError(f"{text} is a checkpoint of job {pointer.get('job')!r}, this plugin saves job {self.job!r}")
        if os.path.basename(text).startswith("last"):
            return None, f"{os.path.basename(text)}: newest checkpoint that verifies"
        return int(pointer["step"]), f"step {pointer['step']} of {os.path.basename(text)}"

    def remove_checkpoint(self, path: _PATH) -> None:
        """Lightning no longer wants ``path``: delete its pointer, forget the alias; the
        checkpoint goes once no alias refers to it and a newer save has committed."""
        name = _norm(path)
        with self._lock:
            step = self._aliases.pop(name, None)
            self._unwritten.pop(name, None)
            self._dirty = True
            fs, p = url_to_fs(name)
            if fs.exists(p):
                fs.rm(p)
        log.info("Lightning removed %s (step %s)", name, step)

    def teardown(self) -> None:
        """Wait for the pending save, apply removals, release the manager (reopened on next use)."""
        with self._lock:
            mgr, self._mgr = self._mgr, None
        if mgr is None:
            return
        try:
            mgr.wait()  # raises a failed background save: then nothing is removed
            self._sync(mgr)
        finally:
            mgr.close()

    # -- background: after each commit -----------------------------------------------------
    def _after_commit(self, info: CheckpointInfo, mgr: CheckpointManager) -> None:
        with self._lock:
            self._committed.add(info.step)
            for name, step in list(self._unwritten.items()):
                if step in self._committed:
                    self._write_pointer(name, step)
                    del self._unwritten[name]
        self._sync(mgr)

    def _sync(self, mgr: CheckpointManager) -> None:
        """Record the aliases in the store and delete the checkpoints no alias refers to."""
        with self._lock:
            if not self._dirty:
                return
            live = set(self._aliases.values())
            dropped = frozenset(s for s in self._created if s not in live and s in self._committed)
            doc = {"format": ALIASES_FORMAT, "aliases": dict(self._aliases), "created": sorted(self._created)}
            mgr.store.put(aliases_key(self.job), json.dumps(doc, sort_keys=True).encode())
            self._dirty = False
        if not dropped:
            return
        rule = AnyOf(_LiveAliases(dropped), Registered(), *self.keep)
        try:
            plan = apply_retention(mgr.store, self.job, rule)
        except ConfigError as exc:  # it would delete every checkpoint: keep them
            log.warning("Lightning retention of job %r not applied: %s", self.job, exc)
            return
        with self._lock:
            for d in plan.deleted:
                self._created.discard(d.step)
                self._committed.discard(d.step)
            if plan.deleted:
                doc = {"format": ALIASES_FORMAT, "aliases": dict(self._aliases), "created": sorted(self._created)}
                mgr.store.put(aliases_key(self.job), json.dumps(doc, sort_keys=True).encode())

    def _write_pointer(self, name: str, step: int) -> None:
        url = self.store_arg if isinstance(self.store_arg, str) else self.store_arg.url
        body = json.dumps({"format": POINTER_FORMAT, "store": url, "job": self.job, "step": step}).encode()
        fs, p = url_to_fs(name)
        if isinstance(fs, LocalFileSystem):
            os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
            tmp = f"{p}.tmp.{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(body)
            os.replace(tmp, p)  # a pointer appears whole or not at all
        else:
            with fs.open(p, "wb") as f:
                f.write(body)


def _as_loaded_through(checkpoint: dict, last_path: str) -> None:
    """Set ``last_model_path`` of the ModelCheckpoint states of ``last_path``'s directory to it.

    ``ModelCheckpoint`` sets that field just before saving ``last.ckpt``, so a real last file
    holds its own path there; a same-step save shares the checkpoint of the top-k file saved a
    moment earlier (or a fallback restores an older one), whose field is older. Without this,
    the resumed callback would not recognise ``last.ckpt`` and start ``last-v1.ckpt``.
    """
    callbacks = checkpoint.get("callbacks")
    if not isinstance(callbacks, dict):
        return
    where = os.path.realpath(os.path.dirname(_norm(last_path)))
    for state in callbacks.values():
        if isinstance(state, dict) and "last_model_path" in state and isinstance(state.get("dirpath"), str) \
                and os.path.realpath(state["dirpath"]) == where:
            state["last_model_path"] = os.path.join(state["dirpath"], os.path.basename(last_path))


def _norm(path: _PATH) -> str:
    text = os.fspath(path)
    return text if "://" in text else os.path.abspath(text)


def _read_pointer(path: str) -> dict:
    fs, p = url_to_fs(path)
    try:
        with fs.open(p, "rb") as f:
            raw = f.read(1 << 16)
    except FileNotFoundError:
        raise NotFoundError(f"no Lightning checkpoint at {path}") from None
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("format") != POINTER_FORMAT or not isinstance(doc.get("step"), int):
        raise ConfigError(f"{path} is not a trainstore checkpoint pointer (a torch.save file? load it without "
                          "TrainstoreCheckpointIO)")
    return doc


__all__ = ["TrainstoreCheckpointIO", "LATEST", "aliases_key"]
