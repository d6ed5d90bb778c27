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

**Save** (``commit_lease``, called by ``CheckpointManager`` right before it commits a
manifest): (a) write the lease naming every chunk key of the manifest; (b) list sweep
markers; a sweep that is still running, or that finished after this process last checked
its chunk knowledge, may have deleted a chunk the save reuses (a dedup hit, a base chunk, a
key the ChunkStore remembered) - so (c) wait until running sweeps are done (or past their
deadline, which a crashed sweep stops renewing), forget cached chunk knowledge, HEAD every chunk of the manifest and write back
any that is missing (from the staged bytes); if the lease has grown older than
``LEASE_RENEW_S`` meanwhile, write it again and repeat (b)-(c) (sweeps honour a lease for
``GcOptions.lease_ttl`` >= ``MIN_LEASE_TTL_S`` after its creation); (d) commit the manifest;
(e) drop the lease. Whether a running sweep's process is provably dead (so not worth waiting
for) is ``liveness.writer_state``'s call: only on the same host, boot and PID namespace.

Why it is safe: a sweep whose listing (3) happens after the lease (a) is visible protects
the save's chunks. A sweep whose listing came earlier wrote its marker (1) before that,
so the save sees the marker in (b) and re-checks after the sweep's deletions ended (c).
Chunks deleted *before* a save's own HEADs are simply written again. The grace period
additionally protects writers that do not take leases (a crashed save's leftovers become
garbage only after it). Listing is strongly consistent on S3, GCS, Azure and locally.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..checkpoint import manifest as mf
from ..chunks import ChunkRef, ChunkStore, replica_key
from ..errors import ConfigError, IntegrityError, ManifestError, NotFoundError, TrainstoreError
from ..store.base import Store
from .liveness import identity, writer_dead
from .retention import parse_duration

log = logging.getLogger("trainstore.lifecycle.gc")

SWEEPS = "gc/sweeps/"
LEASES = "gc/leases/"
#: allowance for clock differences between the machines that save and sweep
CLOCK_SKEW_S = 60.0
#: the shortest ``GcOptions.lease_ttl`` a sweep accepts
MIN_LEASE_TTL_S = 600.0
#: a save whose lease is older than this when it is about to commit writes it again and re-checks
#: (so between a lease's last write and the commit, any sweep counts it live: < ttl - 2 skews)
LEASE_RENEW_S = MIN_LEASE_TTL_S - 3 * CLOCK_SKEW_S
#: what a lease says about itself (older sweeps read only ``expires``); sweeps also apply their ``lease_ttl``
LEASE_EXPIRES_S = 86400.0


@dataclass(frozen=True)
class GcOptions:
    """How a sweep runs. Durations: seconds or strings like ``"1h"``."""

    grace: float | str = "1h"  # only chunks older than this are deleted
    max_duration: float | str = "1h"  # the sweep stops deleting after this, whatever happens
    heartbeat: float | str = 10.0  # the marker's deadline is renewed this often, to now + 3 beats
    marker_ttl: float | str = "7d"  # finished markers are removed after this
    lease_ttl: float | str = "1d"  # leases of crashed saves expire after this
    workers: int = 8
    batch: int = 256
    ignore_unreadable: bool = False  # sweep even if a manifest cannot be read (its chunks may go!)

    def __post_init__(self) -> None:
        for name in ("grace", "max_duration", "marker_ttl", "lease_ttl", "heartbeat"):
            object.__setattr__(self, name, parse_duration(getattr(self, name), name))
        if not self.heartbeat > 0:  # type: ignore[operator]
            raise ConfigError(f"heartbeat must be a positive duration, got {self.heartbeat!r}")
        if self.lease_ttl < MIN_LEASE_TTL_S:  # type: ignore[operator]
            raise ConfigError(f"lease_ttl must be at least {MIN_LEASE_TTL_S:.0f} s (saves renew a lease older "
                              f"than {LEASE_RENEW_S:.0f} s before committing), got {self.lease_ttl!r}")
        if not isinstance(self.workers, int) or self.workers < 1 or not isinstance(self.batch, int) or self.batch < 1:
            raise ConfigError("workers and batch must be positive ints")


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
    stopped_early: bool = False
    seconds: float = 0.0
    deleted_keys: list[str] = field(default_factory=list, repr=False)

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        out.pop("deleted_keys")
        return out


def _now() -> float:
    return time.time()


def _load_json(store: Store, key: str) -> dict | None:
    try:
        obj = json.loads(bytes(memoryview(store.get(key))))
        return obj if isinstance(obj, dict) else None
    except NotFoundError:
        return None
    except (ValueError, UnicodeDecodeError):
        return None


