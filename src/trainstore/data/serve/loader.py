"""``Loader``: batches for one rank, shuffled per epoch, prefetched from the hot tier, resumable.

Pipeline per rank: the epoch plan (``sampler``) gives this rank's sample order; a shard
thread fills the shards that upcoming batches need into the hot tier (``NodeCache``) ahead of
use; ``workers`` threads assemble batches ``N+1 .. N+prefetch`` (``Dataset.take``: one numpy
gather per shard from memory-mapped Arrow files, the GIL released) while batch ``N`` is being
consumed. For a ``parquet`` version, ``decode_ahead`` threads decode the row groups upcoming
batches need as soon as their shard is filled (``decodeahead``). When the cache limit is
smaller than what the rank reads, shards whose last use in this epoch has passed are evicted
at once, so the space goes to shards still needed. With ``device="cuda"`` the batch threads
gather each batch straight into pinned host memory (``devicecopy.pinned_empty``: no copy to
pin it) and copy it to the GPU ``non_blocking`` on a side stream (``devicecopy``); the
iterating thread's current stream waits for that copy on the GPU, so neither side blocks.

``state_dict()`` is a small JSON-able dict (epoch, batches consumed, seed, world size, and the
world sizes earlier parts of this epoch ran with); ``load_state_dict`` resumes exactly after
the last batch returned, with the same or another world size.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ...bytebudget import ByteBudget
from ...devicecopy import CopyFence, cuda_available, pinned_empty, to_device
from ...errors import ConfigError
from ..layouts import PARQUET
from .dataset import Dataset
from .epochrun import EpochRun
from .exchange import ExchangeStep, RowExchange
from .meter import IOWaitMeter, MeterConfig
from .sampler import PlanSpec
from .source import Alloc, EpochPlan, ServeSource

STATE_FORMAT = "trainstore.loader/1"


@dataclass(frozen=True)
class LoaderConfig:
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    shuffle_mode: str = "full"
    block_shards: int = 4
    prefetch: int = 2
    workers: int = 2
    drop_last: bool = False
    as_torch: bool = False
    cross_epoch: bool = True
    prefetch_retries: int = 3  # a shard fill failing with a transient StoreError is retried this often
    prefetch_backoff_s: float = 0.2  # first retry delay, doubling
    fill_concurrency: int = 4  # shards filled into the node cache at once (serve.fill)
    decode_ahead: int = 2  # threads decoding Parquet row groups ahead of use (serve.decodeahead); 0: off
    device: str | None = None  # "cuda[:i]": batches pinned and copied there non_blocking (devicecopy)

    def __post_init__(self) -> None:
        if self.prefetch_retries < 0 or self.prefetch_backoff_s < 0:
            raise ConfigError("prefetch_retries and prefetch_backoff_s must be >= 0")
        if self.fill_concurrency <= 0:
            raise ConfigError(f"fill_concurrency must be positive, got {self.fill_concurrency}")
        if self.decode_ahead < 0:
            raise ConfigError(f"decode_ahead must be >= 0, got {self.decode_ahead}")
        if self.device is not None and not self.device.startswith("cuda"):
            raise ConfigError(f"device must be 'cuda' or 'cuda:<index>', got {self.device!r}")
        if self.device is not None and not cuda_available():
            raise ConfigError(f"device={self.device!r} asked for, but torch sees no CUDA device")
        if self.prefetch < 0 or self.workers <= 0:
            raise ConfigError(f"prefetch must be >= 0 and workers > 0, got {self.prefetch}, {self.workers}")


def _dist_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None or world_size is None:
        try:
            import torch.distributed as dist  # noqa: PLC0415

            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                world_size = dist.get_world_size() if world_size is None else world_size
        except ImportError:
            pass
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    if world_size <= 0 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is not in a world of size {world_size}")
    return rank, world_size


class Loader:
    """Iterate batches (dicts of numpy arrays, or torch tensors) for this rank."""

    def __init__(
        self,
        dataset: ServeSource,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        prefetch: int = 2,
        workers: int = 2,
        drop_last: bool = False,
        collate: Callable[[dict[str, np.ndarray]], Any] | None = None,
        *,
        shuffle_mode: str | None = None,
        block_shards: int = 4,
        as_torch: bool = False,
        metrics_registry: Any = None,
        meter: MeterConfig | None = None,
        exchange: bool = False,
        exchange_group: Any = None,
        decode_ahead: int = 2,
        device: str | None = None,
    ) -> None:
        if not isinstance(dataset, ServeSource):
            raise ConfigError(f"Loader needs a trainstore.data.Dataset or Mixture, got {type(dataset).__name__}")
        if not isinstance(dataset, Dataset) and (cache_dir is not None or cache_limit is not None or exchange):
            raise ConfigError(f"cache_dir, cache_limit and exchange apply to one Dataset; {dataset.source_id}: "
                              "set the cache on each source dataset (exchange mode serves one dataset)")
        if isinstance(dataset, Dataset) and (cache_dir is not None or cache_limit is not None):
            dataset = Dataset(dataset.store, dataset.version, cache_dir=cache_dir, cache_limit=cache_limit,
                              config=dataset.config)
        self.dataset = dataset
        if shuffle_mode is None:  # the default: full shuffle; Parquet shards are told once what fits them
            shuffle_mode = "full"
            if shuffle and isinstance(dataset, Dataset) and dataset.layout is PARQUET:
                warnings.warn(f"Loader over Parquet shards ({dataset.source_id}) with the default full shuffle: "
                              "shuffle_mode='block' reads each file once per epoch instead of row groups "
                              "across all of them per batch (pass shuffle_mode='full' to keep it)",
                              UserWarning, stacklevel=2)
        self.config = LoaderConfig(batch_size, shuffle, seed, shuffle_mode if shuffle else "none",
                                   block_shards, prefetch, workers, drop_last, as_torch,
                                   decode_ahead=decode_ahead, device=device)
        self.rank, self.world_size = _dist_defaults(rank, world_size)
        self.collate = collate
        # exchange mode (serve.exchange): read only owned shards, swap rows over torch.distributed
        self._exchange = RowExchange(dataset, self.rank, self.world_size, exchange_group) if exchange else None
        self.spec = PlanSpec(len(dataset), tuple(s.rows for s in dataset.shards), batch_size, seed,
                             self.config.shuffle_mode, block_shards, drop_last)
        self.epoch = 0
        self._position = 0  # batches consumed in the current segment
        self._segments: list[tuple[int, int]] = []
        self.meter = IOWaitMeter(meter, metrics_registry, {"rank": str(self.rank)})
        self.metrics_registry = self.meter.registry
        self._active: EpochRun | None = None
        self._ahead: tuple[tuple, EpochRun] | None = None
        self._cursor = dataset.start_cursor()  # the source's position (a mixture's stream), or None
        stream_bytes = dataset.source_bytes
        self._evict_done = dataset.cache_limit < stream_bytes
        # bytes pinned ahead of use by every epoch run (serve.fill): most of the cache, so the
        # next block window fills while the current one is read
        self._fill_budget = ByteBudget(max(dataset.cache_limit * 3 // 4, dataset.max_shard_bytes))
        self._fetched_mark = 0  # node-cache bytes_fetched at the last epoch end
        self._fetched_carry = 0  # of those, fetched for the next epoch's run

    # -- plan ---------------------------------------------------------------------------------
    def _plan(self) -> EpochPlan:
        """The current segment of the current epoch, planned by the source from its cursor."""
        return self.dataset.plan_epoch(self.spec, self.epoch, self._cursor, self._segments, self.world_size)

    def _stream(self) -> np.ndarray:
        return self._plan().streams[self.rank]

    def __len__(self) -> int:
        n = len(self._stream())
        return -(-n // self.config.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (like ``DistributedSampler.set_epoch``)."""
        self._stop()
        if int(epoch) != self.epoch:
            self._cursor = self.dataset.start_cursor(int(epoch), self._cursor)
        self.epoch, self._position, self._segments = int(epoch), 0, []

    # -- iteration -----------------------------------------------------------------------------
    def _batches(self, plan: EpochPlan) -> list[np.ndarray] | list[ExchangeStep]:
        """This rank's batches (row indices), or in exchange mode its exchange steps."""
        B = self.config.batch_size
        streams = plan.streams
        if self._exchange is not None:
            return self._exchange.plan(streams, B)
        stream = streams[self.rank]
        return [stream[i:i + B] for i in range(0, len(stream), B)]

    def _next_epoch_run(self, cursor: dict | None, current: EpochRun) -> EpochRun:
        """Start assembling the next epoch's first batches (its plan is already fixed), so the
        epoch boundary does not drain the pipeline. When the node cache cannot hold the dataset,
        the next epoch's fetches wait until ``current`` has copied out every shard it reads: its
        fills would otherwise evict shards ``current`` still needs (fetched twice)."""
        plan = self.dataset.plan_epoch(self.spec, self.epoch + 1, cursor, [], self.world_size)
        return EpochRun(self, self._batches(plan), 0, plan,
                         after=current.gathered_all if self._evict_done else None)

    def __iter__(self) -> Iterator[Any]:
        """The batches of the current epoch from the current position (a dict of column arrays,
        or ``collate``'s result); at its end ``epoch`` moves on. Batches are assembled ahead
        (``prefetch``) on threads, and the next epoch's first ones before this one ends."""
        ahead, self._ahead = self._ahead, None
        self._stop()
        if ahead is not None and ahead[0] == (self.epoch, self._position, tuple(self._segments)):
            run = ahead[1]
        else:
            if ahead is not None:
                ahead[1].close()
            plan = self._plan()
            run = EpochRun(self, self._batches(plan), self._position, plan)
        if run.cursor is not None:  # the cursor as planned: with what planning recorded (a callable's weights)
            self._cursor = run.cursor
        self._active = run
        try:
            while True:
                t0 = self.meter.begin()
                item = run.next()
                if item is None:
                    break
                batch, nbytes, fence = item
                if fence is not None:  # this thread's stream waits for the batch's copy (on the GPU)
                    fence.hold()
                self._position += 1
                self.meter.end(t0, nbytes)
                if (self._ahead is None and run.all_submitted() and self.config.prefetch
                        and self.config.cross_epoch):
                    self._ahead = ((self.epoch + 1, 0, ()), self._next_epoch_run(run.next_cursor, run))
                yield batch
            self.meter.pause()
            self._account_epoch(run)
            self.epoch += 1
            self._cursor = run.next_cursor
            self._position, self._segments = 0, []
        finally:
            run.close()
            if self._active is run:
                self._active = None

    def _account_epoch(self, run: EpochRun) -> None:
        """Bytes this epoch fetched from the durable store vs one copy of its shards (what the
        run ahead already fetched for the next epoch is carried over to it)."""
        now = self.dataset.cache.stats.bytes_fetched
        carry = self._ahead[1].filler.fetched_bytes if self._ahead is not None else 0
        fetched = now - self._fetched_mark + self._fetched_carry - carry
        self._fetched_mark, self._fetched_carry = now, carry
        self.meter.end_epoch(fetched, run.needed_bytes, self.config.shuffle_mode, self.dataset.cache_limit)

    def _stop(self) -> None:
        if self._active is not None:
            self._active.close()
            self._active = None
        if self._ahead is not None:
            self._ahead[1].close()
            self._ahead = None

    def close(self) -> None:
        """Stop the epoch runs (the next epoch's prepared one too: its wanted marks on shared
        cache files go with it) and let go of the dataset's open shards."""
        self._stop()
        self.dataset.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- resume -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """JSON-able position: resume yields exactly the batches after the last one returned."""
        return {
            "format": STATE_FORMAT,
            "dataset": self.dataset.source_id,
            "num_samples": len(self.dataset),
            "epoch": self.epoch,
            "position": self._position,
            "world_size": self.world_size,
            "segments": [list(s) for s in self._segments],
            "cursor": self._cursor,
            "spec": self._spec_state(),
        }

    def _spec_state(self) -> dict:
        """The plan settings a state must match (the row counts are checked on their own)."""
        return {k: v for k, v in asdict(self.spec).items() if k not in ("shard_rows", "num_samples")}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a ``state_dict()``: the next batch is the one after the last returned.
        ``ConfigError`` if it was saved for another dataset or with other settings (batch size,
        seed, shuffle); another world size is allowed (the rest is split anew)."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ConfigError(f"not a trainstore loader state: {str(state)[:80]!r}")
        if state.get("num_samples") != len(self.dataset) or state.get("dataset") != self.dataset.source_id:
            if state.get("cursor") is not None and self.dataset.start_cursor() is not None:
                self.dataset.resume_cursor(state["cursor"], self.spec, [])  # names what differs
            raise ConfigError(
                f"loader state is for {state.get('dataset')} ({state.get('num_samples')} rows), "
                f"this loader reads {self.dataset.source_id} ({len(self.dataset)} rows)"
            )
        spec = dict(state["spec"])
        ours = self._spec_state()
        if spec != ours:
            diff = {k: (spec.get(k), ours.get(k)) for k in ours if spec.get(k) != ours.get(k)}
            raise ConfigError(f"loader state was saved with other settings (saved, now): {diff}")
        self._stop()
        self.epoch = int(state["epoch"])
        segments = [(int(w), int(d)) for w, d in state.get("segments", [])]
        position = int(state["position"])
        # the source checks its cursor (a mixture: same sources; new weights start a new era here)
        self._cursor = self.dataset.resume_cursor(state.get("cursor"), self.spec,
                                                  [*segments, (int(state["world_size"]), position)])
        if int(state["world_size"]) != self.world_size:
            if position or segments:
                segments.append((int(state["world_size"]), position))
            position = 0
        self._segments, self._position = segments, position

    # -- stats ------------------------------------------------------------------------------------
    def stats(self) -> dict:
        snap = self.meter.snapshot()
        cs = self.dataset.cache.stats
        snap.update({"cache_hits": cs.hits, "cache_misses": cs.misses, "cache_hit_rate": cs.hit_rate,
                     "bytes_fetched": cs.bytes_fetched, "evictions": cs.evictions,
                     "cache_limit": self.dataset.cache_limit, "cache_limit_reason": self.dataset.cache_limit_reason,
                     "epoch": self.epoch, "position": self._position})
        return snap

    @property
    def batch_alloc(self) -> Alloc | None:
        """Where batch threads gather fixed-size columns: pinned memory for a CUDA device."""
        return pinned_empty if self.config.device is not None else None

    def _finish(self, arrays: dict[str, np.ndarray]) -> tuple[Any, int, CopyFence | None]:
        """The batch as handed out (torch / on the device / collated), its bytes, and the fence
        of its device copy (the consumer ``hold``s it; the batch threads never wait for it)."""
        nbytes = sum(a.nbytes for a in arrays.values() if a.dtype != object)
        fence = None
        if self.config.as_torch or self.config.device is not None:
            import torch  # noqa: PLC0415

            arrays = {k: torch.from_numpy(v) if v.dtype != object else v for k, v in arrays.items()}
        if self.config.device is not None:
            arrays, fence = to_device(arrays, self.config.device)
        if self.collate is not None:
            return self.collate(arrays), nbytes, fence
        return arrays, nbytes, fence


__all__ = ["Loader", "LoaderConfig"]
