"""Serve stage: a committed feature version out to the training loop as batches.

``Dataset`` (``dataset``) maps rows of a servable version (``data.layouts``) from shards
pinned in the node's hot tier and opened by ``open_shard`` (zero-copy numpy views);
``Loader`` (``loader``) plans each epoch per rank (``sampler``: deterministic shuffle, equal
counts), prefetches shards and assembles batches in the background, resumes mid-epoch, and
meters how long the loop waits (``meter``). ``write`` writes numpy or Arrow data straight into
a servable version. Names are imported on first use (see ``__init__.pyi``).
"""

from __future__ import annotations

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
