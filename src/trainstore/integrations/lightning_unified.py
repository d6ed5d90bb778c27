"""The unified ``lightning`` package (``lightning.pytorch``): the classes of
``trainstore.integrations.lightning`` for its own class hierarchy (see that module).

    from trainstore.integrations.lightning_unified import TrainstoreCheckpointIO, trainstore_strategy
    trainer = lightning.pytorch.Trainer(strategy=trainstore_strategy("ddp", TrainstoreCheckpointIO(url, job="run-1")))
"""

from __future__ import annotations

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy

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
