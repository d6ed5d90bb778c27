"""Lifecycle under concurrency and crashes: GC sweeps, retention and alias updates racing
with saves never lose an object a committed checkpoint references; a registry update cut
short by SIGKILL leaves a consistent registry."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
from harness import child_env, module_command
from harness.crashkit import ckpt_options, ckpt_state, states_equal

from trainstore import open_store
from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format import manifest as mf
from trainstore.lifecycle.gc import GcOptions, collect_garbage
from trainstore.lifecycle.registry import Registry
from trainstore.lifecycle.retention import RetentionPolicy, apply_retention

from .conftest import record

JOB = "race"


def _race(url: str, saves: int, seed: int, store_options: dict | None = None) -> dict:
    """A saver commits ``saves`` checkpoints (full + incremental, with dedup) while other
    threads sweep garbage with no grace period, apply retention and move aliases."""
    opts = store_options or {}
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = {"sweeps": 0, "chunks_deleted": 0, "sweeps_reporting_missing": 0, "retention_runs": 0,
              "alias_moves": 0}
    started = time.monotonic()
    rng = random.Random(seed)

    def guard(fn):
        def run():
            try:
                while not stop.is_set():
                    fn()
                    time.sleep(rng.uniform(0, 0.02))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                stop.set()
        return threading.Thread(target=run, daemon=True)

    def sweep():
        report = collect_garbage(open_store(url, **opts), GcOptions(grace=0, max_duration=60))
        counts["sweeps"] += 1
        counts["chunks_deleted"] += report.deleted
        if report.missing:  # a committed checkpoint referencing an absent chunk? check directly
            counts["sweeps_reporting_missing"] += 1
            store = open_store(url, **opts)
            for step in mf.list_steps(store, JOB):
                try:
                    m = mf.load_manifest(store, JOB, step)
                except Exception:  # deleted by retention meanwhile
                    continue
                gone = [k for k in sorted(mf.manifest_chunk_keys(m)) if not store.exists(k)]
                if gone and store.exists(mf.manifest_key(JOB, step)):
                    broken.append((step, gone[:3], report.to_json()))

    def retain():
        apply_retention(open_store(url, **opts), JOB, RetentionPolicy(keep_last=3))
        counts["retention_runs"] += 1

    reg = Registry(open_store(url, **opts))
    registered: set[int] = set()
    broken: list = []

    def alias():
        steps = mf.list_steps(reg.store, JOB)
        if steps and steps[-1] % 5 == 0 and steps[-1] not in registered:  # register some steps only
            registered.add(steps[-1])
            try:
                mv = reg.register(JOB, steps[-1], "racer", aliases=("latest",))
                reg.promote("racer", mv.version)
                counts["alias_moves"] += 1
            except Exception as exc:  # a step deleted by retention between list and register
                if "no checkpoint step" not in str(exc):
                    raise

    threads = [guard(sweep), guard(retain), guard(alias)]
    for t in threads:
        t.start()
    mgr = CheckpointManager(open_store(url, **opts), JOB, CheckpointPolicy(full_every=3, incremental_every=1),
                            options=ckpt_options())
    try:
        for step in range(saves):
            mgr.save(step, ckpt_state(step), blocking=True)
            if errors:
                break
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        mgr.close()
    if errors:
        raise errors[0]
    assert not broken, f"committed checkpoints referenced deleted chunks during the race: {broken[:3]}"
    # Every checkpoint still committed restores bit-exact: nothing it references was lost.
    store = open_store(url, **opts)
    check = CheckpointManager(store, JOB)
    steps = mf.list_steps(store, JOB)
    assert steps and steps[-1] == saves - 1
    for step in steps:
        assert states_equal(check.restore(step=step), ckpt_state(step)), step
    assert all(r.ok for r in check.verify()), [r.errors for r in check.verify() if not r.ok]
    for name, version in reg.aliases("racer").items():
        mv = reg.version("racer", version)
        assert mf.list_steps(store, JOB).count(mv.step) == 1, (name, mv)  # registered steps are kept
    return {"saves": saves, "surviving_checkpoints": len(steps), **counts, "lost_objects": 0,
            "seconds": round(time.monotonic() - started, 1)}


@pytest.mark.timeout(300)
def test_gc_retention_aliases_racing_saves(tmp_path):
    figures = _race(str(tmp_path / "store"), saves=15, seed=1)
    assert figures["sweeps"] > 0 and figures["retention_runs"] > 0
    record("lifecycle_race", **figures)


#: TRAINSTORE_GC_RACE_SCALE=10 runs the long race 10x longer (docs/reliability.md, "GC race, 10x")
GC_RACE_SCALE = int(os.environ.get("TRAINSTORE_GC_RACE_SCALE", "1"))


@pytest.mark.stress
@pytest.mark.timeout(1500 * GC_RACE_SCALE)
def test_gc_retention_aliases_racing_saves_stress(tmp_path, s3_url):
    figures = _race(str(tmp_path / "store"), saves=60 * GC_RACE_SCALE, seed=2)
    record("lifecycle_race_local_stress", scale=GC_RACE_SCALE, **figures)
    url, opts = s3_url
    figures = _race(url, saves=20 * GC_RACE_SCALE, seed=3, store_options=opts)
    record("lifecycle_race_s3_stress", scale=GC_RACE_SCALE, **figures)


def _registry_trials(tmp_path, trials: int, seed: int) -> dict:
    url = str(tmp_path / "store")
    mgr = CheckpointManager(url, "reg")
    for step in range(3):
        mgr.save(step, {"w": np.full(8, step, dtype=np.float32)}, blocking=True)
    mgr.close()
    rng = random.Random(seed)
    acked: list[int] = []
    for _ in range(trials):
        proc = subprocess.Popen(module_command("crashkit", "registry", url, "reg", "model", "3", "--no-torch"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while not lines and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        reader.join(10)
        err = proc.stderr.read()
        assert "Traceback" not in err, err[-2000:]
        acked += [int(x.split()[1]) for x in lines if x.startswith("ACK ")]
        # The registry is consistent after every kill.
        reg = Registry(url)
        versions = [v.version for v in reg.versions("model")] if reg.models() else []
        assert set(acked) <= set(versions), "an acknowledged registration vanished"
        assert versions == list(range(1, len(versions) + 1)), versions
        for name, v in reg.aliases("model").items() if versions else []:
            assert v in versions, (name, v)
            assert reg.get(f"model@{name}").version == v
        if acked:
            assert reg.get("model@stable").version >= acked[-1]
    return {"trials": trials, "acknowledged_registrations": len(acked), "consistent": True}


@pytest.mark.timeout(300)
def test_registry_update_crash(tmp_path):
    figures = _registry_trials(tmp_path, trials=6, seed=1)
    record("registry_crash", **figures)


@pytest.mark.stress
@pytest.mark.timeout(1500)
def test_registry_update_crash_stress(tmp_path):
    figures = _registry_trials(tmp_path, trials=30, seed=2)
    record("registry_crash_stress", **figures)
