"""Data garbage collection: delete shards no committed dataset version references.

Crashed ingests, cleans and transforms leave shards (and transform work markers) behind
under ``datasets/<name>/``; nothing else ever removes them. A sweep is safe against writers
running at the same time, by the protocol of ``trainstore.sweeps`` (objects under
``gc/data/``):

1. write a sweep marker (kept alive by a heartbeat) before listing anything;
2. list every shard and work marker under ``datasets/``;
3. list live writer leases, *then* per dataset the ingest journal entries
   (``datasets/<name>/pending/``, acknowledged shards) and then every committed version (a
   writer drops or narrows its lease, and an entry is deleted, only after the version naming
   its shards is committed, so one of the listings sees every committed or committing shard);
4. delete what is unreferenced, not covered by a lease and older than ``grace``, while the
   marker's deadline is ahead; 5. mark the sweep done.

Writers: an ``Ingestor`` holds a lease with no expiry on its WAL id's shards from the first
uncommitted sequence number on (acknowledged but uncommitted shards outlive a crash of the
ingesting process, for as long as its WAL directory may come back); ``clean`` and
``transform`` lease their output prefixes for the run (renewed; expire a day after a
crash). A transform that resumes shards of an earlier run waits for running sweeps, then
re-checks them. ``write_dataset`` and other short writers are protected by ``grace``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..errors import ManifestError, NotFoundError
from ..store.base import ObjectMeta, Store
from ..sweeps import SweepMarker, SweepOptions, covered, expire_markers, live_leases
from .ingest.journal import PENDING_DIR, list_entry_keys, load_entries
from .leases import GC_PREFIX
from .transforms.shard_task import marker_output_key
from .versions import list_versions, load_version

log = logging.getLogger("trainstore.data.gc")


@dataclass(frozen=True)
class DataGcOptions(SweepOptions):
    """How a data sweep runs: exactly ``SweepOptions`` (writers' leases carry their own
    expiry, so there is no ``lease_ttl``)."""


@dataclass
class DataGcReport:
    """What a sweep found and did (``dry_run``: what it would do)."""

    dry_run: bool
    datasets: int = 0
    versions: int = 0
    leases: int = 0
    shards: int = 0
    shard_bytes: int = 0
    referenced: int = 0
    referenced_bytes: int = 0
    pending: int = 0  # acknowledged by an ingest (journal entry), not yet committed
    leased: int = 0  # unreferenced but covered by a writer's lease (in progress / uncommitted)
    unreferenced: int = 0
    too_young: int = 0  # unreferenced, unleased, but within the grace period
    deleted: int = 0  # shards deleted (or, dry run, that would be)
    bytes_reclaimed: int = 0
    markers_deleted: int = 0  # transform work markers of deleted or missing shards
    missing: int = 0  # referenced by a version but absent (a broken version: run verify)
    stopped_early: bool = False
    seconds: float = 0.0
    deleted_keys: list[str] = field(default_factory=list, repr=False)

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        out.pop("deleted_keys")
        return out


def referenced_shards(store: Store, *, ignore_unreadable: bool = False) -> tuple[set[str], set[str], int, int]:
    """Shards to keep: (named by a committed version, named by an ingest journal entry,
    versions, datasets). Per dataset, journal entries are listed before versions: an entry
    disappears only after the version naming its shards exists."""
    committed: set[str] = set()
    pending: set[str] = set()
    n = 0
    names = _dataset_names(store)
    for name in names:
        try:
            for entry in load_entries(store, name, [k for *_, k in list_entry_keys(store, name)]):
                pending.update(s.key for s in entry.shards)
        except ManifestError as exc:
            _unreadable(exc, ignore_unreadable)
        for ver in list_versions(store, name):
            try:
                version = load_version(store, name, ver)
            except NotFoundError:
                continue  # removed since the listing
            except ManifestError as exc:
                _unreadable(exc, ignore_unreadable)
                continue
            committed.update(s.key for s in version.shards)
            n += 1
    return committed, pending - committed, n, len(names)


def _dataset_names(store: Store) -> list[str]:
    """Datasets with a committed version or an ingest journal entry (a fresh listing)."""
    names = set()
    for meta in store.list("datasets/"):
        parts = meta.key.split("/")
        if len(parts) >= 4 and parts[2] in ("versions", PENDING_DIR):
            names.add(parts[1])
    return sorted(names)


def _unreadable(exc: ManifestError, ignore: bool) -> None:
    if not ignore:
        raise ManifestError(f"data gc refuses to run: {exc} (it cannot know which shards that manifest "
                            "references; repair or delete it, or pass ignore_unreadable)") from None
    log.warning("data gc: ignoring unreadable manifest: %s", exc)


def _classify(listing: list[ObjectMeta]) -> tuple[dict[str, ObjectMeta], dict[str, ObjectMeta]]:
    """(shards, transform work markers) of a ``datasets/`` listing, by key."""
    shards, markers = {}, {}
    for meta in listing:
        parts = meta.key.split("/")
        if len(parts) >= 4 and parts[2] == "shards":
            shards[meta.key] = meta
        elif len(parts) >= 5 and parts[2] == "work":
            markers[meta.key] = meta
    return shards, markers


def collect_garbage(store: Store, options: DataGcOptions | None = None, *, dry_run: bool = False,
                    now: Callable[[], float] = time.time) -> DataGcReport:
    """One sweep over ``store``'s datasets (see the module docstring); returns what it did."""
    opts = options or DataGcOptions()
    t0 = now()
    report = DataGcReport(dry_run=dry_run)
    marker = SweepMarker(store, GC_PREFIX, max_duration=float(opts.max_duration),  # type: ignore[arg-type]
                         heartbeat=float(opts.heartbeat), now=now)  # type: ignore[arg-type]
    if not dry_run:
        marker.start()  # (1) before any listing
    try:
        shards, work = _classify(list(store.list("datasets/")))  # (2)
        report.shards = len(shards)
        report.shard_bytes = sum(m.size for m in shards.values())
        leases = live_leases(store, GC_PREFIX, t0, delete_expired=not dry_run)  # (3) leases first
        report.leases = len(leases)
        ranges = [r for lease in leases for r in lease.ranges]
        refs, pending, report.versions, report.datasets = referenced_shards(
            store, ignore_unreadable=opts.ignore_unreadable)
        report.missing = sum(1 for key in refs - shards.keys() if not store.exists(key))
        cutoff = t0 - float(opts.grace)  # type: ignore[arg-type]
        victims: list[tuple[str, int]] = []
        for key, meta in shards.items():
            if key in refs:
                report.referenced += 1
                report.referenced_bytes += meta.size
                continue
            report.unreferenced += 1
            if key in pending:
                report.pending += 1
            elif covered(key, ranges):
                report.leased += 1
            elif meta.mtime is None or meta.mtime >= cutoff:
                report.too_young += 1
            else:
                victims.append((key, meta.size))
        doomed = {k for k, _ in victims}
        stale_markers = [(key, meta.size) for key, meta in work.items()
                         if not covered(key, ranges) and meta.mtime is not None and meta.mtime < cutoff
                         and (out := marker_output_key(key)) is not None
                         and (out in doomed or out not in shards)]
        if dry_run:
            report.deleted = len(victims)
            report.bytes_reclaimed = sum(s for _, s in victims)
            report.deleted_keys = sorted(doomed)
            report.markers_deleted = len(stale_markers)
        else:
            _delete(store, victims, opts, marker, report)  # (4)
            if not report.stopped_early:
                _delete(store, stale_markers, opts, marker, report, markers=True)
    finally:
        report.seconds = now() - t0
        if not dry_run:
            marker.finish(deleted=report.deleted)  # (5)
            try:
                expire_markers(store, GC_PREFIX, now(), float(opts.marker_ttl))  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - housekeeping only; the sweep is done
                log.warning("data gc: could not expire old sweep markers: %s", exc)
    log.info("data gc of %s: %d shards, %d referenced, %d leased, deleted %d (%.1f MB)%s", store.url,
             report.shards, report.referenced, report.leased, report.deleted, report.bytes_reclaimed / 1e6,
             " [dry run]" if dry_run else "")
    return report


def _delete(store: Store, victims: list[tuple[str, int]], opts: DataGcOptions, marker: SweepMarker,
            report: DataGcReport, markers: bool = False) -> None:
    with ThreadPoolExecutor(max_workers=opts.workers, thread_name_prefix="trainstore-data-gc") as pool:
        for i in range(0, len(victims), opts.batch):
            if not marker.may_delete():
                report.stopped_early = True
                log.warning("data gc: sweep deadline reached or heartbeat lapsed; stopping with %d objects left",
                            len(victims) - i)
                return
            batch = victims[i:i + opts.batch]
            list(pool.map(lambda kv: store.delete(kv[0]), batch))
            if markers:
                report.markers_deleted += len(batch)
                continue
            report.deleted += len(batch)
            report.bytes_reclaimed += sum(s for _, s in batch)
            report.deleted_keys += [k for k, _ in batch]


__all__ = ["DataGcOptions", "DataGcReport", "GC_PREFIX", "collect_garbage", "referenced_shards"]
