"""torchdata StatefulDataLoader over trainstore datasets: mid-epoch resume with worker processes,
trainstore's rank partitioning and shuffle modes; Loader follows the DCP Stateful protocol."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.stateful import Stateful
from torchdata.stateful_dataloader import StatefulDataLoader

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.serve import write_arrow_dataset
from trainstore.errors import ConfigError
from trainstore.integrations.torchdata import BatchStream, StatefulSampler

pytestmark = pytest.mark.timeout(180)
N, SHARD, B = 96, 16, 8


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("td")
    store = open_store(str(tmp / "durable"))
    idx = np.arange(N, dtype=np.int64)
    write_arrow_dataset(store, "feat", {"idx": idx, "x": (idx[:, None] * 2.0 + np.arange(3)).astype(np.float32)}, SHARD)
    return Dataset(store, "feat@1", cache_dir=tmp / "hot")


def sampler_loader(ds, mode="full", rank=0, world=1, workers=2):
    sampler = StatefulSampler(ds, B, seed=7, shuffle_mode=mode, rank=rank, world_size=world)
    return StatefulDataLoader(ds, batch_size=B, sampler=sampler, num_workers=workers)


def stream_loader(ds, mode="full", workers=2):
    # persistent workers keep their BatchStream copy, so epochs advance by themselves
    # (non-persistent workers get a fresh copy per epoch: call set_epoch as with DistributedSampler)
    return StatefulDataLoader(BatchStream(ds, B, seed=7, shuffle_mode=mode), batch_size=None, num_workers=workers,
                              persistent_workers=workers > 0)


def ids(batch) -> list[int]:
    assert torch.equal(batch["x"][:, 0], batch["idx"].to(torch.float32) * 2)  # rows stay whole
    return batch["idx"].tolist()


def run(loader, epochs: int = 2) -> list[list[int]]:
    return [ids(b) for _ in range(epochs) for b in loader]


@pytest.mark.parametrize("make,mode", [(sampler_loader, "full"), (sampler_loader, "block"),
                                       (stream_loader, "full"), (stream_loader, "none")])
def test_resume_mid_epoch_with_workers_gives_the_same_remaining_batches(ds, make, mode):
    expected = run(make(ds, mode))
    per_epoch = N // B
    assert sorted(sum(expected[:per_epoch], [])) == list(range(N))  # each sample once per epoch
    if mode != "none":
        assert expected[:per_epoch] != expected[per_epoch:]  # a new order every epoch
    stop = per_epoch // 2 + 1  # mid-epoch 0
    first = make(ds, mode)
    it = iter(first)
    seen = [ids(next(it)) for _ in range(stop)]
    state = json.loads(json.dumps(first.state_dict()))  # JSON-able: survives any checkpoint format
    del it, first
    resumed = make(ds, mode)
    resumed.load_state_dict(state)
    rest = run(resumed)  # rest of epoch 0, then all of epoch 1
    assert seen + rest[:2 * per_epoch - stop] == expected


def test_ranks_partition_each_epoch_equally(ds):
    world = 3
    per_rank = [run(sampler_loader(ds, rank=r, world=world, workers=0), epochs=1) for r in range(world)]
    assert len({len(b) for b in per_rank}) == 1  # equal batch counts: no rank waits at the end
    flat = [i for rank in per_rank for b in rank for i in b]
    assert sorted(flat) == list(range(N))


def test_resume_with_another_world_size_reads_each_remaining_sample_once(ds):
    old = [sampler_loader(ds, rank=r, world=2, workers=0) for r in range(2)]
    its = [iter(dl) for dl in old]
    seen = [i for _ in range(2) for it in its for i in ids(next(it))]
    states = [dl.state_dict() for dl in old]
    new = [sampler_loader(ds, rank=r, world=3, workers=0) for r in range(3)]
    for dl in new:
        dl.load_state_dict(states[0])
    rest = [[i for b in dl for i in ids(b)] for dl in new]
    assert len(seen) == 2 * 2 * B and len({len(r) for r in rest}) == 1  # equal counts on the new ranks
    flat = seen + [i for r in rest for i in r]
    assert set(flat) == set(range(N)) and len(flat) - N < 3  # each once, plus < world padding repeats


def test_sampler_state_checks_settings(ds):
    state = StatefulSampler(ds, B, seed=1).state_dict()
    with pytest.raises(ConfigError, match="seed"):
        StatefulSampler(ds, B, seed=2).load_state_dict(state)
    with pytest.raises(ConfigError, match="not a"):
        StatefulSampler(ds, B).load_state_dict({"epoch": 0})


def test_set_epoch_keeps_a_restored_position(ds):
    s = StatefulSampler(ds, B, seed=3)
    full = list(s)
    s2 = StatefulSampler(ds, B, seed=3)
    state = {**s2.state_dict(), "consumed": 2 * B}
    s2.load_state_dict(state)
    s2.set_epoch(0)  # what Lightning does at the start of the resumed epoch
    assert list(s2) == full[2 * B:]
    s2.set_epoch(5)
    assert list(s2) != full and s2.epoch == 6  # exhausted epoch 5 moved on


def test_loader_is_dcp_stateful(ds):
    loader = Loader(ds, batch_size=B, workers=1)
    try:
        assert isinstance(loader, Stateful)
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        assert state["position"] == 1
        fresh = Loader(ds, batch_size=B, workers=1)
        fresh.load_state_dict(state)
        assert [b["idx"].tolist() for b in fresh][0] == next(it)["idx"].tolist()
        fresh.close()
    finally:
        loader.close()
