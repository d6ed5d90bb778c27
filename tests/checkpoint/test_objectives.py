"""Issue 19 item 1: the checkpoint interval chosen from RPO/RTO, the MTBF and measured costs."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from trainstore import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.objectives import ObjectivePolicy, Objectives, plan_interval
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import ConfigError
from trainstore.lifecycle.metrics import CheckpointMetrics


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def young_daly(c: float, m: float) -> float:
    """Daly 2006, eq. (37): higher-order optimum compute time between checkpoints."""
    return math.sqrt(2 * c * m) * (1 + (1 / 3) * math.sqrt(c / (2 * m)) + (1 / 9) * (c / (2 * m))) - c


def run(policy: ObjectivePolicy, clock: Clock, steps: range, step_s: float, blocked_s: float, ready_s: float,
        written: dict | None = None) -> list[tuple[int, str]]:
    """A simulated training loop: the clock advances step_s per step; each save 'costs' the
    injected blocking time and becomes restore-ready ready_s later (events as the manager sends)."""
    written = written or {"full": 1000, "incremental": 100}
    saves = []
    for step in steps:
        clock.t += step_s
        kind = policy.should_save(step)
        assert policy.should_save(step) == kind  # asking twice (manager.save does) answers the same
        if kind is None:
            continue
        saves.append((step, kind))
        clock.t += blocked_s
        policy.observe("save_staged", {"job": "j", "step": step, "kind": kind, "blocked_s": blocked_s})
        w = written[kind] if not callable(written[kind]) else written[kind](step)
        policy.observe("save_committed", {"job": "j", "step": step, "kind": kind, "seconds": ready_s,
                                          "since_created": ready_s, "logical_bytes": 4000, "stored_bytes": w,
                                          "written_bytes": w, "pieces": 1, "same_as_base": 0, "deltas": 0})
    return saves


def gaps(saves: list[tuple[int, str]]) -> list[int]:
    return [b[0] - a[0] for a, b in zip(saves, saves[1:])]


def test_plan_is_daly_optimum_capped_by_rpo_and_floored_by_save_duration():
    obj = Objectives(rpo="2h", mtbf="24h")
    p = plan_interval(obj, save_cost_s=10.0, ready_s=30.0)
    assert p.interval_s == pytest.approx(young_daly(10, 86400))
    assert p.interval_s == pytest.approx(math.sqrt(2 * 10 * 86400), rel=0.01)  # Young to first order
    assert p.bound == "daly" and p.rpo_met
    assert p.expected_loss_s == pytest.approx(30 + p.interval_s / 2)
    assert p.waste == pytest.approx(10 / p.interval_s + (30 + p.interval_s / 2) / 86400)

    p = plan_interval(Objectives(rpo="10min", mtbf="24h"), save_cost_s=10.0, ready_s=30.0)
    assert (p.interval_s, p.bound, p.rpo_met, p.worst_loss_s) == (570.0, "rpo", True, 600.0)

    p = plan_interval(Objectives(rpo="20s", mtbf="24h"), save_cost_s=1.0, ready_s=30.0)
    assert p.interval_s == 30.0 and not p.rpo_met  # a save takes longer than the RPO allows

    p = plan_interval(Objectives(rpo="1h", mtbf="1h"), save_cost_s=0.01, ready_s=120.0)
    assert p.interval_s == 120.0 and p.bound == "save duration"  # saves must not pile up

    # overhead budget: 10 s blocking at most 0.1% of the time -> 10000 s, but the RPO wins
    p = plan_interval(Objectives(rpo="15min", mtbf="30d", max_overhead=0.001), save_cost_s=10.0, ready_s=0.0)
    assert p.interval_s == 900.0 and p.bound == "rpo" and p.rpo_met and p.budget_met is False
    p = plan_interval(Objectives(rpo="1d", mtbf="30d", max_overhead=0.001), save_cost_s=10.0, ready_s=0.0)
    assert p.interval_s == 10000.0 and p.bound == "overhead budget" and p.budget_met


def test_simulated_run_saves_at_the_optimum_and_adapts_to_step_time_and_save_cost():
    clock = Clock()
    policy = CheckpointPolicy.from_objectives(rpo="1h", mtbf="1h", clock=clock)
    saves = run(policy, clock, range(1, 600), step_s=1.0, blocked_s=2.0, ready_s=10.0)
    assert saves[0] == (1, "full")  # nothing measured: the first save measures the cost
    # the clock also advances by the blocking time; steps between saves = interval / step time
    expected = int(young_daly(2.0, 3600) / 1.0)
    assert expected == 118
    assert gaps(saves)[1:] == [expected] * (len(saves) - 2)

    # steps twice as fast: twice as many steps per interval (the time is the same)
    fast = run(policy, clock, range(600, 2000), step_s=0.5, blocked_s=2.0, ready_s=10.0)
    assert gaps(fast)[-3:] == [int(young_daly(2.0, 3600) / 0.5)] * 3

    # saves 4x as expensive: interval x ~2 (sqrt), once the running averages have settled
    slow = run(policy, clock, range(2000, 14000), step_s=0.5, blocked_s=8.0, ready_s=10.0)
    assert gaps(slow)[-3:] == [int(young_daly(8.0, 3600) / 0.5)] * 3
    st = policy.stats()
    assert st["interval_s"] == pytest.approx(young_daly(8.0, 3600), rel=1e-4)
    assert st["save_cost_s"] == pytest.approx(8.0, rel=1e-3) and st["step_s"] == pytest.approx(0.5)
    assert st["expected_loss_s"] == pytest.approx(10.0 + young_daly(8.0, 3600) / 2, rel=1e-4)
    assert st["rpo_met"] and st["measured"]


def test_rpo_is_kept_in_wall_time_when_steps_slow_down():
    clock = Clock()
    policy = CheckpointPolicy.from_objectives(rpo="5min", mtbf="30d", clock=clock)
    run(policy, clock, range(1, 400), step_s=1.0, blocked_s=0.5, ready_s=20.0)
    assert policy.plan().interval_steps == 280  # rpo - ready = 280 s at 1 s per step
    # steps become 50x slower: the step count would stretch the loss to 14000 s; the wall-time
    # guard saves once rpo - ready (280 s) has passed
    slow = run(policy, clock, range(400, 430), step_s=50.0, blocked_s=0.5, ready_s=20.0)
    assert slow and max(gaps(slow)) <= 6  # 6 x 50 s >= 280 s
    assert policy.stats()["rpo_met_now"]


def test_full_when_deltas_stop_paying_else_incremental():
    clock = Clock()
    policy = CheckpointPolicy.from_objectives(rpo="100s", mtbf="1d", clock=clock)
    # incrementals write 10% of a full at first, growing by 10 points per save
    inc = iter(range(100, 10000, 100))
    saves = run(policy, clock, range(1, 2000), step_s=1.0, blocked_s=0.1, ready_s=1.0,
                written={"full": 1000, "incremental": lambda step: next(inc)})
    kinds = [k for _s, k in saves]
    assert kinds[:7] == ["full"] + ["incremental"] * 5 + ["full"]  # the 5th writes 500 = 0.5 x full
    # full_max_age forces a full every 10 minutes whatever the delta sizes
    clock2 = Clock()
    p2 = CheckpointPolicy.from_objectives(rpo="100s", mtbf="1d", full_max_age="10min", clock=clock2)
    saves = run(p2, clock2, range(1, 3000), step_s=1.0, blocked_s=0.1, ready_s=1.0)
    fulls = [s for s, k in saves if k == "full"]
    assert len(fulls) >= 4 and all(600 <= b - a <= 700 for a, b in zip(fulls, fulls[1:]))


def test_rto_from_measured_restores_sets_hot_keep_last():
    clock = Clock()
    policy = CheckpointPolicy.from_objectives(rpo="15min", mtbf="1d", rto="20s", clock=clock)
    run(policy, clock, range(1, 5), step_s=1.0, blocked_s=0.1, ready_s=1.0)  # logical_bytes 4000
    assert policy.stats()["rto_met"] is None and policy.stats()["hot_keep_last"] == 2  # no restore measured
    policy.observe("restore", {"job": "j", "ok": True, "step": 1, "kind": "full", "seconds": 8.0, "skipped": 0,
                               "logical_bytes": 8000})  # 1 ms per byte -> newest (4000 B) restores in 4 s
    st = policy.stats()
    assert st["restore_s"] == pytest.approx(4.0) and st["rto_met"] is True
    assert st["hot_keep_last"] == 5  # 5 candidates fit in 20 s
    tight = CheckpointPolicy.from_objectives(rpo="15min", mtbf="1d", rto="3s", clock=clock)
    run(tight, clock, range(1, 3), step_s=1.0, blocked_s=0.1, ready_s=1.0)
    tight.observe("restore", {"ok": True, "seconds": 8.0, "logical_bytes": 8000})
    assert tight.stats()["rto_met"] is False and tight.stats()["hot_keep_last"] == 2


@pytest.mark.parametrize("kw, what", [({"rpo": "soon"}, "rpo"), ({"mtbf": 0}, "mtbf"), ({"rto": "-1s"}, "rto"),
                                      ({"max_overhead": 2.0}, "max_overhead"), ({"on_busy": "queue"}, "on_busy"),
                                      ({"full_ratio": 0}, "full_ratio"), ({"max_hot": 1}, "max_hot")])
def test_bad_objectives_are_config_errors_naming_the_field(kw, what):
    args = {"rpo": "15min", "mtbf": "24h", **kw}
    with pytest.raises(ConfigError, match=what) as err:
        CheckpointPolicy.from_objectives(**args)
    assert isinstance(err.value, ValueError)


@pytest.mark.timeout(120)
def test_real_manager_feeds_the_policy_and_metrics_export_it(tmp_path):
    policy = CheckpointPolicy.from_objectives(rpo="0.5s", mtbf="1h", rto="1min")
    metrics = CheckpointMetrics()
    metrics.watch_policy(policy, "real")
    state = {"w": np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32)}
    with CheckpointManager(str(tmp_path / "store"), "real", policy, observers=[metrics.observe],
                           options=WriteOptions(chunk_bytes=1 << 16, nice=0)) as mgr:
        saved = []
        t_end = time.monotonic() + 3.0
        step = 0
        while time.monotonic() < t_end:
            step += 1
            time.sleep(0.01)
            state["w"][step % 1000] += 1.0
            if mgr.should_save(step):
                saved.append((step, mgr.save(step, state).kind))
        mgr.wait()
        mgr.restore()
        steps = mgr.steps()
    assert [s for s, _ in saved] == steps and saved[0][1] == "full"
    assert "incremental" in {k for _, k in saved}
    st = policy.stats()
    assert st["measured"] and st["restore_s"] is not None and st["rto_met"] is True
    # the RPO of 0.5 s in wall time bounds every gap between saves (interval + ready <= rpo)
    assert st["interval_s"] + st["ready_s"] <= 0.5 + 1e-9 or not st["rpo_met"]
    assert 3 <= len(steps) <= 3.0 / max(st["interval_s"], 0.01) + 2
    text = metrics.text()
    line = next(ln for ln in text.splitlines() if ln.startswith('trainstore_ckpt_policy_interval_seconds{job="real"}'))
    assert float(line.split()[-1]) == pytest.approx(policy.stats()["interval_s"])
    assert 'trainstore_ckpt_policy_rto_met{job="real"} 1.0' in text
