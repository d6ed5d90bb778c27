"""Retention rules, each with a clock the test controls."""

from __future__ import annotations

import pytest

from trainstore import RetentionPolicy, open_store
from trainstore.checkpoint.format import manifest as mf
from trainstore.errors import ConfigError
from trainstore.lifecycle.registry import Registry
from trainstore.lifecycle.retention import KeepBest, apply_retention, parse_duration, plan_retention

from .helpers import DAY, NOW, make_ckpt


@pytest.fixture
def store(tmp_path):
    s = open_store(str(tmp_path / "s"))
    yield s
    s.close()


def kept(plan):
    return [d.step for d in plan.kept]


def test_parse_duration():
    assert parse_duration("7d") == 7 * DAY
    assert parse_duration("2w") == 14 * DAY
    assert parse_duration("90") == 90
    assert parse_duration(1.5) == 1.5
    for bad in ("7x", "-1d", "", True, [1]):
        with pytest.raises(ConfigError):
            parse_duration(bad)


def test_keep_last(store):
    for s in range(1, 7):
        make_ckpt(store, "j", s * 10, created=NOW - 100 * DAY)
    plan = plan_retention(store, "j", RetentionPolicy(keep_last=2), now=NOW)
    assert kept(plan) == [50, 60]
    assert all("last 2" in d.reasons[0] for d in plan.kept)
    assert "matches no keep rule" in plan.deleted[0].reasons[0]


def test_keep_within_and_full_within(store):
    # fulls every 3rd step; one checkpoint per day going back 40 days
    for i in range(40):
        make_ckpt(store, "j", 100 + i, kind="full" if i % 3 == 0 else "incremental",
                  base=None if i % 3 == 0 else 100 + i - i % 3, created=NOW - (39 - i) * DAY - 60)
    plan = plan_retention(store, "j", RetentionPolicy.preset(), now=NOW)
    for d in plan.decisions:
        age = (NOW - d.created) / DAY
        if age <= 7:
            assert d.keep, d
        elif d.kind == "full" and age <= 30:
            assert d.keep and any("full" in r for r in d.reasons)
        elif d.keep:  # only as a base of a kept incremental
            assert any("base of kept incremental" in r for r in d.reasons), d
    assert plan.deleted and all((NOW - d.created) / DAY > 7 for d in plan.deleted)


def test_keep_every(store):
    for s in range(0, 1100, 100):
        make_ckpt(store, "j", s, created=NOW - 90 * DAY)
    make_ckpt(store, "j", 1150, created=NOW)
    plan = plan_retention(store, "j", RetentionPolicy(keep_every=500, keep_within="1d"), now=NOW)
    assert kept(plan) == [0, 500, 1000, 1150]


def test_keep_best_min_and_max(store):
    losses = {1: 0.9, 2: 0.5, 3: 0.7, 4: 0.4, 5: 0.8}
    for s, loss in losses.items():
        make_ckpt(store, "j", s, created=NOW - 60 * DAY, metrics={"val_loss": loss, "acc": 1 - loss})
    plan = plan_retention(store, "j", RetentionPolicy(keep_best=(KeepBest("val_loss", 2, "min"),)), now=NOW)
    assert kept(plan) == [2, 4, 5]  # 5: the newest full checkpoint is always kept
    assert plan.decisions[-1].reasons == ("newest full checkpoint (base of the next incrementals)",)
    plan = plan_retention(store, "j", RetentionPolicy(keep_best=(KeepBest.parse("acc:1:max"),)), now=NOW)
    assert kept(plan) == [4, 5]
    assert "best #1 by acc" in plan.kept[0].reasons[0]


def test_incremental_base_is_kept(store):
    make_ckpt(store, "j", 100, kind="full", created=NOW - 50 * DAY)
    make_ckpt(store, "j", 150, kind="incremental", base=100, created=NOW - 49 * DAY)
    make_ckpt(store, "j", 200, kind="full", created=NOW - 48 * DAY)
    make_ckpt(store, "j", 250, kind="incremental", base=200, created=NOW - 1 * DAY)
    make_ckpt(store, "j", 260, kind="incremental", base=100, created=NOW - 1 * DAY)  # odd but legal: older base
    plan = plan_retention(store, "j", RetentionPolicy(keep_within="7d"), now=NOW)
    assert kept(plan) == [100, 200, 250, 260]
    reasons = {d.step: d.reasons for d in plan.decisions}
    assert any("base of kept incremental step 260" in r for r in reasons[100])
    assert any("base of kept incremental step 250" in r or "newest full" in r for r in reasons[200])
    assert [d.step for d in plan.deleted] == [150]


