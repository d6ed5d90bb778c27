"""What protection and recovery share on one node: the stores, the pieces, the transport."""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint.format import manifest as mf
from ..chunks import ChunkRef, ChunkStore
from ..store.base import Store
from .pieces import Pieces
from .policy import PeerPolicy
from .transport import Transport


@dataclass(frozen=True)
class PeerContext:
    """One node's view: ``store`` (the job's tiered store), ``hot`` (its first tier, this node's
    chunks), ``chunks`` (hash checks), ``pieces`` (what it keeps for peers), ``transport`` (the
    peer group; ``transport.me`` is this node's index)."""

    store: Store
    hot: Store
    job: str
    policy: PeerPolicy
    pieces: Pieces
    transport: Transport
    chunks: ChunkStore

    @property
    def me(self) -> int:
        return self.transport.me

    @property
    def nodes(self) -> int:
        return self.transport.size

    def group_of(self, node: int) -> tuple[int, int]:
        """(first node of ``node``'s parity group, its position in it)."""
        g = self.policy.group
        return node - node % g, node % g

    def refs(self, manifest: mf.Manifest) -> dict[str, ChunkRef]:
        return {r.key(self.chunks.prefix): r for r in mf.manifest_refs(manifest)}


def bundle_reader(hot: Store, bundle: tuple[tuple[str, int], ...]):  # noqa: ANN201 - a small closure factory
    """``read(start, length)`` over the concatenation of ``bundle``'s chunks in ``hot``, reading
    only the chunks the range touches."""
    offsets, at = [], 0
    for key, n in bundle:
        offsets.append((at, key, n))
        at += n

    def read(start: int, length: int) -> bytes:
        parts, end = [], start + length
        for off, key, n in offsets:
            lo, hi = max(start, off), min(end, off + n)
            if lo < hi:
                parts.append(bytes(hot.get_range(key, lo - off, hi - lo)))
        return b"".join(parts)

    return read


__all__ = ["PeerContext", "bundle_reader"]
