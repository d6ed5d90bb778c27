"""Epoch plans: which samples each rank reads, in which order, for one (seed, epoch).

Two orders:

* ``full``: one uniform permutation of all rows per epoch, split into equal contiguous
  parts per rank. Best statistical quality; every batch touches ~batch_size shards, so each
  rank reads (and caches) nearly every shard every epoch.
* ``block``: shards are assigned to ranks once (contiguous, balanced by rows, the same every
  epoch, so a node keeps caching the shards it reads); each epoch a rank shuffles the order
  of its shards and shuffles rows within windows of ``block_shards`` consecutive shards.
  Only a window's shards are in flight, but rows stay near their shard-mates.

Both give every rank exactly ``n`` samples: ``ceil(N/W)`` padded with repeats of the
epoch's first samples (``drop_last=False``), or ``floor(N/W)`` rounded down to whole batches
(``drop_last=True``). Ranks whose shards hold more rows than ``n`` hand the surplus (chosen
per epoch) to ranks holding fewer. No rank ever has an extra batch to wait for.

Resume: a rank's position is the number of batches it has consumed; all ranks advance in
lockstep, so the epoch's consumed set is known from (world size, batches). The remainder, in
a canonical order (batch step by step, rank by rank), can be re-split across any new world
size; ``segments`` records each world size the epoch ran with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError

MODES = ("full", "block", "none")


@dataclass(frozen=True)
class PlanSpec:
    """What determines an epoch's order (all JSON-able)."""

    num_samples: int
    shard_rows: tuple[int, ...]
    batch_size: int
    seed: int = 0
    shuffle_mode: str = "full"
    block_shards: int = 4
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.shuffle_mode not in MODES:
            raise ConfigError(f"shuffle_mode must be one of {MODES}, got {self.shuffle_mode!r}")
        if self.batch_size <= 0:
            raise ConfigError(f"batch_size must be positive, got {self.batch_size}")
        if self.block_shards <= 0:
            raise ConfigError(f"block_shards must be positive, got {self.block_shards}")


def _rng(seed: int, epoch: int, salt: int = 0) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, salt])))


