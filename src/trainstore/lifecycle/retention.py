"""Retention: which checkpoints of a job to keep, and why; delete the rest.

What to keep is a composable rule (``retention_rules``: ``LatestN``, ``Within``,
``FullWithin``, ``EveryNSteps``, ``BestN``, ``Registered``, ``AnyOf``, ``AllOf``); a
checkpoint is kept if the rule keeps it, everything else goes. Two safety rules always
apply on top: the newest full checkpoint (base of the next incrementals) and the base of
every kept incremental (never an orphaned delta).

``RetentionPolicy`` is a shorthand that builds an ``AnyOf`` from keyword fields
(``keep_last=3, keep_every=100``); ``retention_rules.preset()`` is the rule set of the
design documents (every checkpoint of the last week, full ones of the last month,
registered ones forever).

Steps a rollback or rerun left behind (``checkpoint.format.lineage``: ``abandoned/``) are decided
too: one is kept while the rule would keep it in place of the lineage's step of the same
number (``LatestN(3)`` keeps it until the new lineage has three newer steps; ``Within("7d")``
for a week), never counted against the lineage's own checkpoints.

``plan_retention`` decides without touching the store (a dry run: each decision carries its
reasons); ``apply_retention`` deletes (manifest first, so a checkpoint disappears atomically),
removes the emptied step folders of a local store, and reclaims in the same pass the chunks
only the deleted checkpoints named (``gc.reclaim_released``: the gc protocol, so a chunk
another job, a reader's or a copy's lease still needs stays); the rest is left to ``gc``. A rule that would delete every checkpoint of a job is refused
with ``ConfigError`` unless ``allow_delete_all=True``. ``now`` is injectable, so tests
control the clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ..checkpoint.format import manifest as mf
from ..checkpoint.format.layout import abandoned_prefix, parse_manifest_key
from ..checkpoint.format.lineage import load_abandoned, run_of
from ..errors import (
    ConfigError,
    ManifestError,
    NotFoundError,
    StoreUnavailableError,
    TrainstoreError,
)
from ..store.base import Store
from .deletion import delete_abandoned, delete_checkpoint
from .gc import reclaim_released
from .registry import Registry
from .retention_rules import (
    AllOf,
    AnyOf,
    BestN,
    EveryNSteps,
    FullWithin,
    KeepBest,
    LatestN,
    Registered,
    RetentionView,
    Rule,
    Within,
    format_duration,
    parse_duration,
    preset,
)

log = logging.getLogger("trainstore.lifecycle.retention")


@dataclass(frozen=True)
class RetentionPolicy:
    """Shorthand for an ``AnyOf`` of the common rules, from keyword fields (durations:
    seconds or ``"7d"``). ``rule`` is the composed rule the planner runs."""

    keep_last: int | None = None
    keep_within: float | str | None = None
    keep_full_within: float | str | None = None
    keep_every: int | None = None
    keep_best: tuple[BestN, ...] = ()
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
        if isinstance(best, BestN):
            best = (best,)
        if not isinstance(best, (tuple, list)) or not all(isinstance(b, BestN) for b in best):
            raise ConfigError("keep_best must be a tuple of BestN rules")
        object.__setattr__(self, "keep_best", tuple(best))

    @classmethod
    def preset(cls) -> RetentionPolicy:
        """All checkpoints of the last week, full ones of the last month, registered forever."""
        return cls(keep_within="7d", keep_full_within="30d", keep_registered=True)

    @property
    def rule(self) -> AnyOf:
        rules: list[Rule] = []
        if self.keep_last:
            rules.append(LatestN(self.keep_last))
        if self.keep_within is not None:
            rules.append(Within(self.keep_within))
        if self.keep_full_within is not None:
            rules.append(FullWithin(self.keep_full_within))
        if self.keep_every:
            rules.append(EveryNSteps(self.keep_every))
        rules.extend(self.keep_best)
        if self.keep_registered:
            rules.append(Registered())
        return AnyOf(*rules)

    def describe(self) -> str:
        return describe(self.rule)


def describe(rule: Rule | RetentionPolicy) -> str:
    """``"keep last 3, every 100th step, registered forever"``."""
    return "keep " + _rule_of(rule).describe()


def _rule_of(policy: Rule | RetentionPolicy) -> Rule:
    if isinstance(policy, RetentionPolicy):
        return policy.rule
    if isinstance(policy, Rule):
        return policy
    raise ConfigError(f"retention needs a rule (LatestN, AnyOf, ...) or a RetentionPolicy, got {policy!r}")


@dataclass(frozen=True)
class Decision:
    """One checkpoint's fate: ``keep`` and the reasons (kept: rules that keep it; deleted: why not)."""

    step: int
    kind: str
    created: float
    keep: bool
    reasons: tuple[str, ...]
    stored_bytes: int = 0
    run: str | None = None
    abandoned_key: str | None = None  # set for a step a rollback left behind (its manifest's key)
    chunks: tuple[tuple[str, int], ...] = field(default=(), repr=False, compare=False)  # (key, stored bytes)

    def to_json(self) -> dict:
        return {"step": self.step, "kind": self.kind, "created": self.created, "keep": self.keep,
                "reasons": list(self.reasons), "stored_bytes": self.stored_bytes, "run": self.run,
                "abandoned": self.abandoned_key is not None}


