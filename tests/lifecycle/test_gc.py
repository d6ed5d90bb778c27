"""Garbage collection: what goes, what stays, and safety against concurrent saves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from trainstore import CheckpointManager, CheckpointPolicy, open_store
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import ConfigError, ManifestError
from trainstore.lifecycle.gc import LEASES, GcOptions, collect_garbage, sweep_markers
from trainstore.lifecycle.retention import RetentionPolicy, delete_checkpoint, retention_hook
from trainstore.store.local import LocalStore

from .helpers import NOW, make_ckpt
from .manifest_refs import needed_by_store, needed_chunks, raw_manifest

NOGRACE = GcOptions(grace=0)
SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, nice=0)


@pytest.fixture
def store(tmp_path):
    s = open_store(str(tmp_path / "s"))
    yield s
    s.close()


def chunk_keys(store):
    return {m.key for m in store.list("chunks/")}


def test_deletes_only_unreferenced_and_reports_bytes(store):
    for s in (1, 2, 3):
        make_ckpt(store, "j", s, created=NOW)
    make_ckpt(store, "k", 1, created=NOW, seed=2)  # another job sharing step 2's chunk
    gone = needed_chunks(raw_manifest(store.root, "j", 1))  # read from the JSON, not with gc's own function
    shared = needed_chunks(raw_manifest(store.root, "k", 1))
    assert shared == needed_chunks(raw_manifest(store.root, "j", 2)) and not gone & shared
    gone_bytes = sum(os.path.getsize(os.path.join(store.root, k)) for k in gone)
    delete_checkpoint(store, "j", 1)
    delete_checkpoint(store, "j", 2)  # its chunk is still referenced by job k
    before = chunk_keys(store)
    dry = collect_garbage(store, NOGRACE, dry_run=True)
    assert dry.dry_run and set(dry.deleted_keys) == gone and chunk_keys(store) == before
    assert not list(store.list("gc/"))  # a dry run writes nothing
    rep = collect_garbage(store, NOGRACE)
    assert set(rep.deleted_keys) == gone and rep.deleted == 1
    assert rep.bytes_reclaimed == gone_bytes > 0
    assert rep.manifests == 2 and rep.jobs == 2 and rep.missing == 0
    assert chunk_keys(store) == before - gone and shared <= chunk_keys(store)
    markers = list(sweep_markers(store))
    assert [m["state"] for m in markers] == ["done"]


def test_grace_period_protects_young_chunks(store):
    make_ckpt(store, "j", 1, created=NOW)
    delete_checkpoint(store, "j", 1)
    rep = collect_garbage(store, GcOptions(grace="1h"))
    assert rep.deleted == 0 and rep.too_young == 1
    rep = collect_garbage(store, GcOptions(grace="1h"), now=lambda: time.time() + 7200)
    assert rep.deleted == 1


def test_unreadable_manifest_stops_gc(store):
    make_ckpt(store, "j", 1, created=NOW)
    store.put(mf.manifest_key("j", 2), b"{not json")
    with pytest.raises(ManifestError, match="gc refuses to run"):
        collect_garbage(store, NOGRACE)
    assert collect_garbage(store, GcOptions(grace=0, ignore_unreadable=True)).deleted == 0


def test_lease_protects_chunks_of_an_inflight_save(store):
    make_ckpt(store, "j", 1, created=NOW)
    keys = sorted(chunk_keys(store))
    delete_checkpoint(store, "j", 1)
    store.put(LEASES + "j-000000000002-x.json",
              ('{"job":"j","step":2,"expires":%f,"chunks":["%s"]}' % (time.time() + 60, keys[0])).encode())
    assert collect_garbage(store, NOGRACE).deleted == 0
    store.put(LEASES + "j-000000000002-x.json",  # expired: a crashed save's lease
              ('{"job":"j","step":2,"expires":%f,"chunks":["%s"]}' % (time.time() - 3600, keys[0])).encode())
    assert collect_garbage(store, NOGRACE).deleted == 1
    assert not list(store.list(LEASES))


def test_save_rewrites_remembered_chunk_that_gc_deleted(tmp_path):
    """The manager's ChunkStore remembers chunks it wrote; after retention + gc removed them,
    saving the same bytes again must not commit a manifest naming missing chunks."""
    root = str(tmp_path / "s")
    state = {"w": np.random.default_rng(0).standard_normal(8192).astype(np.float32)}
    with CheckpointManager(root, "j", CheckpointPolicy(full_every=1, incremental_every=None), options=SMALL) as mgr:
        mgr.save(1, state, blocking=True)
        mgr.save(2, {"w": np.zeros(8192, np.float32)}, blocking=True)
        delete_checkpoint(mgr.store, "j", 1)
        assert collect_garbage(mgr.store, NOGRACE).deleted > 0
        mgr.save(3, state, blocking=True)  # cache: "these chunks exist" - they do not any more
        assert all(r.ok for r in mgr.verify(3, deep=True))
        assert np.array_equal(mgr.restore(3)["w"], state["w"])


def job_pool(job: str) -> list:
    """Five arrays of content unique to ``job`` (no other job keeps its chunks referenced)."""
    seed = int.from_bytes(job.encode(), "little") % (1 << 32)
    return [np.random.default_rng([seed, i]).standard_normal(16384).astype(np.float32) for i in range(5)]


def recurring_state(pool: list, step: int) -> dict:
    """Content recurs every 5 steps (fulls every 10, XOR deltas every 5) while retention keeps
    only 2: saves keep reusing chunks that just became garbage - the case gc must not break."""
    return {"a": pool[step % 5], "step": step}


def _stress(tmp_path, threads: int, procs: int, saves: int, seconds_cap: float) -> None:
    root = str(tmp_path / "s")
    errors: list[BaseException] = []
    stop = threading.Event()

    def saver(job: str) -> None:
        try:
            with CheckpointManager(root, job, CheckpointPolicy(full_every=2, incremental_every=1), options=SMALL,
                                   hooks=[retention_hook(RetentionPolicy(keep_last=2))]) as mgr:
                pool = job_pool(job)
                for step in range(saves):
                    mgr.save(step, recurring_state(pool, step), blocking=True)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    sweeps = []

    def sweeper() -> None:
        s = open_store(root)
        try:
            while not stop.is_set():
                sweeps.append(collect_garbage(s, GcOptions(grace=0, workers=2)))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    child = os.path.join(os.path.dirname(__file__), "gc_child.py")
    children = [subprocess.Popen([sys.executable, child, root, f"proc{i}", str(saves)], env=env,
                                 stdout=subprocess.DEVNULL) for i in range(procs)]
    gc_thread = threading.Thread(target=sweeper)
    gc_thread.start()
    workers = [threading.Thread(target=saver, args=(f"thread{i}",)) for i in range(threads)]
    try:
        for t in workers:
            t.start()
        for t in workers:
            t.join(seconds_cap)
        for c in children:
            assert c.wait(seconds_cap) == 0
    finally:
        stop.set()
        gc_thread.join(seconds_cap)
        for c in children:
            if c.poll() is None:
                c.kill()
    assert not errors, errors
    assert sum(r.deleted for r in sweeps) > 0 and len(sweeps) >= 2  # gc really ran and deleted
    store = open_store(root)
    jobs = mf.list_jobs(store)
    assert len(jobs) == threads + procs
    for job in jobs:
        with CheckpointManager(store, job, options=SMALL) as mgr:
            steps = mgr.steps()
            assert steps[-1] == saves - 1
            recs = mgr.verify(deep=True)
            assert recs and all(r.ok for r in recs), [r.errors for r in recs if not r.ok]
            state = mgr.restore()
            assert np.array_equal(state["a"], job_pool(job)[(saves - 1) % 5])
    assert needed_by_store(root) <= chunk_keys(store)  # every chunk a surviving manifest names is there
    final = collect_garbage(store, NOGRACE)
    assert final.missing == 0
    assert chunk_keys(store) == needed_by_store(root)  # and gc left exactly those


@pytest.mark.timeout(240)
def test_gc_concurrent_with_thread_and_process_saves(tmp_path):
    _stress(tmp_path, threads=2, procs=1, saves=25, seconds_cap=200)


@pytest.mark.stress
@pytest.mark.timeout(900)
def test_gc_stress_many_savers(tmp_path):
    _stress(tmp_path, threads=4, procs=3, saves=120, seconds_cap=800)


def test_a_crashed_sweep_delays_saves_only_until_its_deadline(tmp_path, monkeypatch):
    import trainstore.checkpoint.save.lease as gcmod

    monkeypatch.setattr(gcmod, "CLOCK_SKEW_S", 0.0)
    root = str(tmp_path / "s")
    store = open_store(root)
    # a sweep that died: "running", its heartbeat stops renewing the deadline
    store.put(gcmod.SWEEPS + "%015d-dead.json" % int((time.time() + 3600) * 1000),  # named by its hard deadline
              ('{"state": "running", "started": %f, "deadline": %f}' % (time.time(), time.time() + 1.5)).encode())
    with CheckpointManager(root, "j", options=SMALL) as mgr:
        t = time.perf_counter()
        mgr.save(1, {"w": np.ones(4096, np.float32)}, blocking=True)
        waited = time.perf_counter() - t
        assert 1.0 <= waited < 15, waited  # waited for the deadline, then re-checked its chunks
        t = time.perf_counter()
        mgr.save(2, {"w": np.ones(4096, np.float32)}, blocking=True)
        assert time.perf_counter() - t < 1.0  # past the deadline: no more waiting
        assert all(r.ok for r in mgr.verify(deep=True))


def test_a_sweep_in_another_pid_namespace_is_waited_for(tmp_path, monkeypatch):
    """A live sweep in a container sharing this host name (and boot id) but not the PID
    namespace: its pid means nothing here, so the saver must wait out the deadline instead
    of judging it dead and committing while the sweep may still delete reused chunks."""
    import trainstore.checkpoint.save.lease as gcmod
    from trainstore.liveness import identity

    monkeypatch.setattr(gcmod, "CLOCK_SKEW_S", 0.0)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid with no process behind it here
    foreign = {**identity(), "pid": gone.pid, "pstart": 4242,
               "pidns": os.stat("/proc/self/ns/pid").st_ino + 1}  # as that container's sweep writes it
    root = str(tmp_path / "s")
    store = open_store(root)
    now = time.time()
    store.put(gcmod.SWEEPS + "%015d-foreign.json" % int((now + 3600) * 1000),
              json.dumps({"state": "running", "started": now, "deadline": now + 2.0, **foreign}).encode())
    with CheckpointManager(root, "j", options=SMALL) as mgr:
        t = time.perf_counter()
        mgr.save(1, {"w": np.ones(4096, np.float32)}, blocking=True)
        waited = time.perf_counter() - t
    assert 1.5 <= waited < 15, waited  # waited for the deadline


def _lease(store, chunk_key: str, created: float, expires: float) -> None:
    store.put(LEASES + "j-000000000002-x.json",
              json.dumps({"job": "j", "step": 2, "created": created, "expires": expires,
                          "chunks": [chunk_key]}).encode())


def test_lease_ttl_bounds_a_lease(store):
    """``GcOptions.lease_ttl`` counts from the lease's creation: a lease older than it (plus
    the clock-skew allowance) no longer protects, a younger one does, whatever ``expires`` says."""
    import trainstore.lifecycle.gc as gcmod

    make_ckpt(store, "j", 1, created=NOW)
    (key,) = chunk_keys(store)
    delete_checkpoint(store, "j", 1)
    ttl = 3600.0
    now = time.time()
    _lease(store, key, created=now - ttl + 300, expires=now + 86400)  # 55 min old: live
    assert collect_garbage(store, GcOptions(grace=0, lease_ttl="1h")).deleted == 0
    assert chunk_keys(store) == {key} and list(store.list(LEASES))
    _lease(store, key, created=now - ttl - gcmod.CLOCK_SKEW_S - 60, expires=now + 86400)  # past ttl + skew
    rep = collect_garbage(store, GcOptions(grace=0, lease_ttl="1h"))
    assert rep.deleted == 1 and rep.deleted_keys == [key] and not chunk_keys(store)
    assert not list(store.list(LEASES))  # the expired lease is removed
    with pytest.raises(ConfigError, match="lease_ttl"):
        GcOptions(lease_ttl="1m")  # shorter than a save may legitimately hold its lease


def test_a_save_that_waited_past_the_renewal_age_commits_under_a_fresh_lease(store, monkeypatch):
    """A sweep with ``lease_ttl`` T stops honouring a lease T after its creation. A save that
    waited long for a sweep writes its lease again (and re-checks) before committing, so its
    lease is always younger than ``LEASE_RENEW_S`` (< T minus skew) at the commit."""
    import trainstore.checkpoint.save.lease as gcmod
    from trainstore.chunks import ChunkStore
    from trainstore.liveness import identity

    monkeypatch.setattr(gcmod, "CLOCK_SKEW_S", 0.0)
    monkeypatch.setattr(gcmod, "LEASE_RENEW_S", 0.5)
    m = make_ckpt(store, "j", 1, created=NOW)
    delete_checkpoint(store, "j", 1)
    m2 = mf.Manifest(**{**m.__dict__, "step": 2})
    now = time.time()
    foreign = {**identity(), "pidns": os.stat("/proc/self/ns/pid").st_ino + 1}  # liveness unknown: wait
    store.put(gcmod.SWEEPS + "%015d-other.json" % int((now + 3600) * 1000),
              json.dumps({"state": "running", "started": now, "deadline": now + 1.5, **foreign}).encode())
    t0 = time.time()
    with gcmod.commit_lease(store, ChunkStore(store), m2, None, t0):
        (lease_meta,) = store.list(LEASES)
        lease = json.loads(store.get(lease_meta.key))
        assert time.time() - t0 >= 1.4  # it waited for the sweep's deadline
        assert lease["created"] > now + 1.5, lease  # under a lease written again after the wait ended
        mf.commit_manifest(store, m2)
    assert not list(store.list(LEASES))


class _PausingStore(LocalStore):
    """A real local store that holds a sweep at the start of its second reference listing
    (leases / manifests, whichever comes second), so a test can act between the two."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.listings = 0
        self.paused, self.resume = threading.Event(), threading.Event()

    def list(self, prefix: str = ""):
        if prefix in (LEASES, "jobs/"):
            self.listings += 1
            if self.listings == 2:
                self.paused.set()
                assert self.resume.wait(60)
        return super().list(prefix)


