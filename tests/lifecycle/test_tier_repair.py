"""Issue 14 item 4: a corrupt copy in one tier is repaired from another; tier copies are
hash-checked, so bit-rot in one tier never spreads to the next."""

from __future__ import annotations

import random
import uuid

import numpy as np
import pytest

from trainstore import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import ChunkCorruptError
from trainstore.lifecycle.metrics import CheckpointMetrics
from trainstore.lifecycle.tiering import Tiering, TierPolicy

SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, nice=0)
FULL = CheckpointPolicy(full_every=1, incremental_every=None)


def state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal(3000).astype(np.float32), "step": step}


def own_keys(mgr, step: int) -> list[str]:
    """Chunk keys of ``step`` that no other checkpoint of the job references."""
    others = set()
    for s in mgr.steps():
        if s != step:
            others |= mf.manifest_chunk_keys(mgr.manifest(s))
    return sorted(mf.manifest_chunk_keys(mgr.manifest(step)) - others)


def flip_local(store, key: str, pos: int = 100) -> None:
    """Bit rot in place in a local tier (the file, not a new object)."""
    path = store.local_path(key)
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x10]))


def flip_object(store, key: str, pos: int = 100) -> None:
    data = bytearray(memoryview(store.get(key)))
    data[pos % len(data)] ^= 0x10
    store.put(key, bytes(data))


def raw(store, key: str) -> bytes:
    return bytes(memoryview(store.get(key)))


@pytest.mark.timeout(120)
def test_corrupt_hot_chunk_is_repaired_from_durable_and_the_newest_step_restores(tmp_path, s3_url):
    url, opts = s3_url
    metrics = CheckpointMetrics()
    tiers = Tiering(str(tmp_path / "hot"), url, durable_options=opts, policy=TierPolicy(hot_keep_last=3))
    with tiers.manager("run", policy=FULL, options=SMALL, observers=[metrics.observe]) as mgr:
        for step in range(3):
            mgr.save(step, state(step), blocking=True)
        tiers.wait()
        key = own_keys(mgr, 2)[0]
        good = raw(tiers.durable, key)
        flip_local(tiers.hot, key)
        assert raw(tiers.hot, key) != good
        got = mgr.restore()
        assert mgr.last_restore.step == 2 and not mgr.last_restore.skipped
        assert np.array_equal(got["w"], state(2)["w"])
        assert raw(tiers.hot, key) == good  # the hot copy was replaced by the durable bytes
        (ev,) = mgr.last_restore.repairs
        assert ev.key == key and ev.store == tiers.hot.url and ev.source.startswith(tiers.durable.url)
        assert "repaired" in str(mgr.last_restore)
        assert metrics.registry.get_sample_value("trainstore_ckpt_repairs_total", {"job": "run", "tier": tiers.hot.url}) == 1
        assert all(r.ok for r in mgr.verify(deep=True))
    tiers.close()


@pytest.mark.timeout(60)
def test_corrupt_hot_chunk_is_never_copied_to_durable(tmp_path):
    tiers = Tiering(str(tmp_path / "hot"), f"memory://{uuid.uuid4().hex}")
    with CheckpointManager(tiers.store, "run", policy=FULL, options=SMALL) as mgr:  # no copy hook: copy by hand
        mgr.save(0, state(0), blocking=True)
        key = own_keys(mgr, 0)[0]
        flip_local(tiers.hot, key)
    with pytest.raises(ChunkCorruptError, match=key):
        tiers.make_durable("run", 0)  # no good copy anywhere: fail loudly
    assert not tiers.durable.exists(key)
    assert not tiers.durable.exists(mf.manifest_key("run", 0))
    tiers.close()


@pytest.mark.timeout(60)
def test_tier_copy_fetches_a_good_copy_from_another_tier(tmp_path):
    """Durable -> archive with a corrupt durable copy: the archive gets the hot bytes, and the
    durable copy is repaired on the way."""
    tiers = Tiering(str(tmp_path / "hot"), f"memory://{uuid.uuid4().hex}", archive=f"memory://{uuid.uuid4().hex}",
                    policy=TierPolicy(hot_keep_last=5, archive_after=0))
    with tiers.manager("run", policy=FULL, options=SMALL) as mgr:
        for step in range(2):
            mgr.save(step, state(step), blocking=True)
        tiers.wait()
        key = own_keys(mgr, 0)[0]
        good = raw(tiers.hot, key)
        flip_object(tiers.durable, key)
        tiers.hot.delete(mf.manifest_key("run", 0))  # as if evicted, so that archive() takes step 0
        assert tiers.archive("run") == [0]
        assert raw(tiers.archive_store, key) == good
        assert np.array_equal(mgr.restore(0)["w"], state(0)["w"])
    tiers.close()


