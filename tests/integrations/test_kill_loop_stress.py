"""Stress variants of the integration kill-and-resume tests (``make stress``).

The `make test` versions kill each framework's training once, at a chosen point. Here each run
is killed several times at random steps, with a random delay after the step so kills also land
while an async save is staging, writing or committing; every restart resumes from what the
store holds, and the run that finally completes must be bit-identical to one uninterrupted run.
The seed of each round is printed so a failure can be replayed (``TRAINSTORE_STRESS_SEED``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from trainstore.checkpoint import CheckpointManager

from .test_hf_resume import (
    TOTAL_STEPS as HF_STEPS,
    assert_identical,
    finish as hf_finish,
    start as hf_start,
)
from .test_lightning import STEPS_PER_EPOCH, assert_bit_identical, child, finish

pytestmark = pytest.mark.stress

KILLS = int(os.environ.get("TRAINSTORE_STRESS_KILLS", "3"))


def seeded() -> random.Random:
    seed = int(os.environ.get("TRAINSTORE_STRESS_SEED", str(time.time_ns() % 2**31)))
    print(f"TRAINSTORE_STRESS_SEED={seed}")
    return random.Random(seed)


def kill_after(p: subprocess.Popen, step: int, delay_s: float) -> int | None:
    """SIGKILL ``p`` ``delay_s`` after it prints a step >= ``step``; None if it finished first."""
    seen = None
    for line in p.stdout:  # type: ignore[union-attr]
        if line.startswith("STEP ") and int(line.split()[1]) >= step:
            seen = int(line.split()[1])
            time.sleep(delay_s)
            break
    if seen is None:
        p.wait(timeout=60)
        return None
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=60)
    return seen


def has_checkpoint(store: str, job: str) -> bool:
    with CheckpointManager(store, job) as mgr:
        return bool(mgr.steps())


def kill_points(rng: random.Random, first: int, last: int) -> list[int]:
    """``KILLS`` increasing steps in [first, last], at least 3 apart (a save fits between)."""
    points, lo = [], first
    span = max(3, (last - first) // KILLS)
    for _ in range(KILLS):
        points.append(rng.randint(lo, lo + span - 1))
        lo = points[-1] + 3
    return [p for p in points if p <= last]


def test_lightning_repeated_sigkills_end_bit_identical(tmp_path: Path) -> None:
    rng = seeded()
    ref = child(tmp_path / "ref-store", tmp_path / "ref", tmp_path / "ref.pt")
    store, root, kills = tmp_path / "store", tmp_path / "run", 0
    for step in kill_points(rng, 6, 2 * STEPS_PER_EPOCH - 6):
        extra = ["--resume"] if has_checkpoint(str(store), "job") else []
        victim = child(store, root, tmp_path / "victim.pt", *extra, "--slow-after", "0")
        if kill_after(victim, step, rng.uniform(0.0, 0.3)) is not None:
            kills += 1
    assert kills >= 1
    assert not (tmp_path / "victim.pt").exists()
    finish(child(store, root, tmp_path / "resumed.pt", "--resume"), "final resume")
    finish(ref, "reference run")
    a = torch.load(tmp_path / "ref.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert b["global_step"] == a["global_step"] == 2 * STEPS_PER_EPOCH
    for part in ("params", "optim", "sched"):
        assert_bit_identical(a[part], b[part], part)


@pytest.mark.parametrize("mode", ["trainer", "accelerate"])
def test_hf_repeated_sigkills_end_bit_identical(tmp_path: Path, mode: str) -> None:
    rng = seeded()
    store = f"file://{tmp_path / 'store'}"
    ref = hf_start(mode, f"file://{tmp_path / 'ref-store'}", "ref", tmp_path / "ref", tmp_path / "ref.pt")
    kills = 0
    for step in kill_points(rng, 4, HF_STEPS - 4):
        extra = ["--resume"] if has_checkpoint(store, "run") else []
        victim = hf_start(mode, store, "run", tmp_path / "run", tmp_path / "victim.pt", *extra, "--slow-after", "0")
        if kill_after(victim, step, rng.uniform(0.0, 0.3)) is not None:
            kills += 1
    assert kills >= 1
    hf_finish(hf_start(mode, store, "run", tmp_path / "run", tmp_path / "resumed.pt", "--resume"))
    hf_finish(ref)
    assert_identical(torch.load(tmp_path / "resumed.pt", weights_only=True),
                     torch.load(tmp_path / "ref.pt", weights_only=True))
