"""Recovery stage: corrupt the newest checkpoint on purpose and show ``restore()`` skip it.

Flips 16 bytes in the middle of one chunk object that only the newest checkpoint owns (not a
chunk shared with its base), in every tier holding a copy (bad bytes written everywhere, as
a bug upstream of the store would), through the ``Store`` interface: any backend works.
``restore()`` then re-hashes what it reads, detects the damage, records the checkpoint as
bad and falls back to the newest one that verifies; it says which and why.
"""

from __future__ import annotations

from typing import Any

from ..checkpoint import CheckpointManager
from .context import RunContext

FLIP_BYTES = 16


def corrupt_stage(ctx: RunContext, job: str) -> dict:
    out: dict[str, Any] = {"job": job}
    with ctx.stage("corrupt a checkpoint + restore", total=3, unit="") as task:
        tiers = ctx.tiering()
        mgr = CheckpointManager(tiers.store, job)  # reads hot, else durable, else archive
        try:
            step = mgr.latest_step()
            if step is None:
                raise ValueError(f"job {job!r} has no checkpoints to corrupt")
            manifest = mgr.manifest(step)
            name, entry = max(((n, c) for n, t in manifest.tensors.items() for c in t.chunks if not c.same_as_base),
                              key=lambda nc: nc[1].ref.stored)
            key = entry.ref.key(mgr.chunks.prefix)
            where = []
            for tier_name, tier in (("hot", tiers.hot), ("durable", tiers.durable)):
                if not tier.exists(key):
                    continue
                data = bytearray(memoryview(tier.get(key)))  # the same bad bytes in every copy
                mid = len(data) // 2
                for i in range(mid, min(mid + FLIP_BYTES, len(data))):
                    data[i] ^= 0xFF
                tier.put(key, bytes(data))
                where.append(tier_name)
            out.update(step=step, kind=manifest.kind, tensor=name, chunk_key=key, chunk_bytes=len(data),
                       flipped_bytes=min(FLIP_BYTES, len(data) - mid), offset=mid, tiers=where)
            ctx.advance(task, note=f"flipped {out['flipped_bytes']} bytes of step {step}")
            result = mgr.restore_with_info()
            out["restore"] = {"step": result.step, "kind": result.kind, "reason": result.reason,
                              "skipped": [[s, why] for s, why in result.skipped], "seconds": result.seconds}
            ctx.advance(task, note=f"restore() chose step {result.step}")
            records = mgr.verify(step=step, deep=True)
            out["verify"] = {"ok": records[0].ok, "errors": list(records[0].errors)[:3]}
            out["detected"] = any(s == step for s, _ in result.skipped) and not records[0].ok
            ctx.advance(task, note="detected and skipped" if out["detected"] else "NOT DETECTED")
        finally:
            mgr.close()
            tiers.close()
    ctx.record["corruption"] = out
    return out


__all__ = ["FLIP_BYTES", "corrupt_stage"]
