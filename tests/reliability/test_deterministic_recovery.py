"""Deterministic recovery: train a small model (Loader + CheckpointManager), SIGKILL it at
random steps, resume each time from the newest valid checkpoint: the final weights equal an
uninterrupted run's bit for bit (model, optimizer, RNG and loader position restored)."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
from harness import child_env, module_command
from harness.trainjob import JobConfig, train

from .conftest import record


def _reference(tmp_path, cfg: JobConfig) -> dict:
    import torch

    threads = torch.get_num_threads()
    try:
        return train(str(tmp_path / "ref-store"), "ref", str(tmp_path / "ref-cache"), str(tmp_path / "ref.npz"),
                     cfg, log=lambda m: None)
    finally:
        torch.set_num_threads(threads)


def _run_child(store: str, cache: str, out: str, cfg: JobConfig, kill_at: int | None) -> tuple[list[str], bool]:
    """Run the training child; SIGKILL it once it reports step ``kill_at``. (lines, killed)"""
    cmd = module_command("trainjob", "train", store, "job", cache, out, "--steps", str(cfg.steps),
                         "--optimizer", cfg.optimizer)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    lines: list[str] = []
    done = threading.Event()
    killed = False

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.strip())
            if kill_at is not None and line.startswith("STEP ") and int(line.split()[1]) >= kill_at:
                proc.send_signal(signal.SIGKILL)
        done.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    proc.wait(240)
    done.wait(10)
    killed = proc.returncode == -signal.SIGKILL
    err = proc.stderr.read()
    assert killed or proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return lines, killed


def _recovery_trials(tmp_path, kills: int, seed: int, cfg: JobConfig) -> dict:
    rng = random.Random(seed)
    reference = _reference(tmp_path, cfg)
    store, cache, out = str(tmp_path / "store"), str(tmp_path / "cache"), str(tmp_path / "final.npz")
    saved, done, done_kills, resumed_from, t0 = 0, False, 0, [], time.monotonic()
    while not done:
        # Kill somewhere after the newest checkpoint, so every run makes progress.
        can_kill = done_kills < kills and saved + 1 <= cfg.steps - 1
        kill_at = rng.randint(saved + 1, min(cfg.steps - 1, saved + 2 * cfg.save_every)) if can_kill else None
        lines, killed = _run_child(store, cache, out, cfg, kill_at)
        resumed_from += [int(x.split()[1]) for x in lines if x.startswith("RESUMED ")]
        saved = max([int(x.split()[1]) for x in lines if x.startswith("SAVED ")] + [saved])
        if killed:
            done_kills += 1
        else:
            assert lines[-1] == "DONE", lines[-5:]
            done = True
    final = dict(np.load(out))
    assert final.keys() == reference.keys()
    for name in reference:
        assert final[name].tobytes() == reference[name].tobytes(), f"{name} differs after {done_kills} kills"
    return {"kills": done_kills, "resumes": len(resumed_from), "resumed_from_steps": resumed_from[:60],
            "steps": cfg.steps, "bit_exact": True, "seconds": round(time.monotonic() - t0, 1)}


@pytest.mark.timeout(400)
def test_killed_training_resumes_bit_exact(tmp_path):
    figures = _recovery_trials(tmp_path, kills=5, seed=1, cfg=JobConfig(steps=24, optimizer="plain-adam"))
    assert figures["kills"] == 5 and figures["resumes"] >= 2
    record("deterministic_recovery", **figures)


@pytest.mark.stress
@pytest.mark.timeout(1800)
def test_killed_training_resumes_bit_exact_stress(tmp_path):
    """50 kills in all: 40 with the plain Adam, 10 with torch.optim.Adam (whose first use
    imports torch._dynamo, ~10 s per restarted process here)."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "torch").mkdir()
    plain = _recovery_trials(tmp_path / "plain", kills=40, seed=2, cfg=JobConfig(steps=200, optimizer="plain-adam"))
    record("deterministic_recovery_stress_plain_adam", **plain)
    torch_adam = _recovery_trials(tmp_path / "torch", kills=10, seed=3, cfg=JobConfig(steps=60, optimizer="torch-adam"))
    record("deterministic_recovery_stress_torch_adam", **torch_adam)
