"""Durable local-file helpers shared by every part that writes files itself: the local
store, the ingest WAL, the node cache, exports, reports. Every temp file is made by
``create_temp`` (exclusive, unpredictable name, beside its target).

Neutral ground (it imports only ``errors``), so none of them reaches into another's module
for them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import secrets
import stat
import threading
from collections.abc import Iterator

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
    """Whether ``data`` may be read into or written from with ``O_DIRECT`` as it is: large,
    and starting 4 KiB-aligned (checkpoint staging slots and restore buffers are; see
    ``checkpoint.save.staging``)."""
    view = memoryview(data)
    return view.nbytes >= DIRECT_MIN_BYTES and view.contiguous and _aligned(view)


def _aligned(view: memoryview) -> bool:
    """Whether a contiguous buffer starts on a ``DIRECT_ALIGN`` boundary."""
    return np.frombuffer(view.cast("B"), dtype=np.uint8).ctypes.data % DIRECT_ALIGN == 0


def direct_writable(data: Buffer) -> bool:
    """Whether ``write_direct`` should write ``data``: large and contiguous. Unaligned data (a
    codec's output is a new ``bytes``) goes through a bounce buffer (``write_direct``)."""
    view = memoryview(data)
    return view.nbytes >= DIRECT_MIN_BYTES and view.contiguous


#: Unaligned data is written with O_DIRECT this many bytes at a time through a per-thread,
#: page-aligned buffer: a copy at memcpy speed (~10 GB/s, the buffer stays touched and warm)
#: in front of a write at disk speed (~1 GB/s)
BOUNCE_BYTES = 4 << 20
_bounce = threading.local()


def _bounce_buffer() -> np.ndarray:
    """This thread's aligned bounce buffer (an anonymous mapping: page-aligned), touched once."""
    buf = getattr(_bounce, "buf", None)
    if buf is None:
        buf = np.frombuffer(mmap.mmap(-1, BOUNCE_BYTES), dtype=np.uint8)
        buf.fill(0)
        _bounce.buf = buf
    return buf


def write_direct(fd: int, data: Buffer) -> None:
    """Write ``data`` to ``fd`` opened with ``O_DIRECT`` at offset 0: the 4 KiB-multiple head
    with ``O_DIRECT`` (no page cache), straight from ``data`` when it starts aligned, else
    copied through ``_bounce_buffer`` a segment at a time; then
    ``O_DIRECT`` is cleared and the tail written buffered, so the file holds exactly ``data``.
    The caller still fsyncs (size, tail).

    Why not buffered for unaligned data: a buffered write copies every byte into page-cache
    pages the kernel must first allocate (first touch costs 0.4-7 GB/s on the machine measured,
    docs/benchmarks.md) and then writes back at the fsync; the bounce copy goes into 4 MiB that
    stay touched."""
    view = memoryview(data).cast("B")
    head = view.nbytes // DIRECT_ALIGN * DIRECT_ALIGN
    if head == 0 or _aligned(view):
        write_all(fd, view[:head])
    else:
        buf = _bounce_buffer()
        src = np.frombuffer(view, dtype=np.uint8)
        for lo in range(0, head, BOUNCE_BYTES):
            n = min(BOUNCE_BYTES, head - lo)
            np.copyto(buf[:n], src[lo:lo + n])
            write_all(fd, buf[:n])
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
    write_all(fd, view[head:])


def io_error(exc: OSError, what: str) -> StoreError:
    """Translate an OSError into the hierarchy, naming ``what`` failed."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # EFBIG: a file-size limit
        return CapacityError(f"no space left while {what}: {exc}")
    return StoreError(f"I/O error while {what}: {exc}")


#: Every temp file and folder trainstore creates starts with this (listings and sweeps skip it).
TEMP_PREFIX = ".tmp."


def _temp_path(directory: str, name: str) -> str:
    """``directory/.tmp.<128-bit random hex>[.<name>]``: unpredictable, short (NAME_MAX is 255)."""
    token = secrets.token_hex(16)
    return os.path.join(directory, f"{TEMP_PREFIX}{token}.{name[:64]}" if name else f"{TEMP_PREFIX}{token}")


def create_temp(directory: str, name: str = "", *, flags: int = 0, mode: int = 0o666) -> tuple[int, str]:
    """A new, empty temp file in ``directory``: (fd open for reading and writing, path).

    The one way trainstore makes temp files. The name is unpredictable (``_temp_path``) and the
    file is created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``): never an existing file, nor
    a symlink planted to redirect the write. ``flags`` adds open flags (``O_DIRECT``); ``mode``
    is masked by the umask, as ``open()`` does."""
    path = _temp_path(directory, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | flags, mode)
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # a flag the filesystem refuses (O_DIRECT): some create the file first
            unlink_quietly(path)
        raise
    return fd, path


def create_temp_dir(parent: str, name: str = "") -> str:
    """A new, empty temp folder in ``parent`` (``mkdir`` is exclusive and follows no symlink)."""
    path = _temp_path(parent, name)
    os.mkdir(path)
    return path


@contextlib.contextmanager
def replacing(path: str, *, durable: bool = True) -> Iterator[str]:
    """Write ``path`` whole or not at all: yields the path of a new temp file beside it
    (``create_temp``) for the caller - or a library that wants a file name - to fill; on
    success it is fsynced (``durable``) and renamed over ``path``, and the directory fsynced;
    on an error it is removed and ``path`` is untouched."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = create_temp(directory, os.path.basename(path))
    mode = stat.S_IMODE(os.fstat(fd).st_mode)  # 0o666 less the umask, as open() gives
    os.close(fd)
    try:
        yield tmp
        if stat.S_IMODE(os.stat(tmp, follow_symlinks=False).st_mode) != mode:
            os.chmod(tmp, mode)  # a library that recreated the file (safetensors: 0o600) gets the usual mode
        if durable:
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    if durable:
        fsync_dir(directory)


def write_atomic(path: str, data: Buffer | str, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` (str: UTF-8) whole or not at all (``replacing``)."""
    with replacing(path, durable=durable) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            write_all(fd, data.encode() if isinstance(data, str) else data)
        finally:
            os.close(fd)


def remove_temp_leftovers(directory: str) -> int:
    """Remove the temp files a crashed writer left in ``directory`` (``create_temp`` names);
    only for a directory one owner holds (under its lock). Returns how many were removed."""
    n = 0
    with os.scandir(directory) as entries:
        for e in entries:
            if e.name.startswith(TEMP_PREFIX) and not e.is_dir(follow_symlinks=False):
                unlink_quietly(e.path)
                n += 1
    return n


def unlink_quietly(path: str) -> None:
    """Remove ``path``; a missing file is not an error."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["DIRECT_ALIGN", "DIRECT_MIN_BYTES", "TEMP_PREFIX", "Buffer", "create_temp", "create_temp_dir",
           "direct_eligible", "direct_writable", "fsync_dir", "io_error", "remove_temp_leftovers", "replacing", "unlink_quietly",
           "write_all", "write_atomic", "write_direct"]
