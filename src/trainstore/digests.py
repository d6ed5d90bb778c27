"""The two digests of a chunk's bytes: its name, and the check a read compares against.

* ``content_hash`` - BLAKE3-256: the **content address**. Chunk names double as dedup keys,
  so a collision would silently swap one tensor's bytes for another's; only a cryptographic
  hash (collision and second-preimage resistant) is fit for that. Also what ``verify`` /
  scrubs compare against: tamper evidence.
* ``read_check`` - xxh3-128: the **read check** a restore compares each piece against when
  its manifest entry records one (``ChunkEntry.check``). It detects what integrity checks on
  read are for - bit rot, torn or truncated files, a wrong file under a name, a bad delta
  base - as reliably as BLAKE3 (a 128-bit non-cryptographic hash: accidental collisions are
  out of reach), at 0.07-0.09 s per GiB on one core against BLAKE3's 0.37-0.43 s
  (docs/benchmarks.md, "Evicted full restore"). It is *not* proof against someone who can
  write chunk files and craft collisions: ``trainstore verify`` (BLAKE3 of every copy) is.

``digests`` computes both in one pass, block by block while each block is in the CPU cache,
for writers that record both; ``hasher`` is the streaming form of whichever one a read
compares against.
"""

from __future__ import annotations

from typing import Protocol

import blake3
import xxhash

from .store.base import Buffer

HASH_HEX_LEN = 64
CHECK_HEX_LEN = 32
#: ``digests`` hashes in blocks of this size: both hashes see a block while it is in cache.
DIGEST_BLOCK = 256 << 10


class Hasher(Protocol):
    """What a streaming digest offers (``blake3.blake3``, ``xxhash.xxh3_128``)."""

    def update(self, data: Buffer, /) -> object: ...

    def hexdigest(self) -> str: ...


def content_hash(data: Buffer) -> str:
    """BLAKE3-256 of ``data`` as hex (the content address)."""
    return blake3.blake3(data).hexdigest()


def read_check(data: Buffer) -> str:
    """xxh3-128 of ``data`` as hex (the read check)."""
    return xxhash.xxh3_128(data).hexdigest()


def digests(data: Buffer) -> tuple[str, str]:
    """(``content_hash``, ``read_check``) of ``data`` in one pass over it."""
    view = memoryview(data).cast("B")
    strong, fast = blake3.blake3(), xxhash.xxh3_128()
    for lo in range(0, view.nbytes, DIGEST_BLOCK):
        block = view[lo:lo + DIGEST_BLOCK]
        strong.update(block)
        fast.update(block)
    return strong.hexdigest(), fast.hexdigest()


def hasher(check: str | None) -> Hasher:
    """A streaming hasher for a read compared against ``check`` (xxh3-128) or, with none
    recorded (manifests written before read checks), against the BLAKE3 content hash."""
    return xxhash.xxh3_128() if check else blake3.blake3()


def matches(data: Buffer, content: str, check: str | None, strong: bool = False) -> bool:
    """Whether ``data`` has the recorded ``check`` (when there is one) or else ``content``;
    ``strong``: ``content`` and (when there is one) ``check``, in one pass."""
    if strong:
        if not check:
            return content_hash(data) == content
        return digests(data) == (content, check)
    return read_check(data) == check if check else content_hash(data) == content


def is_hex(value: object, length: int) -> bool:
    """Whether ``value`` is ``length`` lowercase hex digits (``str.strip`` runs in C: a manifest
    holds one hash per piece, and a generator over each digit cost a restore milliseconds)."""
    return isinstance(value, str) and len(value) == length and not value.strip("0123456789abcdef")


def is_check(value: object) -> bool:
    """Whether ``value`` is a well-formed read check (32 lowercase hex digits)."""
    return is_hex(value, CHECK_HEX_LEN)


__all__ = ["CHECK_HEX_LEN", "DIGEST_BLOCK", "HASH_HEX_LEN", "Hasher", "content_hash", "digests", "hasher",
           "is_check", "is_hex", "matches", "read_check"]
