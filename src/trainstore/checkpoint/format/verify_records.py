"""Verification records: the outcome of a ``verify``, stored as ``verify.json`` next to a
checkpoint's manifest (advisory: ``restore`` skips a step recorded bad unless asked).

A record is bound to the manifest it verified (``manifest``: ``manifest.manifest_digest``;
None when the manifest itself was unreadable): ``manifest.load_verify_record`` returns only a
record of the manifest committed now, so a record left behind by a deleted step never applies
to a step saved again under the same number (nor does one written before records were bound:
that step is verified again)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from ...errors import ManifestError, NotFoundError
from ...store.base import Buffer, Store
from ...store.checked import read_checked
from .layout import verify_key


@dataclass(frozen=True)
class VerifyRecord:
    """Outcome of a verification, stored as ``verify.json`` next to the manifest."""

    step: int
    ok: bool
    deep: bool
    checked_at: float
    errors: tuple[str, ...] = ()
    chunks_checked: int = 0
    manifest: str | None = None  # digest of the manifest verified (None: it was unreadable)

    def to_json(self) -> dict:
        return {"step": self.step, "ok": self.ok, "deep": self.deep, "checked_at": self.checked_at,
                "errors": list(self.errors), "chunks_checked": self.chunks_checked, "manifest": self.manifest}

    @classmethod
    def from_json(cls, obj: Any) -> VerifyRecord:
        if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
            raise ManifestError("verify record must be an object with a boolean 'ok'")
        errors = obj.get("errors") or []
        digest = obj.get("manifest")
        try:
            return cls(step=int(obj.get("step", -1)), ok=obj["ok"], deep=bool(obj.get("deep")),
                       checked_at=float(obj.get("checked_at") or 0.0),
                       errors=tuple(str(e) for e in errors)[:100], chunks_checked=int(obj.get("chunks_checked") or 0),
                       manifest=digest if isinstance(digest, str) else None)
        except (TypeError, ValueError) as exc:
            raise ManifestError(f"verify record: {exc}") from None


def write_verify_record(store: Store, job: str, record: VerifyRecord) -> None:
    store.put(verify_key(job, record.step), json.dumps(record.to_json()).encode())


def read_verify_record(store: Store, job: str, step: int) -> VerifyRecord | None:
    """The record stored for ``step``, whichever manifest it verified (a bad copy in one tier is
    read from the next), or None: never verified, or unreadable in every tier. Readers that act
    on it use ``manifest.load_verify_record``, which binds it to the manifest."""
    key = verify_key(job, step)

    def parse(data: Buffer) -> VerifyRecord:
        try:
            return VerifyRecord.from_json(json.loads(bytes(memoryview(data))))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ManifestError(f"verify record {key}: {exc}") from None

    try:
        return read_checked(store, key, parse)
    except (NotFoundError, ManifestError):
        return None


def new_verify_record(step: int, deep: bool, errors: list[str], chunks_checked: int,
                      manifest: str | None = None) -> VerifyRecord:
    return VerifyRecord(step, not errors, deep, time.time(), tuple(errors), chunks_checked, manifest)


__all__ = ["VerifyRecord", "write_verify_record", "read_verify_record", "new_verify_record"]
