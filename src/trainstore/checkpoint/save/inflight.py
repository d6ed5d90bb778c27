"""The manager's one in-flight save, its background errors and the work hooks started.

A save runs on one background thread; its failure (or the failure of work a hook started
after the commit, e.g. a tiered store's durable copy, a ``Future``) is logged where it
happens and raised once, as ``BackgroundError``, at the manager's next ``save`` / ``wait`` /
``close``. Thread-safe: the caller thread and the save thread both use it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

from ...errors import BackgroundError
from .failures import SWITCH_HINT


class InflightSaves:
    """Tracks the in-flight save of job ``job``, queued errors and follow-up work."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.lock = threading.Lock()
        self._inflight: tuple[int, Future] | None = None
        self._error: BaseException | None = None
        self._error_step: int | None = None
        self._followups: list[tuple[int, Future]] = []  # (step, work a hook started): durable copies

    def start(self, step: int, fut: Future) -> None:
        with self.lock:
            self._inflight = (step, fut)

    def busy(self) -> int | None:
        """The step being saved now, or None."""
        with self.lock:
            busy = self._inflight
        return busy[0] if busy is not None and not busy[1].done() else None

    def fail(self, exc: BaseException, step: int) -> None:
        """Queue ``exc`` (only the first failure is kept until it is raised)."""
        with self.lock:
            if self._error is None:
                self._error, self._error_step = exc, step

    def follow(self, step: int, work: Future) -> None:
        """Work a hook started after ``step`` was committed: its failure is raised like a save's."""
        with self.lock:
            self._followups.append((step, work))

    def settle(self) -> None:
        """Wait for the in-flight save; its error stays queued for ``raise_queued``."""
        with self.lock:
            busy = self._inflight
        if busy is not None:
            try:
                busy[1].result()
            except BaseException:  # noqa: BLE001 - raised by raise_queued
                pass

    def settle_followups(self) -> None:
        with self.lock:
            pending = [f for _s, f in self._followups]
        for f in pending:
            try:
                f.result()
            except BaseException:  # noqa: BLE001 - raised by raise_queued
                pass

    def raise_queued(self) -> None:
        """Raise the first failure of a background save, else of work a hook started after a
        commit (a durable copy); each failure is raised once."""
        with self.lock:
            exc, step = self._error, self._error_step
            self._error = self._error_step = None
            failed = None
            if exc is None:
                done = [(s, f) for s, f in self._followups if f.done()]
                failed = next(((s, f) for s, f in done if f.exception() is not None), None)
                drop = {id(f) for s, f in done if f.exception() is None} | ({id(failed[1])} if failed else set())
                self._followups = [(s, f) for s, f in self._followups if id(f) not in drop]
        if exc is not None:
            raise BackgroundError(f"background checkpoint save of step {step} (job {self.job!r}) failed: "
                                  f"{type(exc).__name__}: {exc}{SWITCH_HINT}") from exc
        if failed is not None:
            cause = failed[1].exception()
            raise BackgroundError(f"after checkpoint step {failed[0]} of job {self.job!r} was committed: "
                                  f"{cause}") from cause


__all__ = ["InflightSaves"]
