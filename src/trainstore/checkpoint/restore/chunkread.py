"""Restore's read of one chunk into its destination, without intermediate copies.

``get_into(chunks, ref, out)`` is ``ChunkStore.get(ref, out=out)`` with a fast path for
chunk files on a local filesystem (a local store, or the hot tier of a tiered one):

* **raw** chunks are read straight into ``out`` (the destination tensor's memory) with
  ``preadv`` and hashed block by block as they arrive (while they are in the CPU cache;
  never skipped): against the piece's read check (xxh3-128, ``digests``) when the manifest
  records one, else BLAKE3 - 0.08 instead of 0.4 CPU seconds per GiB. When ``out`` is 4 KiB-aligned and large
  (``fileio.direct_eligible``: restore destinations from ``hostmem`` are) and the chunk is
  not in the page cache (``mincore`` of its first page says so), the file is read
  with ``O_DIRECT``: from the device into the tensor, no page-cache copy and no page-cache
  first touch. The tail past the last whole 4 KiB block, and every filesystem that refuses
  ``O_DIRECT`` (tmpfs: ``EINVAL``), go through the page cache.
* **compressed** chunks are read into a per-thread reusable buffer and decoded into ``out``
  (the zstd codecs release the GIL: callers decode pieces on a thread pool), then re-hashed.

The checks are ``ChunkStore.get``'s: stored length, decode, the read check (or BLAKE3). A chunk whose copy is bad
(wrong size, a read that ends early: the file is shorter than it was when opened, a hash
mismatch) raises ``ChunkCorruptError`` internally and is repaired like in ``ChunkStore.get``
(another tier, a replica); one that vanished (evicted) is read through the store. An
``OSError`` while reading (EIO) is a ``StoreError`` naming the chunk: not corruption, so the
checkpoint is not marked bad, and restore hands nothing back.

Remote chunks keep ``ChunkStore.get``: one GET into the store's buffer, decoded (or, raw,
copied once) into ``out``.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from collections.abc import Callable

import numpy as np

from ...chunks import ChunkRef, ChunkStore
from ...codecs import decode
from ...digests import Hasher, hasher as new_hasher, matches
from ...errors import ChunkCorruptError, NotFoundError, StoreError
from ...fileio import DIRECT_ALIGN, direct_eligible
from ...hostmem import PAGE, empty_array

#: Raw chunks are read and hashed in blocks of this size: each block is hashed while it is
#: still in the CPU cache, instead of a second pass over the whole chunk in memory.
READ_BLOCK = 1 << 20
#: Block threads for blosc2 chunks (shuffle-lz4, legacy zstd): blosc2 holds the GIL, so pool
#: threads serialize on it while its own threads run in parallel. The zstd codecs release the
#: GIL and decode on the pool threads themselves.
DECODE_THREADS = 2
#: Whether raw chunks missing from the page cache are read with ``O_DIRECT`` (off: always
#: through the page cache).
USE_DIRECT = True

#: ``on_block(lo, hi)``: bytes ``[lo, hi)`` of the chunk just landed in ``out``.
OnBlock = Callable[[int, int], None]

_tls = threading.local()
_libc = ctypes.CDLL(None, use_errno=True)  # libc, loaded already (hostmem._libc)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
_libc.mincore.restype = ctypes.c_int


def pread_into(fd: int, view: memoryview, offset: int) -> int:
    """``preadv`` of ``view`` at ``offset``: the one read syscall of this module (tests wrap
    it to inject I/O errors and short reads)."""
    return os.preadv(fd, [view], offset)


def _cached(fd: int) -> bool:
    """Whether the file's first page is in the page cache (``mincore`` of a private mapping:
    asks without reading, so it starts no readahead). Any doubt: cached."""
    try:
        with mmap.mmap(fd, PAGE, access=mmap.ACCESS_COPY) as m:
            first = ctypes.c_char.from_buffer(m)  # exports ``m``: released before it closes
            vec = ctypes.c_ubyte(0)
            rc = _libc.mincore(ctypes.c_void_p(ctypes.addressof(first)), PAGE, ctypes.byref(vec))
            del first
        return rc != 0 or bool(vec.value & 1)
    except (OSError, ValueError, BufferError):
        return True


def _open_direct(path: str) -> int | None:
    """An ``O_DIRECT`` descriptor of ``path``, or None where the filesystem refuses it."""
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise


def _read_raw(fd: int, path: str, out: memoryview, key: str, hasher: Hasher | None,
              on_block: OnBlock | None = None) -> None:
    """Read ``out.nbytes`` bytes of ``fd`` into ``out`` block by block, hashing (and handing
    each block to ``on_block``) as they come; the 4 KiB-aligned head with ``O_DIRECT`` when
    that pays (module docstring)."""
    size = out.nbytes
    got = 0
    direct_end = 0
    dfd = None
    if USE_DIRECT and hasattr(os, "O_DIRECT") and direct_eligible(out) and not _cached(fd):
        dfd = _open_direct(path)
        if dfd is not None:
            direct_end = size // DIRECT_ALIGN * DIRECT_ALIGN
    try:
        while got < size:
            use = dfd if got < direct_end else fd
            end = min(direct_end if got < direct_end else size, got + READ_BLOCK)
            try:
                n = pread_into(use, out[got:end], got)
            except OSError as exc:
                if use is dfd and exc.errno == errno.EINVAL:  # alignment refused after all
                    direct_end = got
                    continue
                raise
            if n <= 0:
                raise ChunkCorruptError(f"chunk {key}: read ended at byte {got} of {size} (file shrank while read)")
            if hasher is not None:
                hasher.update(out[got:got + n])
            if on_block is not None:
                on_block(got, got + n)
            got += n
    finally:
        if dfd is not None:
            os.close(dfd)


def _stored_buffer(size: int) -> memoryview:
    """A per-thread reusable buffer for ``size`` stored (compressed) bytes."""
    buf = getattr(_tls, "buf", None)
    if buf is None or buf.nbytes < size:
        buf = _tls.buf = np.empty(max(size, 1 << 20), dtype=np.uint8)
    return memoryview(buf[:size])


def read_local(chunks: ChunkStore, ref: ChunkRef, out: memoryview, verify: bool, path: str,
               on_block: OnBlock | None = None, check: str | None = None) -> None:
    """The local fast path of ``get_into`` (no repair)."""
    key = ref.key(chunks.prefix)
    hasher = new_hasher(check) if ref.codec == "raw" and verify else None
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise NotFoundError(f"no object {key!r} in {chunks.store.url}") from None
    except OSError as exc:
        raise StoreError(f"I/O error while opening chunk {key!r}: {exc}") from exc
    try:
        size = os.fstat(fd).st_size
        if size > ref.max_stored:  # any writer's copy of the name is valid (ChunkRef.max_stored)
            raise ChunkCorruptError(f"chunk {key}: {size} bytes stored, more than a {ref.size}-byte chunk can take")
        if ref.codec == "raw":
            if size != out.nbytes:
                raise ChunkCorruptError(f"chunk {key}: {size} bytes stored, {out.nbytes} expected")
            _read_raw(fd, path, out, key, hasher, on_block)
        else:
            stored = _stored_buffer(size)
            _read_raw(fd, path, stored, key, None)
    except OSError as exc:
        raise StoreError(f"I/O error while reading chunk {key!r}: {exc}") from exc
    finally:
        os.close(fd)
    if ref.codec != "raw":
        decode(stored, ref.codec, ref.size, key=key, out=out, threads=max(chunks.codec.threads, DECODE_THREADS))
    if not verify:
        return
    ok = hasher.hexdigest() == (check or ref.hash) if hasher is not None else matches(out, ref.hash, check)
    if not ok:
        raise ChunkCorruptError(f"chunk {key}: content does not match its hash (corrupted)")


def get_into(chunks: ChunkStore, ref: ChunkRef, out: memoryview, verify: bool = True,
             on_block: OnBlock | None = None, check: str | None = None) -> None:
    """``ChunkStore.get(ref, out=out, check=check)``, read straight into ``out`` from a local
    file. ``check``: the piece's read check (xxh3-128 of ``out``'s bytes) if it has one.

    ``verify=False`` skips only the hash (the caller checks a hash over what it builds from
    this chunk, as the reader does for XOR deltas). A bad local copy is repaired like in
    ``ChunkStore.get``; one that vanished (evicted) is read through the store.

    ``on_block(lo, hi)`` is called, in order, for every block of a raw local chunk right
    after it landed in ``out`` (while it is in the CPU cache). Other paths (a decode, a
    repair, a remote read) fill ``out`` whole without calling it - also after some blocks
    were handed over, when the read then failed - so a caller whose blocks did not cover
    the chunk processes ``out`` whole.
    """
    path = chunks.store.local_path(ref.key(chunks.prefix))
    if path is None:
        chunks.get(ref, out=out, check=check)
        return
    try:
        read_local(chunks, ref, out, verify, path, on_block, check)
    except ChunkCorruptError as exc:
        chunks.recover(ref, out, exc, check)
    except NotFoundError:
        chunks.get(ref, out=out, check=check)


def read_base(chunks: ChunkStore, ref: ChunkRef, check: str | None) -> memoryview:
    """A chunk's verified bytes in this thread's base buffer, valid until the thread's next
    call: the base piece an incremental save XORs against when its base is not in memory (a
    fresh process, e.g. every resumed job's first incremental). Read as ``get_into`` reads
    (``O_DIRECT`` or the page cache, the read check instead of BLAKE3) into a 4 KiB-aligned
    buffer the writer thread keeps, instead of ``ChunkStore.get``'s fresh buffer per piece."""
    buf = getattr(_tls, "base", None)
    if buf is None or buf.nbytes < ref.size:
        buf = _tls.base = empty_array((max(ref.size, PAGE),), np.uint8, huge_pages=False)
    view = memoryview(buf)[:ref.size]
    get_into(chunks, ref, view, check=check)
    return view


__all__ = ["DECODE_THREADS", "READ_BLOCK", "USE_DIRECT", "OnBlock", "get_into", "pread_into", "read_base", "read_local"]
