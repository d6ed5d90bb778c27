"""Mixture: proportions, per-source epochs, determinism, schedules, elastic resume, bad input."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.serve import CallableSchedule, Mixture, PiecewiseLinear, write_arrow_dataset
from trainstore.data.serve.packing import PackedLoader, PackingConfig
from trainstore.errors import ConfigError, SchemaError, TrainstoreError
from trainstore.nodecache import NotNeeded

pytestmark = pytest.mark.timeout(180)

SIZES = {"web": 120, "code": 36, "math": 60}  # rows; source s holds ids BASE[s] + 0..n-1
BASE = {"web": 0, "code": 1000, "math": 2000}


def make_source(store, name, n, rows_per_shard=12, **extra):
    idx = np.arange(n, dtype=np.int64) + BASE.get(name, 0)
    cols = {"idx": idx, "x": (idx[:, None] * 10 + np.arange(3)).astype(np.float32), **extra}
    return write_arrow_dataset(store, name, cols, rows_per_shard)


@pytest.fixture
def sources(tmp_path):
    store = open_store(str(tmp_path / "durable"))
    for name, n in SIZES.items():
        make_source(store, name, n)
    return {name: Dataset(store, f"{name}@1", cache_dir=tmp_path / "hot") for name in SIZES}


def mix(sources, weights=None, **kw):
    return Mixture(sources, weights=weights or {"web": 0.5, "code": 0.3, "math": 0.2}, seed=kw.pop("seed", 0), **kw)


def source_of(ids):
    return np.where(ids >= 2000, 2, np.where(ids >= 1000, 1, 0))


def run(loader, batches=None):
    """Batches of ids (all of the epoch, or the first ``batches``), checking x matches idx."""
    out = []
    for b in loader:
        assert np.array_equal(b["x"][:, 0], b["idx"] * 10)
        out.append(b["idx"].copy())
        if batches is not None and len(out) == batches:
            break
    return out


def test_proportions_per_batch_and_exact_over_the_epoch(sources):
    m = mix(sources, source_column="source")
    loader = Loader(m, batch_size=20, seed=1, world_size=1, rank=0)
    batches = list(loader)
    weights = np.array([0.5, 0.3, 0.2])
    for b in batches:
        assert np.array_equal(b["source"], source_of(b["idx"]))
        counts = np.bincount(b["source"], minlength=3)
        assert np.all(np.abs(counts - weights * len(b["idx"])) <= 1.5), counts
    ids = np.concatenate([b["idx"] for b in batches])
    assert len(ids) == 216  # one epoch = the sources' total rows
    total = np.bincount(source_of(ids), minlength=3)
    assert np.all(np.abs(total - weights * 216) <= 1), total
    # any window of the stream, not only batches
    for w in (7, 33, 100):
        for start in range(0, len(ids) - w, 11):
            c = np.bincount(source_of(ids[start:start + w]), minlength=3)
            assert np.all(np.abs(c - weights * w) <= 2), (start, w, c)


def test_per_source_without_replacement_and_epochs_counted(sources):
    m = mix(sources, {"web": 0.2, "code": 0.6, "math": 0.2})  # code (36 rows) repeats, web is not exhausted
    loader = Loader(m, batch_size=12, seed=3, world_size=1, rank=0)
    ids = np.concatenate([np.concatenate(run(loader)) for _ in range(2)])  # two loader epochs
    progress = m.progress(loader.state_dict())
    for s, name in enumerate(SIZES):
        drawn = ids[source_of(ids) == s]
        assert progress[name]["samples"] == len(drawn)
        n = SIZES[name]
        for e in range(0, len(drawn), n):  # each source epoch: every row at most once, full ones exactly once
            part = drawn[e:e + n]
            assert len(set(part.tolist())) == len(part)
            if len(part) == n:
                assert set(part.tolist()) == set(range(BASE[name], BASE[name] + n))
    assert progress["code"]["epochs"] > 6 and progress["web"]["epochs"] < 1
    assert progress["code"]["samples"] == pytest.approx(0.6 * 432, abs=1)


@pytest.mark.parametrize("mode", ["full", "block", "none"])
def test_same_seed_same_order(sources, mode):
    def order(seed, mix_seed):
        m = mix(sources, seed=mix_seed)
        return np.concatenate(run(Loader(m, 16, seed=seed, world_size=1, rank=0, shuffle_mode=mode)))

    a = order(1, 0)
    assert np.array_equal(a, order(1, 0))
    if mode != "none":
        assert not np.array_equal(a, order(2, 0)) and not np.array_equal(a, order(1, 5))


def resumed_stream(sources, plan, weights=None, epochs=1, batch=6, **loader_kw):
    """Ids consumed over ``plan`` = [(world, batches or None = to the epoch end), ...], step by
    step and rank by rank, each part resuming from the last part's state (via JSON)."""
    seen, state = [], None
    for world, stop in plan:
        loaders = []
        for r in range(world):
            loader = Loader(mix(sources, weights), batch, seed=4, rank=r, world_size=world, **loader_kw)
            if state is not None:
                loader.load_state_dict(state)
            loaders.append(loader)
        per_rank = [run(lo, stop) if stop else [x for _ in range(epochs) for x in run(lo)] for lo in loaders]
        assert len({len(p) for p in per_rank}) == 1  # equal batch counts: no rank waits
        for step in zip(*per_rank):
            seen.extend(step)
        states = [json.loads(json.dumps(lo.state_dict())) for lo in loaders]
        assert all(s == states[0] for s in states)
        state = states[0]
        for lo in loaders:
            lo.close()
    return np.concatenate(seen), state


