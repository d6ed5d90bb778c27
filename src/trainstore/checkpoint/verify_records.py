"""Verification records: the outcome of a ``verify``, stored as ``verify.json`` next to a
checkpoint's manifest (advisory: ``restore`` skips a step recorded bad unless asked)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from ..errors import ManifestError, NotFoundError
from ..store.base import Store
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

    def to_json(self) -> dict:
        return {"step": self.step, "ok": self.ok, "deep": self.deep, "checked_at": self.checked_at,
                "errors": list(self.errors), "chunks_checked": self.chunks_checked}

    @classmethod
    def from_json(cls, obj: Any) -> VerifyRecord:
        if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
            raise ManifestError("verify record must be an object with a boolean 'ok'")
        errors = obj.get("errors") or []
        return cls(step=int(obj.get("step", -1)), ok=obj["ok"], deep=bool(obj.get("deep")),
                   checked_at=float(obj.get("checked_at") or 0.0),
                   errors=tuple(str(e) for e in errors)[:100], chunks_checked=int(obj.get("chunks_checked") or 0))


def write_verify_record(store: Store, job: str, record: VerifyRecord) -> None:
    store.put(verify_key(job, record.step), json.dumps(record.to_json()).encode())


def load_verify_record(store: Store, job: str, step: int) -> VerifyRecord | None:
    """The last verification record of a step, or None (never verified / unreadable)."""
    try:
        data = store.get(verify_key(job, step))
        return VerifyRecord.from_json(json.loads(bytes(memoryview(data))))
    except (NotFoundError, ManifestError, ValueError, TypeError):
        return None


def new_verify_record(step: int, deep: bool, errors: list[str], chunks_checked: int) -> VerifyRecord:
    return VerifyRecord(step, not errors, deep, time.time(), tuple(errors), chunks_checked)


__all__ = ["VerifyRecord", "write_verify_record", "load_verify_record", "new_verify_record"]
