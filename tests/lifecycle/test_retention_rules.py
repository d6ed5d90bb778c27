"""Composable retention rules: each rule alone, composed with AnyOf / AllOf, their reasons,
and the safety rules the planner adds whatever the policy says."""

from __future__ import annotations

import pytest

from trainstore import open_store
from trainstore.checkpoint.format import manifest as mf
from trainstore.errors import ConfigError
from trainstore.lifecycle.registry import Registry
from trainstore.lifecycle.retention import (
    AllOf,
    AnyOf,
    BestN,
    EveryNSteps,
    FullWithin,
    LatestN,
    Registered,
    RetentionPolicy,
    Within,
    apply_retention,
    describe,
    plan_retention,
)

from .helpers import DAY, NOW, make_ckpt


@pytest.fixture
def store(tmp_path):
    s = open_store(str(tmp_path / "s"))
    yield s
    s.close()


def kept(plan):
    return [d.step for d in plan.kept]


def test_each_rule_alone(store):
    # steps 10..60, one per 10 days back from NOW; 30 and 60 are full, the rest incremental on them
    for i, step in enumerate((10, 20, 30, 40, 50, 60)):
        kind = "full" if step in (10, 30, 60) else "incremental"
        base = {20: 10, 40: 30, 50: 30}.get(step)
        make_ckpt(store, "j", step, kind=kind, base=base, created=NOW - (60 - step) * DAY,
                  metrics={"loss": [5, 1, 4, 2, 3, 6][i]})
    plan = plan_retention(store, "j", LatestN(2), now=NOW)
    assert kept(plan) == [30, 50, 60]  # 30: base of 50 (and the newest full is 60)
    assert set(kept(plan_retention(store, "j", Within("15d"), now=NOW))) == {30, 50, 60}
    assert set(kept(plan_retention(store, "j", FullWithin("35d"), now=NOW))) == {30, 60}
    assert set(kept(plan_retention(store, "j", EveryNSteps(20), now=NOW))) == {10, 20, 30, 40, 60}
    best = plan_retention(store, "j", BestN("loss", 2), now=NOW)
    assert set(kept(best)) == {20, 40, 10, 30, 60}  # 20, 40 best; their bases 10, 30; newest full 60
    reasons = {d.step: d.reasons for d in best.decisions}
    assert reasons[20][0] == "best #1 by loss=1 (min)"
    assert reasons[40][0] == "best #2 by loss=2 (min)"
    assert set(kept(plan_retention(store, "j", BestN("loss", 1, "max"), now=NOW))) == {60}


def test_anyof_is_the_union_allof_the_intersection(store):
    for step in range(100, 1100, 100):
        make_ckpt(store, "j", step, created=NOW - (1100 - step) * DAY / 100)
    # ages: step 100 -> 10 d ... step 1000 -> 1 d
    union = plan_retention(store, "j", AnyOf(LatestN(2), EveryNSteps(500)), now=NOW)
    assert kept(union) == [500, 900, 1000]
    inter = plan_retention(store, "j", AllOf(Within("6.5d"), EveryNSteps(200)), now=NOW)
    assert kept(inter) == [600, 800, 1000]
    reason = {d.step: d.reasons for d in inter.decisions}[600][0]
    assert reason == "age 5d within 6.5d and step is a multiple of 200"
    dropped = {d.step: d.reasons for d in inter.decisions}[500][0]
    assert dropped == "matches no keep rule: full, age 6d; not a multiple of 200"


def test_nested_anyof_flattens_and_describes(store):
    rule = AnyOf(LatestN(3), AnyOf(EveryNSteps(100), BestN("val_loss", 2)), Registered())
    assert len(rule.rules) == 4
    assert describe(rule) == "keep last 3, every 100th step, best 2 by val_loss (min), registered forever"
    assert describe(RetentionPolicy(keep_last=3, keep_every=100)) == \
        "keep last 3, every 100th step, registered forever"


def test_registered_rule_reads_registry_only_when_present(store):
    for step in (1, 2, 3):
        make_ckpt(store, "j", step, created=NOW - 100 * DAY)
    Registry(store).register("j", 1, "m", aliases=("stable",))
    with_reg = plan_retention(store, "j", AnyOf(LatestN(1), Registered()), now=NOW)
    assert kept(with_reg) == [1, 3]
    without = plan_retention(store, "j", LatestN(1), now=NOW)
    assert kept(without) == [3]


def test_rule_validation():
    with pytest.raises(ConfigError, match="LatestN.n"):
        LatestN(0)
    with pytest.raises(ConfigError, match="Within.duration"):
        Within("soon")
    with pytest.raises(ConfigError, match="BestN.mode"):
        BestN("loss", 1, "median")
    with pytest.raises(ConfigError, match="AnyOf takes retention rules"):
        AnyOf(LatestN(1), "last 3")  # type: ignore[arg-type]
    assert Within("2d").duration == 2 * DAY


def test_delete_all_guard_with_rules(store):
    for step in (1, 2):
        make_ckpt(store, "j", step, created=NOW - 400 * DAY)
    with pytest.raises(ConfigError, match="would delete all 2 checkpoints"):
        apply_retention(store, "j", Within("7d"), now=NOW)
    assert mf.list_steps(store, "j") == [1, 2]
    apply_retention(store, "j", Within("7d"), now=NOW, allow_delete_all=True)
    assert mf.list_steps(store, "j") == []
