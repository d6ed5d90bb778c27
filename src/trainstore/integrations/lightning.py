"""PyTorch Lightning (``pytorch_lightning``): trainstore as the Trainer's ``CheckpointIO``.

    from trainstore.integrations.lightning import TrainstoreCheckpointIO, trainstore_strategy
    io = TrainstoreCheckpointIO("s3://bucket/ckpts", job="run-1")
    trainer = Trainer(plugins=[io], ...)                                   # one device
    trainer = Trainer(strategy=trainstore_strategy("ddp", io), ...)        # DDP, any launcher
    trainer = Trainer(strategy=trainstore_strategy("model_parallel", io), ...)  # FSDP2, sharded
    trainer.fit(model, ckpt_path="last")      # newest checkpoint that verifies

The modules: ``lightning_io`` (saves, loads, same-step aliases, removals as retention),
``lightning_pointers`` (the pointer files Lightning finds by name, the alias record),
``lightning_state`` (content hash), ``lightning_dist`` (strategies: DDP, sharded saves,
unsupported ones). ``trainstore.integrations.lightning_unified`` has the same names for the
unified ``lightning.pytorch`` namespace.
"""

from __future__ import annotations

from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
from pytorch_lightning.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy

from .lightning_dist import build_classes
from .lightning_io import LATEST
from .lightning_pointers import aliases_key

_classes = build_classes(__name__, CheckpointIO, ModelParallelStrategy, DDPStrategy, SingleDeviceStrategy)
TrainstoreCheckpointIO = _classes.io
TrainstoreModelParallelStrategy = _classes.model_parallel
trainstore_strategy = _classes.strategy
check_strategy = _classes.check

__all__ = ["TrainstoreCheckpointIO", "TrainstoreModelParallelStrategy", "trainstore_strategy", "check_strategy",
           "LATEST", "aliases_key"]
