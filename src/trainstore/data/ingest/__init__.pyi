"""Public names of the ingest stage (lazy_loader reads this stub at run time)."""

from .config import IngestConfig as IngestConfig, default_wal_dir as default_wal_dir
from .files import expand_paths as expand_paths
from .ingestor import Ingestor as Ingestor
