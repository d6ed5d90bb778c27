"""Codecs: lossless round trips, the legacy blosc2 container, and corrupt input named clearly."""

from __future__ import annotations

import struct
import subprocess
import sys

import blosc2
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from trainstore import codecs, codecs_bytegroup
from trainstore.errors import ChunkCorruptError, ConfigError

DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int64, np.bool_]


@pytest.mark.parametrize("codec", codecs.CODECS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype_with_and_without_out(codec, dtype):
    rng = np.random.default_rng(1)
    a = (rng.standard_normal(100_003) * 10).astype(dtype)
    raw = memoryview(a).cast("B")
    enc = codecs.encode(raw, codec, a.itemsize)
    assert bytes(codecs.decode(enc, codec, a.nbytes)) == a.tobytes()
    out = np.zeros_like(a)
    codecs.decode(enc, codec, a.nbytes, out=memoryview(out).cast("B"))
    assert out.tobytes() == a.tobytes()


@given(data=st.binary(max_size=5000), itemsize=st.sampled_from([1, 2, 3, 4, 8]),
       codec=st.sampled_from(["zstd", "shuffle-zstd", "bytegroup-zstd"]))
@settings(max_examples=60, deadline=None)
def test_round_trip_any_bytes_any_element_size(data, itemsize, codec):
    enc = codecs.encode(data, codec, itemsize)
    assert bytes(codecs.decode(enc, codec, len(data))) == data


def test_zstd_codecs_compress_floats_and_the_shuffle_helps():
    a = (np.random.default_rng(0).standard_normal(1 << 20) * 0.02).astype(np.float32)
    raw = memoryview(a).cast("B")
    plain = len(codecs.encode(raw, "zstd", 4)) / a.nbytes
    shuffled = len(codecs.encode(raw, "shuffle-zstd", 4)) / a.nbytes
    assert shuffled < plain < 1.0


def test_chunks_of_the_earlier_blosc2_container_still_decode():
    a = (np.random.default_rng(2).standard_normal(1 << 18) * 0.02).astype(np.float32)
    legacy = {
        "shuffle-zstd": blosc2.compress2(a, clevel=1, codec=blosc2.Codec.ZSTD, filters=[blosc2.Filter.SHUFFLE], typesize=4),
        "zstd": blosc2.compress2(a, clevel=1, codec=blosc2.Codec.ZSTD, filters=[blosc2.Filter.NOFILTER], typesize=1),
    }
    for codec, stored in legacy.items():
        assert bytes(codecs.decode(stored, codec, a.nbytes)) == a.tobytes()


def _corruptions(enc: bytes) -> dict[str, bytes]:
    return {
        "truncated header": enc[:10],
        "truncated frame": enc[:-7],
        "frame cut to a stub": enc[:40],
        "garbage frame": enc[:24] + b"\x00" * 64,
        "bytes appended": enc + b"\x28\xb5\x2f\xfd" + b"\x00" * 16,
        "header raw size lies": enc[:8] + (5).to_bytes(8, "little") + enc[16:],
        "header frame size lies": enc[:16] + (7).to_bytes(8, "little") + enc[24:],
        "garbage frame, sizes kept": enc[:24] + bytes(len(enc) - 24),
        "unknown version": enc[:3] + b"\x09" + enc[4:],
    }


@pytest.mark.parametrize("case", list(_corruptions(b"x" * 32)))
def test_corrupt_zstd_container_is_a_chunk_corrupt_error_naming_the_chunk(case):
    a = (np.random.default_rng(3).standard_normal(1 << 16) * 0.02).astype(np.float32)
    enc = bytes(codecs.encode(memoryview(a).cast("B"), "shuffle-zstd", 4))
    bad = _corruptions(enc)[case]
    with pytest.raises(ChunkCorruptError, match="chunks/ab12"):
        codecs.decode(bad, "shuffle-zstd", a.nbytes, key="chunks/ab12")
    with pytest.raises(ChunkCorruptError):
        codecs.decode(bad, "shuffle-zstd", a.nbytes, key="chunks/ab12", out=memoryview(bytearray(a.nbytes)))


def test_reference_size_mismatch_and_absurd_sizes_are_rejected_before_decoding():
    enc = codecs.encode(b"abcd" * 1000, "shuffle-zstd", 4)
    with pytest.raises(ChunkCorruptError, match="reference says 3996"):
        codecs.decode(enc, "shuffle-zstd", 3996)
    with pytest.raises(ChunkCorruptError, match="out of bounds"):
        codecs.decode(enc, "shuffle-zstd", 1 << 40)
    with pytest.raises(ChunkCorruptError, match="destination"):
        codecs.decode(enc, "shuffle-zstd", 4000, out=memoryview(bytearray(10)))


def test_bad_codec_names_and_element_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="unknown codec 'gzip'"):
        codecs.encode(b"x", "gzip")
    with pytest.raises(ConfigError, match="element size"):
        codecs.encode(b"x" * 8, "shuffle-zstd", 0)


def _planes_of(enc: bytes) -> list[tuple[int, int]]:
    """(mode, stored size) of every plane of a bytegroup container (mode 0 raw, 1 zstd)."""
    nplanes = enc[6]
    return [struct.unpack_from("<BQ", enc, 16 + 9 * k) for k in range(nplanes)]


