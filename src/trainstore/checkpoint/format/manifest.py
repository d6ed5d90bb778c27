"""Checkpoint manifests: the JSON format (validated), loading, committing, verification records.

The layout (keys, listing) is in ``layout.py``: a checkpoint exists only once its
``manifest.json`` is committed, after every chunk it names is durable.

Manifest JSON (``format: "trainstore.checkpoint/2"``; ``/1`` when it holds no packed entry,
so such checkpoints stay readable by older versions; a newer version than ``FORMAT_VERSION``
is refused with a clear error)::

    {
      "format": "trainstore.checkpoint/2",
      "job": "run-1", "step": 1200, "kind": "full" | "incremental",
      "base_step": null | 1000,              # incremental: the FULL checkpoint deltas refer to
      "chunk_bytes": 8388608,                # how tensors were cut (raw bytes per chunk)
      "tensors": {
        "<name>": {"dtype": "torch.bfloat16" | "numpy:<f4", "shape": [..], "nbytes": N,
                   "chunks": [CHUNK, ...]}   # in order; each covers chunk_bytes raw bytes (last: rest)
      },
      "skeleton": <JSON tree of the state; tensors appear as {"$tensor": "<name>"}>,
      "metadata": {"config": {...}, "metrics": {...}, "created": <unix time>,
                   "code_version": "git:<sha>[-dirty]" | null,   # the user's code
                   "trainstore_version": "git:<describe>" | "trainstore <version>",  # absent before 0.1
                   "extra": {...}},
      "logical_bytes": raw tensor bytes, "stored_bytes": bytes of the chunks this checkpoint
      owns (not counting base chunks it references), "written_bytes": bytes this save wrote
    }

A CHUNK is one of:

* ``{"ref": REF}``: the piece is the chunk REF (for incrementals: REF may be the identical chunk
  of the base checkpoint, then ``"same": true``);
* ``{"delta": REF, "base": BASEREF, "hash": H}``: the piece is ``decode(REF) XOR decode(BASEREF)``,
  where BASEREF is the same piece of the base full checkpoint; H is the BLAKE3 of the result.
* ``{"pack": REF, "at": [OFFSET, LENGTH], "hash": H}`` (format 2): the piece is bytes
  ``[OFFSET, OFFSET + LENGTH)`` of the pack chunk REF, which holds several small tensors
  (``packs.py``); H is the BLAKE3 of the piece, so one tensor is read (a range) and verified
  alone. ``"same": true`` when it is the base checkpoint's identical packed piece.

REF is ``ChunkRef.to_json()``: ``[hash, codec, raw size, stored size, itemsize]``.

Every CHUNK may carry ``"check": C``: the xxh3-128 (32 hex digits) of the piece's raw bytes,
what a restore compares the piece against (``digests``: 5x cheaper than BLAKE3, which stays
the content address and what ``verify`` compares). Entries without one (manifests written
before read checks) are checked with BLAKE3. Readers that predate the key ignore it, so it
needs no new format version.

Everything here validates hostile input: a malformed manifest raises ``ManifestError``
naming the key, never a KeyError or a half-built object.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...chunks import ChunkRef, content_hash
from ...errors import ConfigError, ManifestError, NotFoundError
from ...store.base import Store
from ...store.checked import read_checked
from .entries import ChunkEntry, TensorEntry  # re-exported: the manifest's pieces
from .layout import (
    MANIFEST_NAME,
    STEP_DIGITS,
    VERIFY_NAME,
    check_job,
    check_step,
    checkpoints_prefix,
    job_prefix,
    list_jobs,
    list_steps,
    manifest_key,
    step_prefix,
    verify_key,
)
from .verify_records import VerifyRecord, new_verify_record, read_verify_record, write_verify_record

FORMAT_NAME = "trainstore.checkpoint"
#: The newest manifest format this code reads and writes (2: packed pieces).
FORMAT_VERSION = 2
FORMAT = f"{FORMAT_NAME}/{FORMAT_VERSION}"
FORMAT_V1 = f"{FORMAT_NAME}/1"
KINDS = ("full", "incremental")
MAX_MANIFEST_BYTES = 256 << 20  # the largest manifest any reader accepts


# -- the manifest -------------------------------------------------------------------------
@dataclass(frozen=True)
class Manifest:
    """A committed checkpoint. ``tensors`` maps names (used in ``skeleton``) to entries."""

    job: str
    step: int
    kind: str
    tensors: dict[str, TensorEntry]
    skeleton: Any
    base_step: int | None = None
    chunk_bytes: int = 8 << 20
    metadata: dict[str, Any] = field(default_factory=dict)
    logical_bytes: int = 0
    stored_bytes: int = 0
    written_bytes: int = 0

    @property
    def created(self) -> float:
        return float(self.metadata.get("created") or 0.0)

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(self.metadata.get("metrics") or {})

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.metadata.get("config") or {})

    @property
    def key(self) -> str:
        return manifest_key(self.job, self.step)

    def to_json(self) -> dict:
        packed = any(c.span is not None for t in self.tensors.values() for c in t.chunks)
        return {
            "format": FORMAT if packed else FORMAT_V1,  # /1 readers can read what has no packs
            "job": self.job,
            "step": self.step,
            "kind": self.kind,
            "base_step": self.base_step,
            "chunk_bytes": self.chunk_bytes,
            "tensors": {name: t.to_json() for name, t in self.tensors.items()},
            "skeleton": self.skeleton,
            "metadata": self.metadata,
            "logical_bytes": self.logical_bytes,
            "stored_bytes": self.stored_bytes,
            "written_bytes": self.written_bytes,
        }

    def to_bytes(self) -> bytes:
        """JSON with a trailing ``"checksum"`` (BLAKE3 of the JSON without it), so a flipped
        bit anywhere in the manifest, not only in tensor bytes, is detected on load."""
        return _append_checksum(_canonical(self.to_json()))

    @classmethod
    def from_json(cls, obj: Any, where: str = "") -> Manifest:
        if not isinstance(obj, dict):
            raise ManifestError(f"checkpoint manifest {where}: not a JSON object")
        check_format(obj.get("format"), where)
        try:
            job, step, kind = check_job(obj.get("job")), check_step(obj.get("step")), obj.get("kind")
        except ConfigError as exc:
            raise ManifestError(f"checkpoint manifest {where}: {exc}") from None
        if kind not in KINDS:
            raise ManifestError(f"checkpoint manifest {where}: kind must be one of {KINDS}, got {kind!r:.40}")
        base = obj.get("base_step")
        if kind == "incremental":
            if not isinstance(base, int) or isinstance(base, bool) or not 0 <= base < step:
                raise ManifestError(f"checkpoint manifest {where}: incremental needs a base_step < step, got {base!r:.40}")
        elif base is not None:
            raise ManifestError(f"checkpoint manifest {where}: a full checkpoint has no base_step")
        tensors_obj = obj.get("tensors")
        if not isinstance(tensors_obj, dict):
            raise ManifestError(f"checkpoint manifest {where}: 'tensors' must be an object")
        try:
            tensors = {str(n): TensorEntry.from_json(n, t) for n, t in tensors_obj.items()}
        except ManifestError as exc:
            raise ManifestError(f"checkpoint manifest {where}: {exc}") from None
        metadata = obj.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ManifestError(f"checkpoint manifest {where}: 'metadata' must be an object")
        ints = {}
        for name in ("chunk_bytes", "logical_bytes", "stored_bytes", "written_bytes"):
            v = obj.get(name, 0)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ManifestError(f"checkpoint manifest {where}: {name} must be a non-negative int")
            ints[name] = v
        return cls(job=job, step=step, kind=kind, tensors=tensors, skeleton=obj.get("skeleton"),
                   base_step=base, metadata=metadata, **ints)

    @classmethod
    def from_bytes(cls, data: Any, where: str = "") -> Manifest:
        raw = bytes(memoryview(data))
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ManifestError(f"checkpoint manifest {where} is not valid JSON (truncated?): {exc}") from None
        if not _raw_checksum_ok(raw, obj):  # bytes not as to_bytes wrote them: check the parsed object
            check_checksum(obj, f"checkpoint manifest {where}")
        return cls.from_json(obj, where)


def check_format(fmt: Any, where: str = "") -> int:
    """The version of a manifest's ``format`` string; ``ManifestError`` if it is not a
    trainstore checkpoint or is newer than this code reads (upgrade trainstore to read it)."""
    name, _, version = fmt.rpartition("/") if isinstance(fmt, str) else ("", "", "")
    if name != FORMAT_NAME or not version.isdigit() or int(version) < 1:
        raise ManifestError(f"checkpoint manifest {where}: unknown format {fmt!r:.60}")
    if int(version) > FORMAT_VERSION:
        raise ManifestError(f"checkpoint manifest {where}: format version {int(version)} is newer than this "
                            f"trainstore reads (up to {FORMAT_VERSION}); upgrade trainstore to restore it")
    return int(version)


def _canonical(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


_CHECKSUM_FIELD = b',"checksum":"'


def _append_checksum(body: bytes) -> bytes:
    """``body`` (compact JSON of a non-empty object) with ``"checksum"`` (BLAKE3 of ``body``)
    as its last field: the bytes ``json.dumps(with_checksum(obj))`` gives, serialised once."""
    return body[:-1] + _CHECKSUM_FIELD + content_hash(body).encode() + b'"}'


def _raw_checksum_ok(raw: bytes, obj: Any) -> bool:
    """True when ``raw`` is exactly ``_append_checksum`` of its body and the checksum matches
    (then ``obj``, parsed from ``raw``, loses its ``"checksum"`` as ``check_checksum`` does);
    False means "not shown this way": ``check_checksum`` decides, by re-serialising."""
    at = raw.rfind(_CHECKSUM_FIELD)
    if at < 0 or not isinstance(obj, dict) or not raw.endswith(b'"}'):
        return False
    expected = raw[at + len(_CHECKSUM_FIELD):-2]
    if expected != str(obj.get("checksum", "")).encode() or content_hash(raw[:at] + b"}") != expected.decode():
        return False
    del obj["checksum"]
    return True


def with_checksum(obj: dict) -> dict:
    """``obj`` plus ``"checksum"``: BLAKE3 of its compact JSON (key order as given)."""
    return {**obj, "checksum": content_hash(_canonical(obj))}


def check_checksum(obj: Any, what: str) -> None:
    """Verify and remove the ``"checksum"`` that ``with_checksum`` added (``ManifestError``).

    The JSON parser keeps key order, so re-serialising the parsed object reproduces the
    bytes that were hashed."""
    if not isinstance(obj, dict):
        raise ManifestError(f"{what}: not a JSON object")
    expected = obj.pop("checksum", None)
    if not isinstance(expected, str):
        raise ManifestError(f"{what}: no checksum (corrupted, or written by a foreign tool)")
    try:
        actual = content_hash(_canonical(obj))
    except (ValueError, TypeError, RecursionError):
        actual = ""
    if actual != expected:
        raise ManifestError(f"{what}: checksum mismatch (the manifest is corrupted)")


def manifest_refs(manifest: Manifest) -> set[ChunkRef]:
    """Every ChunkRef the manifest needs (its own chunks and the base chunks deltas use).

    GC keeps a chunk object alive if any committed manifest's ``manifest_refs`` contains it;
    ``ref.key()`` is the object key in the store.
    """
    refs: set[ChunkRef] = set()
    for t in manifest.tensors.values():
        for c in t.chunks:
            refs.update(c.refs())
    return refs


def manifest_chunk_keys(manifest: Manifest, prefix: str = "chunks") -> set[str]:
    """Store keys of every chunk the manifest references (see ``manifest_refs``)."""
    return {r.key(prefix) for r in manifest_refs(manifest)}


# -- store access -------------------------------------------------------------------------
def parse_manifest(data: Any, key: str) -> Manifest:
    """The manifest stored at ``key`` from its bytes, refusing oversized ones (``ManifestError``)."""
    if memoryview(data).nbytes > MAX_MANIFEST_BYTES:
        raise ManifestError(f"checkpoint manifest {key} is larger than {MAX_MANIFEST_BYTES} bytes")
    return Manifest.from_bytes(data, key)


def _parse_step(data: Any, job: str, step: int) -> Manifest:
    """``parse_manifest`` of the lineage manifest of ``job``@``step``, which must say so."""
    key = manifest_key(job, step)
    m = parse_manifest(data, key)
    if m.job != job or m.step != step:
        raise ManifestError(f"checkpoint manifest {key} says job={m.job!r} step={m.step}")
    return m


def load_manifest(store: Store, job: str, step: int, *, scrub: bool = False) -> Manifest:
    """Read and validate one manifest. ``NotFoundError`` / ``ManifestError``.

    A copy that fails validation in one tier is read from the next and repaired where it was
    bad (``store.checked.read_checked``): ``ManifestError`` only when no tier holds a good
    copy. ``scrub``: check (and repair) the copy in every tier (deep verification)."""
    return read_checked(store, manifest_key(job, step), lambda data: _parse_step(data, job, step), scrub=scrub)


def manifest_digest(manifest: Manifest) -> str:
    """BLAKE3 of the manifest's canonical bytes: what a verification record is bound to, so a
    record never applies to another manifest committed later under the same step."""
    return content_hash(manifest.to_bytes())


def checkpoint_id(store: Store, job: str, step: int) -> str:
    """BLAKE3 of the stored bytes of a good copy of the step's manifest: the exact checkpoint
    (the registry records it, exports carry it). A bad copy in one tier is read past."""
    def check(data: Any) -> str:
        _parse_step(data, job, step)
        return content_hash(data)

    return read_checked(store, manifest_key(job, step), check)


_READ = object()


def load_verify_record(store: Store, job: str, step: int,
                       manifest: Manifest | None | object = _READ) -> VerifyRecord | None:
    """The last verification record of ``manifest`` (default: the step's manifest committed
    now, read here; None: a manifest unreadable in every tier), or None: never verified, or
    the record is of another manifest (a step deleted and saved again under its number)."""
    if manifest is _READ:
        try:
            manifest = load_manifest(store, job, step)
        except NotFoundError:
            return None
        except ManifestError:
            manifest = None
    rec = read_verify_record(store, job, step)
    digest = manifest_digest(manifest) if isinstance(manifest, Manifest) else None
    return rec if rec is not None and rec.manifest == digest else None


def list_manifests(store: Store, job: str) -> Iterator[Manifest | ManifestError]:
    """Every committed manifest of ``job``, oldest first; an unreadable one yields its error."""
    for step in list_steps(store, job):
        try:
            yield load_manifest(store, job, step)
        except ManifestError as exc:
            yield exc
        except NotFoundError:
            continue  # deleted while listing


def commit_manifest(store: Store, manifest: Manifest) -> None:
    """Write the manifest with a conditional create (``AlreadyExistsError`` if the step exists)."""
    store.put_if_absent(manifest.key, manifest.to_bytes())


__all__ = [
    "FORMAT", "FORMAT_VERSION", "FORMAT_V1", "check_format", "KINDS", "MANIFEST_NAME", "STEP_DIGITS", "VERIFY_NAME", "job_prefix", "ChunkEntry", "TensorEntry", "Manifest", "VerifyRecord",
    "check_job", "check_step", "checkpoints_prefix", "step_prefix", "manifest_key", "verify_key",
    "manifest_refs", "manifest_chunk_keys", "list_steps", "list_jobs", "load_manifest", "parse_manifest", "MAX_MANIFEST_BYTES", "manifest_digest", "checkpoint_id",
    "list_manifests", "commit_manifest", "write_verify_record", "load_verify_record",
    "new_verify_record",
]
