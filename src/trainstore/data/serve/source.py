"""What the ``Loader`` needs of what it serves: the source interface ``Dataset`` and ``Mixture`` implement.

The loader, its shard fill-ahead (``fill``) and packing see a source through four things:

* **rows**: ``len()`` (samples per epoch), ``column_names``, ``take(rows, gathered=...)``
  gathering rows of the source's row space into fresh batch arrays (``gathered(shard)`` as
  each shard's rows are copied out);
* **shard plan**: ``shards`` (key, rows, bytes) and ``offsets`` over the row space, and the
  node-cache side of them (``pin_shard``, ``close_shard``, ``want_shard`` / ``unwant_shard``
  (eviction order: the rank of a shard's next use), pressure hooks, ``cache.stats``,
  ``cache_limit``, ``max_shard_bytes``; ``decode_sources``: the Parquet datasets whose row
  groups the loader decodes ahead, with each batch's rows of each);
* **epoch plan**: ``plan_epoch`` gives every rank's rows for an epoch (or the rest of a resumed
  one), given the source's *cursor* (JSON-able; None for a ``Dataset``, whose plan is the
  sampler's, a function of the epoch alone; a mixture's stream position and weight eras);
* **state**: ``source_id`` (what a saved state must match), ``start_cursor`` and
  ``resume_cursor`` (check a saved cursor against this source, adapt it: a mixture with new
  weights starts a new era).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ...errors import ConfigError
from .sampler import PlanSpec, epoch_streams

#: ``alloc(shape, dtype)``: the array a fixed-size column of a batch is gathered into (None:
#: ``np.empty``). The loader passes pinned host memory when it copies batches to a GPU
#: (``devicecopy.pinned_empty``), so the copy starts from the gathered rows themselves.
Alloc = Callable[[tuple[int, ...], np.dtype], np.ndarray]


def batch_array(alloc: Alloc | None, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """The array column ``name`` of a batch is gathered into (object columns: always numpy's)."""
    if dtype is None or alloc is None:
        return np.empty(shape, dtype=dtype if dtype is not None else object)
    out = alloc(shape, np.dtype(dtype))
    if not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != np.dtype(dtype):
        got = f"{out.dtype}{list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
        raise ConfigError(f"batch allocator gave {got} for column {name!r}, which needs {np.dtype(dtype)}{list(shape)}")
    return out


@dataclass(frozen=True)
class EpochPlan:
    """Every rank's rows for the current segment of an epoch, the cursor it was planned from
    (with what planning recorded) and the cursor the next epoch starts from."""

    streams: list[np.ndarray]
    cursor: dict | None = None
    next_cursor: dict | None = None


@runtime_checkable
class ServeSource(Protocol):
    """A servable source of rows (see the module doc); read-only members as properties, so
    plain attributes of a narrower type implement them."""

    @property
    def shards(self) -> Sequence[Any]: ...
    @property
    def offsets(self) -> np.ndarray: ...
    @property
    def column_names(self) -> tuple[str, ...]: ...
    @property
    def max_shard_bytes(self) -> int: ...
    @property
    def cache_limit(self) -> int: ...
    @property
    def cache_limit_reason(self) -> str: ...

    def __len__(self) -> int: ...
    def take(self, indices: Any, *, gathered: Callable[[int], None] | None = None,
             alloc: Alloc | None = None) -> dict[str, np.ndarray]: ...
    def pin_shard(self, shard: int, *, ahead: bool = False, needed: Callable[[], bool] | None = None) -> Any: ...
    def close_shard(self, shard: int, evict: bool = False) -> None: ...
    def want_shard(self, shard: int, rank: float, owner: int) -> None: ...
    def unwant_shard(self, shard: int, owner: int) -> None: ...
    def add_pressure_hook(self, hook: Callable[[], None]) -> None: ...
    def remove_pressure_hook(self, hook: Callable[[], None]) -> None: ...
    def close(self) -> None: ...

    @property
    def cache(self) -> Any: ...
    @property
    def source_id(self) -> str: ...
    @property
    def source_bytes(self) -> int: ...

    def start_cursor(self, epoch: int = 0, previous: dict | None = None) -> dict | None: ...
    def plan_epoch(self, spec: PlanSpec, epoch: int, cursor: dict | None,
                   segments: list[tuple[int, int]], world_size: int) -> EpochPlan: ...
    def resume_cursor(self, cursor: dict | None, spec: PlanSpec,
                      segments: list[tuple[int, int]]) -> dict | None: ...
    def decode_sources(self, batches: Sequence[np.ndarray]) -> list[tuple[Any, list[np.ndarray]]]: ...


class SamplerPlanned:
    """The epoch plan of a source whose order is the sampler's alone (``Dataset``): no cursor;
    and its decode-ahead: itself when it is a Parquet version."""

    decoded_groups: Any  # the Dataset's decoded Parquet row groups, or None

    def start_cursor(self, epoch: int = 0, previous: dict | None = None) -> None:
        return None

    def plan_epoch(self, spec: PlanSpec, epoch: int, cursor: dict | None,
                   segments: list[tuple[int, int]], world_size: int) -> EpochPlan:
        return EpochPlan(epoch_streams(spec, epoch, segments, world_size))

    def resume_cursor(self, cursor: dict | None, spec: PlanSpec, segments: list[tuple[int, int]]) -> None:
        return None

    def decode_sources(self, batches: Sequence[np.ndarray]) -> list[tuple[Any, list[np.ndarray]]]:
        return [(self, list(batches))] if self.decoded_groups is not None else []


__all__ = ["EpochPlan", "SamplerPlanned", "ServeSource"]
