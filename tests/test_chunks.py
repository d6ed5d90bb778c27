"""Content-addressed chunks and codecs: round trips, dedup, corruption detection, hostile
references, concurrent puts of one chunk."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from trainstore import open_store
from trainstore.chunks import ChunkRef, ChunkStore, content_hash
from trainstore.codecs import CODECS, MAX_CHUNK_BYTES, CodecConfig, decode, encode
from trainstore.errors import (
    ChunkCorruptError,
    ConfigError,
    IntegrityError,
    ManifestError,
    NotFoundError,
    TrainstoreError,
)

RNG = np.random.default_rng(0)


def weights(n: int, dtype: str) -> np.ndarray:
    """Weight-like values: normal(0, 0.02), the usual init scale of transformer weights."""
    w = RNG.normal(0.0, 0.02, n).astype(np.float32)
    if dtype == "bf16":  # the top half of each float32, as torch.bfloat16 stores it
        return (w.view(np.uint32) >> 16).astype(np.uint16)
    if dtype in ("int8", "int64", "uint8"):
        return (w * 1000).astype(dtype)
    return w.astype(dtype)


DTYPES = ["float32", "bf16", "float16", "float64", "int8", "int64"]


def memory_chunks(**kw) -> ChunkStore:
    return ChunkStore(open_store(f"memory://{uuid.uuid4().hex}"), **kw)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_per_codec_and_dtype(codec, dtype):
    chunks = memory_chunks()
    arr = weights(50_000, dtype)
    res = chunks.put(arr, codec=codec, itemsize=arr.itemsize)
    ref = res.ref
    assert res.written
    assert ref.hash == content_hash(arr.tobytes()) and ref.codec == codec
    assert ref.size == arr.nbytes and ref.itemsize == arr.itemsize
    assert ref.stored == chunks.store.head(ref.key()).size
    assert bytes(memoryview(chunks.get(ref))) == arr.tobytes()
    out = np.empty_like(arr)
    chunks.get(ref, out=memoryview(out).cast("B"))
    assert np.array_equal(out, arr)
    if codec == "raw":
        assert ref.stored == ref.size
    elif dtype in ("float32", "bf16"):
        assert ref.stored < ref.size  # weight-like floats do compress


def test_shuffle_helps_on_floats():
    arr = weights(1 << 18, "float32")
    sizes = {c: len(bytes(memoryview(encode(arr.tobytes(), c, 4)))) for c in CODECS}
    assert sizes["shuffle-zstd"] < sizes["zstd"] < sizes["raw"]


@pytest.mark.parametrize("codec", CODECS)
def test_ragged_length_and_empty_chunks(codec):
    chunks = memory_chunks()
    for data in (b"", b"abc", bytes(range(7)) * 3):  # not a multiple of itemsize 4
        ref = chunks.put(data, codec=codec, itemsize=4).ref
        assert bytes(memoryview(chunks.get(ref))) == data


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=5000), codec=st.sampled_from(CODECS), itemsize=st.sampled_from([1, 2, 4, 8]))
def test_roundtrip_property(data, codec, itemsize):
    chunks = memory_chunks()
    ref = chunks.put(data, codec=codec, itemsize=itemsize).ref
    assert bytes(memoryview(chunks.get(ref))) == data
    assert ChunkRef.from_json(ref.to_json()) == ref


# -- dedup ------------------------------------------------------------------------------------

def test_identical_content_is_stored_once(any_store):
    chunks = ChunkStore(any_store)
    a = weights(10_000, "float32")
    first = chunks.put(a, itemsize=4)
    second = chunks.put(a.copy(), itemsize=4)
    assert first.written and not second.written
    assert first.ref == second.ref
    other = chunks.put(weights(10_000, "float32"), itemsize=4)
    assert other.written and other.ref.hash != first.ref.hash
    assert len(list(chunks.list_keys())) == 2
    # A fresh ChunkStore (another process) dedups through the store, not a local cache.
    again = ChunkStore(any_store).put(a, itemsize=4)
    assert not again.written and again.ref == first.ref
    # The same content under another codec is another object (its bytes differ).
    raw = chunks.put(a, codec="raw", itemsize=4)
    assert raw.written and raw.ref.hash == first.ref.hash
    keys = sorted(k for k, _, _ in chunks.list_keys())
    assert len(keys) == 3
    assert all(k.startswith("chunks/") for k in keys)
    assert sorted(m.key for m in any_store.list("")) == keys  # nothing else written


def test_concurrent_puts_of_the_same_content(any_store):
    chunks = ChunkStore(any_store)
    data = weights(20_000, "bf16")
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(chunks.put, data, itemsize=2) for _ in range(12)]
        refs = {f.result().ref for f in futures}
    assert len(refs) == 1
    assert len(list(chunks.list_keys())) == 1
    assert bytes(memoryview(chunks.get(refs.pop()))) == data.tobytes()


def test_layout():
    chunks = memory_chunks()
    ref = chunks.put(b"layout", codec="zstd").ref
    assert ref.key() == f"chunks/{ref.hash[:2]}/{ref.hash}.zstd"
    other = ChunkStore(chunks.store, prefix="/custom/pfx/")
    assert other.put(b"layout", codec="zstd").ref.key("custom/pfx") in {
        m.key for m in chunks.store.list("custom/pfx/")
    }


# -- corruption -------------------------------------------------------------------------------

def _stored(chunks: ChunkStore, ref: ChunkRef) -> bytearray:
    return bytearray(memoryview(chunks.store.get(ref.key(chunks.prefix))))


@pytest.mark.parametrize("codec", CODECS)
def test_bit_flip_is_detected_and_names_the_key(any_store, codec):
    """Flips in the payload always raise ChunkCorruptError naming the key (every backend)."""
    chunks = ChunkStore(any_store)
    ref = chunks.put(weights(30_000, "float32"), codec=codec, itemsize=4).ref
    blob = _stored(chunks, ref)
    header = 0 if codec == "raw" else 96
    for pos in (header, header + 5, len(blob) // 3, len(blob) // 2, len(blob) - 1):
        bad = bytearray(blob)
        bad[pos] ^= 0x10
        any_store.put(ref.key(), bad)
        with pytest.raises(ChunkCorruptError) as info:
            chunks.get(ref)
        assert ref.key() in str(info.value)
        with pytest.raises(ChunkCorruptError):
            chunks.verify(ref, deep=True)
    any_store.put(ref.key(), blob)
    chunks.verify(ref, deep=True)


@pytest.mark.parametrize("codec", CODECS)
def test_no_bit_flip_yields_wrong_data(codec):
    """Every single-bit flip in the container header and a sample of the payload either
    raises ChunkCorruptError or decodes to exactly the original bytes (some header fields,
    such as blosc2's format-version byte, do not affect decoding) - never wrong data."""
    chunks = memory_chunks()
    arr = weights(30_000, "float32")
    ref = chunks.put(arr, codec=codec, itemsize=4).ref
    blob = _stored(chunks, ref)
    positions = list(range(96)) + list(range(96, len(blob), len(blob) // 40))
    detected = 0
    for pos in positions:
        for bit in range(8):
            bad = bytearray(blob)
            bad[pos] ^= 1 << bit
            chunks.store.put(ref.key(), bad)
            try:
                got = chunks.get(ref)
            except ChunkCorruptError as exc:
                assert ref.key() in str(exc)
                detected += 1
            else:
                assert bytes(memoryview(got)) == arr.tobytes(), (pos, bit)
    assert detected >= len(positions) * 8 * 0.8


@pytest.mark.parametrize("codec", CODECS)
def test_truncation_is_detected(codec):
    chunks = memory_chunks()
    ref = chunks.put(weights(30_000, "float32"), codec=codec, itemsize=4).ref
    blob = _stored(chunks, ref)
    for cut in (0, 1, 16, len(blob) // 2, len(blob) - 1):
        chunks.store.put(ref.key(), blob[:cut])
        with pytest.raises(ChunkCorruptError) as info:
            chunks.get(ref)
        assert ref.key() in str(info.value)
        with pytest.raises(ChunkCorruptError):
            chunks.verify(ref, deep=False)  # the shallow check sees the size alone


@pytest.mark.parametrize("codec", CODECS)
def test_reference_with_wrong_sizes(codec):
    chunks = memory_chunks()
    ref = chunks.put(weights(4096, "float32"), codec=codec, itemsize=4).ref
    wrong = ChunkRef(ref.hash, codec, ref.size + 4, ref.stored + (4 if codec == "raw" else 0), 4)
    with pytest.raises(ChunkCorruptError) as info:
        chunks.get(wrong)
    assert ref.key() in str(info.value)
    # the stored size is the writer's copy only: another writer's copy of the name (another
    # codec level) may differ, so a copy is checked by its container and hash, not by it
    if codec != "raw":
        other = ChunkRef(ref.hash, codec, ref.size, ref.stored + 1, 4)
        assert bytes(chunks.get(other)) == bytes(chunks.get(ref))


def test_swapped_object_is_detected():
    """Valid bytes of another chunk under this chunk's name: the hash check catches it."""
    chunks = memory_chunks()
    a = chunks.put(b"a" * 1000, codec="zstd").ref
    b = chunks.put(b"b" * 1000, codec="zstd").ref
    chunks.store.put(a.key(), chunks.store.get(b.key()))
    with pytest.raises(ChunkCorruptError, match="does not match its hash"):
        chunks.get(a)


def test_missing_chunk_is_not_found():
    chunks = memory_chunks()
    ref = ChunkRef("ab" * 32, "zstd", 10, 42, 1)
    with pytest.raises(NotFoundError):
        chunks.get(ref)
    with pytest.raises(NotFoundError):
        chunks.verify(ref, deep=False)


def test_output_buffer_of_the_wrong_size():
    chunks = memory_chunks()
    ref = chunks.put(b"x" * 100).ref
    with pytest.raises(ConfigError, match="output buffer"):
        chunks.get(ref, out=memoryview(bytearray(99)))


def test_decode_rejects_hostile_sizes():
    with pytest.raises(ChunkCorruptError):
        decode(b"\x00" * 40, "zstd", MAX_CHUNK_BYTES + 1)
    with pytest.raises(ChunkCorruptError):
        decode(b"\x00" * 40, "zstd", 10)
    good = encode(b"z" * 1000, "zstd")
    with pytest.raises(ChunkCorruptError, match="header says"):
        decode(good, "zstd", 10**8)  # the reference lies about the raw size: no huge alloc


# -- hostile references ---------------------------------------------------------------------

H = "0f" * 32


@pytest.mark.parametrize(
    "obj",
    [
        None, {}, "str", 42, [], [H, "zstd", 1, 1], [H, "zstd", 1, 1, 1, 1],
        {"hash": H}, (H, "zstd", 1, 1, 1),
        ["../../etc/passwd" + "0" * 48, "zstd", 1, 1, 1],  # path traversal through the hash
        [H[:-1], "zstd", 1, 1, 1], [H + "0", "zstd", 1, 1, 1], [H.upper(), "zstd", 1, 1, 1],
        ["g" * 64, "zstd", 1, 1, 1], [H[:30] + "x" + H[31:], "zstd", 1, 1, 1], [123, "zstd", 1, 1, 1],
        [H, "gzip", 1, 1, 1], [H, "zstd/../x", 1, 1, 1], [H, None, 1, 1, 1], [H, ["zstd"], 1, 1, 1],
        [H, "zstd", -1, 1, 1], [H, "zstd", 1, -1, 1], [H, "zstd", 1.0, 1, 1], [H, "zstd", "1", 1, 1],
        [H, "zstd", True, 1, 1], [H, "zstd", 1, 1, 0], [H, "zstd", 1, 1, 256],
        [H, "zstd", MAX_CHUNK_BYTES + 1, 1, 1], [H, "zstd", 1, 2**63, 1], [H, "zstd", 10**30, 1, 1],
        [H, "raw", 10, 11, 1],
    ],
)
def test_hostile_refs_are_rejected(obj):
    with pytest.raises(ManifestError) as info:
        ChunkRef.from_json(obj)
    assert isinstance(info.value, (IntegrityError, ValueError, TrainstoreError))


def test_valid_ref_json_roundtrip():
    ref = ChunkRef(H, "shuffle-zstd", 4096, 1000, 4)
    assert ChunkRef.from_json(ref.to_json()) == ref
    import json

    assert ChunkRef.from_json(json.loads(json.dumps(ref.to_json()))) == ref


def test_bad_codec_arguments():
    chunks = memory_chunks()
    with pytest.raises(ConfigError, match="unknown codec"):
        chunks.put(b"x", codec="gzip")
    with pytest.raises(ConfigError):
        CodecConfig(codec="lzma")
    with pytest.raises(ConfigError):
        CodecConfig(level=12)
    with pytest.raises(ConfigError):
        CodecConfig(threads=0)
