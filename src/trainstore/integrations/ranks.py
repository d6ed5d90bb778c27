"""Per-rank state in a distributed checkpoint: each rank's RNG and data position, kept per rank.

DCP treats every plain (non-DTensor) value as replicated: entries under the same key on every
rank are written once, from one rank. State that differs per rank (the RNG after a rank drew
its own dropout masks, a loader position) therefore goes under a key of its own rank,
``state[RANKS_KEY] = own_entry(value)`` (-> ``{"ranks": {"rank<r>": value}}``), and is loaded
back, after the main restore chose its step, by ``restore_rank_state`` - in a second,
small collective load of exactly that step, because which ranks have an entry depends on the
world size that step was saved with. A rank the saved world did not have (2 -> 3 ranks) has
no entry: it keeps its own state and ``RankRestore`` says so (framework integrations log it
and append it to ``last_restore``), it is never silently dropped. Entries of ranks that no
longer exist (2 -> 1) are not read, and said as well.

    state["ranks"] = own_entry({"rng": rng_state()})
    mgr.save(step, state)
    ...
    result = mgr.restore_into(main_target)                        # picks the step (with fallback)
    entry, report = restore_rank_state(mgr, result.step, {"rng": rng_state()})
    if entry is not None: restore_rng(entry["rng"])
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..checkpoint import CheckpointManager, capture_rng
from ..checkpoint.format import manifest as mf

log = logging.getLogger("trainstore.integrations.ranks")

RANKS_KEY = "ranks"


def rank_and_world() -> tuple[int, int]:
    """``(rank, world size)`` of this process: ``(0, 1)`` outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_key(rank: int) -> str:
    return f"rank{int(rank)}"


def own_entry(value: Any, rank: int | None = None) -> dict[str, Any]:
    """``{"rank<r>": value}`` for this rank (or ``rank``): put it under ``state[RANKS_KEY]``."""
    return {rank_key(rank_and_world()[0] if rank is None else rank): value}


def rng_state() -> dict[str, Any]:
    """``capture_rng()`` with its numpy arrays as int64 tensors: a per-rank value DCP stores as
    chunks (restore it with ``checkpoint.restore_rng``, which takes either)."""
    def conv(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, np.ndarray):
            return torch.from_numpy(v.astype(np.int64))
        return v
    return conv(capture_rng())


def saved_world(manifest: mf.Manifest) -> int:
    """World size a checkpoint was saved with (1: a single-process save)."""
    d = manifest.metadata.get("dcp")
    if isinstance(d, dict) and isinstance(d.get("world_size"), int):
        return d["world_size"]
    return 1


@dataclass(frozen=True)
class RankRestore:
    """What ``restore_rank_state`` could move for this rank."""

    step: int
    rank: int
    world: int
    saved_world: int
    restored: bool  # this rank's own entry was loaded

    @property
    def moved_all(self) -> bool:
        return self.restored and self.world == self.saved_world

    def __str__(self) -> str:
        if self.moved_all:
            return f"per-rank state of step {self.step}: restored on every rank"
        parts = [f"step {self.step} was saved by {self.saved_world} rank(s), resumed on {self.world}"]
        if not self.restored:
            parts.append(f"rank {self.rank} has no saved per-rank state (RNG, position): it keeps its own")
        if self.saved_world > self.world:
            parts.append(f"the per-rank state of ranks {self.world}..{self.saved_world - 1} is not used")
        return "; ".join(parts)


def restore_rank_state(mgr: CheckpointManager, step: int, template: Any) -> tuple[Any | None, RankRestore]:
    """This rank's ``own_entry`` of checkpoint ``step``, loaded into ``template``'s structure,
    or None when the saved world had no such rank. Every rank of a multi-rank job calls it
    (the load of a distributed checkpoint is collective). The report is logged when a rank's
    state could not move."""
    rank, world = rank_and_world()
    m = mgr.manifest(step)
    saved = saved_world(m)
    have = rank < saved
    entry = None
    if "dcp" in m.metadata:  # a DCP load is collective: every rank takes part, even with nothing to load
        target: dict[str, Any] = {RANKS_KEY: {rank_key(rank): template}} if have else {}
        mgr.restore_into(target, step)
        entry = target[RANKS_KEY][rank_key(rank)] if have else None
    elif have:  # a single-process save: rank 0's entry, read whole
        entry = (mgr.restore(step).get(RANKS_KEY) or {}).get(rank_key(rank))
        have = entry is not None
    report = RankRestore(step, rank, world, saved, have)
    if not report.moved_all:
        log.warning("%s", report)
    return entry, report


__all__ = ["RANKS_KEY", "rank_and_world", "rank_key", "own_entry", "rng_state", "saved_world", "RankRestore",
           "restore_rank_state"]
