"""Issue 26 item 1: metadata objects get what chunks get across tiers. A corrupt copy of a
manifest (or of another metadata object) in one tier is read from the next tier, repaired in
the tier that was bad, and a step is marked bad only when no tier holds a good copy. A
verification record is bound to the manifest it verified, so it never outlives a re-saved step.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import numpy as np
import pytest

from trainstore import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import IntegrityError, ManifestError
from trainstore.lifecycle.registry import Registry
from trainstore.lifecycle.tiering import Tiering, TierPolicy
from trainstore.store import open_store
from trainstore.store.checked import read_checked
from trainstore.store.tiered import TieredStore

SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, nice=0)
FULL = CheckpointPolicy(full_every=1, incremental_every=None)


def state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal(2000).astype(np.float32), "step": step}


def raw(store, key: str) -> bytes:
    return bytes(memoryview(store.get(key)))


def flip_file(store, key: str) -> None:
    """One flipped byte in the middle of a local tier's file (bit rot in place)."""
    path = store.local_path(key)
    with open(path, "r+b") as f:
        data = f.read()
        pos = len(data) // 2
        f.seek(pos)
        f.write(bytes([data[pos] ^ 0x10]))


@contextlib.contextmanager
def durable_tiers(tmp_path, steps: int = 3) -> Iterator[tuple[Tiering, CheckpointManager]]:
    """Write-back tiers with ``steps`` full checkpoints, each copied to the durable tier."""
    tiers = Tiering(str(tmp_path / "hot"), str(tmp_path / "durable"), policy=TierPolicy(hot_keep_last=5))
    mgr = tiers.manager("run", policy=FULL, options=SMALL)
    try:
        for step in range(steps):
            mgr.save(step, state(step), blocking=True)
        mgr.wait()
        tiers.wait()
        yield tiers, mgr
    finally:
        mgr.close()
        tiers.close()


@pytest.mark.timeout(120)
def test_corrupt_hot_manifest_is_read_from_durable_and_repaired(tmp_path):
    with durable_tiers(tmp_path) as (tiers, mgr):
        key = mf.manifest_key("run", 2)
        good = raw(tiers.durable, key)
        assert raw(tiers.hot, key) == good
        flip_file(tiers.hot, key)
        assert raw(tiers.hot, key) != good
        got = mgr.restore()
        assert mgr.last_restore.step == 2 and not mgr.last_restore.skipped
        assert np.array_equal(got["w"], state(2)["w"])
        assert raw(tiers.hot, key) == good  # repaired in the tier that was bad
        rec = mf.load_verify_record(tiers.store, "run", 2)
        assert rec is None or rec.ok  # never recorded bad
        assert all(r.ok for r in mgr.verify(deep=True))


@pytest.mark.timeout(120)
def test_deep_verify_scrubs_a_corrupt_durable_manifest_behind_a_good_hot_one(tmp_path):
    with durable_tiers(tmp_path, steps=2) as (tiers, mgr):
        key = mf.manifest_key("run", 1)
        good = raw(tiers.hot, key)
        flip_file(tiers.durable, key)
        (rec,) = mgr.verify(step=1, deep=True)
        assert rec.ok
        assert raw(tiers.durable, key) == good


@pytest.mark.timeout(120)
def test_a_manifest_corrupt_in_every_tier_is_skipped_and_recorded_bad(tmp_path):
    with durable_tiers(tmp_path) as (tiers, mgr):
        key = mf.manifest_key("run", 2)
        flip_file(tiers.hot, key)
        flip_file(tiers.durable, key)
        mgr.restore()
        assert mgr.last_restore.step == 1
        assert [s for s, _why in mgr.last_restore.skipped] == [2]
        with pytest.raises(ManifestError, match="no good copy"):
            mf.load_manifest(tiers.store, "run", 2)
        (rec,) = mgr.verify(step=2, deep=True)
        assert not rec.ok


@pytest.mark.timeout(120)
def test_a_read_only_view_reads_the_good_copy_and_writes_nothing(tmp_path):
    with durable_tiers(tmp_path, steps=1) as (tiers, mgr):
        key = mf.manifest_key("run", 0)
        flip_file(tiers.hot, key)
        bad = raw(tiers.hot, key)
        m = mf.load_manifest(tiers.store.with_read_only(), "run", 0)
        assert m.step == 0
        assert raw(tiers.hot, key) == bad


