"""The node cache's files on disk for eviction: scan them, remove one nobody uses.

A pinned file is held open with a shared ``flock``; ``remove_idle`` takes a non-blocking
exclusive one and leaves any file it cannot lock, so a file in use is never removed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator

from ..fileio import unlink_quietly
from .files import TMP_PREFIX
from .wanted import CachedFile


def scan(root: str, stale_temp_s: float) -> Iterator[CachedFile]:
    """(path, size, atime) of every file under ``root``; removes temp files older than
    ``stale_temp_s`` on the way (younger ones, fills in progress, are yielded)."""
    now = time.time()
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except FileNotFoundError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                    continue
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if e.name.startswith(TMP_PREFIX):
                if now - st.st_mtime > stale_temp_s:
                    unlink_quietly(e.path)
                    continue
            yield e.path, st.st_size, st.st_atime


def remove_idle(path: str) -> int | None:
    """Remove ``path`` if nobody uses it: bytes freed; None if absent, -1 if busy (or replaced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return -1
            raise
        st = os.fstat(fd)
        try:
            cur = os.stat(path)
        except FileNotFoundError:
            return None
        if cur.st_ino != st.st_ino:
            return -1
        os.unlink(path)
    finally:
        os.close(fd)
    return st.st_size


__all__ = ["remove_idle", "scan"]
