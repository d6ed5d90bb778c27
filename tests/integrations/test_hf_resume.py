"""Kill-and-resume of real Hugging Face training (Trainer, accelerate) through trainstore.

A child process trains a tiny GPT-2 on CPU and is SIGKILLed mid-epoch after a checkpoint
committed; a new process resumes from the newest checkpoint that verifies and finishes. Its
parameters, optimizer and scheduler state must be bit-identical to an uninterrupted run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import require  # tests/conftest.py: optional dependencies

require("transformers", install="pip install 'trainstore[hf]'")
require("accelerate", install="pip install 'trainstore[hf]'")

from trainstore.checkpoint import CheckpointManager  # noqa: E402

CHILD = Path(__file__).with_name("hf_child.py")
TOTAL_STEPS = 24


def start(mode: str, store: str, job: str, root: Path, out: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(CHILD), mode, store, job, str(root), str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def finish(p: subprocess.Popen, timeout: float = 240) -> str:
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out[-3000:]
    assert "DONE" in out
    return out


def kill_mid_run(p: subprocess.Popen, store: str, job: str, committed_at_least: int, steps_at_least: int) -> int:
    """SIGKILL ``p`` once a checkpoint >= ``committed_at_least`` is committed and the run has
    passed ``steps_at_least``; returns the last step it printed."""
    listing = CheckpointManager(store, job)
    last, deadline = -1, time.monotonic() + 240
    try:
        for line in p.stdout:  # type: ignore[union-attr]
            if line.startswith("STEP "):
                last = int(line.split()[1])
                if last >= steps_at_least and any(s >= committed_at_least for s in listing.steps()):
                    break
            assert time.monotonic() < deadline, "child too slow"
        else:
            pytest.fail(f"child ended before the kill: rc={p.wait()}")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        assert p.returncode == -signal.SIGKILL
    finally:
        listing.close()
    return last


def assert_identical(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"] == TOTAL_STEPS
    assert a["params"].keys() == b["params"].keys()
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k]), f"parameter {k} differs"
    sa, sb = a["optim"]["state"], b["optim"]["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    for i in sa:
        for k in sa[i]:
            assert torch.equal(torch.as_tensor(sa[i][k]), torch.as_tensor(sb[i][k])), f"optimizer state {i}/{k} differs"
    assert a["optim"]["param_groups"] == b["optim"]["param_groups"]
    assert a["sched"] == b["sched"]


@pytest.mark.parametrize("mode", ["trainer", "accelerate"])
def test_sigkill_mid_epoch_then_resume_is_bit_identical(tmp_path: Path, mode: str) -> None:
    store = f"file://{tmp_path / 'store'}"
    ref = start(mode, store, "ref", tmp_path / "ref", tmp_path / "ref.pt")
    victim = start(mode, store, "run", tmp_path / "run", tmp_path / "killed.pt", "--slow-after", "10")
    killed_at = kill_mid_run(victim, store, "run", committed_at_least=10, steps_at_least=12)
    assert killed_at < TOTAL_STEPS
    assert not (tmp_path / "killed.pt").exists()
    finish(start(mode, store, "run", tmp_path / "run", tmp_path / "resumed.pt", "--resume"))
    finish(ref)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    reference = torch.load(tmp_path / "ref.pt", weights_only=True)
    # resumed from a committed step inside epoch 0 (12 steps per epoch): a mid-epoch resume
    assert 10 <= resumed["restored"] <= killed_at and resumed["restored"] % 12 != 0
    assert_identical(resumed, reference)
    if mode == "trainer":  # the Trainer wrote no checkpoint-N folders: everything went to the store
        assert not list((tmp_path / "run").glob("checkpoint-*"))