@dataclass
class RetentionPlan:
    """Decisions for every checkpoint of a job, oldest first; ``applied`` once deletions ran."""

    job: str
    policy: Rule
    now: float
    decisions: list[Decision] = field(default_factory=list)
    applied: bool = False
    reclaimed_bytes: int = 0  # chunk bytes the deletions released and this pass deleted

    @property
    def kept(self) -> list[Decision]:
        return [d for d in self.decisions if d.keep]

    @property
    def deleted(self) -> list[Decision]:
        return [d for d in self.decisions if not d.keep]

    def to_json(self) -> dict:
        return {"job": self.job, "policy": describe(self.policy), "now": self.now, "applied": self.applied,
                "reclaimed_bytes": self.reclaimed_bytes,
                "kept": len(self.kept), "deleted": len(self.deleted),
                "decisions": [d.to_json() for d in self.decisions]}


def _registered_steps(store: Store, job: str) -> dict[int, str]:
    return Registry(store).protected_steps(job)


#: (step, run: None in the lineage, etag, size) -> Manifest of one job: committed manifests
#: never change in place
ManifestCache = dict


def _cached(step: int, run: str | None, meta: Any, load: Callable[[], mf.Manifest], cache: ManifestCache | None,
            fresh: ManifestCache) -> mf.Manifest:
    """The manifest listed as ``meta``: from ``cache`` (read by an earlier run), else ``load()``;
    kept in ``fresh``, the cache of the next run."""
    ident = (step, run, meta.etag, meta.size)
    m = cache.get(ident) if cache is not None else None
    fresh[ident] = m = load() if m is None else m
    return m


def _load_manifests(store: Store, job: str, cache: ManifestCache | None,
                    fresh: ManifestCache) -> tuple[list[mf.Manifest], list[int]]:
    """Every readable manifest of ``job`` (one listing; reads only those not in ``cache``)."""
    metas = {p[1]: meta for meta in store.list(mf.checkpoints_prefix(job))
             if (p := parse_manifest_key(meta.key)) is not None and p[2] is None}
    manifests, unreadable = [], []
    for step in sorted(metas):
        try:
            manifests.append(_cached(step, None, metas[step], partial(mf.load_manifest, store, job, step), cache, fresh))
        except NotFoundError:
            continue
        except StoreUnavailableError:
            raise
        except ManifestError:
            unreadable.append(step)
    return manifests, unreadable


