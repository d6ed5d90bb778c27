"""A durable tier that is down never fails a hot save (write-back tiering), and a durable gc
never takes a chunk that an in-flight tier copy is about to reference.

* The save's gc lease lives in the tier its commit happens in (hot, in write-back mode);
  the durable copy takes its own lease on the durable tier around copy + manifest commit.
* While the durable S3 bucket is unreachable (fault proxy outage), saves commit to hot and
  restore from hot; the failed copies are reported; once durable is back the tiering engine
  copies them and they restore from durable alone.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from trainstore import CheckpointPolicy, open_store
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import BackgroundError
from trainstore.lifecycle.gc import LEASES, GcOptions, collect_garbage
from trainstore.lifecycle.retention import delete_checkpoint
from trainstore.lifecycle.tiering import Tiering, TierPolicy
from trainstore.store.base import Buffer, ForwardingStore, ObjectMeta
from trainstore.store.tiered import TieredStore

pytestmark = pytest.mark.timeout(180)

SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, nice=0)
FULLS = CheckpointPolicy(full_every=1, incremental_every=None)


def state(step: int) -> dict:
    return {"w": np.random.default_rng(step).standard_normal(5000).astype(np.float32), "step": step}


def test_hot_saves_succeed_while_the_durable_bucket_is_down(tmp_path, fault_proxy, flaky_s3):
    url, opts = flaky_s3
    hot = str(tmp_path / "hot")
    # retry_durable=False: each failed copy is reported (the default retries it: test_durable_outage)
    tiers = Tiering(hot, url, durable_options=opts, policy=TierPolicy(hot_keep_last=5, hot_gc_grace=0,
                                                                      retry_durable=False))
    mgr = tiers.manager("run", policy=FULLS, options=SMALL)
    mgr.save(0, state(0), blocking=True)
    mgr.wait()  # durable
    fault_proxy.outage = "reset"
    for step in (1, 2):
        info = mgr.save(step, state(step), blocking=True).wait()  # committed in hot: no durable call needed
        assert info.step == step
        with pytest.raises(BackgroundError, match=rf"step {step} .*'run'.*durable"):  # the copy failed, reported
            mgr.wait()
    for step in (1, 2):  # restore-ready from hot while durable is down
        got = mgr.restore(step)
        assert np.array_equal(got["w"], state(step)["w"]) and got["step"] == step
    assert not list(tiers.hot.list(LEASES))
    with pytest.raises(BackgroundError, match=r"step 1 .*'run'.*durable"):  # the tiering's own report
        tiers.wait()
    fault_proxy.outage = None
    assert tiers.sync("run") == [1, 2]  # the tiering engine copies what only hot holds
    assert all(s.durable for s in tiers.status("run"))
    assert not list(tiers.durable.list(LEASES))
    mgr.close()
    tiers.close()
    shutil.rmtree(hot)  # the node is lost: both steps restore from durable alone
    fresh = Tiering(str(tmp_path / "hot2"), url, durable_options=opts)
    with fresh.manager("run", options=SMALL) as again:
        for step in (0, 1, 2):
            assert np.array_equal(again.restore(step)["w"], state(step)["w"])
    fresh.close()


class PausingStore(ForwardingStore):
    """A real store (local directory) that runs ``before_commit`` once, right before the
    first manifest ``put_if_absent``: the moment an in-flight tier copy is about to commit."""

    def __init__(self, root: str) -> None:
        super().__init__(open_store(root))
        self.url = "pausing+" + self.inner.url
        self.before_commit: Callable[[], None] | None = None

    def put_if_absent(self, key: str, data: Buffer) -> ObjectMeta:
        hook, self.before_commit = self.before_commit, None
        if hook is not None and key.endswith("manifest.json"):
            hook()
        return self.inner.put_if_absent(key, data)


def _durable_step_zero(tmp_path) -> tuple[PausingStore, Tiering, set[str]]:
    """Step 0 saved and copied to a pausable durable tier; returns the durable store, the
    tiering and the chunk keys of step 0."""
    durable = PausingStore(str(tmp_path / "durable"))
    tiers = Tiering(str(tmp_path / "hot"), durable, policy=TierPolicy(hot_keep_last=5, hot_gc_grace=0))
    with tiers.manager("run", policy=FULLS, options=SMALL) as mgr:
        mgr.save(0, state(0), blocking=True)
        mgr.wait()
    return durable, tiers, mf.manifest_chunk_keys(mf.load_manifest(tiers.hot, "run", 0))


def test_durable_gc_during_a_tier_copy_keeps_the_chunks_it_reuses(tmp_path):
    """The copy finds the chunks in durable already (unreferenced there: the durable step was
    deleted) and skips them; a durable sweep runs right before the copy commits the manifest.
    The copy's durable lease must keep those chunks."""
    durable, tiers, keys = _durable_step_zero(tmp_path)
    delete_checkpoint(durable, "run", 0)  # its chunks stay in durable, referenced by nothing there
    assert keys and all(durable.exists(k) for k in keys)
    sweeps = []
    durable.before_commit = lambda: sweeps.append(collect_garbage(durable, GcOptions(grace=0)))
    tiers.make_durable("run", 0)  # the copy reuses every chunk, the sweep runs before its commit
    assert len(sweeps) == 1 and sweeps[0].deleted == 0, sweeps
    assert all(durable.exists(k) for k in keys)
    assert collect_garbage(durable, GcOptions(grace=0)).deleted == 0  # referenced by the manifest now
    assert not list(durable.list(LEASES))
    tiers.close()
    with Tiering(str(tmp_path / "hot2"), str(tmp_path / "durable")).manager("run", options=SMALL) as again:
        assert np.array_equal(again.restore(0)["w"], state(0)["w"])