def test_a_save_committing_between_the_sweeps_two_reference_listings_keeps_its_chunks(tmp_path):
    """The interleaving behind the race run's one "referenced chunks absent" (docs/reliability.md):
    a save writes its lease and finds no sweep, a sweep starts and takes its first reference
    listing, the save commits and drops its lease, then the sweep takes the second listing.
    Listing manifests first (gc before 8e08728) saw neither the manifest nor the lease and
    deleted the reused chunk of a committed checkpoint; leases first sees one of them."""
    from trainstore.checkpoint.save.lease import commit_lease
    from trainstore.chunks import ChunkStore

    root = str(tmp_path / "s")
    store = open_store(root)
    m = make_ckpt(store, "j", 1, created=NOW)
    (key,) = chunk_keys(store)
    delete_checkpoint(store, "j", 1)  # its chunk is garbage now ...
    m2 = mf.Manifest(**{**m.__dict__, "step": 2})  # ... and step 2 reuses it (a dedup hit)
    paused = _PausingStore(root)
    reports: list = []
    sweep = threading.Thread(target=lambda: reports.append(collect_garbage(paused, NOGRACE)))
    with commit_lease(store, ChunkStore(store), m2, None, time.time()):  # lease written, no sweep seen
        sweep.start()
        assert paused.paused.wait(60)  # the sweep is between its two listings
        mf.commit_manifest(store, m2)
    assert not list(store.list(LEASES))  # the save dropped its lease
    paused.resume.set()
    sweep.join(60)
    assert reports and reports[0].deleted == 0 and reports[0].deleted_keys == []
    assert chunk_keys(store) == {key}
    with CheckpointManager(root, "j", options=SMALL) as mgr:
        assert [r.ok for r in mgr.verify(2, deep=True)] == [True]


