"""The unified ``lightning`` package (``lightning.pytorch``): the classes of
``trainstore.integrations.lightning`` for its own class hierarchy (see that module).

    from trainstore.integrations.lightning_unified import TrainstoreCheckpointIO, trainstore_strategy
    trainer = lightning.pytorch.Trainer(strategy=trainstore_strategy("ddp", TrainstoreCheckpointIO(url, job="run-1")))
"""

from __future__ import annotations

from .lightning_dist import namespace
from .lightning_io import LATEST
from .lightning_pointers import aliases_key

TrainstoreCheckpointIO, TrainstoreModelParallelStrategy, trainstore_strategy, check_strategy = namespace(
    __name__, "lightning.pytorch")

__all__ = ["TrainstoreCheckpointIO", "TrainstoreModelParallelStrategy", "trainstore_strategy", "check_strategy",
           "LATEST", "aliases_key"]
