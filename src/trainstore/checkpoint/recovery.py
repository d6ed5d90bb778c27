"""Which checkpoint a restore loads: candidates in order, skipping (and recording) bad ones.

``restore_first(...)`` walks the candidates - the asked step, the best by a metric, or the
newest first - and returns the first one that loads and verifies. Only an integrity failure
(``IntegrityError``: a corrupt, undecodable or missing chunk, a manifest no tier holds a
good copy of, a missing base) skips a candidate and records it as bad (bound to the
manifest read); any other error (store unreachable, I/O error, out of memory, a target that
does not match) is raised and leaves no record, so the checkpoint stays restorable.
Loading itself is the save backend's (``backend``): ``restore_selected`` has the backend
that wrote each candidate load it, pruned to a partial restore's selection (``select``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..chunks import ChunkStore, RepairEvent
from ..errors import (
    ConfigError,
    IntegrityError,
    ManifestError,
    NoCheckpointError,
    NotFoundError,
    NoValidCheckpointError,
    TrainstoreError,
)
from ..store.base import Store
from .backend import SaveBackend, loader_name
from .format import manifest as mf
from .format.manifest import Manifest
from .restore.select import PartialReport, Selection, prune
from .restore.verify import record as record_verify
from .save.lossy import LossyReport
from .types import RestoreResult

log = logging.getLogger("trainstore.checkpoint")


def restore_first(chunks: ChunkStore, job: str, load: Callable[[Manifest], Any], step: int | None,
                  best: str | None, mode: str, retry_bad: bool,
                  skipped: list[tuple[int, str]]) -> tuple[Manifest, str, Any, int | None] | None:
    """(manifest, why it was chosen, state, the newest step listed: None when only the asked
    step was looked up) of the first candidate that restores, or None
    when none could be (every candidate is then in ``skipped``, with the reason); raises
    ``NoCheckpointError`` when ``job`` has no checkpoint at all."""
    store = chunks.store
    if step is not None and best is not None:
        raise ConfigError("pass either step= or best=, not both")
    if mode not in ("min", "max"):
        raise ConfigError(f"mode must be 'min' or 'max', got {mode!r}")
    if step is not None:
        mf.check_step(step)
        if not store.exists(mf.manifest_key(job, step)):
            raise NotFoundError(f"no checkpoint step {step} for job {job!r} in {store.url} "
                                f"(committed: {mf.list_steps(store, job)[-10:]})")
        order = [(step, f"step {step} was asked for")]
        retry_bad, newest = True, None
    else:
        steps = mf.list_steps(store, job)
        if not steps:
            raise NoCheckpointError(f"job {job!r} has no checkpoints in {store.url}")
        newest = steps[-1]
        order = best_order(store, job, steps, best, mode, skipped) if best is not None \
            else [(s, "newest checkpoint that verifies") for s in reversed(steps)]
    for s, why in order:
        m = None  # a verification record applies to the manifest read alone
        try:
            m = mf.load_manifest(store, job, s)  # a bad copy in one tier is read from the next
            rec = None if retry_bad else mf.load_verify_record(store, job, s, m)
            if rec is not None and not rec.ok:
                reason = f"verification recorded it as bad: {'; '.join(rec.errors[:2])}"
                skipped.append((s, reason))
                log.warning("restore: skipping step %d of job %r: %s", s, job, reason)
                continue
            check_base(store, m)
            state = load(m)
        except IntegrityError as exc:  # the checkpoint itself is bad: record it, try an older one
            if step is not None:
                raise
            reason = f"{type(exc).__name__}: {exc}"
            skipped.append((s, reason))
            log.warning("restore: skipping step %d of job %r: %s", s, job, reason)
            record_verify(chunks, job, mf.new_verify_record(s, False, [reason], 0,
                                                            None if m is None else mf.manifest_digest(m)))
            continue
        except NotFoundError:
            if step is not None or store.exists(mf.manifest_key(job, s)):
                raise
            skipped.append((s, "deleted while restoring"))  # e.g. by retention: not bad
            continue
        if skipped and why.startswith("newest"):
            why = f"newest checkpoint that verifies ({len(skipped)} newer skipped)"
        return m, why, state, newest
    return None


def restore_selected(chunks: ChunkStore, job: str, backend_for: Callable[[str], SaveBackend],
                     selection: Selection | None, into: Any, scratch_bytes: int, step: int | None,
                     best: str | None, mode: str, retry_bad: bool, skipped: list[tuple[int, str]]
                     ) -> tuple[Manifest, str, Any, PartialReport | None, int | None] | None:
    """``restore_first`` where the backend that wrote each candidate (``backend_for(name)``)
    loads it (into ``into``, in place, when given), pruned to ``selection`` (only=/reset=):
    (manifest, why, state, what a partial restore loaded and left out, newest step listed) or None."""
    partial: list[PartialReport] = []

    def load(m: Manifest) -> Any:
        if selection is not None:
            if loader_name(m) != "single":
                raise ConfigError(f"partial restore (only=/reset=) of checkpoint step {m.step}: not supported "
                                  f"for checkpoints written by the {loader_name(m)!r} backend")
            m, report = prune(m, selection)
            partial[:] = [report]
        return backend_for(loader_name(m)).load(m, into, scratch_bytes)

    found = restore_first(chunks, job, load, step, best, mode, retry_bad, skipped)
    if found is None:
        return None
    m, why, state, newest = found
    return m, why, state, partial[0] if partial else None, newest


def tier_of(store: Store, key: str) -> str:
    """Which tier holds ``key`` (the first that does): ``"hot (URL)"``, ``"durable (URL)"``,
    ``"archive (URL)"``; a store without tiers is named by its URL. For the resume log line."""
    tiers = store.tiers()
    if len(tiers) < 2:
        return store.url
    names = ("hot", "durable", "archive") if len(tiers) <= 3 else tuple(f"tier {i}" for i in range(len(tiers)))
    for name, tier in zip(names, tiers):
        try:
            if tier.exists(key):
                return f"{name} ({tier.url})"
        except TrainstoreError:  # an unreachable tier did not serve it
            continue
    return store.url


def check_base(store: Any, m: Manifest) -> None:
    """An incremental's base must exist and be full: else the incremental is bad (ManifestError)."""
    if m.kind == "incremental":
        try:
            base = mf.load_manifest(store, m.job, m.base_step)  # type: ignore[arg-type]
        except NotFoundError:
            raise ManifestError(f"base full checkpoint step {m.base_step} of incremental step {m.step} "
                                "is missing") from None
        if base.kind != "full":
            raise ManifestError(f"base step {m.base_step} of step {m.step} is not a full checkpoint")


