"""Training through a durable-tier outage (issue 26 item 10).

Write-back tiering in front of moto S3 reached through the fault proxy; the proxy resets
every connection for a five-minute outage, compressed in time: each training step advances
the tiering's clock by 30 s (the backoff itself runs on real, short delays). The training
loop never raises: copies are retried with backoff and resume in order, retention keeps
every hot checkpoint without a durable copy, metrics and ``backlog_status`` say how far
behind the durable tier is, and everything is durable afterwards. Training stops only for a
limit the user set (durable RPO, hot-tier bytes), with a message naming it.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from trainstore import CheckpointPolicy, RetentionPolicy
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import BackgroundError
from trainstore.lifecycle.metrics import CheckpointMetrics
from trainstore.lifecycle.retention import retention_hook
from trainstore.lifecycle.tiering import Tiering, TierPolicy
from trainstore.store import RetryOptions

pytestmark = pytest.mark.timeout(300)

SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, nice=0)
FULLS = CheckpointPolicy(full_every=1, incremental_every=None)
#: an outage costs each durable call ~0.5 s, not the reliability suite's ~2 s
QUICK = RetryOptions(max_retries=1, retry_timeout_s=2.0, init_backoff_s=0.01, max_backoff_s=0.05,
                     timeout_s=0.5, connect_timeout_s=0.5)
STEP_S = 30.0  # fake seconds per training step


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def state(step: int) -> dict:
    return {"w": np.random.default_rng(step).standard_normal(3000).astype(np.float32), "step": step}


def _tiers(tmp_path, flaky_s3, clock, **policy) -> Tiering:
    url, opts = flaky_s3
    base = {"hot_keep_last": 2, "hot_gc_grace": 0, "retry_backoff": 0.05, "retry_backoff_max": 0.2}
    return Tiering(str(tmp_path / "hot"), url, durable_options={**opts, "retry": QUICK},
                   policy=TierPolicy(**{**base, **policy}), clock=clock)


@pytest.mark.parametrize("mode", ["reset", pytest.param("stall", marks=pytest.mark.stress)])
def test_training_runs_through_a_five_minute_durable_outage(tmp_path, fault_proxy, flaky_s3, mode):
    """``reset``: every connection refused at once; ``stall`` (stress): nothing answers until
    the client times out, so each durable call costs a timeout."""
    clock = Clock()
    tiers = _tiers(tmp_path, flaky_s3, clock)
    metrics = CheckpointMetrics(persist=False)  # a manager observer gets the backlog events too
    mgr = tiers.manager("run", policy=FULLS, options=SMALL, observers=[metrics.observe],
                        hooks=[retention_hook(RetentionPolicy(keep_last=3))])
    during = None
    for step in range(24):  # the loop itself: it must never raise
        clock.t += STEP_S
        if step == 4:
            fault_proxy.outage = mode
        if step == 14:  # ten steps down: 300 s of outage
            during = (tiers.backlog_status("run"), sorted(int(k.key.split("/")[3]) for k in
                                                          tiers.hot.list("jobs/run/checkpoints/")
                                                          if k.key.endswith("manifest.json")), metrics.text())
            fault_proxy.outage = None
        mgr.save(step, state(step), blocking=True)
    st, hot_steps, text = during
    assert st.checkpoints >= 9 and st.lag_s >= 9 * STEP_S and st.failing_since is not None and st.attempts >= 2, st
    assert set(range(4, 14)) <= set(hot_steps), hot_steps  # retention kept every step without a durable copy
    assert 'trainstore_ckpt_durable_lag_seconds{job="run"}' in text and "durable_copy_failing{job=\"run\"} 1.0" in text
    mgr.wait()  # every copy done, in order, once the store was back
    assert tiers.backlog_status("run").checkpoints == 0
    assert all(i.durable for i in mgr.list())
    assert 'trainstore_ckpt_durable_backlog_checkpoints{job="run"} 0.0' in metrics.text()
    newest = mgr.steps()[-1]
    mgr.close()
    tiers.close()
    shutil.rmtree(tmp_path / "hot")  # the node is lost: the durable tier alone has the newest step
    url, opts = flaky_s3
    fresh = Tiering(str(tmp_path / "hot2"), url, durable_options=opts)
    with fresh.manager("run", options=SMALL) as again:
        got = again.restore()
        assert again.last_restore.step == newest == 23 and np.array_equal(got["w"], state(23)["w"])
    fresh.close()


@pytest.mark.parametrize("limit", ["rpo", "bytes"])
def test_a_limit_the_user_set_stops_training_with_its_name(tmp_path, fault_proxy, flaky_s3, limit):
    clock = Clock()
    kw = {"durable_rpo": "2m"} if limit == "rpo" else {"max_hot_backlog_bytes": 3 * 12_500}
    tiers = _tiers(tmp_path, flaky_s3, clock, **kw)
    mgr = tiers.manager("run", policy=FULLS, options=SMALL)
    mgr.save(0, state(0), blocking=True)
    mgr.wait()
    fault_proxy.outage = "reset"
    stopped = None
    for step in range(1, 12):
        clock.t += STEP_S
        try:
            mgr.save(step, state(step), blocking=True)
        except BackgroundError as exc:
            stopped = (step, str(exc))
            break
    assert stopped is not None, "a breached limit never stopped training"
    step, msg = stopped
    if limit == "rpo":
        assert "durability RPO breached" in msg and "durable_rpo=2m" in msg and 5 <= step <= 7, stopped
    else:
        assert "hot-tier space limit" in msg and "max_hot_backlog_bytes=37,500" in msg and step <= 6, stopped
    fault_proxy.outage = None
    mgr.wait()  # the copies went on meanwhile: durable once the store is back
    assert all(i.durable for i in mgr.list())
    mgr.close()
    tiers.close()
