"""PyTorch Lightning (``pytorch_lightning``): trainstore as the Trainer's ``CheckpointIO``.

    from trainstore.integrations.lightning import TrainstoreCheckpointIO
    io = TrainstoreCheckpointIO("s3://bucket/ckpts", job="run-1")
    trainer = Trainer(plugins=[io], ...)                       # one device, or strategy="ddp"
    trainer = Trainer(strategy=TrainstoreModelParallelStrategy(io=io), ...)   # FSDP2, sharded
    trainer.fit(model, ckpt_path="last")      # newest checkpoint that verifies

The modules: ``lightning_io`` (saves, loads, same-step aliases, removals as retention),
``lightning_pointers`` (the pointer files Lightning finds by name, the alias record),
``lightning_state`` (content hash), ``lightning_dist`` (strategies: DDP, sharded saves,
unsupported ones). ``trainstore.integrations.lightning_unified`` offers the same classes for
the unified ``lightning.pytorch`` namespace.
"""

from __future__ import annotations

from typing import Any

from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
from pytorch_lightning.strategies import (
    DDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
    Strategy,
)

from ..errors import ConfigError
from .lightning_dist import ShardedSaves, unsupported
from .lightning_io import LATEST, TrainstoreIOBase
from .lightning_pointers import aliases_key


class TrainstoreCheckpointIO(TrainstoreIOBase, CheckpointIO):
    """Lightning ``CheckpointIO`` saving to a trainstore job (``lightning_io``)."""


class TrainstoreModelParallelStrategy(ShardedSaves, ModelParallelStrategy):
    """``ModelParallelStrategy`` (FSDP2) whose sharded checkpoints go through trainstore's ``dcp``
    backend (``lightning_dist``): ``TrainstoreModelParallelStrategy(io=TrainstoreCheckpointIO(...))``."""

    def __init__(self, *args: Any, io: TrainstoreIOBase | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("save_distributed_checkpoint", True)
        if not kwargs["save_distributed_checkpoint"]:
            raise ConfigError("TrainstoreModelParallelStrategy(save_distributed_checkpoint=False) gathers the full "
                              "state on rank 0: use ModelParallelStrategy with plugins=[TrainstoreCheckpointIO(...)]")
        super().__init__(*args, **kwargs)
        if io is not None:
            self.checkpoint_io = io


def check_strategy(strategy: Strategy) -> Strategy:
    """``strategy`` if trainstore supports it with ``TrainstoreCheckpointIO``, else ``ConfigError``
    naming it and what to use instead."""
    if isinstance(strategy, (TrainstoreModelParallelStrategy, DDPStrategy, SingleDeviceStrategy)) and \
            type(strategy).__name__ != "FSDPStrategy":
        return strategy
    if isinstance(strategy, ModelParallelStrategy):
        raise unsupported("ModelParallelStrategy with its own DCP directory (use TrainstoreModelParallelStrategy)")
    return _raise(strategy)


def _raise(strategy: Any) -> Strategy:
    raise unsupported(type(strategy).__name__ if not isinstance(strategy, str) else repr(strategy))


def trainstore_strategy(strategy: str | Strategy, io: TrainstoreIOBase, **kwargs: Any) -> Strategy:
    """The Lightning strategy to pass as ``Trainer(strategy=...)`` with ``io`` attached:
    ``"ddp"`` (any launcher: ``"ddp_spawn"``, ``"ddp_subprocess"`` too), ``"model_parallel"``
    / ``"fsdp2"`` (sharded, ``TrainstoreModelParallelStrategy``), or a Strategy instance to check.
    Anything else (``"deepspeed"``, ``"fsdp"`` (FSDP1), XLA) raises ``ConfigError`` naming it."""
    if isinstance(strategy, str):
        name = strategy.lower()
        if name in ("ddp", "ddp_spawn", "ddp_subprocess", "ddp_fork", "ddp_notebook"):
            start = {"ddp": "popen", "ddp_subprocess": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork",
                     "ddp_notebook": "fork"}[name]
            built: Strategy = DDPStrategy(start_method=start, checkpoint_io=io, **kwargs)
        elif name in ("model_parallel", "fsdp2"):
            built = TrainstoreModelParallelStrategy(io=io, **kwargs)
        else:
            return _raise(strategy)
        return built
    check_strategy(strategy)
    strategy.checkpoint_io = io
    return strategy


__all__ = ["TrainstoreCheckpointIO", "TrainstoreModelParallelStrategy", "trainstore_strategy", "check_strategy",
           "LATEST", "aliases_key"]