def test_heartbeat_lapse_stops_deletion(store):
    from trainstore.sweeps import SweepMarker

    clock = [1000.0]
    beat = SweepMarker(store, "gc/", max_duration=3600.0, heartbeat=10.0, now=lambda: clock[0])
    beat._renew()
    assert beat.deadline == 1030.0 and beat.may_delete()
    body = json.loads(bytes(memoryview(store.get(beat.key))))
    assert body["state"] == "running" and body["pid"] == os.getpid()  # who sweeps, for liveness checks
    clock[0] = 1025.0  # within the deadline but less than one beat ahead: no new batches
    assert not beat.may_delete()
    beat._renew()
    assert beat.may_delete() and not beat.lapsed
    clock[0] = 1100.0  # the process was paused past its published deadline
    beat._renew()
    assert beat.lapsed and not beat.may_delete()
    with pytest.raises(Exception, match="heartbeat"):
        GcOptions(heartbeat=0)


def test_old_markers_expire(store):
    import json as _json

    import trainstore.lifecycle.gc as gcmod

    old = time.time() - 30 * 86400
    store.put(gcmod.SWEEPS + "000000000000001-a.json", _json.dumps({"state": "done", "finished": old}).encode())
    store.put(gcmod.SWEEPS + "000000000000002-b.json", _json.dumps({"state": "running", "deadline": old}).encode())
    collect_garbage(store, NOGRACE)
    assert [(m["state"], m["pid"]) for m in sweep_markers(store)] == [("done", os.getpid())]  # only its own


