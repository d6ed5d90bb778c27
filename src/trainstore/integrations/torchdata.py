"""torchdata ``StatefulDataLoader`` over trainstore datasets: exact mid-epoch resume, with workers.

    from torchdata.stateful_dataloader import StatefulDataLoader
    from trainstore.integrations.torchdata import StatefulSampler, BatchStream

    ds = trainstore.data.Dataset(store, "features@3")
    dl = StatefulDataLoader(ds, batch_size=64, sampler=StatefulSampler(ds, batch_size=64, seed=0),
                            num_workers=2)                        # map-style: workers gather rows
    dl = StatefulDataLoader(BatchStream(ds, batch_size=64), batch_size=None, num_workers=2)
    state = dl.state_dict()  ...  dl.load_state_dict(state)      # resumes after the last batch

Both follow trainstore's epoch plans (``data.sampler``; a ``Mixture`` plans its own through
the loader's source interface, ``data.serve.source``, and its cursor travels in the state): a
deterministic order per (seed, epoch) in ``full``/``block``/``none`` shuffle mode, and equal per-rank counts across a
``torch.distributed`` world (no rank waits at the epoch end). ``StatefulSampler`` yields this
rank's sample indices and records how many it handed out; its state is JSON-able and resumes
with the same or another world size (at batch boundaries). ``BatchStream`` is an
``IterableDataset`` yielding whole batches (``Dataset.take``: one gather per shard), split
round-robin over the loader's workers, so a ``StatefulDataLoader`` (in order) returns them in
plan order; each worker's state is its epoch and batches produced.

Epochs: an exhausted iterator moves to the next epoch by itself; ``set_epoch(e)`` (called by
Lightning and DistributedSampler-style loops) selects epoch ``e`` and keeps a restored
position when ``e`` is the restored epoch. ``BatchStream`` runs inside the workers: with
``persistent_workers=True`` (or no workers) epochs advance by themselves; non-persistent
workers start each epoch from a fresh copy, so call ``stream.set_epoch(e)`` before each epoch. ``trainstore.data.Loader`` itself has the same
``state_dict``/``load_state_dict`` (the ``Stateful`` protocol of ``torch.distributed.checkpoint``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, Sampler, get_worker_info

from ..data.serve.sampler import PlanSpec, epoch_streams
from ..data.serve.source import ServeSource
from ..errors import ConfigError
from .ranks import rank_and_world

SAMPLER_FORMAT = "trainstore.torchdata-sampler/1"
STREAM_FORMAT = "trainstore.torchdata-stream/1"


def _spec(data: ServeSource | Sized, batch_size: int, seed: int, shuffle: bool, shuffle_mode: str,
          block_shards: int, drop_last: bool) -> PlanSpec:
    if isinstance(data, ServeSource):  # a Dataset or a Mixture: it plans its own epochs
        rows = tuple(s.rows for s in data.shards)
    elif isinstance(data, Sized):
        rows = (len(data),)  # any map-style dataset: one "shard"
    else:
        raise ConfigError(f"need a trainstore Dataset or a sized dataset, got {type(data).__name__}")
    return PlanSpec(sum(rows), rows, batch_size, seed, shuffle_mode if shuffle else "none", block_shards, drop_last)


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else the initialised ``torch.distributed`` group, else a single rank."""
    group_rank, group_world = rank_and_world()
    rank, world_size = (group_rank if rank is None else int(rank)), (group_world if world_size is None else int(world_size))
    if world_size <= 0 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is not in a world of size {world_size}")
    return rank, world_size


