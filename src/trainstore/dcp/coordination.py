"""What the ranks of one DCP save/load agree on: which checkpoint, which base, who failed.

Checkpoint ids (``dcp.save(..., checkpoint_id=...)``) name a step of a job in a store:

* ``1200`` or ``"1200"``: step 1200 of the writer's/reader's job;
* ``"run-1@1200"``: step 1200 of job ``run-1`` in the writer's/reader's store;
* ``"trainstore:<store url>#run-1@1200"``: a store URL as well (opened with the
  ``store_options`` the writer/reader was given).

The coordinator decides the step's base full checkpoint (for incrementals) once, in
``prepare_global_plan``, and ships it to every rank inside the plans, so ranks never disagree.

Checkpoint collectives run on gloo process groups of their own (``DcpBackend``), never on the
training's (NCCL) group: a slow durable write cannot trip the training watchdog, and a
checkpoint collective never interleaves with a training one. Their timeout bounds how long a
rank waits for a peer that died or hangs: ``TRAINSTORE_CKPT_TIMEOUT_S`` seconds (default
``DEFAULT_TIMEOUT_S``, 30 min, gloo's own default). It must exceed the slowest rank's write of
one checkpoint (the ranks meet after writing). A rank's error inside a save reaches every
rank at once (DCP gathers it); the timeout only bounds a rank that stops answering, and the
errors it causes name it (``timeout_note``).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from datetime import timedelta

from ..checkpoint.format import manifest as mf
from ..errors import ConfigError, DistributedError, TrainstoreError
from ..naming import NAME_PATTERN
from ..store.base import Store

TIMEOUT_ENV = "TRAINSTORE_CKPT_TIMEOUT_S"
#: the manager event every rank gives its observers after a DCP save committed (the peer tier's cue)
RANK_COMMITTED = "rank_committed"
DEFAULT_TIMEOUT_S = 1800.0

_ID = re.compile(rf"^(?:trainstore:(?P<url>[^#]+)#)?(?:(?P<job>{NAME_PATTERN})@)?(?P<step>\d{{1,12}})$")


@dataclass(frozen=True)
class CheckpointTarget:
    """A parsed checkpoint id: any part may be None (= the writer's/reader's own)."""

    step: int | None
    job: str | None = None
    url: str | None = None


def parse_checkpoint_id(checkpoint_id: object) -> CheckpointTarget:
    """Parse a checkpoint id (see module docstring); ``ConfigError`` if it is none of the forms."""
    if checkpoint_id is None:
        return CheckpointTarget(None)
    if isinstance(checkpoint_id, int) and not isinstance(checkpoint_id, bool):
        return CheckpointTarget(mf.check_step(checkpoint_id))
    if isinstance(checkpoint_id, (str, os.PathLike)):
        m = _ID.match(os.fspath(checkpoint_id))  # type: ignore[arg-type]
        if m:
            return CheckpointTarget(int(m["step"]), m["job"], m["url"])
    raise ConfigError(f"checkpoint_id must be a step, 'job@step' or 'trainstore:<url>#job@step', got {checkpoint_id!r:.100}")


def full_checkpoint_id(checkpoint_id: object) -> CheckpointTarget:
    """Parse an id that names store, job and step (``"trainstore:<url>#<job>@<step>"``)."""
    try:
        target = parse_checkpoint_id(checkpoint_id)
    except ConfigError:
        target = CheckpointTarget(None)
    if target.url is None or target.job is None or target.step is None:
        raise ConfigError("a checkpoint id naming its store must be 'trainstore:<store url>#<job>@<step>', "
                          f"got {checkpoint_id!r:.100}")
    return target


def format_checkpoint_id(url: str, job: str, step: int) -> str:
    """``"trainstore:<url>#<job>@<step>"``: the id ``full_checkpoint_id`` parses back."""
    return f"trainstore:{url}#{mf.check_job(job)}@{mf.check_step(step)}"


def is_valid_checkpoint_id(checkpoint_id: object) -> bool:
    try:
        parse_checkpoint_id(checkpoint_id)
        return checkpoint_id is not None
    except ConfigError:
        return False


def is_dcp_manifest(m: mf.Manifest) -> bool:
    dcp = m.metadata.get("dcp")
    return isinstance(dcp, dict) and dcp.get("format", "").startswith("trainstore.dcp/")


class KnownManifests:
    """The manifests of one job this process committed or read while saving, by step, so the
    saves after them do not read and parse them again (an incremental's base: once per save on
    every rank; the coordinator's search for it: every manifest back to the last full). A
    committed manifest never changes while its step is listed (one writer per job: the job's
    lease; a rollback moves steps away, a rerun commits here again), and a step is only taken
    from here when the store still lists it. Holds the newest full one and the kinds of the
    steps after it."""

    def __init__(self) -> None:
        self._full: mf.Manifest | None = None
        self._kinds: dict[int, str] = {}

    def add(self, m: mf.Manifest) -> None:
        if m.kind == "full" and (self._full is None or m.step >= self._full.step):
            self._full = m
            self._kinds = {s: k for s, k in self._kinds.items() if s > m.step}
        self._kinds[m.step] = m.kind

    def committed(self, step: int, kind: str) -> None:
        """A save of this job committed ``step`` (seen by a rank that did not commit it): a full
        one replaces whatever manifest was held (a rerun may reuse a step number)."""
        if kind == "full":
            self._full = None
            self._kinds = {s: k for s, k in self._kinds.items() if s > step}
        self._kinds[step] = kind

    def kind(self, step: int) -> str | None:
        return self._kinds.get(step)

    def full(self, step: int) -> mf.Manifest | None:
        return self._full if self._full is not None and self._full.step == step else None

    def load_full(self, store: Store, job: str, step: int) -> mf.Manifest:
        """The manifest of ``step`` (a full one), from here or read once from ``store``."""
        m = self.full(step)
        if m is None:
            m = mf.load_manifest(store, job, step)
            self.add(m)
        return m


def find_base(store: Store, job: str, step: int, known: KnownManifests | None = None) -> mf.Manifest | None:
    """The newest readable FULL distributed checkpoint of ``job`` before ``step`` (or None).
    ``known``: steps this process committed or read (not read again; see ``KnownManifests``)."""
    for s in reversed(mf.list_steps(store, job)):
        if s >= step or (known is not None and known.kind(s) == "incremental"):
            continue
        m = known.full(s) if known is not None else None
        if m is None:
            try:
                m = mf.load_manifest(store, job, s)
            except TrainstoreError:
                continue
            if known is not None:
                known.add(m)
        if m.kind == "full" and is_dcp_manifest(m):
            return m
    return None


def group_timeout_s() -> float:
    """Seconds a checkpoint collective waits for the other ranks (``TRAINSTORE_CKPT_TIMEOUT_S``)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r}: expected a positive number of seconds (the checkpoint process "
                          f"group's timeout; unset for the default {DEFAULT_TIMEOUT_S:g} s)")
    return value


