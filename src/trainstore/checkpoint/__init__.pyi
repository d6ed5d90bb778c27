"""Names of this package, imported lazily at run time (lazy_loader reads this stub);
type checkers read it as the package's interface."""

from .format.manifest import Manifest as Manifest
from .manager import (
    CheckpointInfo as CheckpointInfo,
    CheckpointManager as CheckpointManager,
    CheckpointPolicy as CheckpointPolicy,
    RestoreResult as RestoreResult,
    SaveHandle as SaveHandle,
)
from .rng import capture_rng as capture_rng, restore_rng as restore_rng
