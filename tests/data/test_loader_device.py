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


def test_take_gathers_fixed_size_columns_into_the_given_allocator(ds) -> None:
    made: list[np.ndarray] = []

    def alloc(shape, dtype):  # noqa: ANN001, ANN202
        made.append(np.full(shape, 7, dtype=dtype))
        return made[-1]

    rows = [5, 40, 3, 95, 17]
    got = ds.take(rows, alloc=alloc)
    want = ds.take(rows)
    assert len(made) == 2 and {id(a) for a in made} == {id(got["idx"]), id(got["x"])}
    assert np.array_equal(got["idx"], want["idx"]) and np.array_equal(got["x"], want["x"])


def test_an_allocator_giving_the_wrong_array_is_a_clear_error(ds) -> None:
    with pytest.raises(ConfigError, match=r"column 'x'.*float32\[2, 16\]"):
        ds.take([1, 2], alloc=lambda shape, dtype: np.empty(shape, dtype=np.float64) if len(shape) > 1
                else np.empty(shape, dtype=dtype))


@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device (CI has none; benchmarks/gpu.sh "
                    "runs it on a GPU machine)")
def test_device_batches_are_gathered_into_pinned_memory_not_pinned_by_a_copy(ds, monkeypatch) -> None:
    pins = []
    pin = torch.Tensor.pin_memory
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: pins.append(1) or pin(self, *a, **k))
    host = [{k: v.copy() for k, v in b.items()} for b in Loader(ds, 8, seed=3)]
    loader = Loader(ds, 8, seed=3, device="cuda")
    got = [{k: (v * 1).cpu().numpy() for k, v in b.items()} for b in loader]
    loader.close()
    assert not pins  # every batch column was gathered into pinned memory
    assert all(np.array_equal(g[k], h[k]) for g, h in zip(got, host) for k in ("idx", "x"))
