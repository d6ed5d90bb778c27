"""Tiering on a real S3 protocol server: hot commit, background durable copy, eviction,
transparent restore from the durable tier, archiving."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from trainstore import CheckpointPolicy, open_store
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.lifecycle.gc import LEASES
from trainstore.lifecycle.tiering import Tiering, TierPolicy

from .manifest_refs import needed_chunks, raw_manifest

SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, nice=0)


def state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal(6000).astype(np.float32), "frozen": np.arange(4096, dtype=np.int32),
            "step": step}


@pytest.mark.timeout(180)
def test_hot_commit_durable_copy_eviction_and_transparent_restore(tmp_path, s3_url):
    url, opts = s3_url
    hot = str(tmp_path / "hot")
    tiers = Tiering(hot, url, durable_options=opts, policy=TierPolicy(hot_keep_last=2, hot_gc_grace=0))
    with tiers.manager("run", policy=CheckpointPolicy(full_every=3, incremental_every=1), options=SMALL) as mgr:
        for step in range(7):
            mgr.save(step, state(step), blocking=True)
        tiers.wait()
        status = {s.step: s for s in tiers.status("run")}
        assert sorted(status) == list(range(7))
        assert all(s.durable for s in status.values())
        hot_steps = [s for s, st in status.items() if st.hot]
        assert hot_steps == [3, 5, 6]  # the last 2, and 3: the base of incremental 5
        for st in status.values():
            assert st.restore_ready_s is not None and 0 <= st.restore_ready_s <= st.durable_s
        assert mf.list_steps(open_store(hot), "run") == hot_steps
        assert not list(tiers.durable.list(LEASES)) and not list(tiers.hot.list(LEASES))
        # evicted checkpoints restore transparently from the durable tier, verified
        for step in (0, 1, 4):
            got = mgr.restore(step)
            assert np.array_equal(got["w"], state(step)["w"]) and got["step"] == step
        assert all(r.ok for r in mgr.verify(deep=True))
        # hot holds only the chunks of hot checkpoints (evicted ones were collected)
        hot_store = open_store(hot)
        needed = set().union(*(needed_chunks(raw_manifest(hot, "run", s)) for s in hot_steps))  # from the JSON
        assert len(needed) > len(hot_steps)
        assert {m.key for m in hot_store.list("chunks/")} == needed
    tiers.close()
    # the node is lost: a fresh, empty hot tier restores the newest checkpoint from durable
    fresh = Tiering(str(tmp_path / "hot2"), url, durable_options=opts)
    with fresh.manager("run", options=SMALL) as mgr:
        got = mgr.restore()
        assert mgr.last_restore.step == 6 and np.array_equal(got["w"], state(6)["w"])
    fresh.close()


@pytest.mark.timeout(120)
def test_archive_old_full_checkpoints(tmp_path):
    durable = f"memory://{uuid.uuid4().hex}"
    archive = f"memory://{uuid.uuid4().hex}"
    from trainstore.lifecycle.metrics import CheckpointMetrics

    metrics = CheckpointMetrics()
    tiers = Tiering(str(tmp_path / "hot"), durable, archive=archive,
                    policy=TierPolicy(hot_keep_last=1, archive_after=0, hot_gc_grace=0), observers=[metrics.observe])
    with tiers.manager("run", policy=CheckpointPolicy(full_every=1, incremental_every=None), options=SMALL,
                       observers=[metrics.observe]) as mgr:
        for step in range(4):
            mgr.save(step, state(step), blocking=True)
        tiers.wait()
        reg = metrics.registry
        assert reg.get_sample_value("trainstore_ckpt_durable_seconds_count", {"job": "run"}) == 4
        assert reg.get_sample_value("trainstore_ckpt_restore_ready_seconds_count", {"job": "run"}) == 4
        assert reg.get_sample_value("trainstore_ckpt_bytes_total", {"job": "run", "tier": "durable", "kind": "stored"}) > 0
        assert tiers.archive("run", dry_run=True) == [0, 1, 2]
        assert tiers.archive("run") == [0, 1, 2]
        st = {s.step: s.tiers for s in tiers.status("run")}
        assert st == {0: "archived", 1: "archived", 2: "archived", 3: "hot/durable"}
        assert np.array_equal(mgr.restore(1)["w"], state(1)["w"])  # read from the archive tier
    tiers.close()


def test_sync_copies_what_a_crash_left_only_hot(tmp_path):
    durable = f"memory://{uuid.uuid4().hex}"
    hot = str(tmp_path / "hot")
    from trainstore import CheckpointManager

    with CheckpointManager(hot, "run", options=SMALL) as mgr:  # saved without the tiering hook
        mgr.save(0, state(0), blocking=True)
    tiers = Tiering(hot, durable)
    assert tiers.status("run")[0].tiers == "hot"
    assert tiers.sync("run") == [0]
    assert tiers.status("run")[0].tiers == "hot/durable"
    tiers.close()


def test_hot_save_never_borrows_durable_only_chunks(tmp_path):
    """A write-back save commits in hot and depends on hot alone: a chunk only the durable
    tier holds is written to hot again (so no durable lease is needed, and a durable gc
    before the copy cannot break the hot checkpoint); the copy brings it back to durable."""
    from trainstore import CheckpointManager
    from trainstore.lifecycle.gc import GcOptions, collect_garbage
    from trainstore.lifecycle.retention import delete_checkpoint

    hot = str(tmp_path / "hot")
    tiers = Tiering(hot, f"memory://{uuid.uuid4().hex}")
    with CheckpointManager(tiers.store, "run", options=SMALL) as mgr:  # no copy hook: copies by hand
        mgr.save(0, state(0), blocking=True)
        keys = needed_chunks(raw_manifest(hot, "run", 0))
        tiers.make_durable("run", 0)
        delete_checkpoint(tiers.hot, "run", 0)  # evicted from hot: its chunks live only in durable
        collect_garbage(tiers.hot, GcOptions(grace=0))
        assert keys and not any(tiers.hot.exists(k) for k in keys) and all(tiers.durable.exists(k) for k in keys)
        mgr.save(1, state(0), blocking=True)  # the same bytes again
        assert needed_chunks(raw_manifest(hot, "run", 1)) == keys
        assert all(tiers.hot.exists(k) for k in keys)  # written to hot, not borrowed from durable
        assert not list(tiers.durable.list(LEASES)) and not list(tiers.hot.list(LEASES))
        delete_checkpoint(tiers.durable, "run", 0)
        assert collect_garbage(tiers.durable, GcOptions(grace=0)).deleted >= len(keys)  # durable loses them
        assert np.array_equal(mgr.restore(1)["w"], state(0)["w"])  # from hot alone
        tiers.make_durable("run", 1)
        assert all(tiers.durable.exists(k) for k in keys)
        assert collect_garbage(tiers.durable, GcOptions(grace=0)).deleted == 0  # referenced now
    tiers.close()


def test_retention_on_the_tiered_store_before_the_copy(tmp_path):
    """Retention deleting a step before its background copy ran is not an error."""
    from trainstore.lifecycle.retention import RetentionPolicy, retention_hook

    tiers = Tiering(str(tmp_path / "hot"), f"memory://{uuid.uuid4().hex}", policy=TierPolicy(hot_gc_grace=0))
    with tiers.manager("run", policy=CheckpointPolicy(full_every=1, incremental_every=None), options=SMALL,
                       hooks=[retention_hook(RetentionPolicy(keep_last=1))]) as mgr:
        for step in range(5):
            mgr.save(step, state(step), blocking=True)
        tiers.wait()
        assert mgr.steps() == [4] and tiers.status("run", 4)[0].durable  # no copy resurrected a step
        assert np.array_equal(mgr.restore()["w"], state(4)["w"])
    tiers.close()
