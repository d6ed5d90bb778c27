"""Ingest stage: records and files in, durable shards and committed dataset versions out.

``Ingestor`` (``ingestor``: ``ingest_files`` and ``commit``; ``writer``: the write path) logs
records in a local WAL (``wal``), seals them into Parquet shards acknowledged in the store's
journal (``journal``) and publishes them with ``versions.derive``. ``records``, ``exact`` and
``sources`` turn user data and input files into Arrow tables exactly; ``plan`` and ``files``
decide which files and shards a call ingests and a commit publishes. Names are imported on
first use (see ``__init__.pyi``).
"""

from __future__ import annotations

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
