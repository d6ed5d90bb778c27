"""When to checkpoint, chosen from recovery objectives instead of fixed step intervals.

    policy = CheckpointPolicy.from_objectives(rpo="15min", rto="2min", mtbf="24h")
    mgr = CheckpointManager(url, job, policy=policy)   # the manager feeds it its save events
    for step in ...:
        if mgr.should_save(step): mgr.save(step, state)
    policy.stats()    # interval chosen, expected loss per failure, rpo_met, rto_met, hot_keep_last

The model (``plan_interval``, a pure function of the measurements):

* ``C`` - overhead of one save on the training loop: the caller's blocking time
  (``save_staged.blocked_s``), averaged over recent saves.
* ``L`` - time from a save's start to restore-ready (``save_committed.since_created``): work
  done in that window is lost by a failure too. Worst of the recent fulls and incrementals.
* ``M`` - mean time between failures of the job; ``R`` - measured restore time.
* Interval ``T`` (wall time between saves): Daly's higher-order optimum
  ``sqrt(2CM) * (1 + sqrt(C/2M)/3 + C/18M) - C`` (Young's ``sqrt(2CM)`` to first order), which
  minimises checkpoint overhead ``C/T`` plus expected lost work ``(L + T/2)/M``; raised to at
  least ``L`` (a save must finish before the next starts or the loop blocks) and to
  ``C / max_overhead``; lowered to ``RPO - L`` so that the worst loss ``T + L`` stays within
  the RPO (the RPO wins over the overhead budget; ``rpo_met`` is False when even ``T = L``
  misses it).
* The interval in steps is ``T`` over the measured step time; a save is also due whenever
  ``RPO - L`` of wall time has passed since the last one (slow steps never stretch the RPO).
* Full or incremental: the first save, then whenever an incremental writes ``full_ratio`` of
  a full's bytes (deltas stopped paying) or ``full_max_age`` has passed since the last full.
* RTO: a restore of the newest checkpoint is estimated from measured restore throughput
  (``restore`` events); ``hot_keep_last`` recommends keeping as many restore-ready
  checkpoints in the hot tier as a restore can try within the RTO (the newest and fallbacks
  past corrupt ones; at least 2, at most ``max_hot``) for ``TierPolicy(hot_keep_last=...)``.

Before the first save is measured the policy saves at once (that save measures the cost).
The decision uses this process's clock and measurements: in a multi-rank job every rank
must reach the same decision, so decide on one rank and broadcast it, or use fixed steps.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..durations import positive_duration
from ..errors import ConfigError

ON_BUSY = ("wait", "skip")  # what a save does while another is in flight

@dataclass(frozen=True)
class Objectives:
    """Recovery objectives and the failure rate an ``ObjectivePolicy`` plans for.

    ``rpo``: most work (wall time) a failure may lose. ``mtbf``: mean time between failures
    of the whole job. ``rto``: longest acceptable restore (None: not planned). Durations are
    seconds or strings (``"15min"``, ``"24h"``). ``max_overhead``: budget - the largest
    fraction of wall time the loop may spend blocked in saves (None: no budget).
    ``full_ratio``/``full_max_age``: when to save full instead of incremental (module doc).
    ``smoothing``: weight of the newest measurement in the running averages.
    """

    rpo: float | str
    mtbf: float | str
    rto: float | str | None = None
    max_overhead: float | None = None
    full_ratio: float = 0.5
    full_max_age: float | str | None = None
    max_hot: int = 8
    smoothing: float = 0.3
    on_busy: str = "wait"
    keep_base_in_memory: bool = True
    ready_copies: bool = True  # as in CheckpointPolicy

    def __post_init__(self) -> None:
        object.__setattr__(self, "rpo", positive_duration(self.rpo, "rpo"))
        object.__setattr__(self, "mtbf", positive_duration(self.mtbf, "mtbf"))
        if self.rto is not None:
            object.__setattr__(self, "rto", positive_duration(self.rto, "rto"))
        if self.full_max_age is not None:
            object.__setattr__(self, "full_max_age", positive_duration(self.full_max_age, "full_max_age"))
        for name, lo, hi in (("max_overhead", 0.0, 1.0), ("full_ratio", 0.0, 1.0), ("smoothing", 0.0, 1.0)):
            v = getattr(self, name)
            if v is None and name == "max_overhead":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo < v <= hi:
                raise ConfigError(f"{name} must be a number in ({lo}, {hi}], got {v!r}")
        if isinstance(self.max_hot, bool) or not isinstance(self.max_hot, int) or self.max_hot < 2:
            raise ConfigError(f"max_hot must be an int >= 2, got {self.max_hot!r}")
        if self.on_busy not in ON_BUSY:
            raise ConfigError(f"on_busy must be one of {ON_BUSY}, got {self.on_busy!r}")


@dataclass(frozen=True)
class Plan:
    """The interval chosen from one set of measurements, and what it promises."""

    interval_s: float  # wall time between saves
    interval_steps: int | None  # the same in steps (None until the step time is known)
    bound: str  # what set the interval: "daly", "save duration", "overhead budget", "rpo"
    daly_s: float  # the unconstrained optimum
    save_cost_s: float  # C: blocking per save
    ready_s: float  # L: save start -> restore-ready
    step_s: float | None
    expected_loss_s: float  # work lost per failure on average: L + T/2
    worst_loss_s: float  # T + L
    overhead: float  # C/T: fraction of wall time blocked in saves
    waste: float  # C/T + (L + T/2 + R)/MTBF: expected fraction of wall time lost
    rpo_met: bool
    budget_met: bool | None
    restore_s: float | None  # R: estimated restore of the newest checkpoint
    rto_met: bool | None
    hot_keep_last: int


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order optimum compute time between checkpoints (Young's sqrt(2CM)
    to first order); ``mtbf_s`` when the save costs more than half the MTBF."""
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    r = cost_s / (2 * mtbf_s)
    return math.sqrt(2 * cost_s * mtbf_s) * (1 + math.sqrt(r) / 3 + r / 9) - cost_s