def per_rank_count(total: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    if drop_last:
        return (total // world_size) // batch_size * batch_size
    return -(-total // world_size)


def shard_ranges(shard_rows: tuple[int, ...], world_size: int) -> list[list[int]]:
    """Contiguous shard groups per rank, balanced by rows; stable for a given world size."""
    cum = np.cumsum(shard_rows)
    total = int(cum[-1]) if len(cum) else 0
    groups: list[list[int]] = [[] for _ in range(world_size)]
    for s, end in enumerate(cum):
        mid = end - shard_rows[s] / 2.0
        r = min(world_size - 1, int(mid * world_size / total)) if total else s % world_size
        groups[r].append(s)
    return groups


def rank_streams(spec: PlanSpec, epoch: int, world_size: int) -> list[np.ndarray]:
    """Every rank's sample order for ``epoch`` (equal lengths)."""
    if world_size <= 0:
        raise ConfigError(f"world_size must be positive, got {world_size}")
    n_total = spec.num_samples
    n = per_rank_count(n_total, world_size, spec.batch_size, spec.drop_last)
    if spec.shuffle_mode != "block":
        if spec.shuffle_mode == "full":
            perm = _rng(spec.seed, epoch).permutation(n_total)
        else:
            perm = np.arange(n_total, dtype=np.int64)
        need = n * world_size
        if need > n_total:
            perm = np.concatenate([perm, np.resize(perm, need - n_total)])
        perm = perm[:need].astype(np.int64)
        return [perm[r * n:(r + 1) * n] for r in range(world_size)]
    return _block_streams(spec, epoch, world_size, n)


def _block_streams(spec: PlanSpec, epoch: int, world_size: int, n: int) -> list[np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum(spec.shard_rows)]).astype(np.int64)
    groups = shard_ranges(spec.shard_rows, world_size)
    rng = _rng(spec.seed, epoch, 1)
    # rows each rank keeps, and the surplus it hands over
    kept: list[list[np.ndarray]] = []
    pool: list[np.ndarray] = []
    for r in range(world_size):
        rows = [np.arange(offsets[s], offsets[s + 1]) for s in groups[r]]
        count = sum(len(x) for x in rows)
        if count > n:
            flat = np.concatenate(rows)
            drop = np.zeros(len(flat), dtype=bool)
            drop[rng.choice(len(flat), count - n, replace=False)] = True
            pool.append(flat[drop])
            rows = [x[~drop[o:o + len(x)]] for x, o in zip(rows, np.cumsum([0] + [len(x) for x in rows[:-1]]))]
        kept.append(rows)
    spill = np.concatenate(pool) if pool else np.empty(0, dtype=np.int64)
    spill = spill[rng.permutation(len(spill))]
    deficit = [n - sum(len(x) for x in kept[r]) for r in range(world_size)]
    short = sum(deficit) - len(spill)
    if short > 0:  # padding: repeat rows drawn from this epoch's order
        spill = np.concatenate([spill, rng.permutation(spec.num_samples)[:short] if short <= spec.num_samples
                                else np.resize(rng.permutation(spec.num_samples), short)])
    streams = []
    pos = 0
    for r in range(world_size):
        rows = list(kept[r])
        if deficit[r] > 0:
            rows.append(spill[pos:pos + deficit[r]])
            pos += deficit[r]
        streams.append(_window_shuffle(rows, spec.block_shards, rng))
    return streams


def _window_shuffle(groups: list[np.ndarray], window: int, rng: np.random.Generator) -> np.ndarray:
    groups = [g for g in groups if len(g)]
    if not groups:
        return np.empty(0, dtype=np.int64)
    order = rng.permutation(len(groups))
    parts = []
    for w in range(0, len(order), window):
        rows = np.concatenate([groups[i] for i in order[w:w + window]])
        parts.append(rows[rng.permutation(len(rows))])
    return np.concatenate(parts).astype(np.int64)


def remainder(streams: list[np.ndarray], batches_done: int, batch_size: int) -> np.ndarray:
    """Unconsumed samples after every rank consumed ``batches_done`` batches, canonical order."""
    start = batches_done * batch_size
    rest = [s[start:] for s in streams]
    out = []
    longest = max((len(s) for s in rest), default=0)
    for b in range(0, longest, batch_size):
        for s in rest:
            out.append(s[b:b + batch_size])
    return np.concatenate(out).astype(np.int64) if out else np.empty(0, dtype=np.int64)


def split_remainder(rest: np.ndarray, world_size: int, batch_size: int, drop_last: bool) -> list[np.ndarray]:
    """Re-split a remainder across ``world_size`` ranks, equal counts (pad or drop)."""
    n = per_rank_count(len(rest), world_size, batch_size, drop_last)
    need = n * world_size
    if need > len(rest):
        rest = np.concatenate([rest, np.resize(rest, need - len(rest))]) if len(rest) else rest
    return [rest[r * n:(r + 1) * n] for r in range(world_size)]


def epoch_streams(
    spec: PlanSpec, epoch: int, segments: list[tuple[int, int]], world_size: int
) -> list[np.ndarray]:
    """Rank streams for the current (possibly resumed) segment of ``epoch``.

    ``segments``: earlier ``(world_size, batches_done)`` runs of this epoch, oldest first.
    """
    if not segments:
        return rank_streams(spec, epoch, world_size)
    w0, _ = segments[0]
    streams = rank_streams(spec, epoch, w0)
    for i, (_w, done) in enumerate(segments):
        rest = remainder(streams, done, spec.batch_size)
        nxt = segments[i + 1][0] if i + 1 < len(segments) else world_size
        streams = split_remainder(rest, nxt, spec.batch_size, spec.drop_last)
    return streams


__all__ = ["MODES", "PlanSpec", "epoch_streams", "per_rank_count", "rank_streams", "remainder",
           "shard_ranges", "split_remainder"]
