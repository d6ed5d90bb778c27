"""Opt-in lossy optimizer moments (issue 18 item 5): only AdamW moments are lossy, within the
codec's per-block bound; parameters, counters and the default policy stay bit-exact; the
checkpoint says it is lossy (manifest, restore result, log); verify and corruption detection
work as for any checkpoint; incrementals store lossy moments whole (never as deltas)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch

from trainstore import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.save.lossy import moment_kind
from trainstore.codecs import LOSSY_CODECS
from trainstore.errors import ConfigError, NoValidCheckpointError

pytestmark = pytest.mark.timeout(120)
BLOCK = 256


def _train(steps: int = 3) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(), torch.nn.Linear(300, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        loss = model(torch.randn(16, 64)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def _state(model, opt) -> dict:
    return {"model": model.state_dict(), "optim": opt.state_dict(), "note": "x"}


def _flat(state: dict) -> dict[str, torch.Tensor]:
    """name -> tensor, names as the checkpoint flattens them."""
    out = {f"model/{k}": v for k, v in state["model"].items()}
    for idx, entry in state["optim"]["state"].items():
        for k, v in entry.items():
            out[f"optim/state/{idx}/{k}"] = v
    return out


def _save(tmp_path, mode: str | None, steps=(10,), kind=None) -> tuple[CheckpointManager, dict[str, torch.Tensor]]:
    model, opt = _train()
    pol = CheckpointPolicy(full_every=10, incremental_every=1) if mode is None else \
        CheckpointPolicy(full_every=10, incremental_every=1, optimizer_moments=mode)
    mgr = CheckpointManager(str(tmp_path / "store"), "job", pol)
    expected = {}
    for i, step in enumerate(steps):
        if i:
            opt.step()  # moments and weights move between checkpoints
        mgr.save(step, _state(model, opt), blocking=True)
        expected = {k: v.clone() for k, v in _flat(_state(model, opt)).items()}
    return mgr, expected


def test_default_policy_is_bit_exact_and_not_reported_lossy(tmp_path):
    mgr, expected = _save(tmp_path, None)
    with mgr:
        back = _flat(mgr.restore())
        assert mgr.last_restore.lossy is None and "LOSSY" not in str(mgr.last_restore)
        m = mgr.manifest(10)
        assert "lossy" not in m.metadata
        assert not any(c.ref.codec in LOSSY_CODECS for t in m.tensors.values() for c in t.chunks)
    for name, t in expected.items():
        assert torch.equal(back[name], t), name


def _assert_q8_bound(got: torch.Tensor, want: torch.Tensor, sqrt: bool) -> None:
    """Independent bound: per block of 256, half a log step relative, or the map's floor."""
    x, g = want.double().flatten().numpy(), got.double().flatten().numpy()
    if sqrt:
        x, g = np.sqrt(x), np.sqrt(g)
    octaves, steps = (20, 254) if sqrt else (16, 126)
    for s in range(0, x.size, BLOCK):
        xb, gb = x[s:s + BLOCK], g[s:s + BLOCK]
        amax = np.abs(xb).max()
        bound = np.maximum((2.0 ** (octaves / steps / 2) - 1) * np.abs(xb), amax * 2.0 ** -octaves)
        assert (np.abs(gb - xb) <= bound * (1 + 1e-5)).all()