def _put_json(store: Store, key: str, obj: dict) -> None:
    store.put(key, json.dumps(obj).encode())


def referenced_chunks(store: Store, *, ignore_unreadable: bool = False,
                      on_manifest: Callable[[], Any] | None = None) -> tuple[set[str], int, int]:
    """Chunk keys referenced by every committed manifest of every job: (keys, manifests, jobs)."""
    keys: set[str] = set()
    n = 0
    jobs = mf.list_jobs(store)
    for job in jobs:
        for m in mf.list_manifests(store, job):
            if isinstance(m, ManifestError):
                if not ignore_unreadable:
                    raise ManifestError(f"gc refuses to run: {m} (it cannot know which chunks that manifest "
                                        "references; repair or delete it, or pass ignore_unreadable)")
                log.warning("gc: ignoring unreadable manifest: %s", m)
                continue
            keys |= mf.manifest_chunk_keys(m)
            n += 1
            if on_manifest is not None:
                on_manifest()
    return keys, n, len(jobs)


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
        obj = _load_json(store, meta.key)
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
                    progress: Callable[[str, int, int], Any] | None = None) -> GcReport:
    """One sweep over ``store`` (see module docstring). Returns a report with bytes reclaimed."""
    opts = options or GcOptions()
    t0 = now()
    report = GcReport(dry_run=dry_run)
    # named by the hard deadline: savers skip (without reading) markers that ended long ago
    hard = t0 + float(opts.max_duration)  # type: ignore[arg-type]
    marker_key = f"{SWEEPS}{int(hard * 1000):015d}-{uuid.uuid4().hex[:12]}.json"
    marker = {"state": "running", "started": t0, **identity()}
    beat = _Heartbeat(store, marker_key, marker, opts, now)
    if not dry_run:
        beat.start()  # (1) the marker is written before any listing, then kept alive
    try:
        chunks = ChunkStore(store)
        present = {key: (size, mtime) for key, size, mtime in chunks.list_keys()}  # (2)
        report.chunks = len(present)
        report.chunk_bytes = sum(s for s, _ in present.values())
        if progress:
            progress("listed chunks", len(present), len(present))
        # (3) leases BEFORE manifests: a save drops its lease only after committing, so a lease
        # missing from this listing is either not written yet (the save will see our marker) or
        # dropped after a commit that the manifest listing below then sees.
        leased, report.leases = live_leases(store, t0, opts.lease_ttl, dry_run)  # type: ignore[arg-type]
        refs, report.manifests, report.jobs = referenced_chunks(store, ignore_unreadable=opts.ignore_unreadable)
        # A save may write chunks after the chunk listing and commit before the manifest
        # listing: its newest chunks look missing. Confirm with a HEAD before reporting.
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
            beat.stop()
            try:
                _put_json(store, marker_key, {**marker, "state": "done", "finished": now(),
                                              "deleted": report.deleted})  # (5)
                _expire_markers(store, now(), opts.marker_ttl)  # type: ignore[arg-type]
            except TrainstoreError as exc:  # the marker's deadline still bounds what savers wait for
                log.warning("gc: could not finish sweep marker %s: %s", marker_key, exc)
    log.info("gc of %s: %d chunks, %d referenced, deleted %d (%.1f MB)%s", store.url, report.chunks,
             report.referenced, report.deleted, report.bytes_reclaimed / 1e6, " [dry run]" if dry_run else "")
    return report


