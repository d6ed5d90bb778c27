"""Runs and lineage: rollbacks and reruns in one job, without overwriting or losing a step.

A job's ``checkpoints/`` holds its current lineage: the steps ``restore()``, "latest",
retention's rules and tiering see. Each manifest records the run that wrote it
(``metadata["run"]``) and the step it continued from (``metadata["parent_step"]``).

When training reaches a step that exists although it did not come from there - a save after
``restore(step=...)`` of a step that is not the newest (a rollback), or a fresh run in the
same job - the manager moves the steps the new lineage leaves behind (``abandon``) to
``jobs/<job>/abandoned/<step>/<run>/manifest.json`` (``layout.abandoned_key``), tier by
tier: the manifest is created there first (conditional create, same bytes or nothing),
then removed from ``checkpoints/``. A crash in between leaves both (the next save finishes
the move); nothing is overwritten in place. Abandoned checkpoints stay complete - gc keeps
their chunks - and are listed (``CheckpointManager.list(abandoned=True)``, ``ckpt ls``)
until retention removes them (``lifecycle.retention``).
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable

from ...chunks import content_hash
from ...errors import (
    AlreadyExistsError,
    ConflictError,
    ManifestError,
    NotFoundError,
    StoreUnavailableError,
)
from ...naming import check_name
from ...store.base import Buffer, Store
from ...store.checked import read_checked
from .layout import (
    MANIFEST_NAME,
    abandoned_key,
    abandoned_prefix,
    check_step,
    list_steps,
    manifest_key,
    step_prefix,
)
from .manifest import Manifest, parse_manifest

log = logging.getLogger("trainstore.checkpoint")
RUN_FIELD = "run"
PARENT_FIELD = "parent_step"


def new_run_id() -> str:
    """A fresh run id: UTC start time (sorts by age) and a random suffix."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def run_of(m: Manifest) -> str | None:
    """The run that wrote ``m`` (None for manifests written before run ids)."""
    run = m.metadata.get(RUN_FIELD)
    return run if isinstance(run, str) and run else None


def _run_name(m: Manifest | None, raw: bytes) -> str:
    run = run_of(m) if m is not None else None
    return run if run is not None else "legacy-" + content_hash(raw)[:12]


def abandon(store: Store, job: str, steps: list[int]) -> list[tuple[int, str]]:
    """Move ``steps`` of ``job`` out of the lineage, in every tier that holds them, newest
    first (a crash leaves the lineage a prefix of itself). Returns (step, run) moved."""
    moved = []
    for step in sorted(steps, reverse=True):
        run = None
        good = _good_copy(store, job, step)
        for tier in store.tiers():
            try:
                run = _move(tier, job, step, good)
            except NotFoundError:
                continue  # this tier never held it (or a racing rank moved it)
        if run is not None:
            moved.append((step, run))
    return moved


def _good_copy(store: Store, job: str, step: int) -> tuple[bytes, Manifest] | None:
    """A good copy of the manifest (``read_checked``: bad copies are read past and repaired),
    moved into every tier, so a corrupt copy is not kept beside the good one (None: none is)."""
    key = manifest_key(job, step)
    try:
        return read_checked(store, key, lambda data: (bytes(memoryview(data)), parse_manifest(data, key)))
    except (NotFoundError, ManifestError):
        return None


def _move(tier: Store, job: str, step: int, good: tuple[bytes, Manifest] | None) -> str:
    key = manifest_key(job, step)
    raw = bytes(memoryview(tier.get(key)))  # NotFoundError: this tier does not hold it
    m: Manifest | None = None
    if good is not None:
        raw, m = good
    run = _run_name(m, raw)  # no good copy anywhere: this tier's bytes, kept for inspection
    dest = abandoned_key(job, step, run)
    try:
        tier.put_if_absent(dest, raw)
    except AlreadyExistsError:  # an earlier, interrupted move (or a racing rank)
        if bytes(memoryview(tier.get(dest))) != raw:
            raise ConflictError(f"{dest} exists in {tier.url} with other content than {key}; "
                                "inspect both before retrying") from None
    side = dest[:-len(MANIFEST_NAME)]
    others = [meta.key for meta in tier.list(step_prefix(job, step)) if meta.key != key]
    for other in others:  # verification records, tier records: advisory, moved along
        try:
            tier.put(side + other.rsplit("/", 1)[1], tier.get(other))
        except NotFoundError:
            continue
    tier.delete(key)  # the step leaves the lineage here
    for other in others:
        tier.delete(other)
    prune_empty_dirs(tier, [step_prefix(job, step)])
    return run


