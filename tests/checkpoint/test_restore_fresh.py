"""Restore into fresh memory (issue 18 item 3): destinations allocated once on huge-page,
4 KiB-aligned host memory, raw pieces read straight into them (O_DIRECT when the chunk is
not in the page cache), every piece still verified; bit-identical results for full,
incremental, partial, compressed and tiered checkpoints; an I/O error or a read that ends
early is a clear error, and nothing half-restored is handed back."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
import torch
from harness import pagecache

from trainstore import CheckpointManager, CheckpointPolicy, open_store
from trainstore.checkpoint.restore import chunkread, reader
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import IntegrityError, StoreError
from trainstore.hostmem import thp_mode
from trainstore.store.tiered import TieredStore

MIB = 1 << 20
#: 1 MiB chunks, no packing threshold games: big tensors span several raw pieces
OPTS = WriteOptions(chunk_bytes=MIB, max_inflight_bytes=8 * MIB)
FULL_ONLY = CheckpointPolicy(full_every=1, incremental_every=None)


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(3 * MIB // 4 + 17, generator=g),  # 3 MiB + 68 B: a ragged last piece
                  "b": torch.randn(33, generator=g),
                  "h": torch.randn(1024, 1024, generator=g).to(torch.bfloat16)},
        "step": seed,
    }


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _assert_same(got: dict, want: dict) -> None:
    for k, v in want["model"].items():
        assert got["model"][k].dtype == v.dtype and got["model"][k].shape == v.shape, k
        assert _bits(got["model"][k]) == _bits(v), k
    assert got["step"] == want["step"]


def _raw_chunk_paths(root: str) -> list[str]:
    out = []
    for d, _, files in os.walk(os.path.join(root, "chunks")):
        out += [os.path.join(d, f) for f in files if f.endswith(".raw")]
    return sorted(out)


def _saved_and_evicted(root: str, state: dict) -> list[str]:
    """Save ``state`` as step 0 under ``root`` and drop its raw chunks from the page cache;
    skips where the filesystem refuses O_DIRECT or the kernel keeps the pages."""
    if not pagecache.direct_supported(root):
        pytest.skip("filesystem refuses O_DIRECT")
    with CheckpointManager(root, job="j", policy=FULL_ONLY, options=OPTS) as mgr:
        mgr.save(0, state, blocking=True)
    paths = _raw_chunk_paths(root)
    pagecache.evict(paths)
    if any(pagecache.cached(p) for p in paths):
        pytest.skip("the kernel kept the chunks cached (fadvise ignored)")
    return paths


def test_full_incremental_partial_and_compressed_restores_are_bit_identical(tmp_path) -> None:
    s0, s1 = _state(0), _state(1)
    s1["model"]["w"] = s0["model"]["w"] + 1e-4  # a small step: XOR deltas
    s1["model"]["w"][: MIB // 4] = s0["model"]["w"][: MIB // 4]  # one piece same as base
    for codec in ("raw", "shuffle-zstd"):
        root = str(tmp_path / codec)
        pol = CheckpointPolicy(full_every=2, incremental_every=1)
        opts = WriteOptions(chunk_bytes=MIB, max_inflight_bytes=8 * MIB, codec=codec, raw_above=1.0)
        with CheckpointManager(root, job="j", policy=pol, options=opts) as mgr:
            mgr.save(0, s0, blocking=True)
            mgr.save(1, s1, blocking=True)
            assert mgr.manifest(1).kind == "incremental"
            assert any(c.is_delta for c in mgr.manifest(1).tensors["model/w"].chunks)
        with CheckpointManager(root, job="j") as mgr:  # a fresh manager: nothing cached
            _assert_same(mgr.restore(step=0), s0)
            _assert_same(mgr.restore(step=1), s1)
            part = mgr.restore(step=1, only="model/w")
            assert _bits(part["model"]["w"]) == _bits(s1["model"]["w"])


def test_tiered_restore_reads_the_hot_tier_and_is_bit_identical(tmp_path) -> None:
    store = TieredStore(open_store(str(tmp_path / "hot")), open_store(str(tmp_path / "durable")))
    s0 = _state(3)
    with CheckpointManager(store, job="j", policy=FULL_ONLY, options=OPTS) as mgr:
        mgr.save(0, s0, blocking=True)
        _assert_same(mgr.restore(step=0), s0)


def test_large_destinations_are_page_aligned_hostmem(tmp_path) -> None:
    s0 = _state(4)
    with CheckpointManager(str(tmp_path), job="j", policy=FULL_ONLY, options=OPTS) as mgr:
        mgr.save(0, s0, blocking=True)
        got = mgr.restore(step=0)
    w = got["model"]["w"]
    assert w.data_ptr() % 4096 == 0  # O_DIRECT-ready; torch.empty gives 64-byte alignment
    if reader.HUGE_PAGES and thp_mode() in ("always", "madvise"):
        assert w.data_ptr() % (2 * MIB) == 0  # starts on a huge page boundary
    assert _bits(w) == _bits(s0["model"]["w"])
    w[5] = 42.0  # an ordinary writable CPU tensor
    assert w[5].item() == 42.0 and torch.equal(w[6:], s0["model"]["w"][6:])


def test_uncached_raw_chunks_are_read_with_o_direct_and_verified(tmp_path) -> None:
    root = str(tmp_path)
    s0 = _state(5)
    paths = _saved_and_evicted(root, s0)
    assert len(paths) >= 3
    with CheckpointManager(root, job="j") as mgr:
        _assert_same(mgr.restore(step=0), s0)
    # read from the device into the tensors: the page cache never saw the whole-block parts
    big = [p for p in paths if os.path.getsize(p) == MIB]
    assert big and not any(pagecache.cached(p) for p in big)


def test_restore_into_reads_uncached_raw_chunks_with_o_direct_too(tmp_path) -> None:
    """``restore_into`` (how a resumed job restores) verifies everything before it writes the
    target, through scratch buffers: those are 4 KiB-aligned like a fresh restore's
    destinations, so uncached raw pieces skip the page cache there too. (Past
    ``scratch_bytes`` pieces are verified, then read again: through the page cache, so that
    the second read comes from memory.)"""
    root = str(tmp_path)
    s0 = _state(8)
    paths = _saved_and_evicted(root, s0)
    target = {"model": {k: torch.zeros_like(v) for k, v in s0["model"].items()}, "step": -1}
    with CheckpointManager(root, job="j") as mgr:
        mgr.restore_into(target)
    _assert_same(target, s0)
    big = [p for p in paths if os.path.getsize(p) == MIB]
    assert big and not any(pagecache.cached(p) for p in big)


def test_corrupt_uncached_piece_is_named_and_restore_falls_back(tmp_path) -> None:
    root = str(tmp_path)
    s0, s1 = _state(6), _state(7)
    with CheckpointManager(root, job="j", policy=FULL_ONLY, options=OPTS) as mgr:
        mgr.save(0, s0, blocking=True)
        old = set(_raw_chunk_paths(root))
        mgr.save(1, s1, blocking=True)
    new = [p for p in _raw_chunk_paths(root) if p not in old and os.path.getsize(p) == MIB]
    victim = new[0]
    with open(victim, "r+b") as f:  # one flipped bit in the middle of an aligned block
        f.seek(MIB // 2)
        b = f.read(1)
        f.seek(MIB // 2)
        f.write(bytes([b[0] ^ 0x10]))
    pagecache.evict([victim])
    with CheckpointManager(root, job="j") as mgr:
        res = mgr.restore_with_info()
        with pytest.raises(IntegrityError, match=os.path.basename(victim)):
            mgr.restore(step=1)
    assert res.step == 0 and res.skipped and os.path.basename(victim) in res.skipped[0][1]
    _assert_same(res.state, s0)


def _faulty_reads(monkeypatch, victim: str, fault: str) -> list[int]:
    """Wrap chunkread.pread_into: reads of ``victim``'s file fail (EIO) or end early (0 bytes); the real read happens for every other file."""
    real = chunkread.pread_into
    hits: list[int] = []
    victim_ino = os.stat(victim).st_ino

    def pread_into(fd, view, offset):
        if os.fstat(fd).st_ino == victim_ino:
            hits.append(offset)
            if fault == "eio":
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return 0
        return real(fd, view, offset)

    monkeypatch.setattr(chunkread, "pread_into", pread_into)
    return hits


