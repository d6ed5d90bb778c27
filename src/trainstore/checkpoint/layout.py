"""Checkpoint layout in a store: job and step names, the keys under them, and listing.

Layout (one store may hold many jobs; chunks are shared so identical bytes dedup across
every checkpoint of every job in the store)::

    jobs/<job>/checkpoints/<step:012d>/manifest.json  the checkpoint; written LAST, put_if_absent
    jobs/<job>/checkpoints/<step:012d>/verify.json    latest verification record (optional, put)
    chunks/<h[0:2]>/<h>.<codec>                       content-addressed chunks (trainstore.chunks)

A checkpoint exists only once its ``manifest.json`` is committed, after every chunk it names
is durable; a crashed save leaves at most unreferenced chunks (garbage for GC) and is never
listed. ``verify.json`` is advisory: it records the outcome of the last ``verify`` so that
``restore()`` does not retry a checkpoint known to be bad (unless asked).
"""

from __future__ import annotations

from ..errors import ConfigError
from ..naming import check_name
from ..store.base import Store

STEP_DIGITS = 12
MANIFEST_NAME = "manifest.json"
VERIFY_NAME = "verify.json"


def check_job(job: str) -> str:
    """Return ``job`` if it is a valid job name, else raise ``ConfigError``."""
    return check_name(job, "job name")


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


# -- listing ----------------------------------------------------------------------------
def list_steps(store: Store, job: str) -> list[int]:
    """Committed steps of ``job``, ascending (a step counts once its manifest.json exists)."""
    prefix = checkpoints_prefix(job)
    steps = []
    for meta in store.list(prefix):
        rest = meta.key[len(prefix):]
        parts = rest.split("/")
        if len(parts) == 2 and parts[1] == MANIFEST_NAME and len(parts[0]) == STEP_DIGITS and parts[0].isdigit():
            steps.append(int(parts[0]))
    return sorted(steps)


def list_jobs(store: Store) -> list[str]:
    """Job names that have at least one committed checkpoint."""
    jobs = set()
    for meta in store.list("jobs/"):
        parts = meta.key.split("/")
        if len(parts) == 5 and parts[2] == "checkpoints" and parts[4] == MANIFEST_NAME:
            jobs.add(parts[1])
    return sorted(jobs)


__all__ = [
    "MANIFEST_NAME", "STEP_DIGITS", "VERIFY_NAME", "check_job", "check_step", "checkpoints_prefix",
    "job_prefix", "list_jobs", "list_steps", "manifest_key", "step_prefix", "verify_key",
]
