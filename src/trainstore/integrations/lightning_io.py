"""The core of ``TrainstoreCheckpointIO``, free of a Lightning namespace (see ``lightning``).

Each Lightning save (``.../epoch=0-step=50.ckpt``, ``last.ckpt``) becomes the trainstore
checkpoint of step ``checkpoint["global_step"]`` (full or incremental per ``policy``), saved in
the background: ``save_checkpoint`` returns once the state is copied to host buffers. The
path's pointer (``lightning_pointers``) is written before it returns, so the path exists at
once; a load in this process waits for the pending save first.

Two saves at one step share one checkpoint only when their content is identical (by hash,
``lightning_state``). A different content at a step this plugin already saved (``ema.ckpt``,
a ``save_weights_only`` file beside a full one, a save after ``fit``) is saved as its own
full checkpoint in the job's *same-step variant* ``<job>.lightning-variant-<n>``; a step an
earlier run left is left to the manager (a bad one is replaced). Removed paths become
retention (after a newer save committed, never before). After ``teardown`` (the end of
``fit``) a save blocks until committed and releases the manager again: no thread is left.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..checkpoint import CheckpointInfo, CheckpointManager, CheckpointPolicy, RestoreResult
from ..errors import (
    AlreadyExistsError,
    ConfigError,
    IntegrityError,
    NotFoundError,
    NoValidCheckpointError,
    TrainstoreError,
)
from ..lifecycle.deletion import delete_checkpoint
from ..lifecycle.retention_rules import Rule
from ..store.base import Store
from . import pyvalues
from .lightning_layout import (
    LAYOUT_FULL,
    check_global_step,
    check_layout,
    drop_unnamed,
    lightning_extra,
)
from .lightning_pointers import (
    AliasRecord,
    Ref,
    as_loaded_through,
    is_tensor_file,
    norm_path,
    read_tensor_file,
    remove_pointer,
    resolve_path,
    write_pointer,
    write_tensor_file,
)
from .lightning_state import content_hash, is_sharded

log = logging.getLogger("trainstore.integrations.lightning")

LATEST = "trainstore:latest"
VARIANT = ".lightning-variant-"


class TrainstoreIOBase:
    """Lightning ``CheckpointIO`` methods saving to a trainstore job (see module docstring).

    ``policy``: full/incremental choice. ``keep``: extra retention rules that keep checkpoints
    Lightning removed (registered model versions are always kept). ``allow_pickle_paths``:
    leaves stored with pickle (at save) and unpickled (at load) - see ``pyvalues``.
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
        self._mgrs: dict[str, CheckpointManager] = {}  # job (the main one, same-step variants) -> manager
        self._aliases = AliasRecord(job)
        self._hashes: dict[Ref, str] = {}  # content of the checkpoints this plugin saved or looked up
        self._this_run: set[Ref] = set()  # saved by this plugin (a different content there: a variant)
        self._committed: set[Ref] = set()
        self._last_full: int | None = None
        self._dirty = False
        self._torn_down = False  # after teardown: saves block and release the managers
        self._layout = LAYOUT_FULL  # the strategy's: full (single, DDP) or sharded (ModelParallelStrategy)
        self._run: str | None = None  # the run of the first manager: later ones continue it

    def use_layout(self, layout: str) -> None:
        """The strategy saves ``layout`` (a sharded strategy says so before its first save)."""
        with self._lock:
            if layout != self._layout and self._mgrs:
                raise ConfigError(f"TrainstoreCheckpointIO of job {self.job!r} was used with the {self._layout} layout "
                                  f"already; use one plugin per Trainer")
            self._layout = layout

    @property
    def torn_down(self) -> bool:
        return self._torn_down

    def __getstate__(self) -> dict:
        """Pickled for Lightning's spawn launcher: the configuration, no lock, manager or alias state."""
        if self._mgrs:
            raise ConfigError("TrainstoreCheckpointIO cannot be sent to spawned processes after its first use")
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # -- managers --------------------------------------------------------------------------
    @property
    def store_url(self) -> str:
        return self.store_arg if isinstance(self.store_arg, str) else self.store_arg.url

    @property
    def manager(self) -> CheckpointManager:
        """The job's ``CheckpointManager`` (opened on first use, again after ``teardown``)."""
        return self.manager_for(self.job)

    def manager_for(self, job: str) -> CheckpointManager:
        """The manager of ``job`` (the main one or a same-step variant); the full layout saves
        from one process even in a distributed job (DDP's rank 0), the sharded one from all."""
        with self._lock:
            mgr = self._mgrs.get(job)
            if mgr is None:
                main = job == self.job
                mgr = CheckpointManager(self.store_arg, job, self.policy if main else CheckpointPolicy(),
                                        store_options=self.store_options, hooks=[self._after_commit],
                                        run=self._run if main else None,
                                        backend="single" if self._layout == LAYOUT_FULL else "dcp")
                if not self._mgrs:
                    self._aliases.load(mgr.store)
                if main:
                    self._run = mgr.run
                self._committed |= {(job, s) for s in mgr.steps()}
                self._mgrs[job] = mgr
            return mgr

    def variant_job(self, n: int) -> str:
        return f"{self.job}{VARIANT}{n}"

    def owns_job(self, job: str) -> bool:
        return job == self.job or (job.startswith(self.job + VARIANT) and job[len(self.job + VARIANT):].isdigit())

    # -- where a save goes -----------------------------------------------------------------
    def stored_hash(self, ref: Ref) -> str | None:
        """Content hash of ``ref`` ("" when it exists without one; None when it does not exist)."""
        with self._lock:
            if ref in self._hashes:
                return self._hashes[ref]
        try:
            m = self.manager_for(ref[0]).manifest(ref[1])
        except NotFoundError:
            return None
        except TrainstoreError:  # unreadable: never aliased
            return ""
        found = str((lightning_extra(m) or {}).get("content") or "")
        with self._lock:
            self._hashes[ref] = found
        return found

    def place(self, step: int, digest: str) -> tuple[Ref, bool]:
        """``(ref, save)``: the checkpoint a save of ``digest`` at ``step`` goes to, and whether it
        must be written (False: an identical checkpoint exists - an alias)."""
        n = 0
        while True:
            ref = (self.job if n == 0 else self.variant_job(n), step)
            have = self.stored_hash(ref)
            if have is None:
                return ref, True
            if have == digest:
                return ref, False
            if n == 0 and ref not in self._this_run:  # an earlier run's step: the manager decides
                return ref, True
            n += 1

    def kind_for(self, ref: Ref) -> str:
        if ref[0] != self.job:
            return "full"
        p = self.policy
        if p.should_save(ref[1]) == "full" or self._last_full is None or ref[1] - self._last_full >= p.full_every \
                or not p.incremental_every:
            return "full"
        return "incremental"

    def save_ref(self, ref: Ref, state: Any, name: str, digest: str, layout: str, kind: str | None = None,
                 extra: dict | None = None) -> bool:
        """Save ``state`` as ``ref`` (collective under a sharded strategy); False if the policy skipped it."""
        kind = kind or self.kind_for(ref)
        mgr = self.manager_for(ref[0])
        meta = {"lightning": {"path": name, "content": digest, "layout": layout, **(extra or {})}}
        try:
            handle = mgr.save(ref[1], state, kind=kind, extra=meta)
        except AlreadyExistsError:
            status = next((i.status for i in mgr.list() if i.step == ref[1]), None)
            if status not in ("bad", "unreadable"):
                raise AlreadyExistsError(
                    f"step {ref[1]} of job {ref[0]!r} was saved by an earlier run ({status}) and training reached "
                    f"it again on another path ({name}); resume from the newest checkpoint (ckpt_path='last') "
                    "or use a new job") from None
            log.warning("step %d of job %r is recorded %s: deleting it to save the step again", ref[1], ref[0], status)
            delete_checkpoint(mgr.store, ref[0], ref[1])
            with self._lock:
                self._committed.discard(ref)
            handle = mgr.save(ref[1], state, kind=kind, extra=meta)
        if handle.skipped:
            log.warning("Lightning checkpoint %s (step %d) was skipped by the policy", name, ref[1])
            return False
        with self._lock:
            if handle.kind == "full" and ref[0] == self.job:
                self._last_full = ref[1]
            self._hashes[ref] = digest
            self._this_run.add(ref)
            self._aliases.created.add(ref)
        return True

    def name_path(self, name: str, ref: Ref, write: bool = True) -> None:
        """Lightning's ``name`` now refers to ``ref``; its pointer is written at once."""
        with self._lock:
            old = self._aliases.paths.get(name)
            self._aliases.paths[name] = ref
            self._dirty = True
        if write:
            write_pointer(name, self.store_url, ref)
        if old is not None and old != ref:
            log.info("Lightning path %s now refers to %s step %d (was %s step %d)", name, *ref, *old)

    # -- CheckpointIO ----------------------------------------------------------------------
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Start saving ``checkpoint`` as step ``checkpoint["global_step"]``; returns after the host copy."""
        t0 = time.perf_counter()
        if storage_options is not None:
            raise ConfigError(f"TrainstoreCheckpointIO takes no storage_options (got {storage_options!r}): "
                              "configure the store with store_options=")
        if is_sharded(checkpoint):
            raise ConfigError(f"a sharded (DTensor) state reached TrainstoreCheckpointIO.save_checkpoint for {path}: "
                              "Lightning's FSDP / ModelParallelStrategy do not save through a CheckpointIO; use "
                              "trainstore's strategy (trainstore.integrations.lightning.trainstore_strategy)")
        name = norm_path(path)
        if "global_step" not in checkpoint and "://" not in name:
            write_tensor_file(name, checkpoint)  # the spawn launcher's hand-off of rank 0's weights
            return
        step = check_global_step(checkpoint, path)
        encoded = pyvalues.encode(checkpoint, self.allow_pickle_paths)
        digest = content_hash(encoded)
        ref, save = self.place(step, digest)
        if save:
            if not self.save_ref(ref, encoded, name, digest, LAYOUT_FULL):
                return
        del encoded
        self.name_path(name, ref)
        if self._torn_down:  # after fit: as durable as Lightning's own synchronous file, no thread left
            self.teardown()
        self.last_blocked_s = time.perf_counter() - t0

    def wait(self) -> None:
        """Every pending save of this plugin is committed (raises a failed one)."""
        with self._lock:
            mgrs = list(self._mgrs.values())
        for mgr in mgrs:
            mgr.wait()

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint a pointer file (or ``trainstore:latest`` / ``trainstore:<step>``) names.

        Tensors come back on the CPU (Lightning moves them to the module's device).
        ``weights_only`` is accepted and needs nothing: the format never unpickles.
        """
        if is_tensor_file(os.fspath(path)):
            return read_tensor_file(os.fspath(path))
        self.wait()  # saves of this process are visible before we pick one
        ref, last, why = self.resolve(path)
        result = self.restore(ref, last, None, LAYOUT_FULL)
        checkpoint = pyvalues.decode(result.state, self.allow_pickle_paths)
        if last and not os.fspath(path).startswith("trainstore:"):
            as_loaded_through(checkpoint, os.fspath(path))
        log.info("Lightning load of %s (%s): %s", path, why, result)
        if self._torn_down:
            self.teardown()
        return checkpoint

    def resolve(self, path: Any) -> tuple[Ref | None, bool, str]:
        """``(ref, last, why)`` of a load: ``ref`` None means the newest that verifies;
        ``last``: fall back to the newest that verifies if ``ref`` cannot be restored."""
        return resolve_path(os.fspath(path), self.job, self.owns_job)

    def restore(self, ref: Ref | None, last: bool, into: Any, layout: str) -> RestoreResult:
        """Restore ``ref`` (``last``: falling back to the newest that verifies), checking it was
        saved by this plugin in ``layout``."""
        result = None
        if ref is not None:
            mgr = self.manager_for(ref[0])
            if ref[1] not in mgr.steps():
                if not last:
                    raise NotFoundError(f"step {ref[1]} of job {ref[0]!r} is not in {mgr.store.url}: its save never "
                                        "committed (the process ended first) or retention removed it; resume "
                                        "from 'last' or 'trainstore:latest'")
            else:
                check_layout(mgr, ref[1], layout)
                try:
                    result = mgr.restore_with_info(ref[1], into=into)
                except (IntegrityError, NoValidCheckpointError) as exc:
                    if not last:
                        raise
                    log.warning("%s: falling back to the newest checkpoint that verifies", exc)
        if result is None:
            mgr = self.manager
            newest = mgr.latest_step()
            if newest is not None:
                check_layout(mgr, newest, layout)
            result = mgr.restore_with_info(None, into=into)
        self.last_restore = result
        return result

    def remove_checkpoint(self, path: Any) -> None:
        """Lightning no longer wants ``path``: delete its pointer, forget the alias; the
        checkpoint goes once no alias refers to it and a newer save has committed."""
        name = norm_path(path)
        with self._lock:
            ref = self._aliases.paths.pop(name, None)
            self._dirty = True
        remove_pointer(name)
        log.info("Lightning removed %s (%s)", name, ref)

    def teardown(self) -> None:
        """Wait for pending saves, apply removals, release the managers (reopened on next use)."""
        with self._lock:
            mgrs, self._mgrs = dict(self._mgrs), {}
            self._torn_down = True
        try:
            for mgr in mgrs.values():
                mgr.wait()  # raises a failed background save: then nothing is removed
            main = mgrs.get(self.job)
            if main is not None:
                self.sync(main)
        finally:
            for mgr in mgrs.values():
                mgr.close()

    # -- background: after each commit -----------------------------------------------------
    def _after_commit(self, info: CheckpointInfo, mgr: CheckpointManager) -> None:
        with self._lock:
            self._committed.add((mgr.job, info.step))
            main = self._mgrs.get(self.job)
        if main is not None:
            self.sync(main)

    def sync(self, mgr: CheckpointManager) -> None:
        """Record the aliases in the store and delete the checkpoints no alias refers to."""
        with self._lock:
            if not self._dirty:
                return
            live = self._aliases.live()
            dropped = {r for r in self._aliases.created if r not in live and r in self._committed}
            self._aliases.save(mgr.store)
            self._dirty = False
        variants = sorted(r for r in dropped if r[0] != self.job)
        for ref in variants:  # variants are full: nothing depends on them
            delete_checkpoint(mgr.store, *ref)
            self._forget(ref)
        main_dropped = frozenset(s for j, s in dropped if j == self.job)
        deleted = drop_unnamed(mgr.store, self.job, main_dropped, self.keep) if main_dropped else []
        for step in deleted:
            self._forget((self.job, step))
        if deleted or variants:
            with self._lock:
                self._aliases.save(mgr.store)
                self._dirty = False

    def _forget(self, ref: Ref) -> None:
        with self._lock:
            self._aliases.created.discard(ref)
            self._committed.discard(ref)
            self._hashes.pop(ref, None)
            self._dirty = True


__all__ = ["TrainstoreIOBase", "LATEST", "VARIANT"]