def best_order(store: Any, job: str, steps: list[int], metric: str, mode: str,
               skipped: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Steps ordered best first by ``metric`` (``mode`` "min" or "max"), newest first on ties."""
    scored, seen = [], set()
    for s in steps:
        try:
            m = mf.load_manifest(store, job, s)
        except IntegrityError as exc:
            skipped.append((s, f"unreadable manifest: {exc}"))
            continue
        except NotFoundError:
            if store.exists(mf.manifest_key(job, s)):
                raise
            continue  # deleted since it was listed
        seen.update(m.metrics)
        v = m.metrics.get(metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            scored.append((v, s))
    if not scored:
        raise ConfigError(f"no checkpoint of job {job!r} records metric {metric!r}; "
                          f"metrics recorded: {sorted(seen) or 'none'}")
    scored.sort(key=lambda p: (p[0] if mode == "min" else -p[0], -p[1]))
    return [(s, f"best {metric}={v} ({mode})") for v, s in scored]


def restore_result(store: Store, job: str, found: tuple[Manifest, str, Any, PartialReport | None, int | None],
                   skipped: list[tuple[int, str]], seconds: float, repairs: list[RepairEvent]) -> RestoreResult:
    """The ``RestoreResult`` of ``restore_selected``'s pick; a warning when its moments were stored lossy."""
    m, why, state, partial, _newest = found
    result = RestoreResult(m.step, m.kind, why, skipped, state, seconds, repairs=repairs, partial=partial,
                           lossy=LossyReport.of(m), tier=tier_of(store, mf.manifest_key(job, m.step)))
    if result.lossy is not None:
        log.warning("restore of step %d (job %r): %s: %s", m.step, job, result.lossy,
                    ", ".join(result.lossy.tensors[:4]) + (" ..." if len(result.lossy.tensors) > 4 else ""))
    return result


def nothing_restored(job: str, skipped: list[tuple[int, str]]) -> NoValidCheckpointError:
    return NoValidCheckpointError(f"no checkpoint of job {job!r} could be restored; tried: "
                                  + "; ".join(f"step {s}: {why}" for s, why in skipped))


__all__ = ["best_order", "check_base", "nothing_restored", "restore_first", "restore_result", "restore_selected", "tier_of"]
