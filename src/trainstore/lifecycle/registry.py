"""Model registry in the store itself: named model versions with lineage, and aliases.

Layout (no server; only ``put_if_absent``, so it is correct under concurrent writers on
every backend)::

    registry/models/<model>/versions/<version:06d>.json        immutable version records
    registry/models/<model>/aliases/<alias>/<seq:012d>.json    append-only alias events

* A **version** is created with ``put_if_absent`` at the next free number; a writer that
  loses the race re-lists and takes the next number. Records are never rewritten.
* An **alias** is an append-only log: each move writes event ``seq+1`` with
  ``put_if_absent``. The alias points where its highest event says. Two writers racing for
  the same ``seq`` cannot both win; the loser re-reads and retries, or, when it asked for
  ``expect=`` (compare-and-set), gets ``ConflictError`` if the alias moved meanwhile. The
  log doubles as history: ``rollback`` returns an alias to its previous target, or to
  another alias's target (``stable`` -> ``fallback``).

Every record carries a BLAKE3 checksum (like manifests). Registered checkpoints are kept
forever by retention (``protected_steps``).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from .. import naming
from ..checkpoint.format import manifest as mf
from ..errors import AlreadyExistsError, ConfigError, ConflictError, ManifestError, NotFoundError
from ..store import open_store
from ..store.base import Store
from ..store.checked import read_checked

PREFIX = "registry/models/"
VERSION_FORMAT = "trainstore.model-version/1"
ALIAS_FORMAT = "trainstore.alias-event/1"
_MAX_RETRIES = 1000
_UNSET: Any = object()


def check_name(name: object, what: str = "model name") -> str:
    return naming.check_name(name, what)


@dataclass(frozen=True)
class ModelVersion:
    """A registered checkpoint: where it is, what it scored, what it was trained on."""

    model: str
    version: int
    job: str
    step: int
    checkpoint_id: str  # BLAKE3 of the checkpoint's manifest bytes: the exact checkpoint
    kind: str
    created: float  # registration time
    metrics: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    dataset: str | None = None  # dataset version, e.g. "tokens@3"
    code_version: str | None = None
    note: str | None = None
    registered_by: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.version}"

    def to_json(self) -> dict:
        return {"format": VERSION_FORMAT, "model": self.model, "version": self.version, "job": self.job,
                "step": self.step, "checkpoint_id": self.checkpoint_id, "kind": self.kind,
                "created": self.created, "metrics": self.metrics, "config": self.config,
                "dataset": self.dataset, "code_version": self.code_version, "note": self.note,
                "registered_by": self.registered_by}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> ModelVersion:
        if not isinstance(obj, dict) or obj.get("format") != VERSION_FORMAT:
            raise ManifestError(f"model version record {where}: unknown format")
        try:
            return cls(model=check_name(obj["model"]), version=int(obj["version"]), job=mf.check_job(obj["job"]),
                       step=mf.check_step(obj["step"]), checkpoint_id=str(obj["checkpoint_id"]),
                       kind=str(obj["kind"]), created=float(obj["created"]), metrics=dict(obj.get("metrics") or {}),
                       config=dict(obj.get("config") or {}), dataset=obj.get("dataset"),
                       code_version=obj.get("code_version"), note=obj.get("note"),
                       registered_by=obj.get("registered_by"))
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise ManifestError(f"model version record {where}: {exc}") from None


@dataclass(frozen=True)
class AliasEvent:
    """One move of an alias (``version`` None: the alias was removed)."""

    model: str
    alias: str
    seq: int
    version: int | None
    previous: int | None
    at: float
    action: str  # "set" | "rollback" | "promote" | "remove"
    by: str | None = None

    def to_json(self) -> dict:
        return {"format": ALIAS_FORMAT, "model": self.model, "alias": self.alias, "seq": self.seq,
                "version": self.version, "previous": self.previous, "at": self.at, "action": self.action,
                "by": self.by}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> AliasEvent:
        if not isinstance(obj, dict) or obj.get("format") != ALIAS_FORMAT:
            raise ManifestError(f"alias event {where}: unknown format")
        try:
            v, p = obj.get("version"), obj.get("previous")
            return cls(obj["model"], obj["alias"], int(obj["seq"]), None if v is None else int(v),
                       None if p is None else int(p), float(obj["at"]), str(obj["action"]), obj.get("by"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"alias event {where}: {exc}") from None


def _encode(obj: dict) -> bytes:
    return json.dumps(mf.with_checksum(obj), separators=(",", ":"), allow_nan=False).encode()


def _decode(data: Any, where: str) -> dict:
    try:
        obj = json.loads(bytes(memoryview(data)))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ManifestError(f"registry record {where} is not valid JSON: {exc}") from None
    mf.check_checksum(obj, f"registry record {where}")
    return obj


def _load(store: Store, key: str) -> dict:
    """A registry record; a bad copy in one tier is read from the next and repaired."""
    return read_checked(store, key, lambda data: _decode(data, key))


def _who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        user = "?"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


class Registry:
    """Model versions and aliases stored under ``registry/`` of a checkpoint store."""

    def __init__(self, store: str | Store, **store_options: Any) -> None:
        self.store: Store = open_store(store, **store_options)

    # -- keys ------------------------------------------------------------------------------
    @staticmethod
    def _versions_prefix(model: str) -> str:
        return f"{PREFIX}{check_name(model)}/versions/"

    @staticmethod
    def _alias_prefix(model: str, alias: str) -> str:
        return f"{PREFIX}{check_name(model)}/aliases/{check_name(alias, 'alias name')}/"

    @staticmethod
    def _numbered(store: Store, prefix: str, suffix: str = ".json") -> list[int]:
        out = []
        for meta in store.list(prefix):
            name = meta.key[len(prefix):]
            if "/" not in name and name.endswith(suffix) and name[:-len(suffix)].isdigit():
                out.append(int(name[:-len(suffix)]))
        return sorted(out)

    # -- versions --------------------------------------------------------------------------
    def register(self, job: str, step: int, model: str, *, metrics: dict | None = None, config: dict | None = None,
                 dataset: str | None = None, note: str | None = None,
                 aliases: tuple[str, ...] = ("latest",)) -> ModelVersion:
        """Register checkpoint ``job``@``step`` as the next version of ``model``; move ``aliases`` to it.

        Lineage comes from the checkpoint's manifest (metrics, config, code version); the
        arguments add to or override it. ``NotFoundError`` if the checkpoint does not exist.
        """
        check_name(model)
        try:
            m = mf.load_manifest(self.store, job, step)
            checkpoint_id = mf.checkpoint_id(self.store, job, step)
        except NotFoundError:
            raise NotFoundError(f"cannot register {model!r}: no checkpoint step {step} of job {job!r} "
                                f"in {self.store.url}") from None
        extra = m.metadata.get("extra") or {}
        dataset = dataset or (extra.get("dataset") if isinstance(extra, dict) else None)
        for alias in aliases:
            check_name(alias, "alias name")
        prefix = self._versions_prefix(model)
        for _ in range(_MAX_RETRIES):
            existing = self._numbered(self.store, prefix)
            number = existing[-1] + 1 if existing else 1
            mv = ModelVersion(model=model, version=number, job=job, step=step,
                              checkpoint_id=checkpoint_id, kind=m.kind, created=time.time(),
                              metrics={**m.metrics, **(metrics or {})}, config={**m.config, **(config or {})},
                              dataset=dataset, code_version=m.metadata.get("code_version"), note=note,
                              registered_by=_who())
            try:
                self.store.put_if_absent(f"{prefix}{number:06d}.json", _encode(mv.to_json()))
                break
            except AlreadyExistsError:
                continue  # another writer took this number: take the next
        else:  # pragma: no cover - would need 1000 concurrent registrations
            raise ConflictError(f"could not register a version of {model!r}: too much contention")
        for alias in aliases:
            self.set_alias(model, alias, mv.version)
        return mv

    def version(self, model: str, version: int) -> ModelVersion:
        key = f"{self._versions_prefix(model)}{int(version):06d}.json"
        try:
            obj = _load(self.store, key)
        except NotFoundError:
            known = self._numbered(self.store, self._versions_prefix(model))
            if not known:
                raise NotFoundError(f"no model {model!r} in the registry of {self.store.url} "
                                    f"(models: {self.models()[:10]})") from None
            raise NotFoundError(f"model {model!r} has no version {version} (versions {known[0]}..{known[-1]})") from None
        return ModelVersion.from_json(obj, key)

    def versions(self, model: str) -> list[ModelVersion]:
        return [self.version(model, v) for v in self._numbered(self.store, self._versions_prefix(model))]

    def models(self) -> list[str]:
        names = set()
        for meta in self.store.list(PREFIX):
            parts = meta.key[len(PREFIX):].split("/")
            if len(parts) == 3 and parts[1] == "versions":
                names.add(parts[0])
        return sorted(names)

    # -- aliases ---------------------------------------------------------------------------
    def history(self, model: str, alias: str) -> list[AliasEvent]:
        """Every move of ``alias``, oldest first."""
        prefix = self._alias_prefix(model, alias)
        out = []
        for seq in self._numbered(self.store, prefix):
            key = f"{prefix}{seq:012d}.json"
            try:
                out.append(AliasEvent.from_json(_load(self.store, key), key))
            except NotFoundError:
                continue
        return out

    def _head(self, model: str, alias: str) -> tuple[int, int | None]:
        """(highest seq, current version) of an alias; (0, None) if never set."""
        prefix = self._alias_prefix(model, alias)
        seqs = self._numbered(self.store, prefix)
        if not seqs:
            return 0, None
        key = f"{prefix}{seqs[-1]:012d}.json"
        return seqs[-1], AliasEvent.from_json(_load(self.store, key), key).version

    def aliases(self, model: str) -> dict[str, int]:
        """Current target version of every alias of ``model`` (removed aliases omitted)."""
        check_name(model)
        prefix = f"{PREFIX}{model}/aliases/"
        names = {meta.key[len(prefix):].split("/")[0] for meta in self.store.list(prefix)}
        out = {}
        for name in sorted(names):
            _seq, v = self._head(model, name)
            if v is not None:
                out[name] = v
        return out

    def set_alias(self, model: str, alias: str, version: int | None, *, expect: Any = _UNSET,
                  action: str = "set") -> AliasEvent:
        """Point ``alias`` at ``version`` (None removes it).

        ``expect``: compare-and-set - only move if the alias currently points at ``expect``
        (None: unset), else ``ConflictError``. Without it, concurrent moves are serialised
        and the last one wins; no move is ever lost from the history.
        """
        if version is not None:
            self.version(model, version)  # NotFoundError for an unknown model/version
        prefix = self._alias_prefix(model, alias)
        for _ in range(_MAX_RETRIES):
            seq, current = self._head(model, alias)
            if expect is not _UNSET and current != expect:
                raise ConflictError(f"alias {model}@{alias} points at {current}, expected {expect} "
                                    "(moved concurrently)")
            ev = AliasEvent(model, alias, seq + 1, version, current, time.time(), action, _who())
            try:
                self.store.put_if_absent(f"{prefix}{seq + 1:012d}.json", _encode(ev.to_json()))
                return ev
            except AlreadyExistsError:
                continue  # another writer moved it first: re-read and retry
        raise ConflictError(f"could not move alias {model}@{alias}: too much contention")  # pragma: no cover

    def remove_alias(self, model: str, alias: str) -> AliasEvent:
        if self._head(model, alias)[1] is None:
            raise NotFoundError(f"model {model!r} has no alias {alias!r}")
        return self.set_alias(model, alias, None, action="remove")

    def resolve_alias(self, model: str, alias: str) -> ModelVersion:
        _seq, v = self._head(model, alias)
        if v is None:
            known = sorted(self.aliases(model))
            if not known and not self._numbered(self.store, self._versions_prefix(model)):
                raise NotFoundError(f"no model {model!r} in the registry of {self.store.url} "
                                    f"(models: {self.models()[:10]})")
            raise NotFoundError(f"model {model!r} has no alias {alias!r} (aliases: {known})")
        return self.version(model, v)

    def get(self, ref: str) -> ModelVersion:
        """Resolve ``"model@3"``, ``"model@stable"`` or ``"model"`` (= ``model@latest``)."""
        model, _, which = ref.partition("@")
        which = which or "latest"
        if which.isdigit():
            return self.version(model, int(which))
        return self.resolve_alias(model, which)

    def rollback(self, model: str, alias: str = "stable", to: str | None = "fallback") -> AliasEvent:
        """Move ``alias`` back: to where alias ``to`` points (``stable`` -> ``fallback``), or,
        with ``to=None``, to the alias's own previous target."""
        seq, current = self._head(model, alias)
        if to is not None:
            target = self.resolve_alias(model, to).version
        else:
            events = self.history(model, alias)
            if not events or events[-1].previous is None:
                raise NotFoundError(f"alias {model}@{alias} has no previous target to roll back to")
            target = events[-1].previous
        return self.set_alias(model, alias, target, expect=current, action="rollback")

    def promote(self, model: str, version: int, alias: str = "stable", fallback: str | None = "fallback") -> AliasEvent:
        """Make ``version`` the ``alias`` (stable); its previous target becomes ``fallback``."""
        _seq, current = self._head(model, alias)
        ev = self.set_alias(model, alias, version, expect=current, action="promote")
        if fallback and current is not None and current != version:
            self.set_alias(model, fallback, current, action="promote")
        return ev

    # -- retention -------------------------------------------------------------------------
    def protected_steps(self, job: str) -> dict[int, str]:
        """Steps of ``job`` that some registered version points at (kept forever)."""
        out: dict[int, list[str]] = {}
        for model in self.models():
            aliases = self.aliases(model)
            for mv in self.versions(model):
                if mv.job == job:
                    names = [a for a, v in aliases.items() if v == mv.version]
                    label = mv.ref + (f" ({', '.join(names)})" if names else "")
                    out.setdefault(mv.step, []).append(label)
        return {s: "registered as " + ", ".join(labels) for s, labels in out.items()}


__all__ = ["Registry", "ModelVersion", "AliasEvent", "check_name"]
