"""What every derived dataset version records about how it was made.

``config_hash`` is the BLAKE3 of the canonical JSON of an operation's configuration (sorted
keys), so two runs with the same inputs and settings agree on it; which code made a version
(``code_version``, ``trainstore_version``) is ``trainstore.provenance``'s.
Ingested files are recorded by the BLAKE3 of their bytes (``file_digest``), so the same file
ingested twice into a dataset is recognised (``data.ingest.files.SourcesIndex``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import blake3


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(config: Any) -> str:
    """BLAKE3 hex of the canonical JSON of ``config``."""
    return blake3.blake3(canonical_json(config).encode()).hexdigest()


def file_digest(path: str) -> str:
    """BLAKE3 hex of a file's bytes (memory-mapped, multithreaded for large files)."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if os.path.getsize(path):
        hasher.update_mmap(path)
    return hasher.hexdigest()
