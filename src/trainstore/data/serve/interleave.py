"""The deterministic interleave of a mixture: which source each stream position draws from.

Source ``s`` with expected draws ``T_s(x)`` (``schedule.WeightCurve``; ``sum_s T_s(x)`` is the
number of positions since the era's start) gets its ``j``-th draw at the time
``tau_s(j) = T_s^-1(j + 1/2)``; the stream is every source's draws sorted by ``(tau, s)``.
That is a divisor (Sainte-Laguë) apportionment over the position: it is a pure function of
the position (no walk from the start: any window is computed directly, also after a resume),
counts never go back as the stream grows, and every window of ``L`` positions holds
``w_s * L`` draws of each source up to rounding (about one draw either way per source).

An *era* is a stretch of the stream with one schedule; a resume with other weights starts a
new era at the resume position whose draws continue each source's count (``base``), so what
was drawn stays drawn.
"""

from __future__ import annotations

import math

import numpy as np

from .schedule import WeightCurve


class EraStream:
    """Positions of one era (local: 0 = the era's start) -> (source, draw index of that source)."""

    def __init__(self, curve: WeightCurve, base: np.ndarray) -> None:
        self.curve = curve
        self.base = np.asarray(base, dtype=np.int64)
        self.S = len(self.base)

    def _tau(self, s: int, j: np.ndarray) -> np.ndarray:
        return self.curve.inverse(s, np.asarray(j, dtype=np.float64) + 0.5)

    def _before(self, s: int, x: float) -> int:
        """Draws of source ``s`` with ``tau < x`` (decided by ``tau`` itself: windows agree)."""
        est = max(0, math.ceil(self.curve.expected(s, x) - 0.5))
        while est > 0 and self._tau(s, [est - 1])[0] >= x:
            est -= 1
        while self._tau(s, [est])[0] < x:
            est += 1
        return est

    def _sorted(self, q0: int, q1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Draws around local positions ``[q0, q1)`` in stream order, the per-source draws
        before them, and the local position of the first one."""
        start = self.curve.start
        x_lo, x_hi = start + max(0, q0 - self.S), start + q1 + self.S
        self.curve.ensure(x_hi + 1)
        lo = np.array([self._before(s, x_lo) for s in range(self.S)], dtype=np.int64)
        hi = np.array([self._before(s, x_hi) for s in range(self.S)], dtype=np.int64)
        first = int(lo.sum())
        if first > q0 or hi.sum() < q1:  # the bounds above hold by construction; say so if not
            raise RuntimeError(f"mixture interleave: window [{q0}, {q1}) not bracketed ({first}, {hi.sum()})")
        src = np.concatenate([np.full(h - low, s, dtype=np.int64) for s, (low, h) in enumerate(zip(lo, hi))])
        draw = np.concatenate([np.arange(low, h, dtype=np.int64) for low, h in zip(lo, hi)])
        tau = np.concatenate([self._tau(s, np.arange(low, h)) for s, (low, h) in enumerate(zip(lo, hi))])
        order = np.argsort(tau, kind="stable")  # runs per source already sorted; ties: source order
        return src[order], draw[order], lo, first

    def window(self, q0: int, q1: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, absolute draw index) of local positions ``[q0, q1)``."""
        if q1 <= q0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        src, draw, _lo, first = self._sorted(q0, q1)
        sel = slice(q0 - first, q1 - first)
        return src[sel], draw[sel] + self.base[src[sel]]

    def counts_at(self, q: int) -> np.ndarray:
        """Absolute draws of each source after local positions ``[0, q)``."""
        if q <= 0:
            return self.base.copy()
        src, _draw, lo, first = self._sorted(q, q)
        return self.base + lo + np.bincount(src[:q - first], minlength=self.S)


__all__ = ["EraStream"]
