"""One log line at resume says which step was restored, from which tier, and what was skipped
(issue 29 item 5); the integrations log the same ``RestoreResult``."""

from __future__ import annotations

import logging

import torch

from trainstore import CheckpointManager
from trainstore.lifecycle.tiering import Tiering


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "restored step" in r.getMessage()]


def test_restore_logs_step_tier_and_skipped(tmp_path, caplog):
    root = str(tmp_path / "s")
    with CheckpointManager(root, "run") as mgr:
        mgr.save(1, {"w": torch.ones(4)}, blocking=True)
    with caplog.at_level(logging.INFO, logger="trainstore"), CheckpointManager(root, "run") as mgr:
        mgr.restore()
        assert mgr.last_restore.tier == f"file://{root}"
    lines = _lines(caplog)
    assert len(lines) == 1 and "restored step 1 (full) from file://" in lines[0], lines


def test_restore_from_the_durable_tier_says_so(tmp_path, caplog):
    tiers = Tiering(str(tmp_path / "hot"), str(tmp_path / "durable"))
    with tiers.manager("run") as mgr:
        mgr.save(1, {"w": torch.ones(4)}, blocking=True)
    tiers.close()  # waits for the durable copy
    # a new machine: an empty hot tier, the checkpoint only in the durable one
    fresh = Tiering(str(tmp_path / "hot2"), str(tmp_path / "durable"))
    with caplog.at_level(logging.INFO, logger="trainstore"), fresh.manager("run") as mgr:
        mgr.restore()
        assert mgr.last_restore.tier.startswith("durable"), mgr.last_restore.tier
    fresh.close()
    assert any("from durable" in line for line in _lines(caplog)), _lines(caplog)
