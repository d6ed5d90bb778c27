"""Packs: many small tensors in one chunk object, each still hashed and verified alone.

A model + optimizer state has hundreds of tensors of a few bytes to a few hundred KiB
(biases, norms, step counters). Stored one chunk each, every one is a file with its own
fsync; packed, a few MiB of them are one chunk (``WriteOptions.pack_below`` /
``pack_bytes``). A pack is an ordinary content-addressed chunk (hash of its raw bytes,
codec, dedup, repair, GC, tier copies all unchanged); the manifest entry of each member
records the pack, its ``span`` (offset, length) inside the pack's raw bytes and the
member's own BLAKE3 (``ChunkEntry``, format 2).

* Packing order is the state's order, grouped by top-level state entry (``model``,
  ``optim``: a partial restore ``only="model"`` reads no optimizer pack) and element size
  (the byte-shuffle codecs see whole elements); members start at 64-byte offsets, padding
  is zero. The same small
  tensors give the same pack bytes, so an unchanged pack dedups like any chunk.
* Incrementals: a member whose hash equals its base piece is a same-as-base reference to
  the base's (packed or plain) piece: nothing is written. Only the changed small tensors
  are packed again (with the delta codec); no XOR deltas inside packs - small tensors are
  a tiny share of the bytes (0.2% of the GPT + AdamW state), so a delta would save little.
* Reading: members of one pack are read together (``PackRead``: one read and decode of the
  pack for all of them). A raw pack on a local disk is read by range, member by member;
  each member is checked against its own hash, and a mismatch re-reads the whole pack
  through ``ChunkStore.get`` (full check, repair from another tier or replica, else
  ``ChunkCorruptError`` naming the pack).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...chunks import ChunkRef, ChunkStore, content_hash
from ...digests import matches
from ...errors import ChunkCorruptError, IntegrityError, ManifestError, StoreError
from .manifest import ChunkEntry

#: Members start at multiples of this many bytes inside a pack.
ALIGN = 64

_tls = threading.local()


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def pack_group(name: str, itemsize: int) -> tuple[str, int]:
    """Tensors share a pack only within one group: the same top-level state entry (``model``,
    ``optim``: a partial restore of one never reads the other's packs) and element size.
    The entry is what precedes the first ``/`` (the manager's names: ``model/layer.bias``)
    or, in a name without one, the first ``.`` (DCP fqns: ``model.layer.bias@0``; taken
    whole, every DCP tensor was a pack alone: one object and fsync per tensor)."""
    top = name.split("/", 1)[0] if "/" in name else name.split(".", 1)[0]
    return top, itemsize


def plan_packs(members: Iterable[tuple[Any, int, Any]], pack_bytes: int) -> list[list[Any]]:
    """Group ``(item, nbytes, group key)`` into packs of at most ``pack_bytes`` (a member
    larger than that is a pack alone), per key, in the given order."""
    open_packs: dict[Any, tuple[list[Any], int]] = {}
    done: list[list[Any]] = []
    for item, nbytes, key in members:
        group, used = open_packs.get(key, ([], 0))
        if group and used + nbytes > pack_bytes:
            done.append(group)
            group, used = [], 0
        group.append(item)
        open_packs[key] = (group, _aligned(used + nbytes))
    done.extend(g for g, _ in open_packs.values() if g)
    return done


def build_pack(views: list[memoryview]) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Concatenate ``views`` at ``ALIGN``-ed offsets (zero padding): (pack bytes, spans)."""
    spans, pos = [], 0
    for v in views:
        spans.append((pos, v.nbytes))
        pos = _aligned(pos + v.nbytes)
    end = spans[-1][0] + spans[-1][1] if spans else 0
    buf = np.zeros(end, dtype=np.uint8)
    for v, (o, n) in zip(views, spans):
        buf[o:o + n] = np.frombuffer(v, dtype=np.uint8)
    return buf, spans


def rebuild_pack(chunks: ChunkStore, ref: ChunkRef, members: list[tuple[ChunkEntry, memoryview]]) -> memoryview:
    """The raw bytes of pack ``ref`` rebuilt from members' saved bytes (to write back a pack a
    GC sweep deleted). ``IntegrityError`` if they do not give the pack's hash (a pack shared
    with members this save does not hold, e.g. a base checkpoint's)."""
    buf = np.zeros(ref.size, dtype=np.uint8)
    for entry, raw in members:
        o, n = entry.span or (0, 0)
        buf[o:o + n] = np.frombuffer(raw, dtype=np.uint8)
    if content_hash(buf) != ref.hash:
        raise IntegrityError(f"pack {ref.key(chunks.prefix)} was deleted by a concurrent gc sweep and cannot be "
                             "rebuilt from this save's tensors (it holds tensors of another checkpoint)")
    return memoryview(buf)


# -- reading ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PackRead:
    """All members of one pack that a restore needs: read together by ``read_pack``."""

    ref: ChunkRef
    members: tuple[ChunkEntry, ...]

    @property
    def size(self) -> int:
        return sum(m.size for m in self.members)


def group_packed(tasks: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Replace the ``(packed entry, dst)`` tasks by one ``(PackRead, [dst, ...])`` per pack;
    other tasks pass unchanged. A dst may be None (verify only)."""
    out: list[tuple[Any, Any]] = []
    groups: dict[ChunkRef, tuple[list[ChunkEntry], list[Any]]] = {}
    for piece, dst in tasks:
        if isinstance(piece, ChunkEntry) and piece.span is not None:
            members, dsts = groups.setdefault(piece.ref, ([], []))
            members.append(piece)
            dsts.append(dst)
        else:
            out.append((piece, dst))
    out.extend((PackRead(ref, tuple(m)), d) for ref, (m, d) in groups.items())
    return out


def _check_member(entry: ChunkEntry, data: np.ndarray) -> bool:
    return matches(data, entry.content_hash or "", entry.check)


def _buffer(n: int) -> np.ndarray:
    buf = getattr(_tls, "buf", None)
    if buf is None or buf.nbytes < n:
        buf = _tls.buf = np.empty(max(n, 1 << 16), dtype=np.uint8)
    return buf[:n]


def read_pack(chunks: ChunkStore, group: PackRead, dsts: list[np.ndarray | None],
              get_into: Callable[[ChunkStore, ChunkRef, memoryview], None]) -> None:
    """Fill each member's destination (None: verify only) from the pack, each checked
    against its own hash. ``get_into`` is the verified, repairing whole-chunk read."""
    if len(dsts) != len(group.members):
        raise ManifestError(f"pack {group.ref.hash[:12]}: {len(group.members)} members, {len(dsts)} destinations")
    for m, d in zip(group.members, dsts):
        if d is not None and d.nbytes != m.size:
            raise ManifestError(f"packed piece in {group.ref.hash[:12]} is {m.size} bytes, its slot {d.nbytes}")
    if group.ref.codec == "raw" and _read_ranges(chunks, group, dsts):
        return
    whole = _buffer(group.ref.size)
    get_into(chunks, group.ref, memoryview(whole))
    for m, d in zip(group.members, dsts):
        o, n = m.span  # type: ignore[misc]
        piece = whole[o:o + n]
        if not _check_member(m, piece):  # the pack verified, so the manifest entry is wrong
            raise ChunkCorruptError(f"packed piece [{o}, {o + n}) of {group.ref.key(chunks.prefix)} does not match "
                                    "its recorded hash")
        if d is not None:
            np.copyto(d, piece)


def _read_ranges(chunks: ChunkStore, group: PackRead, dsts: list[np.ndarray | None]) -> bool:
    """Range reads of a raw local pack; False when any member failed its hash (or the file
    is not local / not there): the caller then reads the whole pack, verified and repaired."""
    path = chunks.store.local_path(group.ref.key(chunks.prefix))
    if path is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreError(f"I/O error while reading {group.ref.key(chunks.prefix)!r}: {exc}") from exc
    try:
        for m, d in zip(group.members, dsts):
            o, n = m.span  # type: ignore[misc]
            out = d if d is not None else _buffer(n)
            if os.preadv(fd, [memoryview(out)], o) != n or not _check_member(m, out):
                return False
    except OSError as exc:
        raise StoreError(f"I/O error while reading {group.ref.key(chunks.prefix)!r}: {exc}") from exc
    finally:
        os.close(fd)
    return True


__all__ = ["ALIGN", "PackRead", "build_pack", "group_packed", "pack_group", "plan_packs", "read_pack", "rebuild_pack"]