def group_timeout() -> timedelta:
    return timedelta(seconds=group_timeout_s())


def timeout_note() -> str:
    """Names the bound in an error caused by a rank that stopped answering."""
    return (f"the checkpoint process group waits {group_timeout_s():g} s for the other ranks "
            f"({TIMEOUT_ENV}; raise it if one rank's write of a checkpoint can take longer)")


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says a collective lost a peer (closed connection or timeout)."""
    dist_error = getattr(_dist(), "DistError", None)
    text = str(exc).lower()
    return (dist_error is not None and isinstance(exc, dist_error)) or any(
        w in text for w in ("connection closed", "connection reset", "timed out", "timeout"))


def rank_error(rank: int, step: int | None, job: str, what: str, exc: BaseException) -> DistributedError:
    """The error a failing rank raises: names the rank, the checkpoint and the cause."""
    return DistributedError(f"rank {rank}: {what} of checkpoint step {step} (job {job!r}) failed: "
                            f"{type(exc).__name__}: {exc}")


def describe_failure(exc: BaseException) -> str:
    """One line per failing rank of a ``CheckpointException`` (else the exception itself)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        parts = []
        for rank, pair in sorted(failures.items()):
            err = pair[0] if isinstance(pair, tuple) and pair else pair
            msg = str(err)
            parts.append(msg if msg.startswith(f"rank {rank}:") else f"rank {rank}: {type(err).__name__}: {msg}")
        return "; ".join(parts)
    msg = f"{type(exc).__name__}: {exc}"
    if is_peer_failure(exc):
        msg = f"a collective failed: another rank died or stopped responding ({timeout_note()}): {msg}"
    return msg


# -- progress markers: which ranks finished writing (names a rank that died) --------------------
def _marker(save_id: str, rank: int) -> str:
    return f"trainstore/dcp/{save_id}/written/{rank}"


def mark_written(save_id: str | None, rank: int) -> None:
    """Record in the process group's key-value store that ``rank`` finished ``write_data``."""
    store = _kv_store()
    if store is not None and save_id:
        try:
            store.set(_marker(save_id, rank), b"1")
        except Exception:  # noqa: BLE001 - best effort: only used to word an error message
            pass


def unfinished_ranks(save_id: str | None, world_size: int) -> list[int] | None:
    """Ranks that did not mark ``write_data`` as finished (None: unknown, e.g. no store)."""
    store = _kv_store()
    if store is None or not save_id:
        return None
    try:
        return [r for r in range(world_size) if not store.check([_marker(save_id, r)])]
    except Exception:  # noqa: BLE001 - the store lives on rank 0; it may be gone too
        return None


def _kv_store():  # noqa: ANN202
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # noqa: BLE001
        return None


def _dist():  # noqa: ANN202 - torch.distributed, imported lazily
    import torch.distributed as dist

    return dist


__all__ = ["CheckpointTarget", "parse_checkpoint_id", "full_checkpoint_id", "format_checkpoint_id",
           "is_valid_checkpoint_id", "is_dcp_manifest", "find_base", "KnownManifests",
           "rank_error", "describe_failure", "mark_written", "unfinished_ranks", "TIMEOUT_ENV", "DEFAULT_TIMEOUT_S",
           "RANK_COMMITTED", "group_timeout_s", "group_timeout", "timeout_note", "is_peer_failure"]