def plan_retention(store: Store, job: str, policy: Rule | RetentionPolicy, *, now: float | None = None,
                   protected: dict[int, str] | None = None, cache: ManifestCache | None = None,
                   allow_delete_all: bool | None = None) -> RetentionPlan:
    """Decide what ``policy`` (a rule, or a ``RetentionPolicy`` shorthand) keeps of ``job``
    (nothing is deleted). ``protected`` overrides the registry lookup of ``Registered``.
    ``ConfigError`` if it would delete every checkpoint, unless ``allow_delete_all`` (or the
    shorthand's field of that name). ``cache`` (a dict kept by the caller) avoids re-reading
    manifests on every run."""
    now = time.time() if now is None else float(now)
    rule = _rule_of(policy)
    if allow_delete_all is None:
        allow_delete_all = isinstance(policy, RetentionPolicy) and policy.allow_delete_all
    fresh: ManifestCache = {}
    manifests, unreadable = _load_manifests(store, job, cache, fresh)
    lookup = (lambda: protected) if protected is not None else (lambda: _registered_steps(store, job))
    view = RetentionView(tuple(manifests), now, lookup)
    kept = rule.keep(view)
    reasons: dict[int, list[str]] = {m.step: list(kept.get(m.step, ())) for m in manifests}
    fulls = [m.step for m in manifests if m.kind == "full"]
    if fulls and any(reasons.values()):
        reasons[fulls[-1]].append("newest full checkpoint (base of the next incrementals)")
    for s in _hot_only(store, job, reasons):  # its only copy: a durable outage never costs a checkpoint
        reasons[s].append("not durable yet (only the hot tier holds it)")
    for m in manifests:  # bases of kept incrementals (deltas always refer to a full checkpoint)
        if m.kind == "incremental" and reasons[m.step] and m.base_step in reasons:
            reasons[m.base_step].append(f"base of kept incremental step {m.step}")  # type: ignore[index]
    plan = RetentionPlan(job, rule, now)
    for m in manifests:
        why = reasons[m.step]
        keep = bool(why)
        if not keep:
            why = [f"matches no keep rule: {m.kind}, age {format_duration(view.age(m))}; {rule.miss(m, view)}"]
        plan.decisions.append(Decision(m.step, m.kind, m.created, keep, tuple(dict.fromkeys(why)), m.stored_bytes,
                                       run_of(m), None, _chunks(m)))
    plan.decisions.extend(_abandoned_decisions(store, job, rule, view, cache, fresh))
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    for s in unreadable:
        log.warning("retention: step %d of job %r has an unreadable manifest; left for inspection", s, job)
    if manifests and not any(d.keep for d in plan.decisions if d.abandoned_key is None) and not allow_delete_all:
        raise ConfigError(
            f"retention rules ({describe(rule)}) would delete all {len(manifests)} checkpoints of job "
            f"{job!r} in {store.url}; add a rule such as LatestN(1), or pass allow_delete_all=True"
        )
    return plan


def _hot_only(store: Store, job: str, steps: Any) -> set[int]:
    """Steps of ``job`` that a tiered store's first tier alone holds (write-back: not copied yet)."""
    tiers = store.tiers()
    if len(tiers) < 2:
        return set()
    beyond = {s for t in tiers[1:] for s in mf.list_steps(t, job)}
    return {s for s in mf.list_steps(tiers[0], job) if s in steps and s not in beyond}


def _abandoned_decisions(store: Store, job: str, rule: Rule, view: RetentionView, cache: ManifestCache | None,
                         fresh: ManifestCache) -> list[Decision]:
    """Each abandoned checkpoint is judged in place of the lineage's step of its number (its
    manifest read once, then from ``cache``, like the lineage's)."""
    out = []
    listed = sorted(((p[1], p[2], meta) for meta in store.list(abandoned_prefix(job))
                     if (p := parse_manifest_key(meta.key)) is not None and p[2] is not None), key=lambda t: t[:2])
    for step, run, meta in listed:
        key = meta.key
        try:
            m = _cached(step, run, meta, partial(load_abandoned, store, key), cache, fresh)
        except NotFoundError:
            continue
        except ManifestError as exc:
            log.warning("retention: abandoned checkpoint %s is unreadable; left for inspection: %s", key, exc)
            continue
        alone = replace(view, manifests=tuple(sorted((*(x for x in view.manifests if x.step != step), m),
                                                     key=lambda x: x.step)))
        why = rule.keep(alone).get(step)
        prefix = f"abandoned by a rollback (run {run}): "
        reasons = [prefix + r for r in why] if why else \
            [prefix + f"matches no keep rule in place of step {step}: {m.kind}, age "
             f"{format_duration(alone.age(m))}; {rule.miss(m, alone)}"]
        out.append(Decision(step, m.kind, m.created, bool(why), tuple(dict.fromkeys(reasons)), m.stored_bytes, run, key,
                            _chunks(m)))
    return out