class _Heartbeat:
    """Keeps a sweep marker alive: its ``deadline`` is renewed every ``heartbeat`` seconds to
    now + 3 beats (never past started + max_duration). Savers wait for a running sweep only
    until its deadline, so a crashed sweep delays saves by seconds, not an hour. In turn the
    sweep deletes only while its published deadline is at least one beat ahead, and stops for
    good if a renewal ever came late (a paused process: savers may have stopped waiting)."""

    def __init__(self, store: Store, key: str, marker: dict, opts: GcOptions, now: Callable[[], float]) -> None:
        self.store, self.key, self.marker, self.now = store, key, marker, now
        self.period = float(opts.heartbeat)  # type: ignore[arg-type]
        self.hard = marker["started"] + float(opts.max_duration)  # type: ignore[arg-type]
        self.deadline = 0.0
        self.lapsed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainstore-gc-heartbeat", daemon=True)

    def _renew(self) -> None:
        t = self.now()
        if self.deadline and t > self.deadline:
            self.lapsed = True
            return
        deadline = min(t + 3 * self.period, self.hard)
        _put_json(self.store, self.key, {**self.marker, "deadline": deadline})
        if self.deadline and self.now() > self.deadline:  # the put itself outlived the old deadline
            self.lapsed = True
        self.deadline = deadline

    def start(self) -> None:
        self._renew()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period) and not self.lapsed:
            try:
                self._renew()
            except TrainstoreError as exc:
                log.warning("gc: could not renew sweep marker %s: %s", self.key, exc)

    def may_delete(self) -> bool:
        return not self.lapsed and self.now() + self.period < self.deadline

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def _delete(store: Store, victims: list[tuple[str, int]], opts: GcOptions, beat: _Heartbeat, report: GcReport,
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
        obj = _load_json(store, m.key)
        if obj is None:
            continue
        ended = float(obj.get("finished") or 0) if obj.get("state") == "done" else float(obj.get("deadline") or 0)
        if ended < now - ttl:  # finished long ago, or a crashed sweep's marker whose deadline passed long ago
            store.delete(m.key)


def sweep_markers(store: Store, since: float | None = None) -> Iterator[dict]:
    """Sweep markers (with their ``key``); with ``since``, only sweeps that may have been
    deleting at or after ``since`` (the key carries the sweep's hard deadline)."""
    for m in list(store.list(SWEEPS)):
        if since is not None:
            stamp = m.key[len(SWEEPS):].split("-", 1)[0]
            if stamp.isdigit() and int(stamp) / 1000 + 2 * CLOCK_SKEW_S < since:
                continue
        obj = _load_json(store, m.key)
        if obj is not None:
            obj["key"] = m.key
            yield obj


# -- the save side ------------------------------------------------------------------------
class _Knowledge:
    """Per ChunkStore: since when its cached chunk-existence knowledge may date."""

    def __init__(self, since: float) -> None:
        self.since = since
        self.lock = threading.Lock()


_knowledge: weakref.WeakKeyDictionary[ChunkStore, _Knowledge] = weakref.WeakKeyDictionary()
_knowledge_lock = threading.Lock()
#: saves re-check every chunk when their knowledge is older than this (markers may have expired)
KNOWLEDGE_MAX_AGE_S = 86400.0


_fast: weakref.WeakKeyDictionary[Store, Store] = weakref.WeakKeyDictionary()


def _lease_store(store: Store) -> Store:
    """Where lease objects are written: a lease needs to be *visible* to sweeps, not durable
    (after a crash the save either committed - the manifest protects its chunks - or did not),
    so a local store writes them without fsync (0.2 ms instead of a few ms per save)."""
    from ..store.local import LocalStore

    if not isinstance(store, LocalStore) or not store.fsync:
        return store
    with _knowledge_lock:
        fast = _fast.get(store)
        if fast is None:
            fast = _fast[store] = LocalStore(store.root, fsync=False)
        return fast


def _gc_stores(store: Store) -> tuple[list[Store], list[Store]]:
    """(stores to lease in and watch for sweeps, stores whose lease is dropped at commit)."""
    fn = getattr(store, "gc_stores", None)
    if fn is None:
        return [store], [store]
    return fn()


def _relevant(markers: list[dict], since: float, now: float) -> list[dict]:
    out = []
    for m in markers:
        if m.get("state") == "running" and now <= float(m.get("deadline") or 0) + CLOCK_SKEW_S:
            out.append(m)
        elif float(m.get("finished") or m.get("deadline") or 0) >= since - CLOCK_SKEW_S:
            out.append(m)
    return out


@contextmanager
def commit_lease(store: Store, chunks: ChunkStore, manifest: mf.Manifest,
                 pieces: dict[str, memoryview] | None, started: float,
                 poll_s: float = 0.2) -> Iterator[mf.Manifest]:
    """Protect ``manifest``'s chunks from concurrent sweeps while it is committed.

    ``pieces`` maps tensor names to the raw bytes that were saved (to write back chunks a
    sweep removed); ``started`` is when the save began. Commit inside the ``with`` block.
    """
    stores, release_now = _gc_stores(store)
    keys = sorted(mf.manifest_chunk_keys(manifest, chunks.prefix))
    lease_key = f"{LEASES}{manifest.job}-{manifest.step:012d}-{uuid.uuid4().hex[:12]}.json"

    def write_lease() -> float:
        t = time.time()
        body = {"job": manifest.job, "step": manifest.step, "created": t, "expires": t + LEASE_EXPIRES_S,
                "chunks": keys}
        for s in stores:
            _put_json(_lease_store(s), lease_key, body)
        return t

    first = written = write_lease()  # (a)
    ok = False
    try:
        with _knowledge_lock:
            know = _knowledge.setdefault(chunks, _Knowledge(started))
        with know.lock:
            renewed = False
            while True:
                # after a renewal: any sweep since the first lease may have judged it expired
                since = min(know.since, first) if renewed else know.since
                now = time.time()
                markers = [m for s in stores for m in sweep_markers(s, since - CLOCK_SKEW_S)]  # (b)
                relevant = _relevant(markers, since, now)
                if renewed or relevant or now - know.since > KNOWLEDGE_MAX_AGE_S:
                    _wait_for(stores, {m["key"] for m in relevant if m.get("state") == "running"}, poll_s)  # (c)
                    forgotten_at = time.time()
                    chunks.forget()
                    restored = _ensure_chunks(chunks, manifest, pieces)
                    if restored:
                        log.warning("checkpoint %s step %d: a concurrent gc sweep removed %d reused chunks; "
                                    "wrote them again", manifest.job, manifest.step, restored)
                    know.since = forgotten_at
                if time.time() - written <= LEASE_RENEW_S:
                    break
                # waited long: a sweep with a short lease_ttl may stop honouring the lease; write it
                # again, then re-check against every sweep since the first write
                written, renewed = write_lease(), True
        yield manifest  # (d) the caller commits
        ok = True
    finally:
        for s in (release_now if ok else stores):  # (e)
            try:
                s.delete(lease_key)
            except TrainstoreError as exc:  # an orphan lease only delays gc until it expires
                log.warning("could not drop gc lease %s: %s", lease_key, exc)


def _wait_for(stores: list[Store], running: set[str], poll_s: float) -> None:
    while running:
        still = set()
        now = time.time()
        for key in running:  # re-read just these markers (deleted = done)
            for s in stores:
                m = _load_json(s, key)
                if m is not None and m.get("state") == "running" \
                        and now <= float(m.get("deadline") or 0) + CLOCK_SKEW_S:
                    if writer_dead(m):  # its process died: it deletes nothing more
                        log.info("gc sweep %s was left running by dead process %s on this host; "
                                 "not waiting for its deadline", key, m.get("pid"))
                        continue
                    still.add(key)
        running = still
        if running:
            time.sleep(poll_s)


def _ensure_chunks(chunks: ChunkStore, manifest: mf.Manifest, pieces: dict[str, memoryview] | None) -> int:
    """HEAD every chunk of ``manifest``; write back missing ones from ``pieces``. Returns count."""
    entries = []
    for name, t in manifest.tensors.items():
        pos = 0
        for piece in t.chunks:
            entries.append((name, pos, piece))
            pos += piece.size

    def exists(ref: ChunkRef) -> bool:
        try:
            chunks.store.head(ref.key(chunks.prefix))
            return True
        except NotFoundError:
            return False

    restored = 0
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="trainstore-gc-check") as pool:
        found = list(pool.map(lambda e: tuple(exists(r) for r in e[2].refs()), entries))
    for (name, pos, piece), here in zip(entries, found):
        if all(here):
            continue
        raw = None if pieces is None or name not in pieces else memoryview(pieces[name]).cast("B")[pos:pos + piece.size]
        if raw is None or raw.nbytes != piece.size:
            raise IntegrityError(f"checkpoint {manifest.job} step {manifest.step}: chunk(s) of tensor {name!r} were "
                                 "deleted by a concurrent gc sweep and the saved bytes are not available to rewrite")
        restored += sum(1 for h in here if not h)
        _rewrite(chunks, piece, raw, here)
    return restored


