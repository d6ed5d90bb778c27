"""Periodic background verification of a job's checkpoints, at a bounded read rate.

    verifier = BackgroundVerifier(tiers.store, "run-1", period="10m", rate_bytes_s=50e6)
    tiers.observers.append(verifier.observe)   # verify each checkpoint after its tier copy
    metrics.watch_verifier(verifier, "run-1")  # trainstore_ckpt_verify_alert & co.
    verifier.start()  ...  verifier.stop()

Every ``period`` a **sweep** deep-verifies every checkpoint of the job, newest first:
each chunk is read, decoded and re-hashed (``checkpoint.verify.verify_manifest``; on a
tiered store ``ChunkStore.verify`` reads the copy in every tier and repairs a bad copy from a
good one, each repair counted), and the outcome is written as the step's ``verify.json``,
so ``restore()`` skips a checkpoint found bad. A ``durable`` event of the tiering engine
(``observe``) queues that step for verification at once, between sweeps.

Every byte the verifier reads goes through a token bucket of ``rate_bytes_s`` (bursts up to
``burst_bytes``), so it never takes more than that from the store, however large the
checkpoints: a sweep that needs longer than a period delays the next one.

Only integrity failures mark a checkpoint bad; a store error (unreachable, I/O) is logged,
counted in ``stats()["errors"]`` and records nothing. After each sweep the newest ``newest``
checkpoints are checked: ``alert`` is True while one of them is recorded bad, or has gone
unverified for longer than a period (``CheckpointMetrics.watch_verifier`` exports it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..checkpoint.format import manifest as mf
from ..checkpoint.restore.verify import record as record_verify, verify_manifest
from ..chunks import ChunkStore, RepairEvent
from ..durations import positive_duration
from ..errors import ConfigError, IntegrityError, NotFoundError, TrainstoreError
from ..store.base import Buffer, ForwardingStore, Store, StoreCapabilities

log = logging.getLogger("trainstore.lifecycle.verifier")


@dataclass(frozen=True)
class VerifierOptions:
    """``period``: time between sweeps (seconds or ``"10m"``). ``rate_bytes_s``: read budget.
    ``burst_bytes``: reads allowed ahead of the budget. ``newest``: how many of the newest
    checkpoints the alert watches. ``deep``: re-hash (True) or only check sizes (False)."""

    period: float | str = 600.0
    rate_bytes_s: float = 50e6
    burst_bytes: int = 8 << 20
    newest: int = 3
    deep: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "period", positive_duration(self.period, "period"))
        if isinstance(self.rate_bytes_s, bool) or not isinstance(self.rate_bytes_s, (int, float)) \
                or not 0 < self.rate_bytes_s < float("inf"):
            raise ConfigError(f"rate_bytes_s must be a positive number of bytes per second, got {self.rate_bytes_s!r}")
        for name in ("burst_bytes", "newest"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive int, got {v!r}")


class TokenBucket:
    """Byte budget: ``take(n)`` after reading ``n`` bytes sleeps until the debt is paid."""

    def __init__(self, rate: float, burst: int, stop: threading.Event | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = float(rate), float(burst), clock
        self.stop = stop or threading.Event()
        self.tokens = float(burst)
        self.taken = 0
        self._at = clock()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self._at) * self.rate) - n
            self._at = now
            self.taken += n
            debt = -self.tokens
        if debt > 0:
            self.stop.wait(debt / self.rate)  # a stop request ends the wait early


class _ThrottledStore(ForwardingStore):
    """Reads of ``inner`` (and of each of its tiers) paid from one ``TokenBucket``."""

    def __init__(self, inner: Store, bucket: TokenBucket) -> None:
        super().__init__(inner)
        self.bucket = bucket

    def _paid(self, data: Buffer) -> Buffer:
        self.bucket.take(memoryview(data).nbytes)
        return data

    def get(self, key: str) -> Buffer:
        return self._paid(self.inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> Buffer:
        return self._paid(self.inner.get_range(key, start, length))

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[Buffer]:
        return [self._paid(b) for b in self.inner.get_ranges(key, ranges)]

    @property
    def capabilities(self) -> StoreCapabilities:
        return self.inner.capabilities

    def tiers(self) -> tuple[Store, ...]:
        inner = self.inner.tiers()
        return (self,) if len(inner) == 1 else tuple(_ThrottledStore(t, self.bucket) for t in inner)

    def close(self) -> None:  # the caller's store: not ours to close
        pass


class BackgroundVerifier:
    """Re-verifies the checkpoints of ``job`` in ``store`` on a schedule (see module doc).

    ``observers(event, fields)`` get a ``"verify"`` event per checkpoint verified (the
    manager's fields: step, ok, deep, errors; plus repaired), as ``CheckpointMetrics.observe``
    expects.
    """

    def __init__(self, store: Store, job: str, options: VerifierOptions | None = None, *,
                 period: float | str | None = None, rate_bytes_s: float | None = None,
                 observers: Sequence[Callable[[str, dict], None]] = ()) -> None:
        opts = options or VerifierOptions()
        if period is not None or rate_bytes_s is not None:
            opts = VerifierOptions(period if period is not None else opts.period,
                                   rate_bytes_s if rate_bytes_s is not None else opts.rate_bytes_s,
                                   opts.burst_bytes, opts.newest, opts.deep)
        self.options = opts
        self.job = mf.check_job(job)
        self.store = store
        self.observers = list(observers)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.bucket = TokenBucket(opts.rate_bytes_s, opts.burst_bytes, self._stop)
        self.chunks = ChunkStore(_ThrottledStore(store, self.bucket), on_repair=[self._repaired])
        self._lock = threading.Lock()
        self._queue: list[int] = []
        self._thread: threading.Thread | None = None
        self._stats: dict[str, Any] = {"sweeps": 0, "verified": 0, "bad": 0, "errors": 0, "repairs": 0,
                                       "last_sweep_at": None, "last_sweep_s": None, "alert": False,
                                       "unverified_recent": 0, "bad_recent": 0, "newest": []}

    # -- running -----------------------------------------------------------------------------
    def start(self) -> BackgroundVerifier:
        """Run sweeps on a daemon thread until ``stop()``."""
        if self._thread is not None:
            raise ConfigError(f"the verifier of job {self.job!r} is running already")
        self._thread = threading.Thread(target=self.run, name=f"trainstore-verify-{self.job}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> BackgroundVerifier:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self, max_sweeps: int | None = None,
            on_sweep: Callable[[dict[str, Any]], None] | None = None) -> None:
        """The loop (the thread's, or the caller's for ``ckpt verify --watch``): a sweep per
        period, queued steps in between; returns after ``max_sweeps`` sweeps or ``stop()``."""
        done = 0
        next_sweep = time.monotonic()
        while not self._stop.is_set():
            for step in self._take_queue():
                self.verify_step(step)
            if time.monotonic() >= next_sweep:
                started = time.monotonic()
                self.sweep()
                done += 1
                if on_sweep is not None:
                    on_sweep(self.stats())
                if max_sweeps is not None and done >= max_sweeps:
                    return
                next_sweep = started + float(self.options.period)  # type: ignore[arg-type]
            self._wake.wait(max(next_sweep - time.monotonic(), 0.0))
            self._wake.clear()

    def observe(self, event: str, fields: dict) -> None:
        """Tiering observer: a ``durable`` copy of a step of this job is verified at once."""
        if event == "durable" and fields.get("job") == self.job and isinstance(fields.get("step"), int):
            with self._lock:
                self._queue.append(fields["step"])
            self._wake.set()

    def _take_queue(self) -> list[int]:
        with self._lock:
            queue, self._queue = sorted(set(self._queue), reverse=True), []
        return queue

    # -- verifying ---------------------------------------------------------------------------
    def sweep(self) -> None:
        """Verify every checkpoint of the job, newest first, then update the alert."""
        t0 = time.monotonic()
        for step in reversed(mf.list_steps(self.store, self.job)):
            if self._stop.is_set():
                return
            self.verify_step(step)
        with self._lock:
            self._stats["sweeps"] += 1
            self._stats["last_sweep_at"] = time.time()
            self._stats["last_sweep_s"] = time.monotonic() - t0
        self._update_alert()

    def verify_step(self, step: int) -> mf.VerifyRecord | None:
        """Verify one checkpoint and record the outcome; None if it is gone or a store error
        kept it from being checked (logged and counted, nothing recorded)."""
        deep = self.options.deep
        with self._lock:
            repairs_before = self._stats["repairs"]
        try:
            try:
                m = mf.load_manifest(self.chunks.store, self.job, step)
            except IntegrityError as exc:
                rec = mf.new_verify_record(step, deep, [f"manifest: {exc}"], 0)
            else:
                rec = verify_manifest(self.chunks, m, deep=deep, workers=1)
        except NotFoundError:
            return None  # deleted (retention, eviction) since it was listed
        except TrainstoreError as exc:
            log.warning("verifier: could not check step %d of job %r: %s", step, self.job, exc)
            with self._lock:
                self._stats["errors"] += 1
            return None
        record_verify(self.chunks, self.job, rec)
        with self._lock:
            self._stats["verified"] += 1
            self._stats["bad"] += 0 if rec.ok else 1
            repaired = self._stats["repairs"] - repairs_before
        if not rec.ok:
            log.error("verifier: checkpoint step %d of job %r is bad: %s", step, self.job, "; ".join(rec.errors[:3]))
        for obs in self.observers:
            try:
                obs("verify", {"job": self.job, "step": step, "ok": rec.ok, "deep": deep, "errors": len(rec.errors),
                               "repaired": repaired})
            except Exception as exc:  # noqa: BLE001 - monitoring never stops verification
                log.warning("verifier observer %r failed: %s", obs, exc)
        return rec

    def _repaired(self, event: RepairEvent) -> None:
        with self._lock:
            self._stats["repairs"] += 1
        log.warning("verifier: %s", event)

    def _update_alert(self) -> None:
        now = time.time()
        newest = []
        for step in mf.list_steps(self.store, self.job)[-self.options.newest:]:
            rec = mf.load_verify_record(self.store, self.job, step)
            if rec is not None and rec.ok and rec.deep == self.options.deep:
                status = "ok"
            elif rec is not None and not rec.ok:
                status = "bad"
            else:
                try:
                    created = mf.load_manifest(self.store, self.job, step).created
                except TrainstoreError:
                    created = 0.0
                late = now - created > float(self.options.period)  # type: ignore[arg-type]
                status = "unverified (late)" if late else "unverified"
            newest.append((step, status))
        with self._lock:
            self._stats["newest"] = newest
            self._stats["bad_recent"] = sum(s == "bad" for _, s in newest)
            self._stats["unverified_recent"] = sum(s != "ok" for _, s in newest)
            self._stats["alert"] = any(s in ("bad", "unverified (late)") for _, s in newest)

    def stats(self) -> dict[str, Any]:
        """Counters, the newest checkpoints' status and the alert (module doc)."""
        with self._lock:
            out = dict(self._stats)
        out["verified_bytes"] = self.bucket.taken
        out["last_sweep_age_s"] = None if out["last_sweep_at"] is None else time.time() - out["last_sweep_at"]
        return out


__all__ = ["BackgroundVerifier", "VerifierOptions", "TokenBucket"]
