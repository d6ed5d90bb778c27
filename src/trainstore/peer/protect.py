"""Protect one committed checkpoint step on the peers (a collective of the peer group).

Every node: finds the chunks of the step it holds in its hot tier (its *own* chunks), the new
ones since its last protected step (an incremental save sends only those), and sends them -
whole to ``replicas`` next nodes, or as slices to the parity holders of its group's stripes
(``erasure``): each stripe's first parity holder encodes all its parity blocks and
forwards the others (each slice is sent once: 1 + (m-1)/k of the new bytes). Every received
piece is checked (a replica by its chunk hash against the manifest, a slice by the length its owner's record names, a stored
parity block read back against its hash); then all nodes agree (``all_reduce(MIN)``), and
only if every piece landed and verified on every node does each node write ``protected/<step>``.
A node lost mid-way fails the collective: no node marks the step, the previous protected step
stays the one recovery uses. Old pieces beyond ``keep_steps`` protected steps are dropped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from ..checkpoint.format import manifest as mf
from ..chunks import content_hash
from ..errors import IntegrityError, NotFoundError, TrainstoreError
from .context import PeerContext, bundle_reader
from .erasure import encode_parity, slice_span, stripe_node, stripe_of
from .pieces import Record
from .transport import Piece

log = logging.getLogger("trainstore.peer")


@dataclass(frozen=True)
class ProtectStats:
    """One node's part of protecting ``step``: its own chunk bytes, the new ones it sent,
    what it sent and stored for peers, whether every node verified its pieces."""

    step: int
    protected: bool
    own_bytes: int
    new_bytes: int
    sent_bytes: int
    stored_bytes: int
    seconds: float


def own_record(ctx: PeerContext, step: int, previous: Record | None) -> tuple[mf.Manifest, Record]:
    """This node's record of ``step``: the manifest's chunks its hot tier holds; the bundle is
    the ones ``previous`` (its last protected record) did not have."""
    m = mf.load_manifest(ctx.store, ctx.job, step)
    own: dict[str, int] = {}
    for key in sorted(ctx.refs(m)):
        try:
            own[key] = ctx.hot.head(key).size
        except NotFoundError:
            continue
    old = previous.keys if previous is not None else {}
    bundle = tuple((k, n) for k, n in own.items() if k not in old)
    return m, Record(ctx.me, step, own, bundle)


def _cache_manifest(ctx: PeerContext, step: int) -> None:
    """Every node keeps the manifest in its hot tier, so a recovery reads no durable bytes."""
    key = mf.manifest_key(ctx.job, step)
    if not ctx.hot.exists(key):
        ctx.hot.put(key, ctx.store.get(key))


def _outgoing(ctx: PeerContext, rec: Record) -> dict[int, list[Piece]]:
    rec_bytes = rec.to_bytes()
    out: dict[int, list[Piece]] = {}
    if ctx.policy.replicas:
        chunks = [Piece(f"c:{k}", n, lambda k=k: ctx.hot.get(k)) for k, n in rec.bundle]
        for i in range(1, ctx.policy.replicas + 1):
            out[(ctx.me + i) % ctx.nodes] = [Piece("r", len(rec_bytes), lambda: rec_bytes), *chunks]
        return out
    k, g = ctx.policy.data, ctx.policy.group
    base, pos = ctx.group_of(ctx.me)
    for p in range(g):
        if p != pos:
            out[base + p] = [Piece("r", len(rec_bytes), lambda: rec_bytes)]
    read = bundle_reader(ctx.hot, rec.bundle)
    for t in range(k):
        s = stripe_of(pos, t, g)
        start, length = slice_span(rec.bundle_len, k, t)
        # to the stripe's encoder (its first parity position), which forwards the other blocks
        out[base + stripe_node(s, k, g)].append(Piece(f"s:{s}:{t}", length, lambda a=start, n=length: read(a, n)))
    return out


def _receive(ctx: PeerContext, m: mf.Manifest, step: int,
             got: dict[int, list[tuple[str, bytes]]]) -> tuple[int, dict[int, list[Piece]]]:
    """Check and store what peers sent; returns the bytes stored and, for parity, the blocks
    this node encoded for the other parity holders of its stripe. ``IntegrityError`` on a bad piece."""
    refs, stored = ctx.refs(m), 0
    records: dict[int, Record] = {}
    slices: dict[tuple[int, int], bytes] = {}
    for src, items in got.items():
        for name, data in items:
            if name == "r":
                rec = Record.from_bytes(data, f"from node {src}")
                if rec.owner != src or rec.step != step:
                    raise IntegrityError(f"node {src} sent a record of node {rec.owner} step {rec.step} "
                                         f"while protecting step {step}")
                records[src] = rec
            elif name.startswith("c:"):
                key = name[2:]
                if key not in refs:
                    raise IntegrityError(f"node {src} sent chunk {key}, which step {step} does not reference")
                ctx.chunks.check(refs[key], data, key=key)  # ChunkCorruptError: not protected
                ctx.pieces.put_chunk(key, data)
                stored += len(data)
            elif name.startswith("s:"):
                _, s, t = name.split(":")
                slices[(int(s), int(t))] = data
    for rec in records.values():
        ctx.pieces.put_record(rec)
    if not ctx.policy.parity:
        return stored, {}
    return _encode(ctx, step, records, slices)


def _encode(ctx: PeerContext, step: int, records: dict[int, Record],
            slices: dict[tuple[int, int], bytes]) -> tuple[int, dict[int, list[Piece]]]:
    """Encode the stripe this node is the first parity position of; keep block k, return the
    blocks k+1.. for their holders."""
    k, g = ctx.policy.data, ctx.policy.group
    base, pos = ctx.group_of(ctx.me)
    s = (pos - k) % g
    parts = []
    for t in range(k):
        owner = base + stripe_node(s, t, g)
        rec = records.get(owner) if owner != ctx.me else ctx.pieces.record(ctx.me, step)
        data = slices.get((s, t), b"")
        if rec is None or len(data) != slice_span(rec.bundle_len, k, t)[1]:
            raise IntegrityError(f"stripe {s} of step {step}: slice {t} from node {owner} is missing or has "
                                 f"{len(data)} bytes, not what its record names")
        parts.append(data)
    blocks = encode_parity(parts, k, g, list(range(k, g)))
    stored = _keep_block(ctx, step, s, k, blocks[0])
    forward = {base + stripe_node(s, j, g): [Piece(f"p:{s}:{j}", len(b), lambda b=b: b)]
               for j, b in zip(range(k + 1, g), blocks[1:], strict=True)}
    return stored, forward


def _keep_block(ctx: PeerContext, step: int, s: int, j: int, block: bytes) -> int:
    ctx.pieces.put_parity(step, s, j, block)
    if ctx.pieces.parity(step, s, j) != block:  # read back against its hash
        raise IntegrityError(f"parity block {s}.{j} of step {step} did not read back as written")
    return len(block)


def _receive_blocks(ctx: PeerContext, step: int, got: dict[int, list[tuple[str, bytes]]]) -> int:
    """Keep the parity blocks the stripes' encoders forwarded (one per stripe this node holds
    a later parity position of)."""
    k, g = ctx.policy.data, ctx.policy.group
    base, pos = ctx.group_of(ctx.me)
    want = {((pos - j) % g, j) for j in range(k + 1, g)}
    stored = 0
    for src, items in got.items():
        for name, data in items:
            parts = name.split(":")
            key = (int(parts[1]), int(parts[2])) if len(parts) == 3 and parts[0] == "p" else (-1, -1)
            if key not in want or src != base + stripe_node(key[0], k, g):
                raise IntegrityError(f"node {src} sent {name!r} while protecting step {step}")
            stored += _keep_block(ctx, step, key[0], key[1], data)
            want.discard(key)
    if want:
        raise IntegrityError(f"parity blocks {sorted(want)} of step {step} never arrived")
    return stored


def protect(ctx: PeerContext, step: int, previous: Record | None) -> ProtectStats:
    """Protect ``step`` (collective of the peer group; see the module docstring)."""
    t0, sent0 = time.perf_counter(), ctx.transport.bytes_sent
    m, rec = own_record(ctx, step, previous)
    if ctx.policy.parity:  # a recovery checks a data slice by this hash (no decode of its chunks)
        read = bundle_reader(ctx.hot, rec.bundle)
        rec = replace(rec, slices=tuple(content_hash(read(*slice_span(rec.bundle_len, ctx.policy.data, t)))
                                        for t in range(ctx.policy.data)))
    _cache_manifest(ctx, step)
    ctx.pieces.put_record(rec)
    got = ctx.transport.exchange(_outgoing(ctx, rec))
    ok, stored, forward = 1, 0, {}
    try:
        stored, forward = _receive(ctx, m, step, got)
    except (TrainstoreError, OSError) as exc:
        log.error("peer tier: node %d could not keep its peers' pieces of step %d: %s", ctx.me, step, exc)
        ok = 0
    if ctx.policy.parity:  # every node takes part in the second round, also after a failure
        got = ctx.transport.exchange(forward)
        try:
            stored += _receive_blocks(ctx, step, got) if ok else 0
        except (TrainstoreError, OSError) as exc:
            log.error("peer tier: node %d could not keep the parity of step %d: %s", ctx.me, step, exc)
            ok = 0
    flag = torch.tensor([ok], dtype=torch.int64)
    ctx.transport.all_reduce(flag, dist.ReduceOp.MIN)
    protected = bool(flag.item())
    if protected:
        ctx.pieces.mark_protected(step, {"step": step, "nodes": ctx.nodes, "policy": ctx.policy.describe()})
        prune(ctx)
    return ProtectStats(step, protected, sum(rec.keys.values()), rec.bundle_len,
                        ctx.transport.bytes_sent - sent0, stored, time.perf_counter() - t0)


def prune(ctx: PeerContext) -> None:
    """Keep the pieces the newest ``keep_steps`` protected steps need; drop the rest."""
    steps = ctx.pieces.protected_steps()
    keep = steps[-ctx.policy.keep_steps:]
    if not keep:
        return
    owners = ctx.pieces.owners()
    needed: dict[int, set[str]] = {}
    for o in owners:
        needed[o] = set()
        for s in keep:
            rec = ctx.pieces.record(o, s)
            if rec is not None:
                needed[o].update(rec.keys)
    # a step's pieces are needed while a kept step still uses a chunk its bundle carried
    for o in owners:
        for s in ctx.pieces.record_steps(o):
            if s in keep:
                continue
            rec = ctx.pieces.record(o, s)
            if s > keep[-1] or (rec is not None and ctx.policy.parity and needed[o] & {k for k, _ in rec.bundle}):
                continue
            if ctx.policy.replicas or not any(_bundle_needed(ctx, o2, s, needed) for o2 in owners):
                ctx.pieces.delete(f"records/{o:06d}/{s:012d}.json")
    for s in steps[:-ctx.policy.keep_steps]:
        ctx.pieces.delete(f"protected/{s:012d}.json")
    if ctx.policy.replicas:
        held = set().union(*(needed[o] for o in owners if o != ctx.me)) if owners else set()
        for key in list(ctx.pieces.chunk_keys()):
            if key not in held:
                ctx.pieces.delete(key)
    else:
        for s in ctx.pieces.parity_steps():
            if s < keep[0] and not any(_bundle_needed(ctx, o, s, needed) for o in owners):
                ctx.pieces.delete_prefix(f"parity/{s:012d}/")


def _bundle_needed(ctx: PeerContext, owner: int, step: int, needed: dict[int, set[str]]) -> bool:
    rec = ctx.pieces.record(owner, step)
    return rec is not None and bool(needed.get(owner, set()) & {k for k, _ in rec.bundle})


__all__ = ["ProtectStats", "own_record", "protect", "prune"]
