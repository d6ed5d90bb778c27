"""The I/O-wait meter: how long the training loop waits inside ``next()`` for data.

``wait`` is the time spent inside the loader's ``__next__``; ``compute`` is the time between
returning a batch and the next call (the training step). Wait fraction = wait / (wait +
compute), over the whole run and over a sliding window of recent batches; the first batch is
excluded (start-up is not steady state). Above ``warn_fraction`` over a full window the
pipeline is I/O-bound: a ``IOBoundWarning`` is logged and raised through ``warnings``.

Phases: batches are *cold* until ``mark_warm()`` (the loader calls it once every shard of
the first epoch plan has been fetched once), *warm* after; wait and compute are also kept per
phase, so a cold start from an object store and the steady state read apart.

Re-fetching: ``end_epoch(fetched, needed)`` records how many bytes an epoch pulled from the
durable store beyond one copy of the shards it needs (kept per epoch); with a non-``block``
shuffle over a cache smaller than the data that is logged and raised as a ``RefetchWarning``,
once per meter: every later epoch re-fetches about as much, and ``stats()`` keeps the figures.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("trainstore.data.loader")


class IOBoundWarning(RuntimeWarning):
    """The training loop waited for data more than the threshold over a window."""


class RefetchWarning(RuntimeWarning):
    """An epoch fetched shards from the durable store more than once (cache too small)."""

#: re-fetched bytes below this share of what an epoch needs are not worth a warning
REFETCH_WARN_SHARE = 0.05


@dataclass(frozen=True)
class MeterConfig:
    window: int = 50
    warn_fraction: float = 0.10
    warn_every_s: float = 60.0


class IOWaitMeter:
    """Counts batches, bytes, wait and compute time; exports Prometheus metrics."""

    def __init__(self, config: MeterConfig | None = None, registry: CollectorRegistry | None = None,
                 labels: dict[str, str] | None = None) -> None:
        self.config = config or MeterConfig()
        self.registry = registry if registry is not None else CollectorRegistry()
        self._labels = labels or {}
        names = list(self._labels)
        self._m_wait = Counter("trainstore_loader_wait_seconds", "Time the training loop waited for batches",
                               names, registry=self.registry)
        self._m_compute = Counter("trainstore_loader_compute_seconds",
                                  "Time between batches (the training step)", names, registry=self.registry)
        self._m_batches = Counter("trainstore_loader_batches", "Batches delivered", names,
                                  registry=self.registry)
        self._m_bytes = Counter("trainstore_loader_bytes", "Batch bytes delivered", names,
                                registry=self.registry)
        self._m_frac = Gauge("trainstore_loader_wait_fraction", "Wait fraction over the recent window",
                             names, registry=self.registry)
        # the labelled children, looked up once (``labels()`` per batch was a tenth of a
        # batch's consumer-side cost)
        self._c_wait, self._c_compute, self._c_batches, self._c_bytes, self._c_frac = (
            m.labels(**self._labels) if self._labels else m
            for m in (self._m_wait, self._m_compute, self._m_batches, self._m_bytes, self._m_frac))
        self._mu = threading.Lock()
        self._window: deque[tuple[float, float]] = deque(maxlen=self.config.window)
        self._window_sums = [0.0, 0.0]  # wait, compute over ``_window`` (kept as it slides)
        self.batches = 0
        self.bytes = 0
        self.wait_s = 0.0
        self.compute_s = 0.0
        self.first_wait_s = 0.0
        self._started = None
        self._last_return: float | None = None
        self._last_warn = -1e18
        self.warnings = 0
        self.warm_at: float | None = None
        self._phase = {"cold": [0, 0.0, 0.0], "warm": [0, 0.0, 0.0]}  # batches, wait, compute
        self.refetched_bytes = 0
        self.refetched_last_epoch = 0
        self.refetched_by_epoch: list[int] = []
        self._refetch_warned = False

    def begin(self) -> float:
        now = time.perf_counter()
        if self._started is None:
            self._started = now
        return now

    def end(self, t_enter: float, nbytes: int) -> None:
        now = time.perf_counter()
        wait = now - t_enter
        compute = t_enter - self._last_return if self._last_return is not None else None
        self._last_return = now
        with self._mu:
            self.batches += 1
            self.bytes += nbytes
            phase = self._phase["warm" if self.warm_at is not None else "cold"]
            phase[0] += 1
            phase[1] += wait
            phase[2] += compute or 0.0
            if compute is None:  # first batch of a run: start-up, not steady state
                self.first_wait_s += wait
            else:
                self.wait_s += wait
                self.compute_s += compute
                if len(self._window) == self._window.maxlen:
                    old_wait, old_compute = self._window[0]
                    self._window_sums[0] -= old_wait
                    self._window_sums[1] -= old_compute
                self._window.append((wait, compute))
                self._window_sums[0] += wait
                self._window_sums[1] += compute
        self._c_batches.inc()
        self._c_bytes.inc(nbytes)
        if compute is not None:
            self._c_wait.inc(wait)
            self._c_compute.inc(compute)
            frac = self.window_fraction()
            self._c_frac.set(frac)
            self._maybe_warn(frac, now)

    def mark_warm(self) -> None:
        """Every shard of the plan has been fetched once: later batches count as warm."""
        with self._mu:
            if self.warm_at is None:
                self.warm_at = time.perf_counter()

    def end_epoch(self, fetched: int, needed: int, shuffle_mode: str, cache_limit: int) -> int:
        """Record an epoch's store reads; returns the re-fetched bytes (warns once, see module)."""
        refetched = max(0, fetched - needed)
        with self._mu:
            self.refetched_last_epoch = refetched
            self.refetched_bytes += refetched
            self.refetched_by_epoch.append(refetched)
            warn = (not self._refetch_warned and shuffle_mode != "block" and needed > 0
                    and refetched > REFETCH_WARN_SHARE * needed)
            self._refetch_warned |= warn
        if warn:
            msg = (f"shuffle_mode={shuffle_mode!r} re-fetched {refetched:,} bytes from the durable "
                   f"store this epoch ({fetched / needed:.2f}x the {needed:,} bytes of shards it "
                   f"reads) because the node-cache limit ({cache_limit:,} bytes) is smaller than "
                   "those shards; shuffle_mode='block' reads each shard once per epoch (warned "
                   "once; every epoch's figure: loader.stats()['refetched_bytes_by_epoch'])")
            log.warning(msg)
            warnings.warn(msg, RefetchWarning, stacklevel=3)
        return refetched

    def pause(self) -> None:
        """The consumer stopped (epoch end): the next gap is not compute time."""
        self._last_return = None

    def window_fraction(self) -> float:
        with self._mu:
            w, c = (max(0.0, x) for x in self._window_sums)  # sliding sums: no rounding below 0
        return w / (w + c) if w + c > 0 else 0.0

    def _maybe_warn(self, frac: float, now: float) -> None:
        if len(self._window) < self._window.maxlen or frac <= self.config.warn_fraction:
            return
        if now - self._last_warn < self.config.warn_every_s:
            return
        self._last_warn = now
        self.warnings += 1
        msg = (f"training loop waited {frac:.0%} of the last {len(self._window)} batches for data "
               f"(> {self.config.warn_fraction:.0%}): the input pipeline is I/O-bound; raise "
               "prefetch/workers, the cache limit, or use shuffle_mode='block'")
        log.warning(msg)
        warnings.warn(msg, IOBoundWarning, stacklevel=4)

    def snapshot(self) -> dict:
        with self._mu:
            total = self.wait_s + self.compute_s
            elapsed = (time.perf_counter() - self._started) if self._started else 0.0
            return {
                "batches": self.batches,
                "bytes": self.bytes,
                "wait_s": self.wait_s,
                "compute_s": self.compute_s,
                "first_batch_wait_s": self.first_wait_s,
                "wait_fraction": self.wait_s / total if total > 0 else 0.0,
                "batches_per_s": self.batches / elapsed if elapsed > 0 else 0.0,
                "bytes_per_s": self.bytes / elapsed if elapsed > 0 else 0.0,
                "warnings": self.warnings,
                **self._phase_figures(),
                "refetched_bytes": self.refetched_bytes,
                "refetched_bytes_last_epoch": self.refetched_last_epoch,
                "refetched_bytes_by_epoch": list(self.refetched_by_epoch),
            }

    def _phase_figures(self) -> dict:
        out: dict = {"cold_s": ((self.warm_at if self.warm_at is not None else time.perf_counter())
                                - self._started) if self._started else 0.0}
        for name, (n, wait, compute) in self._phase.items():
            out[f"{name}_batches"] = n
            out[f"{name}_wait_s"] = wait
            out[f"{name}_wait_fraction"] = wait / (wait + compute) if wait + compute > 0 else 0.0
        return out


__all__ = ["IOBoundWarning", "IOWaitMeter", "MeterConfig", "RefetchWarning"]
