"""How a Lightning checkpoint is laid out in trainstore, and the retention of removed paths.

The plugin records ``extra.lightning`` in every manifest it writes: the Lightning path, the
content hash and the *layout* - ``full`` (one process wrote the whole state: one device, or
DDP's rank 0) or ``sharded`` (every rank wrote its shards through the ``dcp`` backend: FSDP2 /
ModelParallelStrategy). A load checks it: a checkpoint of another framework (no
``extra.lightning``) or of the other layout is refused with a ``ConfigError`` saying which.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..checkpoint import CheckpointManager
from ..errors import ConfigError, TrainstoreError
from ..lifecycle.retention import apply_retention
from ..lifecycle.retention_rules import AnyOf, Registered, RetentionView, Rule
from ..store.base import Store

log = logging.getLogger("trainstore.integrations.lightning")

LAYOUT_FULL = "full"  # one process wrote the whole state (single process, DDP rank 0)
LAYOUT_SHARDED = "sharded"  # every rank wrote its shards (FSDP / ModelParallelStrategy, the dcp backend)


def lightning_extra(manifest: Any) -> dict | None:
    """The ``lightning`` entry a plugin recorded in a manifest, or None."""
    extra = manifest.metadata.get("extra")
    found = extra.get("lightning") if isinstance(extra, dict) else None
    return found if isinstance(found, dict) else None


def check_layout(mgr: CheckpointManager, step: int, layout: str) -> None:
    """A checkpoint of another framework or state layout is refused, saying which."""
    try:
        m = mgr.manifest(step)
    except TrainstoreError:
        return  # unreadable: the restore's fallback deals with it
    found = lightning_extra(m)
    if found is None:
        others = sorted(k for k in (m.metadata.get("extra") or {}) if isinstance(k, str))
        by = f"by {', '.join(others)}" if others else "by a plain CheckpointManager"
        raise ConfigError(f"step {step} of job {mgr.job!r} was not saved by TrainstoreCheckpointIO (saved {by}); "
                          "restore it with the API that saved it, or point the plugin at its own job")
    saved = found.get("layout", LAYOUT_FULL)
    if saved != layout:
        how = {LAYOUT_FULL: "the full-state layout (single process or DDP: rank 0 writes the replicated model)",
               LAYOUT_SHARDED: "the sharded layout (FSDP / ModelParallelStrategy: every rank wrote its shards)"}
        raise ConfigError(f"step {step} of job {mgr.job!r} was saved in {how.get(saved, repr(saved))}, this strategy "
                          f"loads {how[layout]}; resume with the strategy that saved it (trainstore_strategy)")


def check_global_step(checkpoint: dict, path: Any) -> int:
    step = checkpoint.get("global_step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ConfigError(f"Lightning checkpoint for {path} has no valid global_step: {step!r}")
    return step


class _LiveAliases(Rule):
    """Keeps every checkpoint except those the plugin created whose Lightning paths were all removed."""

    def __init__(self, dropped: frozenset[int]) -> None:
        self.dropped = dropped

    def keep(self, view: RetentionView) -> dict[int, list[str]]:
        return {m.step: ["a Lightning checkpoint path refers to it"] for m in view.manifests
                if m.step not in self.dropped}

    def miss(self, m: Any, view: RetentionView) -> str:
        return "every Lightning path to it was removed (ModelCheckpoint)"

    def describe(self) -> str:
        return "checkpoints Lightning still refers to"


def drop_unnamed(store: Store, job: str, dropped: frozenset[int], keep: Sequence[Rule]) -> list[int]:
    """Apply retention to ``job`` dropping the steps in ``dropped`` (registered versions and the
    ``keep`` rules still keep theirs; the bases of kept incrementals stay); the deleted steps."""
    rule = AnyOf(_LiveAliases(dropped), Registered(), *keep)
    try:
        plan = apply_retention(store, job, rule)
    except ConfigError as exc:  # it would delete every checkpoint: keep them
        log.warning("Lightning retention of job %r not applied: %s", job, exc)
        return []
    return [d.step for d in plan.deleted]


__all__ = ["LAYOUT_FULL", "LAYOUT_SHARDED", "lightning_extra", "check_layout", "check_global_step", "drop_unnamed"]