def plan_interval(obj: Objectives, save_cost_s: float, ready_s: float, step_s: float | None = None,
                  restore_s: float | None = None) -> Plan:
    """The interval for measured costs (see module doc); a pure function."""
    rpo, mtbf = float(obj.rpo), float(obj.mtbf)  # type: ignore[arg-type]
    daly = daly_interval(save_cost_s, mtbf)
    t, bound = daly, "daly"
    if ready_s > t:
        t, bound = ready_s, "save duration"
    if obj.max_overhead is not None and save_cost_s / obj.max_overhead > t:
        t, bound = save_cost_s / obj.max_overhead, "overhead budget"
    cap = rpo - ready_s
    if t > cap:
        t, bound = max(cap, ready_s), "rpo"
    t = max(t, 1e-3)
    rpo_met = t + ready_s <= rpo * (1 + 1e-9)
    budget_met = None if obj.max_overhead is None else save_cost_s / t <= obj.max_overhead * (1 + 1e-9)
    steps = max(1, int(t / step_s)) if step_s else None
    loss = ready_s + t / 2
    rto_met, hot = None, 2
    if restore_s is not None and obj.rto is not None:
        rto_met = restore_s <= float(obj.rto)  # type: ignore[arg-type]
        tries = int(float(obj.rto) / restore_s) if restore_s > 0 else obj.max_hot  # type: ignore[arg-type]
        hot = max(2, min(obj.max_hot, tries))
    return Plan(interval_s=t, interval_steps=steps, bound=bound, daly_s=daly, save_cost_s=save_cost_s,
                ready_s=ready_s, step_s=step_s, expected_loss_s=loss, worst_loss_s=t + ready_s,
                overhead=save_cost_s / t, waste=save_cost_s / t + (loss + (restore_s or 0.0)) / mtbf,
                rpo_met=rpo_met, budget_met=budget_met, restore_s=restore_s, rto_met=rto_met,
                hot_keep_last=hot)


class _Average:
    """Exponentially weighted running average (None until the first value)."""

    def __init__(self, weight: float) -> None:
        self.weight, self.value = weight, None

    def add(self, x: float) -> None:
        self.value = float(x) if self.value is None else (1 - self.weight) * self.value + self.weight * float(x)


