"""Checkpoint layout in a store: job and step names, the keys under them, and listing.

Layout (one store may hold many jobs; chunks are shared so identical bytes dedup across
every checkpoint of every job in the store)::

    jobs/<job>/checkpoints/<step:012d>/manifest.json  the checkpoint; written LAST, put_if_absent
    jobs/<job>/checkpoints/<step:012d>/verify.json    latest verification record (optional, put)
    jobs/<job>/abandoned/<step:012d>/<run>/manifest.json  a step a rollback or rerun left behind
    chunks/<h[0:2]>/<h>.<codec>                       content-addressed chunks (trainstore.chunks)

A checkpoint exists only once its ``manifest.json`` is committed, after every chunk it names
is durable; a crashed save leaves at most unreferenced chunks (garbage for GC) and is never
listed. ``verify.json`` is advisory: it records the outcome of the last ``verify`` so that
``restore()`` does not retry a checkpoint known to be bad (unless asked).

``checkpoints/`` holds the job's current lineage only; a rollback (a save after restoring a
step that is not the newest) or a fresh run reaching an existing step moves the steps it
leaves behind to ``abandoned/`` (``checkpoint.format.lineage``), where they stay, still complete
(gc keeps their chunks), until retention removes them. ``<run>`` is the run id recorded in
the manifest (``legacy-<hash>`` for manifests written before run ids).
"""

from __future__ import annotations

from ...errors import AlreadyExistsError, ConfigError
from ...naming import check_name
from ...store.base import Store

STEP_DIGITS = 12
MANIFEST_NAME = "manifest.json"
VERIFY_NAME = "verify.json"
ABANDONED = "abandoned"


def check_job(job: str) -> str:
    """Return ``job`` if it is a valid job name, else raise ``ConfigError``."""
    return check_name(job, "job name")


def step_exists(job: str, step: int, url: str) -> AlreadyExistsError:
    """The error for saving a step that this run saved already, with the ways to continue."""
    return AlreadyExistsError(
        f"checkpoint step {step} of job {job!r} already exists in {url} (saved earlier in this run). "
        "To continue: save a later step; to redo from an earlier step, restore it first (the steps after "
        "it are kept under abandoned/); or save under a new job name")


def check_step(step: object) -> int:
    """Steps are non-negative ints below 10**12 (the zero-padded width)."""
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 10**STEP_DIGITS:
        raise ConfigError(f"step must be an int in [0, 10**{STEP_DIGITS}), got {step!r}")
    return step


def job_prefix(job: str) -> str:
    return f"jobs/{check_job(job)}/"


def checkpoints_prefix(job: str) -> str:
    return f"jobs/{check_job(job)}/checkpoints/"


def step_prefix(job: str, step: int) -> str:
    return f"{checkpoints_prefix(job)}{check_step(step):0{STEP_DIGITS}d}/"


def manifest_key(job: str, step: int) -> str:
    return step_prefix(job, step) + MANIFEST_NAME


def verify_key(job: str, step: int) -> str:
    return step_prefix(job, step) + VERIFY_NAME


def abandoned_prefix(job: str) -> str:
    return f"jobs/{check_job(job)}/{ABANDONED}/"


def abandoned_key(job: str, step: int, run: str) -> str:
    """Where a step of run ``run`` goes when the lineage leaves it behind."""
    return f"{abandoned_prefix(job)}{check_step(step):0{STEP_DIGITS}d}/{check_name(run, 'run id')}/{MANIFEST_NAME}"


# -- listing ----------------------------------------------------------------------------
def parse_manifest_key(key: str) -> tuple[str, int, str | None] | None:
    """(job, step, run) of a manifest's key: run None for the lineage's
    (``checkpoints/<step>/manifest.json``), the run for an abandoned one; None for other keys."""
    parts = key.split("/")
    if parts[0] != "jobs" or parts[-1] != MANIFEST_NAME or len(parts) not in (5, 6):
        return None
    if not (len(parts[3]) == STEP_DIGITS and parts[3].isdigit()):
        return None
    if len(parts) == 5 and parts[2] == "checkpoints":
        return parts[1], int(parts[3]), None
    if len(parts) == 6 and parts[2] == ABANDONED:
        return parts[1], int(parts[3]), parts[4]
    return None


def list_steps(store: Store, job: str) -> list[int]:
    """Committed steps of ``job``, ascending (a step counts once its manifest.json exists)."""
    return sorted(p[1] for meta in store.list(checkpoints_prefix(job))
                  if (p := parse_manifest_key(meta.key)) is not None and p[2] is None)


def list_abandoned(store: Store, job: str) -> list[tuple[int, str, str]]:
    """(step, run, key) of every abandoned checkpoint of ``job``, by step then run."""
    return sorted((p[1], p[2], meta.key) for meta in store.list(abandoned_prefix(job))
                  if (p := parse_manifest_key(meta.key)) is not None and p[2] is not None)


def list_jobs(store: Store) -> list[str]:
    """Job names that have at least one committed checkpoint."""
    return sorted({p[0] for meta in store.list("jobs/")
                   if (p := parse_manifest_key(meta.key)) is not None and p[2] is None})


__all__ = [
    "ABANDONED", "abandoned_key", "abandoned_prefix", "list_abandoned", "MANIFEST_NAME", "STEP_DIGITS", "VERIFY_NAME", "check_job", "check_step", "checkpoints_prefix",
    "job_prefix", "list_jobs", "parse_manifest_key", "step_exists", "list_steps", "manifest_key", "step_prefix", "verify_key",
]
