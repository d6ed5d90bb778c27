"""trainstore.dcp in one process (DCP's no_dist mode): S3, corruption fallback, old call forms."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from harness import pagecache
from torch.distributed.checkpoint.planner import SavePlan

from trainstore.checkpoint import CheckpointManager
from trainstore.checkpoint.format import manifest as mf
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.dcp import StorageReader, StorageWriter
from trainstore.errors import ConfigError
from trainstore.store import open_store

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::UserWarning")]
SMALL = WriteOptions(chunk_bytes=4096, workers=2)
# packs are at most chunk_bytes: chunks large enough that model.w (8448 bytes) is packed
PACKED = WriteOptions(chunk_bytes=16384, workers=2)
CHUNKED = WriteOptions(chunk_bytes=4096, workers=2, pack_below=0)  # small tensors as chunks, not packs


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(64, 33, generator=g), "b": torch.randn(5, generator=g).to(torch.bfloat16)},
            "step": seed, "sched": {"milestones": (1, 2), "name": "cos"}}


def empty() -> dict:
    return {"model": {"w": torch.zeros(64, 33), "b": torch.zeros(5, dtype=torch.bfloat16)}, "step": 0,
            "sched": {"milestones": (0,), "name": ""}}


def same(a: dict, b: dict) -> bool:
    return all(torch.equal(a["model"][k], b["model"][k]) for k in ("w", "b")) and a["step"] == b["step"] \
        and a["sched"] == b["sched"]


def test_s3_roundtrip_with_url_checkpoint_id(s3_url):
    url, opts = s3_url
    store = open_store(url, **opts)
    dcp.save(state(1), storage_writer=StorageWriter(store, "s3job", options=SMALL), checkpoint_id=1, no_dist=True)
    dcp.save(state(1) | {"step": 2}, storage_writer=StorageWriter(url, "other", kind="incremental", options=SMALL,
                                                                   store_options=opts),
             checkpoint_id=f"trainstore:{url}#s3job@2", no_dist=True)
    assert mf.list_steps(store, "s3job") == [1, 2]
    out = empty()
    dcp.load(out, storage_reader=StorageReader(url, "s3job", store_options=opts), no_dist=True)  # newest: 2
    assert same(out, state(1) | {"step": 2})
    m = mf.load_manifest(store, "s3job", 2)
    assert m.kind == "incremental" and all(c.same_as_base for t in m.tensors.values() for c in t.chunks)


@pytest.mark.parametrize("options", [CHUNKED, PACKED], ids=["chunks", "packs"])
def test_manager_restore_falls_back_past_a_corrupt_distributed_checkpoint(tmp_path, options):
    root = str(tmp_path)
    for step in (1, 2):
        dcp.save(state(step), storage_writer=StorageWriter(root, "j", options=options), checkpoint_id=step, no_dist=True)
    store = open_store(root)
    m2 = mf.load_manifest(store, "j", 2)
    pieces = m2.tensors["model.w@0,0"].chunks
    assert [c.is_packed for c in pieces] == ([True] if options is PACKED else [False] * 3)
    key = pieces[-1].ref.key()
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0xFF
    store.put(key, bytes(data))
    with CheckpointManager(root, "j") as mgr:
        assert [r.ok for r in mgr.verify()] == [True, False]
        res = mgr.restore_into(empty())
        assert res.step == 1 and same(res.state, state(1))
        full = mgr.restore(retry_bad=True)  # no target: full tensors; step 2 fails again -> step 1
        assert mgr.last_restore.step == 1 and torch.equal(full["model"]["w"], state(1)["model"]["w"])
        with pytest.raises(ConfigError):  # a target that does not match is not a bad checkpoint
            mgr.restore_into({"model": {"w": torch.zeros(3)}}, step=1)


def test_older_call_forms_and_step_checks(tmp_path):
    w = StorageWriter(str(tmp_path), "j")
    w.reset()  # older torch: reset() without an id
    with pytest.raises(ConfigError, match="no checkpoint step"):
        w.set_up_storage_writer(True)  # older torch: is_coordinator only
    w.reset("j@5")
    w.set_up_storage_writer(True)
    assert w.step == 5 and w.rank == 0
    plans = w.prepare_global_plan([SavePlan([]), SavePlan([])])
    assert [p.storage_data["rank"] for p in plans] == [0, 1] and plans[0].storage_data["kind"] == "full"
    other = StorageWriter(str(tmp_path), "j", 6)
    other.set_up_storage_writer(False, rank=1, use_collectives=True)
    with warnings.catch_warnings():
        with pytest.raises(ConfigError, match="same checkpoint_id"):
            other._write(plans[1], None)  # the coordinator decided step 5
    r = StorageReader(str(tmp_path), "j")
    r.reset()
    assert StorageReader.validate_checkpoint_id("j@5") and not StorageReader.validate_checkpoint_id(None)


def test_items_are_written_in_bounded_groups_and_base_cache_serves_incrementals(tmp_path, monkeypatch):
    import trainstore.dcp.writer as writer_mod
    from trainstore.dcp import BaseCache

    monkeypatch.setattr(writer_mod, "GROUP_BYTES", 8000)  # w (8448 B) and b (10 B) in separate groups
    groups = writer_mod._item_groups
    calls = []
    monkeypatch.setattr(writer_mod, "_item_groups", lambda items, limit: calls.append(g := groups(items, limit)) or g)
    root, cache = str(tmp_path), BaseCache()
    dcp.save(state(1), storage_writer=StorageWriter(root, "j", options=CHUNKED, base_cache=cache), checkpoint_id=1,
             no_dist=True)
    assert len(calls[0]) >= 2
    nxt = state(1)
    nxt["model"]["w"][3:5] += 1e-3
    w = StorageWriter(root, "j", kind="incremental", options=CHUNKED, base_cache=cache)
    store = open_store(root)
    before = {m.key for m in store.list("chunks/")}
    dcp.save(nxt, storage_writer=w, checkpoint_id=2, no_dist=True)
    pieces = [c for t in w.last_manifest.tensors.values() for c in t.chunks]
    assert sum(c.is_delta for c in pieces) == 1 and sum(c.same_as_base for c in pieces) == len(pieces) - 1
    assert len({m.key for m in store.list("chunks/")} - before) == 1  # only the changed piece's delta
    out = empty()
    dcp.load(out, storage_reader=StorageReader(root, "j"), no_dist=True)
    assert same(out, nxt)


def test_small_tensors_of_one_state_entry_share_a_pack(tmp_path):
    """DCP names are dotted fqns (``model.layer0.bias@0``): the small tensors of one top-level
    entry share packs (one object, one fsync) as in the manager's own format, and ``model``
    and ``optim`` never share one (a partial restore of one reads none of the other's)."""
    g = torch.Generator().manual_seed(0)
    sd = {"model": {f"layer{i}": {"bias": torch.randn(16, generator=g), "scale": torch.randn(16, generator=g)}
                    for i in range(12)},
          "optim": {f"p{i}": {"exp_avg": torch.randn(16, generator=g), "step": torch.tensor(float(i))}
                    for i in range(12)}}
    w = StorageWriter(str(tmp_path), "j", options=PACKED)
    dcp.save(sd, storage_writer=w, checkpoint_id=1, no_dist=True)
    refs = {top: {c.ref for n, t in w.last_manifest.tensors.items() if n.startswith(top + ".") for c in t.chunks}
            for top in ("model", "optim")}
    assert len(refs["model"]) == 1 and len(refs["optim"]) == 1 and refs["model"] != refs["optim"]
    out = {"model": {k: {n: torch.zeros_like(v) for n, v in d.items()} for k, d in sd["model"].items()},
           "optim": {k: {n: torch.zeros_like(v) for n, v in d.items()} for k, d in sd["optim"].items()}}
    dcp.load(out, storage_reader=StorageReader(str(tmp_path), "j"), no_dist=True)
    assert all(torch.equal(out[top][k][n], sd[top][k][n]) for top in sd for k in sd[top] for n in sd[top][k])


def test_planning_and_commit_run_with_the_collector_paused_and_the_writes_without(tmp_path):
    """``pause_gc``: the collector is off while DCP plans and the coordinator commits (their
    short-lived objects set off full collections otherwise), on during the writes, and on
    again after ``end_gc_pause`` whether the save succeeded or failed."""
    import gc

    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    seen: dict[str, list[bool]] = {"plan": [], "write": [], "commit": []}

    class Planner(DefaultSavePlanner):
        def create_local_plan(self):
            seen["plan"].append(gc.isenabled())
            return super().create_local_plan()

        def resolve_data(self, write_item):
            seen["write"].append(gc.isenabled())
            return super().resolve_data(write_item)

    class Writer(StorageWriter):
        def finish(self, metadata, results):
            seen["commit"].append(gc.isenabled())
            return super().finish(metadata, results)

    assert gc.isenabled()
    for step in (1, 1):  # the second fails in planning: the step exists
        w = Writer(str(tmp_path), "j", step, options=SMALL, pause_gc=True)
        try:
            dcp.save(state(1), storage_writer=w, planner=Planner(), no_dist=True)
        except BaseException:  # noqa: BLE001 - CheckpointException
            assert step == 1 and seen["commit"] == [False]
        finally:
            w.end_gc_pause()
        assert gc.isenabled()
    assert seen["plan"] == [False, False] and seen["write"] and all(seen["write"]), seen


def test_a_restore_through_a_host_scratch_reads_uncached_chunks_with_o_direct(tmp_path, monkeypatch):
    """Targets DCP's reader cannot fill in place (a CUDA tensor, another sharding, a
    non-contiguous view) are read into a host scratch first: 4 KiB-aligned, so uncached raw
    pieces come off the device with O_DIRECT as in a manager restore."""
    from trainstore.checkpoint.restore import chunkread

    root = str(tmp_path)
    if not pagecache.direct_supported(root):
        pytest.skip("filesystem refuses O_DIRECT")
    w = torch.randn(1024, 1024)
    dcp.save({"w": w}, storage_writer=StorageWriter(root, "j", options=WriteOptions(chunk_bytes=1 << 20)),
             checkpoint_id=1, no_dist=True)
    chunk_files = pagecache.files_under(os.path.join(root, "chunks"))
    pagecache.evict(chunk_files)
    if any(pagecache.cached(p) for p in chunk_files):
        pytest.skip("the kernel kept the chunks cached (fadvise ignored)")
    opened = []
    direct = chunkread._open_direct
    monkeypatch.setattr(chunkread, "_open_direct", lambda p: opened.append(p) or direct(p))
    target = torch.zeros(1024, 1024).t()  # non-contiguous: through the scratch
    dcp.load({"w": target}, storage_reader=StorageReader(root, "j"), no_dist=True)
    assert torch.equal(target, w)
    assert len(opened) >= 4  # the 1 MiB raw pieces were read with O_DIRECT


def test_no_memory_for_the_host_scratch_is_a_capacity_error_naming_the_tensor(tmp_path, monkeypatch):
    import errno

    import trainstore.checkpoint.restore.reader as reader_mod  # the host tensors' allocation (host_tensor)
    from trainstore.errors import CapacityError

    root = str(tmp_path)
    dcp.save({"w": torch.randn(1024, 1024)}, storage_writer=StorageWriter(root, "j"), checkpoint_id=1, no_dist=True)

    def no_memory(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(reader_mod, "empty_tensor", no_memory)
    target = {"w": torch.zeros(1024, 1024).t()}  # non-contiguous: read through a host scratch
    with CheckpointManager(root, job="j") as mgr, pytest.raises(CapacityError, match=r"host memory to read 'w@.*\[1024, 1024\]"):
        mgr.restore_into(target)
    assert not target["w"].any()  # nothing was written
