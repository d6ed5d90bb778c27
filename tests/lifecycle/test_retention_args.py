"""Retention in one argument (issue 29 item 2): ``CheckpointManager(..., max_to_keep=N,
keep_best=(k, "val_loss"))`` maps to the composable rules (LatestN, BestN, Registered)."""

from __future__ import annotations

import pytest
import torch

from trainstore import CheckpointManager, CheckpointPolicy
from trainstore.errors import ConfigError

ALL_FULL = CheckpointPolicy(full_every=1, incremental_every=None)
LOSS = {1: 0.1, 2: 0.9, 3: 0.5, 4: 0.8, 5: 0.7, 6: 0.6}


def _train(root: str, **retention) -> list[int]:
    with CheckpointManager(root, "run", ALL_FULL, **retention) as mgr:
        for step, loss in LOSS.items():
            mgr.save(step, {"w": torch.full((8,), float(step))}, metrics={"val_loss": loss}, blocking=True)
        mgr.wait()
    with CheckpointManager(root, "run") as mgr:
        return [i.step for i in mgr.list()]


def test_max_to_keep_keeps_the_newest(tmp_path):
    assert _train(str(tmp_path / "a"), max_to_keep=2) == [5, 6]


def test_keep_best_adds_the_best_by_metric(tmp_path):
    assert _train(str(tmp_path / "b"), max_to_keep=1, keep_best=(2, "val_loss")) == [1, 3, 6]
    assert _train(str(tmp_path / "c"), max_to_keep=1, keep_best=(1, "val_loss", "max")) == [2, 6]


def test_no_argument_keeps_everything(tmp_path):
    assert _train(str(tmp_path / "d")) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("kwargs", [{"max_to_keep": 0}, {"max_to_keep": "3"}, {"keep_best": ("val_loss", 2)},
                                    {"keep_best": (2, "val_loss", "lowest")}, {"keep_best": 2}])
def test_bad_retention_arguments_are_config_errors(tmp_path, kwargs):
    with pytest.raises(ConfigError) as err:
        CheckpointManager(str(tmp_path / "e"), "run", **kwargs)
    assert next(iter(kwargs)) in str(err.value)
    assert not (tmp_path / "e").exists() or not any((tmp_path / "e").iterdir())
