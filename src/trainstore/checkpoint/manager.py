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

A save flattens the state (rejecting what would need pickle), copies it into a reusable
host arena (the only part on the caller's clock) and hands it to one background thread
that writes the chunks (``writer``) and commits the manifest last. The arena of the latest
full checkpoint is kept as the base for XOR deltas of the following incrementals, so an
incremental never reads the store. Errors of a background save are logged at once and
raised (``BackgroundError``) at the next ``save``/``wait``/``close``.

Pluggable: ``hooks`` are called as ``hook(info, manager)`` after each committed save (on the
background thread: retention, tiering, metrics export); all store access goes through the
``Store`` interface, so a tiered store can be passed instead of a URL.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..chunks import ChunkStore, RepairEvent
from ..codecs import CodecConfig
from ..errors import (
    AlreadyExistsError,
    BackgroundError,
    ConfigError,
    IntegrityError,
    ManifestError,
    NoCheckpointError,
    NotFoundError,
    NoValidCheckpointError,
    StoreUnavailableError,
    TrainstoreError,
)
from ..provenance import code_version, trainstore_version
from ..store import open_store
from ..store.base import Store
from . import manifest as mf
from .manifest import ChunkEntry, Manifest
from .reader import SCRATCH_BYTES, load_into, load_state
from .staging import Arena, StagedTensor, Stager, plan
from .state import flatten
from .types import CheckpointInfo, CheckpointPolicy, RestoreResult, SaveHandle
from .verify import record as record_verify, verify_manifest
from .writer import WriteOptions, WriteStats, lower_thread_priority, write_tensors

log = logging.getLogger("trainstore.checkpoint")

_BASE_MISSING = object()


class CheckpointManager:
    """Saves and restores the checkpoints of one job in one store (see module docstring)."""

    def __init__(self, store: str | Store, job: str, policy: CheckpointPolicy | None = None, *,
                 options: WriteOptions | None = None, store_options: dict | None = None,
                 hooks: Sequence[Callable[[CheckpointInfo, CheckpointManager], None]] = (),
                 pin_memory: bool | None = None, read_workers: int = 4,
                 observers: Sequence[Callable[[str, dict], None]] = ()) -> None:
        self.job = mf.check_job(job)
        self.policy = policy or CheckpointPolicy()
        self.options = options or WriteOptions()
        self._owns_store = isinstance(store, str)
        self.store: Store = open_store(store, **(store_options or {})) if isinstance(store, str) else store
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
        self._stager = Stager(pin_memory)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainstore-ckpt-save",
                                            initializer=lower_thread_priority, initargs=(self.options.nice,))
        self._lock = threading.Lock()
        self._inflight: tuple[int, Future] | None = None
        self._error: BaseException | None = None
        self._error_step: int | None = None
        self._followups: list[tuple[int, Future]] = []  # (step, work a hook started): durable copies
        self._base: Manifest | None = None  # last full checkpoint committed by this manager
        self._base_views: dict[str, memoryview] | None = None
        self._base_arena: Arena | None = None
        self._closed = False
        self._code_version = code_version()
        _live_managers.add(self)

    # -- policy ----------------------------------------------------------------------------
    def should_save(self, step: int) -> str | None:
        """None, "full" or "incremental" for ``step`` under the policy."""
        return self.policy.should_save(step)

    # -- saving ----------------------------------------------------------------------------
    def save(self, step: int, state: Any, metrics: dict | None = None, config: dict | None = None, *,
             blocking: bool = False, kind: str | None = None, extra: dict | None = None) -> SaveHandle:
        """Checkpoint ``state`` as ``step``. Returns once the state is copied to host buffers."""
        t0 = time.perf_counter()
        self._check_open()
        self._raise_background()
        mf.check_step(step)
        kind = kind or self.policy.should_save(step) or "full"
        if kind not in mf.KINDS:
            raise ConfigError(f"kind must be one of {mf.KINDS}, got {kind!r}")
        if _distributed_job():  # torch.distributed job: DCP underneath (trainstore.dcp.bridge)
            from ..dcp.bridge import save_distributed

            metadata = {"config": _jsonable(config or {}, "config"), "metrics": _jsonable(metrics or {}, "metrics"),
                        "created": time.time(), "code_version": self._code_version, "trainstore_version": trainstore_version(),
                        "extra": _jsonable(extra or {}, "extra")}
            return save_distributed(self, step, kind, state, metadata, blocking, t0)
        with self._lock:
            busy = self._inflight
        if busy is not None and not busy[1].done():
            if busy[0] == step:
                raise AlreadyExistsError(f"checkpoint step {step} of job {self.job!r} is being saved already")
            if self.policy.on_busy == "skip":
                msg = f"checkpoint step {step} skipped: step {busy[0]} is still being saved (on_busy='skip')"
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                log.warning(msg)
                return SaveHandle(step, kind, None, skipped=True)
            self._wait_inflight()
        fast = self.store.tiers()[0]  # remote tiers are asked in the background (_write)
        if fast.capabilities.local and fast.exists(mf.manifest_key(self.job, step)):
            raise AlreadyExistsError(f"checkpoint step {step} of job {self.job!r} already exists in {fast.url}")
        metadata = {"config": _jsonable(config or {}, "config"), "metrics": _jsonable(metrics or {}, "metrics"),
                    "created": time.time(), "code_version": self._code_version, "trainstore_version": trainstore_version(),
                    "extra": _jsonable(extra or {}, "extra")}
        skeleton, leaves = flatten(state)
        _offsets, total = plan(leaves)
        arena = self._stager.acquire(total)
        try:
            staged = self._stager.stage(leaves, arena)
        except BaseException:
            self._stager.release(arena)
            raise
        del leaves  # the live tensors may change from here on
        blocked = time.perf_counter() - t0
        fut = self._executor.submit(self._write, step, kind, skeleton, staged, arena, metadata)
        with self._lock:
            self._inflight = (step, fut)
        handle = SaveHandle(step, kind, fut, blocked_s=blocked)
        self._notify("save_staged", step=step, kind=kind, blocked_s=blocked)
        if blocking:
            self._wait_inflight()
        return handle

    def _base_for(self, kind: str, step: int) -> Manifest | None:
        """The full checkpoint an incremental ``step`` diffs against (background thread: it
        may ask remote tiers). Only a base in the store's write view counts (not one only in
        an archive), so the incremental never needs the archive to become durable."""
        if kind != "incremental":
            return None
        live = self.store.write_view()
        if self._base is not None and self._base.step < step and live.exists(self._base.key):
            return self._base
        # a fresh process (or the base was deleted): the newest full checkpoint before step
        for s in reversed(mf.list_steps(live, self.job)):
            if s >= step:
                continue
            try:
                m = mf.load_manifest(live, self.job, s)
            except TrainstoreError:
                continue
            if m.kind == "full":
                self._set_base(m, None, None)
                return m
        return None

    def _set_base(self, m: Manifest, views: dict[str, memoryview] | None, arena: Arena | None) -> None:
        old = self._base_arena
        self._base, self._base_views, self._base_arena = m, views, arena
        if old is not None and old is not arena:
            self._stager.release(old)

    def _write(self, step: int, kind: str, skeleton: Any, staged: list[StagedTensor], arena: Arena,
               metadata: dict) -> CheckpointInfo:
        keep_arena = False
        started = time.time()
        try:
            if self.store.exists(mf.manifest_key(self.job, step)):
                raise AlreadyExistsError(f"checkpoint step {step} of job {self.job!r} already exists in {self.store.url}")
            base = self._base_for(kind, step)
            if kind == "incremental" and base is None:
                log.info("step %d: no full checkpoint to diff against, saving a full checkpoint", step)
                kind = "full"
            lookup = self._lookup(base) if base is not None else None
            entries, stats = write_tensors(self.chunks, staged, self.options, lookup)
            m = Manifest(job=self.job, step=step, kind=kind, tensors=entries, skeleton=skeleton,
                         base_step=base.step if base is not None else None, chunk_bytes=self.options.chunk_bytes,
                         metadata=metadata, logical_bytes=stats.logical_bytes, stored_bytes=stats.stored_bytes,
                         written_bytes=stats.written_bytes)
            # gc-safe commit: a lease on m's chunks, re-checked against concurrent gc sweeps
            from ..lifecycle.gc import commit_lease

            with commit_lease(self.store, self.chunks, m, {t.name: t.data for t in staged}, started):
                mf.commit_manifest(self.store, m)  # last: the checkpoint exists from here on
            _log_saved(m, stats)
            self._notify("save_committed", step=step, kind=kind, seconds=time.time() - started,
                         since_created=time.time() - float(metadata["created"]), logical_bytes=stats.logical_bytes,
                         stored_bytes=stats.stored_bytes, written_bytes=stats.written_bytes, pieces=stats.pieces,
                         same_as_base=stats.same_as_base, deltas=stats.deltas)
            if kind == "full":
                if self.policy.keep_base_in_memory and self.policy.incremental_every:
                    self._set_base(m, {t.name: t.data for t in staged}, arena)
                    keep_arena = True
                else:
                    self._set_base(m, None, None)
            info = CheckpointInfo.from_manifest(m, durable=len(self.store.tiers()) == 1)  # tiered: copy pending
        except BaseException as exc:
            with self._lock:
                if self._error is None:
                    self._error, self._error_step = exc, step
            log.error("background checkpoint save of step %d (job %r) failed: %s", step, self.job, exc)
            self._notify("save_failed", step=step, kind=kind, error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if not keep_arena:
                self._stager.release(arena)
        for hook in self.hooks:
            try:
                started_work = hook(info, self)
                if isinstance(started_work, Future):  # e.g. the durable copy: reported like a save
                    with self._lock:
                        self._followups.append((step, started_work))
            except Exception as exc:  # committed already; report, do not undo
                with self._lock:
                    if self._error is None:
                        self._error, self._error_step = exc, step
                log.error("checkpoint hook %r failed after step %d was committed: %s", hook, step, exc)
        return info

    def _lookup(self, base: Manifest):  # noqa: ANN202 - see writer.BaseLookup
        views = self._base_views if (self._base is base and self._base_views is not None) else None
        chunk_bytes = base.chunk_bytes
        if chunk_bytes != self.options.chunk_bytes:
            return None

        def lookup(name: str, dtype: str, idx: int, size: int) -> tuple[ChunkEntry, Callable[[], memoryview]] | None:
            t = base.tensors.get(name)
            if t is None or t.dtype != dtype or idx >= len(t.chunks) or t.chunks[idx].size != size:
                return None
            entry = t.chunks[idx]
            if views is not None and name in views:
                start = idx * chunk_bytes
                return entry, lambda: views[name][start:start + size]
            return entry, lambda: memoryview(self.chunks.get(entry.ref))

        return lookup

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
        with self._lock:
            busy = self._inflight
        if busy is not None:
            try:
                busy[1].result()
            except BaseException:
                pass
        self._raise_background()

    def _raise_background(self) -> None:
        """Raise the first failure of a background save, else of work a hook started after a
        commit (a durable copy); each failure is raised once."""
        with self._lock:
            exc, step = self._error, self._error_step
            self._error = self._error_step = None
            failed = None
            if exc is None:
                done = [(s, f) for s, f in self._followups if f.done()]
                failed = next(((s, f) for s, f in done if f.exception() is not None), None)
                drop = {id(f) for s, f in done if f.exception() is None} | ({id(failed[1])} if failed else set())
                self._followups = [(s, f) for s, f in self._followups if id(f) not in drop]
        if exc is not None:
            raise BackgroundError(f"background checkpoint save of step {step} (job {self.job!r}) failed: "
                                  f"{type(exc).__name__}: {exc}") from exc
        if failed is not None:
            cause = failed[1].exception()
            raise BackgroundError(f"after checkpoint step {failed[0]} of job {self.job!r} was committed: "
                                  f"{cause}") from cause

    def _wait_followups(self) -> None:
        with self._lock:
            pending = [f for _s, f in self._followups]
        for f in pending:
            try:
                f.result()
            except BaseException:  # noqa: BLE001 - raised by _raise_background
                pass

    def wait(self) -> None:
        """Block until every in-flight save is committed and the work its hooks started (a
        tiered store's durable copy) is done; raise a background error if one failed."""
        self._wait_inflight()
        self._wait_followups()
        self._raise_background()

    def pending(self) -> int | None:
        """The step being saved in the background, or None."""
        with self._lock:
            busy = self._inflight
        return busy[0] if busy is not None and not busy[1].done() else None

    def close(self) -> None:
        """Wait for pending saves, release buffers and the store (if opened here)."""
        if self._closed:
            return
        try:
            self._wait_inflight()
            self._wait_followups()
            self._raise_background()
        finally:
            self._closed = True
            self._executor.shutdown(wait=True)
            self._base_views = None
            self._base_arena = None
            _live_managers.discard(self)
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
        """Committed steps, ascending."""
        return mf.list_steps(self.store, self.job)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def manifest(self, step: int) -> Manifest:
        return mf.load_manifest(self.store, self.job, step)

    def list(self) -> list[CheckpointInfo]:
        """Every committed checkpoint, oldest first (unreadable manifests as status 'unreadable').
        On a tiered store, ``durable`` says whether a tier past the hot one holds it."""
        out = []
        tiers = self.store.tiers()
        beyond_hot = {s for t in tiers[1:] for s in mf.list_steps(t, self.job)}
        for step in self.steps():
            durable = len(tiers) == 1 or step in beyond_hot
            try:
                m = self.manifest(step)
            except NotFoundError:
                continue
            except TrainstoreError as exc:
                if isinstance(exc, StoreUnavailableError):
                    raise
                out.append(CheckpointInfo(step, "?", None, 0.0, {}, {}, 0, 0, 0, 0, "unreadable", None, (str(exc),),
                                          durable=durable))
                continue
            out.append(CheckpointInfo.from_manifest(m, mf.load_verify_record(self.store, self.job, step), durable))
        return out

    def verify(self, step: int | None = None, deep: bool = True) -> list[mf.VerifyRecord]:
        """Verify one step (or all); records each outcome in the store; returns the records."""
        steps = [mf.check_step(step)] if step is not None else self.steps()
        records = []
        for s in steps:
            try:
                m = self.manifest(s)
            except IntegrityError as exc:  # only integrity failures are recorded as bad
                m, rec = None, mf.new_verify_record(s, deep, [f"manifest: {exc}"], 0)
            except NotFoundError:
                if step is not None or self.store.exists(mf.manifest_key(self.job, s)):
                    raise NotFoundError(f"no checkpoint step {s} for job {self.job!r}") from None
                continue  # deleted since it was listed
            if m is not None:
                rec = verify_manifest(self.chunks, m, deep=deep, workers=self.read_workers)
            record_verify(self.chunks, self.job, rec)
            self._notify("verify", step=s, ok=rec.ok, deep=deep, errors=len(rec.errors))
            if not rec.ok:
                log.warning("checkpoint step %d of job %r failed verification: %s", s, self.job, "; ".join(rec.errors[:3]))
            records.append(rec)
        return records

    # -- restoring -------------------------------------------------------------------------
    def restore(self, step: int | None = None, *, best: str | None = None, mode: str = "min",
                retry_bad: bool = False) -> Any:
        """The state of the newest checkpoint that loads and verifies (or of ``step``/``best``).

        Sets ``last_restore`` (a ``RestoreResult``) saying which step was chosen and why.
        Raises ``NoCheckpointError`` when the job has none, ``NoValidCheckpointError`` (its
        base class) when none could be restored.
        """
        return self.restore_with_info(step, best=best, mode=mode, retry_bad=retry_bad).state

    def restore_into(self, state: Any, step: int | None = None, *, best: str | None = None, mode: str = "min",
                     retry_bad: bool = False, scratch_bytes: int = SCRATCH_BYTES) -> RestoreResult:
        """Restore into the tensors of ``state`` in place; returns the result.

        Transactional per candidate: ``state`` changes only once a checkpoint has been read
        and verified entirely, so a failed restore leaves it as it was (``reader.load_into``;
        ``scratch_bytes`` bounds the verified bytes held before they are copied in).
        """
        return self.restore_with_info(step, best=best, mode=mode, retry_bad=retry_bad, into=state,
                                      scratch_bytes=scratch_bytes)

    def restore_with_info(self, step: int | None = None, *, best: str | None = None, mode: str = "min",
                          retry_bad: bool = False, into: Any = None, scratch_bytes: int = SCRATCH_BYTES) -> RestoreResult:
        """``restore`` / ``restore_into`` returning the ``RestoreResult`` (see module docstring).

        Only an integrity failure (``IntegrityError``: a corrupt, undecodable or missing chunk,
        an unreadable manifest, a missing base) skips a candidate and records it as bad; any
        other error (store unreachable, I/O error, out of memory, a target that does not match)
        is raised and leaves no record, so the checkpoint stays restorable.
        """
        self._check_open()
        t0 = time.perf_counter()
        repairs_before = len(self.repairs)
        if _distributed_job():  # every rank's in-flight save has committed before steps are listed
            from ..dcp.bridge import settle

            settle(self)
        if step is not None and best is not None:
            raise ConfigError("pass either step= or best=, not both")
        if mode not in ("min", "max"):
            raise ConfigError(f"mode must be 'min' or 'max', got {mode!r}")
        skipped: list[tuple[int, str]] = []
        if step is not None:
            mf.check_step(step)
            if not self.store.exists(mf.manifest_key(self.job, step)):
                raise NotFoundError(f"no checkpoint step {step} for job {self.job!r} in {self.store.url} "
                                    f"(committed: {self.steps()[-10:]})")
            order = [(step, f"step {step} was asked for")]
            retry_bad = True
        else:
            steps = self.steps()
            if not steps:
                raise NoCheckpointError(f"job {self.job!r} has no checkpoints in {self.store.url}")
            order = self._best_order(steps, best, mode, skipped) if best is not None \
                else [(s, "newest checkpoint that verifies") for s in reversed(steps)]
        for s, why in order:
            if not retry_bad:
                rec = mf.load_verify_record(self.store, self.job, s)
                if rec is not None and not rec.ok:
                    reason = f"verification recorded it as bad: {'; '.join(rec.errors[:2])}"
                    skipped.append((s, reason))
                    log.warning("restore: skipping step %d of job %r: %s", s, self.job, reason)
                    continue
            try:
                m = self.manifest(s)
                self._check_base(m)
                if m.metadata.get("dcp"):  # saved through torch.distributed.checkpoint
                    from ..dcp.bridge import load_dcp

                    state = load_dcp(self, m, into)
                else:
                    state = load_state(self.chunks, m, self.read_workers) if into is None \
                        else load_into(self.chunks, m, into, self.read_workers, scratch_bytes)
            except IntegrityError as exc:  # the checkpoint itself is bad: record it, try an older one
                if step is not None:
                    raise
                reason = f"{type(exc).__name__}: {exc}"
                skipped.append((s, reason))
                log.warning("restore: skipping step %d of job %r: %s", s, self.job, reason)
                record_verify(self.chunks, self.job, mf.new_verify_record(s, False, [reason], 0))
                continue
            except NotFoundError:
                if step is not None or self.store.exists(mf.manifest_key(self.job, s)):
                    raise
                skipped.append((s, "deleted while restoring"))  # e.g. by retention: not bad
                continue
            if skipped and why.startswith("newest"):
                why = f"newest checkpoint that verifies ({len(skipped)} newer skipped)"
            result = RestoreResult(s, m.kind, why, skipped, state, time.perf_counter() - t0,
                                   repairs=self.repairs[repairs_before:])
            self._notify("restore", ok=True, step=s, kind=m.kind, seconds=result.seconds, skipped=len(skipped),
                         logical_bytes=m.logical_bytes)
            self.last_restore = result
            log.info("restore: %s", result)
            return result
        self.last_restore = None
        self._notify("restore", ok=False, step=None, kind=None, seconds=time.perf_counter() - t0,
                     skipped=len(skipped), logical_bytes=0)
        raise NoValidCheckpointError(
            f"no checkpoint of job {self.job!r} could be restored; tried: "
            + "; ".join(f"step {s}: {why}" for s, why in skipped)
        )

    def _check_base(self, m: Manifest) -> None:
        """An incremental's base must exist and be full: else the incremental is bad (ManifestError)."""
        if m.kind == "incremental":
            try:
                base = self.manifest(m.base_step)  # type: ignore[arg-type]
            except NotFoundError:
                raise ManifestError(f"base full checkpoint step {m.base_step} of incremental step {m.step} "
                                    "is missing") from None
            if base.kind != "full":
                raise ManifestError(f"base step {m.base_step} of step {m.step} is not a full checkpoint")

    def _best_order(self, steps: list[int], metric: str, mode: str,
                    skipped: list[tuple[int, str]]) -> list[tuple[int, str]]:
        scored, seen = [], set()
        for s in steps:
            try:
                m = self.manifest(s)
            except IntegrityError as exc:
                skipped.append((s, f"unreadable manifest: {exc}"))
                continue
            except NotFoundError:
                if self.store.exists(mf.manifest_key(self.job, s)):
                    raise
                continue  # deleted since it was listed
            seen.update(m.metrics)
            v = m.metrics.get(metric)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                scored.append((v, s))
        if not scored:
            raise ConfigError(f"no checkpoint of job {self.job!r} records metric {metric!r}; "
                              f"metrics recorded: {sorted(seen) or 'none'}")
        scored.sort(key=lambda p: (p[0] if mode == "min" else -p[0], -p[1]))
        return [(s, f"best {metric}={v} ({mode})") for v, s in scored]


def _distributed_job() -> bool:
    """True inside a multi-rank torch.distributed job (saves then go through trainstore.dcp)."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is optional
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _jsonable(obj: Any, what: str) -> Any:
    import json

    try:
        return json.loads(json.dumps(obj, allow_nan=False, default=_json_default))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"checkpoint {what} must be JSON-serialisable: {exc}") from None


def _json_default(x: Any) -> Any:
    try:
        import numpy as np

        if isinstance(x, np.generic):
            return x.item()
    except ImportError:  # pragma: no cover
        pass
    if hasattr(x, "item") and callable(x.item) and getattr(x, "numel", lambda: 0)() == 1:
        return x.item()  # a 0-d torch tensor (loss.detach())
    raise TypeError(f"{type(x).__name__} is not JSON serialisable")


def _log_saved(m: Manifest, stats: WriteStats) -> None:
    log.info("checkpoint %s step %d (%s): %d tensors, %.1f MB logical, %.1f MB stored, %.1f MB written, "
             "%d/%d pieces same as base, %d deltas", m.job, m.step, m.kind, len(m.tensors), stats.logical_bytes / 1e6,
             stats.stored_bytes / 1e6, stats.written_bytes / 1e6, stats.same_as_base, stats.pieces, stats.deltas)


# -- interpreter exit: finish or report pending saves ---------------------------------------
_live_managers: weakref.WeakSet[CheckpointManager] = weakref.WeakSet()


def _finish_at_exit() -> None:
    for mgr in list(_live_managers):
        pending = mgr.pending()
        try:
            if pending is not None:
                log.warning("interpreter exit: waiting for checkpoint step %d of job %r", pending, mgr.job)
            mgr.close()
        except BaseException as exc:  # noqa: BLE001 - report, never raise at exit
            log.error("trainstore: checkpoint save of job %r did not complete at exit: %s", mgr.job, exc)


# Run before concurrent.futures shuts its pools down at interpreter exit (threading's exit
# hooks run in reverse order of registration and concurrent.futures registered at import),
# so a pending save can still use its thread pool; plain atexit as a fallback.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_finish_at_exit)
else:  # pragma: no cover
    atexit.register(_finish_at_exit)

__all__ = ["CheckpointManager", "CheckpointPolicy", "CheckpointInfo", "RestoreResult", "SaveHandle",
           "WriteOptions", "code_version"]
