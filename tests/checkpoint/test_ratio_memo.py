"""Sampled compression ratios reused across saves (``format.ratios.RatioMemo``,
``WriteOptions.resample_every``): a piece's codec sample is taken again only every few saves,
the resamples of a state are spread over saves, a piece that turns compressible is compressed
within ``resample_every`` saves, and every restore stays bit-exact."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format import delta as delta_mod
from trainstore.checkpoint.format.ratios import RatioMemo
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.dcp import StorageWriter
from trainstore.errors import ConfigError

pytestmark = pytest.mark.timeout(120)
INCR = CheckpointPolicy(full_every=100, incremental_every=1)


def test_a_ratio_is_reused_then_resampled_every_n_uses():
    memo = RatioMemo(every=4)
    calls: dict[str, list[int]] = {}
    for use in range(13):
        for key in ("a", "b", "c", "d", "e", "f", "g", "h"):
            memo.ratio(key, lambda k=key, u=use: calls.setdefault(k, []).append(u) or 0.5)
    for key, uses in calls.items():
        assert uses[0] == 0, key
        gaps = [b - a for a, b in zip(uses, uses[1:])]
        assert 1 <= gaps[0] <= 4 and all(g == 4 for g in gaps[1:]), (key, uses)
    assert len({uses[1] for uses in calls.values()}) > 1  # first resamples spread over several saves
    assert memo.samples == sum(len(u) for u in calls.values())
    every_time = RatioMemo(every=1)
    for _ in range(3):
        every_time.ratio("k", lambda: 0.5)
    assert every_time.samples == 3
    with pytest.raises(ConfigError, match="resampled every"):
        RatioMemo(every=0)
    with pytest.raises(ConfigError, match="resample_every"):
        WriteOptions(resample_every=0)


def _states(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(1 << 18, generator=g)
    m = torch.randn(1 << 18, generator=g).abs()
    out = []
    for _ in range(n):
        w = w + torch.randn(w.shape, generator=g) * 1e-3
        m = 0.9 * m + 0.1 * torch.randn(m.shape, generator=g) ** 2
        out.append({"w": w.clone(), "m": m.clone(), "small": torch.randn(100, generator=g)})
    return out


def _count_samples(monkeypatch) -> list[int]:
    """Counts the sample encodes of ``PieceEncoder`` (the chunk encodes go through ``chunks``)."""
    count = [0]
    real = delta_mod.encode

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(delta_mod, "encode", counting)
    return count


@pytest.mark.parametrize("cpu_threads", [1, 4])
def test_incremental_saves_sample_each_piece_every_few_saves(tmp_path, monkeypatch, cpu_threads):
    states = _states(9)
    count = _count_samples(monkeypatch)
    sampled = {}
    for every in (1, 4):
        count[0] = 0
        opts = WriteOptions(chunk_bytes=1 << 18, cpu_threads=cpu_threads, resample_every=every)
        with CheckpointManager(str(tmp_path / f"s{every}"), job="j", policy=INCR, options=opts) as mgr:
            for step, st in enumerate(states, 1):
                mgr.save(step, st, blocking=True)
            assert [mgr.manifest(s).kind for s in (1, 2, 9)] == ["full", "incremental", "incremental"]
            for step in (1, 5, 9):
                got = mgr.restore(step)
                for k, v in states[step - 1].items():
                    assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), (every, step, k)
        sampled[every] = count[0]
    # 8 pieces and a pack: every save samples each of them (twice for an incremental's delta
    # and plain candidates); with a memo a piece is sampled again only every 4th save
    assert sampled[1] >= 9 * 8
    assert sampled[4] <= sampled[1] * 0.45, sampled


def test_a_piece_that_turns_compressible_is_compressed_within_resample_every_saves(tmp_path):
    g = torch.Generator().manual_seed(5)
    noise = torch.randn(1 << 18, generator=g)
    moved = noise + torch.randn(noise.shape, generator=g) * 1e-3
    opts = WriteOptions(chunk_bytes=1 << 20, cpu_threads=1, resample_every=3, pack_below=0)
    with CheckpointManager(str(tmp_path / "s"), job="j", policy=INCR, options=opts) as mgr:
        mgr.save(1, {"x": noise}, blocking=True)
        mgr.save(2, {"x": moved}, blocking=True)  # both candidates sampled: incompressible, raw
        assert mgr.manifest(2).tensors["x"].chunks[0].ref.codec == "raw"
        codecs = []
        for step in range(3, 8):
            mostly_zeros = torch.zeros_like(noise)
            mostly_zeros[step] = float(step)  # changes every save: never same-as-base
            mgr.save(step, {"x": mostly_zeros}, blocking=True)
            codecs.append(mgr.manifest(step).tensors["x"].chunks[0].ref.codec)
            assert torch.equal(mgr.restore(step)["x"], mostly_zeros)
    # the remembered ratio of the noisy piece may keep the zeros raw until the piece's resample,
    # at most 3 saves after step 2's sample (steps 3-5); from then on they are compressed
    first = next(i for i, c in enumerate(codecs) if c != "raw")
    assert first <= 2 and all(c != "raw" for c in codecs[first:]), codecs


def test_dcp_writes_reuse_the_memo_they_are_given(tmp_path, monkeypatch):
    states = _states(5)
    count = _count_samples(monkeypatch)
    opts = WriteOptions(chunk_bytes=1 << 18, cpu_threads=1)
    memo = RatioMemo(every=4)
    per_save = []
    for step, st in enumerate(states, 1):
        count[0] = 0
        kind = "full" if step == 1 else "incremental"
        dcp.save(st, storage_writer=StorageWriter(str(tmp_path / "s"), "j", step, kind=kind, options=opts,
                                                  ratios=memo), no_dist=True)
        per_save.append(count[0])
    # the first incremental samples every piece's two candidates; later ones only the pieces due
    assert per_save[1] >= 8 and sum(per_save[2:]) <= per_save[1] * 1.6, per_save
    assert memo.samples == sum(per_save)


def test_a_fresh_process_seeds_its_memo_from_the_checkpoint_it_restored(tmp_path, monkeypatch):
    """A resumed job's first incremental would sample both candidates of every changed piece
    (an empty memo); the checkpoint it restored says what each compressed piece came to."""
    g = torch.Generator().manual_seed(7)
    states = [{"w": torch.randn(1 << 18, generator=g), "m": torch.randn(1 << 18, generator=g).abs()}]
    for _ in range(2):  # sparse updates: XOR deltas that compress well (no plain candidate needed)
        nxt = {k: v.clone() for k, v in states[-1].items()}
        for v in nxt.values():
            v[torch.randint(0, v.numel(), (2000,), generator=g)] += 1.0
        states.append(nxt)
    opts = WriteOptions(chunk_bytes=1 << 18, cpu_threads=1, incompressible_ratio=0.99, pack_below=0)
    root = tmp_path / "s"
    with CheckpointManager(str(root), job="j", policy=INCR, options=opts) as mgr:
        mgr.save(1, states[0], blocking=True)
        mgr.save(2, states[1], blocking=True)
        assert sum(c.is_delta for t in mgr.manifest(2).tensors.values() for c in t.chunks) >= 4
    count = _count_samples(monkeypatch)
    samples = {}
    for restored in (False, True):
        work = tmp_path / f"resumed-{restored}"
        shutil.copytree(root, work)
        with CheckpointManager(str(work), job="j", policy=INCR, options=opts) as mgr:
            if restored:
                mgr.restore_into({k: torch.zeros_like(v) for k, v in states[1].items()})
            count[0] = 0
            mgr.save(3, states[2], blocking=True)
            samples[restored] = count[0]
            assert mgr.manifest(3).kind == "incremental"
            got = mgr.restore(3)
            assert all(torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)) for k, v in states[2].items())
    assert samples[False] >= 8, samples  # every changed piece's delta sampled
    assert samples[True] == 0, samples  # each one's ratio known from the restored step


def test_a_seeded_ratio_serves_like_a_fresh_sample_and_never_replaces_a_known_one():
    memo = RatioMemo(every=4)
    memo.ratio("known", lambda: 0.9)
    memo.seed([("known", 0.1), ("new", 0.3)])
    assert memo.ratio("known", lambda: 0.5) in (0.9, 0.5)  # its own ratio (or its resample), never the seed
    uses: list[int] = []
    got = [memo.ratio("new", lambda: uses.append(1) or 0.7) for _ in range(9)]
    # served from the seed first (no sample), then resampled every 4th use
    assert got[0] == 0.3 and 1 <= len(uses) <= 3 and got.count(0.3) <= 4, got
    every_time = RatioMemo(every=1)  # resample_every=1: every save samples, seeds or not
    every_time.seed([("new", 0.3)])
    assert every_time.ratio("new", lambda: 0.7) == 0.7