def test_registered_kept_forever(store):
    for s in (1, 2, 3):
        make_ckpt(store, "j", s, created=NOW - 400 * DAY)
    make_ckpt(store, "j", 4, created=NOW)
    Registry(store).register("j", 1, "llm", aliases=("stable",))
    plan = plan_retention(store, "j", RetentionPolicy.preset(), now=NOW)
    assert kept(plan) == [1, 4]
    assert "registered as llm@1 (stable)" in plan.kept[0].reasons[0]


def test_delete_everything_is_refused(store):
    for s in (1, 2):
        make_ckpt(store, "j", s, created=NOW - 400 * DAY)
    with pytest.raises(ConfigError, match="would delete all 2 checkpoints"):
        plan_retention(store, "j", RetentionPolicy.preset(), now=NOW)
    with pytest.raises(ConfigError, match="would delete all"):
        apply_retention(store, "j", RetentionPolicy(), now=NOW)
    assert mf.list_steps(store, "j") == [1, 2]
    plan = apply_retention(store, "j", RetentionPolicy(allow_delete_all=True), now=NOW)
    assert plan.applied and mf.list_steps(store, "j") == []


def test_apply_deletes_manifest_and_sidecars_dry_run_does_not(store):
    for s in (1, 2, 3):
        make_ckpt(store, "j", s, created=NOW - 10 * DAY)
        store.put(mf.verify_key("j", s), b"{}")
    plan = apply_retention(store, "j", RetentionPolicy(keep_last=1), dry_run=True, now=NOW)
    assert not plan.applied and [d.step for d in plan.deleted] == [1, 2]
    assert mf.list_steps(store, "j") == [1, 2, 3]
    apply_retention(store, "j", RetentionPolicy(keep_last=1), now=NOW)
    assert mf.list_steps(store, "j") == [3]
    assert not list(store.list(mf.step_prefix("j", 1)))


def test_policy_validation():
    with pytest.raises(ConfigError):
        RetentionPolicy(keep_last=0)
    with pytest.raises(ConfigError):
        RetentionPolicy(keep_within="soon")
    with pytest.raises(ConfigError):
        KeepBest("loss", mode="median")
    with pytest.raises(ConfigError):
        KeepBest.parse("loss:x")
    assert RetentionPolicy(keep_within="7d").keep_within == 7 * DAY


def test_hook_runs_after_each_save(tmp_path):
    import numpy as np

    from trainstore import CheckpointManager, CheckpointPolicy
    from trainstore.lifecycle.retention import retention_hook

    with CheckpointManager(str(tmp_path / "m"), "run", CheckpointPolicy(full_every=1, incremental_every=None),
                           hooks=[retention_hook(RetentionPolicy(keep_last=2))]) as mgr:
        for step in range(5):
            mgr.save(step, {"w": np.full(1000, step, np.float32)}, blocking=True)
        assert mgr.steps() == [3, 4]


def test_manifest_cache_reads_each_manifest_once(store, monkeypatch):
    from trainstore.lifecycle import retention as rt

    for s in range(1, 6):
        make_ckpt(store, "j", s, created=NOW)
    reads = []
    orig = rt.mf.load_manifest
    monkeypatch.setattr(rt.mf, "load_manifest", lambda st, job, step: reads.append(step) or orig(st, job, step))
    cache: dict = {}  # reclaim=False: the reclaim sweep's own reads (its cache): test_retention_reclaim
    apply_retention(store, "j", RetentionPolicy(keep_last=3), now=NOW, cache=cache, reclaim=False)
    assert sorted(reads) == [1, 2, 3, 4, 5]
    make_ckpt(store, "j", 6, created=NOW)
    plan = apply_retention(store, "j", RetentionPolicy(keep_last=3), now=NOW, cache=cache, reclaim=False)
    assert sorted(reads) == [1, 2, 3, 4, 5, 6] and [d.step for d in plan.kept] == [4, 5, 6]
    assert {4, 5, 6} <= {k[0] for k in cache} <= {3, 4, 5, 6}  # pruned at the next listing
