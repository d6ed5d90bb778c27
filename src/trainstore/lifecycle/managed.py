"""Retention in one argument: ``CheckpointManager(..., max_to_keep=N, keep_best=(k, "val_loss"))``.

The arguments users bring from Orbax (``max_to_keep``, best-n by a metric) and the frameworks
(``save_total_limit``, ``save_top_k``) map to the composable rules of ``retention_rules``:
``AnyOf(LatestN(N), BestN(metric, k, mode), Registered())``, applied after every committed
save by a ``retention_hook``. Registered model versions are always kept, and so is the full
base of every kept incremental, so a job may hold a few more checkpoints than ``N + k``.

This lives in ``lifecycle`` (the rules and their application do) and subclasses the
checkpoint layer's manager; ``trainstore.CheckpointManager`` is this class.
"""

from __future__ import annotations

from typing import Any

from ..checkpoint.manager import CheckpointManager as _Manager
from ..errors import ConfigError
from .retention import retention_hook
from .retention_rules import AnyOf, BestN, LatestN, Registered, Rule


def retention_rule(max_to_keep: int | None = None, keep_best: Any = None) -> Rule | None:
    """The rule ``max_to_keep`` / ``keep_best`` stand for (None: keep everything)."""
    rules: list[Rule] = []
    if max_to_keep is not None:
        if not isinstance(max_to_keep, int) or isinstance(max_to_keep, bool) or max_to_keep < 1:
            raise ConfigError(f"max_to_keep must be a positive int (the newest N checkpoints), got {max_to_keep!r}")
        rules.append(LatestN(max_to_keep))
    if keep_best is not None:
        if (not isinstance(keep_best, tuple) or len(keep_best) not in (2, 3) or not isinstance(keep_best[0], int)
                or isinstance(keep_best[0], bool) or not isinstance(keep_best[1], str)
                or (len(keep_best) == 3 and keep_best[2] not in ("min", "max"))):
            raise ConfigError(f"keep_best must be (k, metric) or (k, metric, 'min'|'max'), e.g. (2, 'val_loss'), "
                              f"got {keep_best!r}")
        rules.append(BestN(keep_best[1], keep_best[0], keep_best[2] if len(keep_best) == 3 else "min"))
    return AnyOf(*rules, Registered()) if rules else None


class CheckpointManager(_Manager):
    """``trainstore.checkpoint.CheckpointManager`` with retention in one argument:
    ``max_to_keep=N`` keeps the newest N checkpoints, ``keep_best=(k, "val_loss")`` (or
    ``(k, metric, "max")``) also the k best by a recorded metric; registered versions always.
    Without them nothing is deleted (compose rules with ``hooks=[retention_hook(...)]``)."""

    def __init__(self, store: Any, job: str, policy: Any = None, *, max_to_keep: int | None = None,
                 keep_best: Any = None, hooks: Any = (), **kwargs: Any) -> None:
        rule = retention_rule(max_to_keep, keep_best)  # bad arguments fail before the store is opened
        super().__init__(store, job, policy, hooks=[*hooks, *([retention_hook(rule)] if rule else [])], **kwargs)


__all__ = ["CheckpointManager", "retention_rule"]