def _put_exact(chunks: ChunkStore, ref: ChunkRef, data: memoryview) -> None:
    got = chunks.put(data, ref.codec, ref.itemsize, digest=ref.hash).ref
    if got != ref:
        raise IntegrityError(f"rewriting chunk {ref.key(chunks.prefix)} gave {got.stored} stored bytes, "
                             f"the manifest records {ref.stored}")


def _rewrite(chunks: ChunkStore, piece: mf.ChunkEntry, raw: memoryview, here: tuple[bool, ...]) -> None:
    if piece.base is None:  # plain or same-as-base: the chunk is the raw piece
        _put_exact(chunks, piece.ref, raw)
        return
    delta_ok, base_ok = here
    a = np.frombuffer(raw, dtype=np.uint8)
    if not delta_ok and not base_ok:
        raise IntegrityError(f"both the delta {piece.ref.key(chunks.prefix)} and its base chunk were deleted")
    other = piece.base if base_ok else piece.ref
    other_raw = np.frombuffer(memoryview(chunks.get(other)).cast("B"), dtype=np.uint8)
    missing = piece.ref if base_ok else piece.base
    _put_exact(chunks, missing, memoryview(np.bitwise_xor(a, other_raw)))


__all__ = ["GcOptions", "GcReport", "collect_garbage", "commit_lease", "lease_expiry", "live_leases",
           "referenced_chunks", "sweep_markers", "LEASES", "LEASE_RENEW_S", "MIN_LEASE_TTL_S", "SWEEPS"]
