"""What a failed background save does to training: ``on_error`` and the save-failure record.

``SaveErrorPolicy.mode``:

* ``"raise"`` (default): the failure is raised as ``BackgroundError`` at the manager's next
  ``save`` / ``wait`` / ``close`` (its message says how to switch to ``"warn"``).
* ``"warn"``: training continues; the failure is logged, warned about (``RuntimeWarning`` at
  the next ``should_save`` / ``save`` on the caller's thread), counted and exported, and
  ``should_save`` asks for a save again at the next step it is asked about.
* ``"retry"``: like ``"warn"``, but the next save is asked for only after a backoff that
  doubles with each failure in a row (``backoff_s`` .. ``backoff_max_s``).

Every missed checkpoint widens the recovery point: ``SaveFailures.stats()`` says since when
(``rpo_at_risk``, ``seconds_since_commit``), and ``CheckpointMetrics`` exports it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError

log = logging.getLogger("trainstore.checkpoint")

ON_ERROR = ("raise", "warn", "retry")
#: appended to the BackgroundError of a failed save under on_error="raise"
SWITCH_HINT = ("; to keep training through failed checkpoint saves pass "
               "CheckpointManager(..., on_error='warn') (or 'retry')")


@dataclass(frozen=True)
class SaveErrorPolicy:
    """How a failed background save is handled (see module docstring)."""

    mode: str = "raise"
    backoff_s: float = 30.0  # "retry": wait this long after the first failure in a row
    backoff_max_s: float = 600.0  # ... doubling per further failure, at most this

    def __post_init__(self) -> None:
        if self.mode not in ON_ERROR:
            raise ConfigError(f"on_error must be one of {ON_ERROR}, got {self.mode!r}")
        if not (0 <= self.backoff_s <= self.backoff_max_s):
            raise ConfigError(f"on_error backoff: need 0 <= backoff_s ({self.backoff_s}) <= backoff_max_s "
                              f"({self.backoff_max_s})")

    @classmethod
    def of(cls, value: str | SaveErrorPolicy) -> SaveErrorPolicy:
        return value if isinstance(value, SaveErrorPolicy) else cls(mode=value)

    @property
    def tolerates(self) -> bool:
        """Whether training continues through a failed save."""
        return self.mode != "raise"


class SaveFailures:
    """Failed and committed saves of one manager: counts, the retry schedule, warnings.

    Thread-safe: the save thread records outcomes, the caller thread asks ``retry_kind``.
    ``clock`` (monotonic seconds) is injectable for tests.
    """

    def __init__(self, job: str, policy: SaveErrorPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.job = job
        self.policy = policy
        self.clock = clock
        self._lock = threading.Lock()
        self.total = 0
        self.consecutive = 0
        self._failed: tuple[int, str, float] | None = None  # newest failure: (step, kind, clock)
        self._last_error: str | None = None
        self._last_commit: tuple[int, float] | None = None  # newest commit: (step, wall time it was created)
        self._warnings: list[str] = []

    def failed(self, step: int, kind: str, exc: BaseException) -> None:
        """The save thread: ``step`` failed with ``exc``."""
        error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self.total += 1
            self.consecutive += 1
            self._failed = (step, kind, self.clock())
            self._last_error = error
            if self.policy.tolerates:
                wait = self._backoff()
                when = "at the next step asked" if wait == 0 else f"after {wait:.0f} s"
                self._warnings.append(f"checkpoint step {step} of job {self.job!r} failed ({error}); training "
                                      f"continues (on_error={self.policy.mode!r}, {self.consecutive} failed in a "
                                      f"row), saving again {when}")

    def committed(self, step: int, created: float) -> None:
        """The save thread: ``step`` (staged at wall time ``created``) committed."""
        with self._lock:
            self.consecutive = 0
            self._failed = None
            if self._last_commit is None or step >= self._last_commit[0]:
                self._last_commit = (step, created)

    def _backoff(self) -> float:
        if self.policy.mode != "retry" or self.consecutive == 0:
            return 0.0
        return min(self.policy.backoff_s * 2 ** (self.consecutive - 1), self.policy.backoff_max_s)

    def retry_kind(self, step: int) -> str | None:
        """The kind to save at ``step`` to make up for a failed save, or None (not due)."""
        with self._lock:
            if not self.policy.tolerates or self._failed is None:
                return None
            failed_step, kind, at = self._failed
            if step <= failed_step or self.clock() - at < self._backoff():
                return None
            return kind

    def take_warnings(self) -> list[str]:
        """Warnings not yet given on the caller's thread (each given once)."""
        with self._lock:
            out, self._warnings = self._warnings, []
        return out

    def stats(self) -> dict[str, Any]:
        """Counts and how far the restore point lags: ``rpo_at_risk`` is True after a failed
        save until the next commit; ``seconds_since_commit`` is the age of the newest
        committed checkpoint made by this manager (None before the first)."""
        with self._lock:
            commit = self._last_commit
            return {"on_error": self.policy.mode, "save_failures": self.total, "consecutive_failures": self.consecutive,
                    "last_error": self._last_error, "failed_step": None if self._failed is None else self._failed[0],
                    "rpo_at_risk": self._failed is not None,
                    "last_commit_step": None if commit is None else commit[0],
                    "seconds_since_commit": None if commit is None else max(time.time() - commit[1], 0.0),
                    "retry_in_s": None if self._failed is None else max(self._failed[2] + self._backoff() - self.clock(),
                                                                        0.0)}


__all__ = ["ON_ERROR", "SWITCH_HINT", "SaveErrorPolicy", "SaveFailures"]
