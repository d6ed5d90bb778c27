"""Transform stage: a committed version in, a derived version out (cleaning and features).

``cleaning`` (``clean``: DuckDB SQL from ``clean_sql``) writes a cleaned Parquet version and
a quarantine of rejected rows; ``runner`` (``transform``) maps a function over every shard
(``shard_task``, run by ``engines``: this process, a process pool or Ray), resumable by a
config hash that includes the function's fingerprint (``fn_identity``), into an Arrow IPC
feature version. ``features`` holds ready-made functions. Both commit with
``versions.derive``. Names are imported on first use (see ``__init__.pyi``).
"""

from __future__ import annotations

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
