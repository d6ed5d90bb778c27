"""The save side of the GC protocol: a lease on a manifest's chunks while it is committed.

Two kinds of small objects are shared with the sweep (``trainstore.lifecycle.gc``, which
imports the names from here; see docs/lifecycle.md for the argument):

    gc/sweeps/<deadline-ms>-<id>.json a sweep marker: {"state": "running"|"done", started, deadline, finished}
    gc/leases/<job>-<step>-<id>.json a save lease: the chunk keys a save is about to commit

**Save** (``commit_lease``, used by the save backends right before they commit a manifest):
(a) write the lease naming every chunk key of the manifest; (b) list sweep markers; a sweep
that is still running, or that finished after this process last checked its chunk
knowledge, may have deleted a chunk the save reuses (a dedup hit, a base chunk, a key the
ChunkStore remembered) - so (c) wait until running sweeps are done (or past their deadline,
which a crashed sweep stops renewing, or their process is provably dead:
``trainstore.liveness``), forget cached chunk knowledge, HEAD every chunk of the manifest
and write back any that is missing (from the staged bytes); if the lease has grown older
than ``LEASE_RENEW_S`` meanwhile, write it again and repeat (b)-(c) (sweeps honour a lease
for ``GcOptions.lease_ttl`` >= ``MIN_LEASE_TTL_S`` after its creation); (d) commit the
manifest; (e) drop the lease.

**Where**: the lease lives in the tier the commit happens in (``commit_tier``): a plain store
itself, a write-back tiered store's hot tier, a write-through one's durable tier. A save
never writes to (or waits on) a tier it does not commit to, so a durable tier that is full
or down does not fail hot saves. In write-back mode the hot tier is the write view: a hot
checkpoint's chunks are all in hot. The tiering engine's copy to the durable tier
(``lifecycle.tiering.copy_checkpoint``) takes its own lease there (``CopyLease``):
written before it looks at which chunks the durable tier holds, it makes every sweep
that lists later keep them; sweeps running already are waited for (they may have listed
before the lease); the lease is renewed while the copy runs and dropped after its manifest
commit.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from ...chunks import ChunkRef, ChunkStore
from ...errors import IntegrityError, NotFoundError, StoreError, TrainstoreError
from ...liveness import writer_dead
from ...store import open_store
from ...store.base import Store
from ...store.tiered import TieredStore
from ...sweeps import CLOCK_SKEW_S, load_json, put_json
from ..format import manifest as mf
from ..format.packs import rebuild_pack

log = logging.getLogger("trainstore.checkpoint.save.lease")

SWEEPS = "gc/sweeps/"
LEASES = "gc/leases/"
#: the shortest ``GcOptions.lease_ttl`` a sweep accepts
MIN_LEASE_TTL_S = 600.0
#: a save whose lease is older than this when it is about to commit writes it again and re-checks
#: (so between a lease's last write and the commit, any sweep counts it live: < ttl - 2 skews)
LEASE_RENEW_S = MIN_LEASE_TTL_S - 3 * CLOCK_SKEW_S
#: what a lease says about itself (older sweeps read only ``expires``); sweeps also apply their ``lease_ttl``
LEASE_EXPIRES_S = 86400.0


def sweep_markers(store: Store, since: float | None = None) -> Iterator[dict]:
    """Sweep markers (with their ``key``); with ``since``, only sweeps that may have been
    deleting at or after ``since`` (the key carries the sweep's hard deadline)."""
    for m in list(store.list(SWEEPS)):
        if since is not None:
            stamp = m.key[len(SWEEPS):].split("-", 1)[0]
            if stamp.isdigit() and int(stamp) / 1000 + 2 * CLOCK_SKEW_S < since:
                continue
        obj = load_json(store, m.key)
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
    so a local store with fsync writes them through a twin without fsync (0.2 ms instead of
    a few ms per save)."""
    caps = store.capabilities
    if not (caps.local and caps.fsync):
        return store
    with _knowledge_lock:
        fast = _fast.get(store)
        if fast is None:
            fast = _fast[store] = open_store(store.url, fsync=False)
        return fast


def commit_tier(store: Store) -> Store:
    """The tier a commit through ``store`` happens in (where its lease belongs): the durable
    tier of a write-through tiered store, else the write view (a write-back tiered store's
    hot tier; a plain store itself)."""
    view = store.write_view()
    if isinstance(view, TieredStore) and not view.write_back:
        return view.durable
    return view


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
    stores = [commit_tier(store)]
    keys = sorted(mf.manifest_chunk_keys(manifest, chunks.prefix))
    lease_key = f"{LEASES}{manifest.job}-{manifest.step:012d}-{uuid.uuid4().hex[:12]}.json"

    def write_lease() -> float:
        t = time.time()
        body = {"job": manifest.job, "step": manifest.step, "created": t, "expires": t + LEASE_EXPIRES_S,
                "chunks": keys}
        for s in stores:
            put_json(_lease_store(s), lease_key, body)
        return t

    first = written = write_lease()  # (a)
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
    finally:
        for s in stores:  # (e)
            try:
                s.delete(lease_key)
            except TrainstoreError as exc:  # an orphan lease only delays gc until it expires
                log.warning("could not drop gc lease %s: %s", lease_key, exc)


class CopyLease:
    """A tier copy's lease on the destination tier (see the module docstring, **Where**).

    ``with CopyLease(dst, job, step, keys) as lease:`` writes the lease and waits for the
    sweeps running on ``dst``; the copy then looks at and writes chunks, calls
    ``lease.check()`` and commits the manifest; leaving the block drops the lease. A thread
    renews the lease every ``LEASE_RENEW_S / 4``; ``check`` raises if no write succeeded for
    ``LEASE_RENEW_S`` (a sweep may no longer honour it: copy again later).
    """

    def __init__(self, store: Store, job: str, step: int, keys: Iterable[str], poll_s: float = 0.2) -> None:
        self.store, self.job, self.step = store, job, step
        self.key = f"{LEASES}{job}-{step:012d}-copy-{uuid.uuid4().hex[:12]}.json"
        self.keys = sorted(keys)
        self.poll_s = poll_s
        self.written = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="trainstore-copy-lease", daemon=True)

    def _write(self) -> None:
        t = time.time()
        put_json(_lease_store(self.store), self.key, {"job": self.job, "step": self.step, "created": t,
                                                      "expires": t + LEASE_EXPIRES_S, "chunks": self.keys})
        self.written = t

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_RENEW_S / 4):
            try:
                self._write()
            except TrainstoreError as exc:  # the next beat retries; check() tells the copy
                log.warning("could not renew tier copy lease %s: %s", self.key, exc)

    def check(self) -> None:
        """Raise ``StoreError`` if the lease may have lapsed (call right before the commit)."""
        age = time.time() - self.written
        if age > LEASE_RENEW_S:
            raise StoreError(f"the gc lease of the copy of step {self.step} of job {self.job!r} to {self.store.url} "
                             f"was last written {age:.0f} s ago; a gc sweep may no longer honour it (copy again)")

    def __enter__(self) -> CopyLease:
        self._write()  # before the copy looks at what the destination holds
        try:
            markers = sweep_markers(self.store, self.written - 2 * CLOCK_SKEW_S)
            running = {m["key"] for m in _relevant(list(markers), self.written, self.written)
                       if m.get("state") == "running"}
            _wait_for([self.store], running, self.poll_s)  # they may have listed before the lease
        except BaseException:
            self._drop()
            raise
        self._thread.start()
        return self

    def _drop(self) -> None:
        try:
            self.store.delete(self.key)
        except TrainstoreError as exc:  # an orphan lease only delays gc until it expires
            log.warning("could not drop tier copy lease %s: %s", self.key, exc)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._drop()


def _wait_for(stores: list[Store], running: set[str], poll_s: float) -> None:
    while running:
        still = set()
        now = time.time()
        for key in running:  # re-read just these markers (deleted = done)
            for s in stores:
                m = load_json(s, key)
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
            chunks.store.write_view().head(ref.key(chunks.prefix))  # not the archive: see ChunkStore.put
            return True
        except NotFoundError:
            return False

    restored = 0
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="trainstore-gc-check") as pool:
        found = list(pool.map(lambda e: tuple(exists(r) for r in e[2].refs()), entries))
    lost_packs: dict[ChunkRef, list[tuple[mf.ChunkEntry, memoryview]]] = {}
    for (name, pos, piece), here in zip(entries, found):
        if all(here):
            continue
        raw = None if pieces is None or name not in pieces else memoryview(pieces[name]).cast("B")[pos:pos + piece.size]
        if raw is None or raw.nbytes != piece.size:
            raise IntegrityError(f"checkpoint {manifest.job} step {manifest.step}: chunk(s) of tensor {name!r} were "
                                 "deleted by a concurrent gc sweep and the saved bytes are not available to rewrite")
        if piece.span is not None:  # a pack: rebuilt from all its members below
            lost_packs.setdefault(piece.ref, []).append((piece, raw))
            continue
        restored += sum(1 for h in here if not h)
        _rewrite(chunks, piece, raw, here)
    for ref, members in lost_packs.items():
        _put_exact(chunks, ref, rebuild_pack(chunks, ref, members))
        restored += 1
    return restored


def _put_exact(chunks: ChunkStore, ref: ChunkRef, data: memoryview) -> None:
    """Write back chunk ``ref`` from its raw bytes. The write is conditional: another writer
    may win with its own copy (another codec level: another stored size), so only what names
    the content is compared (hash, codec, raw size), never ``stored`` (see ``ChunkRef.max_stored``)."""
    got = chunks.put(data, ref.codec, ref.itemsize, digest=ref.hash).ref
    if (got.hash, got.codec, got.size) != (ref.hash, ref.codec, ref.size):
        raise IntegrityError(f"rewriting chunk {ref.key(chunks.prefix)} gave {got.key(chunks.prefix)} of {got.size} "
                             f"raw bytes, the manifest records {ref.size}")


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



__all__ = ["CopyLease", "commit_lease", "commit_tier", "sweep_markers", "CLOCK_SKEW_S", "KNOWLEDGE_MAX_AGE_S", "LEASES", "LEASE_EXPIRES_S",
           "LEASE_RENEW_S", "MIN_LEASE_TTL_S", "SWEEPS"]
