"""Sweep markers and writer leases: what a garbage collector and concurrent writers share.

Neutral ground (it needs only ``store`` and ``errors``), so any collector can use it: the
data GC (``trainstore.data.gc``) does; the checkpoint GC (``trainstore.lifecycle.gc``)
implements the same protocol for chunks and can move onto these pieces.

* A **sweep marker** (``<prefix>sweeps/<hard-deadline-ms>-<id>.json``) is written before a
  sweep lists anything; its ``deadline`` is renewed by a heartbeat, so a crashed sweep
  stops counting as running within seconds. The sweep deletes only while its published
  deadline is a beat ahead (``SweepMarker.may_delete``), and marks the marker ``done``.
* A **lease** (``<prefix>leases/<name>.json``) names key ranges a writer is about to write
  or will commit later. A writer writes its lease *before* the objects it protects. A
  sweep lists leases *before* manifests, and keeps every key a live lease covers. Leases
  of crashed writers expire (``ttl``); a lease without ``ttl`` lasts until dropped.
* A writer that **reuses** an object which existed before its lease (a resumed transform)
  calls ``wait_for_sweeps`` after writing the lease and re-checks the object afterwards: a
  sweep whose listing predates the lease has then finished deleting.
* ``SweepOptions`` is what every sweep is configured with (grace, deadline, heartbeat,
  marker expiry, parallelism, unreadable manifests); each collector's options extend it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .durations import parse_duration
from .errors import ConfigError, NotFoundError, TrainstoreError
from .liveness import identity
from .store.base import Store

log = logging.getLogger("trainstore.sweeps")

#: allowance for clock differences between the machines that write and sweep
CLOCK_SKEW_S = 60.0


@dataclass(frozen=True)
class SweepOptions:
    """How a sweep runs (the options every collector shares). Durations: seconds or strings
    like ``"1h"``, parsed to seconds."""

    grace: float | str = "1h"  # only objects older than this are deleted
    max_duration: float | str = "1h"  # the sweep stops deleting after this, whatever happens
    heartbeat: float | str = 10.0  # the marker's deadline is renewed this often, to now + 3 beats
    marker_ttl: float | str = "7d"  # finished sweep markers are removed after this
    workers: int = 8
    batch: int = 256
    ignore_unreadable: bool = False  # sweep even if a manifest cannot be read (what it names may go!)

    def __post_init__(self) -> None:
        for name in ("grace", "max_duration", "heartbeat", "marker_ttl"):
            object.__setattr__(self, name, parse_duration(getattr(self, name), name))
        if not self.heartbeat > 0:  # type: ignore[operator]
            raise ConfigError(f"heartbeat must be a positive duration, got {self.heartbeat!r}")
        for name in ("workers", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")



def load_json(store: Store, key: str) -> dict | None:
    """A small JSON object, or None when missing or unreadable (a torn or foreign object)."""
    try:
        obj = json.loads(bytes(memoryview(store.get(key))))
    except NotFoundError:
        return None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def put_json(store: Store, key: str, obj: dict) -> None:
    store.put(key, json.dumps(obj).encode())


# -- key ranges --------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyRange:
    """Keys starting with ``prefix``; with ``from_seq`` > 0 only those whose next digits
    (a sequence number) are at least ``from_seq``. Keys with no digits there are covered."""

    prefix: str
    from_seq: int = 0

    def covers(self, key: str) -> bool:
        if not key.startswith(self.prefix):
            return False
        if self.from_seq <= 0:
            return True
        digits = re.match(r"\d+", key[len(self.prefix):])
        return digits is None or int(digits.group()) >= self.from_seq

    def to_json(self) -> dict:
        return {"prefix": self.prefix, "from_seq": self.from_seq}

    @classmethod
    def from_json(cls, obj: object) -> KeyRange | None:
        if not isinstance(obj, dict) or not isinstance(obj.get("prefix"), str) or not obj["prefix"]:
            return None
        seq = obj.get("from_seq", 0)
        return cls(obj["prefix"], seq if isinstance(seq, int) and not isinstance(seq, bool) else 0)


def covered(key: str, ranges: Iterable[KeyRange]) -> bool:
    return any(r.covers(key) for r in ranges)


# -- leases ------------------------------------------------------------------------------------
class Lease:
    """A writer's claim on key ranges, visible to sweeps under ``<prefix>leases/``.

    ``ttl`` None: the lease lasts until ``drop`` (an ingest's acknowledged but uncommitted
    shards must outlive a crash). Otherwise it expires ``ttl`` seconds after its last
    renewal; a daemon thread renews it every ``ttl / 4`` while the writer is alive.
    """

    def __init__(self, store: Store, prefix: str, name: str, ranges: Iterable[KeyRange], *,
                 ttl: float | None = 86400.0, kind: str = "") -> None:
        self.store = store
        self.key = f"{prefix}leases/{name}.json"
        self.ranges = tuple(ranges)
        self.ttl, self.kind = ttl, kind
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mu = threading.Lock()

    def _body(self) -> dict:
        t = time.time()
        return {"kind": self.kind, "ranges": [r.to_json() for r in self.ranges], "renewed": t,
                "expires": None if self.ttl is None else t + self.ttl}

    def write(self) -> Lease:
        """Publish (or renew) the lease; durable when this returns. Starts the renewals."""
        with self._mu:
            put_json(self.store, self.key, self._body())
        if self.ttl is not None and self._thread is None:
            self._thread = threading.Thread(target=self._renew, name="trainstore-lease", daemon=True)
            self._thread.start()
        return self

    def update(self, ranges: Iterable[KeyRange]) -> None:
        """Replace the covered ranges (write the new lease before relying on it)."""
        self.ranges = tuple(ranges)
        self.write()

    def _renew(self) -> None:
        assert self.ttl is not None
        while not self._stop.wait(max(self.ttl / 4, 0.05)):
            try:
                with self._mu:
                    if not self._stop.is_set():
                        put_json(self.store, self.key, self._body())
            except TrainstoreError as exc:  # the next beat retries; expiry is ttl away
                log.warning("could not renew lease %s: %s", self.key, exc)

    def stop(self) -> None:
        """Stop renewing, keep the lease (it expires after ``ttl``, or lasts if none)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def drop(self) -> None:
        """Stop renewing and delete the lease (call after the covered objects are committed)."""
        self.stop()
        with self._mu:
            try:
                self.store.delete(self.key)
            except TrainstoreError as exc:  # an orphan lease only delays gc until it expires
                log.warning("could not drop lease %s: %s", self.key, exc)

    def __enter__(self) -> Lease:
        return self.write()

    def __exit__(self, *exc: object) -> None:
        self.drop()


