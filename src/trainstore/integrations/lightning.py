"""PyTorch Lightning (``pytorch_lightning``): trainstore as the Trainer's ``CheckpointIO``.

    from trainstore.integrations.lightning import TrainstoreCheckpointIO, trainstore_strategy
    io = TrainstoreCheckpointIO("s3://bucket/ckpts", job="run-1")
    trainer = Trainer(plugins=[io], ...)                                   # one device
    trainer = Trainer(strategy=trainstore_strategy("ddp", io), ...)        # DDP, any launcher
    trainer = Trainer(strategy=trainstore_strategy("model_parallel", io), ...)  # FSDP2, sharded
    trainer.fit(model, ckpt_path="last")      # newest checkpoint that verifies

The modules: ``lightning_io`` (saves, loads, same-step aliases, removals as retention),
``lightning_pointers`` (the pointer files Lightning finds by name, load paths, the alias record),
``lightning_state`` (content hash), ``lightning_dist`` (strategies: DDP, sharded saves,
unsupported ones). ``trainstore.integrations.lightning_unified`` has the same names for the
unified ``lightning.pytorch`` namespace.
"""

from __future__ import annotations

from .lightning_dist import namespace
from .lightning_io import LATEST
from .lightning_pointers import aliases_key

TrainstoreCheckpointIO, TrainstoreModelParallelStrategy, trainstore_strategy, check_strategy = namespace(
    __name__, "pytorch_lightning")

__all__ = ["TrainstoreCheckpointIO", "TrainstoreModelParallelStrategy", "trainstore_strategy", "check_strategy",
           "LATEST", "aliases_key"]
