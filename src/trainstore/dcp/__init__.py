"""torch.distributed.checkpoint storage on trainstore's chunk store.

``StorageWriter`` / ``StorageReader`` plug into ``dcp.save`` / ``dcp.async_save`` / ``dcp.load``:
every rank writes its shards as content-addressed, compressed, verified chunks in parallel
(incrementals as XOR deltas against the job's last full checkpoint), and the coordinator
commits one manifest (JSON, no pickle) after every rank succeeded. See docs/distributed.md.
"""

from .basecache import BaseCache
from .coordination import (
    CheckpointTarget,
    describe_failure,
    format_checkpoint_id,
    parse_checkpoint_id,
)
from .reader import StorageReader
from .writer import StorageWriter

__all__ = ["StorageWriter", "StorageReader", "BaseCache", "CheckpointTarget", "parse_checkpoint_id",
           "format_checkpoint_id", "describe_failure"]
