"""Checkpoint interval benchmark: the objective-driven policy vs fixed step intervals.

    .venv/bin/python benchmarks/policy.py                 # 128 MiB state, a simulated week
    .venv/bin/python benchmarks/policy.py --quick         # 16 MiB, one simulated day

1. Measures real saves of a model-sized float32 state with ``CheckpointManager`` on a local
   store: blocking time and time to restore-ready (committed) of a full checkpoint and of an
   incremental (1% of the elements changed), and the restore time (median of ``--repeats``).
2. Simulates a training run of ``--days`` of wall time (``--step-s`` per step) with failures
   drawn from an exponential distribution with mean ``--mtbf`` (seeded; every policy sees the
   same failure times). A save blocks the loop for the measured blocking time (and waits for
   the previous save if it is not committed yet); it becomes a restore point the measured
   ready time later. A failure loses the work since the newest restore point and costs a
   restore. Policies: ``ObjectivePolicy`` (rpo, mtbf, rto) fed the measured costs through its
   observer, and fixed intervals of 10, 100 and 1,000 steps (full every 10th save).
3. Prints, per policy: saves, blocking overhead, lost work, restore time, total waste and the
   useful fraction of the wall time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from trainstore.checkpoint import CheckpointManager, CheckpointPolicy  # noqa: E402
from trainstore.durations import positive_duration  # noqa: E402


@dataclass
class Costs:
    full_blocked: float
    full_ready: float
    inc_blocked: float
    inc_ready: float
    restore: float
    full_bytes: int
    inc_bytes: int
    logical: int


def measure(mib: int, repeats: int) -> Costs:
    """Real saves and restores of a ``mib`` MiB float32 state on a local store."""
    root = tempfile.mkdtemp(prefix="ts-policy-")
    try:
        n = mib * (1 << 20) // 4
        state = {"w": np.random.default_rng(0).standard_normal(n).astype(np.float32)}
        fb, fr, ib, ir, rs, fw, iw = [], [], [], [], [], [], []
        events: dict[int, dict] = {}

        def observe(event: str, f: dict) -> None:
            if event in ("save_staged", "save_committed"):
                events.setdefault(f["step"], {}).update(f)

        with CheckpointManager(os.path.join(root, "store"), "bench", CheckpointPolicy(full_every=2),
                               observers=[observe]) as mgr:
            step = 0
            for _ in range(repeats):
                for kind in ("full", "incremental"):
                    step += 1
                    state["w"][:: 100] += 1.0  # 1% of the elements change: every chunk differs
                    mgr.save(step, state, kind=kind).wait()
                    e = events[step]
                    (fb if kind == "full" else ib).append(e["blocked_s"])
                    (fr if kind == "full" else ir).append(e["since_created"])
                    (fw if kind == "full" else iw).append(e["written_bytes"])
                t0 = time.perf_counter()
                mgr.restore()
                rs.append(time.perf_counter() - t0)
        med = statistics.median
        return Costs(med(fb), med(fr), med(ib), med(ir), med(rs), int(med(fw)), int(med(iw)), n * 4)
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Fixed:
    """Save every ``every`` steps, a full every ``full_each``-th save."""

    def __init__(self, every: int, full_each: int = 10) -> None:
        self.every, self.full_each, self.n = every, full_each, 0
        self.name = f"fixed every {every:,} steps"

    def should_save(self, step: int) -> str | None:
        if step % self.every:
            return None
        self.n += 1
        return "full" if (self.n - 1) % self.full_each == 0 else "incremental"

    def observe(self, event: str, f: dict) -> None:
        pass


class SimClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def simulate(policy, clock: SimClock, costs: Costs, step_s: float, wall_s: float, failures: list[float]) -> dict:
    """Run ``policy`` for ``wall_s`` of simulated wall time; returns the waste breakdown."""
    step = done = 0  # step: current step (rolls back on failure); done: useful steps at the end
    points: list[tuple[float, int]] = [(0.0, 0)]  # (ready at, step) restore points; step 0 = start
    busy_until = 0.0
    saves = {"full": 0, "incremental": 0}
    blocked = lost = restoring = 0.0
    fail = iter(failures)
    next_fail = next(fail, float("inf"))
    while clock.t < wall_s:
        if clock.t >= next_fail:  # the failure: back to the newest restore point ready by now
            ready_step = max(s for at, s in points if at <= next_fail)
            lost += (step - ready_step) * step_s
            step = ready_step
            points = [(at, s) for at, s in points if at <= next_fail]
            clock.t = next_fail + costs.restore
            restoring += costs.restore
            busy_until = clock.t
            policy.observe("restore", {"job": "sim", "ok": True, "step": step, "kind": "full",
                                       "seconds": costs.restore, "skipped": 0, "logical_bytes": costs.logical})
            next_fail = next(fail, float("inf"))
            continue
        clock.t += step_s
        step += 1
        kind = policy.should_save(step)
        if kind is None:
            continue
        full = kind == "full"
        wait = max(busy_until - clock.t, 0.0)  # on_busy="wait": the previous save must commit
        b = (costs.full_blocked if full else costs.inc_blocked) + wait
        clock.t += b
        blocked += b
        saves[kind] += 1
        policy.observe("save_staged", {"job": "sim", "step": step, "kind": kind, "blocked_s": b})
        ready = costs.full_ready if full else costs.inc_ready
        busy_until = clock.t + ready - b
        points.append((busy_until, step))
        written = costs.full_bytes if full else costs.inc_bytes
        policy.observe("save_committed", {"job": "sim", "step": step, "kind": kind, "seconds": ready,
                                          "since_created": ready, "logical_bytes": costs.logical,
                                          "stored_bytes": written, "written_bytes": written, "pieces": 0,
                                          "same_as_base": 0, "deltas": 0})
    done = step
    useful = done * step_s
    return {"saves": saves, "blocked_h": blocked / 3600, "lost_h": lost / 3600, "restore_h": restoring / 3600,
            "waste_h": (wall_s - useful) / 3600, "useful": useful / wall_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--step-s", type=float, default=1.0)
    ap.add_argument("--mtbf", default="24h")
    ap.add_argument("--rpo", default="15min")
    ap.add_argument("--rto", default="2min")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.mib, a.repeats, a.days, a.seeds = 16, 1, 1.0, 1
    costs = measure(a.mib, a.repeats)
    print(f"measured ({a.mib} MiB float32, local store, median of {a.repeats}): "
          f"full blocked {costs.full_blocked:.3f}s ready {costs.full_ready:.3f}s written {costs.full_bytes / 2**20:.1f} MiB; "
          f"incremental blocked {costs.inc_blocked:.3f}s ready {costs.inc_ready:.3f}s written "
          f"{costs.inc_bytes / 2**20:.1f} MiB; restore {costs.restore:.3f}s")
    wall, mtbf = a.days * 86400, positive_duration(a.mtbf, "mtbf")
    results: dict[str, list[dict]] = {}
    objective_stats = None
    for seed in range(a.seeds):
        rng = np.random.default_rng(seed)
        failures = list(np.cumsum(rng.exponential(mtbf, size=int(4 * wall / mtbf) + 10)))
        failures = [f for f in failures if f < wall]
        clock = SimClock()
        obj = CheckpointPolicy.from_objectives(rpo=a.rpo, mtbf=a.mtbf, rto=a.rto, clock=clock)
        runs: list[tuple[str, object, SimClock]] = [("objective (rpo %s, mtbf %s)" % (a.rpo, a.mtbf), obj, clock)]
        runs += [(p.name, p, SimClock()) for p in (Fixed(10), Fixed(100), Fixed(1000))]
        for name, policy, clk in runs:
            results.setdefault(name, []).append(simulate(policy, clk, costs, a.step_s, wall, failures))
        objective_stats = obj.stats()
    st = objective_stats
    print(f"objective policy chose: interval {st['interval_s']:.1f}s = {st['interval_steps']} steps ({st['bound']}), "
          f"expected loss per failure {st['expected_loss_s']:.1f}s, worst {st['worst_loss_s']:.1f}s, "
          f"rpo_met {st['rpo_met']}, restore {st['restore_s']:.2f}s, rto_met {st['rto_met']}, "
          f"hot_keep_last {st['hot_keep_last']}")
    print(f"simulated {a.days:g} days at {a.step_s}s/step, MTBF {a.mtbf}, {a.seeds} seeds (mean):")
    print(f"{'policy':<34} {'saves':>8} {'blocked h':>10} {'lost h':>8} {'restore h':>10} {'waste h':>8} "
          f"{'useful':>7} {'vs objective':>13}")
    base = statistics.mean(r["waste_h"] for r in next(iter(results.values())))
    for name, rs in results.items():
        mean = {k: statistics.mean(r[k] for r in rs) for k in ("blocked_h", "lost_h", "restore_h", "waste_h", "useful")}
        saves = statistics.mean(sum(r["saves"].values()) for r in rs)
        print(f"{name:<34} {saves:>8.0f} {mean['blocked_h']:>10.2f} {mean['lost_h']:>8.2f} {mean['restore_h']:>10.2f} "
              f"{mean['waste_h']:>8.2f} {mean['useful']:>7.2%} {mean['waste_h'] / base:>12.2f}x")


if __name__ == "__main__":
    main()
