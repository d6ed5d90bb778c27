"""Loader: exactly-once per epoch, determinism, resume (same and other world size), cache."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
import warnings
from collections import Counter

import numpy as np
import pytest

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.serve import IOBoundWarning, IOWaitMeter, MeterConfig, write_arrow_dataset
from trainstore.errors import CapacityError, ConfigError
from trainstore.nodecache.wanted import wanted_files

pytestmark = pytest.mark.timeout(120)


def make_dataset(store, n=240, rows_per_shard=20, name="feat", width=8):
    idx = np.arange(n, dtype=np.int64)
    x = (idx[:, None, None] * 10 + np.arange(width * 2).reshape(1, 2, width)).astype(np.float32)
    return write_arrow_dataset(store, name, {"idx": idx, "x": x, "label": idx % 7}, rows_per_shard)


@pytest.fixture
def store(tmp_path):
    return open_store(str(tmp_path / "durable"))


@pytest.fixture
def ds(store, tmp_path):
    make_dataset(store)
    return Dataset(store, "feat@1", cache_dir=tmp_path / "hot")


def epoch_indices(loader):
    out = []
    for batch in loader:
        assert batch["x"].shape[1] == 2
        assert np.array_equal(batch["x"][:, 0, 0], batch["idx"] * 10)
        out.append(batch["idx"].copy())
    return out


def test_dataset_map_style(ds):
    assert len(ds) == 240 and len(ds.shards) == 12
    row = ds[57]
    assert row["idx"] == 57 and row["label"] == 57 % 7
    assert row["x"].shape == (2, 8) and row["x"][1, 3] == 570 + 11
    assert not row["x"].flags.writeable  # a zero-copy view of the mapped shard
    batch = ds.take([5, 230, 21, 5])
    assert batch["idx"].tolist() == [5, 230, 21, 5] and batch["x"].shape == (4, 2, 8)
    assert ds[-1]["idx"] == 239
    with pytest.raises(IndexError):
        ds[240]


@pytest.mark.parametrize("mode", ["full", "block"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_sample_once_per_epoch(ds, world, mode):
    per_rank = []
    for rank in range(world):
        loader = Loader(ds, batch_size=7, seed=3, rank=rank, world_size=world, shuffle_mode=mode)
        batches = epoch_indices(loader)
        per_rank.append(np.concatenate(batches))
        assert len(batches) == len(loader)
    sizes = {len(p) for p in per_rank}
    assert sizes == {240 // world}  # equal parts: nobody waits at the epoch end
    allidx = np.concatenate(per_rank)
    assert sorted(allidx.tolist()) == list(range(240))


@pytest.mark.parametrize("mode", ["full", "block"])
def test_uneven_world_pads_equally(store, tmp_path, mode):
    make_dataset(store, n=50, rows_per_shard=9)
    ds = Dataset(store, "feat@1", cache_dir=tmp_path / "hot")
    counts, sizes = Counter(), set()
    for rank in range(4):
        got = np.concatenate(epoch_indices(Loader(ds, 4, rank=rank, world_size=4, shuffle_mode=mode)))
        sizes.add(len(got))
        counts.update(got.tolist())
    assert sizes == {13}
    assert set(counts) == set(range(50)) and sum(counts.values()) == 52
    dropped = Counter()
    for rank in range(4):
        got = epoch_indices(Loader(ds, 4, rank=rank, world_size=4, drop_last=True, shuffle_mode=mode))
        assert all(len(b) == 4 for b in got) and len(got) == 3
        dropped.update(np.concatenate(got).tolist())
    assert max(dropped.values()) == 1 and len(dropped) == 48


def test_same_seed_same_order_new_epoch_new_order(ds):
    a = Loader(ds, 16, seed=11)
    b = Loader(ds, 16, seed=11)
    ea, eb = epoch_indices(a), epoch_indices(b)
    assert all(np.array_equal(x, y) for x, y in zip(ea, eb))
    ea2 = epoch_indices(a)  # epoch 1 (its first batches were prefetched during epoch 0)
    assert a.epoch == 2 and not np.array_equal(np.concatenate(ea), np.concatenate(ea2))
    b.set_epoch(1)
    assert np.array_equal(np.concatenate(epoch_indices(b)), np.concatenate(ea2))
    c = Loader(ds, 16, seed=12)
    assert not np.array_equal(np.concatenate(epoch_indices(c)), np.concatenate(ea))
    plain = Loader(ds, 16, shuffle=False)
    assert np.concatenate(epoch_indices(plain)).tolist() == list(range(240))


def test_block_mode_keeps_rank_shards_stable(ds):
    shards = []
    for epoch in range(3):
        loader = Loader(ds, 10, rank=1, world_size=3, shuffle_mode="block", block_shards=2)
        loader.set_epoch(epoch)
        got = np.concatenate(epoch_indices(loader))
        shards.append(set((got // 20).tolist()))
    assert shards[0] == shards[1] == shards[2] and len(shards[0]) == 4


@pytest.mark.parametrize("mode", ["full", "block"])
def test_resume_same_world_size(ds, mode):
    full = [np.concatenate(epoch_indices(Loader(ds, 8, seed=5, rank=r, world_size=2, shuffle_mode=mode)))
            for r in range(2)]
    for r in range(2):
        loader = Loader(ds, 8, seed=5, rank=r, world_size=2, shuffle_mode=mode, prefetch=3)
        it = iter(loader)
        first = [next(it)["idx"].copy() for _ in range(6)]
        state = json.loads(json.dumps(loader.state_dict()))
        it.close()
        resumed = Loader(ds, 8, seed=5, rank=r, world_size=2, shuffle_mode=mode)
        resumed.load_state_dict(state)
        rest = epoch_indices(resumed)
        assert np.array_equal(np.concatenate(first + rest), full[r])
        assert resumed.epoch == 1


@pytest.mark.parametrize(("old", "new", "stop"), [(2, 3, 3), (4, 2, 2), (3, 4, 4), (2, 1, 5)])
@pytest.mark.parametrize("mode", ["full", "block"])
def test_resume_other_world_size_each_sample_once(ds, old, new, stop, mode):
    seen = []
    states = []
    for r in range(old):
        loader = Loader(ds, 6, seed=9, rank=r, world_size=old, shuffle_mode=mode)
        it = iter(loader)
        seen += [next(it)["idx"].copy() for _ in range(stop)]
        states.append(loader.state_dict())
        it.close()
    assert all(s == states[0] for s in states)
    for r in range(new):
        loader = Loader(ds, 6, seed=9, rank=r, world_size=new, shuffle_mode=mode)
        loader.load_state_dict(states[0])
        seen += epoch_indices(loader)
    got = np.concatenate(seen)
    remaining = 240 - old * stop * 6
    pad = -(-remaining // new) * new - remaining
    assert len(got) == 240 + pad
    assert set(got.tolist()) == set(range(240))


def test_resume_twice_across_world_sizes(ds):
    seen, state = [], None
    for world, stop in [(2, 3), (3, 2), (4, None)]:
        states = []
        for r in range(world):
            loader = Loader(ds, 6, seed=1, rank=r, world_size=world)
            if state:
                loader.load_state_dict(state)
            if stop is None:
                seen += epoch_indices(loader)
                continue
            it = iter(loader)
            seen += [next(it)["idx"].copy() for _ in range(stop)]
            states.append(loader.state_dict())
            it.close()
        state = states[0] if states else None
    got = np.concatenate(seen)
    assert sorted(got.tolist()) == list(range(240))


def test_state_checks(ds, store, tmp_path):
    loader = Loader(ds, 8, seed=1)
    with pytest.raises(ConfigError, match="other settings"):
        Loader(ds, 8, seed=2).load_state_dict(loader.state_dict())
    make_dataset(store, n=100, name="other")
    other = Dataset(store, "other@1", cache_dir=tmp_path / "hot")
    with pytest.raises(ConfigError, match="feat@1"):
        Loader(other, 8, seed=1).load_state_dict(loader.state_dict())


def test_cache_limit_smaller_than_dataset_evicts(store, tmp_path):
    make_dataset(store, n=400, rows_per_shard=20, width=64)
    shard_bytes = Dataset(store, "feat@1", cache_dir=tmp_path / "probe").max_shard_bytes
    limit = shard_bytes * 5
    ds = Dataset(store, "feat@1", cache_dir=tmp_path / "hot", cache_limit=limit)
    for mode in ["block", "full"]:
        loader = Loader(ds, 10, seed=2, shuffle_mode=mode, block_shards=1)
        for _ in range(2):
            got = np.concatenate(epoch_indices(loader))
            assert sorted(got.tolist()) == list(range(400))
            assert ds.cache.usage() <= limit
        # closed, so its prepared next epoch drops its wanted marks: left open, the block
        # loader's marks made every fill of the full-shuffle loader wait want_grace_s first
        # (30 s an epoch here instead of 1 s; docs/loader.md, "Sharing one cache directory")
        loader.close()
    assert ds.cache.stats.evictions > 0
    with pytest.raises(CapacityError, match="smaller than shard"):
        Dataset(store, "feat@1", cache_dir=tmp_path / "hot2", cache_limit=shard_bytes - 1)
    with pytest.raises(CapacityError):
        Loader(ds, 10, cache_dir=tmp_path / "hot3", cache_limit=shard_bytes // 2)


def test_closing_a_loader_drops_the_wanted_marks_of_its_prepared_next_epoch(store, tmp_path):
    """A block loader marks the shards it reads next as wanted in the cache directory's shared
    registry (evicted last; other readers' fills wait want_grace_s before taking them), the
    next epoch's first shards included once an epoch ends. ``with`` (``close``) drops them."""
    make_dataset(store, n=400, rows_per_shard=20, width=64)
    ds = Dataset(store, "feat@1", cache_dir=tmp_path / "hot")
    registry = wanted_files(ds.cache.root)

    def wanted() -> set[str]:
        files = [(ds.cache.path_of(s.key), s.bytes, 0.0) for s in ds.shards]
        idle = {p for p, _s, _a in registry.victims(files, ahead=True, rank=None)}
        return {p for p, _s, _a in files} - idle

    with Loader(ds, 10, seed=2, shuffle_mode="block", block_shards=1) as loader:
        assert sorted(np.concatenate(epoch_indices(loader)).tolist()) == list(range(400))
        assert wanted(), "the prepared next epoch marks its shards"
    assert wanted() == set()


def test_corrupt_shard_in_hot_tier_is_refetched(store, tmp_path):
    make_dataset(store)
    ds = Dataset(store, "feat@1", cache_dir=tmp_path / "hot")
    expected = np.concatenate(epoch_indices(Loader(ds, 16, shuffle=False)))
    ds.close()
    path = ds.cache.path_of(ds.shards[3].key)
    with open(path, "r+b") as f:
        f.seek(ds.shards[3].bytes // 2)
        f.write(b"\x13\x37" * 8)
    fresh = Dataset(store, "feat@1", cache_dir=tmp_path / "hot")
    got = np.concatenate(epoch_indices(Loader(fresh, 16, shuffle=False)))
    assert np.array_equal(got, expected)
    assert fresh.cache.stats.refetched_corrupt == 1


def _rank_proc(args):
    durable, hot, rank, world = args
    ds = Dataset(open_store(durable), "feat@1", cache_dir=hot, cache_limit=10**8)
    loader = Loader(ds, 5, seed=4, rank=rank, world_size=world, shuffle_mode="block")
    got = []
    for _ in range(2):
        for b in loader:
            assert np.array_equal(b["x"][:, 0, 0], b["idx"] * 10)
            got += b["idx"].tolist()
    return got, ds.cache.stats.misses


def test_processes_share_one_cache_dir(store, tmp_path):
    make_dataset(store)
    args = [(str(tmp_path / "durable"), str(tmp_path / "hot"), r, 3) for r in range(3)]
    with mp.get_context("spawn").Pool(3) as pool:
        results = pool.map(_rank_proc, args)
    all_idx = sum((r[0] for r in results), [])
    assert Counter(all_idx) == Counter({i: 2 for i in range(240)})
    assert sum(r[1] for r in results) == 12  # each shard crossed from durable once


def test_stats_meter_and_warning(ds):
    from prometheus_client import generate_latest

    loader = Loader(ds, 8, meter=MeterConfig(window=5, warn_fraction=0.0, warn_every_s=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in loader:
            time.sleep(0.001)
    s = loader.stats()
    assert s["batches"] == 30 and s["bytes"] > 0 and 0 <= s["wait_fraction"] < 1
    assert s["batches_per_s"] > 0 and s["cache_misses"] == 12
    assert any(issubclass(w.category, IOBoundWarning) for w in caught)
    text = generate_latest(loader.metrics_registry).decode()
    assert 'trainstore_loader_batches_total{rank="0"} 30.0' in text
    # a loop that never waits for data: no warning (meter driven directly, so the machine's
    # load cannot make the loader late)

    quiet = IOWaitMeter(MeterConfig(window=5, warn_every_s=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", IOBoundWarning)
        for _ in range(12):
            quiet.end(quiet.begin(), 100)
            time.sleep(0.01)
    assert quiet.snapshot()["wait_fraction"] < 0.1 and quiet.warnings == 0
    assert s["cache_hit_rate"] >= 0


def test_as_torch_and_collate(ds):
    import torch

    loader = Loader(ds, 16, as_torch=True, collate=lambda b: (b["x"], b["label"]))
    x, y = next(iter(loader))
    assert isinstance(x, torch.Tensor) and x.shape == (16, 2, 8) and y.dtype == torch.int64


def test_torch_dataloader_over_dataset(ds):
    import torch
    from torch.utils.data import DataLoader

    seen = []
    for batch in DataLoader(ds, batch_size=32, shuffle=True, num_workers=2):
        assert isinstance(batch["x"], torch.Tensor) and batch["x"].shape[1:] == (2, 8)
        seen += batch["idx"].tolist()
    assert sorted(seen) == list(range(240))


def test_load_from_s3(s3_url, tmp_path):
    url, opts = s3_url
    store = open_store(url, **opts)
    make_dataset(store, n=60, rows_per_shard=15)
    ds = Dataset(url, "feat@1", cache_dir=tmp_path / "hot", **opts)
    got = np.concatenate(epoch_indices(Loader(ds, 8, seed=0)))
    assert sorted(got.tolist()) == list(range(60))
    assert ds.cache.stats.misses == 4 and ds.cache.stats.bytes_fetched == ds.version.bytes


def test_rejects_non_feature_layout(store, tmp_path):
    import pyarrow as pa

    from trainstore.data.layouts import ArrowIpcLayout, register_layout
    from trainstore.data.versions import DatasetVersion, commit_version

    class Unservable(ArrowIpcLayout):  # parquet is served since issue 16: a layout that is not
        name, servable = "unservable-test", False

    register_layout(Unservable(), replace=True)
    commit_version(store, DatasetVersion("raw", 1, "unservable-test", pa.schema([("a", pa.int64())]), ()))
    with pytest.raises(ConfigError, match="arrow-ipc"):
        Dataset(store, "raw@1", cache_dir=tmp_path / "hot")


def test_state_round_trips_through_a_checkpoint(ds, tmp_path):
    from trainstore import CheckpointManager

    loader = Loader(ds, 8, seed=2, shuffle_mode="block")
    it = iter(loader)
    first = [next(it)["idx"].copy() for _ in range(4)]
    mgr = CheckpointManager(str(tmp_path / "ckpt"), "job")
    try:
        mgr.save(4, {"w": np.zeros(3, dtype=np.float32), "loader": loader.state_dict()}, blocking=True)
        restored = mgr.restore()
    finally:
        mgr.close()
    it.close()
    again = Loader(ds, 8, seed=2, shuffle_mode="block")
    again.load_state_dict(restored["loader"])
    rest = epoch_indices(again)
    full = epoch_indices(Loader(ds, 8, seed=2, shuffle_mode="block"))
    assert np.array_equal(np.concatenate(first + rest), np.concatenate(full))


def test_nested_lists_tensor_type_and_multibatch_shards(store, tmp_path):
    """The transform's shard contract: nested fixed_size_list or FixedShapeTensor columns,
    several record batches per shard; all read zero-copy."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from trainstore.chunks import content_hash
    from trainstore.data.versions import DatasetVersion, ShardInfo, commit_version

    n, shards = 60, []
    img = np.arange(n * 3 * 4, dtype=np.float32).reshape(n, 3, 4)
    nested_t = pa.list_(pa.list_(pa.float32(), 4), 3)
    tensor_t = pa.fixed_shape_tensor(pa.int16(), (2, 2))
    schema = pa.schema([("idx", pa.int64()), ("img", nested_t), ("t", tensor_t)])
    for s, start in enumerate(range(0, n, 30)):
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, schema) as w:
            for b in range(start, start + 30, 7):  # 5 record batches, the last one short
                rows = range(b, min(b + 7, start + 30))
                inner = pa.FixedSizeListArray.from_arrays(pa.array(img[list(rows)].reshape(-1)), 4)
                nested = pa.FixedSizeListArray.from_arrays(inner, 3)
                t = pa.ExtensionArray.from_storage(tensor_t, pa.FixedSizeListArray.from_arrays(
                    pa.array(np.repeat(np.array(rows, dtype=np.int16), 4)), 4))
                w.write_batch(pa.record_batch([pa.array(list(rows), pa.int64()), nested, t], schema=schema))
        buf = sink.getvalue()
        key = f"datasets/nested/shards/{s}.arrow"
        store.put(key, buf)
        shards.append(ShardInfo(key, 30, buf.size, content_hash(buf)))
    commit_version(store, DatasetVersion("nested", 1, "arrow-ipc", schema, tuple(shards)))
    ds = Dataset(store, "nested@1", cache_dir=tmp_path / "hot")
    row = ds[44]
    assert row["idx"] == 44 and np.array_equal(row["img"], img[44]) and row["t"].tolist() == [[44, 44]] * 2
    assert not row["img"].flags.writeable
    batch = ds.take([59, 0, 13, 14, 35])
    assert np.array_equal(batch["img"], img[[59, 0, 13, 14, 35]])
    assert batch["t"].shape == (5, 2, 2) and batch["t"].dtype == np.int16
    got = np.concatenate(epoch_indices_any(Loader(ds, 8, seed=1, shuffle_mode="block")))
    assert sorted(got.tolist()) == list(range(n))


def epoch_indices_any(loader):
    return [b["idx"].copy() for b in loader]


def test_wait_fraction_window_slides():
    """The window's fraction follows only the last ``window`` batches (kept as running sums)."""
    meter = IOWaitMeter(MeterConfig(window=4, warn_every_s=1e9))
    for _ in range(6):  # waits of 20 ms, no compute
        t = meter.begin()
        time.sleep(0.02)
        meter.end(t, 1)
    assert meter.window_fraction() > 0.9
    for _ in range(4):  # then compute of 20 ms, no wait: the window holds only these
        time.sleep(0.02)
        meter.end(meter.begin(), 1)
    assert meter.window_fraction() < 0.1
    t = meter.begin()  # one waiting batch of four: about a quarter
    time.sleep(0.02)
    meter.end(t, 1)
    assert 0.1 < meter.window_fraction() < 0.5
    assert meter.snapshot()["batches"] == 11
