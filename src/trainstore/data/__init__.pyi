"""Public names of ``trainstore.data``, imported lazily at run time (lazy_loader reads this
stub); type checkers read it as the package's interface."""

from .gc import DataGcOptions as DataGcOptions, collect_garbage as collect_garbage
from .ingest.config import IngestConfig as IngestConfig
from .ingest.ingestor import Ingestor as Ingestor
from .layouts import (
    ShardFile as ShardFile,
    ShardLayout as ShardLayout,
    get_layout as get_layout,
    register_layout as register_layout,
)
from .serve.dataset import Dataset as Dataset, DatasetConfig as DatasetConfig
from .serve.loader import Loader as Loader, LoaderConfig as LoaderConfig
from .serve.mixture import Mixture as Mixture
from .serve.write import write_arrow_dataset as write_arrow_dataset
from .transforms.cleaning import DROP as DROP, CleanConfig as CleanConfig, clean as clean
from .transforms.runner import TransformConfig as TransformConfig, transform as transform
from .versions import (
    DatasetVersion as DatasetVersion,
    ShardInfo as ShardInfo,
    SourceFile as SourceFile,
    derive as derive,
    list_versions as list_versions,
    load_version as load_version,
)