def test_bytegroup_keeps_noisy_mantissa_planes_raw_and_codes_the_exponent_plane():
    a = (np.random.default_rng(4).standard_normal(1 << 18) * 0.02).astype(np.float32)
    enc = bytes(codecs.encode(memoryview(a).cast("B"), "bytegroup-zstd", 4))
    planes = _planes_of(enc)
    plane = a.nbytes // 4
    assert [m for m, _ in planes[:3]] == [0, 0, 0]  # low mantissa bytes: raw
    assert planes[3][0] == 1 and planes[3][1] < plane * 0.45  # the exponent byte: ~3 bits of 8
    # the exponent byte holds exactly the 8 exponent bits: 0.02-scaled normals span few of them
    exponents = (a.view(np.uint32) >> 23) & 0xFF
    assert planes[3][1] < plane * (len(np.unique(exponents)).bit_length() + 1) / 8
    assert bytes(codecs.decode(enc, "bytegroup-zstd", a.nbytes)) == a.tobytes()


def test_bytegroup_round_trips_bf16_and_odd_sizes_into_out():
    import torch

    w = torch.randn(3, 100_001).mul(0.02).bfloat16()
    raw = w.view(torch.uint8).numpy().tobytes()
    enc = codecs.encode(raw, "bytegroup-zstd", 2)
    out = bytearray(len(raw))
    codecs.decode(enc, "bytegroup-zstd", len(raw), out=memoryview(out))
    assert bytes(out) == raw
    odd = raw[:-1]  # not whole elements: falls back to one plane
    assert bytes(codecs.decode(codecs.encode(odd, "bytegroup-zstd", 2), "bytegroup-zstd", len(odd))) == odd


def _bytegroup_corruptions(enc: bytes) -> dict[str, bytes]:
    table_end = 16 + 9 * enc[6]
    return {
        "truncated header": enc[:10],
        "truncated table": enc[:table_end - 3],
        "truncated planes": enc[:-5],
        "bytes appended": enc + b"\x00" * 9,
        "other magic": b"TSZ" + enc[3:],
        "unknown version": enc[:3] + b"\x07" + enc[4:],
        "plane count lies": enc[:6] + b"\x03" + enc[7:],
        "element size lies": enc[:4] + b"\x01" + enc[5:],
        "unknown bit swap": enc[:5] + b"\x02" + enc[6:],
        "header raw size lies": enc[:8] + (4).to_bytes(8, "little") + enc[16:],
        "unknown plane mode": enc[:16] + b"\x05" + enc[17:],
        "raw plane size lies": enc[:17] + (5).to_bytes(8, "little") + enc[25:],
        "zstd plane garbage": enc[:table_end] + bytes(len(enc) - table_end),
        "zstd plane size lies": enc[:16 + 28] + (7).to_bytes(8, "little") + enc[16 + 36:],
    }


@pytest.mark.parametrize("case", list(_bytegroup_corruptions(bytes(64))))
def test_corrupt_bytegroup_container_is_a_chunk_corrupt_error_naming_the_chunk(case):
    a = (np.random.default_rng(5).standard_normal(1 << 16) * 0.02).astype(np.float32)
    enc = bytes(codecs.encode(memoryview(a).cast("B"), "bytegroup-zstd", 4))
    assert enc[:3] == codecs_bytegroup.MAGIC and _planes_of(enc)[3][0] == 1
    bad = _bytegroup_corruptions(enc)[case]
    with pytest.raises(ChunkCorruptError, match="chunks/cd34"):
        codecs.decode(bad, "bytegroup-zstd", a.nbytes, key="chunks/cd34")
    with pytest.raises(ChunkCorruptError):
        codecs.decode(bad, "bytegroup-zstd", a.nbytes, key="chunks/cd34", out=memoryview(bytearray(a.nbytes)))


def test_incrementals_default_to_bytegroup_and_earlier_shuffle_zstd_deltas_still_restore(tmp_path):
    import torch

    from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
    from trainstore.checkpoint.save.writer import WriteOptions

    def state(step: int) -> dict:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(1 << 17, generator=g) * 0.02
        moved = torch.randn(1 << 17, generator=torch.Generator().manual_seed(step)) * 1e-4 * step
        return {"w": w + moved, "exp_avg_sq": (moved * moved).add(1e-8)}

    policy = CheckpointPolicy(full_every=100, incremental_every=1)
    small = {"chunk_bytes": 64 << 10, "incompressible_ratio": 0.97}  # deltas kept on 2 cores too
    old = CheckpointManager(str(tmp_path), job="j", policy=policy, options=WriteOptions(delta_codec="shuffle-zstd", **small))
    old.save(0, state(0), blocking=True)
    old.save(1, state(1), blocking=True)
    old.close()
    new = CheckpointManager(str(tmp_path), job="j", policy=policy, options=WriteOptions(**small))
    assert new.options.delta_codec == "bytegroup-zstd"
    new.save(2, state(2), blocking=True)
    suffixes = {p.suffix for p in tmp_path.rglob("*") if p.is_file()}
    assert {".shuffle-zstd", ".bytegroup-zstd"} <= suffixes
    for step in (0, 1, 2):
        got = new.restore(step=step)
        for name, t in state(step).items():
            assert torch.equal(got[name].view(torch.int32), t.view(torch.int32)), (step, name)
    new.close()


def test_blosc2_codecs_release_the_gil():
    """shuffle-lz4 (blosc2) on a save thread must not hold the GIL the training loop needs:
    trainstore's first use of blosc2 turns its release on (set_releasegil returns the old state;
    a fresh process checks it, since other tests share this one's blosc2)."""
    code = ("import blosc2, numpy as np\n"
            "from trainstore import codecs\n"
            "codecs.encode(memoryview(np.zeros(4096, np.float32)).cast('B'), 'shuffle-lz4', 4)\n"
            "print(blosc2.set_releasegil(True))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
