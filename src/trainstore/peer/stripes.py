"""Stripe blocks in a parity recovery: checked when sent, replaced when one fails.

The inventory reads no block (``plan``); so a block's bytes are checked by the node that sends
it, as it reads them: a data slice against the slice hash its protection recorded (else each
chunk of the slice against the manifest), a parity block against its stored BLAKE3. A block
that fails, or is gone, is sent empty. The lost node keeps the blocks of the right length;
a stripe left with fewer than ``k`` is *short*, and ``complete_stripes`` asks for the stripe's
spare blocks (``Plan.spare``) in rounds that every node of the peer group takes part in, until
no stripe is short or no spare is left (its chunks then come from the durable tier). Every
node counts the failed blocks of every lost node as corrupt.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..chunks import ChunkRef, content_hash
from ..errors import IntegrityError, NotFoundError, TrainstoreError
from .context import PeerContext, bundle_reader
from .erasure import block_len, slice_span
from .plan import Plan
from .transport import Piece

Buffer = bytes | bytearray | memoryview
log = logging.getLogger("trainstore.peer")


def checked_slice(ctx: PeerContext, step: int, j: int, refs: dict[str, ChunkRef]) -> bytes:
    """Data slice ``j`` of this node's bundle of ``step``, checked (module docstring);
    ``IntegrityError`` / ``NotFoundError`` when it fails."""
    rec = ctx.pieces.record(ctx.me, step)
    if rec is None:
        raise IntegrityError(f"node {ctx.me} has no record of its step {step}")
    k = ctx.policy.data
    start, length = slice_span(rec.bundle_len, k, j)
    if len(rec.slices) == k:
        data = bundle_reader(ctx.hot, rec.bundle)(start, length)
        if content_hash(data) != rec.slices[j]:
            raise IntegrityError(f"data slice {j} of node {ctx.me}'s step {step} does not match its recorded hash")
        return data
    parts, at = [], 0  # no slice hashes recorded: each chunk the slice touches, read once and checked
    for key, n in rec.bundle:
        lo, hi = max(start, at), min(start + length, at + n)
        if lo < hi:
            whole = bytes(ctx.hot.get(key))
            ref = refs.get(key)
            if ref is not None:
                try:
                    ctx.chunks.check(ref, whole, key=key)
                except TrainstoreError as exc:
                    raise IntegrityError(f"data slice {j} of node {ctx.me}'s step {step}: {exc}") from exc
            parts.append(whole[lo - at:hi - at])
        at += n
    return b"".join(parts)


def send_block(ctx: PeerContext, step: int, stripe: int, j: int, n: int, refs: dict[str, ChunkRef]) -> bytes:
    """Block ``j`` of ``stripe`` padded to ``n`` bytes, or empty when it fails its check."""
    try:
        if j < ctx.policy.data:
            data = checked_slice(ctx, step, j, refs)
            return data + b"\0" * (n - len(data))
        return ctx.pieces.parity(step, stripe, j) or b""
    except (IntegrityError, NotFoundError) as exc:
        log.warning("peer recovery: node %d does not send block %d of stripe %d of step %d: %s",
                    ctx.me, j, stripe, step, exc)
        return b""


def block_pieces(ctx: PeerContext, plan: Plan, wanted: dict[int, list[tuple[int, int, int, int]]],
                 refs: dict[str, ChunkRef]) -> dict[int, list[Piece]]:
    """The pieces this node sends: ``wanted`` = lost node -> [(step, stripe, j, source)]."""
    out: dict[int, list[Piece]] = {}
    for L, blocks in wanted.items():
        for s_step, stripe, j, src in blocks:
            if src == ctx.me:
                n = block_len(plan.slice_lens[(s_step, stripe)])
                out.setdefault(L, []).append(Piece(f"b:{s_step}:{stripe}:{j}", n,
                                                   lambda a=s_step, s=stripe, j=j, n=n: send_block(ctx, a, s, j, n, refs)))
    return out


@dataclass
class Stripes:
    """The blocks a lost node received, by ``(step, stripe)``: ``good`` (the right length),
    ``tried`` (every block asked for), ``bad`` (failed blocks not yet counted)."""

    k: int
    lens: dict[tuple[int, int], int]
    good: dict[tuple[int, int], dict[int, Buffer]] = field(default_factory=dict)
    tried: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    bad: int = 0

    @classmethod
    def planned(cls, ctx: PeerContext, plan: Plan) -> Stripes:
        lens = {key: block_len(v) for key, v in plan.slice_lens.items()}
        st = cls(ctx.policy.data, lens)
        for s_step, stripe, j, _ in plan.blocks.get(ctx.me, []):
            st.tried.setdefault((s_step, stripe), set()).add(j)
            st.good.setdefault((s_step, stripe), {})
        return st

    def receive(self, items: list[tuple[str, Buffer]]) -> None:
        for name, data in items:
            if not name.startswith("b:"):
                continue
            _, a, s, j = name.split(":")
            key = (int(a), int(s))
            if key in self.tried and int(j) in self.tried[key] and memoryview(data).nbytes == self.lens[key]:
                self.good[key][int(j)] = data
            else:
                self.bad += 1

    def short(self) -> list[list]:
        """``[[step, stripe, [tried j..], good count], ..]`` of the stripes below ``k`` blocks."""
        return [[a, s, sorted(self.tried[(a, s)]), len(self.good[(a, s)])]
                for (a, s) in sorted(self.good) if len(self.good[(a, s)]) < self.k]

    def blocks(self, step: int, stripe: int) -> dict[int, Buffer] | None:
        """``k`` good blocks of the stripe, or None when it stayed short."""
        good = self.good.get((step, stripe), {})
        return dict(sorted(good.items())[:self.k]) if len(good) >= self.k else None


def complete_stripes(ctx: PeerContext, plan: Plan, stripes: Stripes | None,
                     refs: dict[str, ChunkRef]) -> int:
    """Retry rounds for short stripes (module docstring); collective of the peer group, every
    node computes the same rounds from the gathered short lists. Returns the blocks that failed,
    summed over the lost nodes (the same on every node)."""
    corrupt = 0
    while True:
        mine = {"bad": stripes.bad if stripes is not None else 0,
                "short": stripes.short() if stripes is not None else []}
        if stripes is not None:
            stripes.bad = 0
        gathered = ctx.transport.all_gather(mine)
        corrupt += sum(int(gathered[L]["bad"]) for L in plan.lost)
        wanted: dict[int, list[tuple[int, int, int, int]]] = {}
        for L in plan.lost:
            for a, s, tried, have in gathered[L]["short"]:
                spares = [(j, n) for j, n in plan.spare.get(L, {}).get((a, s), []) if j not in tried]
                wanted.setdefault(L, []).extend((a, s, j, n) for j, n in spares[:ctx.policy.data - have])
        if not any(wanted.values()):
            return corrupt
        if stripes is not None:
            for a, s, j, _ in wanted.get(ctx.me, []):
                stripes.tried[(a, s)].add(j)
        got = ctx.transport.exchange(block_pieces(ctx, plan, wanted, refs))
        if stripes is not None:
            stripes.receive([it for src in sorted(got) for it in got[src]])


__all__ = ["Stripes", "block_pieces", "checked_slice", "complete_stripes", "send_block"]
