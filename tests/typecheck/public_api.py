"""Uses the public API the way a user's code does, for ``make typecheck`` (mypy): the names of
``trainstore``'s stubs resolve and the calls type-check. Not a pytest module (never run)."""

from __future__ import annotations

from typing import Any

import trainstore
from trainstore import (
    CheckpointInfo,
    CheckpointManager,
    CheckpointPolicy,
    ChunkStore,
    Registry,
    TrainstoreError,
    open_store,
)
from trainstore.data import (
    Dataset,
    DatasetVersion,
    IngestConfig,
    Ingestor,
    Loader,
    LoaderConfig,
    load_version,
)
from trainstore.data.serve import Mixture, PiecewiseLinear
from trainstore.errors import ChunkCorruptError, NotFoundError
from trainstore.provenance import code_version, trainstore_version
from trainstore.store import Store


def checkpoint_loop(url: str, state: dict[str, Any]) -> list[CheckpointInfo]:
    store: Store = open_store(url)
    policy = CheckpointPolicy(full_every=100, incremental_every=10)
    with CheckpointManager(store, job="llm", policy=policy) as mgr:
        for step in range(1, 3):
            handle = mgr.save(step, state, metrics={"loss": 1.0 / step})
            info: CheckpointInfo | None = handle.wait()
            assert info is None or info.step == step
        restored: Any = mgr.restore()
        assert restored is not None
        return mgr.list()


def dataset_version(url: str, wal_dir: str) -> DatasetVersion:
    store = open_store(url)
    with Ingestor(store, "raw", config=IngestConfig(wal_dir=wal_dir)) as ing:
        ing.write([{"text": "hello"}])
        made = ing.commit()
    return load_version(store, "raw", made.version)


def mixture_batches(web: Dataset, code: Dataset) -> int:
    """A Dataset and a Mixture both go where the Loader takes a source (``serve.source``)."""
    mix = Mixture({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}, seed=0)
    anneal = Mixture({"web": web, "code": code},
                     PiecewiseLinear({0: {"web": 0.7, "code": 0.3}, 1000: {"web": 0.2, "code": 0.8}}))
    state = Loader(mix, 32).state_dict()
    return len(Loader(web, 32)) + len(Loader(anneal, 32)) + int(mix.progress(state)["web"]["samples"])


def provenance() -> tuple[str, str | None, str]:
    return trainstore_version(), code_version("."), trainstore.__version__


def errors(store: Store) -> str:
    try:
        store.get("missing")
    except NotFoundError as exc:
        return str(exc)
    except (ChunkCorruptError, TrainstoreError) as exc:
        return type(exc).__name__
    return ""


__all__ = ["checkpoint_loop", "dataset_version", "mixture_batches", "provenance", "errors", "ChunkStore", "Registry", "Loader",
           "LoaderConfig"]
