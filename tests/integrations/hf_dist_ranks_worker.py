"""Rank functions for tests/integrations/test_hf_dist_ranks.py (run by harness.dist.run_ranks)."""

from __future__ import annotations

import torch

from trainstore.checkpoint import CheckpointManager
from trainstore.integrations.ranks import RANKS_KEY, own_entry, restore_rank_state


def save(rank: int, world: int, args: dict) -> dict:
    """Every rank saves a replicated tensor and a per-rank value that differs by rank."""
    with CheckpointManager(args["store"], "ranks") as mgr:
        state = {"w": torch.arange(4.0), RANKS_KEY: own_entry({"x": torch.full((3,), float(rank)), "n": rank * 10})}
        mgr.save(1, state, kind="full")
        mgr.wait()
    return {}


def load(rank: int, world: int, args: dict) -> dict:
    """Every rank loads its own entry (or learns it has none)."""
    with CheckpointManager(args["store"], "ranks") as mgr:
        entry, report = restore_rank_state(mgr, 1, {"x": torch.zeros(3), "n": -1})
    return {"entry": None if entry is None else [entry["x"].tolist(), entry["n"]],
            "restored": report.restored, "moved_all": report.moved_all, "text": str(report)}


def one_rank_fails_first(rank: int, world: int, args: dict) -> dict:
    """Step 1 saves on both ranks; at step 2 rank 1 passes a bad state (refused before any
    collective) and stays alive, so only the group timeout can end rank 0's wait."""
    import time

    with CheckpointManager(args["store"], "fail") as mgr:
        mgr.save(1, {"w": torch.ones(4)}, kind="full")
        mgr.wait()
        if rank == 1:
            try:
                mgr.save(2, ["not", "a", "dict"])
                err = None
            except Exception as exc:  # noqa: BLE001 - reported
                err = f"{type(exc).__name__}: {exc}"
            time.sleep(args["linger"])
            return {"error": err}
        t0 = time.monotonic()
        try:
            mgr.save(2, {"w": torch.ones(4)}, kind="full")
            mgr.wait()
            return {"error": None, "type": None, "seconds": time.monotonic() - t0}
        except Exception as exc:  # noqa: BLE001 - reported
            return {"error": str(exc), "type": type(exc).__name__, "seconds": time.monotonic() - t0}
