"""Restore of XOR-delta pieces (issue 18 item 3): the base is read straight into the
destination and each block XORed with the decoded delta and hashed as it lands
(``delta.DeltaApply`` as ``chunkread.get_into``'s ``on_block``); a read of the base that
fails half-way and is repaired whole, a compressed base, and an incremental restore all give
the exact bytes and hash."""

from __future__ import annotations

import os

import blake3
import numpy as np
import pytest
import torch

from trainstore import CheckpointManager, CheckpointPolicy, open_store
from trainstore.checkpoint.format.delta import DeltaApply
from trainstore.checkpoint.restore import chunkread
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.chunks import ChunkStore

KIB = 1 << 10
N = 3 * (1 << 20) + 12  # several read blocks and a ragged tail (whole float32s)


def _data(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, N, dtype=np.uint8)


def _chunk_path(chunks: ChunkStore, ref) -> str:
    return chunks.store.local_path(ref.key(chunks.prefix))


def _restore_piece(chunks: ChunkStore, delta_ref, base_ref) -> tuple[np.ndarray, str, int]:
    """(result, its hash, bytes the blocks covered before ``hexdigest``)."""
    delta = np.empty(N, np.uint8)
    chunkread.get_into(chunks, delta_ref, memoryview(delta), verify=False)
    out = np.empty(N, np.uint8)
    apply = DeltaApply(delta, out)
    chunkread.get_into(chunks, base_ref, memoryview(out), verify=False, on_block=apply)
    covered = apply.done
    return out, apply.hexdigest(), covered


@pytest.fixture
def pieces(tmp_path):
    chunks = ChunkStore(open_store(str(tmp_path)))
    base, new = _data(1), _data(2)
    new[: N // 2] = base[: N // 2] ^ 1  # a delta that is mostly 0x01 in its first half
    base_ref = chunks.put(base.tobytes(), "raw").ref
    delta_ref = chunks.put((base ^ new).tobytes(), "bytegroup-zstd", itemsize=4).ref
    return chunks, base, new, base_ref, delta_ref


def test_delta_is_applied_and_hashed_block_by_block_as_the_base_lands(pieces, monkeypatch) -> None:
    chunks, _base, new, base_ref, delta_ref = pieces
    monkeypatch.setattr(chunkread, "READ_BLOCK", 256 * KIB)
    out, digest, covered = _restore_piece(chunks, delta_ref, base_ref)
    assert covered == N  # every block went through on_block: no second pass
    assert out.tobytes() == new.tobytes()
    assert digest == blake3.blake3(new.tobytes()).hexdigest()


def test_base_read_failing_half_way_is_repaired_and_the_delta_applied_once(pieces, monkeypatch) -> None:
    """Two blocks are XORed in place, then the read ends early: the store re-reads the base
    whole into the destination, and the delta must be applied again from the start (not
    twice to the first blocks, not only to the rest)."""
    chunks, _base, new, base_ref, delta_ref = pieces
    monkeypatch.setattr(chunkread, "READ_BLOCK", 256 * KIB)
    victim = os.stat(_chunk_path(chunks, base_ref)).st_ino
    real, reads = chunkread.pread_into, []

    def pread_into(fd, view, offset):
        if os.fstat(fd).st_ino == victim:
            reads.append(offset)
            if len(reads) > 2:
                return 0  # the file "shrank": a bad copy, repaired through the store
        return real(fd, view, offset)

    monkeypatch.setattr(chunkread, "pread_into", pread_into)
    out, digest, covered = _restore_piece(chunks, delta_ref, base_ref)
    assert covered == 2 * 256 * KIB and len(reads) == 3
    assert out.tobytes() == new.tobytes()
    assert digest == blake3.blake3(new.tobytes()).hexdigest()


def test_compressed_base_is_decoded_whole_then_the_delta_applied(tmp_path) -> None:
    chunks = ChunkStore(open_store(str(tmp_path)))
    base = np.zeros(N, np.uint8)
    base[::7] = 3  # compressible
    new = base.copy()
    new[1000:2000] ^= 0x55
    base_ref = chunks.put(base.tobytes(), "shuffle-zstd", itemsize=4).ref
    delta_ref = chunks.put((base ^ new).tobytes(), "bytegroup-zstd", itemsize=4).ref
    out, digest, covered = _restore_piece(chunks, delta_ref, base_ref)
    assert covered == 0  # a decode fills the destination whole
    assert out.tobytes() == new.tobytes()
    assert digest == blake3.blake3(new.tobytes()).hexdigest()


def test_delta_apply_rejects_blocks_out_of_order() -> None:
    apply = DeltaApply(np.zeros(16, np.uint8), np.zeros(16, np.uint8))
    apply(0, 8)
    with pytest.raises(ValueError, match="in order"):
        apply(0, 8)


def test_incremental_restore_with_a_base_read_ending_early_is_bit_exact(tmp_path, monkeypatch) -> None:
    """End to end: an incremental of raw full pieces; one base chunk's fast read ends early."""
    root = str(tmp_path)
    g = torch.Generator().manual_seed(3)
    s0 = {"w": torch.randn(3 * (1 << 20) // 4, generator=g)}
    s1 = {"w": s0["w"] * (1 + 1e-4)}
    opts = WriteOptions(chunk_bytes=1 << 20, max_inflight_bytes=8 << 20)
    policy = CheckpointPolicy(full_every=10, incremental_every=1, ready_copies=False)  # the delta path
    with CheckpointManager(root, job="j", policy=policy, options=opts) as mgr:
        mgr.save(0, s0, blocking=True, kind="full")
        mgr.save(1, s1, blocking=True, kind="incremental")
    raw = sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "chunks")) for f in fs
                 if f.endswith(".raw"))
    assert raw, "the full checkpoint stores raw pieces"
    victim = os.stat(raw[0]).st_ino
    monkeypatch.setattr(chunkread, "READ_BLOCK", 256 * KIB)
    real, hits = chunkread.pread_into, []

    def pread_into(fd, view, offset):
        if os.fstat(fd).st_ino == victim:
            hits.append(offset)
            if len(hits) > 1:
                return 0
        return real(fd, view, offset)

    monkeypatch.setattr(chunkread, "pread_into", pread_into)
    with CheckpointManager(root, job="j") as mgr:
        info = mgr.restore_with_info()
    assert info.step == 1 and hits
    assert info.state["w"].view(torch.int32).numpy().tobytes() == s1["w"].view(torch.int32).numpy().tobytes()