def _chunks(m: mf.Manifest) -> tuple[tuple[str, int], ...]:
    return tuple((r.key("chunks"), r.stored) for r in mf.manifest_refs(m))


def apply_retention(store: Store, job: str, policy: Rule | RetentionPolicy, *, dry_run: bool = False,
                    now: float | None = None, protected: dict[int, str] | None = None,
                    on_delete: Callable[[Decision], Any] | None = None,
                    cache: ManifestCache | None = None, allow_delete_all: bool | None = None,
                    reclaim: bool = True, ref_caches: dict | None = None) -> RetentionPlan:
    """Plan, then (unless ``dry_run``) delete what the plan drops and (``reclaim``) the chunks
    only those checkpoints named (see module docstring; ``ref_caches``: the reclaim sweep's
    ``gc.RefCache`` per tier, kept by the caller). Returns the plan."""
    plan = plan_retention(store, job, policy, now=now, protected=protected, cache=cache,
                          allow_delete_all=allow_delete_all)
    if dry_run:
        return plan
    deleted = []
    for d in plan.deleted:
        try:
            if d.abandoned_key is not None:
                delete_abandoned(store, d.abandoned_key)
            else:
                delete_checkpoint(store, job, d.step)
        except StoreUnavailableError:
            raise
        except TrainstoreError as exc:
            log.warning("retention: could not delete step %d of job %r: %s", d.step, job, exc)
            continue
        log.info("retention: deleted %sstep %d of job %r (%s)", "abandoned " if d.abandoned_key else "", d.step, job,
                 d.reasons[0])
        deleted.append(d)
        if on_delete is not None:
            on_delete(d)
    plan.applied = True
    if reclaim and deleted:
        plan.reclaimed_bytes = _reclaim(store, job, plan, deleted, ref_caches)
    return plan


def _reclaim(store: Store, job: str, plan: RetentionPlan, deleted: list[Decision], caches: dict | None) -> int:
    """Sweep at once the chunks the deleted checkpoints named and no kept one of ``job`` does;
    other jobs and live leases are checked by the sweep. A failure leaves them to ``gc``."""
    kept = {k for d in plan.kept for k, _n in d.chunks}
    released = {k: n for d in deleted for k, n in d.chunks if k not in kept}
    if not released:
        return 0
    try:
        report = reclaim_released(store, released, caches=caches)
    except TrainstoreError as exc:
        log.warning("retention: could not reclaim the %d chunks released in job %r now (left to gc): %s",
                    len(released), job, exc)
        return 0
    log.info("retention: reclaimed %d chunks (%.1f MB) of job %r; %d still referenced elsewhere", report.deleted,
             report.bytes_reclaimed / 1e6, job, len(released) - report.deleted)
    return report.bytes_reclaimed


def retention_hook(policy: Rule | RetentionPolicy) -> Callable[[Any, Any], None]:
    """A ``CheckpointManager`` hook applying ``policy`` after each committed save."""

    cache: ManifestCache = {}  # manifests read by earlier runs (one listing per save, not one read per checkpoint)
    ref_caches: dict = {}  # the same for the reclaim sweep, per tier

    def hook(info: Any, manager: Any) -> None:
        try:
            apply_retention(manager.store, manager.job, policy, cache=cache, ref_caches=ref_caches)
        except StoreUnavailableError as exc:  # a tier is down: nothing is deleted, training goes on
            log.warning("retention of job %r skipped after step %d (a tier is unreachable; it runs again after "
                        "the next save): %s", manager.job, info.step, exc)

    hook.__name__ = f"retention({describe(policy)})"
    return hook


__all__ = ["RetentionPolicy", "Decision", "RetentionPlan", "plan_retention", "apply_retention",
           "delete_checkpoint", "retention_hook", "describe", "Rule", "LatestN", "Within", "FullWithin",
           "EveryNSteps", "BestN", "KeepBest", "Registered", "AnyOf", "AllOf", "preset", "parse_duration",
           "format_duration"]