@pytest.mark.timeout(60)
def test_corrupt_durable_copy_with_hot_intact_is_repaired_by_deep_verify(tmp_path):
    tiers = Tiering(str(tmp_path / "hot"), f"memory://{uuid.uuid4().hex}", policy=TierPolicy(hot_keep_last=3))
    with tiers.manager("run", policy=FULL, options=SMALL) as mgr:
        mgr.save(0, state(0), blocking=True)
        tiers.wait()
        key = own_keys(mgr, 0)[0]
        good = raw(tiers.hot, key)
        flip_object(tiers.durable, key)
        (rec,) = mgr.verify(0, deep=True)
        assert rec.ok
        assert raw(tiers.durable, key) == good
        assert [e.key for e in mgr.repairs] == [key]
    tiers.close()
    # the hot tier is lost: the durable tier alone restores the step
    fresh = Tiering(str(tmp_path / "hot2"), tiers.durable)
    with fresh.manager("run", options=SMALL) as mgr:
        assert np.array_equal(mgr.restore()["w"], state(0)["w"]) and mgr.last_restore.step == 0
    fresh.close()


def _repair_rounds(tmp_path, rounds: int, seed: int) -> dict:
    """Corrupt a random copy (hot / durable / archive) of a random chunk, then restore or deep-
    verify; count what was repaired and what was only detected."""
    rnd = random.Random(seed)
    tiers = Tiering(str(tmp_path / "hot"), f"memory://{uuid.uuid4().hex}", archive=f"memory://{uuid.uuid4().hex}",
                    policy=TierPolicy(hot_keep_last=10, archive_after=0, evict_after_copy=False))
    out = {"rounds": rounds, "corrupted": 0, "repaired": 0, "detected_only": 0, "wrong_restores": 0,
           "false_bad": 0}
    with tiers.manager("run", policy=FULL, options=SMALL) as mgr:
        for step in range(4):
            mgr.save(step, state(step), blocking=True)
        tiers.wait()
        for key in sorted(mf.manifest_chunk_keys(mgr.manifest(0))):  # step 0's chunks also in the archive
            tiers.archive_store.put(key, tiers.durable.get(key))
        for _ in range(rounds):
            step = rnd.randrange(4)
            key = rnd.choice(sorted(mf.manifest_chunk_keys(mgr.manifest(step))))
            holders = [s for s in (tiers.hot, tiers.durable, tiers.archive_store) if s.exists(key)]
            victim = rnd.choice(holders)
            good = raw(tiers.durable if victim is not tiers.durable else tiers.hot, key)
            (flip_local if victim is tiers.hot else flip_object)(victim, key, rnd.randrange(200))
            out["corrupted"] += 1
            before = len(mgr.repairs)
            if rnd.random() < 0.5:
                got = mgr.restore(step)
                if not np.array_equal(got["w"], state(step)["w"]):
                    out["wrong_restores"] += 1
            if not all(r.ok for r in mgr.verify(step, deep=True)):
                out["false_bad"] += 1
            if raw(victim, key) == good and len(mgr.repairs) > before:
                out["repaired"] += 1
            else:
                out["detected_only"] += 1
    tiers.close()
    return out


@pytest.mark.timeout(120)
def test_random_corruption_of_one_copy_is_always_repaired(tmp_path):
    got = _repair_rounds(tmp_path, rounds=12, seed=1)
    assert got["repaired"] == got["corrupted"] == 12, got
    assert got["wrong_restores"] == got["false_bad"] == 0, got


@pytest.mark.stress
@pytest.mark.timeout(1800)
def test_stress_random_corruption_across_tiers(tmp_path):
    got = _repair_rounds(tmp_path, rounds=400, seed=14)
    print("tier repair stress:", got)
    assert got["repaired"] == got["corrupted"], got
    assert got["wrong_restores"] == got["false_bad"] == 0, got