class _Plan:
    """Position in this rank's epoch plan: epoch, earlier world-size segments, batches done."""

    def __init__(self, spec: PlanSpec, rank: int | None, world_size: int | None,
                 source: ServeSource | None = None) -> None:
        self.spec = spec
        self.rank, self.world_size = _rank_world(rank, world_size)
        self.epoch = 0
        self.segments: list[tuple[int, int]] = []
        self.restored: int | None = None  # samples already consumed of the restored epoch
        # a trainstore source plans its own epochs (serve.source); its cursor: a mixture's position
        self.source = source
        self.cursor = source.start_cursor() if source is not None else None
        self._next_cursor = self.cursor

    def stream(self) -> np.ndarray:
        if self.source is None:
            return epoch_streams(self.spec, self.epoch, self.segments, self.world_size)[self.rank]
        plan = self.source.plan_epoch(self.spec, self.epoch, self.cursor, self.segments, self.world_size)
        self.cursor = plan.cursor if plan.cursor is not None else self.cursor
        self._next_cursor = plan.next_cursor
        return plan.streams[self.rank]

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.epoch:
            if self.source is not None:
                self.cursor = self.source.start_cursor(int(epoch), self.cursor)
            self.epoch, self.segments, self.restored = int(epoch), [], None

    def state(self, fmt: str, consumed: int) -> dict:
        return {"format": fmt, "epoch": self.epoch, "consumed": consumed, "world_size": self.world_size,
                "segments": [list(s) for s in self.segments],
                "spec": {k: v for k, v in asdict(self.spec).items() if k != "shard_rows"},
                **({"cursor": self.cursor} if self.cursor is not None else {})}

    def load(self, state: dict, fmt: str) -> None:
        if not isinstance(state, dict) or state.get("format") != fmt:
            raise ConfigError(f"not a {fmt} state: {str(state)[:80]!r}")
        ours = {k: v for k, v in asdict(self.spec).items() if k != "shard_rows"}
        if state.get("spec") != ours:
            saved = state.get("spec") or {}
            diff = {k: (saved.get(k), v) for k, v in ours.items() if saved.get(k) != v}
            raise ConfigError(f"{fmt} state was saved with other settings (saved, now): {diff}")
        self.epoch = int(state["epoch"])
        self.segments = [(int(w), int(d)) for w, d in state["segments"]]
        consumed = int(state["consumed"])
        if self.source is not None:  # the source checks its cursor (a mixture: new weights, a new era)
            done = [*self.segments, (int(state["world_size"]), -(-consumed // self.spec.batch_size))]
            self.cursor = self.source.resume_cursor(state.get("cursor"), self.spec, done)
        if int(state["world_size"]) != self.world_size:
            if consumed % self.spec.batch_size:
                raise ConfigError(f"cannot resume with world size {self.world_size} (saved with "
                                  f"{state['world_size']}) in the middle of a batch ({consumed} samples)")
            if consumed or self.segments:
                self.segments.append((int(state["world_size"]), consumed // self.spec.batch_size))
            consumed = 0
        self.restored = consumed

    def start(self) -> int:
        start, self.restored = self.restored or 0, None
        return start

    def finished(self) -> None:
        self.epoch, self.segments, self.cursor = self.epoch + 1, [], self._next_cursor


class StatefulSampler(Sampler[int]):
    """This rank's sample indices in trainstore's epoch plan; ``state_dict`` resumes mid-epoch."""

    def __init__(self, data: ServeSource | Sized, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 shuffle_mode: str = "full", block_shards: int = 4, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None) -> None:
        self._plan = _Plan(_spec(data, batch_size, seed, shuffle, shuffle_mode, block_shards, drop_last),
                           rank, world_size, data if isinstance(data, ServeSource) else None)
        self.yielded = 0

    @property
    def epoch(self) -> int:
        return self._plan.epoch

    def set_epoch(self, epoch: int) -> None:
        self._plan.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self._plan.stream())

    def __iter__(self) -> Iterator[int]:
        stream = self._plan.stream()
        self.yielded = self._plan.start()
        for i in stream[self.yielded:].tolist():
            self.yielded += 1
            yield i
        self._plan.finished()
        self.yielded = 0

    def state_dict(self) -> dict[str, Any]:
        return self._plan.state(SAMPLER_FORMAT, self.yielded)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._plan.load(state, SAMPLER_FORMAT)
        self.yielded = self._plan.restored or 0


class BatchStream(IterableDataset):
    """Whole batches of a trainstore ``Dataset`` for this rank (an ``IterableDataset`` for
    ``StatefulDataLoader(..., batch_size=None)``); workers take batches round-robin."""

    def __init__(self, dataset: ServeSource, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 shuffle_mode: str = "full", block_shards: int = 4, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None, as_torch: bool = True) -> None:
        if not isinstance(dataset, ServeSource):
            raise ConfigError(f"BatchStream needs a trainstore.data.Dataset or Mixture, got {type(dataset).__name__}")
        self.dataset = dataset
        self.as_torch = as_torch
        self._plan = _Plan(_spec(dataset, batch_size, seed, shuffle, shuffle_mode, block_shards, drop_last),
                           rank, world_size, dataset)
        self.produced = 0  # batches this worker (or the main process) produced this epoch

    def set_epoch(self, epoch: int) -> None:
        self._plan.set_epoch(epoch)

    def __len__(self) -> int:
        return -(-len(self._plan.stream()) // self._plan.spec.batch_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        B = self._plan.spec.batch_size
        stream = self._plan.stream()
        batches = [stream[i:i + B] for i in range(0, len(stream), B)][worker::workers]
        self.produced = self._plan.start()
        for idx in batches[self.produced:]:
            self.produced += 1
            arrays = self.dataset.take(idx)
            yield {k: torch.from_numpy(v) if v.dtype != object else v for k, v in arrays.items()} \
                if self.as_torch else arrays
        self._plan.finished()
        self.produced = 0

    def state_dict(self) -> dict[str, Any]:
        return self._plan.state(STREAM_FORMAT, self.produced)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state.get("world_size", -1)) != self._plan.world_size:
            raise ConfigError("BatchStream resumes with the same world size only (use StatefulSampler to change it)")
        self._plan.load(state, STREAM_FORMAT)
        self.produced = self._plan.restored or 0


__all__ = ["StatefulSampler", "BatchStream"]
