"""Sizes and settings of one demo run, as frozen dataclasses (``DemoConfig.for_size``).

The default size runs in one to two minutes on two CPU cores; ``small`` is for tests (well
under a minute of work); ``large`` shows the same pipeline with more data and a bigger model.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from ..errors import ConfigError

SIZES = ("small", "default", "large")


@dataclass(frozen=True)
class DataConfig:
    """The synthetic raw data: how many records, how dirty, how they are sharded."""

    records: int = 48_000
    seed: int = 7
    duplicate_fraction: float = 0.04
    missing_fraction: float = 0.03
    malformed_rows: int = 25
    write_batches: int = 6          # the raw data arrives in this many ingest writes
    ingest_shards: int = 6          # raw Parquet shards (drives transform parallelism)
    clean_shards: int = 4
    val_every: int = 10             # every val_every-th id goes to the validation split
    seq_len: int = 64               # byte tokens per record
    transform_workers: int = 2


@dataclass(frozen=True)
class TrainConfig:
    """The model, the optimiser, the loader and the checkpoint policy."""

    epochs: int = 2
    batch_size: int = 128
    embed_dim: int = 32
    hidden: int = 384
    lr: float = 2e-3
    dropout: float = 0.1
    seed: int = 1234
    # torch intra-op threads, fixed so results are bit-reproducible; 1 because OpenMP threads
    # spin-wait, and on two shared cores with the loader's threads 2 was 10-20x slower per step
    threads: int = 1
    full_every: int = 100
    incremental_every: int = 20
    chunk_bytes: int = 1 << 20
    prefetch: int = 2
    loader_workers: int = 2


@dataclass(frozen=True)
class DemoConfig:
    size: str = "default"
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    crash_fraction: float = 0.6     # SIGKILL the second run when it is this far through

    @classmethod
    def for_size(cls, size: str) -> DemoConfig:
        if size == "default":
            return cls()
        if size == "small":
            return cls(size="small",
                       data=DataConfig(records=8_000, malformed_rows=8, write_batches=3, ingest_shards=3,
                                       clean_shards=2, seq_len=48, transform_workers=1),
                       train=TrainConfig(epochs=2, batch_size=64, hidden=96, full_every=96, incremental_every=32,
                                         chunk_bytes=64 << 10))
        if size == "large":
            return cls(size="large",
                       data=DataConfig(records=160_000, ingest_shards=8, clean_shards=8),
                       train=TrainConfig(epochs=3, hidden=768, full_every=200, incremental_every=40,
                                         chunk_bytes=2 << 20))
        raise ConfigError(f"demo size must be one of {SIZES}, got {size!r}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> DemoConfig:
        try:
            return cls(size=obj["size"], data=DataConfig(**obj["data"]), train=TrainConfig(**obj["train"]),
                       crash_fraction=float(obj["crash_fraction"]))
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"not a demo config: {exc}") from None


@dataclass(frozen=True)
class DemoPaths:
    """Where a run keeps its local state (the hot tier, the ingest WAL, exports)."""

    work_dir: str

    @property
    def hot(self) -> str:
        return os.path.join(self.work_dir, "hot")

    @property
    def data_cache(self) -> str:
        return os.path.join(self.hot, "data")

    @property
    def ckpt_hot(self) -> str:
        return os.path.join(self.hot, "checkpoints")

    @property
    def archive(self) -> str:
        """The archive tier: a local directory standing in for cold object storage."""
        return os.path.join(self.work_dir, "archive")

    @property
    def wal(self) -> str:
        return os.path.join(self.work_dir, "wal")

    @property
    def scratch(self) -> str:
        return os.path.join(self.work_dir, "scratch")

    @property
    def export(self) -> str:
        return os.path.join(self.work_dir, "export")


__all__ = ["SIZES", "DataConfig", "DemoConfig", "DemoPaths", "TrainConfig"]
