"""What the demo left where: bytes per tier and category, and the lineage graph.

Both are computed from the stores themselves (listing the durable store and the archive,
walking the hot-tier directories), not from what the stages think they wrote.
"""

from __future__ import annotations

import os
from typing import Any

from ..data.versions import iter_lineage, load_version, parse_ref
from ..store import Store
from .svg import human_bytes


def _category(key: str) -> str:
    parts = key.split("/")
    if parts[0] == "datasets" and len(parts) > 2:
        name = parts[1]
        if name.endswith(".quarantine"):
            return "quarantine"
        if name.endswith((".train", ".val")):
            return "features (Arrow IPC)"
        return "raw + clean data (Parquet)"
    if parts[0] == "chunks":
        return "checkpoint chunks"
    if parts[0] == "jobs":
        return "checkpoint manifests"
    if parts[0] == "registry":
        return "model registry"
    if parts[0] == "exports":
        return "model export"
    return "other (reports, gc markers)"


def _by_category(store: Store | None) -> dict[str, int]:
    out: dict[str, int] = {}
    if store is None:
        return out
    for meta in store.list(""):
        cat = _category(meta.key)
        out[cat] = out.get(cat, 0) + meta.size
    return out


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                continue
    return total


def storage_by_tier(durable: Store, hot_dirs: dict[str, str], archive: Store | None,
                    exports: dict[str, str] | None = None) -> dict[str, Any]:
    """``{"tiers": [[tier, [[category, bytes], ...]], ...]}``, categories in a stable order."""
    order = ["raw + clean data (Parquet)", "quarantine", "features (Arrow IPC)", "feature shards (loader cache)",
             "checkpoint chunks", "checkpoint manifests", "model registry", "model export",
             "other (reports, gc markers)"]

    def ordered(d: dict[str, int]) -> list[list]:
        return [[c, d[c]] for c in sorted(d, key=lambda c: order.index(c) if c in order else 99) if d[c] > 0]

    hot = {name: _dir_bytes(path) for name, path in hot_dirs.items()}
    tiers = [["hot (local)", ordered(hot)], ["durable (store)", ordered(_by_category(durable))]]
    if archive is not None:
        tiers.append(["archive", ordered(_by_category(archive))])
    if exports:
        tiers.append(["deployable", ordered({"model export": sum(_dir_bytes(p) if os.path.isdir(p) else
                                                                 os.path.getsize(p) for p in exports.values()
                                                                 if os.path.exists(p))})])
    codecs: dict[str, int] = {}  # checkpoint chunk bytes by the codec in their names (chunks/<h>.<codec>)
    for meta in durable.list("chunks/"):
        codec = meta.key.rsplit(".", 1)[-1] if "." in meta.key.rsplit("/", 1)[-1] else "unknown"
        codecs[codec] = codecs.get(codec, 0) + meta.size
    return {"tiers": tiers, "codecs": codecs}


def lineage(store: Store, refs: list[str], job: str | None, checkpoints: int, model: dict | None,
            export: dict | None) -> dict[str, Any]:
    """Nodes and edges from raw data to the exported model, read from the manifests."""
    nodes: dict[str, dict] = {}
    edges: list[list[str]] = []
    for ref in refs:
        for v in iter_lineage(store, ref):
            kind = "features" if v.layout == "arrow-ipc" else ("quarantine" if v.name.endswith(".quarantine") else "dataset")
            nodes[v.id] = {"id": v.id, "label": v.id, "kind": kind,
                           "detail": f"{v.rows:,} rows · {human_bytes(v.bytes)}",
                           "title": f"{v.id}: {v.operation}, {len(v.shards)} shards, parents {list(v.parents)}"}
            for p in v.parents:
                edges.append([p, v.id])
            q = v.extra.get("quarantine") if isinstance(v.extra, dict) else None
            if q and q not in nodes:
                name, ver = parse_ref(q)
                qv = load_version(store, name, ver)
                nodes[q] = {"id": q, "label": q.replace("tickets.clean.", ""), "kind": "quarantine",
                            "detail": f"{qv.rows:,} rows set aside", "title": f"{q}: rows that failed cleaning"}
                for p in qv.parents:
                    edges.append([p, q])
    if job:
        jid = f"job:{job}"
        nodes[jid] = {"id": jid, "label": job, "kind": "checkpoint", "detail": f"{checkpoints} checkpoints kept",
                      "title": f"training job {job}"}
        for ref in refs:
            edges.append([ref, jid])
        if model:
            cid = f"ckpt:{job}@{model['step']}"
            nodes[cid] = {"id": cid, "label": f"step {model['step']}", "kind": "checkpoint",
                          "detail": f"{model['kind']} · val_loss {model['metrics'].get('val_loss', 0):.3f}",
                          "title": f"checkpoint {job}@{model['step']} (id {model['checkpoint_id'][:16]}…)"}
            edges.append([jid, cid])
            mid = f"model:{model['ref']}"
            nodes[mid] = {"id": mid, "label": model["ref"], "kind": "model",
                          "detail": "aliases " + ", ".join(model.get("aliases", [])),
                          "title": f"registered model version {model['ref']}"}
            edges.append([cid, mid])
            if export:
                eid = "export"
                nodes[eid] = {"id": eid, "label": os.path.basename(export["path"]), "kind": "export",
                              "detail": f"{export['tensors']} tensors · {human_bytes(export['bytes'])}",
                              "title": f"{export['path']} sha256 {export['sha256']}"}
                edges.append([mid, eid])
    return {"nodes": list(nodes.values()), "edges": [e for e in edges if e[0] in nodes and e[1] in nodes]}


__all__ = ["lineage", "storage_by_tier"]
