"""Checkpoints under crashes, corruption, concurrent writers and a flaky store.

* SIGKILL the saving process at random moments: ``restore()`` returns the last acknowledged
  checkpoint (or the one whose commit raced the kill), bit-exact, never a partial one.
* Random bit flips, truncations and deletions of chunks and manifests: every damaged
  checkpoint is detected by ``verify`` (no false alarms), ``restore()`` falls back to the
  newest intact one, bit-exact.
* Two writers committing the same step: exactly one wins, the other gets a clear error.
* Saves and restores through the fault-injecting proxy.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time

import pytest
from harness import child_env, module_command
from harness.crashkit import ckpt_options, ckpt_policy, ckpt_state, states_equal

from trainstore import open_store
from trainstore.checkpoint import CheckpointManager
from trainstore.checkpoint.format import manifest as mf
from trainstore.errors import (
    AlreadyExistsError,
    BackgroundError,
    NoCheckpointError,
    NoValidCheckpointError,
    StoreUnavailableError,
    TrainstoreError,
)

from .conftest import record

JOB = "crash"


def _manager(store) -> CheckpointManager:
    return CheckpointManager(store, JOB, ckpt_policy(), options=ckpt_options())


# -- SIGKILL during saves -------------------------------------------------------------------
def _kill_trial(url: str, start: int, delay: float, env: dict) -> list[int]:
    """Run a saving child from ``start``; SIGKILL it ``delay`` s after READY; the acked steps."""
    proc = subprocess.Popen(module_command("crashkit", "ckpt", url, JOB, str(start), "--no-torch"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while not lines and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    reader.join(10)
    err = proc.stderr.read()
    assert lines and lines[0].strip() == "READY", f"child did not start: {err[-2000:]}"
    assert "Traceback" not in err, err[-3000:]
    return [int(line.split()[1]) for line in lines if line.startswith("ACK ")]


def _crash_trials(url: str, trials: int, seed: int, store_options: dict | None = None) -> dict:
    rng = random.Random(seed)
    env = {**child_env(), "TRAINSTORE_CRASHKIT_STORE_OPTIONS": json.dumps(store_options or {})}
    store = open_store(url, **(store_options or {}))
    acked_total, in_flight_commits, checked = 0, 0, 0
    last_acked = -1
    for trial in range(trials):
        start = last_acked + 1 if last_acked >= 0 else 0
        committed_before = set(mf.list_steps(store, JOB))
        acked = _kill_trial(url, max(start, max(committed_before, default=-1) + 1), rng.uniform(0.0, 0.8), env)
        acked_total += len(acked)
        if acked:
            last_acked = acked[-1]
        mgr = _manager(store)
        if not mf.list_steps(store, JOB):
            assert last_acked < 0, "an acknowledged checkpoint vanished"
            with pytest.raises(NoCheckpointError):  # none committed yet: not "none valid"
                mgr.restore()
            continue
        result = mgr.restore_with_info()
        # The newest checkpoint is the last acknowledged one, or the one in flight whose
        # manifest commit landed just before the kill (acknowledgement not yet printed).
        assert result.step >= last_acked, (trial, result.step, last_acked)
        assert result.step <= max(last_acked, max(committed_before, default=-1)) + 1, (trial, result.step)
        assert not result.skipped, f"trial {trial}: restore skipped {result.skipped}"
        if result.step > last_acked:
            in_flight_commits += 1
            last_acked = result.step
        assert states_equal(result.state, ckpt_state(result.step)), f"trial {trial}: step {result.step} differs"
        # Every checkpoint committed in this trial restores bit-exact (none is partial).
        for step in sorted(set(mf.list_steps(store, JOB)) - committed_before):
            assert states_equal(mgr.restore(step=step), ckpt_state(step)), f"trial {trial}: step {step}"
            checked += 1
        mgr.close()
    return {"trials": trials, "acknowledged_saves": acked_total, "checkpoints_checked": checked,
            "commits_racing_the_kill": in_flight_commits, "restore_success": "100%"}


@pytest.mark.timeout(300)
def test_sigkill_during_saves_local(tmp_path):
    figures = _crash_trials(str(tmp_path / "store"), trials=10, seed=1)  # 200 under make stress
    assert figures["acknowledged_saves"] > 0
    record("ckpt_sigkill_local", **figures)


@pytest.mark.stress
@pytest.mark.timeout(1500)
def test_sigkill_during_saves_local_stress(tmp_path):
    figures = _crash_trials(str(tmp_path / "store"), trials=200, seed=2)
    record("ckpt_sigkill_local_stress", **figures)


@pytest.mark.timeout(300)
def test_sigkill_during_saves_s3(s3_url):
    url, opts = s3_url
    figures = _crash_trials(url, trials=4, seed=3, store_options=opts)
    record("ckpt_sigkill_s3", **figures)


@pytest.mark.stress
@pytest.mark.timeout(1500)
def test_sigkill_during_saves_s3_stress(s3_url):
    url, opts = s3_url
    figures = _crash_trials(url, trials=20, seed=4, store_options=opts)
    record("ckpt_sigkill_s3_stress", **figures)


# -- corruption -----------------------------------------------------------------------------
def _build(store, steps: int) -> None:
    mgr = _manager(store)
    for step in range(steps):
        mgr.save(step, ckpt_state(step), blocking=True)
    mgr.close()


def _damage(store, key: str, kind: str, rng: random.Random) -> bytes:
    """Apply one corruption to ``key``; returns the original bytes."""
    original = bytes(store.get(key))
    if kind == "delete":
        store.delete(key)
    elif kind == "truncate":
        store.put(key, original[:rng.randrange(len(original))])
    elif kind == "bitflip":
        data = bytearray(original)
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        store.put(key, bytes(data))
    return original


def _bad_steps(manifests: dict, key: str, kind: str) -> tuple[set[int], set[int]]:
    """(steps that must be detected as damaged, steps that vanish) after damaging ``key``."""
    bad, gone, broken_manifest = set(), set(), set()
    for step, m in manifests.items():
        if m.key == key:
            (gone if kind == "delete" else bad).add(step)
            broken_manifest.add(step)
        elif key in mf.manifest_chunk_keys(m):  # includes base chunks an incremental uses
            bad.add(step)
    for step, m in manifests.items():  # incrementals whose base *manifest* is damaged or gone
        if m.kind == "incremental" and m.base_step in broken_manifest:
            bad.add(step)
    return bad, gone


def _corruption_trials(store, trials: int, seed: int) -> dict:
    rng = random.Random(seed)
    _build(store, 9)
    mgr = _manager(store)
    manifests = {s: mgr.manifest(s) for s in mgr.steps()}
    chunk_keys = sorted({k for m in manifests.values() for k in mf.manifest_chunk_keys(m)})
    detected = damaged = fallbacks = no_valid = 0
    by_kind: dict[str, int] = {}
    for trial in range(trials):
        kind = rng.choice(["bitflip", "truncate", "delete"])
        target = rng.choice(["manifest", "chunk", "chunk"])
        key = manifests[rng.choice(sorted(manifests))].key if target == "manifest" else rng.choice(chunk_keys)
        original = _damage(store, key, kind, rng)
        by_kind[f"{target}-{kind}"] = by_kind.get(f"{target}-{kind}", 0) + 1
        try:
            bad, gone = _bad_steps(manifests, key, kind)
            assert bad or gone, key
            fresh = _manager(store)
            records = {r.step: r for r in fresh.verify()}
            assert set(records) == set(manifests) - gone, (trial, key, sorted(records))
            flagged = {s for s, r in records.items() if not r.ok}
            assert flagged == bad, f"trial {trial} {kind} {key}: flagged {sorted(flagged)}, damaged {sorted(bad)}"
            damaged += len(bad)
            detected += len(flagged & bad)
            # Forget the verification records: restore must find the damage on its own.
            for s in manifests:
                store.delete(mf.verify_key(JOB, s))
            intact = set(manifests) - bad - gone
            if not intact:  # a chunk every checkpoint shares (dedup): nothing to fall back to
                with pytest.raises(NoValidCheckpointError) as info:
                    _manager(store).restore()
                assert not isinstance(info.value, NoCheckpointError), info.value
                assert all(f"step {s}:" in str(info.value) for s in set(manifests) - gone), info.value
                no_valid += 1
                continue
            expect = max(intact)
            result = _manager(store).restore_with_info()
            assert result.step == expect, (trial, key, result.step, expect, result.skipped)
            assert states_equal(result.state, ckpt_state(expect))
            fallbacks += result.step != max(manifests)
        finally:
            store.put(key, original)
            for s in manifests:
                store.delete(mf.verify_key(JOB, s))
    return {"trials": trials, "damaged_checkpoints": damaged, "detected": detected,
            "detection_rate": f"{100.0 * detected / max(damaged, 1):.1f}%", "false_alarms": 0,
            "restores_that_fell_back": fallbacks, "no_intact_checkpoint_left": no_valid,
            "restore_success": "100%", "by_kind": by_kind}


@pytest.mark.timeout(300)
def test_corruption_detected_and_restore_falls_back(tmp_path):
    figures = _corruption_trials(open_store(str(tmp_path / "store")), trials=20, seed=5)
    assert figures["detected"] == figures["damaged_checkpoints"] > 0
    record("ckpt_corruption", **figures)


@pytest.mark.stress
@pytest.mark.timeout(1500)
def test_corruption_detected_and_restore_falls_back_stress(tmp_path):
    figures = _corruption_trials(open_store(str(tmp_path / "store")), trials=100, seed=6)
    assert figures["detected"] == figures["damaged_checkpoints"]
    record("ckpt_corruption_stress", **figures)


# -- concurrency ----------------------------------------------------------------------------
def test_two_writers_same_step_exactly_one_wins(tmp_path):
    """Two processes' managers commit the same step at the same moment (threads here,
    separate managers and stores): one commit wins, the other reports AlreadyExistsError."""
    url = str(tmp_path / "store")
    for step in range(5):
        barrier = threading.Barrier(2)
        outcomes: list[object] = [None, None]

        def writer(i: int) -> None:
            mgr = _manager(open_store(url))
            state = ckpt_state(100 + i)  # different content per writer
            barrier.wait()
            try:
                mgr.save(step, state, blocking=True)
                outcomes[i] = "won"
            except (AlreadyExistsError, BackgroundError) as exc:
                outcomes[i] = exc
            finally:
                try:
                    mgr.close()
                except TrainstoreError as exc:
                    outcomes[i] = outcomes[i] if outcomes[i] != "won" else exc

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        winners = [i for i, o in enumerate(outcomes) if o == "won"]
        assert len(winners) == 1, outcomes
        loser = outcomes[1 - winners[0]]
        # lost the foreground check (AlreadyExistsError) or the conditional commit (raised as
        # the BackgroundError of that save, caused by AlreadyExistsError): both name the step
        cause = loser.__cause__ if isinstance(loser, BackgroundError) else loser
        assert isinstance(cause, AlreadyExistsError) and f"step {step}" in str(loser), repr(loser)
        restored = _manager(open_store(url)).restore(step=step)
        assert states_equal(restored, ckpt_state(100 + winners[0]))


# -- flaky store ----------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_saves_and_restores_through_faults(fault_proxy, flaky_s3):
    url, opts = flaky_s3
    store = open_store(url, **opts)
    fault_proxy.configure(rate=0.1, seed=21)
    mgr = _manager(store)
    for step in range(6):
        mgr.save(step, ckpt_state(step), blocking=True)
    mgr.close()
    mgr = _manager(open_store(url, **opts))
    for step in range(6):
        assert states_equal(mgr.restore(step=step), ckpt_state(step))
    assert all(r.ok for r in mgr.verify())
    fault_proxy.configure(rate=0.0)
    assert fault_proxy.injected > 5, fault_proxy.counts
    record("ckpt_through_faults", saves=6, restores=6, requests=fault_proxy.requests, faults=fault_proxy.counts)


@pytest.mark.timeout(120)
def test_outage_during_save_is_clear_and_commits_nothing(fault_proxy, flaky_s3):
    url, opts = flaky_s3
    from trainstore.store import RetryOptions

    retry = RetryOptions(max_retries=2, retry_timeout_s=4, init_backoff_s=0.05, max_backoff_s=0.2,
                         timeout_s=0.5, connect_timeout_s=0.5)
    store = open_store(url, **{**opts, "retry": retry})
    mgr = _manager(store)
    mgr.save(0, ckpt_state(0), blocking=True)
    # The outage begins in the middle of the next save, after a few of its requests.
    first = fault_proxy.requests

    def cut() -> None:
        while fault_proxy.requests < first + 4:
            time.sleep(0.001)
        fault_proxy.outage = "reset"

    threading.Thread(target=cut, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(TrainstoreError) as info:
        mgr.save(1, ckpt_state(1), blocking=True)
        mgr.wait()
    elapsed = time.monotonic() - t0
    fault_proxy.outage = False
    assert elapsed < 30, elapsed
    # the background save's failure, raised at the next call: the store was unreachable
    assert isinstance(info.value, BackgroundError) and "step 1" in str(info.value), repr(info.value)
    assert isinstance(info.value.__cause__, StoreUnavailableError), repr(info.value.__cause__)
    assert mf.list_steps(store, JOB) == [0]
    assert states_equal(_manager(store).restore(), ckpt_state(0))
    record("ckpt_outage", seconds_to_error=round(elapsed, 2), error=type(info.value).__name__)
