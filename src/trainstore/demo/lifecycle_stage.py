"""Lifecycle stage: verify, register the best checkpoint (aliased ``stable``), apply retention,
archive old full checkpoints, collect garbage, export the model to safetensors.

Everything goes through ``trainstore.lifecycle``: ``Registry`` (in the store), retention
(registered checkpoints are protected), ``Tiering`` (hot -> durable -> archive), ``gc`` and
``export_version``. The export is loaded back with safetensors and compared with the
checkpoint's model tensors, bit for bit.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..checkpoint import CheckpointManager
from ..lifecycle.export import export_version
from ..lifecycle.gc import GcOptions, collect_garbage
from ..lifecycle.registry import Registry
from ..lifecycle.retention import (
    AnyOf,
    BestN,
    EveryNSteps,
    LatestN,
    Registered,
    Rule,
    apply_retention,
    describe,
)
from .context import RunContext
from .svg import human_bytes

MODEL = "ticket-classifier"
METRIC = "val_loss"


def retention_policy(full_every: int) -> Rule:
    """Keep the newest 3, every ``full_every``-th step (the full checkpoints) as milestones, and
    the best 2 by validation loss; registered checkpoints and bases of kept incrementals always.
    Old milestones then go to the archive tier."""
    return AnyOf(LatestN(3), EveryNSteps(full_every), BestN(METRIC, 2, "min"), Registered())


def lifecycle_stage(ctx: RunContext, job: str, dataset: str) -> dict:
    out: dict[str, Any] = {}
    rows: list[tuple[str, str]] = []
    with ctx.stage("lifecycle: registry, retention, tiers", total=6, unit="") as task:
        tiers = ctx.tiering()
        mgr = CheckpointManager(tiers.store, job)
        try:
            ctx.note(task, "verifying every checkpoint")
            records = mgr.verify(deep=True)
            bad = [r.step for r in records if not r.ok]
            out["verify"] = {"checked": len(records), "bad": bad}
            rows.append(("verified (deep: every chunk re-hashed)",
                         f"{len(records)} checkpoints, {len(bad)} bad" + (f" (step {', '.join(map(str, bad))})" if bad else "")))
            ctx.advance(task)

            infos = {i.step: i for i in mgr.list()}
            good = [i for i in infos.values() if i.status == "ok" and isinstance(i.metrics.get(METRIC), (int, float))]
            best = min(good, key=lambda i: (i.metrics[METRIC], -i.step))
            registry = Registry(ctx.store)
            mv = registry.register(job, best.step, MODEL, dataset=dataset, aliases=("latest",),
                                   note="registered by trainstore demo: best verified checkpoint by val_loss")
            registry.promote(MODEL, mv.version, "stable")
            aliases = sorted(a for a, v in registry.aliases(MODEL).items() if v == mv.version)
            out["model"] = {"ref": mv.ref, "model": MODEL, "version": mv.version, "step": best.step, "kind": best.kind,
                            "metrics": best.metrics, "checkpoint_id": mv.checkpoint_id, "aliases": aliases,
                            "dataset": mv.dataset}
            rows.append(("model version", f"{mv.ref} = {job}@{best.step} ({best.kind}, {METRIC} "
                         f"{best.metrics[METRIC]:.4f}), aliases {', '.join(aliases)}"))
            ctx.advance(task, note=f"registered {mv.ref}")

            policy = retention_policy(ctx.config.train.full_every)
            plan = apply_retention(ctx.store, job, policy)  # the hot tier holds only the newest already
            out["retention"] = {**plan.to_json(), "policy": describe(policy)}
            rows.append(("retention", f"{describe(policy)}: kept {len(plan.kept)}, deleted {len(plan.deleted)}"))
            ctx.advance(task, note=f"retention kept {len(plan.kept)}")

            archived = tiers.archive(job)
            out["archived"] = archived
            rows.append(("archived (old full checkpoints)", ", ".join(f"step {s}" for s in archived) or "none"))
            ctx.advance(task, note=f"archived {len(archived)}")

            report = collect_garbage(ctx.store, GcOptions(grace=0))
            out["gc"] = report.to_json()
            rows.append(("garbage collection (durable tier)",
                         f"{report.deleted} unreferenced chunks deleted, {human_bytes(report.bytes_reclaimed)} reclaimed; "
                         f"{report.referenced} chunks still referenced"))
            ctx.advance(task, note="gc done")

            path = os.path.join(ctx.paths.export, f"{MODEL}-v{mv.version}.safetensors")
            exported = export_version(registry, f"{MODEL}@stable", path, only="model/")
            out["export"] = {**exported.to_json(), "matches_checkpoint": _export_matches(mgr, best.step, path)}
            rows.append(("export", f"{exported.path} ({exported.tensors} tensors, {human_bytes(exported.bytes)}, "
                         f"sha256 {exported.sha256[:12]}…); loads with safetensors, "
                         + ("bit-identical to the checkpoint" if out["export"]["matches_checkpoint"] else "DIFFERS")))
            out["tiers"] = [st.to_json() for st in tiers.status(job)]
            ready = [st["restore_ready_s"] for st in out["tiers"] if st.get("restore_ready_s") is not None]
            durable = [st["durable_s"] for st in out["tiers"] if st.get("durable_s") is not None]
            where = {}
            for st in out["tiers"]:
                where[st["tiers"]] = where.get(st["tiers"], 0) + 1
            rows.append(("tiers now", ", ".join(f"{n} {t}" for t, n in sorted(where.items()))
                         + (f"; created -> restore-ready median {1000 * float(np.median(ready)):.0f} ms" if ready else "")
                         + (f", -> durable median {1000 * float(np.median(durable)):.0f} ms" if durable else "")))
            ctx.advance(task, note="exported")
        finally:
            mgr.close()
            tiers.close()
    out["summary"] = {"rows": rows}
    ctx.record["lifecycle"] = out
    return out


def _export_matches(mgr: CheckpointManager, step: int, path: str) -> bool:
    """The safetensors file loads, and holds exactly the checkpoint's model tensors."""
    from safetensors.torch import load_file

    loaded = load_file(path)
    model = mgr.restore(step=step)["model"]
    if set(loaded) != set(model):
        return False
    return all(loaded[k].dtype == model[k].dtype and loaded[k].shape == model[k].shape
               and loaded[k].contiguous().view(-1).view(torch_uint8()).numpy().tobytes()
               == model[k].contiguous().view(-1).view(torch_uint8()).numpy().tobytes() for k in model)


def torch_uint8() -> Any:
    import torch

    return torch.uint8


__all__ = ["METRIC", "MODEL", "lifecycle_stage", "retention_policy"]
