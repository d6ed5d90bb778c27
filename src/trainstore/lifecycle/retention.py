"""Retention: which checkpoints of a job to keep, and why; delete the rest.

A ``RetentionPolicy`` is a frozen set of *keep* rules. A checkpoint is kept if any rule keeps
it; everything else goes. Rules (all optional, combined with OR):

* ``keep_last=N``: the N newest steps;
* ``keep_within="7d"``: every checkpoint created less than this long ago;
* ``keep_full_within="30d"``: full checkpoints created less than this long ago;
* ``keep_every=K``: steps that are multiples of K (milestones);
* ``keep_best=(KeepBest("val_loss", 3, "min"), ...)``: the best n by a recorded metric;
* registered in the model registry (or aliased, which implies registered): always kept;
* the newest full checkpoint: always kept (it is the base of the next incrementals);
* the base of every kept incremental: always kept (never an orphaned delta).

``RetentionPolicy.preset()`` is the rule set of the design documents: every checkpoint of
the last week, full ones of the last month, older ones deleted, registered ones forever.

``plan_retention`` decides without touching the store (a dry run: each decision carries its
reasons); ``apply_retention`` deletes (manifest first, so a checkpoint disappears atomically;
its chunks are left to ``gc``). A rule set that would delete every checkpoint of a job is
refused with ``ConfigError`` unless ``allow_delete_all=True``. ``now`` is injectable, so tests
control the clock.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..checkpoint import manifest as mf
from ..errors import (
    ConfigError,
    ManifestError,
    NotFoundError,
    StoreUnavailableError,
    TrainstoreError,
)
from ..store.base import Store

log = logging.getLogger("trainstore.lifecycle.retention")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration(value: float | int | str | None, what: str = "duration") -> float | None:
    """Seconds from a number or a string like ``"90s"``, ``"12h"``, ``"7d"``, ``"2w"``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be seconds or a string like '7d', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    else:
        raise ConfigError(f"{what} must be seconds or a string like '90s', '12h', '7d', '2w', got {value!r}")
    if not seconds >= 0 or seconds == float("inf"):
        raise ConfigError(f"{what} must be a finite non-negative duration, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds / n:.3g}{unit}"
    return f"{seconds:.3g}s"


@dataclass(frozen=True)
class KeepBest:
    """Keep the ``n`` checkpoints with the best ``metric`` (``mode`` "min" or "max")."""

    metric: str
    n: int = 1
    mode: str = "min"

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise ConfigError(f"KeepBest.metric must be a metric name, got {self.metric!r}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ConfigError(f"KeepBest.n must be a positive int, got {self.n!r}")
        if self.mode not in ("min", "max"):
            raise ConfigError(f"KeepBest.mode must be 'min' or 'max', got {self.mode!r}")

    @classmethod
    def parse(cls, text: str) -> KeepBest:
        """``"val_loss:3:min"`` (n and mode optional: ``"acc::max"``, ``"val_loss"``)."""
        parts = text.split(":")
        if not 1 <= len(parts) <= 3 or not parts[0]:
            raise ConfigError(f"keep-best must look like METRIC[:N[:min|max]], got {text!r}")
        try:
            n = int(parts[1]) if len(parts) > 1 and parts[1] else 1
        except ValueError:
            raise ConfigError(f"keep-best count must be an int, got {parts[1]!r} in {text!r}") from None
        return cls(parts[0], n, parts[2] if len(parts) > 2 and parts[2] else "min")


@dataclass(frozen=True)
class RetentionPolicy:
    """Declarative keep rules (see module docstring). Durations: seconds or ``"7d"``."""

    keep_last: int | None = None
    keep_within: float | str | None = None
    keep_full_within: float | str | None = None
    keep_every: int | None = None
    keep_best: tuple[KeepBest, ...] = ()
    keep_registered: bool = True
    allow_delete_all: bool = False

    def __post_init__(self) -> None:
        for name in ("keep_last", "keep_every"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError(f"{name} must be None or a positive int, got {v!r}")
        for name in ("keep_within", "keep_full_within"):
            object.__setattr__(self, name, parse_duration(getattr(self, name), name))
        best = self.keep_best
        if isinstance(best, KeepBest):
            best = (best,)
        if not isinstance(best, (tuple, list)) or not all(isinstance(b, KeepBest) for b in best):
            raise ConfigError("keep_best must be a tuple of KeepBest rules")
        object.__setattr__(self, "keep_best", tuple(best))

    @classmethod
    def preset(cls) -> RetentionPolicy:
        """All checkpoints of the last week, full ones of the last month, registered forever."""
        return cls(keep_within="7d", keep_full_within="30d", keep_registered=True)

    def describe(self) -> str:
        parts = []
        if self.keep_last:
            parts.append(f"last {self.keep_last}")
        if self.keep_within is not None:
            parts.append(f"all within {format_duration(self.keep_within)}")  # type: ignore[arg-type]
        if self.keep_full_within is not None:
            parts.append(f"full within {format_duration(self.keep_full_within)}")  # type: ignore[arg-type]
        if self.keep_every:
            parts.append(f"every {self.keep_every}th step")
        parts += [f"best {b.n} by {b.metric} ({b.mode})" for b in self.keep_best]
        if self.keep_registered:
            parts.append("registered forever")
        return "keep " + (", ".join(parts) if parts else "nothing")


@dataclass(frozen=True)
class Decision:
    """One checkpoint's fate: ``keep`` and the reasons (kept: rules that keep it; deleted: why not)."""

    step: int
    kind: str
    created: float
    keep: bool
    reasons: tuple[str, ...]
    stored_bytes: int = 0

    def to_json(self) -> dict:
        return {"step": self.step, "kind": self.kind, "created": self.created, "keep": self.keep,
                "reasons": list(self.reasons), "stored_bytes": self.stored_bytes}


@dataclass
class RetentionPlan:
    """Decisions for every checkpoint of a job, oldest first; ``applied`` once deletions ran."""

    job: str
    policy: RetentionPolicy
    now: float
    decisions: list[Decision] = field(default_factory=list)
    applied: bool = False

    @property
    def kept(self) -> list[Decision]:
        return [d for d in self.decisions if d.keep]

    @property
    def deleted(self) -> list[Decision]:
        return [d for d in self.decisions if not d.keep]

    def to_json(self) -> dict:
        return {"job": self.job, "policy": self.policy.describe(), "now": self.now, "applied": self.applied,
                "kept": len(self.kept), "deleted": len(self.deleted),
                "decisions": [d.to_json() for d in self.decisions]}


def _registered_steps(store: Store, job: str) -> dict[int, str]:
    from .registry import Registry

    return Registry(store).protected_steps(job)


ManifestCache = dict  # (step, etag, size) -> Manifest: committed manifests never change in place


def _load_manifests(store: Store, job: str, cache: ManifestCache | None) -> tuple[list[mf.Manifest], list[int]]:
    """Every readable manifest of ``job`` (one listing; reads only those not in ``cache``)."""
    prefix = mf.checkpoints_prefix(job)
    metas = {}
    for meta in store.list(prefix):
        parts = meta.key[len(prefix):].split("/")
        if len(parts) == 2 and parts[1] == mf.MANIFEST_NAME and len(parts[0]) == mf.STEP_DIGITS and parts[0].isdigit():
            metas[int(parts[0])] = meta
    manifests, unreadable = [], []
    fresh = {}
    for step in sorted(metas):
        ident = (step, metas[step].etag, metas[step].size)
        m = cache.get(ident) if cache is not None else None
        if m is None:
            try:
                m = mf.load_manifest(store, job, step)
            except NotFoundError:
                continue
            except StoreUnavailableError:
                raise
            except ManifestError:
                unreadable.append(step)
                continue
        fresh[ident] = m
        manifests.append(m)
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    return manifests, unreadable


def plan_retention(store: Store, job: str, policy: RetentionPolicy, *, now: float | None = None,
                   protected: dict[int, str] | None = None, cache: ManifestCache | None = None) -> RetentionPlan:
    """Decide what ``policy`` keeps of ``job`` (nothing is deleted). ``ConfigError`` if it
    would delete every checkpoint (unless ``policy.allow_delete_all``). ``cache`` (a dict kept
    by the caller) avoids re-reading manifests on every run."""
    now = time.time() if now is None else float(now)
    manifests, unreadable = _load_manifests(store, job, cache)
    if protected is None:
        protected = _registered_steps(store, job) if policy.keep_registered else {}
    reasons: dict[int, list[str]] = {m.step: [] for m in manifests}
    by_step = {m.step: m for m in manifests}
    steps = sorted(by_step)
    if policy.keep_last:
        for s in steps[-policy.keep_last:]:
            reasons[s].append(f"among the last {policy.keep_last}")
    for m in manifests:
        age = max(0.0, now - m.created)
        if policy.keep_within is not None and age <= policy.keep_within:
            reasons[m.step].append(f"age {format_duration(age)} within {format_duration(policy.keep_within)}")
        if policy.keep_full_within is not None and m.kind == "full" and age <= policy.keep_full_within:
            reasons[m.step].append(f"full, age {format_duration(age)} within {format_duration(policy.keep_full_within)}")
        if policy.keep_every and m.step % policy.keep_every == 0:
            reasons[m.step].append(f"step is a multiple of {policy.keep_every}")
        if m.step in protected:
            reasons[m.step].append(protected[m.step])
    for rule in policy.keep_best:
        scored = [(v, m.step) for m in manifests
                  if isinstance(v := m.metrics.get(rule.metric), (int, float)) and not isinstance(v, bool)]
        scored.sort(key=lambda p: (p[0] if rule.mode == "min" else -p[0], -p[1]))
        for rank, (v, s) in enumerate(scored[:rule.n], 1):
            reasons[s].append(f"best #{rank} by {rule.metric}={v} ({rule.mode})")
    fulls = [m.step for m in manifests if m.kind == "full"]
    if fulls and any(reasons.values()):
        reasons[fulls[-1]].append("newest full checkpoint (base of the next incrementals)")
    for m in manifests:  # bases of kept incrementals (deltas always refer to a full checkpoint)
        if m.kind == "incremental" and reasons[m.step] and m.base_step in reasons:
            reasons[m.base_step].append(f"base of kept incremental step {m.step}")  # type: ignore[index]
    plan = RetentionPlan(job, policy, now)
    for s in steps:
        m = by_step[s]
        why = reasons[s]
        if not why:
            why = [_why_not(m, policy, now, steps, protected)]
        plan.decisions.append(Decision(s, m.kind, m.created, bool(reasons[s]), tuple(dict.fromkeys(why)),
                                       m.stored_bytes))
    for s in unreadable:
        log.warning("retention: step %d of job %r has an unreadable manifest; left for inspection", s, job)
    if manifests and not plan.kept and not policy.allow_delete_all:
        raise ConfigError(
            f"retention rules ({policy.describe()}) would delete all {len(manifests)} checkpoints of job "
            f"{job!r} in {store.url}; add a rule such as keep_last=1, or pass allow_delete_all=True"
        )
    return plan


def _why_not(m: mf.Manifest, policy: RetentionPolicy, now: float, steps: list[int],
             protected: dict[int, str]) -> str:
    age = max(0.0, now - m.created)
    parts = [f"{m.kind}, age {format_duration(age)}"]
    if policy.keep_within is not None:
        parts.append(f"older than {format_duration(policy.keep_within)}")
    if policy.keep_full_within is not None and m.kind == "full":
        parts.append(f"full but older than {format_duration(policy.keep_full_within)}")
    elif policy.keep_full_within is not None:
        parts.append("not full")
    if policy.keep_last:
        parts.append(f"not among the last {policy.keep_last}")
    if policy.keep_every:
        parts.append(f"not a multiple of {policy.keep_every}")
    parts += [f"not best {b.n} by {b.metric}" for b in policy.keep_best]
    if policy.keep_registered:
        parts.append("not registered")
    return "matches no keep rule: " + "; ".join(parts)


def delete_checkpoint(store: Store, job: str, step: int) -> int:
    """Remove one checkpoint: its manifest first (it vanishes atomically), then its other
    files (verify records, tier marks). Chunks stay for ``gc``. Returns objects deleted."""
    store.delete(mf.manifest_key(job, step))
    n = 1
    for meta in list(store.list(mf.step_prefix(job, step))):
        store.delete(meta.key)
        n += 1
    return n


def apply_retention(store: Store, job: str, policy: RetentionPolicy, *, dry_run: bool = False,
                    now: float | None = None, protected: dict[int, str] | None = None,
                    on_delete: Callable[[Decision], Any] | None = None,
                    cache: ManifestCache | None = None) -> RetentionPlan:
    """Plan, then (unless ``dry_run``) delete what the plan drops. Returns the plan."""
    plan = plan_retention(store, job, policy, now=now, protected=protected, cache=cache)
    if dry_run:
        return plan
    for d in plan.deleted:
        try:
            delete_checkpoint(store, job, d.step)
        except StoreUnavailableError:
            raise
        except TrainstoreError as exc:
            log.warning("retention: could not delete step %d of job %r: %s", d.step, job, exc)
            continue
        log.info("retention: deleted step %d of job %r (%s)", d.step, job, d.reasons[0])
        if on_delete is not None:
            on_delete(d)
    plan.applied = True
    return plan


def retention_hook(policy: RetentionPolicy) -> Callable[[Any, Any], None]:
    """A ``CheckpointManager`` hook applying ``policy`` after each committed save."""

    cache: ManifestCache = {}  # manifests read by earlier runs (one listing per save, not one read per checkpoint)

    def hook(info: Any, manager: Any) -> None:
        apply_retention(manager.store, manager.job, policy, cache=cache)

    hook.__name__ = f"retention({policy.describe()})"
    return hook


__all__ = ["KeepBest", "RetentionPolicy", "Decision", "RetentionPlan", "plan_retention", "apply_retention",
           "delete_checkpoint", "retention_hook", "parse_duration", "format_duration"]
