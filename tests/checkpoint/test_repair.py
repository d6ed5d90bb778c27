"""Issue 14 item 5: with a single tier, opt-in replicas of shared chunks (referenced by many
checkpoints or by registered models) repair a corrupt or lost chunk, so one bad shared chunk
no longer takes down every checkpoint that dedup made share it."""

from __future__ import annotations

import numpy as np
import pytest

from trainstore import CheckpointManager, CheckpointPolicy, open_store
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.chunks import replica_key
from trainstore.errors import ChunkCorruptError, NoValidCheckpointError
from trainstore.lifecycle.gc import GcOptions, collect_garbage
from trainstore.lifecycle.redundancy import Redundancy, RedundancyPolicy
from trainstore.lifecycle.registry import Registry
from trainstore.lifecycle.retention import delete_checkpoint

SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, nice=0, pack_below=0)  # chunk sharing, not packs
FULL = CheckpointPolicy(full_every=1, incremental_every=None)
FROZEN = np.arange(2048, dtype=np.int32)  # 8 KiB: two chunks every checkpoint shares


def state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal(1500).astype(np.float32), "frozen": FROZEN, "step": step}


def frozen_keys(mgr) -> list[str]:
    keys = None
    for s in mgr.steps():
        ks = mf.manifest_chunk_keys(mgr.manifest(s))
        keys = ks if keys is None else keys & ks
    return sorted(keys)


def flip(store, key: str, pos: int = 100) -> None:
    with open(store.local_path(key), "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))


def raw(store, key: str) -> bytes:
    return bytes(memoryview(store.get(key)))


def _save(tmp_path, steps: int = 7, redundancy: Redundancy | None = None) -> CheckpointManager:
    store = open_store(str(tmp_path / "ckpt"))
    hooks = [redundancy.hook] if redundancy is not None else []
    mgr = CheckpointManager(store, "run", policy=FULL, options=SMALL, hooks=hooks)
    for step in range(steps):
        mgr.save(step, state(step), blocking=True)
    mgr.wait()
    return mgr


def test_without_redundancy_one_flipped_shared_chunk_breaks_every_checkpoint(tmp_path):
    """The failure item 5 is about (single tier, no replicas): documents the baseline."""
    mgr = _save(tmp_path, steps=4)
    flip(mgr.store, frozen_keys(mgr)[0])
    with pytest.raises(NoValidCheckpointError):
        mgr.restore()
    mgr.close()


def test_flipped_shared_chunk_is_repaired_from_its_replica_and_every_checkpoint_restores(tmp_path):
    red = Redundancy(RedundancyPolicy(min_refs=2))
    mgr = _save(tmp_path, redundancy=red)
    shared = frozen_keys(mgr)
    assert len(shared) == 2
    assert all(mgr.store.exists(replica_key(k)) for k in shared)
    own = sorted(mf.manifest_chunk_keys(mgr.manifest(6)) - set(shared))
    assert not any(mgr.store.exists(replica_key(k)) for k in own)  # referenced once: no replica
    good = raw(mgr.store, shared[0])
    flip(mgr.store, shared[0])
    got = mgr.restore()
    assert mgr.last_restore.step == 6 and not mgr.last_restore.skipped
    assert [e.key for e in mgr.last_restore.repairs] == [shared[0]]
    assert raw(mgr.store, shared[0]) == good
    for step in range(7):
        got = mgr.restore(step)
        assert np.array_equal(got["frozen"], FROZEN) and np.array_equal(got["w"], state(step)["w"])
    # a corrupt replica is repaired from the primary by a deep verify
    flip(mgr.store, replica_key(shared[1]))
    assert all(r.ok for r in mgr.verify(deep=True))
    assert raw(mgr.store, replica_key(shared[1])) == raw(mgr.store, shared[1])
    mgr.close()


def test_lost_shared_chunk_is_restored_from_its_replica(tmp_path):
    red = Redundancy(RedundancyPolicy(min_refs=2))
    mgr = _save(tmp_path, steps=3, redundancy=red)
    key = frozen_keys(mgr)[0]
    good = raw(mgr.store, key)
    mgr.store.delete(key)
    mgr.chunks.forget()
    assert all(r.ok for r in mgr.verify(deep=True))
    assert raw(mgr.store, key) == good
    mgr.close()


def test_a_corrupt_primary_is_never_replicated(tmp_path):
    mgr = _save(tmp_path, steps=2)
    key = frozen_keys(mgr)[0]
    flip(mgr.store, key)
    with pytest.raises(ChunkCorruptError, match=key):
        Redundancy(RedundancyPolicy(min_refs=2)).protect(mgr.store)
    assert not mgr.store.exists(replica_key(key))
    mgr.close()


def test_registered_model_chunks_get_replicas(tmp_path):
    mgr = _save(tmp_path, steps=2)
    Registry(mgr.store).register("run", 1, "demo-model")
    report = Redundancy(RedundancyPolicy(min_refs=3, registered=True)).protect(mgr.store)
    keys = sorted(mf.manifest_chunk_keys(mgr.manifest(1)))
    assert all(mgr.store.exists(replica_key(k)) for k in keys)
    own0 = mf.manifest_chunk_keys(mgr.manifest(0)) - set(keys)
    assert not any(mgr.store.exists(replica_key(k)) for k in own0)
    assert report.chunks == len(keys) and report.bytes_written == sum(mgr.store.head(k).size for k in keys)
    assert Redundancy(RedundancyPolicy(min_refs=3, registered=False)).protect(mgr.store).chunks == 0
    mgr.close()


def test_gc_keeps_replicas_while_their_primary_is_referenced(tmp_path):
    mgr = _save(tmp_path, steps=3, redundancy=Redundancy(RedundancyPolicy(min_refs=2)))
    shared = frozen_keys(mgr)
    assert collect_garbage(mgr.store, GcOptions(grace=0)).deleted == 0
    assert all(mgr.store.exists(replica_key(k)) for k in shared)
    for step in range(3):
        delete_checkpoint(mgr.store, "run", step)
    collect_garbage(mgr.store, GcOptions(grace=0))
    assert list(mgr.store.list("chunks/")) == []  # primaries and replicas both collected
    mgr.close()
