"""A background save uses at most ``WriteOptions.cpu_threads`` cores for hashing and codecs."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from trainstore import codecs
from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.save.writer import WriteOptions, default_cpu_threads
from trainstore.errors import ConfigError


class _Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def wrap(self, fn):
        def counted(*args, **kwargs):
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
            try:
                time.sleep(0.003)  # long enough for other workers to pile in if ungated
                return fn(*args, **kwargs)
            finally:
                with self.lock:
                    self.now -= 1
        return counted


@pytest.mark.parametrize("cpu_threads", [1, 2])
def test_at_most_cpu_threads_encode_at_once_and_the_save_round_trips(tmp_path, monkeypatch, cpu_threads):
    counter = _Counter()
    encode = counter.wrap(codecs.encode)
    monkeypatch.setattr("trainstore.chunks.encode", encode)
    monkeypatch.setattr("trainstore.checkpoint.format.delta.encode", encode)
    rng = np.random.default_rng(0)
    state = {f"w{i}": (rng.standard_normal(64 << 10) * 0.02).astype(np.float32) for i in range(6)}
    opts = WriteOptions(chunk_bytes=64 << 10, workers=8, cpu_threads=cpu_threads, codec="shuffle-zstd", raw_above=1.0)
    policy = CheckpointPolicy(full_every=10, incremental_every=1)
    with CheckpointManager(str(tmp_path), job="gate", policy=policy, options=opts) as mgr:
        mgr.save(0, state, blocking=True)
        state2 = {k: v + np.float32(1e-4) for k, v in state.items()}
        mgr.save(1, state2, blocking=True)
        got = mgr.restore(step=1)
    assert counter.peak >= 1 and counter.peak <= cpu_threads
    for k, v in state2.items():
        assert np.array_equal(np.asarray(got[k]).view(np.uint8), v.view(np.uint8))


def test_cpu_threads_is_validated_and_defaults_to_half_the_cores():
    with pytest.raises(ConfigError, match="cpu_threads"):
        WriteOptions(cpu_threads=0)
    assert 1 <= default_cpu_threads() <= 8