def prune_empty_dirs(store: Store, prefixes: list[str]) -> None:
    """Remove the directories of ``prefixes`` (deepest first) in each local tier of ``store``
    if they are empty now, so deleted checkpoints leave no empty step folders behind."""
    for tier in store.tiers():
        for prefix in prefixes:
            path = tier.local_path(prefix.rstrip("/"))
            if path is None:
                break  # not a local tier
            try:
                os.rmdir(path)
            except OSError:  # not empty (a racing write, other runs' steps) or gone: keep it
                continue


class RunLineage:
    """One manager's place in its job's lineage: the run id it records, the step training is
    at (restored or saved last), and whether its next save may reach an existing step."""

    def __init__(self, store: Store, job: str, run: str | None) -> None:
        self.store, self.job = store, job
        self.run = check_name(run, "run id") if run is not None else new_run_id()
        self._given = run is not None
        self.position: int | None = None
        self._check = True  # until this run's first save (and again after a restore)

    def start(self, from_step: int | None, run: str | None) -> None:
        """The next saves continue from ``from_step`` (None: a fresh run)."""
        self.position = None if from_step is None else check_step(from_step)
        self._check = True
        if run is not None or not self._given:
            self.run = check_name(run, "run id") if run is not None else new_run_id()
            self._given = run is not None

    def restored(self, m: Manifest, newest: int | None = None) -> None:
        """Training continues from ``m``; restoring the newest step continues its run (a
        store that cannot list now - a tier down - starts a new one: only a name differs).
        ``newest``: the newest step the restore listed (else it is listed here)."""
        self.position, self._check = m.step, True
        if self._given or run_of(m) is None:
            return
        if newest is None:
            try:
                newest = max(list_steps(self.store, self.job), default=None)
            except StoreUnavailableError:
                return
        if newest == m.step:
            self.run = run_of(m)  # type: ignore[assignment]

    @property
    def pending(self) -> bool:
        """Whether the next save may reach an existing step (its check runs on the save thread)."""
        return self._check

    def saved(self, step: int) -> tuple[bool, int | None]:
        """Caller thread, as a save of ``step`` is queued: the (check, position) its ``follow``
        needs; later saves of this run continue from ``step``."""
        ticket = (self._check, self.position)
        self.position, self._check = step, False
        return ticket

    def follow(self, step: int, ticket: tuple[bool, int | None],
               on_abandon: Callable[[int, int | None, list[int]], None]) -> int | None:
        """Save thread, before the save of ``step`` (``ticket`` from ``saved``): if it exists
        and this run has not saved yet, abandon the steps the new lineage leaves behind and
        start a new run (logged; then ``on_abandon(step, parent, moved)``). Returns the parent step."""
        check, position = ticket
        if not check:
            return position
        steps = self._steps()
        if not any(s >= step for s in steps):
            older = [s for s in steps if s < step]
            return position if position is not None else (older[-1] if older else None)
        parent = position if position is not None and position < step else None
        cut = step if parent is None else parent + 1
        if not self._given:
            self.run = new_run_id()
        moved = sorted(s for s, _ in abandon(self.store, self.job, [s for s in steps if s >= cut]))
        log.warning("checkpoint step %d of job %r exists from an earlier run: %s as run %r; steps %s kept under "
                    "%s until retention removes them", step, self.job,
                    "starting a fresh lineage" if parent is None else f"rolling back to step {parent}",
                    self.run, moved, abandoned_prefix(self.job))
        on_abandon(step, parent, moved)
        return parent

    def _steps(self) -> list[int]:
        """The lineage's steps; with a tier past the write view unreachable (a durable outage),
        those of the write view (its commit cannot ask that tier either)."""
        try:
            return list_steps(self.store, self.job)
        except StoreUnavailableError as exc:
            log.warning("lineage check of job %r: %s; using the steps of %s", self.job, exc, self.store.write_view().url)
            return list_steps(self.store.write_view(), self.job)


def load_abandoned(store: Store, key: str) -> Manifest:
    """Read and validate an abandoned manifest (``layout.list_abandoned`` gives the keys)."""
    def check(data: Buffer) -> Manifest:
        m = parse_manifest(data, key)
        parts = key.split("/")
        if key != abandoned_key(m.job, m.step, parts[-2]) or not key.startswith(abandoned_prefix(m.job)):
            raise ManifestError(f"abandoned checkpoint manifest {key} says job={m.job!r} step={m.step}")
        return m

    return read_checked(store, key, check)  # a bad copy in one tier is read from the next


__all__ = ["PARENT_FIELD", "RUN_FIELD", "RunLineage", "abandon", "prune_empty_dirs", "load_abandoned", "new_run_id",
           "run_of"]
