"""Issue 26 item 5: scans across jobs tolerate objects that vanish between listing and
reading (another job's retention or GC), instead of raising ``NotFoundError`` and failing the
next save.

The deletes are the real operations (``retention.delete_checkpoint``, a chunk delete as a GC
sweep does it) on the real store, run by a store view at the exact moment between a scan's
listing and its read, so the race is hit every time.
"""

from __future__ import annotations

import numpy as np
import pytest

from trainstore import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.chunks import replica_key
from trainstore.lifecycle.redundancy import Redundancy, RedundancyPolicy
from trainstore.lifecycle.retention import delete_checkpoint
from trainstore.store import open_store
from trainstore.store.base import ForwardingStore

SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, nice=0)
FULL = CheckpointPolicy(full_every=1, incremental_every=None)


def state(step: int) -> dict:
    rng = np.random.default_rng(7)  # the same weights every step: every chunk is shared
    return {"w": rng.standard_normal(2000).astype(np.float32), "step": step}


class RetentionAfterListing(ForwardingStore):
    """Deletes checkpoint ``job``@``step`` (as that job's retention does) right after the first
    listing of ``job``'s steps: a scan has listed the step and has not read it yet."""

    def __init__(self, inner, job: str, step: int) -> None:
        super().__init__(inner)
        self.job, self.step, self.fired = job, step, False

    def list(self, prefix: str = ""):
        metas = list(self.inner.list(prefix))
        if not self.fired and prefix == mf.checkpoints_prefix(self.job) \
                and any(m.key == mf.manifest_key(self.job, self.step) for m in metas):
            self.fired = True
            delete_checkpoint(self.inner, self.job, self.step)
        return iter(metas)


class GcBeforeReplication(ForwardingStore):
    """Deletes a chunk (as a GC sweep does) when its replica is first asked about: the
    replication planned it and has not read it yet."""

    def __init__(self, inner, victim: str) -> None:
        super().__init__(inner)
        self.victim, self.fired = victim, False

    def _collect(self, key: str) -> None:
        if not self.fired and key == replica_key(self.victim):
            self.fired = True
            self.inner.delete(self.victim)

    def head(self, key: str):
        self._collect(key)
        return self.inner.head(key)

    def exists(self, key: str) -> bool:
        self._collect(key)
        return self.inner.exists(key)


def other_job(store) -> None:
    with CheckpointManager(store, "other", policy=FULL, options=SMALL) as other:
        for step in (1, 2):
            other.save(step, state(step), blocking=True)


@pytest.mark.timeout(120)
def test_redundancy_hook_survives_another_jobs_retention_between_list_and_read(tmp_path):
    store = open_store(str(tmp_path / "ckpt"))
    other_job(store)
    view = RetentionAfterListing(store, "other", 2)
    red = Redundancy(RedundancyPolicy(min_refs=2))
    with CheckpointManager(view, "run", policy=FULL, options=SMALL, hooks=[red.hook]) as mgr:
        mgr.save(1, state(1), blocking=True)
        mgr.wait()  # a hook that failed is raised here (and at the next save)
        assert view.fired and not store.exists(mf.manifest_key("other", 2))
        mgr.save(2, state(2), blocking=True)
        mgr.wait()
        shared = mf.manifest_chunk_keys(mgr.manifest(1))
        assert shared and all(store.exists(replica_key(k)) for k in shared)


@pytest.mark.timeout(120)
def test_redundancy_skips_a_chunk_collected_between_plan_and_replication(tmp_path):
    store = open_store(str(tmp_path / "ckpt"))
    other_job(store)
    keys = sorted(mf.manifest_chunk_keys(mf.load_manifest(store, "other", 1)))
    view = GcBeforeReplication(store, keys[0])
    report = Redundancy(RedundancyPolicy(min_refs=2)).protect(view)
    assert view.fired
    assert report.chunks == len(keys) and report.written == len(keys) - 1
    assert not store.exists(replica_key(keys[0]))
    assert all(store.exists(replica_key(k)) for k in keys[1:])


@pytest.mark.timeout(120)
def test_tier_status_skips_a_step_deleted_between_list_and_read(tmp_path):
    from trainstore.lifecycle.tiering import Tiering

    hot = open_store(str(tmp_path / "hot"))
    with CheckpointManager(hot, "run", policy=FULL, options=SMALL) as mgr:
        for step in (1, 2):
            mgr.save(step, state(step), blocking=True)
    view = RetentionAfterListing(hot, "run", 1)
    tiers = Tiering(view, str(tmp_path / "durable"))
    try:
        assert [st.step for st in tiers.status("run")] == [2]
        assert view.fired
    finally:
        tiers.close()
