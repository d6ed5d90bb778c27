"""Issue 19 item 2: a background verifier finds corruption within a period, at a bounded read
rate, repairs from another tier, verifies after each tier copy and raises an alert metric."""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pytest
from typer.testing import CliRunner

from trainstore import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.cli.main import app
from trainstore.errors import ConfigError
from trainstore.lifecycle.metrics import CheckpointMetrics
from trainstore.lifecycle.tiering import Tiering, TierPolicy
from trainstore.lifecycle.verifier import BackgroundVerifier, VerifierOptions

SMALL = WriteOptions(chunk_bytes=16384, workers=2, nice=0)
FULL = CheckpointPolicy(full_every=1, incremental_every=None)


def state(step: int, n: int = 8192) -> dict:
    return {"w": np.random.default_rng(step).standard_normal(n).astype(np.float32)}


def own_keys(mgr, step: int) -> list[str]:
    """Chunk keys of ``step`` that no other checkpoint of the job references."""
    others = set()
    for s in mgr.steps():
        if s != step:
            others |= mf.manifest_chunk_keys(mgr.manifest(s))
    return sorted(mf.manifest_chunk_keys(mgr.manifest(step)) - others)


def flip_byte(path: str, pos: int = 100) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x10]))


def wait_for(cond, timeout: float, every: float = 0.02) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "condition not reached in time"
        time.sleep(every)
    return time.monotonic() - t0


def gauge(text: str, name: str, job: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(f'{name}{{job="{job}"}}'))
    return float(line.split()[-1])


@pytest.mark.timeout(120)
def test_corruption_injected_while_running_is_found_within_one_period(tmp_path):
    root = str(tmp_path / "store")
    with CheckpointManager(root, "job", FULL, options=SMALL) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, state(step), blocking=True)
        victim = own_keys(mgr, 3)[0]
        metrics = CheckpointMetrics()
        period = 0.5
        verifier = BackgroundVerifier(mgr.store, "job", period=period, rate_bytes_s=100e6,
                                      observers=[metrics.observe])
        metrics.watch_verifier(verifier, "job")
        with verifier:
            wait_for(lambda: verifier.stats()["sweeps"] >= 1, 30)
            assert [s for s, st in verifier.stats()["newest"] if st == "ok"] == [1, 2, 3]
            assert gauge(metrics.text(), "trainstore_ckpt_verify_alert", "job") == 0.0
            flip_byte(mgr.store.local_path(victim))  # bit rot in the newest checkpoint, on disk
            injected = time.monotonic()
            wait_for(lambda: (r := mf.load_verify_record(mgr.store, "job", 3)) is not None and not r.ok, 30)
            found_after = time.monotonic() - injected
            sweeps_needed = verifier.stats()["sweeps"]
            wait_for(lambda: verifier.stats()["alert"], 30)
        # found by the next sweep: within one period plus that sweep's own duration
        assert found_after <= period + 2 * (verifier.stats()["last_sweep_s"] or 0) + 0.5, found_after
        assert sweeps_needed >= 1
        rec = mf.load_verify_record(mgr.store, "job", 3)
        assert victim in " ".join(rec.errors) and rec.deep
        st = verifier.stats()
        assert st["bad_recent"] == 1 and st["alert"] and dict(st["newest"])[3] == "bad"
        text = metrics.text()
        assert gauge(text, "trainstore_ckpt_verify_alert", "job") == 1.0
        assert gauge(text, "trainstore_ckpt_verify_bad_recent", "job") == 1.0
        assert 'trainstore_ckpt_verifications_total{job="job",outcome="failed"}' in text
        # restore skips the checkpoint the verifier found bad, says why, and loads step 2 exactly
        restored = mgr.restore()
        assert mgr.last_restore.step == 2 and "verification recorded it as bad" in mgr.last_restore.skipped[0][1]
        np.testing.assert_array_equal(restored["w"], state(2)["w"])


