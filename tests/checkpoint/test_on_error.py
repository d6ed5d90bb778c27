"""Issue 19 item 3: a failed background save kills training only with on_error="raise".

The failure is real: the store lies on a 1 MiB tmpfs that a ballast file fills (as root),
else on a directory made read-only with chmod (as another user).
"""

from __future__ import annotations

import numpy as np
import pytest
from harness.breakable import BreakableDir

from trainstore import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.save.failures import SaveErrorPolicy
from trainstore.errors import BackgroundError, ConfigError
from trainstore.lifecycle.metrics import CheckpointMetrics

pytestmark = pytest.mark.timeout(120)


def _state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal(2048).astype(np.float32), "b": np.full(16, step, dtype=np.int64)}


def _manager(breakable: BreakableDir, on_error, metrics=None, policy=None) -> CheckpointManager:
    return CheckpointManager(str(breakable.store), "job", policy or CheckpointPolicy(full_every=5, incremental_every=None),
                             on_error=on_error, observers=[metrics.observe] if metrics else [])


def _sample(metrics: CheckpointMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"job": "job"})


def test_raise_is_default_and_says_how_to_switch(breakable):
    mgr = _manager(breakable, "raise")
    mgr.save(5, _state(5), blocking=True)
    breakable.break_()
    mgr.save(10, _state(10))
    with pytest.raises(BackgroundError) as info:
        mgr.save(11, _state(11))  # the next call raises the failure of step 10
    msg = str(info.value)
    assert "step 10" in msg and "on_error='warn'" in msg
    assert mgr.failures.stats()["save_failures"] == 1
    assert CheckpointManager(str(breakable.store), "other").failures.policy.mode == "raise"
    breakable.heal()
    mgr.close()


@pytest.mark.filterwarnings("ignore:checkpoint step")
def test_warn_keeps_training_counts_and_saves_again(breakable):
    metrics = CheckpointMetrics()
    mgr = _manager(breakable, "warn", metrics)
    saved = {}
    failed_steps = []
    breaks = {8: "break", 13: "heal"}
    for step in range(1, 21):  # a training loop: the save of step 10 and 11 fail, 13 commits
        if breaks.get(step) == "break":
            breakable.break_()
        elif breaks.get(step) == "heal":
            breakable.heal()
        kind = mgr.should_save(step)
        if kind:
            state = _state(step)
            mgr.save(step, state)
            mgr.wait()  # never raises under "warn"
            if mgr.failures.stats()["failed_step"] == step:
                failed_steps.append(step)
            else:
                saved[step] = state
    assert failed_steps == [10, 11, 12]  # 10 failed; asked again at each next step until healed
    assert sorted(saved) == [5, 13, 15, 20]  # 13 made up for 10; then the policy's own steps
    stats = mgr.failures.stats()
    assert stats["save_failures"] == 3 and stats["consecutive_failures"] == 0 and not stats["rpo_at_risk"]
    assert _sample(metrics, "trainstore_ckpt_save_failures_total") == 3
    assert _sample(metrics, "trainstore_ckpt_save_failures_tolerated_total") == 3
    assert _sample(metrics, "trainstore_ckpt_rpo_at_risk") == 0
    assert 0 <= _sample(metrics, "trainstore_ckpt_last_commit_age_seconds") < 60
    assert mgr.steps() == [5, 13, 15, 20]
    for step in (13, 20):
        got = mgr.restore(step=step)
        for k, v in saved[step].items():
            assert got[k].dtype == v.dtype and got[k].tobytes() == v.tobytes()
    mgr.close()


def test_warn_gives_a_warning_and_exports_the_risk(breakable):
    metrics = CheckpointMetrics()
    mgr = _manager(breakable, "warn", metrics)
    mgr.save(5, _state(5), blocking=True)
    breakable.break_()
    assert mgr.should_save(10) == "full"
    mgr.save(10, _state(10))
    mgr.wait()
    stats = mgr.failures.stats()
    assert stats["rpo_at_risk"] and stats["failed_step"] == 10 and stats["last_commit_step"] == 5
    assert _sample(metrics, "trainstore_ckpt_rpo_at_risk") == 1
    assert _sample(metrics, "trainstore_ckpt_consecutive_save_failures") == 1
    with pytest.warns(RuntimeWarning, match=r"step 10 .*training continues"):
        assert mgr.should_save(11) == "full"  # not a policy step: made up for the failure
    breakable.heal()
    mgr.close()


def test_retry_waits_for_the_backoff(breakable):
    mgr = _manager(breakable, SaveErrorPolicy("retry", backoff_s=30.0, backoff_max_s=60.0))
    now = [100.0]
    mgr.failures.clock = lambda: now[0]
    breakable.break_()
    mgr.save(5, _state(5), blocking=True)
    with pytest.warns(RuntimeWarning, match="after 30 s"):
        assert mgr.should_save(6) is None
    now[0] += 29
    assert mgr.should_save(7) is None
    now[0] += 1
    assert mgr.should_save(8) == "full"
    mgr.save(8, _state(8), blocking=True)  # fails again: the backoff doubles
    now[0] += 59
    with pytest.warns(RuntimeWarning, match="after 60 s"):
        assert mgr.should_save(9) is None
    now[0] += 1
    assert mgr.should_save(9) == "full"  # the backoff has passed
    breakable.heal()
    assert mgr.should_save(11) == "full"
    state = _state(11)
    mgr.save(11, state, blocking=True)
    assert mgr.should_save(12) is None and not mgr.failures.stats()["rpo_at_risk"]
    assert mgr.restore()["w"].tobytes() == state["w"].tobytes()
    mgr.close()


def test_warn_with_objective_policy(breakable):
    clock = [1000.0]
    policy = CheckpointPolicy.from_objectives(rpo="1h", mtbf="7d", clock=lambda: clock[0])
    mgr = _manager(breakable, "warn", policy=policy)
    breakable.break_()
    assert mgr.should_save(1) == "full"  # nothing measured: the first save measures
    mgr.save(1, _state(1), blocking=True)
    clock[0] += 1
    assert mgr.should_save(2) == "full"  # the policy would wait for its interval; the failure does not
    breakable.heal()
    state = _state(2)
    mgr.save(2, state, blocking=True)
    clock[0] += 1
    assert mgr.should_save(3) is None
    assert policy.stats()["restore_point_step"] == 2
    assert mgr.restore()["w"].tobytes() == state["w"].tobytes()
    mgr.close()


def test_bad_on_error_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="on_error"):
        CheckpointManager(str(tmp_path), "job", on_error="ignore")
