"""Recovery: restore() falls back past corrupt/missing/truncated checkpoints; SIGKILL mid-save."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import ChunkCorruptError, NoCheckpointError, NoValidCheckpointError

pytestmark = pytest.mark.timeout(180)
SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 20)
# without restore-ready copies: a corrupt delta of the newest step must be met (a good copy
# would restore that step from it: test_ready_copies)
POLICY = CheckpointPolicy(full_every=4, incremental_every=1, ready_copies=False)


def _make(tmp_path, steps=6):
    mgr = CheckpointManager(str(tmp_path), job="rec", policy=POLICY, options=SMALL)
    w = torch.randn(3000)
    for step in range(steps):
        w += 0.001 * step
        mgr.save(step, {"w": w.clone(), "step": step}, metrics={"loss": 1.0 / (step + 1)})
    mgr.wait()
    return mgr


def _chunk_path(tmp_path, mgr, step, own=True):
    m = mgr.manifest(step)
    for t in m.tensors.values():
        for c in t.chunks:
            if own and c.same_as_base:
                continue
            return os.path.join(tmp_path, c.ref.key())
    raise AssertionError("no chunk")


def test_corrupt_chunk_falls_back(tmp_path):
    mgr = _make(tmp_path)
    path = _chunk_path(tmp_path, mgr, 5)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    state = mgr.restore()
    assert state["step"] == 4 and mgr.last_restore.step == 4
    assert mgr.last_restore.skipped[0][0] == 5 and "Corrupt" in mgr.last_restore.skipped[0][1]
    # recorded as bad: not retried, unless asked
    assert mf.load_verify_record(mgr.store, "rec", 5).ok is False
    mgr.restore()
    assert "verification recorded" in mgr.last_restore.skipped[0][1]
    with pytest.raises(ChunkCorruptError, match=os.path.basename(path).split(".")[0]):
        mgr.restore(step=5)  # asked for explicitly: the integrity error itself, naming the chunk
    mgr.close()


def test_deleted_chunk_falls_back(tmp_path):
    mgr = _make(tmp_path)
    os.unlink(_chunk_path(tmp_path, mgr, 5))
    assert mgr.restore()["step"] == 4
    assert not mgr.verify(step=5, deep=False)[0].ok
    mgr.close()


def test_truncated_manifest_falls_back(tmp_path):
    mgr = _make(tmp_path)
    path = os.path.join(tmp_path, mf.manifest_key("rec", 5))
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    assert mgr.restore()["step"] == 4
    assert "ManifestError" in mgr.last_restore.skipped[0][1]
    assert [i.status for i in mgr.list()][-1] in ("unreadable", "bad")
    mgr.close()


def test_deleted_base_falls_back_to_older_full(tmp_path):
    mgr = _make(tmp_path, steps=7)  # full 0, inc 1-3, full 4, inc 5-6
    mgr.store.delete(mf.manifest_key("rec", 4))
    assert mgr.restore()["step"] == 3
    reasons = dict(mgr.last_restore.skipped)
    assert "base" in reasons[6] and "base" in reasons[5]
    mgr.close()


def test_nothing_valid_lists_reasons(tmp_path):
    mgr = _make(tmp_path, steps=2)
    for step in (0, 1):
        path = os.path.join(tmp_path, mf.manifest_key("rec", step))
        open(path, "wb").write(b"{")
    with pytest.raises(NoValidCheckpointError, match="step 1: ManifestError.*step 0: ManifestError") as info:
        mgr.restore()
    assert not isinstance(info.value, NoCheckpointError)  # checkpoints exist, none is valid
    mgr.close()


def test_verify_reports_and_records(tmp_path):
    mgr = _make(tmp_path, steps=3)
    records = mgr.verify()
    assert [r.ok for r in records] == [True, True, True]
    assert [i.status for i in mgr.list()] == ["ok", "ok", "ok"]
    mgr.close()


# A zygote process imports torch and trainstore once (seconds on a loaded machine), then forks one
# fresh saving process per round; each forked process is SIGKILLed while it saves. The zygote
# itself never saves and starts no threads, so forking it is safe.
_ZYGOTE = textwrap.dedent("""
    import os, sys, torch
    from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
    from trainstore.checkpoint.save.writer import WriteOptions

    def saver(root):
        mgr = CheckpointManager(root, job="kill", policy=CheckpointPolicy(full_every=3, incremental_every=1),
                                options=WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2))
        latest = mgr.latest_step()
        start = 0 if latest is None else latest + 1
        for step in range(start, start + 1000):
            w = torch.full((20000,), float(step))
            mgr.save(step, {"w": w, "step": step})
            mgr.wait()
            os.write(1, f"{step}\\n".encode())
        os._exit(0)

    root = sys.argv[1]
    print("ready", flush=True)
    for cmd in sys.stdin:
        if cmd.strip() != "go":
            break
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.read(r, 1)  # start only after the parent was told our pid
            try:
                saver(root)
            finally:
                os._exit(1)
        os.close(r)
        print(f"pid {pid}", flush=True)
        os.write(w, b"x")
        os.close(w)
        _, status = os.waitpid(pid, 0)
        print(f"exit {status}", flush=True)
