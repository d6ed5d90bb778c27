"""Public names of the serve stage (lazy_loader reads this stub at run time)."""

from .dataset import Dataset as Dataset, DatasetConfig as DatasetConfig
from .loader import Loader as Loader, LoaderConfig as LoaderConfig
from .meter import (
    IOBoundWarning as IOBoundWarning,
    IOWaitMeter as IOWaitMeter,
    MeterConfig as MeterConfig,
    RefetchWarning as RefetchWarning,
)
from .mixture import Mixture as Mixture
from .schedule import CallableSchedule as CallableSchedule, PiecewiseLinear as PiecewiseLinear
from .write import table_from_numpy as table_from_numpy, write_arrow_dataset as write_arrow_dataset
