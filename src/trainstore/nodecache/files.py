"""Files of the node cache: pinned handles, and the helpers that copy, hash and stamp them."""

from __future__ import annotations

import contextlib
import mmap
import os
import time

import blake3

from ..errors import ConfigError
from ..fileio import TEMP_PREFIX, create_temp, write_all

#: Prefix of temp files in the cache directory (never served, removed at start-up).
TMP_PREFIX = TEMP_PREFIX
_COPY_BLOCK = 8 << 20


class PinnedFile:
    """A cached file held in use (shared flock) until ``close()``; eviction skips it."""

    def __init__(self, key: str, path: str, fd: int, size: int, release) -> None:
        self.key = key
        self.path = path
        self.size = size
        self._fd = fd
        self._release = release
        self._closed = False
        #: True when this pin downloaded the object (a miss), False when it found it cached
        self.fetched = False

    def mmap(self) -> mmap.mmap:
        """A read-only memory map of the whole file (valid after close; the inode stays)."""
        if self.size == 0:
            raise ConfigError(f"cannot memory-map the empty cached object {self.key!r}")
        return mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._fd)  # drops the shared flock
            self._release(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> PinnedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten handle must not pin a file forever
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        return f"PinnedFile({self.key!r}, {self.path!r})"


def file_hash(fd: int, size: int) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO if size >= (32 << 20) else 1)
    if size:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
            h.update(m)
    return h.hexdigest()


def copy_file(src: int, dst: int) -> int:
    total = 0
    try:
        while n := os.copy_file_range(src, dst, _COPY_BLOCK):
            total += n
        return total
    except OSError:  # no in-kernel copy here (old kernel, other file system): plain copy
        os.lseek(src, 0, os.SEEK_SET)
        os.lseek(dst, 0, os.SEEK_SET)
        os.ftruncate(dst, 0)
    total = 0
    while chunk := os.read(src, _COPY_BLOCK):
        write_all(dst, chunk)
        total += len(chunk)
    return total


def stamp(fd: int) -> tuple[int, int, int]:
    """(inode, size, mtime) of an open file: tells one copy of a cached object from another."""
    st = os.fstat(fd)
    return st.st_ino, st.st_size, st.st_mtime_ns


def temp_file_beside(path: str) -> tuple[int, str]:
    """A new exclusive temp file in ``path``'s directory (created if needed): (fd, its path)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    return create_temp(directory, mode=0o644)


def touch(path: str) -> None:
    """Stamp ``path``'s atime now (the LRU clock), keeping its mtime; a vanished file is fine."""
    with contextlib.suppress(OSError):
        st = os.stat(path)
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))


__all__ = ["PinnedFile", "TMP_PREFIX", "copy_file", "file_hash", "stamp", "temp_file_beside", "touch"]
