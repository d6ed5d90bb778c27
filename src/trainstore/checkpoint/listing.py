"""What ``CheckpointManager.list`` reports: one ``CheckpointInfo`` per checkpoint of a job.

The lineage's checkpoints (``checkpoints/``), oldest first, an unreadable manifest as status
``unreadable``; with ``abandoned=True`` also those rollbacks and reruns left behind
(``lineage``), each beside the lineage's step of the same number. On a tiered store,
``durable`` says whether a tier past the hot one holds the checkpoint.
"""

from __future__ import annotations

import logging

from ..errors import ManifestError, NotFoundError, StoreUnavailableError, TrainstoreError
from ..store.base import Store
from .format import manifest as mf
from .format.layout import list_abandoned
from .format.lineage import load_abandoned
from .types import CheckpointInfo

log = logging.getLogger("trainstore.checkpoint")


def checkpoint_infos(store: Store, job: str, abandoned: bool = False) -> list[CheckpointInfo]:
    """Every checkpoint of ``job`` (see module docstring)."""
    out = []
    tiers = store.tiers()
    beyond_hot = {s for t in tiers[1:] for s in mf.list_steps(t, job)}
    for step in mf.list_steps(store, job):
        durable = len(tiers) == 1 or step in beyond_hot
        try:
            m = mf.load_manifest(store, job, step)
        except NotFoundError:
            continue
        except TrainstoreError as exc:
            if isinstance(exc, StoreUnavailableError):
                raise
            out.append(CheckpointInfo(step, "?", None, 0.0, {}, {}, 0, 0, 0, 0, "unreadable", None, (str(exc),),
                                      durable=durable))
            continue
        out.append(CheckpointInfo.from_manifest(m, mf.load_verify_record(store, job, step, m), durable))
    if abandoned:
        out.extend(_abandoned(store, job, tiers))
        out.sort(key=lambda i: (i.step, i.abandoned, i.created))
    return out


def _abandoned(store: Store, job: str, tiers: tuple[Store, ...]) -> list[CheckpointInfo]:
    beyond_hot = {key for t in tiers[1:] for _s, _r, key in list_abandoned(t, job)}
    out = []
    for _step, _run, key in list_abandoned(store, job):
        try:
            m = load_abandoned(store, key)
        except NotFoundError:
            continue  # removed by retention since it was listed
        except ManifestError as exc:
            log.warning("unreadable abandoned checkpoint %s: %s", key, exc)
            continue
        out.append(CheckpointInfo.from_manifest(m, None, len(tiers) == 1 or key in beyond_hot, abandoned=True))
    return out


__all__ = ["checkpoint_infos"]