def test_a_sigkilled_sweep_on_this_host_does_not_stall_the_next_save(tmp_path):
    """A sweep killed mid-delete leaves its marker "running" with a deadline ~30 s ahead (plus
    60 s of allowed clock skew). A saver on the same host sees the sweeper's process is gone and
    goes straight to re-checking its chunks instead of waiting ~90 s; nothing referenced is lost."""
    root = str(tmp_path / "s")
    store = open_store(root)
    pool = [np.random.default_rng(i).standard_normal(16384).astype(np.float32) for i in range(40)]
    with CheckpointManager(root, "j", CheckpointPolicy(full_every=1), options=SMALL) as mgr:
        for step in range(40):
            mgr.save(step, {"w": pool[step]}, blocking=True)
    for step in range(39):
        delete_checkpoint(store, "j", step)  # ~600 unreferenced chunks: a long, slow sweep
    child = os.path.join(os.path.dirname(__file__), "sweep_child.py")
    proc = subprocess.Popen([sys.executable, child, root], stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("deleting") and int(line.split()[1]) >= 5:
                break
        proc.kill()  # SIGKILL mid-sweep
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    running = [m for m in sweep_markers(store, 0) if m.get("state") == "running"]
    assert running and running[0]["deadline"] > time.time() + 5, running
    with CheckpointManager(root, "j", CheckpointPolicy(full_every=1), options=SMALL) as mgr:
        t = time.perf_counter()
        mgr.save(100, {"w": pool[39], "v": pool[3]}, blocking=True)  # reuses the kept step's chunks
        assert time.perf_counter() - t < 15
        assert all(r.ok for r in mgr.verify(deep=True))
        assert np.array_equal(mgr.restore(step=100)["v"], pool[3])
