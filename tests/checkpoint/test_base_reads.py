"""The base of an incremental that is not in memory (a fresh process: every resumed job's first
incremental) is read like a restore reads (``chunkread.read_base``): straight into a buffer the
writer thread keeps, checked with the piece's read check (xxh3), not through ``ChunkStore.get``
(a fresh buffer per piece, BLAKE3 over it). Corruption is still caught."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from trainstore import digests
from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.restore import chunkread
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.chunks import ChunkStore
from trainstore.dcp import StorageReader, StorageWriter
from trainstore.errors import ChunkCorruptError, TrainstoreError
from trainstore.store import open_store

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::UserWarning")]
POLICY = CheckpointPolicy(full_every=10, incremental_every=1)
OPTS = WriteOptions(chunk_bytes=64 << 10, workers=2, pack_below=0, delta_codec="bytegroup-zstd",
                    incompressible_ratio=0.99)


def _state(scale: float = 1.0) -> dict:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(200_000, generator=g) * scale, "v": torch.randn(50_000, generator=g) * scale}


class _Spy:
    """Counts ``ChunkStore.get`` calls and BLAKE3 hashers made while it is installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gets = 0
        self.blake3 = 0
        get, hasher = ChunkStore.get, digests.hasher

        def spy_get(store, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
            self.gets += 1
            return get(store, *a, **k)

        def spy_hasher(check=None):  # noqa: ANN001, ANN202
            self.blake3 += check is None
            return hasher(check)

        monkeypatch.setattr(ChunkStore, "get", spy_get)
        monkeypatch.setattr(chunkread, "new_hasher", spy_hasher)


def _base_pieces(root: str, step: int) -> list:
    with CheckpointManager(root, job="j") as mgr:
        m = mgr.manifest(step)
    return [c for t in m.tensors.values() for c in t.chunks]


def test_a_fresh_process_incremental_reads_its_base_with_read_checks_not_chunkstore_get(tmp_path, monkeypatch):
    root = str(tmp_path)
    with CheckpointManager(root, job="j", policy=POLICY, options=OPTS) as mgr:
        mgr.save(10, _state(), blocking=True)
    spy = _Spy(monkeypatch)
    nxt = _state(1.0001)
    with CheckpointManager(root, job="j", policy=POLICY, options=OPTS) as mgr:  # nothing in memory
        mgr.save(11, nxt, blocking=True)
        m = mgr.manifest(11)
    assert m.kind == "incremental" and any(c.is_delta for t in m.tensors.values() for c in t.chunks)
    assert spy.gets == 0  # every base piece read by chunkread, not ChunkStore.get
    assert spy.blake3 == 0  # and checked with its read check
    with CheckpointManager(root, job="j") as mgr:
        out = mgr.restore(11)
    assert all(torch.equal(out[k], nxt[k]) for k in nxt)


def test_read_base_reuses_one_buffer_per_thread(tmp_path):
    root = str(tmp_path)
    with CheckpointManager(root, job="j", policy=POLICY, options=OPTS) as mgr:
        mgr.save(10, _state(), blocking=True)
    pieces = _base_pieces(root, 10)
    chunks = ChunkStore(open_store(root))
    seen = []

    def read_two() -> None:
        a = chunkread.read_base(chunks, pieces[0].ref, pieces[0].check)
        pa = np.frombuffer(a, np.uint8).ctypes.data
        assert digests.matches(a, pieces[0].logical_hash(), pieces[0].check)
        b = chunkread.read_base(chunks, pieces[1].ref, pieces[1].check)
        assert digests.matches(b, pieces[1].logical_hash(), pieces[1].check)
        seen.append((pa, np.frombuffer(b, np.uint8).ctypes.data))

    for _ in range(2):
        t = threading.Thread(target=read_two)
        t.start()
        t.join()
    assert len(seen) == 2 and all(pa == pb for pa, pb in seen)  # one buffer per thread, reused


def test_a_corrupt_base_piece_fails_the_incremental_instead_of_storing_a_delta_of_it(tmp_path):
    root = str(tmp_path)
    with CheckpointManager(root, job="j", policy=POLICY, options=OPTS) as mgr:
        mgr.save(10, _state(), blocking=True)
    piece = _base_pieces(root, 10)[0]
    path = open_store(root).local_path(piece.ref.key())
    with open(path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with CheckpointManager(root, job="j", policy=POLICY, options=OPTS) as mgr:
        with pytest.raises(TrainstoreError) as err:
            mgr.save(11, _state(1.0001), blocking=True)
        assert 11 not in mgr.steps()
    assert isinstance(err.value, ChunkCorruptError) or isinstance(err.value.__cause__, ChunkCorruptError)
    assert piece.ref.hash[:12] in str(err.value)


def test_a_dcp_incremental_without_a_base_cache_reads_its_base_with_read_checks(tmp_path, monkeypatch):
    root = str(tmp_path)
    sd = {"model": {"w": torch.randn(400, 256)}}
    dcp.save(sd, storage_writer=StorageWriter(root, "j", options=OPTS), checkpoint_id=1, no_dist=True)
    spy = _Spy(monkeypatch)
    nxt = {"model": {"w": sd["model"]["w"] * 1.0001}}
    w = StorageWriter(root, "j", kind="incremental", options=OPTS)
    dcp.save(nxt, storage_writer=w, checkpoint_id=2, no_dist=True)
    assert any(c.is_delta for t in w.last_manifest.tensors.values() for c in t.chunks)
    assert spy.gets == 0 and spy.blake3 == 0
    out = {"model": {"w": torch.zeros(400, 256)}}
    dcp.load(out, storage_reader=StorageReader(root, "j"), no_dist=True)
    assert torch.equal(out["model"]["w"], nxt["model"]["w"])