@pytest.mark.timeout(120)
def test_a_verify_record_does_not_outlive_a_resaved_step(tmp_path):
    store = str(tmp_path / "store")
    with CheckpointManager(store, "run", policy=FULL, options=SMALL) as mgr:
        mgr.save(1, state(1), blocking=True)
        mgr.save(2, state(2), blocking=True)
        s = mgr.store
        # step 2 recorded bad (say a chunk was corrupt), then deleted manifest first (as
        # retention does) by a process that died before removing verify.json
        mf.write_verify_record(s, "run", mf.new_verify_record(2, True, ["chunk x: corrupted"], 1))
        s.delete(mf.manifest_key("run", 2))
        assert s.exists(mf.verify_key("run", 2))
        mgr.save(2, state(22), blocking=True)  # the same step number, saved again
        got = mgr.restore()
        assert mgr.last_restore.step == 2 and not mgr.last_restore.skipped
        assert np.array_equal(got["w"], state(22)["w"])
        assert mf.load_verify_record(s, "run", 2) is None
        (info,) = [i for i in mgr.list() if i.step == 2]
        assert info.status != "bad"


@pytest.mark.timeout(60)
def test_a_record_binds_to_the_manifest_it_verified(tmp_path):
    with CheckpointManager(str(tmp_path / "store"), "run", policy=FULL, options=SMALL) as mgr:
        mgr.save(1, state(1), blocking=True)
        (rec,) = mgr.verify(step=1)
        m = mgr.manifest(1)
        assert rec.ok and rec.manifest == mf.manifest_digest(m)
        assert mf.load_verify_record(mgr.store, "run", 1, m) == rec == mf.load_verify_record(mgr.store, "run", 1)


def test_corrupt_hot_registry_record_is_read_from_durable(tmp_path):
    hot, durable = open_store(str(tmp_path / "hot")), open_store(str(tmp_path / "durable"))
    store = TieredStore(hot, durable)
    with CheckpointManager(store, "run", policy=FULL, options=SMALL) as mgr:
        mgr.save(1, state(1), blocking=True)
    reg = Registry(store)
    reg.register("run", 1, "m")
    keys = [meta.key for meta in hot.list("registry/")]
    assert keys
    for key in keys:
        flip_file(hot, key)
    (v,) = Registry(store).versions("m")
    assert v.job == "run" and v.step == 1
    assert Registry(store).aliases("m") == {"latest": 1}
    for key in keys:
        assert raw(hot, key) == raw(durable, key)


def test_read_checked_raises_the_store_error_not_corruption_when_a_tier_cannot_answer(tmp_path):
    from trainstore.errors import StoreUnavailableError
    from trainstore.store.base import ForwardingStore

    class Down(ForwardingStore):
        def get(self, key):
            raise StoreUnavailableError(f"{self.inner.url} is down")

    hot, durable = open_store(str(tmp_path / "hot")), open_store(str(tmp_path / "durable"))
    hot.put("k", b"{bad")
    durable.put("k", b"{}")

    def check(data):
        try:
            return json.loads(bytes(data))
        except ValueError as exc:
            raise IntegrityError(f"k: {exc}") from None

    assert read_checked(TieredStore(hot, durable), "k", check) == {}
    assert raw(hot, "k") == b"{}"
    hot.put("k", b"{bad")
    with pytest.raises(StoreUnavailableError):
        read_checked(TieredStore(hot, Down(durable)), "k", check)


def test_corrupt_hot_dataset_version_is_read_from_durable(tmp_path):
    import pyarrow as pa

    from trainstore.data.versions import DatasetVersion, commit_version, load_version

    hot, durable = open_store(str(tmp_path / "hot")), open_store(str(tmp_path / "durable"))
    store = TieredStore(hot, durable)
    commit_version(store, DatasetVersion("ds", 1, "parquet", pa.schema([("a", pa.int64())]), ()))
    (key,) = [meta.key for meta in hot.list("datasets/")]
    flip_file(hot, key)
    assert load_version(store, "ds", 1).version == 1
    assert raw(hot, key) == raw(durable, key)
