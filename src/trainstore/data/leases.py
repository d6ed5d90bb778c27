"""The leases data writers take so that a concurrent data GC sweep keeps their shards.

See ``trainstore.sweeps`` for the protocol and ``trainstore.data.gc`` for the sweep. Leases
and sweep markers of the data GC live under ``gc/data/`` (the checkpoint GC's are under
``gc/leases/`` and ``gc/sweeps/``; neither waits for the other).
"""

from __future__ import annotations

import uuid

from ..store.base import Store
from ..sweeps import KeyRange, Lease, wait_for_sweeps
from .versions import shards_prefix

#: where data sweeps and writer leases live
GC_PREFIX = "gc/data/"
#: a run's lease (clean, transform) expires this long after its writer stopped renewing it
RUN_LEASE_TTL_S = 86400.0


def ingest_prefix(dataset: str, wal_id: str) -> str:
    """Key prefix of every shard an ``Ingestor`` with WAL id ``wal_id`` writes."""
    return f"{shards_prefix(dataset)}ingest-{wal_id}-"


def ingest_lease(store: Store, dataset: str, wal_id: str, from_seq: int = 0) -> Lease:
    """The lasting lease of one WAL id: its shards from ``from_seq`` on (the uncommitted ones).

    It has no expiry: acknowledged shards stay protected until a commit publishes them,
    however long the ingesting process is gone."""
    return Lease(store, GC_PREFIX, f"ingest-{dataset}-{wal_id}", [KeyRange(ingest_prefix(dataset, wal_id), from_seq)],
                 ttl=None, kind="ingest")


def run_lease(store: Store, kind: str, name: str, prefixes: list[str]) -> Lease:
    """A lease for one clean or transform run over ``prefixes`` (renewed while it runs)."""
    return Lease(store, GC_PREFIX, f"{kind}-{name}-{uuid.uuid4().hex[:12]}", [KeyRange(p) for p in prefixes],
                 ttl=RUN_LEASE_TTL_S, kind=kind)


def wait_for_data_sweeps(store: Store) -> int:
    """Wait until data sweeps running now are done (before re-checking reused shards)."""
    return wait_for_sweeps(store, GC_PREFIX)


__all__ = ["GC_PREFIX", "RUN_LEASE_TTL_S", "ingest_lease", "ingest_prefix", "run_lease", "wait_for_data_sweeps"]
