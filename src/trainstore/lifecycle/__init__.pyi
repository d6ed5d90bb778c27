"""Names of this package, imported lazily at run time (lazy_loader reads this stub);
type checkers read it as the package's interface."""

from .backlog import BacklogStatus as BacklogStatus, DurabilityLimitError as DurabilityLimitError
from .export import export_safetensors as export_safetensors
from .gc import GcOptions as GcOptions, GcReport as GcReport, collect_garbage as collect_garbage
from .metrics import CheckpointMetrics as CheckpointMetrics
from .redundancy import Redundancy as Redundancy, RedundancyPolicy as RedundancyPolicy
from .registry import ModelVersion as ModelVersion, Registry as Registry
from .retention import (
    KeepBest as KeepBest,
    RetentionPlan as RetentionPlan,
    RetentionPolicy as RetentionPolicy,
    apply_retention as apply_retention,
    plan_retention as plan_retention,
)
from .retention_rules import (
    AllOf as AllOf,
    AnyOf as AnyOf,
    BestN as BestN,
    EveryNSteps as EveryNSteps,
    FullWithin as FullWithin,
    LatestN as LatestN,
    Registered as Registered,
    Rule as Rule,
    Within as Within,
)
from .tiering import Tiering as Tiering, TierPolicy as TierPolicy
