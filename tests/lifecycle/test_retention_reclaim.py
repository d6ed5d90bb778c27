"""Retention that frees space (issue 26 item 11): the chunks only the removed checkpoints
named are deleted in the same pass (not after gc's hour of grace), emptied step folders are
removed, and a chunk another job or a live lease still needs stays."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from trainstore import RetentionPolicy, open_store
from trainstore.checkpoint import CheckpointManager
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.lease import CopyLease
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.chunks import ChunkStore
from trainstore.cli.main import app
from trainstore.lifecycle.retention import apply_retention, retention_hook

pytestmark = pytest.mark.timeout(120)

SMALL = WriteOptions(chunk_bytes=16384, max_inflight_bytes=1 << 20, pack_below=0)


def _state(seed: int) -> dict:
    return {"w": torch.randn(16384, generator=torch.Generator().manual_seed(seed))}


def _chunk_keys(store) -> set[str]:
    return {k for k, _size, _mtime in ChunkStore(store).list_keys()}


def _referenced(store, job) -> set[str]:
    return {k for s in mf.list_steps(store, job) for k in mf.manifest_chunk_keys(mf.load_manifest(store, job, s))}


def test_save_total_limit_leaves_only_the_kept_checkpoints(tmp_path):
    root = tmp_path / "store"
    with CheckpointManager(str(root), job="hf", options=SMALL,
                           hooks=[retention_hook(RetentionPolicy(keep_last=3))]) as mgr:
        for step in range(1, 7):
            mgr.save(step, _state(step))
        mgr.wait()
        assert mgr.steps() == [4, 5, 6]
        # no chunk of the removed steps 1..3 waits for gc's grace: the store is the three kept checkpoints
        assert _chunk_keys(mgr.store) == _referenced(mgr.store, "hf")
    assert sorted(os.listdir(root / "jobs" / "hf" / "checkpoints")) == [f"{s:012d}" for s in (4, 5, 6)]


def test_reclaim_keeps_chunks_other_jobs_and_leases_still_need(tmp_path):
    store = open_store(str(tmp_path / "store"))
    with CheckpointManager(store, job="a", options=SMALL) as a, CheckpointManager(store, job="b", options=SMALL) as b:
        a.save(1, _state(100), blocking=True)
        b.save(1, _state(100), blocking=True)  # same bytes: deduplicated, shared with job a
        a.save(2, _state(200), blocking=True)
        a.save(3, _state(300), blocking=True)
        shared = mf.manifest_chunk_keys(a.manifest(1))
        copying = mf.manifest_chunk_keys(a.manifest(2))
        with CopyLease(store, "a", 2, copying):  # e.g. a tier copy of step 2 in progress
            plan = apply_retention(store, "a", RetentionPolicy(keep_last=1))
        assert [d.step for d in plan.deleted] == [1, 2]
        left = _chunk_keys(store)
        assert shared <= left and copying <= left
        assert plan.reclaimed_bytes == 0
        b.save(2, _state(400), blocking=True)
        plan = apply_retention(store, "b", RetentionPolicy(keep_last=1))  # now nothing else needs step 1's
        assert plan.reclaimed_bytes > 0 and not shared & _chunk_keys(store)
    store.close()


def test_ckpt_gc_says_when_the_rest_is_reclaimed(tmp_path):
    root = str(tmp_path / "store")
    with CheckpointManager(root, job="j", options=SMALL) as mgr:
        mgr.save(1, _state(1), blocking=True)
        mgr.save(2, _state(2), blocking=True)
    apply_retention(open_store(root), "j", RetentionPolicy(keep_last=1), reclaim=False)  # left to gc
    r = CliRunner().invoke(app, ["ckpt", "gc", root, "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["too_young"] > 0 and rep["next_reclaim_at"] is not None
    r = CliRunner().invoke(app, ["ckpt", "gc", root], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "reclaimable from" in r.stdout, r.output


def test_reclaim_after_every_save_reads_each_manifest_a_bounded_number_of_times(tmp_path, monkeypatch):
    from collections import Counter

    reads: Counter = Counter()
    orig = mf.load_manifest
    monkeypatch.setattr(mf, "load_manifest", lambda st, job, step, **kw: reads.update([step]) or orig(st, job, step, **kw))
    with CheckpointManager(str(tmp_path / "store"), job="hf", options=SMALL,
                           hooks=[retention_hook(RetentionPolicy(keep_last=2))]) as mgr:
        for step in range(1, 9):
            mgr.save(step, _state(step), blocking=True)
        assert mgr.steps() == [7, 8] and _chunk_keys(mgr.store) == _referenced(mgr.store, "hf")
    # once by retention (its cache), once by the reclaim sweep (its cache), not once per later save
    assert max(reads[s] for s in range(1, 7)) <= 2, reads


def test_ckpt_retain_says_what_it_reclaimed(tmp_path):
    root = str(tmp_path / "store")
    with CheckpointManager(root, job="j", options=SMALL) as mgr:
        mgr.save(1, _state(1), blocking=True)
        mgr.save(2, _state(2), blocking=True)
    r = CliRunner().invoke(app, ["ckpt", "retain", root, "-j", "j", "--keep-last", "1"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "1 kept, 1 deleted (" in r.stdout and "reclaimed now" in r.stdout, r.output
    assert "(0 B of" not in r.stdout, r.output
