"""The checkpoint manager's value types: policy, per-checkpoint info, restore result, save handle."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..chunks import RepairEvent
from ..errors import ConfigError
from .format import manifest as mf
from .format.lineage import run_of
from .format.manifest import Manifest
from .objectives import ON_BUSY, ObjectivePolicy, Objectives
from .restore.select import PartialReport
from .save.lossy import LossyReport, check_mode


@dataclass(frozen=True)
class CheckpointPolicy:
    """When to save and how to behave when a save is still running.

    ``full_every``/``incremental_every``: steps that are multiples of ``full_every`` get a full
    checkpoint, other multiples of ``incremental_every`` an incremental (0 or None: never).
    ``on_busy``: a save while another is in flight ``"wait"``s for it or is ``"skip"``ped with a
    warning. ``keep_base_in_memory``: keep the last full checkpoint's host copy so
    incrementals XOR against memory instead of re-reading the store (costs one state-sized
    buffer). ``ready_copies``: after an incremental commits, write the raw bytes of its
    changed pieces to the local tier, so restoring the newest checkpoint reads them instead of
    decoding deltas (``checkpoint.format.ready``: costs one raw write of the changed pieces per
    incremental and that much local disk for the newest step only); False writes none and
    drops existing ones at the next save.

    ``optimizer_moments``: ``"lossless"`` (default, bit-exact), or opt-in lossy storage of
    float32 Adam/AdamW moments (``exp_avg``, ``exp_avg_sq``): ``"bf16"`` or
    ``"int8-blockwise"`` (8-bit log-map codes with per-block scales); parameters and
    everything else stay lossless (``checkpoint.save.lossy``; ``RestoreResult.lossy`` reports it).
    """

    full_every: int = 1000
    incremental_every: int | None = 100
    on_busy: str = "wait"
    keep_base_in_memory: bool = True
    ready_copies: bool = True
    optimizer_moments: str = "lossless"

    def __post_init__(self) -> None:
        if not isinstance(self.full_every, int) or self.full_every < 1:
            raise ConfigError(f"full_every must be a positive int, got {self.full_every!r}")
        if self.incremental_every is not None and (not isinstance(self.incremental_every, int) or self.incremental_every < 0):
            raise ConfigError(f"incremental_every must be None or a non-negative int, got {self.incremental_every!r}")
        if self.on_busy not in ON_BUSY:
            raise ConfigError(f"on_busy must be one of {ON_BUSY}, got {self.on_busy!r}")
        check_mode(self.optimizer_moments)

    @staticmethod
    def from_objectives(rpo: float | str, mtbf: float | str, rto: float | str | None = None,
                        max_overhead: float | None = None, **kw: Any) -> ObjectivePolicy:
        """A policy choosing its interval from an RPO, the MTBF and measured save costs
        (``checkpoint.objectives``); ``kw``: further ``Objectives`` fields (and ``clock``)."""
        clock = kw.pop("clock", None)
        obj = Objectives(rpo=rpo, mtbf=mtbf, rto=rto, max_overhead=max_overhead, **kw)
        return ObjectivePolicy(obj) if clock is None else ObjectivePolicy(obj, clock)

    def should_save(self, step: int) -> str | None:
        if step % self.full_every == 0:
            return "full"
        if self.incremental_every and step % self.incremental_every == 0:
            return "incremental"
        return None


@dataclass(frozen=True)
class CheckpointInfo:
    """One committed checkpoint as ``list()`` reports it.

    ``durable``: held by a tier that survives the loss of the hot one (a tiered store's
    durable or archive tier); always True on a single store, where committed is durable.
    """

    step: int
    kind: str
    base_step: int | None
    created: float
    metrics: dict[str, Any]
    config: dict[str, Any]
    logical_bytes: int
    stored_bytes: int
    written_bytes: int
    tensors: int
    status: str  # "unverified" | "ok" | "bad" | "unreadable"
    verified_at: float | None = None
    errors: tuple[str, ...] = ()
    code_version: str | None = None  # the user's code (provenance.code_version)
    durable: bool = True
    trainstore_version: str | None = None  # the library that wrote it (provenance.trainstore_version)
    run: str | None = None  # the run that wrote it (checkpoint.format.lineage; None before run ids)
    abandoned: bool = False  # left behind by a rollback or rerun: not in the lineage restore follows

    @classmethod
    def from_manifest(cls, m: Manifest, rec: mf.VerifyRecord | None = None, durable: bool = True,
                      abandoned: bool = False) -> CheckpointInfo:
        status = "unverified" if rec is None else ("ok" if rec.ok else "bad")
        return cls(m.step, m.kind, m.base_step, m.created, m.metrics, m.config, m.logical_bytes,
                   m.stored_bytes, m.written_bytes, len(m.tensors), status,
                   rec.checked_at if rec else None, rec.errors if rec else (),
                   m.metadata.get("code_version"), durable, m.metadata.get("trainstore_version"),
                   run_of(m), abandoned)


@dataclass
class RestoreResult:
    """What ``restore`` chose and why; ``skipped`` lists (step, reason) of every rejected one."""

    step: int
    kind: str
    reason: str
    skipped: list[tuple[int, str]] = field(default_factory=list)
    state: Any = None
    seconds: float = 0.0
    repairs: list[RepairEvent] = field(default_factory=list)  # bad chunk copies replaced on the way
    partial: PartialReport | None = None  # restore(only=/reset=): what was loaded and what left out
    lossy: LossyReport | None = None  # set when optimizer moments were stored lossy (not bit-exact)
    tier: str | None = None  # where its manifest was found: "hot (URL)", "durable (URL)", or the store's URL

    def __str__(self) -> str:
        s = f"restored step {self.step} ({self.kind})" + (f" from {self.tier}" if self.tier else "") + f": {self.reason}"
        if self.skipped:
            s += "; skipped " + ", ".join(f"{st} ({why})" for st, why in self.skipped)
        if self.partial is not None:
            s += f"; {self.partial}"
        if self.lossy is not None:
            s += f"; {self.lossy}"
        if self.repairs:
            s += f"; repaired {len(self.repairs)} bad chunk copies: " + ", ".join(str(e) for e in self.repairs[:3])
        return s


class CommitPoint:
    """The durable point of one save: ``future`` (its handle's) resolves when the manifest is
    committed, or fails when the save fails before that; the work after the commit (restore-
    ready copies, hooks) does not hold it."""

    def __init__(self) -> None:
        self.future: Future[CheckpointInfo] = Future()

    def resolve(self, info: CheckpointInfo) -> CheckpointInfo:
        """The save committed ``info`` (the first call counts)."""
        if not self.future.done():
            self.future.set_result(info)
        return info

    def fail(self, exc: BaseException) -> bool:
        """The save failed with ``exc``: True if it had committed already (the failure is in the
        work after the commit; the checkpoint stands), else the handle raises ``exc``."""
        if self.future.done():
            return True
        self.future.set_exception(exc)
        return False


class SaveHandle:
    """A save in flight: ``wait()`` blocks until durable (raising its error), ``done()`` polls."""

    def __init__(self, step: int, kind: str, future: Future | None = None, skipped: bool = False,
                 blocked_s: float = 0.0) -> None:
        self.step = step
        self.kind = kind
        self.skipped = skipped
        self.blocked_s = blocked_s  # time the caller was blocked (flatten + staging copy)
        self._future = future

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def wait(self, timeout: float | None = None) -> CheckpointInfo | None:
        if self._future is None:
            return None
        return self._future.result(timeout)

    @property
    def info(self) -> CheckpointInfo | None:
        return self._future.result() if self._future is not None and self._future.done() else None

    def __repr__(self) -> str:
        state = "skipped" if self.skipped else ("done" if self.done() else "pending")
        return f"SaveHandle(step={self.step}, kind={self.kind!r}, {state})"


__all__ = ["CommitPoint", "CheckpointPolicy", "CheckpointInfo", "RestoreResult", "SaveHandle", "ON_BUSY"]