def test_eio_during_read_is_a_store_error_naming_the_chunk_and_nothing_changes(tmp_path, monkeypatch) -> None:
    root = str(tmp_path)
    s0, s1 = _state(8), _state(9)
    with CheckpointManager(root, job="j", policy=FULL_ONLY, options=OPTS) as mgr:
        mgr.save(0, s0, blocking=True)
        old = set(_raw_chunk_paths(root))
        mgr.save(1, s1, blocking=True)
    victim = next(p for p in _raw_chunk_paths(root) if p not in old and os.path.getsize(p) == MIB)
    hits = _faulty_reads(monkeypatch, victim, "eio")
    target = _state(10)
    before = {k: _bits(v) for k, v in target["model"].items()}
    with CheckpointManager(root, job="j") as mgr:
        with pytest.raises(StoreError, match=f"I/O error.*{os.path.basename(victim)}"):
            mgr.restore()  # not an integrity failure: no fallback to step 0, nothing returned
        with pytest.raises(StoreError, match=os.path.basename(victim)):
            mgr.restore_into(target)
        assert hits
        assert {k: _bits(v) for k, v in target["model"].items()} == before  # untouched
        monkeypatch.undo()
        assert mgr.restore_with_info().step == 1  # not recorded as bad: the next restore takes it
        _assert_same(mgr.restore(), s1)


def test_read_ending_early_is_detected_and_reread_verified(tmp_path, monkeypatch) -> None:
    root = str(tmp_path)
    s0 = _state(11)
    with CheckpointManager(root, job="j", policy=FULL_ONLY, options=OPTS) as mgr:
        mgr.save(0, s0, blocking=True)
    victim = next(p for p in _raw_chunk_paths(root) if os.path.getsize(p) == MIB)
    hits = _faulty_reads(monkeypatch, victim, "short")
    with CheckpointManager(root, job="j") as mgr:
        got = mgr.restore(step=0)  # the fast path's short read is caught; the store's read repairs it
    assert hits
    _assert_same(got, s0)
    assert np.frombuffer(open(victim, "rb").read(), np.uint8).nbytes == MIB
