"""What "durable" costs a framework that never fsyncs its own checkpoint files."""

from __future__ import annotations

import os
import time


def fsync_new_files(root: str, since: float) -> float:
    """fsync every file under ``root`` modified at or after ``since`` (wall clock, 1 s slack)
    and the folders holding them; returns the seconds taken. A save whose files are only in
    the page cache is not durable: this is the rest of its time to durable."""
    t0 = time.perf_counter()
    for d, _, files in os.walk(root):
        paths = [os.path.join(d, n) for n in files if os.stat(os.path.join(d, n)).st_mtime >= since - 1]
        for path in paths + ([d] if paths else []):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    return time.perf_counter() - t0
