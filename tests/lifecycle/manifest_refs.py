"""The chunk objects a checkpoint needs, read straight from its manifest's JSON.

Deliberately independent of ``trainstore`` (GC decides with ``manifest_chunk_keys``; a test
that computed its expectation with the same function could not catch a mistake in it)."""

from __future__ import annotations

import json
import os


def chunk_key(ref: list) -> str:
    """Object key of a manifest chunk reference ``[hash, codec, size, stored, itemsize]``."""
    digest, codec = ref[0], ref[1]
    return f"chunks/{digest[:2]}/{digest}.{codec}"


def raw_manifest(root: str, job: str, step: int) -> dict:
    with open(os.path.join(root, "jobs", job, "checkpoints", f"{step:012d}", "manifest.json")) as f:
        return json.load(f)


def needed_chunks(manifest: dict) -> set[str]:
    """Every chunk key a manifest's pieces name: plain ``ref``s, XOR ``delta``s and their
    ``base``s, and the ``pack`` chunks of packed pieces (format 2)."""
    keys = set()
    for tensor in manifest["tensors"].values():
        for piece in tensor["chunks"]:
            keys.update(chunk_key(piece[field]) for field in ("ref", "delta", "base", "pack") if field in piece)
    return keys


def needed_by_store(root: str) -> set[str]:
    """Chunk keys needed by every committed checkpoint under a local store's ``root``."""
    keys: set[str] = set()
    jobs = os.path.join(root, "jobs")
    for job in os.listdir(jobs) if os.path.isdir(jobs) else []:
        steps = os.path.join(jobs, job, "checkpoints")
        for step in os.listdir(steps) if os.path.isdir(steps) else []:
            if os.path.exists(os.path.join(steps, step, "manifest.json")):
                keys |= needed_chunks(raw_manifest(root, job, int(step)))
    return keys
