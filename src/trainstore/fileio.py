"""Durable local-file helpers shared by every part that writes files itself: the local
store, the ingest WAL, the node cache.

Neutral ground (it imports only ``errors``), so none of them reaches into another's module
for them.
"""

from __future__ import annotations

import errno
import os

from .errors import CapacityError, StoreError

#: Anything exposing the buffer protocol (bytes, bytearray, memoryview, numpy arrays).
Buffer = bytes | bytearray | memoryview


def fsync_dir(path: str) -> None:
    """fsync a directory, so entries created or renamed in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: Buffer) -> None:
    """Write every byte of ``data`` to ``fd`` (os.write may write less than asked)."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def io_error(exc: OSError, what: str) -> StoreError:
    """Translate an OSError into the hierarchy, naming ``what`` failed."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # EFBIG: a file-size limit
        return CapacityError(f"no space left while {what}: {exc}")
    return StoreError(f"I/O error while {what}: {exc}")


def unlink_quietly(path: str) -> None:
    """Remove ``path``; a missing file is not an error."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["Buffer", "fsync_dir", "io_error", "unlink_quietly", "write_all"]
