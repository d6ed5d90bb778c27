"""A Mixture under torchdata's StatefulDataLoader (integrations.torchdata): the same plan as the
trainstore Loader, and mid-epoch resume (the mixture's cursor travels in the sampler state)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.serve import Mixture, write_arrow_dataset
from trainstore.integrations.torchdata import BatchStream, StatefulSampler

pytestmark = pytest.mark.timeout(180)
B = 8


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mixtd")
    store = open_store(str(tmp / "durable"))
    srcs = {}
    for name, n, base in (("web", 60, 0), ("code", 20, 1000)):
        idx = np.arange(n, dtype=np.int64) + base
        write_arrow_dataset(store, name, {"idx": idx, "x": (idx[:, None] * 2.0 + np.arange(3)).astype(np.float32)}, 10)
        srcs[name] = Dataset(store, f"{name}@1", cache_dir=tmp / "hot")
    return Mixture(srcs, {"web": 0.6, "code": 0.4}, seed=3)


def ids(batch) -> list[int]:
    x, idx = (torch.as_tensor(batch["x"]), torch.as_tensor(batch["idx"]))
    assert torch.equal(x[:, 0], idx.to(torch.float32) * 2)
    return idx.tolist()


def reference(mix, epochs=2):
    loader = Loader(mix, B, seed=7, world_size=1, rank=0)
    return [ids(b) for _ in range(epochs) for b in loader]


def sampler_loader(mix, workers=0):
    return StatefulDataLoader(mix, batch_size=B, sampler=StatefulSampler(mix, B, seed=7, rank=0, world_size=1),
                              num_workers=workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_sampler_and_batch_stream_follow_the_loader_plan(mix, workers):
    want = reference(mix)
    dl = sampler_loader(mix, workers)
    assert [ids(b) for _ in range(2) for b in dl] == want
    stream = StatefulDataLoader(BatchStream(mix, B, seed=7, rank=0, world_size=1), batch_size=None,
                                num_workers=workers, persistent_workers=workers > 0)
    assert [ids(b) for _ in range(2) for b in stream] == want


def test_sampler_resume_mid_epoch(mix):
    want = reference(mix, epochs=1)
    dl = sampler_loader(mix)
    it = iter(dl)
    head = [ids(next(it)) for _ in range(4)]
    state = json.loads(json.dumps(dl.state_dict()))
    again = sampler_loader(mix)
    again.load_state_dict(state)
    assert head + [ids(b) for b in again] == want
