"""Rollbacks and reruns in one job (issue 26 item 12): saves after them succeed, the steps
left behind are kept (abandoned, never overwritten) until retention removes them, restore()
follows the current lineage, and listings say which run each step belongs to."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format.layout import abandoned_key, list_abandoned, manifest_key
from trainstore.checkpoint.format.lineage import load_abandoned
from trainstore.checkpoint.restore.reader import load_state
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.chunks import ChunkStore
from trainstore.cli.main import app
from trainstore.errors import AlreadyExistsError
from trainstore.lifecycle.gc import GcOptions, collect_garbage
from trainstore.lifecycle.retention import RetentionPolicy, apply_retention
from trainstore.lifecycle.tiering import Tiering, TierPolicy
from trainstore.store import open_store

pytestmark = pytest.mark.timeout(120)

SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 20)


def _state(step: int, run: int = 0) -> dict:
    return {"w": torch.full((2048,), float(step * 10 + run)), "step": step}


def _save_steps(mgr: CheckpointManager, steps, run: int = 0) -> None:
    for s in steps:
        mgr.save(s, _state(s, run))
    mgr.wait()


def test_rollback_then_save_keeps_abandoned_and_restore_follows_lineage(tmp_path):
    with CheckpointManager(str(tmp_path), job="j", options=SMALL) as mgr:
        _save_steps(mgr, range(1, 6))
        old_run = mgr.run
        assert mgr.restore(step=2)["step"] == 2  # "a newer version performs worse"
        _save_steps(mgr, [3, 4], run=1)  # reached step 3 again: no AlreadyExistsError
        assert mgr.steps() == [1, 2, 3, 4]
        state = mgr.restore()
        assert mgr.last_restore.step == 4 and float(state["w"][0]) == 41.0  # the new lineage's step 4
        assert mgr.run != old_run
        infos = mgr.list(abandoned=True)
        abandoned = [(i.step, i.run) for i in infos if i.abandoned]
        assert abandoned == [(3, old_run), (4, old_run), (5, old_run)]
        assert {i.run for i in infos if not i.abandoned and i.step >= 3} == {mgr.run}
        assert {i.run for i in infos if not i.abandoned and i.step < 3} == {old_run}
        new3 = mgr.manifest(3)
        assert new3.metadata["parent_step"] == 2 and new3.metadata["run"] == mgr.run
    # abandoned checkpoints stay complete: a gc without grace keeps their chunks
    store = open_store(str(tmp_path))
    collect_garbage(store, GcOptions(grace=0))
    chunks = ChunkStore(store)
    for step, _run, key in list_abandoned(store, "j"):
        state = load_state(chunks, load_abandoned(store, key))
        assert state["step"] == step and float(state["w"][0]) == step * 10


def test_fresh_run_in_same_job_starts_new_lineage(tmp_path):
    with CheckpointManager(str(tmp_path), job="j", options=SMALL) as first:
        _save_steps(first, range(0, 4))
    with CheckpointManager(str(tmp_path), job="j", options=SMALL) as second:  # a rerun, no restore
        _save_steps(second, [0, 1], run=1)
        assert second.steps() == [0, 1]
        assert float(second.restore()["w"][0]) == 11.0
        assert sorted((s, r) for s, r, _ in list_abandoned(second.store, "j")) == [(s, first.run) for s in range(4)]


def test_same_run_saving_a_step_twice_still_refused(tmp_path):
    with CheckpointManager(str(tmp_path), job="j", options=SMALL) as mgr:
        _save_steps(mgr, [1, 2])
        with pytest.raises(AlreadyExistsError, match="step 2"):
            mgr.save(2, _state(2))
        with pytest.raises(AlreadyExistsError, match="step 1"):
            mgr.save(1, _state(1))
        assert list_abandoned(mgr.store, "j") == []


def test_rollback_in_new_process_with_incrementals(tmp_path):
    policy = CheckpointPolicy(full_every=4, incremental_every=1)
    with CheckpointManager(str(tmp_path), job="j", options=SMALL, policy=policy) as mgr:
        _save_steps(mgr, range(0, 8))
    with CheckpointManager(str(tmp_path), job="j", options=SMALL, policy=policy) as mgr:
        mgr.restore(step=5)
        _save_steps(mgr, range(6, 10), run=1)
        for s in range(0, 10):
            assert float(mgr.restore(step=s)["w"][0]) == s * 10 + (1 if s >= 6 else 0)
        assert [s for s, _r, _k in list_abandoned(mgr.store, "j")] == [6, 7]


def test_restoring_newest_continues_the_run(tmp_path):
    with CheckpointManager(str(tmp_path), job="j", options=SMALL) as mgr:
        _save_steps(mgr, [1, 2])
        run = mgr.run
    with CheckpointManager(str(tmp_path), job="j", options=SMALL) as mgr:
        mgr.restore()
        _save_steps(mgr, [3])
        assert mgr.manifest(3).metadata["run"] == run
        assert list_abandoned(mgr.store, "j") == []
        assert mgr.store.exists(manifest_key("j", 3))


def test_rollback_on_tiered_store_moves_every_tier(tmp_path):
    tiers = Tiering(str(tmp_path / "hot"), str(tmp_path / "durable"), policy=TierPolicy(hot_keep_last=10))
    with tiers.manager("j", options=SMALL) as mgr:
        _save_steps(mgr, range(1, 5))
        mgr.restore(step=2)
        _save_steps(mgr, [3], run=1)
        assert mgr.steps() == [1, 2, 3]
    tiers.close()
    for tier in (tiers.hot, tiers.durable):  # no tier still lists an abandoned step in the lineage
        assert [s for s, _r, _k in list_abandoned(tier, "j")] == [3, 4]
        assert tier.exists(manifest_key("j", 3)) and not tier.exists(manifest_key("j", 4))
    with CheckpointManager(str(tmp_path / "durable"), job="j") as durable:
        assert float(durable.restore()["w"][0]) == 31.0
        assert [(i.step, i.abandoned, i.durable) for i in durable.list(abandoned=True)] == \
            [(1, False, True), (2, False, True), (3, False, True), (3, True, True), (4, True, True)]


def test_ckpt_ls_shows_the_run_of_each_step(tmp_path):
    with CheckpointManager(str(tmp_path), job="j", options=SMALL) as mgr:
        _save_steps(mgr, [1, 2, 3])
        old = mgr.run
        mgr.restore(step=1)
        _save_steps(mgr, [2], run=1)
        new = mgr.run
    r = CliRunner().invoke(app, ["ckpt", "ls", str(tmp_path), "--job", "j", "--json"])
    assert r.exit_code == 0, r.output
    assert [(i["step"], i["run"], i["abandoned"]) for i in json.loads(r.stdout)] == \
        [(1, old, False), (2, new, False), (2, old, True), (3, old, True)]
    r = CliRunner().invoke(app, ["ckpt", "ls", str(tmp_path), "--job", "j"], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and f"{old} (abandoned)" in r.stdout and new in r.stdout, r.output


def test_retention_removes_abandoned_steps_once_the_lineage_moved_past_them(tmp_path):
    with CheckpointManager(str(tmp_path), job="j", options=SMALL) as mgr:
        _save_steps(mgr, range(1, 6))
        mgr.restore(step=2)
        _save_steps(mgr, [3], run=1)
        plan = apply_retention(mgr.store, "j", RetentionPolicy(keep_last=3))
        # each judged in place of its step: old 3, 4, 5 would each be among the last 3
        assert sorted((d.step, d.keep) for d in plan.decisions if d.abandoned_key) == [(3, True), (4, True), (5, True)]
        assert mgr.steps() == [1, 2, 3]
        _save_steps(mgr, [4, 5, 6, 7], run=1)
        apply_retention(mgr.store, "j", RetentionPolicy(keep_last=3))
        assert [s for s, _r, _k in list_abandoned(mgr.store, "j")] == [5]  # the lineage has 3 steps past 4
        _save_steps(mgr, [8], run=1)
        apply_retention(mgr.store, "j", RetentionPolicy(keep_last=3))
        assert mgr.steps() == [6, 7, 8] and list_abandoned(mgr.store, "j") == []
        assert [float(mgr.restore(step=s)["w"][0]) for s in (6, 7, 8)] == [61.0, 71.0, 81.0]


def test_rollback_moves_the_good_manifest_copy_when_one_tier_is_corrupt(tmp_path):
    tiers = Tiering(str(tmp_path / "hot"), str(tmp_path / "durable"), policy=TierPolicy(hot_keep_last=10))
    with tiers.manager("j", options=SMALL) as mgr:
        _save_steps(mgr, range(1, 4))
        path = tiers.hot.local_path(manifest_key("j", 3))
        with open(path, "r+b") as f:  # bit rot in the hot copy of step 3's manifest
            f.seek(20)
            f.write(b"\xff")
        mgr.restore(step=1)
        _save_steps(mgr, [2], run=1)
    tiers.close()
    for tier in (tiers.hot, tiers.durable):  # one abandoned step 3, the good bytes, in both tiers
        found = [(s, r) for s, r, _k in list_abandoned(tier, "j") if s == 3]
        assert len(found) == 1 and not found[0][1].startswith("legacy-"), found
        load_abandoned(tier, abandoned_key("j", 3, found[0][1]))
    collect_garbage(tiers.hot, GcOptions(grace=0))  # no unreadable manifest left to block a sweep


def test_start_run_declares_a_rollback_or_rerun_in_the_same_manager(tmp_path):
    with CheckpointManager(str(tmp_path), job="j", options=SMALL) as mgr:
        _save_steps(mgr, [1, 2, 3])
        first = mgr.run
        mgr.start_run(from_step=1)  # state loaded by other means (e.g. a framework's own resume)
        _save_steps(mgr, [2], run=1)
        assert mgr.steps() == [1, 2] and mgr.run != first
        assert [s for s, _r, _k in list_abandoned(mgr.store, "j")] == [2, 3]
        mgr.start_run(run="rerun-b")  # a fresh run: everything from its first step on is left behind
        _save_steps(mgr, [1], run=2)
        assert mgr.steps() == [1] and mgr.manifest(1).metadata["run"] == "rerun-b"
        assert float(mgr.restore()["w"][0]) == 12.0
