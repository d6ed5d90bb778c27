"""Durable local-file helpers shared by every part that writes files itself: the local
store, the ingest WAL, the node cache.

Neutral ground (it imports only ``errors``), so none of them reaches into another's module
for them.
"""

from __future__ import annotations

import errno
import fcntl
import os

import numpy as np

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


#: O_DIRECT needs buffer address, file offset and length aligned to the logical block size.
DIRECT_ALIGN = 4096
#: Smaller writes go through the page cache: O_DIRECT pays off for large pieces only.
DIRECT_MIN_BYTES = 1 << 20


def direct_eligible(data: Buffer) -> bool:
    """Whether ``data`` may be written with ``O_DIRECT``: large, and starting 4 KiB-aligned
    (checkpoint staging slots are; see ``checkpoint.staging``)."""
    view = memoryview(data)
    if view.nbytes < DIRECT_MIN_BYTES or not view.contiguous:
        return False
    return np.frombuffer(view.cast("B"), dtype=np.uint8).ctypes.data % DIRECT_ALIGN == 0


def write_direct(fd: int, data: Buffer) -> None:
    """Write ``data`` to ``fd`` opened with ``O_DIRECT`` at offset 0: the 4 KiB-multiple head
    straight from ``data`` (no page cache), then ``O_DIRECT`` is cleared and the tail written
    buffered, so the file holds exactly ``data``. The caller still fsyncs (size, tail)."""
    view = memoryview(data).cast("B")
    head = view.nbytes // DIRECT_ALIGN * DIRECT_ALIGN
    write_all(fd, view[:head])
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
    write_all(fd, view[head:])


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


__all__ = ["DIRECT_ALIGN", "DIRECT_MIN_BYTES", "Buffer", "direct_eligible", "fsync_dir", "io_error",
           "unlink_quietly", "write_all", "write_direct"]
