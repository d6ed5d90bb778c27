"""``CheckpointManager``: save (async, incremental), list, verify and restore checkpoints.

    mgr = CheckpointManager("s3://bucket/prefix", job="run-1",
                            policy=CheckpointPolicy(full_every=1000, incremental_every=100))
    for step in range(...):
        ...
        if mgr.should_save(step):
            mgr.save(step, {"model": model.state_dict(), "optim": opt.state_dict()},
                     metrics={"val_loss": loss})      # returns after the host copy
    mgr.close()                                       # waits; raises background errors
    state = mgr.restore()                             # newest checkpoint that verifies
    print(mgr.last_restore)                           # which step, why, what was skipped

The manager owns what every save shares: the lock, the one in-flight save, background errors
(raised at the next ``save``/``wait``/``close``; ``on_error`` "warn"/"retry": ``failures``),
hooks and observers. The work is a save backend's (``backend``): ``single`` in one process,
``dcp`` in a torch.distributed job. A save copies the state to host buffers (the caller's
clock), one background thread writes and commits it. The backend that wrote a manifest loads it.

Reruns (``lineage``): a save reaching an existing step moves the later ones to ``abandoned/``;
``hooks(info, manager)`` run after each commit.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import blosc2  # noqa: F401 - with the manager, not a first save's or restore's clock (codecs._blosc)

from ..chunks import ChunkStore, RepairEvent
from ..codecs import CodecConfig
from ..errors import AlreadyExistsError, ConfigError
from ..gcpause import gc_paused
from ..provenance import code_version, manifest_fields
from ..store import open_store
from ..store.base import Store
from .backend import SaveBackend, SaveContext, backend_class, backend_name
from .format import lineage, manifest as mf
from .format.state import jsonable
from .listing import checkpoint_infos
from .recovery import nothing_restored, restore_result, restore_selected
from .restore.reader import SCRATCH_BYTES
from .restore.select import Selection
from .restore.verify import verify_steps
from .save import exit as exit_hooks
from .save.failures import SaveErrorPolicy, SaveFailures
from .save.inflight import InflightSaves
from .save.pool import lower_thread_priority
from .save.writer import WriteOptions
from .types import CheckpointInfo, CheckpointPolicy, CommitPoint, RestoreResult, SaveHandle

log = logging.getLogger("trainstore.checkpoint")


class CheckpointManager:
    """Saves and restores the checkpoints of one job in one store (see module docstring)."""

    def __init__(self, store: str | Store, job: str, policy: CheckpointPolicy | None = None, *,
                 options: WriteOptions | None = None, store_options: dict | None = None,
                 hooks: Sequence[Callable[[CheckpointInfo, CheckpointManager], None]] = (),
                 pin_memory: bool | None = None, read_workers: int = 4,
                 observers: Sequence[Callable[[str, dict], None]] = (),
                 on_error: str | SaveErrorPolicy = "raise", run: str | None = None,
                 backend: str | None = None) -> None:
        self.job = mf.check_job(job)
        # None: single or dcp per save (backend_name); "single": one process writes all (DDP rank 0)
        self._backend_choice = backend
        # a failed background save: "raise" at the next call, or "warn"/"retry" and save again soon
        self.failures = SaveFailures(self.job, SaveErrorPolicy.of(on_error))
        self.policy = policy or CheckpointPolicy()
        self.options = options or WriteOptions()
        self._owns_store = isinstance(store, str)
        self.store: Store = open_store(store, **(store_options or {})) if isinstance(store, str) else store
        # the run recorded in each manifest: given, continued from a restored head, or new
        self._lineage = lineage.RunLineage(self.store, self.job, run)
        self.repairs: list[RepairEvent] = []  # bad chunk copies this manager's reads repaired
        self.chunks = ChunkStore(self.store, codec=CodecConfig(self.options.codec, self.options.level,
                                                               self.options.codec_threads),
                                 on_repair=[self._repaired])
        self.hooks: list[Callable[[CheckpointInfo, CheckpointManager], None]] = list(hooks)
        # observers(event, fields): "save_staged", "save_committed", "save_failed", "restore",
        # "verify" - for metrics (trainstore.lifecycle.metrics); their errors are only logged
        self.observers: list[Callable[[str, dict], None]] = list(observers)
        if callable(getattr(self.policy, "observe", None)):  # e.g. ObjectivePolicy: learns save costs
            self.observers.append(self.policy.observe)
        self.read_workers = read_workers
        self.last_restore: RestoreResult | None = None
        self._context = SaveContext(self.store, self.job, self.policy, self.options, self.chunks, read_workers,
                                    pin_memory, self._notify)
        self._backends: dict[str, SaveBackend] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainstore-ckpt-save",
                                            initializer=lower_thread_priority, initargs=(self.options.nice,))
        self._saves = InflightSaves(self.job)
        self._lock = self._saves.lock
        self._closed = False
        self._provenance: Future[dict[str, str | None]] | None = None  # git: asked by the first save (_stage)
        backend_class(backend_name())  # the backend's import: now, not on the first save's clock
        exit_hooks.track(self)

    # -- policy ----------------------------------------------------------------------------
    def should_save(self, step: int) -> str | None:
        """None, "full" or "incremental" for ``step`` under the policy, or a failed save's kind
        to retry (``on_error``); asked every step (an ObjectivePolicy measures steps)."""
        for msg in self.failures.take_warnings():  # failures training continued through
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
        return self.policy.should_save(step) or self.failures.retry_kind(step)

    # -- saving ----------------------------------------------------------------------------
    def save(self, step: int, state: Any, metrics: dict | None = None, config: dict | None = None, *,
             blocking: bool = False, kind: str | None = None, extra: dict | None = None) -> SaveHandle:
        """Checkpoint ``state`` as ``step``. Returns once the state is copied to host buffers."""
        t0 = time.perf_counter()
        with gc_paused():  # checks + staging: one paused phase (gcpause); only a wait is outside
            admitted = self._admit(step, state, kind)
            if isinstance(admitted, SaveHandle):
                return admitted  # skipped
            backend, kind, busy = admitted
            if busy is None:
                handle = self._stage(backend, step, kind, state, metrics, config, extra, t0)
        if busy is not None:  # the previous save still runs: wait for it with the collector on
            self._wait_inflight()
            with gc_paused():
                handle = self._stage(backend, step, kind, state, metrics, config, extra, t0)
        del state  # the live tensors may change from here on
        if blocking:
            self._wait_inflight()
        return handle

    def _admit(self, step: int, state: Any, kind: str | None) -> SaveHandle | tuple[SaveBackend, str, int | None]:
        """The checks of ``save``: (backend, kind, the step still in flight) or a skipped handle."""
        self._check_open()
        self._saves.raise_queued()
        mf.check_step(step)
        kind = kind or self.should_save(step) or "full"
        if kind not in mf.KINDS:
            raise ConfigError(f"kind must be one of {mf.KINDS}, got {kind!r}")
        backend = self.backend
        backend.check_state(state)
        busy = self._saves.busy()
        if busy == step and not backend.collective:
            raise AlreadyExistsError(f"checkpoint step {step} of job {self.job!r} is being saved already")
        # "skip" must be one decision for every rank (a collective on the control group); "wait"
        # needs none: a busy rank waits for its own save, whose collectives the others finished
        if self.policy.on_busy == "skip" and backend.agree_busy(busy is not None):
            where = "some rank" if backend.collective else f"step {busy}"
            msg = f"checkpoint step {step} skipped: {where} is still being saved (on_busy='skip')"
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            log.warning(msg)
            return SaveHandle(step, kind, None, skipped=True)
        return backend, kind, busy

    def _stage(self, backend: SaveBackend, step: int, kind: str, state: Any, metrics: dict | None,
               config: dict | None, extra: dict | None, t0: float) -> SaveHandle:
        """Copy ``state`` to host buffers and hand the write to the save thread."""
        if not self._lineage.pending:  # else a rerun may reach existing steps: the save thread decides
            backend.check_free(step)
        metadata = {"config": jsonable(config or {}, "config"), "metrics": jsonable(metrics or {}, "metrics"),
                    "created": time.time(), "extra": jsonable(extra or {}, "extra")}
        staged = backend.stage(state)
        blocked = time.perf_counter() - t0
        ticket = self._lineage.saved(step)
        commit = CommitPoint()  # what the handle waits for
        if self._provenance is None:  # on the save thread once the copy is done (`git status` can take seconds)
            self._provenance = self._executor.submit(manifest_fields)
        fut = self._executor.submit(self._write, backend, step, kind, staged, metadata, ticket, commit, self._provenance)
        self._saves.start(step, fut)  # the save thread's whole work: the next save waits for it
        self._notify("save_staged", step=step, kind=kind, blocked_s=blocked)
        return SaveHandle(step, kind, commit.future, blocked_s=blocked)

    @property
    def run(self) -> str:
        """The run id this manager records in its manifests (``lineage``)."""
        return self._lineage.run

    def _follow_lineage(self, step: int, backend: SaveBackend, ticket: tuple[bool, int | None]) -> int | None:
        """Save thread: a save reaching an existing step rolls back or starts a fresh lineage
        (``lineage``); remote tiers are asked here, never on the caller's clock."""
        def abandoned(step: int, parent: int | None, moved: list[int]) -> None:
            backend.lineage_changed()
            self._notify("lineage", step=step, run=self.run, parent=parent, abandoned=moved)

        return self._lineage.follow(step, ticket, abandoned)

    def start_run(self, from_step: int | None = None, run: str | None = None) -> None:
        """Declare where the next saves continue from, for callers that load state by other
        means than ``restore``: ``from_step`` (a lineage step; None: a fresh run). The next
        save that reaches an existing step then rolls back (see ``lineage``)."""
        self._check_open()
        self._lineage.start(from_step, run)

    def reserve(self, state_or_template: Any, *, background: bool = False) -> None:
        """Allocate and touch the host staging buffers of saves of ``state_or_template`` now,
        off the training loop's clock (e.g. while the model is being built), so the first save
        copies into touched memory. A template is the state itself, meta tensors, or
        ``{name: (shape, dtype)}`` specs. ``background=True`` returns at once and touches on a
        thread; a save waits for it only if it still runs. Without it the first save copies
        into fresh memory (slower: first touch), which is also correct."""
        self._check_open()
        self.backend.reserve(state_or_template, background)

    @property
    def backend(self) -> SaveBackend:
        """The save backend of a save made now (``backend.backend_name``: single or dcp)."""
        return self._backend(self._backend_choice or backend_name())

    def _backend(self, name: str) -> SaveBackend:
        with self._lock:
            found = self._backends.get(name)
        if found is None:
            found = backend_class(name)(self._context)
            with self._lock:
                found = self._backends.setdefault(name, found)
        return found

    def _write(self, backend: SaveBackend, step: int, kind: str, staged: Any, metadata: dict,
               ticket: tuple[bool, int | None], commit: CommitPoint, provenance: Future[dict]) -> CheckpointInfo:
        """The save thread: the lineage check, the backend writes and commits (``commit``
        resolves there: the handle's durable point); then the work after the commit and the hooks."""
        try:
            parent = self._follow_lineage(step, backend, ticket)
            metadata = {**metadata, **provenance.result(), lineage.RUN_FIELD: self.run, lineage.PARENT_FIELD: parent}
            info = commit.resolve(backend.write(step, kind, staged, metadata, commit.resolve))
        except BaseException as exc:
            if commit.fail(exc):  # after the commit (best-effort work): the checkpoint stands
                log.error("work after the commit of checkpoint step %d (job %r) failed: %s", step, self.job, exc)
                if not backend.collective:  # (a collective one: see _run_hooks)
                    self._saves.fail(exc, step)
                raise
            self.failures.failed(step, kind, exc)
            tolerated = self.failures.policy.tolerates
            if not tolerated:
                self._saves.fail(exc, step)
            log.error("background checkpoint save of step %d (job %r) failed%s: %s", step, self.job,
                      f" (on_error={self.failures.policy.mode!r}: training continues)" if tolerated else "", exc)
            self._notify("save_failed", step=step, kind=kind, error=f"{type(exc).__name__}: {exc}",
                         tolerated=tolerated, consecutive=self.failures.consecutive)
            raise
        self.failures.committed(step, float(metadata["created"]))
        if backend.runs_hooks:  # DCP: retention, GC, tiering once per job, on the coordinator
            self._run_hooks(info, step, raise_later=not backend.collective)
        return info

    def _run_hooks(self, info: CheckpointInfo, step: int, raise_later: bool) -> None:
        for hook in self.hooks:
            try:
                started_work = hook(info, self)
                if raise_later and isinstance(started_work, Future):  # e.g. the durable copy: reported like a save
                    self._saves.follow(step, started_work)
            except Exception as exc:  # committed already; report, do not undo
                log.error("checkpoint hook %r failed after step %d was committed: %s", hook, step, exc)
                # collective backends only log: an error raised on the coordinator alone would
                # make it leave the next collective save while the other ranks enter it
                if raise_later:
                    self._saves.fail(exc, step)

    def _repaired(self, event: RepairEvent) -> None:
        """A read met a bad chunk copy and replaced it with a good one (``ChunkStore``)."""
        with self._lock:
            self.repairs.append(event)
        self._notify("repair", key=event.key, tier=event.store, source=event.source)

    def _notify(self, event: str, **fields: Any) -> None:
        for obs in self.observers:
            try:
                obs(event, {"job": self.job, **fields})
            except Exception as exc:  # noqa: BLE001 - monitoring never breaks a save
                log.warning("checkpoint observer %r failed on %s: %s", obs, event, exc)

    def _wait_inflight(self) -> None:
        self._saves.settle()
        self._saves.raise_queued()

    def wait(self) -> None:
        """Block until every in-flight save is committed and the work its hooks started (a
        tiered store's durable copy) is done; raise a background error if one failed."""
        self._wait_inflight()
        self._saves.settle_followups()
        self._saves.raise_queued()

    def pending(self) -> int | None:
        """The step being saved in the background, or None."""
        return self._saves.busy()

    def close(self) -> None:
        """Wait for pending saves, release buffers and the store (if opened here)."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._executor.shutdown(wait=True)
            for backend in self._backends.values():
                backend.close()
            exit_hooks.untrack(self)
            if self._owns_store:
                self.store.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError(f"checkpoint manager of job {self.job!r} is closed")

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- listing & verification ------------------------------------------------------------
    def steps(self) -> list[int]:
        """Committed steps of the current lineage, ascending (not the abandoned ones)."""
        return mf.list_steps(self.store, self.job)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def manifest(self, step: int) -> mf.Manifest:
        return mf.load_manifest(self.store, self.job, step)

    def list(self, abandoned: bool = False) -> list[CheckpointInfo]:
        """Every committed checkpoint, oldest first (unreadable manifests as status 'unreadable').
        On a tiered store, ``durable`` says whether a tier past the hot one holds it.
        ``abandoned``: also the steps rollbacks and reruns left behind (``abandoned=True``)."""
        return checkpoint_infos(self.store, self.job, abandoned)

    def verify(self, step: int | None = None, deep: bool = True) -> list[mf.VerifyRecord]:
        """Verify one step (or all); records each outcome in the store; returns the records."""
        steps = [mf.check_step(step)] if step is not None else self.steps()
        return verify_steps(self.chunks, self.job, steps, deep, self.read_workers, asked=step is not None,
                            notify=lambda rec: self._notify("verify", step=rec.step, ok=rec.ok, deep=deep,
                                                            errors=len(rec.errors)))

    # -- restoring -------------------------------------------------------------------------
    def restore(self, step: int | None = None, *, best: str | None = None, mode: str = "min",
                retry_bad: bool = False, only: str | Sequence[str] | None = None,
                reset: str | Sequence[str] | None = None) -> Any:
        """The state of the newest checkpoint that loads and verifies (or of ``step``/``best``).

        Sets ``last_restore`` (a ``RestoreResult``) saying which step was chosen and why.
        Raises ``NoCheckpointError`` when the job has none, ``NoValidCheckpointError`` (its
        base class) when none could be restored. ``only``/``reset``: load just these
        ``/``-joined state names / all but these (``select``); the rest is not read at all.
        """
        return self.restore_with_info(step, best=best, mode=mode, retry_bad=retry_bad, only=only, reset=reset).state

    def restore_into(self, state: Any, step: int | None = None, *, best: str | None = None, mode: str = "min",
                     retry_bad: bool = False, scratch_bytes: int = SCRATCH_BYTES, only: str | Sequence[str] | None = None,
                     reset: str | Sequence[str] | None = None) -> RestoreResult:
        """Restore into the tensors of ``state`` in place; returns the result.

        Transactional per candidate: ``state`` changes only once a checkpoint has been read
        and verified entirely, so a failed restore leaves it as it was (``reader.load_into``;
        ``scratch_bytes`` bounds the verified bytes held before they are copied in). With
        ``only``/``reset`` the entries left out stay as they are in ``state``.
        """
        return self.restore_with_info(step, best=best, mode=mode, retry_bad=retry_bad, into=state,
                                      scratch_bytes=scratch_bytes, only=only, reset=reset)

    def restore_with_info(self, step: int | None = None, *, best: str | None = None, mode: str = "min",
                          retry_bad: bool = False, into: Any = None, scratch_bytes: int = SCRATCH_BYTES,
                          only: str | Sequence[str] | None = None, reset: str | Sequence[str] | None = None) -> RestoreResult:
        """``restore`` / ``restore_into`` returning the ``RestoreResult`` (see module docstring).

        Only an integrity failure (``IntegrityError``: a corrupt, undecodable or missing chunk,
        an unreadable manifest, a missing base) skips a candidate and records it as bad; any
        other error (store unreachable, I/O error, out of memory, a target that does not match)
        is raised and leaves no record, so the checkpoint stays restorable.
        """
        self._check_open()
        with gc_paused():  # see gcpause: a fresh process's owed full collection, not the restore's
            t0 = time.perf_counter()
            repairs_before = len(self.repairs)
            if self.backend.collective:  # every rank's in-flight save has committed before steps are listed
                self._saves.settle()
            skipped: list[tuple[int, str]] = []
            found = restore_selected(self.chunks, self.job, self._backend, Selection.of(only, reset), into,
                                     scratch_bytes, step, best, mode, retry_bad, skipped)
            if found is None:
                self.last_restore = None
                self._notify("restore", ok=False, step=None, kind=None, seconds=time.perf_counter() - t0,
                             skipped=len(skipped), logical_bytes=0)
                raise nothing_restored(self.job, skipped)
            self._lineage.restored(m := found[0], found[4])  # found: (manifest, why, state, partial, newest)
            result = restore_result(self.store, self.job, found, skipped, time.perf_counter() - t0,
                                    self.repairs[repairs_before:])
            self._notify("restore", ok=True, step=m.step, kind=m.kind, seconds=result.seconds,
                         skipped=len(skipped), logical_bytes=m.logical_bytes)
            self.last_restore = result
            log.info("restore: %s", result)
            return result


__all__ = ["CheckpointManager", "CheckpointPolicy", "CheckpointInfo", "RestoreResult", "SaveHandle",
           "WriteOptions", "code_version"]