class ObjectivePolicy:
    """A stateful ``CheckpointPolicy`` replacement planning saves from ``Objectives``.

    ``should_save(step)`` answers like ``CheckpointPolicy`` (None, "full", "incremental";
    the same answer for repeated calls on one step). ``observe(event, fields)`` is a
    ``CheckpointManager`` observer (the manager registers it itself) that learns save and
    restore costs. ``clock`` (seconds, monotonic) is injectable for tests and simulations.
    """

    def __init__(self, objectives: Objectives, clock: Callable[[], float] = time.monotonic) -> None:
        self.objectives = objectives
        self.clock = clock
        w = objectives.smoothing
        self._lock = threading.Lock()
        self._blocked = _Average(w)
        self._ready = {"full": _Average(w), "incremental": _Average(w)}
        self._written = {"full": _Average(w), "incremental": _Average(w)}
        self._restore_per_byte = _Average(w)
        self._step_s = _Average(w)
        self._last_call: tuple[int, float] | None = None
        self._blocked_since_call = 0.0
        self._decided: tuple[int, str | None] | None = None
        self._last_save: tuple[int, float] | None = None  # (step, clock) of the newest save started
        self._last_full_at: float | None = None
        self._last_incremental_written: float | None = None
        self._started: dict[int, float] = {}  # step -> clock at staging, until committed
        self._restore_point: tuple[int, float] | None = None  # newest committed: (step, started at)
        self._logical_bytes: float | None = None

    # -- what the manager reads ------------------------------------------------------------
    @property
    def on_busy(self) -> str:
        return self.objectives.on_busy

    @property
    def keep_base_in_memory(self) -> bool:
        return self.objectives.keep_base_in_memory

    @property
    def ready_copies(self) -> bool:
        return self.objectives.ready_copies

    @property
    def incremental_every(self) -> int:
        """Always truthy: incrementals follow fulls (the manager keeps the base in memory)."""
        plan = self.plan()
        return plan.interval_steps or 1

    def should_save(self, step: int) -> str | None:
        """None, "full" or "incremental" for ``step`` (see module doc)."""
        now = self.clock()
        with self._lock:
            if self._decided is not None and self._decided[0] == step:
                return self._decided[1]
            if self._last_call is not None:
                prev_step, prev_t = self._last_call
                if step > prev_step:  # compute time per step: the saves' blocking is their cost
                    self._step_s.add(max(now - prev_t - self._blocked_since_call, 0.0) / (step - prev_step))
            self._blocked_since_call = 0.0
            self._last_call = (step, now)
            kind = self._decide(step, now)
            self._decided = (step, kind)
            return kind

    def _decide(self, step: int, now: float) -> str | None:
        if self._last_save is None:
            return "full"  # nothing measured yet: this save measures the cost
        last_step, last_t = self._last_save
        plan = self._plan()
        rpo_due = now - last_t >= max(float(self.objectives.rpo) - plan.ready_s, 0.0)  # type: ignore[arg-type]
        step_due = plan.interval_steps is not None and step - last_step >= plan.interval_steps
        if step <= last_step or not (rpo_due or step_due):
            return None
        return self._kind(now)

    def _kind(self, now: float) -> str:
        obj = self.objectives
        full_w = self._written["full"].value
        if self._last_full_at is None or full_w is None:
            return "full"
        if obj.full_max_age is not None and now - self._last_full_at >= obj.full_max_age:  # type: ignore[operator]
            return "full"
        inc_w = self._last_incremental_written
        if inc_w is not None and inc_w >= obj.full_ratio * full_w:
            return "full"
        return "incremental"

    # -- learning from the manager ---------------------------------------------------------
    def observe(self, event: str, fields: dict) -> None:
        """``CheckpointManager`` observer: save_staged / save_committed / restore events."""
        now = self.clock()
        kind = fields.get("kind")
        with self._lock:
            if event == "save_staged":
                self._blocked.add(fields["blocked_s"])
                self._blocked_since_call += fields["blocked_s"]
                self._last_save = (fields["step"], now)
                self._started[fields["step"]] = now
                if kind == "full":
                    self._last_full_at = now
            elif event == "save_committed":
                if kind in self._ready:
                    self._ready[kind].add(fields["since_created"])
                    self._written[kind].add(fields["written_bytes"])
                if kind == "incremental":
                    self._last_incremental_written = float(fields["written_bytes"])
                elif kind == "full":
                    self._last_incremental_written = None
                started = self._started.pop(fields["step"], now - fields["since_created"])
                if self._restore_point is None or fields["step"] >= self._restore_point[0]:
                    self._restore_point = (fields["step"], started)
                self._logical_bytes = float(fields["logical_bytes"])
            elif event == "save_failed":  # the manager asks for a save again (on_error); not a restore point
                self._started.pop(fields.get("step"), None)
            elif event == "restore" and fields.get("ok") and fields.get("logical_bytes"):
                self._restore_per_byte.add(fields["seconds"] / fields["logical_bytes"])

    # -- reporting -------------------------------------------------------------------------
    def plan(self) -> Plan:
        """The interval for the current measurements."""
        with self._lock:
            return self._plan()

    def _plan(self) -> Plan:
        ready = max((a.value for a in self._ready.values() if a.value is not None), default=0.0)
        restore = None
        if self._restore_per_byte.value is not None and self._logical_bytes is not None:
            restore = self._restore_per_byte.value * self._logical_bytes
        return plan_interval(self.objectives, self._blocked.value or 0.0, ready, self._step_s.value, restore)

    def stats(self) -> dict[str, Any]:
        """The plan plus measurements: what ``CheckpointMetrics.watch_policy`` exports."""
        now = self.clock()
        with self._lock:
            plan = self._plan()
            point = self._restore_point
            measured = self._blocked.value is not None and any(a.value is not None for a in self._ready.values())
            full_w, inc_w = self._written["full"].value, self._written["incremental"].value
        age = None if point is None else now - point[1]
        return {**asdict(plan), "measured": measured, "rpo_s": self.objectives.rpo, "rto_s": self.objectives.rto,
                "mtbf_s": self.objectives.mtbf, "full_written_bytes": full_w, "incremental_written_bytes": inc_w,
                "restore_point_step": None if point is None else point[0], "restore_point_age_s": age,
                "rpo_met_now": None if age is None else age <= float(self.objectives.rpo)}  # type: ignore[arg-type]


__all__ = ["Objectives", "ObjectivePolicy", "Plan", "plan_interval", "daly_interval"]
