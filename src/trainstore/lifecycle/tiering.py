"""Tiering: a hot tier (local directory), a durable tier (object store), an optional archive.

    tiers = Tiering("/nvme/ckpt", "s3://bucket/run", durable_options={...},
                    policy=TierPolicy(hot_keep_last=2, archive_after="30d"), archive="s3://cold/run")
    mgr = tiers.manager("run-1")          # a CheckpointManager on the tiered store
    ...                                   # saves commit to hot; copies to durable run behind
    tiers.wait(); tiers.status("run-1")   # hot / durable / archived, created->ready->durable times

* A save is **restore-ready** once its manifest is committed in the hot tier.
* The manager's post-commit hook queues a **durable copy** (background thread): chunks the
  durable tier lacks, then the manifest with a conditional create, then a tier record
  ``jobs/<job>/checkpoints/<step>/tier.json`` (created, restore_ready_at, durable_at).
* A durable tier that is down does not stop training (``backlog``): a copy failing with a
  store error is retried with backoff, later copies wait in order behind it, retention keeps
  every hot checkpoint that has no durable copy, and ``backlog_status`` / metrics / logs say
  how far behind the durable tier is. Only a limit the user set stops training (raised at
  the next save): ``durable_rpo`` or ``max_hot_backlog_bytes``. ``retry_durable=False``
  reports the first failed copy at the next save instead (the behaviour before the backlog).
* After each copy, checkpoints past the hot rule (``hot_keep_last``, ``hot_max_age``) that
  are durable are **evicted** from hot, and hot chunks nothing references any more are
  collected (the gc protocol keeps concurrent saves safe).
* ``archive()`` moves durable full checkpoints older than ``archive_after`` to the archive.
* ``TieredStore`` (``trainstore.store.tiered``, in write-back mode here) reads hot, else
  durable, else archive: restore is transparent.

GC leases (``checkpoint.save.lease``): a save leases its chunks in hot only (the tier it commits
in; its chunks are all in hot), so a durable tier that is full or down never fails a save -
the copy fails, is reported, and ``sync`` copies later. The durable copy takes its own lease
on the destination tier (``CopyLease``) before it looks at which chunks are there, and drops
it after the manifest commit, so a durable gc never takes a chunk the copy relies on.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..checkpoint.format import manifest as mf
from ..chunks import RepairEvent
from ..durations import parse_duration
from ..errors import (
    BackgroundError,
    ConfigError,
    NotFoundError,
    StoreError,
    TrainstoreError,
)
from ..store import open_store
from ..store.base import Store
from ..store.tiered import TieredStore
from .backlog import BacklogStatus, DurableBacklog
from .deletion import delete_checkpoint
from .gc import GcOptions, collect_garbage
from .tiercopy import copy_checkpoint

log = logging.getLogger("trainstore.lifecycle.tiering")
TIER_NAME = "tier.json"


@dataclass(frozen=True)
class TierPolicy:
    """Which checkpoints stay hot and which are archived. Durations: seconds or ``"30d"``."""

    hot_keep_last: int = 2  # newest checkpoints kept in the hot tier (bases of kept incrementals too)
    hot_max_age: float | str | None = None  # evict hot checkpoints older than this even if among the last
    archive_after: float | str | None = None  # move durable full checkpoints older than this to the archive
    evict_after_copy: bool = True  # evict (and collect hot chunks) after each durable copy
    hot_gc_grace: float | str = "10m"  # hot chunks younger than this survive eviction's gc (in-flight saves)
    retry_durable: bool = True  # retry a durable copy that fails with a store error (an outage), training goes on
    retry_backoff: float | str = 1.0  # first retry delay, doubled per failed attempt ...
    retry_backoff_max: float | str = "1m"  # ... up to this
    durable_rpo: float | str | None = None  # stop training once a checkpoint waits longer for its durable copy
    max_hot_backlog_bytes: int | None = None  # stop training once more bytes than this wait in hot for a copy

    def __post_init__(self) -> None:
        if not isinstance(self.hot_keep_last, int) or self.hot_keep_last < 1:
            raise ConfigError(f"hot_keep_last must be a positive int, got {self.hot_keep_last!r}")
        for name in ("retry_backoff", "retry_backoff_max"):
            value = parse_duration(getattr(self, name), name)
            if value is None or value <= 0:
                raise ConfigError(f"{name} must be a positive duration, got {getattr(self, name)!r}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "durable_rpo", parse_duration(self.durable_rpo, "durable_rpo"))
        b = self.max_hot_backlog_bytes
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
            raise ConfigError(f"max_hot_backlog_bytes must be None or a positive int, got {b!r}")
        object.__setattr__(self, "hot_max_age", parse_duration(self.hot_max_age, "hot_max_age"))
        object.__setattr__(self, "archive_after", parse_duration(self.archive_after, "archive_after"))
        object.__setattr__(self, "hot_gc_grace", parse_duration(self.hot_gc_grace, "hot_gc_grace"))


@dataclass(frozen=True)
class TierStatus:
    """Where one checkpoint is, and how long it took to get there."""

    step: int
    kind: str
    hot: bool
    durable: bool
    archived: bool
    created: float
    restore_ready_s: float | None  # created -> committed in hot
    durable_s: float | None  # created -> copied to durable

    @property
    def tiers(self) -> str:
        return "/".join(n for n, on in (("hot", self.hot), ("durable", self.durable), ("archived", self.archived)) if on)

    def to_json(self) -> dict:
        return {**self.__dict__, "tiers": self.tiers}


def _tier_key(job: str, step: int) -> str:
    return mf.step_prefix(job, step) + TIER_NAME


class Tiering:
    """Hot/durable/archive tiers for the checkpoints of any number of jobs (see module doc)."""

    def __init__(self, hot: str | Store, durable: str | Store, *, archive: str | Store | None = None,
                 policy: TierPolicy | None = None, durable_options: dict | None = None,
                 archive_options: dict | None = None, workers: int = 4,
                 observers: Sequence[Callable[[str, dict], None]] = (),
                 clock: Callable[[], float] = time.time) -> None:
        self.hot = open_store(hot)
        self.durable = open_store(durable, **(durable_options or {}))
        self.archive_store = open_store(archive, **(archive_options or {})) if archive is not None else None
        # write-back: saves commit to hot (restore-ready fast); copies to durable run behind
        self.store = TieredStore(self.hot, self.durable, self.archive_store, write_back=True)
        self.policy = policy or TierPolicy()
        self.workers = workers
        self.observers = list(observers)
        self._job_observers: dict[Any, list[Callable[[str, dict], None]]] = {}  # job -> its manager's observers
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainstore-tier")
        self._pending: list[Future] = []
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []
        p = self.policy
        self.backlog = DurableBacklog(p.durable_rpo, p.max_hot_backlog_bytes, p.retry_backoff,  # type: ignore[arg-type]
                                      p.retry_backoff_max, clock, self._notify)  # type: ignore[arg-type]

    # -- integration with CheckpointManager -------------------------------------------------
    def manager(self, job: str, **kw: Any) -> Any:
        """A ``CheckpointManager`` for ``job`` on the tiered store, with the copy hook."""
        from ..checkpoint.manager import CheckpointManager

        hooks = [self.hook, self.limits_hook, *kw.pop("hooks", ())]
        return CheckpointManager(self.store, job, hooks=hooks, **kw)

    def hook(self, info: Any, manager: Any) -> Future:
        """Post-commit hook: record restore-ready, queue the durable copy. Returns its future:
        the manager reports a failed copy at its next ``save``/``wait``/``close`` and waits
        for the copy in ``wait``/``close`` (its checkpoints are durable when they return).
        A durable outage is retried in the background (``limits_hook`` stops training)."""
        ready = time.time()
        self._job_observers[manager.job] = [o for o in manager.observers if o not in self.observers]
        self.backlog.add(manager.job, info.step, info.stored_bytes)
        fut = self._pool.submit(self._copy_and_evict, manager.job, info.step, info.created, ready)
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [fut]
        return fut

    def limits_hook(self, info: Any, manager: Any) -> None:
        """Post-commit hook after ``hook``: raise ``DurabilityLimitError`` (at the manager's
        next save) when the durable backlog breaches a limit the user set."""
        if self.policy.retry_durable:
            self.backlog.check_limits(manager.job)

    def backlog_status(self, job: str | None = None) -> BacklogStatus:
        """How far behind the durable tier is (checkpoints, bytes, lag, failing copies)."""
        return self.backlog.status(job)

    def _copy(self, job: str, step: int, created: float, ready: float) -> None:
        """The durable copy; a store error (an outage, a full bucket) is retried with backoff
        while ``retry_durable``: later copies wait behind it, so they resume in order."""
        while True:
            try:
                self.make_durable(job, step, created=created, restore_ready_at=ready)
                return
            except StoreError as exc:
                if not self.policy.retry_durable or isinstance(exc, NotFoundError):
                    raise
                if not self.backlog.sleep(self.backlog.failed(job, step, exc)):
                    raise BackgroundError(f"tiering closed while the durable copy of step {step} of job {job!r} "
                                          f"was failing ({self.backlog.status(job)}); `trainstore ckpt tier sync` "
                                          "copies it later") from exc

    def _copy_and_evict(self, job: str, step: int, created: float, ready: float) -> None:
        try:
            self._copy(job, step, created, ready)
            self.backlog.done(job, step)
        except NotFoundError as exc:
            if not self.hot.exists(mf.manifest_key(job, step)):
                log.info("tiering: step %d of job %r was deleted (retention) before its durable copy", step, job)
                self.backlog.done(job, step)
                return
            self._failed(BackgroundError(f"durable copy of step {step} of job {job!r} to the durable tier "
                                         f"({self.durable.url}) failed: {type(exc).__name__}: {exc}"), exc)
        except BaseException as exc:
            self._failed(BackgroundError(f"durable copy of step {step} of job {job!r} to the durable tier "
                                         f"({self.durable.url}) failed: {type(exc).__name__}: {exc}"), exc)
        if not self.policy.evict_after_copy:
            return
        try:
            self.evict(job)
        except BaseException as exc:  # step is durable; the hot tier keeps more than the rule says
            self._failed(BackgroundError(f"eviction from the hot tier ({self.hot.url}) after the durable copy of "
                                         f"step {step} of job {job!r} failed: {type(exc).__name__}: {exc}"), exc)

    def _failed(self, error: BackgroundError, cause: BaseException) -> None:
        log.error("tiering: %s", error)
        with self._lock:
            self._errors.append(error)
        raise error from cause

    def make_durable(self, job: str, step: int, *, created: float | None = None,
                     restore_ready_at: float | None = None) -> TierStatus:
        """Copy ``job``@``step`` from hot to durable and mark it durable there."""
        if created is None or restore_ready_at is None:
            m = mf.load_manifest(self.hot, job, step)
            created = m.created if created is None else created
            restore_ready_at = restore_ready_at or self.hot.head(mf.manifest_key(job, step)).mtime or created
        copied = copy_checkpoint(self.hot, self.durable, job, step, self.workers,
                                 fallbacks=[s for s in (self.archive_store,) if s is not None],
                                 on_repair=[partial(self._repaired, job)])
        if not self.hot.exists(mf.manifest_key(job, step)):  # retention deleted it while we copied
            delete_checkpoint(self.durable, job, step)
            raise NotFoundError(f"step {step} of job {job!r} was deleted from the hot tier during its copy")
        durable_at = time.time()
        record = {"created": created, "restore_ready_at": restore_ready_at, "durable_at": durable_at,
                  "copied_bytes": copied}
        self.durable.put(_tier_key(job, step), json.dumps(record).encode())
        self._notify("durable", {"job": job, "step": step, "since_created": durable_at - created,
                                 "copied_bytes": copied, "tier": "durable"})
        # built here, not by status(): listing the archive would make the copy depend on it
        # (and archive() moves only steps that left hot, so this one is not archived)
        kind = mf.load_manifest(self.hot, job, step).kind
        return TierStatus(step, kind, True, True, False, created, restore_ready_at - created, durable_at - created)

    def _repaired(self, job: str, event: RepairEvent) -> None:
        """A tier copy met a bad copy and repaired it: tell the observers (metrics)."""
        self._notify("repair", {"job": job, "key": event.key, "tier": event.store, "source": event.source})

    def _notify(self, event: str, fields: dict) -> None:
        """To the tiering's observers; backlog events also to the job's manager's (metrics)."""
        extra = self._job_observers.get(fields.get("job"), []) if event == "durable_backlog" else []
        for obs in (*self.observers, *extra):
            try:
                obs(event, fields)
            except Exception as exc:  # noqa: BLE001 - monitoring never breaks a copy
                log.warning("tiering observer failed: %s", exc)

    def sync(self, job: str) -> list[int]:
        """Copy every hot checkpoint the durable tier lacks (e.g. after a crash). Returns steps."""
        done = []
        for step in mf.list_steps(self.hot, job):
            if not self.durable.exists(mf.manifest_key(job, step)):
                self.make_durable(job, step)
                done.append(step)
        return done

    def wait(self) -> None:
        """Wait for queued durable copies; raise the first error one hit."""
        with self._lock:
            pending = list(self._pending)
        for f in pending:
            try:
                f.result()
            except BaseException:
                pass
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Wait for the queued copies (a failing one is retried until it succeeds or a
        limit is breached); see ``abandon`` to give up on an outage."""
        try:
            self.wait()
        finally:
            self.backlog.close()
            self._pool.shutdown(wait=True)

    def abandon(self) -> None:
        """Stop retrying failing durable copies (they stay hot; ``sync`` copies them later)."""
        self.backlog.close()

    # -- eviction and archiving ------------------------------------------------------------
    def evict_plan(self, job: str, now: float | None = None) -> list[tuple[int, bool, str]]:
        """(step, evict?, reason) for every hot checkpoint of ``job``."""
        now = time.time() if now is None else now
        steps = mf.list_steps(self.hot, job)
        manifests = {}
        for s in steps:
            try:
                manifests[s] = mf.load_manifest(self.hot, job, s)
            except TrainstoreError:
                continue
        keep = set(steps[-self.policy.hot_keep_last:])
        if self.policy.hot_max_age is not None:
            keep = {s for s in keep if s in manifests and now - manifests[s].created <= self.policy.hot_max_age}
        for s in list(keep):
            m = manifests.get(s)
            if m is not None and m.kind == "incremental":
                keep.add(m.base_step)  # type: ignore[arg-type]
        out = []
        for s in steps:
            if s in keep:
                out.append((s, False, "within the hot rule"))
            elif not self.durable.exists(mf.manifest_key(job, s)):
                out.append((s, False, "not durable yet"))
            else:
                out.append((s, True, f"past the hot rule (last {self.policy.hot_keep_last}"
                            + (f", max age {self.policy.hot_max_age:.0f}s" if self.policy.hot_max_age else "") + ")"))
        return out

    def evict(self, job: str, *, dry_run: bool = False, now: float | None = None) -> list[int]:
        """Remove durable checkpoints past the hot rule from the hot tier; collect hot chunks."""
        victims = [s for s, ev, _ in self.evict_plan(job, now) if ev]
        if dry_run or not victims:
            return victims
        for s in victims:
            delete_checkpoint(self.hot, job, s)
        collect_garbage(self.hot, GcOptions(grace=self.policy.hot_gc_grace))
        return victims

    def archive(self, job: str, *, dry_run: bool = False, now: float | None = None) -> list[int]:
        """Move durable full checkpoints older than ``archive_after`` (that no remaining
        incremental builds on, and not the newest full) to the archive tier."""
        if self.archive_store is None or self.policy.archive_after is None:
            raise ConfigError("archiving needs an archive store and TierPolicy(archive_after=...)")
        now = time.time() if now is None else now
        ms = [m for m in mf.list_manifests(self.durable, job) if isinstance(m, mf.Manifest)]
        fulls = [m.step for m in ms if m.kind == "full"]
        needed = {m.base_step for m in ms if m.kind == "incremental"}
        victims = [m.step for m in ms if m.kind == "full" and m.step != fulls[-1] and m.step not in needed
                   and now - m.created > self.policy.archive_after and not self.hot.exists(m.key)]
        if dry_run:
            return victims
        for s in victims:
            copy_checkpoint(self.durable, self.archive_store, job, s, self.workers, fallbacks=[self.hot],
                            on_repair=[partial(self._repaired, job)])
            rec = self._record(job, s) or {}
            self.archive_store.put(_tier_key(job, s), json.dumps({**rec, "archived_at": time.time()}).encode())
            delete_checkpoint(self.durable, job, s)  # its chunks go at the next durable gc
        return victims

    # -- status ----------------------------------------------------------------------------
    def _record(self, job: str, step: int) -> dict | None:
        for s in (self.durable, self.archive_store):
            if s is None:
                continue
            try:
                return json.loads(bytes(memoryview(s.get(_tier_key(job, step)))))
            except (NotFoundError, ValueError):
                continue
        return None

    def status(self, job: str, step: int | None = None) -> list[TierStatus]:
        """Per checkpoint: which tiers hold it and the created -> ready -> durable times."""
        where = {}
        for name, s in (("hot", self.hot), ("durable", self.durable), ("archived", self.archive_store)):
            if s is None:
                continue
            for st in mf.list_steps(s, job):
                where.setdefault(st, set()).add(name)
        steps = sorted(where) if step is None else [step]
        out = []
        for s in steps:
            tiers = where.get(s, set())
            if not tiers:
                raise NotFoundError(f"no checkpoint step {s} of job {job!r} in any tier of {self.store.url}")
            try:
                m = mf.load_manifest(self.store, job, s)
            except NotFoundError:
                if step is not None:
                    raise
                continue  # deleted (retention) since the tiers were listed
            rec = self._record(job, s) or {}
            created = m.created
            ready = rec.get("restore_ready_at")
            durable = rec.get("durable_at")
            out.append(TierStatus(s, m.kind, "hot" in tiers, "durable" in tiers, "archived" in tiers, created,
                                  None if ready is None else ready - created,
                                  None if durable is None else durable - created))
        return out


__all__ = ["Tiering", "TierPolicy", "TierStatus", "copy_checkpoint"]
