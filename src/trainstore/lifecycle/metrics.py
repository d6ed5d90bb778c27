"""Monitoring: Prometheus metrics for checkpoints, plus per-process stats persisted in the store.

    metrics = CheckpointMetrics()                 # its own CollectorRegistry (or pass one)
    mgr = CheckpointManager(url, job, observers=[metrics.observe], hooks=[...])
    metrics.serve(port=9108)                      # optional /metrics endpoint (127.0.0.1)

Metrics (prefix ``trainstore_ckpt_``): saves by kind and outcome, caller blocking seconds,
save and restore duration, time from creation to restore-ready and to durable, bytes
logical/stored/written per tier, the last save's dedup and compression ratios, restores and
fallbacks (checkpoints skipped on the way), verification failures, repairs of bad chunk copies
(per tier that held the bad copy; see docs/checkpoints.md "Repair"), failed saves training
continued through (``on_error="warn"``/``"retry"``) and the widened recovery point they leave:
``rpo_at_risk`` (1 from a failed save to the next commit), ``consecutive_save_failures`` and
``last_commit_age_seconds`` (age of the newest checkpoint committed in this process).

With ``persist=True`` (the default when a store is given) the observer also writes its
cumulative counters to ``jobs/<job>/stats/<host>-<pid>-<start>.json`` in the store after
each event, so ``trainstore ckpt stats`` can summarise restores and recovery success across
processes and machines (``load_stats``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ..checkpoint.format import manifest as mf
from ..errors import TrainstoreError
from ..store.base import Store

log = logging.getLogger("trainstore.lifecycle.metrics")

_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
STATS_FIELDS = ("saves", "save_failures", "save_seconds", "blocked_seconds", "restores", "restores_ok",
                "restores_failed", "fallbacks", "verifications", "verify_failures", "logical_bytes",
                "written_bytes", "durable_copies", "durable_seconds", "repairs", "save_failures_tolerated")


@dataclass
class _Persisted:
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STATS_FIELDS, 0.0))
    first: float | None = None
    last: float | None = None


class CheckpointMetrics:
    """Prometheus collectors for checkpoint activity; ``observe`` is a manager observer."""

    def __init__(self, registry: CollectorRegistry | None = None, *, store: Store | None = None,
                 persist: bool = True) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        p = "trainstore_ckpt_"
        self.saves = Counter(p + "saves", "Committed checkpoint saves", ["job", "kind"], registry=r)
        self.save_failures = Counter(p + "save_failures", "Failed checkpoint saves", ["job"], registry=r)
        self.failures_tolerated = Counter(p + "save_failures_tolerated", "Failed checkpoint saves training "
                                          "continued through (on_error='warn' or 'retry')", ["job"], registry=r)
        self.rpo_at_risk = Gauge(p + "rpo_at_risk", "1 from a failed checkpoint save until the next one commits "
                                 "(the recovery point is older than planned)", ["job"], registry=r)
        self.consecutive_failures = Gauge(p + "consecutive_save_failures", "Checkpoint saves failed in a row",
                                          ["job"], registry=r)
        self.last_commit_age = Gauge(p + "last_commit_age_seconds", "Seconds since the newest checkpoint committed "
                                     "in this process was created (NaN before the first)", ["job"], registry=r)
        self._last_commit: dict[str, float] = {}  # job -> creation time of the newest commit seen
        self.blocking = Histogram(p + "blocking_seconds", "Time the training loop was blocked by save()",
                                  ["job"], buckets=_SECONDS, registry=r)
        self.save_seconds = Histogram(p + "save_seconds", "Background save duration (write + commit)",
                                      ["job", "kind"], buckets=_SECONDS, registry=r)
        self.restore_ready = Histogram(p + "restore_ready_seconds", "Creation to restore-ready (committed)",
                                       ["job"], buckets=_SECONDS, registry=r)
        self.durable = Histogram(p + "durable_seconds", "Creation to durable (copied to the durable tier)",
                                 ["job"], buckets=_SECONDS, registry=r)
        self.bytes = Counter(p + "bytes", "Checkpoint bytes by tier and kind (logical, stored, written)",
                             ["job", "tier", "kind"], registry=r)
        self.dedup_ratio = Gauge(p + "dedup_ratio", "Last save: fraction of stored bytes not written (dedup)",
                                 ["job"], registry=r)
        self.compression_ratio = Gauge(p + "compression_ratio", "Last save: stored bytes / logical bytes",
                                       ["job"], registry=r)
        self.restores = Counter(p + "restores", "Restores by outcome", ["job", "outcome"], registry=r)
        self.restore_seconds = Histogram(p + "restore_seconds", "Restore duration", ["job"], buckets=_SECONDS,
                                         registry=r)
        self.fallbacks = Counter(p + "fallbacks", "Checkpoints skipped by restore (corrupt or incomplete)",
                                 ["job"], registry=r)
        self.verifications = Counter(p + "verifications", "Verifications by outcome", ["job", "outcome"],
                                     registry=r)
        self.repairs = Counter(p + "repairs", "Bad chunk copies replaced by a good copy from another tier or "
                               "a replica, by the tier (store URL) that held the bad copy", ["job", "tier"], registry=r)
        # the durable backlog of write-back tiering (``Tiering(observers=[metrics.observe])``)
        self.backlog_checkpoints = Gauge(p + "durable_backlog_checkpoints", "Checkpoints committed hot whose "
                                         "durable copy is still to come", ["job"], registry=r)
        self.backlog_bytes = Gauge(p + "durable_backlog_bytes", "Stored bytes in the hot tier waiting for "
                                   "their durable copy", ["job"], registry=r)
        self.durable_lag = Gauge(p + "durable_lag_seconds", "How long the oldest checkpoint without a durable "
                                 "copy has waited (0: the durable tier is up to date)", ["job"], registry=r)
        self.durable_failing = Gauge(p + "durable_copy_failing", "1 while durable copies fail (an outage: "
                                     "retried with backoff)", ["job"], registry=r)
        self.store = store
        self.persist = persist and store is not None
        self._lock = threading.Lock()
        self._persisted: dict[str, _Persisted] = {}
        self._id = f"{socket.gethostname()}-{os.getpid()}-{int(time.time() * 1000)}"
        self._server: Any = None

    # -- the observer ----------------------------------------------------------------------
    def observe(self, event: str, f: dict) -> None:
        """``CheckpointManager`` observer: turns manager events into metrics."""
        job = f.get("job", "?")
        add: dict[str, float] = {}
        if event == "save_staged":
            self.blocking.labels(job).observe(f["blocked_s"])
            add["blocked_seconds"] = f["blocked_s"]
        elif event == "save_committed":
            self.saves.labels(job, f["kind"]).inc()
            self.save_seconds.labels(job, f["kind"]).observe(f["seconds"])
            self.restore_ready.labels(job).observe(f["since_created"])
            for kind in ("logical", "stored", "written"):
                self.bytes.labels(job, "hot", kind).inc(f[f"{kind}_bytes"])
            if f["stored_bytes"]:
                self.dedup_ratio.labels(job).set(1.0 - f["written_bytes"] / f["stored_bytes"])
            if f["logical_bytes"]:
                self.compression_ratio.labels(job).set(f["stored_bytes"] / f["logical_bytes"])
            add.update(saves=1, save_seconds=f["seconds"], logical_bytes=f["logical_bytes"],
                       written_bytes=f["written_bytes"])
            self._committed(job, time.time() - f["since_created"])
        elif event == "save_failed":
            self.save_failures.labels(job).inc()
            self.rpo_at_risk.labels(job).set(1)
            self.consecutive_failures.labels(job).set(f.get("consecutive", 1))
            self._ensure_age_gauge(job)
            add["save_failures"] = 1
            if f.get("tolerated"):
                self.failures_tolerated.labels(job).inc()
                add["save_failures_tolerated"] = 1
        elif event == "restore":
            self.restores.labels(job, "ok" if f["ok"] else "failed").inc()
            self.restore_seconds.labels(job).observe(f["seconds"])
            self.fallbacks.labels(job).inc(f["skipped"])
            add.update(restores=1, fallbacks=f["skipped"], **{"restores_ok" if f["ok"] else "restores_failed": 1})
        elif event == "verify":
            self.verifications.labels(job, "ok" if f["ok"] else "failed").inc()
            add.update(verifications=1, verify_failures=0 if f["ok"] else 1)
        elif event == "repair":
            self.repairs.labels(job, f["tier"]).inc()
            add["repairs"] = 1
        elif event == "durable":
            self.durable.labels(job).observe(f["since_created"])
            self.bytes.labels(job, f.get("tier", "durable"), "stored").inc(f.get("copied_bytes", 0))
            add.update(durable_copies=1, durable_seconds=f["since_created"])
        elif event == "durable_backlog":
            self.backlog_checkpoints.labels(job).set(f["checkpoints"])
            self.backlog_bytes.labels(job).set(f["bytes"])
            self.durable_lag.labels(job).set(f["lag_s"])
            self.durable_failing.labels(job).set(1 if f["failing"] else 0)
        if add:
            # save_staged runs on the training loop's thread: count it, write with the next event
            self._persist(job, add, write=event != "save_staged")

    def _committed(self, job: str, created: float) -> None:
        self.rpo_at_risk.labels(job).set(0)
        self.consecutive_failures.labels(job).set(0)
        with self._lock:
            self._last_commit[job] = max(created, self._last_commit.get(job, created))
        self._ensure_age_gauge(job)

    def _ensure_age_gauge(self, job: str) -> None:
        def age() -> float:
            with self._lock:
                created = self._last_commit.get(job)
            return float("nan") if created is None else max(time.time() - created, 0.0)

        self.last_commit_age.labels(job).set_function(age)

    def _persist(self, job: str, add: dict[str, float], write: bool = True) -> None:
        if not self.persist:
            return
        with self._lock:
            st = self._persisted.setdefault(job, _Persisted())
            for k, v in add.items():
                st.counters[k] = st.counters.get(k, 0.0) + float(v)
            now = time.time()
            st.first = st.first or now
            st.last = now
            if not write:
                return
            body = json.dumps({"process": self._id, "job": job, "first": st.first, "last": st.last,
                               "counters": st.counters}).encode()
            try:
                self.store.put(f"{mf.job_prefix(job)}stats/{self._id}.json", body)  # type: ignore[union-attr]
            except TrainstoreError as exc:
                log.warning("could not persist checkpoint stats of job %r: %s", job, exc)

    # -- live gauges of a checkpoint policy and a background verifier ------------------------
    def watch_policy(self, policy: Any, job: str) -> None:
        """Gauges read from ``policy.stats()`` (an ``ObjectivePolicy``) at each scrape: the
        chosen interval, the expected loss per failure and whether RPO/RTO are met."""
        p = "trainstore_ckpt_policy_"
        for name, key, doc in _POLICY_GAUGES:
            gauge = Gauge(p + name, doc, ["job"], registry=self.registry)
            gauge.labels(job).set_function(_reader(policy, key))

    def watch_verifier(self, verifier: Any, job: str) -> None:
        """Gauges read from ``verifier.stats()`` (a ``BackgroundVerifier``) at each scrape;
        ``trainstore_ckpt_verify_alert`` is 1 while one of the newest checkpoints is not
        verified ok (bad, or unverified for longer than a period)."""
        p = "trainstore_ckpt_verify_"
        for name, key, doc in _VERIFIER_GAUGES:
            gauge = Gauge(p + name, doc, ["job"], registry=self.registry)
            gauge.labels(job).set_function(_reader(verifier, key))

    # -- serving ---------------------------------------------------------------------------
    def serve(self, port: int = 0, addr: str = "127.0.0.1") -> int:
        """Start a ``/metrics`` HTTP endpoint (a daemon thread); returns the bound port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def text(self) -> str:
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


