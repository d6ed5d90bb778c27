"""Names of this package, imported lazily at run time (lazy_loader reads this stub);
type checkers read it as the package's interface."""

from . import errors as errors
from .errors import TrainstoreError as TrainstoreError
from .store import open_store as open_store

__version__: str

from .checkpoint import (
    CheckpointInfo as CheckpointInfo,
    CheckpointPolicy as CheckpointPolicy,
)
from .chunks import ChunkRef as ChunkRef, ChunkStore as ChunkStore
from .lifecycle.managed import CheckpointManager as CheckpointManager  # + max_to_keep / keep_best
from .lifecycle.registry import Registry as Registry
from .lifecycle.retention import RetentionPolicy as RetentionPolicy
from .nodecache import NodeCache as NodeCache