@pytest.mark.parametrize("plan", [
    [(2, 5), (3, 4), (1, None)],
    [(3, 3), (2, 7), (3, None)],  # ends on 3 ranks: the tail takes positions of the next epoch
    [(1, 1), (2, 1), (3, 1), (2, None)],
])
def test_resume_2_3_1_ranks_reads_the_uninterrupted_stream(sources, plan):
    straight, _ = resumed_stream(sources, [(1, None)], epochs=3)
    got, state = resumed_stream(sources, plan)
    assert np.array_equal(got, straight[:len(got)])  # same samples, same order: none doubled or skipped
    assert len(got) >= 216 and state["epoch"] == 1
    # and the next epoch continues the same stream after a resume
    follow = Loader(mix(sources), 6, seed=4, rank=0, world_size=1)
    follow.load_state_dict(state)
    rest = np.concatenate(run(follow))
    assert np.array_equal(rest, straight[len(got):len(got) + len(rest)])
    counts = Counter(got.tolist())
    for s, name in enumerate(SIZES):  # every row of a source drawn k or k+1 times (without replacement)
        per_row = [counts[i] for i in range(BASE[name], BASE[name] + SIZES[name])]
        assert max(per_row) - min(per_row) <= 1 and sum(per_row) == int((source_of(got) == s).sum())


def test_piecewise_schedule_and_steps_unit(sources):
    two = {"web": sources["web"], "math": sources["math"]}
    sched = PiecewiseLinear({0: {"web": 1, "math": 0}, 15: {"web": 0, "math": 1}}, unit="steps", global_batch=8)
    ids = np.concatenate(run(Loader(Mixture(two, sched, num_samples=180), 8, world_size=1, rank=0)))
    is_math = (ids >= 2000).astype(float)
    # expected share of math rises linearly over the first 120 samples, then stays 1
    expect = np.cumsum(np.clip(np.arange(180) / 120.0, 0, 1))
    assert np.all(np.abs(np.cumsum(is_math) - expect) <= 1.5)
    assert is_math[:8].sum() <= 1 and is_math[120:].all()


