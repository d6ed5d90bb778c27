"""Page-cache state of benchmark files, without root: the test harness's helpers
(``tests/harness/pagecache.py``: evict with ``posix_fadvise(DONTNEED)`` after an ``fsync``,
count resident pages with ``mincore``, read files once to cache them), imported from there so
the two never drift. Load-independent: counts of pages, not times."""

from __future__ import annotations

import os
import sys

# appended, not first: tests/ holds packages (checkpoint, data) named like benchmark modules
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from harness.pagecache import PAGE, cache, evict, files_under, resident, resident_all  # noqa: E402

__all__ = ["PAGE", "cache", "evict", "files_under", "resident", "resident_all"]
