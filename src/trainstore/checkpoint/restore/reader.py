"""Restore: decode a manifest's chunks straight into destination tensor memory.

Fresh destinations are allocated once at their final size (``hostmem``: 4 KiB aligned, for
tensors of 2 MiB and more; huge pages only with ``HUGE_PAGES``) and every piece is read
straight into its slice
(``chunkread.get_into``: ``preadv`` / ``O_DIRECT`` for raw pieces, hashed as read; the checks
of ``ChunkStore.get``: length, decode, re-hash against the piece's read check, xxh3-128, or
BLAKE3 where the manifest predates read checks: ``digests``); XOR
deltas are decoded into a per-thread scratch buffer, the base chunk read into the
destination, XORed in place and checked against the piece's recorded check or hash. Pieces are decoded in
parallel on a thread pool (the zstd codecs and BLAKE3 release the GIL; xxh3 holds it, ~0.1 ms per 1 MiB block).

``load_state`` allocates fresh tensors. ``load_into`` fills the tensors of an existing state
(``restore_into``) transactionally: no byte lands in the target before every piece of the
checkpoint was read and verified. Tensors that fit ``scratch_bytes`` are decoded into scratch
buffers and copied in after the last piece verified (one read); larger ones are verified in a
first pass and read again piece by piece (each piece re-verified in a per-thread buffer
before it is copied), so memory stays bounded by ``scratch_bytes`` plus one piece per thread.
CUDA and non-contiguous targets always go through a host buffer and ``copy_``.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ...chunks import ChunkRef, ChunkStore
from ...digests import matches
from ...errors import (
    CapacityError,
    ChunkCorruptError,
    ChunkMissingError,
    ConfigError,
    IntegrityError,
    ManifestError,
    NotFoundError,
    RestoreIncompleteError,
    StoreError,
)
from ...hostmem import HUGE_PAGE, empty_array, empty_tensor
from ..format.delta import DeltaApply, scratch, xor_into
from ..format.manifest import Manifest, TensorEntry
from ..format.packs import PackRead, group_packed, read_pack
from ..format.ready import ReadyReads, ready_piece
from ..format.state import (
    PARTIAL_KEY,
    flatten,
    merge_into,
    parse_numpy_dtype,
    parse_torch_dtype,
    unflatten,
)
from .chunkread import get_into as _get_into, read_local

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None  # type: ignore[assignment]


_tls = threading.local()


#: ``restore_into`` holds at most this many bytes of decoded, verified tensors before copying
#: them into the target; tensors past it are verified first and read a second time.
SCRATCH_BYTES = 1 << 30
#: Fresh destinations of at least this many bytes get their own 4 KiB-aligned ``hostmem``
#: mapping (``O_DIRECT``-ready); smaller ones ``torch.empty``.
HOSTMEM_MIN_BYTES = HUGE_PAGE
#: Ask for transparent huge pages on those mappings. Off: on the 2-core VMs measured, a fresh
#: huge-page fault (THP ``madvise`` mode, direct compaction) made a 1 GiB restore 3-4x slower
#: than 4 KiB pages (docs/benchmarks.md, "Restore into fresh memory").
HUGE_PAGES = False


def read_piece(chunks: ChunkStore, entry: Any, out: Any, ready: ReadyReads | None = None) -> None:
    """Read one piece into ``out`` (a ``PackRead``: its members into the list ``out``); a
    chunk that does not exist raises ``ChunkMissingError`` (an integrity failure of the
    checkpoint, unlike e.g. an I/O error). ``ready``: the restore-ready copies of the step."""
    try:
        if isinstance(entry, PackRead):
            read_pack(chunks, entry, out, _get_into)
        elif entry.span is not None:  # one packed piece alone
            read_pack(chunks, PackRead(entry.ref, (entry,)), [out], _get_into)
        else:
            _read_piece_checked(chunks, entry, out, ready)
    except NotFoundError as exc:
        if isinstance(exc, IntegrityError):
            raise
        raise ChunkMissingError(f"missing chunk: {exc}") from None


def _read_piece_checked(chunks: ChunkStore, entry: Any, out: np.ndarray, ready: ReadyReads | None = None) -> None:
    """Read one piece into ``out``. An XOR delta and its base chunk are not hashed one by one:
    the reconstructed piece is checked against its recorded check (or hash), which verifies both
    inputs at once (one hash pass instead of three); only on a mismatch are the two chunks
    checked separately, to name the corrupt one. The delta is decoded into a per-thread
    buffer first; the base is then read straight into ``out`` and each block XORed and
    hashed as it lands (``DeltaApply``). A delta or compressed piece with a restore-ready copy
    (``ready``) is read from it instead, like a raw piece; a missing or bad copy falls back to
    the stored piece."""
    view = memoryview(out)
    if entry.ref.size != view.nbytes:
        raise ManifestError(f"chunk {entry.ref.hash[:12]} is {entry.ref.size} bytes, its slot {view.nbytes}")
    if entry.base is None:
        if ready is None or not ready_piece(entry) or not _read_ready(chunks, entry, view, ready):
            _get_into(chunks, entry.ref, view, check=entry.check)
        return
    if entry.base.size != view.nbytes:
        raise ManifestError(f"base chunk {entry.base.hash[:12]} is {entry.base.size} bytes, its slot {view.nbytes}")
    if ready is not None and _read_ready(chunks, entry, view, ready):
        return
    delta = scratch(view.nbytes)
    _get_into(chunks, entry.ref, memoryview(delta), verify=False)
    apply = DeltaApply(delta, out, entry.check)
    _get_into(chunks, entry.base, view, verify=False, on_block=apply)
    if apply.hexdigest() != (entry.check or entry.content_hash):
        # verified reads name the corrupt chunk - or repair it from another tier or replica
        _get_into(chunks, entry.ref, memoryview(delta))
        _get_into(chunks, entry.base, view)
        xor_into(out, delta, out)
        if matches(view, entry.content_hash, entry.check):
            return
        raise ChunkCorruptError(f"chunk {entry.ref.key(chunks.prefix)} XOR base {entry.base.key(chunks.prefix)}: "
                                "result does not match the recorded hash")


def _read_ready(chunks: ChunkStore, entry: Any, view: memoryview, ready: ReadyReads) -> bool:
    """Read a piece from its restore-ready copy (checked as it is read, against the piece's
    read check or hash); False when there is none or it is bad (``out`` is then rewritten whole)."""
    h = entry.logical_hash()
    path = ready.path(h)
    if path is None:
        return False
    ref = ChunkRef(h, "raw", view.nbytes, view.nbytes, entry.ref.itemsize)
    try:
        read_local(chunks, ref, view, True, path, check=entry.check)
    except (NotFoundError, IntegrityError, StoreError):
        ready.count(None)
        return False
    ready.count(view.nbytes)
    return True


def _pieces(entry: TensorEntry, dst: np.ndarray) -> list[tuple[Any, np.ndarray]]:
    """(piece, slice of ``dst``) for every piece of ``entry``."""
    if dst.nbytes != entry.nbytes:
        raise ManifestError(f"destination holds {dst.nbytes} bytes, manifest says {entry.nbytes}")
    out, pos = [], 0
    for piece in entry.chunks:
        out.append((piece, dst[pos:pos + piece.size]))
        pos += piece.size
    return out


def _piece_buffer(n: int) -> np.ndarray:
    """A per-thread reusable buffer of ``n`` bytes (distinct from ``delta.scratch``), for the
    pieces ``load_into`` verifies first and reads again. Deliberately not 4 KiB-aligned: the
    first read then goes through the page cache, so the second is served from memory instead
    of the device (an aligned buffer would make both ``O_DIRECT``)."""
    buf = getattr(_tls, "piece", None)
    if buf is None or buf.nbytes < n:
        buf = _tls.piece = np.empty(max(n, 1), dtype=np.uint8)
    return buf[:n]


def _check_piece(chunks: ChunkStore, piece: Any, copy_to: np.ndarray | None,
                 ready: ReadyReads | None = None) -> None:
    """Read and verify ``piece`` into a per-thread buffer; then copy it to ``copy_to`` if given."""
    buf = _piece_buffer(piece.size)
    read_piece(chunks, piece, buf, ready)
    if copy_to is not None:
        np.copyto(copy_to, buf)


def _run(workers: int, fn: Any, tasks: list[tuple[Any, ...]]) -> None:
    """``fn(*task)`` for every task on a thread pool; the first error is raised."""
    if not tasks:
        return
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(tasks))), thread_name_prefix="trainstore-ckpt-read") as pool:
        for f in [pool.submit(fn, *t) for t in tasks]:
            f.result()


def _fill(chunks: ChunkStore, jobs: list[tuple[TensorEntry, np.ndarray]], workers: int,
          ready: ReadyReads | None = None) -> None:
    tasks = group_packed([(p, d) for entry, dst in jobs for p, d in _pieces(entry, dst)])
    _run(workers, lambda p, d: read_piece(chunks, p, d, ready), tasks)


def _check_size(entry: TensorEntry, itemsize: int) -> None:
    """Shape x itemsize must equal nbytes, computed in Python ints *before* allocating:
    a tampered manifest must not make restore allocate what its chunks do not back."""
    expected = math.prod(entry.shape) * itemsize
    if expected != entry.nbytes:
        raise ManifestError(f"tensor of shape {list(entry.shape)[:8]} {entry.dtype} is {expected} bytes, "
                            f"manifest says {entry.nbytes}")


def _alloc(fn: Any, entry: TensorEntry, name: str | None = None) -> Any:
    try:
        return fn()
    except (RuntimeError, MemoryError, ValueError, OSError) as exc:  # OSError: mmap ENOMEM
        what = f" to read {name!r}" if name is not None else ""
        raise CapacityError(f"cannot allocate {entry.nbytes} bytes of host memory{what} for a {entry.dtype} tensor "
                            f"of shape {list(entry.shape)[:8]}: {str(exc)[:120]}") from None


def host_tensor(entry: TensorEntry, dtype: Any, name: str | None = None) -> Any:
    """A fresh host tensor of ``entry``'s shape: ``hostmem`` (4 KiB-aligned, so uncached raw
    pieces are read into it with ``O_DIRECT``) from ``HOSTMEM_MIN_BYTES`` on; pages are
    touched only where read. No memory for it is a ``CapacityError`` (naming ``name``)."""
    return _alloc(lambda: empty_tensor(tuple(entry.shape), dtype, huge_pages=HUGE_PAGES)
                  if entry.nbytes >= HOSTMEM_MIN_BYTES else torch.empty(entry.shape, dtype=dtype), entry, name)


def _new_leaf(entry: TensorEntry) -> tuple[Any, np.ndarray]:
    """A fresh destination for ``entry`` and a uint8 view of its bytes."""
    if entry.dtype.startswith("torch."):
        dtype = parse_torch_dtype(entry.dtype)
        _check_size(entry, dtype.itemsize)
        t = host_tensor(entry, dtype)
        nbytes = t.numel() * t.element_size()
        if nbytes != entry.nbytes:
            raise ManifestError(f"tensor of shape {entry.shape} {entry.dtype} is {nbytes} bytes, manifest says {entry.nbytes}")
        return t, (t.reshape(-1).view(torch.uint8).numpy() if nbytes else np.empty(0, np.uint8))
    np_dtype = parse_numpy_dtype(entry.dtype)
    _check_size(entry, np_dtype.itemsize)
    a = _alloc(lambda: empty_array(tuple(entry.shape), np_dtype, huge_pages=HUGE_PAGES) if entry.nbytes >= HOSTMEM_MIN_BYTES
               else np.empty(entry.shape, dtype=np_dtype), entry)
    if a.nbytes != entry.nbytes:
        raise ManifestError(f"array of shape {entry.shape} {entry.dtype} is {a.nbytes} bytes, manifest says {entry.nbytes}")
    return a, a.reshape(-1).view(np.uint8)


def load_state(chunks: ChunkStore, manifest: Manifest, workers: int = 4, ready: ReadyReads | None = None) -> Any:
    """Rebuild the saved state with freshly allocated tensors (``ready``: the step's
    restore-ready copies, ``checkpoint.format.ready``)."""
    leaves: dict[str, Any] = {}
    jobs = []
    for name, entry in manifest.tensors.items():
        obj, raw = _new_leaf(entry)
        leaves[name] = obj
        jobs.append((entry, raw))
    _fill(chunks, jobs, workers, ready)
    return unflatten(manifest.skeleton, lambda tag, name: _lookup(leaves, name), _partial(manifest))


def _partial(manifest: Manifest) -> bool:
    """A manifest pruned by a partial restore (``select``), never one read from the store."""
    return bool(manifest.metadata.get(PARTIAL_KEY))


def _lookup(leaves: dict[str, Any], name: str) -> Any:
    try:
        return leaves[name]
    except KeyError:
        raise ManifestError(f"checkpoint skeleton names tensor {name!r}, which the manifest lacks") from None


def _direct_view(leaf: Any, entry: TensorEntry) -> np.ndarray | None:
    """A writable uint8 view of the target leaf's bytes, if they can be filled in place."""
    obj = leaf.obj
    if not entry.nbytes:
        return None
    if leaf.is_torch and obj.device.type == "cpu" and obj.is_contiguous() and not obj.is_conj() and not obj.is_neg():
        return obj.detach().reshape(-1).view(torch.uint8).numpy()
    if not leaf.is_torch and obj.flags.c_contiguous and obj.flags.writeable:
        return obj.reshape(-1).view(np.uint8)
    return None


