"""``trainstore ckpt stats`` reports from what the store records (issue 29 item 4): saves from the
committed manifests and verifications from the verify records, not from an observer the CLI
process never had; what no process recorded is said to be unrecorded, never shown as 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from trainstore import CheckpointManager


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainstore", "ckpt", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "80"})


def row(out: str, name: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith(name + " ")]
    assert len(lines) == 1, (name, out)
    return lines[0]


def test_stats_count_saves_and_verifications_the_store_records(tmp_path):
    root = str(tmp_path / "s")
    with CheckpointManager(root, "run") as mgr:  # no metrics observer: nothing but the checkpoints
        for step in (1, 2, 3):
            mgr.save(step, {"w": torch.full((4,), float(step))}, blocking=True)
        mgr.verify(step=2)
    got = json.loads(cli("stats", root, "-j", "run", "--json").stdout)
    assert got["saves"] == 3 and got["verified"] == 1 and got["verified_bad"] == 0, got
    assert got["processes_reporting"] == 0
    proc = cli("stats", root, "-j", "run")
    assert proc.returncode == 0, proc.stderr
    assert "3 committed" in row(proc.stdout, "saves"), proc.stdout
    assert "1 of 3 checkpoints verified" in row(proc.stdout, "verifications"), proc.stdout
    assert "not recorded" in row(proc.stdout, "restores"), proc.stdout
    assert "observed 0" not in proc.stdout and "0 (0 failed)" not in proc.stdout, proc.stdout
