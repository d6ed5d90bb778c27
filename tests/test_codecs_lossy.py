"""Lossy moment codecs: per-block error bounds (computed here from the documented map),
determinism, and corrupt or unsuitable input rejected clearly."""

from __future__ import annotations

import numpy as np
import pytest

from trainstore import codecs
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.codecs import CodecConfig
from trainstore.errors import ChunkCorruptError, ConfigError

BLOCK = 256


def _moments(n: int = 100_003, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Adam-like moments spanning many decades (log-normal magnitudes), a few zeros."""
    rng = np.random.default_rng(seed)
    m = rng.standard_normal(n) * 1e-3 * rng.lognormal(0.0, 3.0, n)
    m[::997] = 0.0
    v = m * m * rng.lognormal(0.0, 1.0, n)
    return m.astype(np.float32), v.astype(np.float32)


def _blocks_absmax(x: np.ndarray) -> np.ndarray:
    """Each element's block absolute maximum (blocks of 256 in order, last one short)."""
    out = np.empty_like(x)
    for start in range(0, x.size, BLOCK):
        out[start:start + BLOCK] = np.abs(x[start:start + BLOCK]).max()
    return out


def _round_trip(x: np.ndarray, codec: str) -> np.ndarray:
    enc = codecs.encode(memoryview(x).cast("B"), codec, 4)
    return np.frombuffer(bytes(codecs.decode(enc, codec, x.nbytes)), dtype=np.float32)


def test_q8_error_is_bounded_per_block():
    m, _ = _moments()
    got = _round_trip(m, "lossy-q8").astype(np.float64)
    x = m.astype(np.float64)
    absmax = _blocks_absmax(m).astype(np.float64)
    rel = 2.0 ** (16 / 126 / 2) - 1  # 127 log-spaced magnitudes over 16 octaves: half a step
    floor = absmax * 2.0 ** -16
    bound = np.maximum(rel * np.abs(x), floor) * (1 + 1e-5)
    assert (np.abs(got - x) <= bound).all(), np.max(np.abs(got - x) / bound)
    assert ((np.sign(got) == np.sign(x)) | (got == 0)).all()
    assert (got[x == 0] == 0).all()
    big = np.abs(x) >= floor
    assert np.median(np.abs(got - x)[big] / np.abs(x)[big]) < rel  # not all at the bound
    assert (np.abs(got) <= absmax * (1 + 1e-6)).all()


def test_q8_sqrt_error_is_bounded_per_block_on_the_square_root():
    _, v = _moments()
    got = _round_trip(v, "lossy-q8-sqrt").astype(np.float64)
    assert (got >= 0).all()
    r, rg = np.sqrt(v.astype(np.float64)), np.sqrt(got)
    rmax = _blocks_absmax(np.sqrt(v)).astype(np.float64)
    rel = 2.0 ** (20 / 254 / 2) - 1  # 255 magnitudes over 20 octaves of sqrt(v)
    bound = np.maximum(rel * r, rmax * 2.0 ** -20) * (1 + 1e-5)
    assert (np.abs(rg - r) <= bound).all(), np.max(np.abs(rg - r) / bound)


def test_bf16_is_round_to_nearest_within_half_a_bf16_ulp():
    m, _ = _moments()
    got = _round_trip(m, "lossy-bf16")
    assert (np.abs(got.astype(np.float64) - m) <= np.abs(m.astype(np.float64)) * 2.0 ** -8).all()
    assert (got.view(np.uint32) & 0xFFFF == 0).all()  # really bf16 values
    exact = np.array([1.0, -2.5, 0.0, 3.0e38, 1e-40], dtype=np.float32)
    exact = (exact.view(np.uint32) & 0xFFFF0000).view(np.float32)
    assert _round_trip(exact, "lossy-bf16").tobytes() == exact.tobytes()


@pytest.mark.parametrize("codec", codecs.LOSSY_CODECS)
def test_encoding_is_deterministic_and_small(codec):
    m, v = _moments(1 << 18)
    x = v if codec == "lossy-q8-sqrt" else m
    a, b = codecs.encode(x.tobytes(), codec, 4), codecs.encode(x.copy().tobytes(), codec, 4)
    assert bytes(a) == bytes(b)
    assert len(a) / x.nbytes < (0.5 if codec == "lossy-bf16" else 0.27)
    out = np.zeros_like(x)
    codecs.decode(a, codec, x.nbytes, out=memoryview(out).cast("B"))
    assert out.tobytes() == _round_trip(x, codec).tobytes()


@pytest.mark.parametrize("codec", codecs.LOSSY_CODECS)
def test_unsuitable_input_is_rejected(codec):
    with pytest.raises(ConfigError, match="finite float32"):
        codecs.encode(np.array([1.0, np.nan], dtype=np.float32).tobytes(), codec, 4)
    with pytest.raises(ConfigError, match="finite float32"):
        codecs.encode(b"\0" * 6, codec, 4)
    if codec == "lossy-q8-sqrt":
        with pytest.raises(ConfigError, match="none negative"):
            codecs.encode(np.array([1.0, -1e-9], dtype=np.float32).tobytes(), codec, 4)


@pytest.mark.parametrize("codec", codecs.LOSSY_CODECS)
def test_corrupt_container_is_named(codec):
    m, v = _moments(10_000)
    x = v if codec == "lossy-q8-sqrt" else m
    enc = bytes(codecs.encode(x.tobytes(), codec, 4))
    for bad, size in ((enc[:10], x.nbytes), (enc[:-1], x.nbytes), (enc + b"\0", x.nbytes), (enc, x.nbytes - 4),
                      (b"XYZ" + enc[3:], x.nbytes)):
        with pytest.raises(ChunkCorruptError, match="chunk k1"):
            codecs.decode(bad, codec, size, key="k1")


@pytest.mark.parametrize("codec", codecs.LOSSY_CODECS)
def test_configs_cannot_choose_a_lossy_codec(codec):
    with pytest.raises(ConfigError, match="optimizer_moments"):
        CodecConfig(codec=codec)
    with pytest.raises(ConfigError, match="optimizer_moments"):
        WriteOptions(codec=codec)
    with pytest.raises(ConfigError, match="optimizer_moments"):
        WriteOptions(delta_codec=codec)
