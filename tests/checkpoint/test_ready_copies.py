"""Restore-ready copies of the newest incremental (issue 30 item 1, ``checkpoint.format.ready``):
written after the commit, read instead of the deltas, never trusted (a bad or missing copy
falls back to the delta), kept for the newest step only, and never part of a checkpoint
(the durable tier, GC and verification do not see them)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from trainstore import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format.ready import READY_PREFIX
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.lifecycle.gc import GcOptions, collect_garbage
from trainstore.lifecycle.tiering import Tiering, TierPolicy
from trainstore.store import open_store

pytestmark = pytest.mark.timeout(120)

# incompressible_ratio: keep the XOR deltas these copies stand in for (auto on 2 cores: plain pieces)
SMALL = WriteOptions(chunk_bytes=4096, max_inflight_bytes=1 << 16, workers=2, pack_below=0,
                     incompressible_ratio=0.97)
INCR = CheckpointPolicy(full_every=10, incremental_every=1)
N = 3000  # float32: 3 pieces of 4 KiB


def _state(step: int) -> dict:
    """``w`` moves a little every step (XOR deltas); ``frozen`` never changes (same as base)."""
    w = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    w += np.float32(1e-3) * step * np.random.default_rng(step).standard_normal(N).astype(np.float32)
    return {"w": w, "frozen": np.arange(N, dtype=np.int32), "step": step}


def _ready_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / READY_PREFIX).rglob("*.raw")) if (root / READY_PREFIX).exists() else []


def _events(mgr: CheckpointManager, name: str) -> list[dict]:
    seen: list[dict] = []
    mgr.observers.append(lambda event, fields: seen.append(fields) if event == name else None)
    return seen


def _save(root: Path, steps, policy: CheckpointPolicy = INCR) -> list[dict]:
    with CheckpointManager(str(root), "job", policy=policy, options=SMALL) as mgr:
        written = _events(mgr, "ready_copies_written")
        for step in steps:
            mgr.save(step, _state(step), blocking=True)
    return written


def _restore(root: Path, step: int | None = None) -> tuple[dict, list[dict]]:
    with CheckpointManager(str(root), "job", options=SMALL) as mgr:
        reads = _events(mgr, "restore_ready_copies")
        return mgr.restore(step=step), reads


def _same(got: dict, step: int) -> None:
    want = _state(step)
    assert got["step"] == step
    for k in ("w", "frozen"):
        assert got[k].tobytes() == want[k].tobytes(), k


def test_newest_incremental_restores_from_its_copies_older_ones_through_deltas(tmp_path):
    written = _save(tmp_path, range(3))  # full 0, incrementals 1 and 2
    assert [(w["step"], w["bytes"]) for w in written] == [(1, N * 4), (2, N * 4)]  # only w's pieces changed
    files = _ready_files(tmp_path)
    assert len(files) == 3 and all(f.parent.name == f"{2:012d}" for f in files)  # step 1's copies are gone
    got, reads = _restore(tmp_path)
    _same(got, 2)
    assert reads == [{"job": "job", "step": 2, "pieces": 3, "bytes": N * 4, "fallbacks": 0}]
    got, reads = _restore(tmp_path, step=1)
    _same(got, 1)
    assert reads == [{"job": "job", "step": 1, "pieces": 0, "bytes": 0, "fallbacks": 3}]


def test_bad_or_missing_copy_falls_back_to_the_delta(tmp_path):
    _save(tmp_path, range(2))
    files = _ready_files(tmp_path)
    assert len(files) == 3
    data = bytearray(files[0].read_bytes())
    data[100] ^= 0x40  # rots after it was written
    files[0].write_bytes(bytes(data))
    files[1].write_bytes(files[1].read_bytes()[:-8])  # torn
    files[2].unlink()
    got, reads = _restore(tmp_path)
    _same(got, 1)
    assert reads[0]["pieces"] == 0 and reads[0]["fallbacks"] == 3
    with CheckpointManager(str(tmp_path), "job", options=SMALL) as mgr:
        assert [r.ok for r in mgr.verify(1)] == [True]  # the checkpoint itself is whole: the copies are not part of it


def test_a_corrupt_delta_chunk_with_a_good_copy_restores_the_step_and_verify_names_it(tmp_path):
    """The copy is checked against the piece's recorded hash, so the step restores bit-exactly;
    the checkpoint's own chunk is still bad, and verification (which reads the checkpoint,
    never the copies) says so."""
    _save(tmp_path, range(2))
    with CheckpointManager(str(tmp_path), "job", options=SMALL) as mgr:
        piece = mgr.manifest(1).tensors["w"].chunks[0]
    assert piece.is_delta
    path = tmp_path / piece.ref.key()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    got, reads = _restore(tmp_path)
    _same(got, 1)
    assert reads[0]["pieces"] == 3
    with CheckpointManager(str(tmp_path), "job", options=SMALL) as mgr:
        [record] = mgr.verify(1)
    assert not record.ok and piece.ref.hash[:12] in " ".join(record.errors)


def test_restore_into_uses_the_copies(tmp_path):
    _save(tmp_path, range(2))
    target = _state(0)
    with CheckpointManager(str(tmp_path), "job", options=SMALL) as mgr:
        reads = _events(mgr, "restore_ready_copies")
        mgr.restore_into(target)
    _same(target, 1)
    assert reads[0]["pieces"] == 3


def test_a_full_save_drops_the_copies_and_the_policy_can_turn_them_off(tmp_path):
    _save(tmp_path, range(2))
    assert len(_ready_files(tmp_path)) == 3
    _save(tmp_path, [10])  # full (full_every=10), in a new process-like manager
    assert _ready_files(tmp_path) == []
    off = CheckpointPolicy(full_every=10, incremental_every=1, ready_copies=False)
    assert _save(tmp_path, [11, 12], policy=off) == []
    assert _ready_files(tmp_path) == []
    got, reads = _restore(tmp_path)
    _same(got, 12)
    assert reads[0]["fallbacks"] == 3


def test_copies_stay_in_the_hot_tier_and_out_of_gc_and_the_durable_copy(tmp_path):
    hot, durable = tmp_path / "hot", tmp_path / "durable"
    tiers = Tiering(str(hot), str(durable), policy=TierPolicy(hot_keep_last=5, hot_gc_grace=0))
    with tiers.manager("job", policy=INCR, options=SMALL) as mgr:
        for step in range(3):
            mgr.save(step, _state(step), blocking=True)
        tiers.wait()
    assert len(_ready_files(hot)) == 3
    assert _ready_files(durable) == []
    assert not [m.key for m in open_store(str(durable)).list(READY_PREFIX)]
    report = collect_garbage(open_store(str(hot)), GcOptions(grace="0s"))
    assert report.deleted == 0 and len(_ready_files(hot)) == 3
    with tiers.manager("job", options=SMALL) as mgr:
        reads = _events(mgr, "restore_ready_copies")
        _same(mgr.restore(), 2)
    assert reads[0]["pieces"] == 3


def test_a_full_disk_while_copying_leaves_the_checkpoint_committed(breakable):
    """The disk fills right after the commit (real ENOSPC on a tmpfs as root, EACCES via
    chmod otherwise): no copies, a warning, the save succeeds and restores through deltas."""
    root = breakable.store
    with CheckpointManager(str(root), "job", policy=INCR, options=SMALL) as mgr:
        mgr.save(0, _state(0), blocking=True)
        mgr.observers.append(lambda event, fields: breakable.break_() if event == "save_committed" else None)
        written = _events(mgr, "ready_copies_written")
        mgr.save(1, _state(1), blocking=True)  # raises nothing
        mgr.observers.pop(0)
        breakable.heal()
    assert written[0]["bytes"] == 0
    assert _ready_files(root) == []
    assert not any(name.startswith(".tmp") for _, _, names in os.walk(root / READY_PREFIX) for name in names)
    got, reads = _restore(root)
    _same(got, 1)
    assert reads[0]["fallbacks"] == 3


def _moments(step: int) -> dict:
    """``m`` changes completely between steps but compresses (AdamW moments do the first, zeros
    the second, more): its XOR delta against random bytes does not compress, so the incremental
    stores the piece itself with the delta codec - a decode on restore, unless it has a copy."""
    rng = np.random.default_rng(step)
    m = rng.standard_normal(N).astype(np.float32) if step == 0 else np.zeros(N, dtype=np.float32)
    return {"w": _state(step)["w"], "m": m, "step": step}


def test_compressed_pieces_an_incremental_stored_itself_get_copies_too(tmp_path):
    with CheckpointManager(str(tmp_path), "job", policy=INCR, options=SMALL) as mgr:
        written = _events(mgr, "ready_copies_written")
        mgr.save(0, _moments(0), blocking=True)
        mgr.save(1, _moments(1), blocking=True)
        pieces = mgr.manifest(1).tensors["m"].chunks
    assert all(p.base is None and not p.same_as_base and p.ref.codec not in ("raw",) for p in pieces), pieces
    assert written[0]["bytes"] == 2 * N * 4  # w's deltas and m's compressed pieces
    with CheckpointManager(str(tmp_path), "job", options=SMALL) as mgr:
        reads = _events(mgr, "restore_ready_copies")
        got = mgr.restore()
    assert got["m"].tobytes() == _moments(1)["m"].tobytes() and got["w"].tobytes() == _moments(1)["w"].tobytes()
    assert reads[0]["pieces"] == 6 and reads[0]["fallbacks"] == 0
    for f in _ready_files(tmp_path):  # a bad copy of a compressed piece falls back to decoding it
        data = bytearray(f.read_bytes())
        data[7] ^= 0x01
        f.write_bytes(bytes(data))
    with CheckpointManager(str(tmp_path), "job", options=SMALL) as mgr:
        reads = _events(mgr, "restore_ready_copies")
        got = mgr.restore()
    assert got["m"].tobytes() == _moments(1)["m"].tobytes() and reads[0]["fallbacks"] == 6