""")

KILL_REPS = 20
LANES = 2  # independent stores killed concurrently: 2 x 10 real SIGKILLs of a saving process


def _kill_lane(root: str, reps: int, seed: int) -> int:
    """``reps`` times: fork a fresh saving process, SIGKILL it at a random point during its
    saves, then check that only complete checkpoints are visible and that the newest one
    restores. Returns the rounds done."""
    rng = random.Random(seed)
    acknowledged = -1
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    zygote = subprocess.Popen([sys.executable, "-c", _ZYGOTE, root], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env, text=True)
    done = 0
    try:
        assert zygote.stdout.readline().strip() == "ready"
        for _ in range(reps):
            zygote.stdin.write("go\n")
            zygote.stdin.flush()
            head, pid = zygote.stdout.readline().split()
            assert head == "pid"
            # wait until the saver acknowledges its first step, then kill it at a random point
            line = zygote.stdout.readline()
            acknowledged = max(acknowledged, int(line))
            time.sleep(rng.uniform(0.0, 0.2))
            os.kill(int(pid), signal.SIGKILL)
            while True:
                line = zygote.stdout.readline()
                if line.startswith("exit"):
                    status = int(line.split()[1])
                    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
                    break
                acknowledged = max(acknowledged, int(line))
            done += 1
            with CheckpointManager(root, job="kill", options=SMALL) as mgr:
                steps = mgr.steps()
                assert steps and steps[-1] >= acknowledged  # nothing acknowledged is lost
                state = mgr.restore()
                assert mgr.last_restore.step == steps[-1] and not mgr.last_restore.skipped
                assert state["step"] == steps[-1] and torch.equal(state["w"], torch.full((20000,), float(steps[-1])))
        with CheckpointManager(root, job="kill", options=SMALL) as mgr:
            assert all(r.ok for r in mgr.verify(deep=True))
    finally:
        zygote.stdin.close()
        try:
            zygote.wait(timeout=30)
        except subprocess.TimeoutExpired:
            zygote.kill()
            zygote.wait()
    return done


@pytest.mark.timeout(300)
def test_sigkill_during_saves_leaves_only_complete_checkpoints(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    per_lane = KILL_REPS // LANES
    with ThreadPoolExecutor(LANES) as pool:
        futs = [pool.submit(_kill_lane, str(tmp_path / f"store{i}"), per_lane, 1234 + i) for i in range(LANES)]
        reps = sum(f.result() for f in futs)
    assert reps >= KILL_REPS


def test_pending_save_finishes_at_interpreter_exit(tmp_path):
    root = str(tmp_path / "store")
    child = ("import sys, torch\nfrom trainstore.checkpoint import CheckpointManager\n"
             "mgr = CheckpointManager(sys.argv[1], job='exit')\n"
             "mgr.save(1, {'w': torch.randn(1 << 20)})\n")  # no wait, no close
    subprocess.run([sys.executable, "-c", child, root], check=True, timeout=60)
    with CheckpointManager(root, job="exit") as mgr:
        assert mgr.steps() == [1]
        assert mgr.restore()["w"].shape == (1 << 20,)