def test_int8_moments_are_bounded_and_everything_else_exact(tmp_path, caplog):
    mgr, expected = _save(tmp_path, "int8-blockwise")
    with mgr:
        with caplog.at_level(logging.WARNING, logger="trainstore.checkpoint"):
            back = _flat(mgr.restore())
        report = mgr.last_restore.lossy
        moments = sorted(n for n in expected if moment_kind(n))
        assert len(moments) == 8  # exp_avg and exp_avg_sq of 4 parameters
        assert report is not None and sorted(report.tensors) == moments and report.mode == "int8-blockwise"
        assert "LOSSY" in str(mgr.last_restore)
        assert any("LOSSY" in r.getMessage() and "step 10" in r.getMessage() for r in caplog.records)
        m = mgr.manifest(10)
        assert sorted(m.metadata["lossy"]["tensors"]) == moments
        for name, t in m.tensors.items():
            want = {"exp_avg": {"lossy-q8"}, "exp_avg_sq": {"lossy-q8-sqrt"}}.get(moment_kind(name) or "")
            got = {c.ref.codec for c in t.chunks}
            assert got == want if want else not (got & set(LOSSY_CODECS)), name
        moment_raw = sum(expected[n].numel() * 4 for n in moments)
        moment_stored = sum(c.ref.stored for n in moments for c in m.tensors[n].chunks)
        assert moment_stored < 0.27 * moment_raw
        [rec] = mgr.verify(10)
        assert rec.ok, rec.errors
    for name, t in expected.items():
        if moment_kind(name):
            assert not torch.equal(back[name], t)  # really lossy
            _assert_q8_bound(back[name], t, sqrt=name.endswith("_sq"))
        else:
            assert torch.equal(back[name], t), name  # parameters and step counters bit-exact


def test_bf16_moments_within_half_a_bf16_ulp(tmp_path):
    mgr, expected = _save(tmp_path, "bf16")
    with mgr:
        back = _flat(mgr.restore())
        assert mgr.last_restore.lossy.codecs == ("lossy-bf16",)
    for name, t in expected.items():
        if moment_kind(name):
            assert (back[name] - t).abs().le(t.abs() * 2.0 ** -8).all(), name
        else:
            assert torch.equal(back[name], t), name


def test_incremental_stores_lossy_moments_whole(tmp_path):
    mgr, expected = _save(tmp_path, "int8-blockwise", steps=(10, 11))
    with mgr:
        m = mgr.manifest(11)
        assert m.kind == "incremental"
        for name, t in m.tensors.items():
            if moment_kind(name):
                assert all(not c.is_delta and not c.same_as_base for c in t.chunks), name
        assert not any(c.ref.codec in LOSSY_CODECS for n, t in m.tensors.items() if n.startswith("model/")
                       for c in t.chunks)
        back = _flat(mgr.restore())
        assert mgr.last_restore.step == 11 and mgr.last_restore.lossy is not None
        assert all(r.ok for r in mgr.verify())
    for name, t in expected.items():
        if moment_kind(name):
            _assert_q8_bound(back[name], t, sqrt=name.endswith("_sq"))
        else:
            assert torch.equal(back[name], t), name


def test_corrupt_lossy_chunk_is_detected(tmp_path):
    mgr, _ = _save(tmp_path, "int8-blockwise")
    with mgr:
        m = mgr.manifest(10)
        ref = m.tensors["optim/state/0/exp_avg_sq"].chunks[0].ref
        path = os.path.join(str(tmp_path / "store"), ref.key())
        data = bytearray(open(path, "rb").read())
        data[-5] ^= 0x01  # one code byte (codes are stored raw or zstd: both end in code bytes)
        with open(path, "wb") as f:
            f.write(bytes(data))
        [rec] = mgr.verify(10)
        assert not rec.ok and any(ref.hash in e for e in rec.errors), rec.errors
        with pytest.raises(NoValidCheckpointError, match="step 10"):
            mgr.restore()


def test_lease_rewrite_of_a_lossy_chunk_reproduces_it(tmp_path):
    """A GC lease rewrites a chunk a sweep removed from the staged (original) bytes:
    re-encoding them must give the chunk of the recorded hash."""
    mgr, expected = _save(tmp_path, "int8-blockwise")
    with mgr:
        ref = mgr.manifest(10).tensors["optim/state/0/exp_avg"].chunks[0].ref
        before = mgr.chunks.get(ref)
        mgr.chunks.delete_key(ref.key())
        original = expected["optim/state/0/exp_avg"].numpy()
        got = mgr.chunks.put(memoryview(original).cast("B"), ref.codec, 4, digest=ref.hash).ref
        assert (got.hash, got.codec, got.size) == (ref.hash, ref.codec, ref.size)
        assert bytes(mgr.chunks.get(ref)) == bytes(before)


def test_bad_mode_is_rejected():
    with pytest.raises(ConfigError, match="optimizer_moments"):
        CheckpointPolicy(optimizer_moments="int4")
