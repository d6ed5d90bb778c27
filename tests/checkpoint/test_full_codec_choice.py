"""Which full-save pieces are compressed (``WriteOptions.raw_above``, auto by default): float
data that saves a few 10% is stored raw where the writer's CPU threads cannot keep up with a
local disk, compressed where they can or where the store is a network one; data that halves
is compressed everywhere; an explicit ``raw_above`` wins."""

from __future__ import annotations

import uuid

import pytest
import torch

from trainstore import open_store
from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.format.delta import auto_raw_above
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.errors import ConfigError
from trainstore.store.tiered import TieredStore

pytestmark = pytest.mark.timeout(120)
FULL = CheckpointPolicy(full_every=1, incremental_every=None)


def _state() -> dict:
    g = torch.Generator().manual_seed(3)
    return {"bf16": torch.randn(1 << 20, generator=g).to(torch.bfloat16),  # shuffle-lz4: ~0.88 of raw
            "f32": torch.randn(1 << 19, generator=g),  # ~0.94
            "zeros": torch.zeros(1 << 19),  # a fresh optimizer moment: compresses to almost nothing
            "ids": torch.randint(0, 50, (1 << 19,), generator=g)}  # int64 token ids: < 0.3


def _codecs(store, **opts) -> dict[str, set[str]]:
    state = _state()
    with CheckpointManager(store, job="j", policy=FULL, options=WriteOptions(**opts)) as mgr:
        mgr.save(1, state, blocking=True)
        m = mgr.manifest(1)
        got = mgr.restore(1)
    for k, v in state.items():
        assert torch.equal(got[k], v), k
    return {k: {c.ref.codec for c in m.tensors[k].chunks} for k in state}


def test_auto_threshold_follows_the_cpu_threads_and_the_store():
    assert auto_raw_above(1, local=True) == auto_raw_above(3, local=True) == 0.5
    assert auto_raw_above(4, local=True) == auto_raw_above(8, local=True) == 0.9
    assert auto_raw_above(1, local=False) == 0.9


def test_few_cpu_threads_on_a_local_disk_store_float_data_raw(tmp_path):
    codecs = _codecs(str(tmp_path / "s"), cpu_threads=1)
    assert codecs == {"bf16": {"raw"}, "f32": {"raw"}, "zeros": {"shuffle-lz4"}, "ids": {"shuffle-lz4"}}


def test_enough_cpu_threads_compress_what_saves_ten_percent(tmp_path):
    codecs = _codecs(str(tmp_path / "s"), cpu_threads=4)
    assert codecs == {"bf16": {"shuffle-lz4"}, "f32": {"raw"}, "zeros": {"shuffle-lz4"}, "ids": {"shuffle-lz4"}}


def test_a_network_store_compresses_what_saves_ten_percent_with_one_thread(s3_url):
    url, opts = s3_url
    store = open_store(url, **opts)
    try:
        assert _codecs(store, cpu_threads=1)["bf16"] == {"shuffle-lz4"}
    finally:
        store.close()


@pytest.mark.parametrize("write_back", [False, True], ids=["write-through", "write-back"])
def test_a_tiered_store_counts_as_a_network_one(tmp_path, write_back):
    """Write-through puts go to the durable tier first; write-back ones are copied there later:
    either way the bytes cross the network, so the 10% threshold stays."""
    store = TieredStore(open_store(str(tmp_path / "hot")), open_store(f"memory://{uuid.uuid4().hex}"),
                        write_back=write_back)
    assert _codecs(store, cpu_threads=1)["bf16"] == {"shuffle-lz4"}


def test_an_explicit_threshold_wins(tmp_path):
    assert _codecs(str(tmp_path / "a"), cpu_threads=1, raw_above=0.9)["bf16"] == {"shuffle-lz4"}
    assert _codecs(str(tmp_path / "b"), cpu_threads=8, raw_above=0.05) == \
        {"bf16": {"raw"}, "f32": {"raw"}, "zeros": {"shuffle-lz4"}, "ids": {"raw"}}  # ids sample 0.13


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5])
def test_a_threshold_outside_0_1_is_refused_naming_it(bad):
    with pytest.raises(ConfigError, match=f"raw_above must be in \\(0, 1\\] or None \\(auto\\), got {bad}"):
        WriteOptions(raw_above=bad)