@dataclass
class LeaseInfo:
    """A live lease as a sweep sees it."""

    key: str
    kind: str
    ranges: tuple[KeyRange, ...]
    renewed: float
    expires: float | None


def live_leases(store: Store, prefix: str, now: float, *, delete_expired: bool = True) -> list[LeaseInfo]:
    """Unexpired leases under ``<prefix>leases/``; expired ones (crashed writers) are deleted
    (unless ``delete_expired`` is false, for a dry run)."""
    out = []
    for meta in list(store.list(f"{prefix}leases/")):
        obj = load_json(store, meta.key)
        if obj is None:
            continue
        expires = obj.get("expires")
        if isinstance(expires, (int, float)) and expires + CLOCK_SKEW_S < now:
            if delete_expired:
                store.delete(meta.key)
            continue
        ranges = tuple(r for r in (KeyRange.from_json(x) for x in obj.get("ranges") or []) if r is not None)
        renewed = obj.get("renewed")
        out.append(LeaseInfo(meta.key, str(obj.get("kind") or ""), ranges,
                             float(renewed) if isinstance(renewed, (int, float)) else 0.0,
                             float(expires) if isinstance(expires, (int, float)) else None))
    return out


# -- sweep markers -----------------------------------------------------------------------------
class SweepMarker:
    """A running sweep's marker, kept alive by a heartbeat.

    Its ``deadline`` is renewed every ``heartbeat`` seconds to now + 3 beats (never past
    started + ``max_duration``). Writers wait for a running sweep only until its deadline, so
    a crashed sweep delays them by seconds. The sweep may delete only while its published
    deadline is at least one beat ahead, and stops for good once a renewal came late (a
    paused process: writers may have stopped waiting)."""

    def __init__(self, store: Store, prefix: str, *, max_duration: float, heartbeat: float,
                 now: Callable[[], float] = time.time) -> None:
        self.store, self.now = store, now
        self.period = heartbeat
        self.started = now()
        self.hard = self.started + max_duration
        # named by the hard deadline: writers skip (without reading) markers that ended long ago
        self.key = f"{prefix}sweeps/{int(self.hard * 1000):015d}-{uuid.uuid4().hex[:12]}.json"
        self.body = {"state": "running", "started": self.started, **identity()}  # who sweeps (liveness)
        self.deadline = 0.0
        self.lapsed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainstore-sweep-heartbeat", daemon=True)

    def _renew(self) -> None:
        t = self.now()
        if self.deadline and t > self.deadline:
            self.lapsed = True
            return
        deadline = min(t + 3 * self.period, self.hard)
        put_json(self.store, self.key, {**self.body, "deadline": deadline})
        if self.deadline and self.now() > self.deadline:  # the put itself outlived the old deadline
            self.lapsed = True
        self.deadline = deadline

    def start(self) -> None:
        """Write the marker (durably, before the sweep lists anything) and start the heartbeat."""
        self._renew()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period) and not self.lapsed:
            try:
                self._renew()
            except TrainstoreError as exc:
                log.warning("could not renew sweep marker %s: %s", self.key, exc)

    def may_delete(self) -> bool:
        return not self.lapsed and self.now() + self.period < self.deadline

    def finish(self, **fields: object) -> None:
        """Stop the heartbeat and mark the sweep done (writers stop waiting for it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            put_json(self.store, self.key, {**self.body, "state": "done", "finished": self.now(), **fields})
        except TrainstoreError as exc:  # its deadline still bounds what writers wait for
            log.warning("could not finish sweep marker %s: %s", self.key, exc)


def running_sweeps(store: Store, prefix: str, now: float | None = None) -> set[str]:
    """Keys of sweep markers that are running and within their deadline."""
    now = time.time() if now is None else now
    out = set()
    for meta in list(store.list(f"{prefix}sweeps/")):
        stamp = meta.key.rsplit("/", 1)[-1].split("-", 1)[0]
        if stamp.isdigit() and int(stamp) / 1000 + CLOCK_SKEW_S < now:
            continue  # past its hard deadline: deletes nothing more
        obj = load_json(store, meta.key)
        if obj is not None and obj.get("state") == "running" \
                and now <= float(obj.get("deadline") or 0) + CLOCK_SKEW_S:
            out.add(meta.key)
    return out


def wait_for_sweeps(store: Store, prefix: str, poll_s: float = 0.2) -> int:
    """Block until every sweep running now has finished or passed its deadline (after
    that it deletes nothing more). Returns how many were waited for."""
    running = running_sweeps(store, prefix)
    waited = len(running)
    while running:
        time.sleep(poll_s)
        now = time.time()
        still = set()
        for key in running:
            obj = load_json(store, key)
            if obj is not None and obj.get("state") == "running" \
                    and now <= float(obj.get("deadline") or 0) + CLOCK_SKEW_S:
                still.add(key)
        running = still
    return waited


def expire_markers(store: Store, prefix: str, now: float, ttl: float) -> int:
    """Delete markers of sweeps that ended more than ``ttl`` seconds ago."""
    n = 0
    for meta in list(store.list(f"{prefix}sweeps/")):
        obj = load_json(store, meta.key)
        if obj is None:
            continue
        ended = float(obj.get("finished") or 0) if obj.get("state") == "done" else float(obj.get("deadline") or 0)
        if ended < now - ttl:
            store.delete(meta.key)
            n += 1
    return n


__all__ = ["CLOCK_SKEW_S", "KeyRange", "Lease", "LeaseInfo", "SweepMarker", "SweepOptions", "covered",
           "expire_markers", "live_leases", "load_json", "put_json", "running_sweeps", "wait_for_sweeps"]