def test_durable_copy_waits_for_a_running_durable_sweep(tmp_path):
    """A sweep that listed before the copy's lease was visible is still deleting when the
    copy starts: the copy waits for it, then copies what it deleted."""
    durable, tiers, keys = _durable_step_zero(tmp_path)
    delete_checkpoint(durable, "run", 0)
    listed, go = threading.Event(), threading.Event()

    def progress(what: str, done: int, total: int) -> None:
        if what == "listed chunks":  # the sweep has its marker and chunk listing; it deletes after us
            listed.set()
            go.wait(30)

    sweep = threading.Thread(target=collect_garbage, args=(durable, GcOptions(grace=0, heartbeat=1.0)),
                             kwargs={"progress": progress})
    sweep.start()
    assert listed.wait(30)
    copier = threading.Thread(target=tiers.make_durable, args=("run", 0))
    copier.start()
    copier.join(2.0)
    assert copier.is_alive()  # waits for the running sweep
    go.set()
    sweep.join(30)
    copier.join(30)
    assert not copier.is_alive()
    assert all(durable.exists(k) for k in keys)  # deleted by the sweep, then copied again
    tiers.close()
    with Tiering(str(tmp_path / "hot2"), str(tmp_path / "durable")).manager("run", options=SMALL) as again:
        assert np.array_equal(again.restore(0)["w"], state(0)["w"])


@pytest.fixture
def full_dir(tmp_path) -> Iterator[str]:
    """A directory on a 1 MiB tmpfs, filled up: every write there is a real ENOSPC."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {res.stderr.decode().strip()}")
    try:
        with open(mnt / "filler", "wb") as f:
            try:
                f.write(b"\0" * (2 << 20))
            except OSError:
                pass
        yield str(mnt / "store")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_write_through_save_leases_in_durable_where_it_commits(tmp_path, full_dir):
    """Write-through: the commit is the durable tier's conditional create and hot is a cache
    whose failed fills are dropped; a full hot tier must not fail the save (the lease lives
    in durable, with the commit)."""
    from trainstore import CheckpointManager

    durable = str(tmp_path / "durable")
    store = TieredStore(open_store(full_dir), open_store(durable))
    with CheckpointManager(store, "run", policy=FULLS, options=SMALL) as mgr:
        mgr.save(0, state(0), blocking=True)
        assert not list(store.list(LEASES))
    with CheckpointManager(durable, "run", options=SMALL) as alone:  # durable alone holds it all
        assert np.array_equal(alone.restore(0)["w"], state(0)["w"])


def test_hot_saves_succeed_while_the_archive_is_down(tmp_path, fault_proxy, flaky_s3):
    """The archive is asked at a hot commit only to refuse a step number it holds; while it
    is unreachable the commit proceeds (and the durable copy, which does not need it)."""
    url, opts = flaky_s3
    tiers = Tiering(str(tmp_path / "hot"), str(tmp_path / "durable"), archive=url, archive_options=opts,
                    policy=TierPolicy(hot_keep_last=5, hot_gc_grace=0))
    with tiers.manager("run", policy=FULLS, options=SMALL) as mgr:
        mgr.save(0, state(0), blocking=True)
        fault_proxy.outage = "reset"
        mgr.save(1, state(1), blocking=True)
        mgr.wait()  # committed in hot and copied to durable
        assert np.array_equal(mgr.restore(1)["w"], state(1)["w"])
        fault_proxy.outage = None
        assert [s.tiers for s in tiers.status("run")] == ["hot/durable", "hot/durable"]
    tiers.close()


def test_dcp_incremental_save_on_hot_while_durable_is_down(tmp_path, fault_proxy, flaky_s3):
    """The distributed writer (one process, DCP's no_dist mode) on a write-back tiered store:
    its existence check, its base lookup for an incremental and its commit ask hot only."""
    import torch
    import torch.distributed.checkpoint as dcp

    from trainstore.dcp import StorageReader, StorageWriter

    url, opts = flaky_s3
    store = TieredStore(open_store(str(tmp_path / "hot")), open_store(url, **opts), write_back=True)
    w0 = torch.randn(64, 33, generator=torch.Generator().manual_seed(0))
    dcp.save({"w": w0}, storage_writer=StorageWriter(store, "run", options=SMALL), checkpoint_id=0, no_dist=True)
    fault_proxy.outage = "reset"
    w1 = w0.clone()
    w1[0, :5] += 1
    dcp.save({"w": w1}, storage_writer=StorageWriter(store, "run", kind="incremental", options=SMALL),
             checkpoint_id=1, no_dist=True)
    m = mf.load_manifest(store.hot, "run", 1)
    assert m.kind == "incremental" and m.base_step == 0
    out = {"w": torch.zeros(64, 33)}
    dcp.load(out, storage_reader=StorageReader(store.hot, "run", 1), no_dist=True)
    assert torch.equal(out["w"], w1)
    fault_proxy.outage = None
