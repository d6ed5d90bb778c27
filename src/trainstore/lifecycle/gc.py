"""Garbage collection of chunks no manifest references, safe against concurrent saves.

The protocol (see docs/lifecycle.md for the argument) uses two kinds of small objects:

    gc/sweeps/<deadline-ms>-<id>.json a sweep marker: {"state": "running"|"done", started, deadline, finished}
    gc/leases/<job>-<step>-<id>.json a save lease: the chunk keys a save is about to commit

**Sweep** (``collect_garbage``): (1) write the marker ``running`` - durably, before anything
else; (2) list chunks; (3) list every live lease, *then* every manifest of every job: their
chunk keys are referenced (leases first: a lease disappears only after its manifest
exists, so one of the two listings sees every committed or committing save); (4) delete chunks that are unreferenced *and* older than the
grace period, while the marker's deadline (renewed by a heartbeat) is ahead; (5) mark the
marker ``done``.

**Save**: ``trainstore.checkpoint.save.lease.commit_lease`` (the save backends call it right before
they commit a manifest) writes a lease, then re-checks its chunks against sweeps that may
have been deleting; this module keeps the sweep and imports the shared names from there.

Why it is safe: a sweep whose listing (3) happens after the lease (a) is visible protects
the save's chunks. A sweep whose listing came earlier wrote its marker (1) before that,
so the save sees the marker in (b) and re-checks after the sweep's deletions ended (c).
Chunks deleted *before* a save's own HEADs are simply written again. The grace period
additionally protects writers that do not take leases (a crashed save's leftovers become
garbage only after it). Listing is strongly consistent on S3, GCS, Azure and locally.

**Released chunks** (``reclaim_released``): the chunks a retention decision just unreferenced
are swept at once, by the same protocol (marker, leases, then every manifest of every job),
restricted to those keys and without the grace period: they were named by a committed
manifest, so no unleased writer is writing them, and a save that dedups against one either
shows in the lease listing or sees the marker and writes it again. The report's
``next_reclaim_at`` says when the chunks a sweep left for the grace period become deletable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..checkpoint.format import manifest as mf
from ..checkpoint.format.layout import parse_manifest_key
from ..checkpoint.format.lineage import load_abandoned
from ..checkpoint.save.lease import (
    CLOCK_SKEW_S,
    LEASE_RENEW_S,
    LEASES,
    MIN_LEASE_TTL_S,
    SWEEPS,
    sweep_markers,
)
from ..chunks import ChunkStore, replica_key
from ..durations import parse_duration
from ..errors import ConfigError, ManifestError, NotFoundError, TrainstoreError
from ..store.base import Store
from ..sweeps import SweepMarker, SweepOptions, load_json

log = logging.getLogger("trainstore.lifecycle.gc")


@dataclass(frozen=True)
class GcOptions(SweepOptions):
    """How a chunk sweep runs: ``SweepOptions`` plus ``lease_ttl``, after which the leases of
    crashed saves stop protecting their chunks (at least ``MIN_LEASE_TTL_S``)."""

    lease_ttl: float | str = "1d"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "lease_ttl", parse_duration(self.lease_ttl, "lease_ttl"))
        if self.lease_ttl < MIN_LEASE_TTL_S:  # type: ignore[operator]
            raise ConfigError(f"lease_ttl must be at least {MIN_LEASE_TTL_S:.0f} s (saves renew a lease older "
                              f"than {LEASE_RENEW_S:.0f} s before committing), got {self.lease_ttl!r}")


@dataclass
class GcReport:
    """What a sweep found and did (``dry_run``: what it would do)."""

    dry_run: bool
    manifests: int = 0
    jobs: int = 0
    leases: int = 0
    chunks: int = 0
    chunk_bytes: int = 0
    referenced: int = 0
    referenced_bytes: int = 0
    unreferenced: int = 0
    too_young: int = 0  # unreferenced but within the grace period
    deleted: int = 0
    bytes_reclaimed: int = 0
    missing: int = 0  # referenced by a manifest but absent (a broken checkpoint: run verify)
    too_young_bytes: int = 0
    next_reclaim_at: float | None = None  # when the first chunk left for the grace period may go
    stopped_early: bool = False
    seconds: float = 0.0
    deleted_keys: list[str] = field(default_factory=list, repr=False)

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        out.pop("deleted_keys")
        return out


def _now() -> float:
    return time.time()


#: (manifest key, etag, size) -> the chunk keys it names: committed manifests never change
#: in place (a key reused after a rollback has another etag), so a sweep repeated after each
#: save (retention's reclaim) reads only the manifests that are new since the last one
RefCache = dict


def referenced_chunks(store: Store, *, ignore_unreadable: bool = False,
                      on_manifest: Callable[[], Any] | None = None,
                      cache: RefCache | None = None) -> tuple[set[str], int, int]:
    """Chunk keys referenced by every committed manifest of every job, abandoned ones (a
    rollback's, kept until retention removes them) included: (keys, manifests, jobs)."""
    keys: set[str] = set()
    jobs: set[str] = set()
    fresh: RefCache = {}
    for meta, job, load in _manifest_keys(store):
        ident = (meta.key, meta.etag, meta.size)
        named = cache.get(ident) if cache is not None and meta.etag else None
        if named is None:
            try:
                named = frozenset(mf.manifest_chunk_keys(load()))
            except NotFoundError:
                continue  # deleted since it was listed
            except ManifestError as exc:
                if not ignore_unreadable:
                    raise ManifestError(f"gc refuses to run: {exc} (it cannot know which chunks that manifest "
                                        "references; repair or delete it, or pass ignore_unreadable)") from None
                log.warning("gc: ignoring unreadable manifest: %s", exc)
                continue
        fresh[ident] = named
        keys |= named
        jobs.add(job)
        if on_manifest is not None:
            on_manifest()
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    return keys, len(fresh), len(jobs)


def _manifest_keys(store: Store) -> Iterator[tuple[Any, str, Callable[[], mf.Manifest]]]:
    """(listing entry, job, loader) of every committed and abandoned manifest, one listing."""
    for meta in list(store.list("jobs/")):
        parsed = parse_manifest_key(meta.key)
        if parsed is None:
            continue
        job, step, run = parsed
        yield meta, job, (partial(mf.load_manifest, store, job, step) if run is None
                          else partial(load_abandoned, store, meta.key))


def lease_expiry(lease: dict, lease_ttl: float) -> float:
    """When ``lease`` stops protecting its chunks: its own ``expires``, or ``created`` +
    ``lease_ttl`` if sooner (the sweep's bound on how long a crashed save holds chunks)."""
    def num(field: str) -> float | None:
        value = lease.get(field)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    expires, created = num("expires"), num("created")
    ends = [t for t in (expires, None if created is None else created + lease_ttl) if t is not None]
    return min(ends) if ends else 0.0


def live_leases(store: Store, now: float, lease_ttl: float, dry_run: bool) -> tuple[set[str], int]:
    """Chunk keys named by unexpired leases; expired ones (crashed saves) are deleted."""
    keys: set[str] = set()
    n = 0
    for meta in list(store.list(LEASES)):
        obj = load_json(store, meta.key)
        if obj is None:
            continue
        if lease_expiry(obj, lease_ttl) + CLOCK_SKEW_S < now:
            if not dry_run:
                store.delete(meta.key)
            continue
        keys.update(k for k in obj.get("chunks") or [] if isinstance(k, str))
        n += 1
    return keys, n


def collect_garbage(store: Store, options: GcOptions | None = None, *, dry_run: bool = False,
                    now: Callable[[], float] = _now,
                    progress: Callable[[str, int, int], Any] | None = None,
                    only: Mapping[str, int] | None = None, cache: RefCache | None = None) -> GcReport:
    """One sweep over ``store`` (see module docstring). Returns a report with bytes reclaimed.
    ``only``: sweep just these chunk keys (key -> stored bytes), without the grace period
    (``reclaim_released``); ``cache``: what earlier sweeps read (``RefCache``)."""
    opts = options or GcOptions()
    t0 = now()
    report = GcReport(dry_run=dry_run)
    # the marker (keyed by its hard deadline, carrying this process's identity) is kept alive
    # by a heartbeat; savers wait for it only until its deadline
    beat = SweepMarker(store, SWEEPS.removesuffix("sweeps/"), max_duration=float(opts.max_duration),  # type: ignore[arg-type]
                       heartbeat=float(opts.heartbeat), now=now)  # type: ignore[arg-type]
    if not dry_run:
        beat.start()  # (1) the marker is written before any listing, then kept alive
    try:
        if only is None:
            present = {key: (size, mtime) for key, size, mtime in ChunkStore(store).list_keys()}  # (2)
        else:  # released by a committed manifest's deletion: no grace (see module docstring)
            present = {key: (size, float("-inf")) for key, size in only.items()}
        report.chunks = len(present)
        report.chunk_bytes = sum(s for s, _ in present.values())
        if progress:
            progress("listed chunks", len(present), len(present))
        # (3) leases BEFORE manifests: a save drops its lease only after committing, so a lease
        # missing from this listing is either not written yet (the save will see our marker) or
        # dropped after a commit that the manifest listing below then sees.
        leased, report.leases = live_leases(store, t0, opts.lease_ttl, dry_run)  # type: ignore[arg-type]
        refs, report.manifests, report.jobs = referenced_chunks(store, ignore_unreadable=opts.ignore_unreadable,
                                                                cache=cache)
        # A save may write chunks after the chunk listing and commit before the manifest
        # listing: its newest chunks look missing. Confirm with a HEAD before reporting.
        if only is None:
            report.missing = sum(1 for key in refs - present.keys() if not store.exists(key))
        refs |= leased
        refs |= {replica_key(k) for k in refs}  # a replica lives exactly as long as its primary
        cutoff = t0 - opts.grace  # type: ignore[operator]
        victims = []
        for key, (size, mtime) in present.items():
            if key in refs:
                report.referenced += 1
                report.referenced_bytes += size
                continue
            report.unreferenced += 1
            if mtime is None or mtime >= cutoff:
                report.too_young += 1
                report.too_young_bytes += size
                if mtime is not None:
                    ends = mtime + opts.grace  # type: ignore[operator]
                    report.next_reclaim_at = ends if report.next_reclaim_at is None else min(report.next_reclaim_at, ends)
                continue
            victims.append((key, size))
        if dry_run:
            report.deleted = len(victims)
            report.bytes_reclaimed = sum(s for _, s in victims)
            report.deleted_keys = [k for k, _ in victims]
        else:
            _delete(store, victims, opts, beat, report, progress)  # (4)
    finally:
        report.seconds = now() - t0
        if not dry_run:
            beat.finish(deleted=report.deleted)  # (5)
            try:
                _expire_markers(store, now(), opts.marker_ttl)  # type: ignore[arg-type]
            except TrainstoreError as exc:  # old markers are removed by a later sweep
                log.warning("gc: could not expire old sweep markers: %s", exc)
    log.info("gc of %s: %d chunks, %d referenced, deleted %d (%.1f MB)%s", store.url, report.chunks,
             report.referenced, report.deleted, report.bytes_reclaimed / 1e6, " [dry run]" if dry_run else "")
    return report


def reclaim_released(store: Store, released: Mapping[str, int], options: GcOptions | None = None,
                     caches: dict[str, RefCache] | None = None) -> GcReport:
    """Delete now, in each tier of ``store``, the chunks of ``released`` (key -> stored bytes:
    what deleted manifests named) that no manifest or lease references any more.
    ``caches``: a ``RefCache`` per tier URL, kept by the caller between calls."""
    opts = options or GcOptions()
    report = GcReport(dry_run=False)
    for tier in store.tiers():
        cache = caches.setdefault(tier.url, {}) if caches is not None else None
        rep = collect_garbage(tier, opts, only={k: n for k, n in released.items() if tier.exists(k)}, cache=cache)
        report.deleted += rep.deleted
        report.bytes_reclaimed += rep.bytes_reclaimed
        report.referenced += rep.referenced
        report.deleted_keys += rep.deleted_keys
    return report


def _delete(store: Store, victims: list[tuple[str, int]], opts: GcOptions, beat: SweepMarker, report: GcReport,
            progress: Callable[[str, int, int], Any] | None) -> None:
    with ThreadPoolExecutor(max_workers=opts.workers, thread_name_prefix="trainstore-gc") as pool:
        for i in range(0, len(victims), opts.batch):
            if not beat.may_delete():
                report.stopped_early = True
                log.warning("gc: sweep deadline reached or heartbeat lapsed; stopping with %d chunks left",
                            len(victims) - i)
                break
            batch = victims[i:i + opts.batch]
            list(pool.map(lambda kv: store.delete(kv[0]), batch))
            report.deleted += len(batch)
            report.bytes_reclaimed += sum(s for _, s in batch)
            report.deleted_keys += [k for k, _ in batch]
            if progress:
                progress("deleting", report.deleted, len(victims))


def _expire_markers(store: Store, now: float, ttl: float) -> None:
    for m in list(store.list(SWEEPS)):
        obj = load_json(store, m.key)
        if obj is None:
            continue
        ended = float(obj.get("finished") or 0) if obj.get("state") == "done" else float(obj.get("deadline") or 0)
        if ended < now - ttl:  # finished long ago, or a crashed sweep's marker whose deadline passed long ago
            store.delete(m.key)


__all__ = ["GcOptions", "GcReport", "RefCache", "collect_garbage", "reclaim_released", "lease_expiry", "live_leases", "referenced_chunks",
           "sweep_markers", "LEASES", "LEASE_RENEW_S", "MIN_LEASE_TTL_S", "SWEEPS"]
