"""Mixture weights over the run: fixed, piecewise-linear breakpoints, or a recorded callable.

The axis is *samples drawn from the mixture* (all ranks together). ``unit="steps"`` with a
``global_batch`` (batch size x world size) converts steps to samples, so after a resume on
another world size the schedule keeps its place in the data seen, not in the step count.
``unit="tokens"`` (``PiecewiseLinear`` only) with declared mean ``tokens_per_sample`` per source
places each breakpoint at the sample where the *expected* tokens seen reach it (draws of each
source x its mean; between breakpoints the weights are linear in samples): deterministic from
the plan alone, exact in tokens when every sample of a source has its mean length.

* ``PiecewiseLinear({0: {"web": .7, "code": .3}, 10_000: {"web": .4, "code": .6}})``: the
  (normalised) weights are interpolated linearly between breakpoints, held before the first
  and after the last.
* ``CallableSchedule(fn, every=1000)``: ``fn(x)`` (``x`` in the schedule's unit) gives the
  weights held for the next ``every`` units. Each output is recorded (``recorded``) and saved
  with the loader state, so a resume replays it instead of calling ``fn`` again.

``WeightCurve`` turns a schedule into what the interleave needs (``mixture``): ``T_s(x)``,
the expected draws of source ``s`` between an era's start and ``x``, and its inverse.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import ConfigError

UNITS = ("samples", "steps", "tokens")
Weights = Mapping[str, float]


def normalize(weights: Weights, names: Sequence[str], where: str) -> np.ndarray:
    """Weights of ``names`` (in that order), summing to 1; ConfigError naming what is wrong."""
    if not isinstance(weights, Mapping):
        raise ConfigError(f"{where}: weights must be a dict of source name -> weight, got {type(weights).__name__}")
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ConfigError(f"{where}: weights name sources that are not in the mixture: {unknown} "
                          f"(sources: {list(names)})")
    missing = [n for n in names if n not in weights]
    if missing:
        raise ConfigError(f"{where}: no weight for sources {missing}; give every source a weight (0 to leave it out)")
    w = np.array([float(weights[n]) for n in names], dtype=np.float64)
    bad = {n: weights[n] for n, v in zip(names, w) if not math.isfinite(v) or v < 0}
    if bad:
        raise ConfigError(f"{where}: weights must be finite and >= 0, got {bad}")
    if w.sum() <= 0:
        raise ConfigError(f"{where}: all weights are zero; at least one source needs a positive weight")
    return w / w.sum()


def _unit_scale(unit: str, global_batch: int | None) -> int:
    if unit not in UNITS:
        raise ConfigError(f"schedule unit must be one of {UNITS}, got {unit!r}")
    if unit == "steps":
        if not global_batch or global_batch <= 0:
            raise ConfigError("a schedule in steps needs global_batch=batch_size*world_size (samples per step)")
        return int(global_batch)
    return 1


@dataclass(frozen=True)
class PiecewiseLinear:
    """Weights at breakpoints (``{x: {source: weight}}``), linear in between."""

    points: Mapping[int, Weights]
    unit: str = "samples"
    global_batch: int | None = None
    tokens_per_sample: Mapping[str, float] | None = None  # unit="tokens": mean tokens of a source's sample

    def __post_init__(self) -> None:
        if not self.points:
            raise ConfigError("PiecewiseLinear needs at least one breakpoint")
        if any(int(x) < 0 for x in self.points):
            raise ConfigError(f"schedule breakpoints must be >= 0, got {sorted(self.points)}")
        _unit_scale(self.unit, self.global_batch)
        if (self.unit == "tokens") != (self.tokens_per_sample is not None):
            raise ConfigError("a schedule in tokens needs tokens_per_sample={source: mean tokens per sample} "
                              "(and only one in tokens takes it)")
        bad = {k: v for k, v in (self.tokens_per_sample or {}).items() if not math.isfinite(v) or v <= 0}
        if bad:
            raise ConfigError(f"tokens_per_sample must be positive, got {bad}")


def token_means(schedule: Schedule, names: Sequence[str]) -> np.ndarray | None:
    """Mean tokens per sample of each source (``names`` order) of a schedule in tokens, else None."""
    if not isinstance(schedule, PiecewiseLinear) or schedule.tokens_per_sample is None:
        return None
    missing = [n for n in names if n not in schedule.tokens_per_sample]
    if missing:
        raise ConfigError(f"tokens_per_sample has no mean for sources {missing}")
    return np.array([float(schedule.tokens_per_sample[n]) for n in names])


@dataclass(frozen=True)
class CallableSchedule:
    """``fn(x) -> {source: weight}``, called every ``every`` units; outputs recorded."""

    fn: Callable[[int], Weights]
    every: int
    unit: str = "samples"
    global_batch: int | None = None
    #: evaluation index -> normalised weights (filled as the stream is planned, and from a state)
    recorded: dict[int, list[float]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.every <= 0:
            raise ConfigError(f"CallableSchedule every must be positive, got {self.every}")
        if self.unit == "tokens":
            raise ConfigError("CallableSchedule runs in samples or steps; a schedule in tokens is a PiecewiseLinear")
        _unit_scale(self.unit, self.global_batch)


Schedule = PiecewiseLinear | CallableSchedule


def as_schedule(weights: Any) -> Schedule:
    """A dict of weights is a one-point ``PiecewiseLinear``; a callable needs ``CallableSchedule``."""
    if isinstance(weights, (PiecewiseLinear, CallableSchedule)):
        return weights
    if callable(weights):
        raise ConfigError("wrap a weights function as CallableSchedule(fn, every=N) (how often to call it)")
    return PiecewiseLinear({0: weights})


def describe(schedule: Schedule, names: Sequence[str]) -> dict:
    """JSON-able identity of a schedule (what a resume compares to decide on a new era)."""
    if isinstance(schedule, CallableSchedule):
        fn = schedule.fn
        return {"kind": "callable", "fn": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}",
                "every": schedule.every, "unit": schedule.unit, "global_batch": schedule.global_batch}
    pts = sorted((int(x), w) for x, w in schedule.points.items())
    means = token_means(schedule, names)
    return {"kind": "piecewise", "unit": schedule.unit, "global_batch": schedule.global_batch,
            "points": [[x, normalize(w, names, f"schedule breakpoint {x}").tolist()] for x, w in pts],
            **({"tokens_per_sample": means.tolist()} if means is not None else {})}


class WeightCurve:
    """Per-source expected draws ``T_s(x) = integral of w_s from start to x`` for one era.

    Piecewise: segment ``i`` runs from ``knots[i]`` to ``knots[i+1]`` (the last one to
    infinity) with weights going linearly from ``wa[i]`` to ``wb[i]``.
    """

    def __init__(self, schedule: Schedule, names: Sequence[str], start: int, start_tokens: float = 0.0) -> None:
        self.schedule, self.names, self.start = schedule, list(names), int(start)
        self.scale = _unit_scale(schedule.unit, schedule.global_batch)
        self.knots: list[float] = []
        self.wa: list[np.ndarray] = []
        self.wb: list[np.ndarray] = []
        self.T: list[np.ndarray] = []  # T at each knot
        self.horizon = float(start)  # the curve is exact up to here (callables extend it)
        if isinstance(schedule, PiecewiseLinear):
            pts = sorted((int(x) * self.scale, normalize(w, names, f"schedule breakpoint {x}"))
                         for x, w in schedule.points.items())
            means = token_means(schedule, names)
            self._build_linear(pts if means is None else self._tokens_to_samples(pts, means, start_tokens))

    def _push(self, a: float, wa: np.ndarray, wb: np.ndarray) -> None:
        if self.knots:
            L = a - self.knots[-1]
            self.T.append(self.T[-1] + (self.wa[-1] + self.wb[-1]) * (L / 2.0))
        else:
            self.T.append(np.zeros(len(self.names)))
        self.knots.append(float(a))
        self.wa.append(wa)
        self.wb.append(wb)

    def _tokens_to_samples(self, pts: list[tuple[int, np.ndarray]], means: np.ndarray,
                           start_tokens: float) -> list[tuple[float, np.ndarray]]:
        """Breakpoints in tokens -> in samples, from the era start (``start_tokens`` expected
        tokens seen there): a segment from weights ``w0`` to ``w1`` linear in samples yields
        ``L * (w0 + w1) . means / 2`` tokens."""
        w = self._interp(pts, start_tokens)
        out: list[tuple[float, np.ndarray]] = [(float(self.start), w)]
        x, t = float(self.start), float(start_tokens)
        for tk, wk in pts:
            if tk > t:
                x += 2.0 * (tk - t) / float((w + wk) @ means)
                out.append((x, wk))
                t, w = float(tk), wk
        return out

    @staticmethod
    def _interp(pts: Sequence[tuple[float, np.ndarray]], x: float) -> np.ndarray:
        xs = [p[0] for p in pts]
        i = int(np.searchsorted(xs, x, side="right")) - 1
        if i < 0:
            return pts[0][1]
        if i >= len(pts) - 1:
            return pts[-1][1]
        (x0, w0), (x1, w1) = pts[i], pts[i + 1]
        return w0 + (w1 - w0) * ((x - x0) / (x1 - x0))

    def _build_linear(self, pts: Sequence[tuple[float, np.ndarray]]) -> None:
        inner = [x for x, _ in pts if x > self.start]
        bounds = [float(self.start)] + [float(x) for x in inner]
        for k, a in enumerate(bounds):
            b = bounds[k + 1] if k + 1 < len(bounds) else None
            wa = self._interp(pts, a)
            self._push(a, wa, self._interp(pts, b) if b is not None else wa)
        self.horizon = math.inf

    def ensure(self, x: float) -> None:
        """Extend a callable schedule's curve to ``x`` (calling ``fn``, or replaying what was
        recorded): interval ``m`` of ``every`` units holds the weights ``fn(m * every)``."""
        sched = self.schedule
        if not isinstance(sched, CallableSchedule):
            return
        span = sched.every * self.scale
        while self.horizon < x or not self.knots:
            m = int(self.horizon // span)
            rec = sched.recorded.get(m)
            if rec is None:
                w = normalize(sched.fn(m * sched.every), self.names, f"CallableSchedule output at {m * sched.every}")
                sched.recorded[m] = w.tolist()
            else:
                w = np.asarray(rec, dtype=np.float64)
            self._push(self.horizon, w, w)
            self.horizon = float((m + 1) * span)

    def _segment(self, s: int, x: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(np.asarray(self.knots), x, side="right") - 1, 0, None)

    def expected(self, s: int, x: float) -> float:
        """``T_s(x)``: expected draws of source ``s`` from the era start to ``x``."""
        self.ensure(x)
        i = int(self._segment(s, np.asarray([x]))[0])
        d = x - self.knots[i]
        wa, wb = self.wa[i][s], self.wb[i][s]
        L = (self.knots[i + 1] - self.knots[i]) if i + 1 < len(self.knots) else math.inf
        slope = 0.0 if math.isinf(L) else (wb - wa) / L
        return float(self.T[i][s] + wa * d + slope * d * d / 2.0)

    def inverse(self, s: int, y: np.ndarray) -> np.ndarray:
        """Smallest ``x`` with ``T_s(x) >= y`` for each target ``y`` (inf if never reached);
        exact up to ``horizon`` (call ``ensure`` first), extrapolated past it."""
        y = np.asarray(y, dtype=np.float64)
        Ts = np.asarray([t[s] for t in self.T])
        i = np.clip(np.searchsorted(Ts, y, side="right") - 1, 0, len(Ts) - 1)
        a = np.asarray(self.knots)[i]
        wa = np.asarray([w[s] for w in self.wa])[i]
        wb = np.asarray([w[s] for w in self.wb])[i]
        nxt = np.asarray(self.knots[1:] + [math.inf])[i]
        L = nxt - a
        slope = np.where(np.isinf(L), 0.0, (wb - wa) / np.where(np.isinf(L), 1.0, L))
        r = np.maximum(y - Ts[i], 0.0)
        disc = np.sqrt(np.maximum(wa * wa + 2.0 * slope * r, 0.0))
        den = wa + disc
        with np.errstate(divide="ignore", invalid="ignore"):
            d = np.where(r == 0, 0.0, np.where(den > 0, 2.0 * r / den, np.inf))
        return a + d


__all__ = ["UNITS", "CallableSchedule", "PiecewiseLinear", "Schedule", "WeightCurve", "as_schedule",
           "describe", "normalize"]