_POLICY_GAUGES = (
    ("interval_seconds", "interval_s", "Chosen wall time between checkpoints"),
    ("interval_steps", "interval_steps", "Chosen steps between checkpoints (NaN until the step time is known)"),
    ("expected_loss_seconds", "expected_loss_s", "Expected work lost per failure (ready latency + interval/2)"),
    ("worst_loss_seconds", "worst_loss_s", "Worst-case work lost per failure (interval + ready latency)"),
    ("save_cost_seconds", "save_cost_s", "Measured blocking time per save"),
    ("waste_fraction", "waste", "Expected fraction of wall time lost to saves and failures"),
    ("restore_point_age_seconds", "restore_point_age_s", "Age of the newest restore-ready checkpoint"),
    ("rpo_met", "rpo_met", "1 if the planned worst-case loss is within the RPO"),
    ("rto_met", "rto_met", "1 if the estimated restore meets the RTO (NaN: not measured)"),
    ("hot_keep_last", "hot_keep_last", "Restore-ready checkpoints to keep in the hot tier for the RTO"),
)
_VERIFIER_GAUGES = (
    ("alert", "alert", "1 while one of the newest checkpoints is not verified ok"),
    ("unverified_recent", "unverified_recent", "Newest checkpoints not verified ok"),
    ("bad_recent", "bad_recent", "Newest checkpoints verified bad"),
    ("sweeps", "sweeps", "Verification sweeps finished"),
    ("verified_bytes", "verified_bytes", "Bytes read by the background verifier"),
    ("repairs", "repairs", "Bad chunk copies the background verifier repaired"),
    ("last_sweep_age_seconds", "last_sweep_age_s", "Seconds since the last finished sweep"),
)


def _reader(source: Any, key: str) -> Any:
    """A gauge callback: ``source.stats()[key]`` as a float (NaN when None or failing)."""
    def read() -> float:
        try:
            v = source.stats().get(key)
        except Exception as exc:  # noqa: BLE001 - a scrape never fails on a bad source
            log.warning("metrics: could not read %s from %r: %s", key, source, exc)
            return float("nan")
        return float("nan") if v is None else float(v)

    return read


def load_stats(store: Store, job: str) -> dict[str, Any]:
    """Sum the persisted counters of every process that observed ``job``."""
    total = dict.fromkeys(STATS_FIELDS, 0.0)
    processes = 0
    for meta in store.list(f"{mf.job_prefix(job)}stats/"):
        try:
            obj = json.loads(bytes(memoryview(store.get(meta.key))))
            counters = obj["counters"]
        except (TrainstoreError, ValueError, KeyError, TypeError):
            continue
        processes += 1
        for k in STATS_FIELDS:
            v = counters.get(k, 0)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                total[k] += v
    total["processes"] = processes
    return total


__all__ = ["CheckpointMetrics", "load_stats", "STATS_FIELDS"]
