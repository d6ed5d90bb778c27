"""Exchange mode: each rank reads only the shards it owns; ranks swap the rows batches need.

In ``full`` shuffle every batch draws from nearly every shard, so without exchange every node
reads the whole dataset from the object store each epoch (N nodes: N times). With exchange,
shard ``s`` is read by one rank only (its owner, from ``sampler.shard_ranges``: contiguous,
balanced by rows), and for each batch step every rank sends each other rank the rows of that
rank's batch that live in its shards, with one ``all_to_all_single`` per column over a
``torch.distributed`` process group. The plan (which rows every rank's batch holds) is the
same deterministic epoch plan as without exchange, so every rank gets exactly the batches the
plain loader would have given it; only where the bytes come from changes.

The collective runs in the thread that iterates the loader (in batch order, the same on every
rank); worker threads only gather the rows to send from the mapped shards ahead of time. Tensor
columns only (fixed dtype and row shape); the exchange is over gloo on CPU memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ConfigError
from .dataset import Dataset
from .open_shard import column_spec
from .sampler import shard_ranges

try:
    import torch
    import torch.distributed as dist
except ImportError:  # only the exchange needs torch; the rest of the loader does not
    torch = None  # type: ignore[assignment]
    dist = None  # type: ignore[assignment]


@dataclass(frozen=True)
class ExchangeStep:
    """One batch step as seen by one rank."""

    reads: np.ndarray  # global rows this rank reads from its own shards, grouped by destination rank
    send_counts: tuple[int, ...]  # rows sent to each rank
    recv_counts: tuple[int, ...]  # rows received from each rank
    recv_positions: np.ndarray  # this rank's batch position of each received row (grouped by source)
    size: int  # rows in this rank's batch


class RowExchange:
    """Shard ownership and the per-batch row exchange of one rank (see the module doc)."""

    def __init__(self, dataset: Dataset, rank: int, world_size: int, group: Any = None) -> None:
        if torch is None or not dist.is_available():
            raise ConfigError("exchange mode needs torch with torch.distributed (pip install torch)")
        if world_size > 1 and not dist.is_initialized():
            raise ConfigError("exchange mode needs an initialised torch.distributed process group")
        if world_size > 1:
            pg_world = dist.get_world_size(group)
            if pg_world != world_size:
                raise ConfigError(f"exchange group has {pg_world} ranks, the loader has world size {world_size}")
            backend = str(dist.get_backend(group))
            if backend != "gloo":
                raise ConfigError(f"exchange mode moves host (CPU) rows and needs a gloo group, got {backend!r}; "
                                  "pass exchange_group=torch.distributed.new_group(backend='gloo')")
        self.dataset = dataset
        self.rank, self.world_size, self.group = rank, world_size, group
        self.columns: dict[str, tuple[np.dtype, tuple[int, ...], int]] = {}
        for name in dataset.column_names:
            dtype, shape = column_spec(dataset.version, name)
            if dtype is None:
                raise ConfigError(f"exchange mode sends tensor columns only; column {name!r} of "
                                  f"{dataset.version.id} is not one (select columns=... without it)")
            self.columns[name] = (dtype, shape, dtype.itemsize * int(np.prod(shape, dtype=np.int64)))
        groups = shard_ranges(tuple(s.rows for s in dataset.shards), world_size)
        self.shard_owner = np.zeros(len(dataset.shards), dtype=np.int64)
        for r, shards in enumerate(groups):
            self.shard_owner[shards] = r
        self.owned_shards = tuple(groups[rank])
        self.seconds = 0.0  # spent in exchange() (collectives + placing rows), for stats
        self.steps = 0
        self.bytes_sent = 0  # to other ranks

    def owner_of_rows(self, rows: np.ndarray) -> np.ndarray:
        return self.shard_owner[np.searchsorted(self.dataset.offsets, rows, side="right") - 1]

    def plan(self, streams: list[np.ndarray], batch_size: int) -> list[ExchangeStep]:
        """This rank's exchange steps for the streams of every rank (equal lengths)."""
        if len(streams) != self.world_size:
            raise ConfigError(f"exchange plan needs {self.world_size} rank streams, got {len(streams)}")
        owners = [self.owner_of_rows(s) for s in streams]
        ranks = range(self.world_size)
        steps = []
        for start in range(0, len(streams[self.rank]), batch_size):
            sl = slice(start, start + batch_size)
            mine = [streams[q][sl][owners[q][sl] == self.rank] for q in ranks]
            own = owners[self.rank][sl]
            positions = [np.flatnonzero(own == q) for q in ranks]
            steps.append(ExchangeStep(
                reads=np.concatenate(mine), send_counts=tuple(len(m) for m in mine),
                recv_counts=tuple(len(p) for p in positions), recv_positions=np.concatenate(positions),
                size=len(own),
            ))
        return steps

    def gather(self, step: ExchangeStep) -> dict[str, np.ndarray]:
        """The rows this rank sends for ``step`` (worker thread; reads only owned shards)."""
        return self.dataset.take(step.reads)

    def exchange(self, step: ExchangeStep, sent: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Swap rows with every rank (collective: all ranks call it for the same step in
        the same order) and return this rank's batch."""
        t0 = time.perf_counter()
        out: dict[str, np.ndarray] = {}
        for name, (dtype, shape, row_bytes) in self.columns.items():
            batch = np.empty((step.size, *shape), dtype=dtype)
            if self.world_size == 1:
                batch[step.recv_positions] = sent[name]
                out[name] = batch
                continue
            send = torch.from_numpy(np.ascontiguousarray(sent[name]).reshape(-1).view(np.uint8))
            recv = torch.empty(step.size * row_bytes, dtype=torch.uint8)
            dist.all_to_all_single(recv, send, [c * row_bytes for c in step.recv_counts],
                                   [c * row_bytes for c in step.send_counts], group=self.group)
            batch[step.recv_positions] = recv.numpy().view(dtype).reshape((step.size, *shape))
            out[name] = batch
            self.bytes_sent += (sum(step.send_counts) - step.send_counts[self.rank]) * row_bytes
        self.seconds += time.perf_counter() - t0
        self.steps += 1
        return out


__all__ = ["ExchangeStep", "RowExchange"]
