"""Pure planning steps of ingestion: which input files to read, and what a commit publishes.

``plan_files`` hashes each input file (BLAKE3) and skips one whose bytes a committed version
or an acknowledged ingest already holds, or that appeared earlier in the same call.
``plan_commit`` orders the acknowledged shards of every journal entry (other writers' first,
then this writer's in write order), drops those the parent version already names, and
gathers the source files of the entries it publishes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from ..lineage import file_digest
from ..versions import ShardInfo, SourceFile
from .journal import PendingEntry

_BLANK = b" \t\r\n"


@dataclass(frozen=True)
class FilePlan:
    """One input file to read: its path, the name recorded in lineage, its digest and size."""

    path: str
    name: str
    blake3: str
    bytes: int


def plan_files(files: list[str], known: dict[str, str], allow_duplicates: bool
               ) -> tuple[list[FilePlan], list[tuple[str, str]]]:
    """(files to ingest, [(path, where its bytes already are)] skipped)."""
    base = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in files]) if files else ""
    plans: list[FilePlan] = []
    skipped: list[tuple[str, str]] = []
    seen = dict(known)
    for path in files:
        digest = file_digest(path)
        if not allow_duplicates and digest in seen:
            skipped.append((path, seen[digest]))
            continue
        seen.setdefault(digest, f"this ingest ({path})")
        plans.append(FilePlan(path, os.path.relpath(os.path.abspath(path), base), digest, os.path.getsize(path)))
    return plans, skipped


def is_blank(path: str, block: int = 1 << 20) -> bool:
    """True when a file holds only whitespace (an empty JSONL or CSV file: zero rows)."""
    with open(path, "rb") as f:
        while chunk := f.read(block):
            if chunk.strip(_BLANK):
                return False
    return True


@dataclass(frozen=True)
class CommitPlan:
    """What one commit attempt publishes: new shards in order, their source files, and the
    journal entries it retires once the version is committed."""

    fresh: tuple[ShardInfo, ...]
    sources: tuple[SourceFile, ...]
    retire: tuple[str, ...]


def plan_commit(entries: Iterable[PendingEntry], own_writer: str, own_unjournaled: list[ShardInfo],
                committed: set[str], extra_sources: Iterable[SourceFile] = ()) -> CommitPlan:
    """Shards to add to a version whose parent names ``committed`` (see the module docstring).

    ``own_unjournaled``: this writer's pending shards that no entry names (journals written
    before the store journal existed), published after its entries."""
    ordered = sorted(entries, key=lambda e: (e.writer == own_writer, e.writer, e.seq))
    fresh: list[ShardInfo] = []
    sources: dict[str, SourceFile] = {}
    taken = set(committed)
    for entry in ordered:
        new = [s for s in entry.shards if s.key not in taken]
        taken.update(s.key for s in new)
        fresh.extend(new)
        if new:
            for src in entry.sources:
                sources.setdefault(src.blake3, src)
    for info in own_unjournaled:
        if info.key not in taken:
            taken.add(info.key)
            fresh.append(info)
    for src in extra_sources:
        sources.setdefault(src.blake3, src)
    return CommitPlan(tuple(fresh), tuple(sources.values()), tuple(e.key for e in ordered))


__all__ = ["CommitPlan", "FilePlan", "is_blank", "plan_commit", "plan_files"]
