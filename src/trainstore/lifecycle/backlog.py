"""The durable backlog: checkpoints committed hot whose durable copy is still to come.

With write-back tiering (``tiering``) every save commits in the hot tier; the copy to the
durable tier runs behind. When the durable tier is down (an object-store outage, a full
bucket), the copy is retried with exponential backoff (``TierPolicy.retry_backoff`` up to
``retry_backoff_max``) and later copies wait in order behind it; training goes on. This
module keeps that backlog: which checkpoints are not durable yet, their stored bytes in the
hot tier, how long the oldest has waited (the durable tier's lag), and the failure streak.

Training stops only for a limit the user set (``TierPolicy.durable_rpo``: no committed
checkpoint may wait longer than this for its durable copy; ``max_hot_backlog_bytes``: the
hot tier holds at most this many bytes of checkpoints not yet durable): ``check_limits``
raises ``DurabilityLimitError`` naming the limit, which the manager raises at the next save.
Observers get ``durable_backlog`` events (metrics: ``lifecycle.metrics``); the log says
when copies start failing, how far behind the durable tier is, and when it is back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..durations import format_duration
from ..errors import BackgroundError

log = logging.getLogger("trainstore.lifecycle.tiering")


class DurabilityLimitError(BackgroundError):
    """A limit on how far the durable tier may fall behind (RPO, hot-tier bytes) is breached."""


@dataclass(frozen=True)
class BacklogStatus:
    """How far behind the durable tier is (for one job, or all)."""

    checkpoints: int  # committed hot, not yet durable
    bytes: int  # their stored bytes in the hot tier
    lag_s: float  # how long the oldest of them has waited for its durable copy (0: none)
    failing_since: float | None  # when the current streak of failed copies began
    attempts: int  # failed copy attempts in the streak
    last_error: str | None

    def __str__(self) -> str:
        if not self.checkpoints:
            return "durable tier up to date"
        text = (f"durable tier {self.checkpoints} checkpoints ({self.bytes / 1e6:,.1f} MB) behind, "
                f"oldest waiting {format_duration(self.lag_s)}")
        if self.failing_since is not None:
            text += f"; {self.attempts} failed copy attempts: {self.last_error}"
        return text


class DurableBacklog:
    """Pending durable copies, the failure streak and the limits (see module docstring)."""

    def __init__(self, rpo: float | None, max_bytes: int | None, backoff: float, backoff_max: float,
                 clock: Callable[[], float], notify: Callable[[str, dict], None]) -> None:
        self.rpo, self.max_bytes = rpo, max_bytes
        self.backoff, self.backoff_max = backoff, backoff_max
        self.clock, self._notify = clock, notify
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, int], tuple[float, int]] = {}  # (job, step) -> (committed at, bytes)
        self._failing_since: float | None = None
        self._attempts = 0
        self._last_error: str | None = None
        self._closing = threading.Event()

    def add(self, job: str, step: int, stored_bytes: int) -> None:
        with self._lock:
            self._pending.setdefault((job, step), (self.clock(), int(stored_bytes)))
        self._report(job)

    def done(self, job: str, step: int) -> None:
        """``step`` is durable (or was deleted before its copy): it leaves the backlog."""
        with self._lock:
            self._pending.pop((job, step), None)
            recovered = self._failing_since is not None
            down_s = self.clock() - self._failing_since if recovered else 0.0  # type: ignore[operator]
            attempts = self._attempts
            self._failing_since, self._attempts, self._last_error = None, 0, None
        if recovered:
            log.warning("tiering: durable tier reachable again after %s (%d failed attempts); copying the backlog in "
                        "order: %s", format_duration(down_s), attempts, self.status(job))
        self._report(job)

    def pending(self, job: str) -> set[int]:
        """Steps of ``job`` not durable yet (retention keeps them)."""
        with self._lock:
            return {s for j, s in self._pending if j == job}

    def failed(self, job: str, step: int, exc: BaseException) -> float:
        """A copy attempt failed with a store error: record it; returns the backoff delay."""
        with self._lock:
            if self._failing_since is None:
                self._failing_since = self.clock()
            self._attempts += 1
            self._last_error = f"{type(exc).__name__}: {exc}"
            attempts = self._attempts
        delay = min(self.backoff_max, self.backoff * 2 ** min(attempts - 1, 30))
        if attempts & (attempts - 1) == 0:  # attempts 1, 2, 4, 8, ...: the log says it, not every retry
            log.warning("tiering: durable copy of step %d of job %r failed (attempt %d; retrying in %.1fs, training "
                        "continues): %s", step, job, attempts, delay, self.status(job))
        self._report(job)
        return delay

    def sleep(self, delay: float) -> bool:
        """Wait ``delay`` before the next attempt; False when the tiering is closing."""
        return not self._closing.wait(delay)

    def close(self) -> None:
        self._closing.set()

    def status(self, job: str | None = None) -> BacklogStatus:
        with self._lock:
            items = [v for (j, _s), v in self._pending.items() if job is None or j == job]
            now = self.clock()
            return BacklogStatus(len(items), sum(b for _t, b in items),
                                 max((now - t for t, _b in items), default=0.0), self._failing_since,
                                 self._attempts, self._last_error)

    def check_limits(self, job: str) -> None:
        """Raise ``DurabilityLimitError`` if ``job``'s backlog breaches a limit the user set."""
        st = self.status(job)
        if self.rpo is not None and st.lag_s > self.rpo:
            raise DurabilityLimitError(
                f"durability RPO breached for job {job!r}: a checkpoint committed {format_duration(st.lag_s)} ago "
                f"has no durable copy yet (TierPolicy.durable_rpo={format_duration(self.rpo)}); {st}. Training "
                "stops here: restore the durable tier, or raise durable_rpo to keep training on the hot tier")
        if self.max_bytes is not None and st.bytes > self.max_bytes:
            raise DurabilityLimitError(
                f"hot-tier space limit reached for job {job!r}: {st.bytes:,} bytes of checkpoints wait for their "
                f"durable copy (TierPolicy.max_hot_backlog_bytes={self.max_bytes:,}); {st}. Training stops here: "
                "restore the durable tier, or raise max_hot_backlog_bytes if the hot tier has room")

    def _report(self, job: str) -> None:
        st = self.status(job)
        self._notify("durable_backlog", {"job": job, "checkpoints": st.checkpoints, "bytes": st.bytes,
                                         "lag_s": st.lag_s, "failing": st.failing_since is not None,
                                         "attempts": st.attempts})


__all__ = ["BacklogStatus", "DurabilityLimitError", "DurableBacklog"]
