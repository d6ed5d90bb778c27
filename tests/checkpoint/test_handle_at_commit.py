"""A save's handle resolves when its manifest is committed (durable), not when the work after
the commit is done: restore-ready copies and hooks (retention, GC, tiering) run on the save
thread afterwards. The next save still waits for that work (it reads the staging buffers),
``mgr.wait()`` waits for it, and an error in it reaches the next call, not the handle."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from trainstore import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import BackgroundError
from trainstore.store import open_store

pytestmark = pytest.mark.timeout(120)

SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, pack_below=0)
INCR = CheckpointPolicy(full_every=10, incremental_every=1)
HOLD_S = 20.0  # how long post-commit work is held at most (the test releases it sooner)


def _state(step: int) -> dict:
    w = np.random.default_rng(0).standard_normal(3000).astype(np.float32)
    w += np.float32(1e-3) * step * np.random.default_rng(step).standard_normal(3000).astype(np.float32)
    return {"w": w, "step": step}


class Gate:
    """Post-commit work that waits for the test to release it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls: list[int] = []

    def hook(self, info, mgr) -> None:  # noqa: ANN001
        self.calls.append(info.step)
        self.entered.set()
        self.release.wait(HOLD_S)


def test_handle_resolves_at_the_commit_while_a_hook_still_runs(tmp_path):
    gate = Gate()
    with CheckpointManager(str(tmp_path), "job", INCR, options=SMALL, hooks=[gate.hook]) as mgr:
        h = mgr.save(10, _state(10))
        t0 = time.perf_counter()
        info = h.wait(timeout=HOLD_S / 2)  # before the change: TimeoutError (the hook holds it)
        waited = time.perf_counter() - t0
        assert info is not None and info.step == 10 and h.done() and h.info == info
        assert mf.list_steps(open_store(str(tmp_path)), "job") == [10]  # durable: committed
        assert gate.entered.wait(HOLD_S) and not gate.release.is_set()
        assert mgr.pending() == 10  # the save thread still works on step 10
        gate.release.set()
        mgr.wait()
        assert mgr.pending() is None and gate.calls == [10]
    assert waited < HOLD_S / 2


def test_handle_resolves_before_the_restore_ready_copies_are_written(tmp_path):
    """The incremental's copies are written after its commit; its handle does not wait for them."""
    held = threading.Event()
    release = threading.Event()

    def observe(event: str, fields: dict) -> None:
        if event == "ready_copies_written":
            held.set()
            release.wait(HOLD_S)

    with CheckpointManager(str(tmp_path), "job", INCR, options=SMALL, observers=[observe]) as mgr:
        mgr.save(10, _state(10), blocking=True)
        h = mgr.save(11, _state(11))
        info = h.wait(timeout=HOLD_S / 2)
        assert info.step == 11 and info.kind == "incremental"
        assert held.wait(HOLD_S) and mgr.pending() == 11
        release.set()
        mgr.wait()


def test_next_save_waits_for_the_post_commit_work_of_the_previous_one(tmp_path):
    """The restore-ready copies read the staging buffers: the next save must not restage
    into them before the previous save's post-commit work is done, even though its handle
    has resolved. The copies of step 11 then hold step 11's bytes, not step 12's."""
    gate = Gate()
    with CheckpointManager(str(tmp_path), "job", INCR, options=SMALL, hooks=[gate.hook]) as mgr:
        mgr.save(10, _state(10))
        gate.release.set()
        mgr.wait()
        gate.release.clear()
        gate.entered.clear()
        h11 = mgr.save(11, _state(11))
        assert h11.wait(timeout=HOLD_S / 2).step == 11
        assert gate.entered.wait(HOLD_S)
        staged = threading.Event()
        saver = threading.Thread(target=lambda: (mgr.save(12, _state(12)), staged.set()))
        saver.start()
        time.sleep(0.3)
        assert not staged.is_set()  # waits for step 11's hook (on_busy="wait")
        gate.release.set()
        saver.join(HOLD_S)
        assert staged.is_set()
        mgr.wait()
    with CheckpointManager(str(tmp_path), "job", options=SMALL) as mgr:
        for step in (11, 12):
            got = mgr.restore(step=step)
            np.testing.assert_array_equal(got["w"], _state(step)["w"])


def test_a_hook_error_after_the_commit_does_not_fail_the_handle_but_the_next_call(tmp_path):
    def broken(info, mgr) -> None:  # noqa: ANN001
        raise RuntimeError("hook broke")

    mgr = CheckpointManager(str(tmp_path), "job", INCR, options=SMALL, hooks=[broken])
    info = mgr.save(10, _state(10)).wait(timeout=HOLD_S)
    assert info.step == 10  # committed: the handle reports the checkpoint
    with pytest.raises(BackgroundError, match="hook broke"):
        mgr.wait()
    mgr.close()


def test_a_failure_before_the_commit_fails_the_handle(breakable):
    """A save that never commits (a full disk, or a read-only directory) fails its handle."""
    mgr = CheckpointManager(str(breakable.store), "job", INCR, options=SMALL)
    mgr.save(10, _state(10), blocking=True)
    breakable.break_()
    h = mgr.save(11, _state(11))
    with pytest.raises(Exception) as err:  # noqa: PT011 - the store's error, whatever the breakage
        h.wait(timeout=HOLD_S)
    assert not isinstance(err.value, TimeoutError) and h.done()
    breakable.heal()
    with pytest.raises(BackgroundError, match="step 11"):
        mgr.close()
    assert mf.list_steps(open_store(str(breakable.store)), "job") == [10]
