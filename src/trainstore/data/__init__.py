"""The data pipeline: ingest, transform (clean, features) and serve, around dataset versions.

Stages are subpackages (``ingest``, ``transforms``, ``serve``); what they share sits here:
``versions`` (manifests; ``derive`` commits every new version), ``lineage``, ``layouts``
(the shard layout registry), ``shardio``, ``leases`` and the data GC (``gc``). Imports are
lazy: the public names in ``__init__.pyi`` are imported on first use.
"""

from __future__ import annotations

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