def test_callable_schedule_outputs_recorded_and_replayed(sources):
    calls, feedback = [], {"eval_loss": 1.0}

    def fn(x):  # e.g. driven by training feedback: not reproducible by calling it again
        calls.append(x)
        return {"web": feedback["eval_loss"], "code": 1.0 + x / 50.0, "math": 0.5}

    def make():
        return Mixture(sources, CallableSchedule(fn, every=24), seed=0)

    straight = np.concatenate(run(Loader(make(), 8, world_size=1, rank=0)))
    calls.clear()
    loader = Loader(make(), 8, world_size=1, rank=0)
    first = run(loader, 10)
    state = json.loads(json.dumps(loader.state_dict()))
    recorded = state["cursor"]["eras"][0]["recorded"]
    assert sorted(int(m) for m in recorded) == sorted(x // 24 for x in calls) and len(calls) >= 9
    feedback["eval_loss"] = 9.0  # fn now answers otherwise; the resume replays what was recorded
    calls.clear()
    resumed = Loader(make(), 8, world_size=1, rank=0)
    resumed.load_state_dict(state)
    rest = np.concatenate(run(resumed))
    assert np.array_equal(np.concatenate([*first, rest]), straight)
    assert calls and all(str(x // 24) not in recorded for x in calls)  # only the next epoch's, planned ahead
    assert len(resumed.state_dict()["cursor"]["eras"]) == 1


def test_resume_with_changed_weights(sources):
    old = {"web": 0.5, "code": 0.3, "math": 0.2}
    new = {"web": 0.1, "code": 0.1, "math": 0.8}
    got_a, state = resumed_stream(sources, [(2, 6)], weights=old)
    got_b, end = resumed_stream_with(sources, state, new)
    straight, _ = resumed_stream(sources, [(1, None)], weights=old)
    assert np.array_equal(got_a, straight[:len(got_a)])  # what was drawn stays drawn
    c = np.bincount(source_of(got_b), minlength=3)
    assert np.all(np.abs(c - np.array([0.1, 0.1, 0.8]) * len(got_b)) <= 1.5), c
    both = np.concatenate([got_a, got_b])
    for s, name in enumerate(SIZES):  # each source continues its own order: no row twice per source epoch
        drawn = both[source_of(both) == s]
        n = SIZES[name]
        for e in range(0, len(drawn), n):
            assert len(set(drawn[e:e + n].tolist())) == len(drawn[e:e + n])
    assert len(end["cursor"]["eras"]) == 2 and end["cursor"]["eras"][1]["start"] == len(got_a)


def resumed_stream_with(sources, state, weights):
    loader = Loader(mix(sources, weights), 6, seed=4, rank=0, world_size=1)
    loader.load_state_dict(state)
    got = np.concatenate(run(loader))
    return got, loader.state_dict()


def test_a_fill_ahead_no_batch_needs_is_skipped_in_every_source(sources):
    """The loader's fill-ahead asks a mixture shard with ``needed=``, as it asks a Dataset:
    once the batches are done with a shard its download is skipped (NotNeeded), not made."""
    m = mix(sources)
    last = len(m.shards) - 1  # a shard of the last source
    with pytest.raises(NotNeeded):
        m.pin_shard(last, ahead=True, needed=lambda: False)
    assert not sources["math"].cache.contains(m.shards[last].key)
    m.pin_shard(last, ahead=True, needed=lambda: True).close()
    assert sources["math"].cache.contains(m.shards[last].key)


def test_bad_input(sources, tmp_path):
    with pytest.raises(ConfigError, match="finite and >= 0"):
        mix(sources, {"web": -1, "code": 1, "math": 1})
    with pytest.raises(ConfigError, match="all weights are zero"):
        mix(sources, {"web": 0, "code": 0, "math": 0})
    with pytest.raises(ConfigError, match=r"not in the mixture: \['books'\]"):
        mix(sources, {"web": 1, "code": 1, "math": 1, "books": 1})
    with pytest.raises(ConfigError, match=r"no weight for sources \['math'\]"):
        mix(sources, {"web": 1, "code": 1})
    with pytest.raises(ConfigError, match="breakpoint 10"):
        mix(sources, PiecewiseLinear({0: {"web": 1, "code": 1, "math": 1}, 10: {"web": -2, "code": 1, "math": 1}}))
    store = open_store(str(tmp_path / "other"))
    write_arrow_dataset(store, "labels", {"label": np.arange(10)}, 5)
    other = Dataset(store, "labels@1", cache_dir=tmp_path / "hot")
    with pytest.raises(ConfigError, match="no common columns"):
        Mixture({"web": sources["web"], "labels": other}, {"web": 1, "labels": 1})
    with pytest.raises(SchemaError, match="not in source 'labels'"):
        Mixture({"web": sources["web"], "labels": other}, {"web": 1, "labels": 1}, columns=["idx"])
    # a state from another mixture names what differs
    loader = Loader(mix(sources), 6, world_size=1, rank=0)
    run(loader, 2)
    state = loader.state_dict()
    two = Mixture({"web": sources["web"], "code": sources["code"]}, {"web": 1, "code": 1})
    with pytest.raises(ConfigError, match="another mixture.*sources"):
        Loader(two, 6, world_size=1, rank=0).load_state_dict(state)
    with pytest.raises(ConfigError, match="another mixture.*seed"):
        Loader(mix(sources, seed=7), 6, world_size=1, rank=0).load_state_dict(state)
    with pytest.raises(ConfigError, match="web@1"):
        Loader(sources["web"], 6, world_size=1, rank=0).load_state_dict(state)
    plain = Loader(sources["web"], 6, world_size=1, rank=0).state_dict()
    with pytest.raises(ConfigError, match="mixture"):
        Loader(mix(sources), 6, world_size=1, rank=0).load_state_dict(plain)
    with pytest.raises(ConfigError, match="each source dataset"):
        Loader(mix(sources), 6, world_size=1, rank=0, cache_limit=10**9)


def test_packed_loader_over_a_mixture(tmp_path):
    store = open_store(str(tmp_path / "durable"))
    srcs = {}
    for name, n in (("web", 40), ("code", 14)):
        idx = np.arange(n, dtype=np.int64) + BASE[name]
        docs = [list(range(int(i) * 100, int(i) * 100 + 1 + int(i) % 9)) for i in idx]
        write_arrow_dataset(store, name, pa.table({"idx": idx, "tokens": pa.array(docs, pa.list_(pa.int32()))}), 10)
        srcs[name] = Dataset(store, f"{name}@1", cache_dir=tmp_path / "hot")
    cfg = PackingConfig(seq_len=16, batch_size=3, column="tokens")

    def packed(m_seed=0):
        return PackedLoader(Loader(Mixture(srcs, {"web": 0.6, "code": 0.4}, seed=m_seed), 8, world_size=1, rank=0),
                            cfg)

    full = [b["input_ids"].copy() for b in packed()]
    toks = np.concatenate([b[b != 0] for b in full]) if full else np.empty(0)
    docs_seen = Counter((toks // 100).tolist())
    assert sum(1 for d in docs_seen if d >= 1000) > 0 and len(docs_seen) > 40
    p = packed()
    it = iter(p)
    head = [next(it)["input_ids"].copy() for _ in range(4)]
    state = json.loads(json.dumps(p.state_dict()))
    it.close()
    q = packed()
    q.load_state_dict(state)
    rest = [b["input_ids"].copy() for b in q]
    assert all(np.array_equal(a, b) for a, b in zip(head + rest, full, strict=True))


def test_parquet_source_beside_arrow_ipc(sources, tmp_path):
    import pyarrow.parquet as pq

    folder = tmp_path / "pq"
    folder.mkdir()
    for k in range(3):  # an external Parquet folder served as it is
        ids = np.arange(k * 10, k * 10 + 10, dtype=np.int64) + 3000
        pq.write_table(pa.table({"idx": ids, "text": [f"doc {i}" for i in ids]}), folder / f"part-{k}.parquet",
                       row_group_size=4)
    ext = Dataset.open(str(folder), cache_dir=tmp_path / "hot")
    m = Mixture({"web": sources["web"], "pq": ext}, {"web": 0.5, "pq": 0.5}, columns=["idx"], source_column="src")
    assert m.column_names == ("idx", "src")
    loader = Loader(m, 10, seed=2, world_size=1, rank=0)
    ids = np.concatenate([b["idx"] for b in loader])
    from_pq = ids[ids >= 3000]
    assert len(from_pq) == 75 and len(ids) == 150
    first, second = from_pq[:30], from_pq[30:60]  # 30 rows: each source epoch draws each row once
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(3000, 3030))


@pytest.mark.parametrize("S,prefix,window", [(2, 0.5, 1.0), (3, 1.0, 2.0)])
def test_interleave_bounds_and_random_access(S, prefix, window):
    from trainstore.data.serve.interleave import EraStream
    from trainstore.data.serve.schedule import WeightCurve

    rng = np.random.default_rng(S)
    names = [f"s{i}" for i in range(S)]
    for _ in range(20):
        w = rng.random(S) ** 2 + 1e-3
        stream = EraStream(WeightCurve(PiecewiseLinear({0: dict(zip(names, w))}), names, 0), np.zeros(S, np.int64))
        src, draw = stream.window(0, 2000)
        w = w / w.sum()
        cum = np.vstack([np.zeros(S), np.eye(S)[src].cumsum(0)])
        assert np.abs(cum - np.arange(2001)[:, None] * w).max() <= prefix + 1e-9
        for L in (8, 64):
            assert np.abs(cum[L:] - cum[:-L] - L * w).max() <= window + 1e-9
        for s in range(S):  # each source's draws are 0, 1, 2, ... in stream order
            assert np.array_equal(draw[src == s], np.arange(int((src == s).sum())))
        a, b = sorted(rng.integers(0, 2000, 2).tolist())
        s2, d2 = stream.window(a, b)  # any window directly, as a resume computes it
        assert np.array_equal(s2, src[a:b]) and np.array_equal(d2, draw[a:b])
        assert np.array_equal(stream.counts_at(b), cum[b].astype(np.int64))


@pytest.mark.stress
@pytest.mark.parametrize("case", range(6))
def test_stress_random_resume_chains(sources, case):
    rng = np.random.default_rng(100 + case)
    weights = dict(zip(SIZES, (rng.random(3) + 0.05).tolist()))
    batch = int(rng.integers(2, 9))
    drop_last = bool(case % 2)
    plan = [(int(rng.integers(1, 5)), int(rng.integers(1, 6))) for _ in range(int(rng.integers(2, 5)))]
    plan.append((int(rng.integers(1, 5)), None))
    mode = ["full", "block", "none"][case % 3]
    straight, _ = resumed_stream(sources, [(1, None)], weights, epochs=3, batch=batch, drop_last=drop_last,
                                 shuffle_mode=mode)
    got, _ = resumed_stream(sources, plan, weights, batch=batch, drop_last=drop_last, shuffle_mode=mode)
    assert np.array_equal(got, straight[:len(got)]), plan


def test_packed_loader_names_a_missing_column_of_a_mixture(sources):
    with pytest.raises(SchemaError, match=r"mixture\(web=web@1.*no column 'tokens'"):
        PackedLoader(Loader(mix(sources), 8, world_size=1, rank=0), PackingConfig(seq_len=8))


def test_sources_sharing_a_cache_dir_share_a_limit_that_fits_the_mixture(tmp_path):
    store = open_store(str(tmp_path / "durable"))
    rng = np.random.default_rng(0)
    for name, n in (("web", 1400), ("math", 140)):  # 1 KB rows: web alone is above the 1 MB floor
        write_arrow_dataset(store, name, {"idx": np.arange(n) + BASE[name],
                                          "x": rng.standard_normal((n, 256)).astype(np.float32)}, 100)
    srcs = {n: Dataset(store, f"{n}@1", cache_dir=tmp_path / "hot") for n in ("web", "math")}
    m = Mixture(srcs, {"web": 0.5, "math": 0.5})
    assert m.cache_limit >= m.source_bytes  # every source's default limit counts the others in its directory
    loader = Loader(m, 50, shuffle_mode="block", world_size=1, rank=0)
    for _ in range(3):
        for _b in loader:
            pass
    assert loader.stats()["bytes_fetched"] == m.source_bytes  # each shard fetched once, none evicted


def test_zero_weight_source_is_not_drawn_until_its_weight_rises(sources):
    sched = PiecewiseLinear({0: {"web": 1, "code": 0, "math": 1}, 100: {"web": 1, "code": 0, "math": 1},
                             101: {"web": 1, "code": 2, "math": 1}})
    loader = Loader(Mixture(sources, sched), 10, world_size=1, rank=0)
    ids = np.concatenate(run(loader))
    assert not (source_of(ids[:100]) == 1).any() and (source_of(ids[110:]) == 1).mean() == pytest.approx(0.5, abs=0.02)
    with pytest.raises(ConfigError, match="exchange"):
        Loader(mix(sources), 6, world_size=1, rank=0, exchange=True)


def test_mixture_state_round_trips_through_a_checkpoint(sources, tmp_path):
    from trainstore import CheckpointManager

    def make():
        return Mixture(sources, CallableSchedule(lambda x: {"web": 1.0, "code": 0.5 + x / 400, "math": 0.25},
                                                 every=30), seed=1)

    full = np.concatenate(run(Loader(make(), 8, world_size=1, rank=0)))
    loader = Loader(make(), 8, world_size=1, rank=0)
    first = run(loader, 5)
    mgr = CheckpointManager(str(tmp_path / "ckpt"), "job")
    try:
        mgr.save(5, {"w": np.zeros(3, dtype=np.float32), "loader": loader.state_dict()}, blocking=True)
        restored = mgr.restore()
    finally:
        mgr.close()
    again = Loader(make(), 8, world_size=3, rank=0)  # the restored state, on another world size
    again.load_state_dict(restored["loader"])
    rest = np.concatenate([x for step in zip(*[run(lo) for lo in [again] + [
        _loaded(make(), restored["loader"], r) for r in (1, 2)]]) for x in step])
    got = np.concatenate([*first, rest])
    assert np.array_equal(got[:len(full)], full)


def _loaded(m, state, rank):
    lo = Loader(m, 8, world_size=3, rank=rank)
    lo.load_state_dict(state)
    return lo


def test_callable_outputs_of_an_epoch_planned_ahead_are_recorded(sources):
    feedback = {"eval_loss": 1.0}

    def fn(x):
        return {"web": feedback["eval_loss"], "code": 1.0 + x / 100.0, "math": 0.5}

    def make():
        return Mixture(sources, CallableSchedule(fn, every=24), seed=0)

    straight = np.concatenate([x for lo in [Loader(make(), 8, world_size=1, rank=0)] for _ in range(2)
                               for x in run(lo)])
    loader = Loader(make(), 8, world_size=1, rank=0)
    first = run(loader)  # epoch 0; epoch 1 is planned ahead (prefetch across the boundary)
    first += run(loader, 3)
    state = json.loads(json.dumps(loader.state_dict()))
    feedback["eval_loss"] = 9.0
    resumed = Loader(make(), 8, world_size=1, rank=0)
    resumed.load_state_dict(state)
    got = np.concatenate([*first, *run(resumed)])
    assert np.array_equal(got, straight)


def test_schedule_in_tokens_places_breakpoints_at_the_tokens_seen(tmp_path):
    store = open_store(str(tmp_path / "durable"))
    srcs = {}
    for name, n, length in (("web", 200, 10), ("math", 200, 30)):  # every doc of a source has its mean length
        idx = np.arange(n, dtype=np.int64) + BASE[name]
        write_arrow_dataset(store, name, pa.table({"idx": idx, "tokens": pa.array(
            [[int(i)] * length for i in idx], pa.list_(pa.int32()))}), 50)
        srcs[name] = Dataset(store, f"{name}@1", cache_dir=tmp_path / "hot")
    means = {"web": 10, "math": 30}
    sched = PiecewiseLinear({0: {"web": 1, "math": 0}, 1000: {"web": 1, "math": 0}, 4000: {"web": 0, "math": 1}},
                            unit="tokens", tokens_per_sample=means)
    batches = list(Loader(Mixture(srcs, sched, num_samples=300), 10, world_size=1, rank=0))
    lengths = np.concatenate([[len(d) for d in b["tokens"]] for b in batches])
    seen = np.cumsum(lengths) - lengths  # tokens before each sample
    is_math = lengths == 30
    assert not is_math[seen < 1000].any() and is_math[seen >= 4000 + 30].all()
    mid = (seen >= 2400) & (seen < 2600)  # halfway in tokens: weights 1/2, 1/2
    assert is_math[mid].mean() == pytest.approx(0.5, abs=0.2)
    with pytest.raises(ConfigError, match="tokens_per_sample"):
        PiecewiseLinear({0: means}, unit="tokens")
    with pytest.raises(ConfigError, match="no mean for sources"):
        Mixture(srcs, PiecewiseLinear({0: {"web": 1, "math": 1}}, unit="tokens", tokens_per_sample={"web": 3}))


@pytest.mark.parametrize(("workers", "prefetch"), [(1, 0), (3, 4)])
def test_resume_does_not_depend_on_worker_count(sources, workers, prefetch):
    straight, _ = resumed_stream(sources, [(1, None)], epochs=2)
    got, state = resumed_stream(sources, [(2, 3)])
    per_rank = []
    for r in range(3):  # resumed on 3 ranks with another worker count and prefetch depth
        lo = Loader(mix(sources), 6, seed=4, rank=r, world_size=3, workers=workers, prefetch=prefetch)
        lo.load_state_dict(state)
        per_rank.append(run(lo))
    got = np.concatenate([got, *[x for step in zip(*per_rank) for x in step]])
    assert np.array_equal(got, straight[:len(got)]) and len(got) >= 216


def test_take_reports_each_gathered_shard_by_its_mixture_index(sources):
    m = mix(sources)
    rows = np.array([0, 125, 5, 200, 13])  # web shards 0 and 1, code (rows 120..) shard 0, math shard 3
    done = []
    m.take(rows, gathered=done.append)
    web, code = len(sources["web"].shards), len(sources["code"].shards)
    assert sorted(done) == [0, 1, web, web + code + 3]


def test_a_shard_missing_from_the_store_is_named(tmp_path, monkeypatch):
    import threading

    crashed = []  # the fill-ahead thread must report the failure, not crash on a Dataset-only name
    monkeypatch.setattr(threading, "excepthook", lambda args: crashed.append(args.exc_value))
    store = open_store(str(tmp_path / "durable"))
    for name, n in (("web", 40), ("math", 20)):
        make_source(store, name, n, rows_per_shard=10)
    srcs = {n: Dataset(store, f"{n}@1", cache_dir=tmp_path / "hot") for n in ("web", "math")}
    m = Mixture(srcs, {"web": 0.5, "math": 0.5})
    gone = srcs["math"].shards[1].key
    store.delete(gone)
    with pytest.raises(TrainstoreError, match=gone.replace(".", r"\.")):
        run(Loader(m, 10, world_size=1, rank=0, prefetch=4))
    assert not crashed


def test_parquet_sources_are_decoded_ahead(tmp_path):
    import time

    import pyarrow.parquet as pq

    srcs = {}
    for name, n in (("web", 240), ("code", 120)):
        folder = tmp_path / name
        folder.mkdir()
        for k in range(0, n, 40):  # files of 40 rows in row groups of 8
            ids = np.arange(k, k + 40, dtype=np.int64) + BASE[name]
            pq.write_table(pa.table({"idx": ids}), folder / f"part-{k:04d}.parquet", row_group_size=8)
        srcs[name] = Dataset.open(str(folder), cache_dir=tmp_path / "hot")
    m = Mixture(srcs, {"web": 0.5, "code": 0.5})
    it = iter(Loader(m, 8, shuffle_mode="block", block_shards=1, world_size=1, rank=0, workers=1, prefetch=1))
    first = next(it)["idx"]  # the consumer pauses: only decode-ahead reaches later row groups
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and min(s.row_group_stats()["decoded_ahead"] for s in m.sources) < 2:
        time.sleep(0.02)
    assert all(s.row_group_stats()["decoded_ahead"] >= 2 for s in m.sources), [s.row_group_stats() for s in m.sources]
    rest = np.concatenate([first, *[b["idx"] for b in it]])
    web = rest[rest < 1000]  # 180 of web's 240 rows, once each; code (120 rows) goes round 1.5 times
    assert len(rest) == 360 and len(web) == 180 and len(set(web.tolist())) == 180


def test_take_gathers_into_the_given_allocator(sources):
    m = mix(sources)
    made = []

    def alloc(shape, dtype):  # noqa: ANN001, ANN202
        made.append(np.zeros(shape, dtype=dtype))
        return made[-1]

    rows = [0, 130, 200, 7]
    got, want = m.take(rows, alloc=alloc), m.take(rows)
    assert {id(a) for a in made} == {id(got["idx"]), id(got["x"])}
    assert all(np.array_equal(got[k], want[k]) for k in want)
