"""Durable means durable on a tiered store (issue 14, items 1 and 8).

* A checkpoint whose bytes exist only in the archive tier is still copied to the durable
  tier in full (dedup counts hot and durable only), so it survives the loss of the hot tier.
* A durable copy that fails is raised by the job's manager at its next save/wait/close,
  naming job, step and tier, and ``list()`` shows the checkpoint as not durable.
* ``save()`` on a tiered store makes no call to the durable tier on the caller's thread.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from trainstore import CheckpointPolicy, open_store
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import BackgroundError
from trainstore.lifecycle.gc import GcOptions, collect_garbage
from trainstore.lifecycle.tiering import Tiering, TierPolicy
from trainstore.store.base import Buffer, ObjectMeta, Store

SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, nice=0)
FULLS = CheckpointPolicy(full_every=1, incremental_every=None)


def state(step: int, n: int = 20000) -> dict:
    return {"w": np.random.default_rng(step).standard_normal(n).astype(np.float32)}


@pytest.mark.timeout(120)
def test_checkpoint_reusing_archived_bytes_becomes_durable(tmp_path):
    """The issue's reproduction: archive steps 0-1, gc the durable tier, save step 3 with
    step 0's bytes, lose the hot directory: restore must return step 3."""
    hot, durable, archive = (str(tmp_path / n) for n in ("hot", "durable", "archive"))
    policy = TierPolicy(hot_keep_last=1, archive_after=0, hot_gc_grace=0)
    tiers = Tiering(hot, durable, archive=archive, policy=policy)
    with tiers.manager("run", policy=FULLS, options=SMALL) as mgr:
        for step in range(3):
            mgr.save(step, state(step), blocking=True)
        mgr.wait()
        tiers.wait()
        assert tiers.archive("run") == [0, 1]
        assert collect_garbage(tiers.durable, GcOptions(grace=0)).deleted > 0
        step0_keys = mf.manifest_chunk_keys(mf.load_manifest(tiers.archive_store, "run", 0))
        # precondition: step 0's chunks live only in the archive now
        assert not any(tiers.hot.exists(k) or tiers.durable.exists(k) for k in step0_keys)
        assert all(tiers.archive_store.exists(k) for k in step0_keys)
        mgr.save(3, state(0), blocking=True)
        # dedup counts hot and durable only: the bytes were written again, not borrowed from the archive
        assert all(tiers.hot.exists(k) for k in step0_keys)
    tier_error = None
    try:
        tiers.close()
    except Exception as exc:  # noqa: BLE001 - asserted below, after the restore
        tier_error = exc
    shutil.rmtree(hot)  # the node is lost
    fresh = Tiering(str(tmp_path / "hot2"), durable, archive=archive)
    with fresh.manager("run", options=SMALL) as mgr:
        got = mgr.restore()
        assert mgr.last_restore.step == 3
        assert np.array_equal(got["w"], state(0)["w"])
    fresh.close()
    assert tier_error is None


