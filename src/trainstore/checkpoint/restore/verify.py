"""Verification of committed checkpoints.

Shallow: every chunk a manifest names exists with the recorded stored size, and the base
manifest of an incremental exists. Deep: additionally every chunk is read, decoded and
re-hashed (``ChunkStore.verify(deep=True)``: BLAKE3, and the read check the manifest records
for its pieces, ``digests``), and every XOR delta is applied to its base and every packed
piece cut from its pack, each checked against the piece's recorded hash and read check. The outcome is written to
``jobs/<job>/checkpoints/<step>/verify.json`` (see ``manifest.VerifyRecord``) so that
``restore()`` skips a checkpoint known to be bad; the record is bound to the manifest it
verified (its digest), so it never applies to a step saved again under the same number.

Only integrity failures (``IntegrityError``: corrupt, undecodable or missing chunks, an
unreadable or missing base manifest) are recorded as problems; any other error (the store
unreachable, an I/O error, out of memory) is raised and records nothing: it says nothing
about the checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...chunks import ChunkRef, ChunkStore
from ...digests import matches
from ...errors import IntegrityError, NotFoundError, TrainstoreError
from ..format.manifest import (
    Manifest,
    VerifyRecord,
    load_manifest,
    manifest_digest,
    manifest_key,
    new_verify_record,
    write_verify_record,
)
from ..format.packs import PackRead, group_packed
from .reader import read_piece

log = logging.getLogger("trainstore.checkpoint")


def verify_manifest(chunks: ChunkStore, manifest: Manifest, deep: bool = True, workers: int = 4) -> VerifyRecord:
    """Check one checkpoint; returns a record bound to ``manifest`` (``ok`` False lists every
    problem found). Deep: the manifest's copy in every tier is checked too, bad ones repaired."""
    errors: list[str] = []
    if deep:
        try:
            load_manifest(chunks.store, manifest.job, manifest.step, scrub=True)
        except IntegrityError as exc:
            errors.append(f"manifest: {exc}")
        except NotFoundError:
            pass  # deleted since it was read: its chunks are checked as given
    if manifest.kind == "incremental":
        try:
            base = load_manifest(chunks.store, manifest.job, manifest.base_step)  # type: ignore[arg-type]
            if base.kind != "full":
                errors.append(f"base step {manifest.base_step} is not a full checkpoint")
        except (IntegrityError, NotFoundError) as exc:
            errors.append(f"base step {manifest.base_step}: {exc}")
    refs: dict[ChunkRef, str | None] = {}  # chunk -> the read check its plain pieces record
    deltas, packed = [], []  # pieces that are not a chunk's bytes as stored
    for t in manifest.tensors.values():
        for piece in t.chunks:
            for ref in piece.refs():
                refs.setdefault(ref, None)
            if piece.base is not None:
                deltas.append(piece)
            elif piece.span is not None:
                packed.append(piece)
            elif piece.check is not None:
                refs[piece.ref] = piece.check
    # a pack's members are read together (one read of the pack, as a restore does)
    built = deltas + [group for group, _dsts in group_packed([(p, None) for p in packed])]

    def check(item: tuple[ChunkRef, str | None]) -> str | None:
        ref, read_check = item
        try:  # deep: BLAKE3 and the read check restore compares, so neither can disagree
            chunks.verify(ref, deep=deep, check=read_check)
        except IntegrityError as exc:
            return str(exc)
        except NotFoundError:
            return f"missing chunk {ref.key(chunks.prefix)}"
        return None

    def check_built(piece) -> str | None:  # noqa: ANN001 - a delta piece or a PackRead
        members = piece.members if isinstance(piece, PackRead) else (piece,)
        outs = [np.empty(m.size, dtype=np.uint8) for m in members]
        try:  # against the read checks, when there are some ...
            read_piece(chunks, piece, outs if isinstance(piece, PackRead) else outs[0])
        except IntegrityError as exc:
            return str(exc)
        for m, out in zip(members, outs):  # ... and the recorded hashes: the two must agree
            if m.check is not None and not matches(out, m.content_hash or "", m.check, strong=True):
                return f"piece of chunk {m.ref.key(chunks.prefix)}: its recorded hash and read check disagree"
        return None

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trainstore-ckpt-verify") as pool:
        errors += [e for e in pool.map(check, sorted(refs.items(), key=lambda r: r[0].hash)) if e]
        if deep and not errors:
            errors += [e for e in pool.map(check_built, built) if e]
    return new_verify_record(manifest.step, deep, errors, len(refs), manifest_digest(manifest))


def record(chunks: ChunkStore, job: str, rec: VerifyRecord) -> None:
    """Store the record next to the manifest (best effort: a read-only store just skips)."""
    try:
        write_verify_record(chunks.store, job, rec)
    except TrainstoreError:
        pass


def verify_steps(chunks: ChunkStore, job: str, steps: list[int], deep: bool, workers: int, *, asked: bool,
                 notify: Callable[[VerifyRecord], None]) -> list[VerifyRecord]:
    """Verify ``steps`` of ``job`` (``asked``: one step the caller named, which must exist),
    record each outcome in the store and ``notify`` it; returns the records."""
    records = []
    for s in steps:
        try:
            m = load_manifest(chunks.store, job, s)
        except IntegrityError as exc:  # only integrity failures are recorded as bad
            m, rec = None, new_verify_record(s, deep, [f"manifest: {exc}"], 0)
        except NotFoundError:
            if asked or chunks.store.exists(manifest_key(job, s)):
                raise NotFoundError(f"no checkpoint step {s} for job {job!r}") from None
            continue  # deleted since it was listed
        if m is not None:
            rec = verify_manifest(chunks, m, deep=deep, workers=workers)
        record(chunks, job, rec)
        notify(rec)
        if not rec.ok:
            log.warning("checkpoint step %d of job %r failed verification: %s", s, job, "; ".join(rec.errors[:3]))
        records.append(rec)
    return records


__all__ = ["verify_manifest", "verify_steps", "record"]