def _scratch_for(entry: TensorEntry, budget: int) -> np.ndarray | None:
    """A scratch buffer for the whole tensor if it fits ``budget`` and memory (else None):
    4 KiB-aligned ``hostmem`` from ``HOSTMEM_MIN_BYTES`` on, like a fresh restore's
    destinations, so uncached raw pieces are read into it with ``O_DIRECT``."""
    if entry.nbytes > budget:
        return None
    try:
        if entry.nbytes >= HOSTMEM_MIN_BYTES:
            return empty_array((entry.nbytes,), np.uint8, huge_pages=HUGE_PAGES)
        return np.empty(entry.nbytes, dtype=np.uint8)
    except (MemoryError, OSError):  # OSError: mmap ENOMEM
        return None  # verified first and read twice instead


def load_into(chunks: ChunkStore, manifest: Manifest, target: Any, workers: int = 4,
              scratch_bytes: int = SCRATCH_BYTES, ready: ReadyReads | None = None) -> Any:
    """Fill the tensors of ``target`` in place and copy its other values; returns ``target``.

    Nothing in ``target`` changes unless every piece of the checkpoint reads and verifies
    (see the module docstring). ``RestoreIncompleteError`` is the one exception: a piece past
    ``scratch_bytes`` that verified in the first pass failed when read again (the store
    changed in between); the target then holds verified bytes of this checkpoint in part.
    """
    _skel, leaves = flatten(target)
    by_name = {leaf.name: leaf for leaf in leaves}
    missing = [n for n in manifest.tensors if n not in by_name]
    if missing:
        raise ConfigError(f"restore_into: the target state has no tensor for {missing[:5]} "
                          f"(checkpoint step {manifest.step} has {len(manifest.tensors)} tensors)")
    for name, entry in manifest.tensors.items():
        leaf = by_name[name]
        if leaf.dtype != entry.dtype or tuple(leaf.shape) != tuple(entry.shape):
            raise ConfigError(f"restore_into: {leaf.path} is {leaf.dtype}{list(leaf.shape)}, checkpoint step "
                              f"{manifest.step} has {entry.dtype}{list(entry.shape)}")
    placed: dict[str, Any] = {}
    staged: list[tuple[np.ndarray, np.ndarray]] = []  # (scratch, target view): copied after verification
    copies: list[tuple[Any, Any]] = []  # (target, host tensor): copy_ after verification
    twice: list[tuple[TensorEntry, np.ndarray]] = []  # verified, then read again into the target view
    fill_jobs: list[tuple[TensorEntry, np.ndarray]] = []
    budget = scratch_bytes
    for name, entry in manifest.tensors.items():
        obj = by_name[name].obj
        placed[name] = obj
        direct = _direct_view(by_name[name], entry)
        if direct is None:
            tmp, raw = _new_leaf(entry)
            fill_jobs.append((entry, raw))
            if isinstance(obj, np.ndarray) and not obj.flags.writeable:
                placed[name] = tmp  # read-only (e.g. from bytes): replaced, not filled
            else:
                copies.append((obj, tmp))
            continue
        buf = _scratch_for(entry, budget)
        if buf is None:
            twice.append((entry, direct))
            continue
        budget -= entry.nbytes
        fill_jobs.append((entry, buf))
        staged.append((buf, direct))
    restored = unflatten(manifest.skeleton, lambda tag, name: _lookup(placed, name), _partial(manifest))
    # pass 1: read and verify everything; the target is untouched until this returns
    tasks = [(p, d) for entry, dst in fill_jobs for p, d in _pieces(entry, dst)]
    tasks += [(p, None) for entry, dst in twice for p, _ in _pieces(entry, dst)]
    tasks = group_packed(tasks)  # members of one pack: one task (a PackRead, its list of dsts)
    _run(workers, lambda p, d: read_piece(chunks, p, d, ready) if d is not None else _check_piece(chunks, p, None, ready),
         tasks)
    # pass 2: write the target
    for buf, direct in staged:
        np.copyto(direct, buf)
    for obj, tmp in copies:
        if isinstance(obj, np.ndarray):
            np.copyto(obj, tmp)
        else:
            with torch.no_grad():
                obj.copy_(tmp)
    try:
        _run(workers, lambda p, d: _check_piece(chunks, p, d, ready),
             [(p, d) for entry, dst in twice for p, d in _pieces(entry, dst)])
    except Exception as exc:  # the target is written in part: say so, whatever failed
        raise RestoreIncompleteError(
            f"restore_into of checkpoint step {manifest.step}: a piece verified in the first pass failed when "
            f"read again ({type(exc).__name__}: {exc}); the target holds part of step {manifest.step}: "
            "restore again") from exc
    return merge_into(target, restored)


__all__ = ["host_tensor", "load_into", "load_state", "read_piece"]