@pytest.mark.timeout(120)
def test_reads_are_bounded_by_the_rate(tmp_path):
    with CheckpointManager(str(tmp_path / "store"), "job", FULL, options=SMALL) as mgr:
        mgr.save(1, state(1, n=1 << 18), blocking=True)  # 1 MiB of random float32: ~1 MiB stored
        stored = mgr.manifest(1).stored_bytes
        rate, burst = 512 * 1024, 64 * 1024
        verifier = BackgroundVerifier(mgr.store, "job", VerifierOptions(period=60, rate_bytes_s=rate, burst_bytes=burst))
        t0 = time.monotonic()
        verifier.sweep()
        elapsed = time.monotonic() - t0
    taken = verifier.stats()["verified_bytes"]
    assert taken >= stored > 900_000
    assert elapsed >= (taken - burst) / rate * 0.98, (elapsed, taken)  # ~1.9 s: never faster than the rate
    assert mf.load_verify_record(mgr.store, "job", 1).ok


@pytest.mark.timeout(120)
def test_tiered_corrupt_hot_copy_is_repaired_and_each_tier_copy_is_verified_at_once(tmp_path):
    tiers = Tiering(str(tmp_path / "hot"), f"memory://{uuid.uuid4().hex}", policy=TierPolicy(hot_keep_last=5))
    mgr = tiers.manager("job", policy=FULL, options=SMALL)
    for step in (1, 2):
        mgr.save(step, state(step), blocking=True)
    tiers.wait()
    verifier = BackgroundVerifier(tiers.store, "job", period=3600, rate_bytes_s=100e6)
    tiers.observers.append(verifier.observe)
    victim = own_keys(mgr, 2)[0]
    good = bytes(memoryview(tiers.durable.get(victim)))
    flip_byte(tiers.hot.local_path(victim))
    with verifier:
        wait_for(lambda: verifier.stats()["sweeps"] >= 1, 30)
        assert verifier.stats()["repairs"] >= 1  # the hot copy was replaced from durable
        assert bytes(memoryview(tiers.hot.get(victim))) == good
        assert mf.load_verify_record(tiers.store, "job", 2).ok and not verifier.stats()["alert"]
        # a new save: its durable copy queues it, verified long before the next period (1 h)
        mgr.save(3, state(3), blocking=True)
        tiers.wait()
        wait_for(lambda: mf.load_verify_record(tiers.store, "job", 3) is not None, 30)
        assert mf.load_verify_record(tiers.store, "job", 3).ok
    mgr.close()
    tiers.close()


def test_cli_verify_watch(tmp_path):
    root = str(tmp_path / "store")
    with CheckpointManager(root, "cli", FULL, options=SMALL) as mgr:
        mgr.save(1, state(1), blocking=True)
        mgr.save(2, state(2), blocking=True)
        victim = own_keys(mgr, 2)[0]
    runner = CliRunner()
    r = runner.invoke(app, ["ckpt", "verify", root, "--job", "cli", "--watch", "--period", "0.1", "--rate", "50MB",
                            "--sweeps", "2", "--json"])
    assert r.exit_code == 0, r.stdout
    sweeps = [json.loads(ln) for ln in r.stdout.splitlines() if ln.strip()]
    assert len(sweeps) == 2 and sweeps[-1]["alert"] is False and sweeps[-1]["newest"] == [[1, "ok"], [2, "ok"]]
    flip_byte(f"{root}/{victim}")
    r = runner.invoke(app, ["ckpt", "verify", root, "--job", "cli", "--watch", "--period", "0.1", "--sweeps", "1"])
    assert r.exit_code == 1 and "BAD" in r.stdout and "step 2" in r.stdout
    r = runner.invoke(app, ["ckpt", "verify", root, "--job", "cli", "--watch", "--rate", "fast"])
    assert r.exit_code == 2 and "--rate" in r.output


@pytest.mark.parametrize("kw", [{"period": "soon"}, {"rate_bytes_s": 0}, {"newest": 0}, {"burst_bytes": -1}])
def test_bad_options_are_config_errors(kw):
    with pytest.raises(ConfigError):
        VerifierOptions(**kw)