@pytest.fixture
def full_durable_dir(tmp_path) -> Iterator[str]:
    """A directory on a 1 MiB tmpfs: the durable tier fills up (a real ENOSPC)."""
    mnt = tmp_path / "durable"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {res.stderr.decode().strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.timeout(120)
def test_failed_durable_copy_is_raised_by_the_manager_and_listed(tmp_path, full_durable_dir):
    # retry_durable=False: each failed copy is reported at once (the default retries it: test_durable_outage)
    tiers = Tiering(str(tmp_path / "hot"), full_durable_dir, policy=TierPolicy(hot_gc_grace=0, retry_durable=False))
    big = 600_000  # 2.4 MB of float32 noise (stored raw): more than the durable tier holds
    mgr = tiers.manager("run", policy=FULLS, options=SMALL)
    mgr.save(0, state(0, big), blocking=True)
    with pytest.raises(BackgroundError, match=r"step 0 .*'run'.*durable") as err:  # at wait()
        mgr.wait()
    assert "CapacityError" in str(err.value)
    info = {i.step: i for i in mgr.list()}
    assert info[0].durable is False and info[0].status == "unverified"
    mgr.wait()  # reported once
    # the full durable tier does not fail the next hot commit (its gc lease is in hot only)
    free = lambda: shutil.rmtree(f"{full_durable_dir}/chunks", ignore_errors=True)  # noqa: E731
    mgr.save(1, state(1, big), blocking=True)
    with pytest.raises(Exception):  # noqa: B017 - the tiering's own report of the same failure
        tiers.wait()
    with pytest.raises(BackgroundError, match=r"step 1 .*'run'.*durable"):  # at the next save()
        mgr.save(2, state(2, big))
    assert [i.durable for i in mgr.list()] == [False, False]
    free()
    mgr.save(2, state(2, big), blocking=True)
    with pytest.raises(BackgroundError, match=r"step 2 .*'run'.*durable"):  # at close()
        mgr.close()
    try:
        tiers.close()
    except Exception:  # noqa: BLE001 - reported above already
        pass
    # every step is committed in hot and restores from there
    with Tiering(str(tmp_path / "hot"), full_durable_dir).manager("run", options=SMALL) as again:
        assert np.array_equal(again.restore()["w"], state(2, big)["w"])


def test_list_marks_durable_checkpoints(tmp_path):
    tiers = Tiering(str(tmp_path / "hot"), str(tmp_path / "durable"))
    with tiers.manager("run", policy=FULLS, options=SMALL) as mgr:
        mgr.save(0, state(0), blocking=True)
        mgr.wait()
        assert [(i.step, i.durable) for i in mgr.list()] == [(0, True)]
    tiers.close()


class SlowStore(Store):
    """A real store (a local directory) whose every call first sleeps ``delay`` seconds: a
    durable tier far away. For timing tests only."""

    def __init__(self, root: str) -> None:
        self.inner = open_store(root)
        self.url = "slow+" + self.inner.url
        self.delay = 0.0
        self.calls = 0

    def _slow(self) -> None:
        self.calls += 1
        time.sleep(self.delay)

    def get(self, key: str) -> Buffer:
        self._slow()
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> Buffer:
        self._slow()
        return self.inner.get_range(key, start, length)

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[Buffer]:
        self._slow()
        return self.inner.get_ranges(key, ranges)

    def put(self, key: str, data: Buffer) -> ObjectMeta:
        self._slow()
        return self.inner.put(key, data)

    def put_if_absent(self, key: str, data: Buffer) -> ObjectMeta:
        self._slow()
        return self.inner.put_if_absent(key, data)

    def head(self, key: str) -> ObjectMeta:
        self._slow()
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        self._slow()
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._slow()
        self.inner.delete(key)


@pytest.mark.timeout(120)
def test_save_makes_no_durable_call_on_the_callers_thread(tmp_path):
    stall = 2.0
    slow = SlowStore(str(tmp_path / "durable"))
    tiers = Tiering(str(tmp_path / "hot"), slow, policy=TierPolicy(hot_keep_last=3, hot_gc_grace=0))
    incs = CheckpointPolicy(full_every=10, incremental_every=1)
    x = state(0, 4096)
    with tiers.manager("run", policy=incs, options=SMALL) as mgr:
        mgr.save(0, x, blocking=True)
        mgr.wait()
        slow.delay = stall
        t0 = time.perf_counter()
        h = mgr.save(1, state(1, 4096))  # incremental on the in-memory base
        first = time.perf_counter() - t0
        slow.delay = 0.0
        mgr.wait()
        assert h.wait().kind == "incremental"
    # a fresh manager finds its base in the store: in the background, not on the caller's time
    with tiers.manager("run", policy=incs, options=SMALL) as mgr:
        slow.delay = stall
        t0 = time.perf_counter()
        h = mgr.save(2, state(2, 4096))
        second = time.perf_counter() - t0
        slow.delay = 0.0
        mgr.wait()
        assert h.wait().kind == "incremental" and mgr.manifest(2).base_step == 0
    tiers.close()
    assert first < stall / 4 and second < stall / 4, (first, second)
    with Tiering(str(tmp_path / "hot"), str(tmp_path / "durable")).manager("run") as mgr:
        assert np.array_equal(mgr.restore(2)["w"], state(2, 4096)["w"])


# -- SIGKILL during tier copies, then the hot tier is lost ----------------------------------
STATE_SRC = """
import numpy as np
def tier_state(step):
    base = np.random.default_rng(0).standard_normal(65536).astype(np.float32)
    rng = np.random.default_rng(step)
    lo = int(rng.integers(0, 60000))
    base[lo:lo + 4096] = rng.standard_normal(4096).astype(np.float32)
    return {"w": base, "b": rng.standard_normal(16384).astype(np.float32), "step": step}
"""

TIER_CHILD = STATE_SRC + """
import sys
from trainstore import CheckpointPolicy
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.lifecycle.tiering import Tiering, TierPolicy

hot, durable, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
tiers = Tiering(hot, durable, policy=TierPolicy(hot_keep_last=2, hot_gc_grace=0))
mgr = tiers.manager("run", policy=CheckpointPolicy(full_every=3, incremental_every=1),
                    options=WriteOptions(chunk_bytes=65536, max_inflight_bytes=1 << 20, workers=2))
print("READY", flush=True)
step = start
while True:
    mgr.save(step, tier_state(step))
    mgr.wait()  # returns once the step is in the durable tier: acknowledged durable
    print(f"ACK {step}", flush=True)
    step += 1
"""


def kill_and_lose_hot(tmp_path, rounds: int, seed: int = 0) -> dict:
    """Each round: a child saves through a Tiering until SIGKILLed at a random moment (most
    often inside a durable copy), then its hot directory is deleted. Every step it
    acknowledged durable must restore bit-exactly from the durable tier alone."""
    import random
    import sys
    import threading

    ns: dict = {}
    exec(STATE_SRC, ns)  # noqa: S102 - the same state function as the child's
    tier_state = ns["tier_state"]
    rnd = random.Random(seed)
    durable = str(tmp_path / "durable")
    acked: list[int] = []
    figures = {"rounds": rounds, "acked_durable": 0, "lost": 0, "restored_newest": 0}
    for r in range(rounds):
        hot = str(tmp_path / f"hot{r}")
        start = (max(mf.list_steps(open_store(durable), "run"), default=-1) + 1) if r else 0
        proc = subprocess.Popen([sys.executable, "-c", TIER_CHILD, hot, durable, str(start)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        ready = threading.Event()

        def pump(p=proc, out=lines, ev=ready) -> None:
            for line in p.stdout:
                out.append(line.strip())
                if line.startswith("READY"):
                    ev.set()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        assert ready.wait(120), "\n".join(lines)
        time.sleep(rnd.uniform(0.2, 1.5))
        proc.kill()
        proc.wait()
        reader.join(10)
        assert not any("Traceback" in line for line in lines), "\n".join(lines)
        new = [int(line.split()[1]) for line in lines if line.startswith("ACK ")]
        acked += new
        shutil.rmtree(hot)  # the node is lost
        fresh = Tiering(str(tmp_path / f"empty{r}"), durable)
        with fresh.manager("run") as mgr:
            durable_steps = {i.step for i in mgr.list() if i.durable}
            for step in (acked if r == rounds - 1 else new):  # all of them again after the last round
                if step not in durable_steps or not _restores(mgr, step, tier_state(step)):
                    figures["lost"] += 1
            if acked:
                mgr.restore()
                figures["restored_newest"] += mgr.last_restore.step >= max(acked)
        fresh.close()
        shutil.rmtree(str(tmp_path / f"empty{r}"), ignore_errors=True)
    figures["acked_durable"] = len(acked)
    print(f"[reliability] tiered kill + hot loss: {figures}")
    return figures


def _restores(mgr, step: int, expected: dict) -> bool:
    got = mgr.restore(step)
    return (got["step"] == expected["step"] and np.array_equal(got["w"], expected["w"])
            and np.array_equal(got["b"], expected["b"]))


@pytest.mark.timeout(300)
def test_kill_during_tier_copy_then_lose_hot(tmp_path):
    figures = kill_and_lose_hot(tmp_path, rounds=2)
    assert figures["acked_durable"] > 0 and figures["lost"] == 0
    assert figures["restored_newest"] == 2


@pytest.mark.stress
@pytest.mark.timeout(3600)
def test_kill_during_tier_copy_then_lose_hot_long(tmp_path):
    rounds = 60
    figures = kill_and_lose_hot(tmp_path, rounds=rounds, seed=1)
    assert figures["lost"] == 0 and figures["restored_newest"] == rounds
