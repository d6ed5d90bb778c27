"""Loader(device="cuda"): batches pinned and copied to the GPU non_blocking on a side stream.

The GPU test is skipped where torch sees no CUDA device - in CI too, on purpose (CI machines
have no GPU: an allowed, explicit skip); ``benchmarks/gpu.sh`` runs it on a GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.serve import write_arrow_dataset
from trainstore.devicecopy import cuda_available, to_device
from trainstore.errors import ConfigError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ds(tmp_path):
    store = open_store(str(tmp_path / "durable"))
    idx = np.arange(96, dtype=np.int64)
    x = (idx[:, None] * 10 + np.arange(16)).astype(np.float32)
    write_arrow_dataset(store, "feat", {"idx": idx, "x": x}, 16)
    return Dataset(store, "feat@1", cache_dir=tmp_path / "hot")


def test_device_must_be_cuda(ds) -> None:
    with pytest.raises(ConfigError, match="cuda"):
        Loader(ds, 8, device="cpu")


@pytest.mark.skipif(cuda_available(), reason="checks the behaviour without a CUDA device")
def test_cuda_device_without_cuda_is_a_clear_error(ds) -> None:
    with pytest.raises(ConfigError, match="no CUDA device"):
        Loader(ds, 8, device="cuda")
    with pytest.raises(ConfigError, match="no CUDA device"):
        to_device({"x": torch.zeros(3)}, "cuda")


@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device (CI has none; benchmarks/gpu.sh "
                    "runs it on a GPU machine)")
def test_batches_land_on_the_device_equal_to_host_batches(ds) -> None:
    host = [{k: v.copy() for k, v in b.items()} for b in Loader(ds, 8, seed=3)]
    loader = Loader(ds, 8, seed=3, device="cuda")
    got = []
    for b in loader:
        assert b["x"].device.type == "cuda" and b["idx"].device.type == "cuda"
        got.append({k: (v * 1).cpu().numpy() for k, v in b.items()})  # a kernel on this stream reads it
    loader.close()
    assert len(got) == len(host)
    for g, h in zip(got, host):
        assert np.array_equal(g["idx"], h["idx"]) and np.array_equal(g["x"], h["x"])
