"""Rebuild lost nodes' chunks from their peers (a collective of the peer group).

1. Every node says which steps it holds protected and which of its own records it has; a node
   without its own record of a step is *lost* for that step (its hot tier came back empty).
2. For each protected step, newest first: every node gathers its inventory (``plan``), every
   node computes the same plan; the first step every lost node can get back is chosen. None:
   the durable tier, and the report says plainly why (too many nodes lost).
3. The survivors send the manifest, the lost node's records, replica chunks or stripe blocks;
   the lost node checks the manifest's checksum, decodes stripes (zfec), checks every chunk by
   its hash and writes it to its hot tier (on a few threads) - so the checkpoint restores from
   local disk and the node holds its chunks again before the next failure. A replica chunk
   that fails its hash is asked of the next holder (``_replica_retries``; every node counts
   it as corrupt); a stripe block that fails its check at its sender is replaced by a spare
   block of the stripe (``stripes.complete_stripes``, counted the same way); a chunk no peer
   could give, or a decoded one that failed its hash, is left to the durable tier and counted.
"""

from __future__ import annotations

import bisect
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from ..checkpoint.format import manifest as mf
from ..errors import TrainstoreError
from .context import PeerContext
from .erasure import decode_stripe, slice_span
from .pieces import Record
from .plan import Plan, inventory, make_plan, rec_from_json
from .stripes import Stripes, block_pieces, complete_stripes
from .transport import Piece

Buffer = bytes | bytearray | memoryview
#: threads that check and write rebuilt chunks (their hashing and fsyncs overlap)
_WRITERS = 4

log = logging.getLogger("trainstore.peer")


@dataclass
class RecoveryReport:
    """What one node's recovery did. ``step``: the protected step rebuilt (None: peers could
    not; restore from the durable tier, ``reason`` says why). ``bytes``: this node's chunk
    bytes by source - ``local`` (already in its hot tier), ``peer`` (replicas), ``parity``
    (decoded), ``durable`` (no peer could give them). ``corrupt``: peer pieces that failed
    their hash (all nodes) and were not used."""

    step: int | None
    lost: list[int]
    bytes: dict[str, int] = field(default_factory=lambda: {"local": 0, "peer": 0, "parity": 0, "durable": 0})
    corrupt: int = 0
    reason: str = ""
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase on this node

    def __str__(self) -> str:
        b = ", ".join(f"{k} {v}" for k, v in self.bytes.items())
        where = f"step {self.step}" if self.step is not None else "no step from peers (durable tier)"
        return f"peer recovery: {where}; lost nodes {self.lost}; bytes {b}; corrupt pieces {self.corrupt}; {self.reason}"


def recover(ctx: PeerContext) -> RecoveryReport:
    """Choose and rebuild (see the module docstring); collective of the peer group."""
    t0 = time.perf_counter()
    mine = {"protected": ctx.pieces.protected_steps(), "own": ctx.pieces.record_steps(ctx.me)}
    infos = ctx.transport.all_gather(mine)
    started = time.perf_counter() - t0
    candidates = sorted({s for i in infos for s in i["protected"]}, reverse=True)
    reasons = []
    for step in candidates:
        t = time.perf_counter()
        lost = [n for n in range(ctx.nodes) if step not in infos[n]["own"]]
        refs = _refs(ctx, step, lost)
        refs_s = time.perf_counter() - t
        inv = inventory(ctx, step, lost, refs)
        inventoried = time.perf_counter() - t
        invs = ctx.transport.all_gather(inv)
        plan = make_plan(ctx, step, lost, invs)
        if plan.missing:
            reasons.append(f"step {step}: {plan.missing}")
            continue
        planned = time.perf_counter() - t
        report = _execute(ctx, plan, refs)
        report.phases.update(start_s=started, refs_s=refs_s, inventory_s=inventoried, plan_s=planned)
        report.seconds = time.perf_counter() - t0
        report.reason = "; ".join(reasons + [f"step {step} rebuilt from peers" if lost else
                                             f"step {step}: no node lost, every chunk local"])
        return report
    report = RecoveryReport(None, [], reason="; ".join(reasons) or "no step is peer-protected")
    report.reason = "restore from the durable tier: " + report.reason
    report.seconds = time.perf_counter() - t0
    log.warning("%s", report)
    return report


def _refs(ctx: PeerContext, step: int, lost: list[int]) -> dict:
    if ctx.me in lost:
        return {}
    try:  # protection cached the manifest in the hot tier: read it there (the tiered store's get was 0.2-0.4 s)
        try:
            return ctx.refs(mf.load_manifest(ctx.hot, ctx.job, step))
        except TrainstoreError:
            return ctx.refs(mf.load_manifest(ctx.store, ctx.job, step))
    except TrainstoreError as exc:  # the manifest decides: a step whose manifest is gone is no candidate
        log.warning("peer recovery: node %d cannot read the manifest of step %d: %s", ctx.me, step, exc)
        return {}


def _execute(ctx: PeerContext, plan: Plan, refs: dict) -> RecoveryReport:
    report = RecoveryReport(plan.step, plan.lost)
    out: dict[int, list[Piece]] = {}
    first_alive = min(n for n in range(ctx.nodes) if n not in plan.lost)
    if ctx.me == first_alive and plan.lost:  # the manifest, and the base an incremental loads with it
        man = bytes(ctx.store.get(mf.manifest_key(ctx.job, plan.step)))
        base = mf.Manifest.from_bytes(man, f"manifest of step {plan.step}").base_step
        mans = [(plan.step, man)]
        if base is not None:
            mans.append((base, bytes(ctx.store.get(mf.manifest_key(ctx.job, base)))))
        for L in plan.lost:
            for s, data in mans:
                out.setdefault(L, []).append(Piece(f"m:{s}", len(data), lambda d=data: d))
    for L, keys in plan.chunks.items():
        for key, src in keys.items():
            if src == ctx.me:
                n = int(plan.records[L][0]["keys"].get(key, 0))
                out.setdefault(L, []).append(Piece(f"c:{key}", n, lambda key=key: ctx.pieces.chunk(key) or b""))
    for L, pieces in block_pieces(ctx, plan, plan.blocks, refs).items():
        out.setdefault(L, []).extend(pieces)
    t = time.perf_counter()
    got = ctx.transport.exchange(out)
    report.phases["exchange_s"] = time.perf_counter() - t
    rx: _Received | None = None
    failed, durable, error = [], set(plan.durable.get(ctx.me, [])), None
    try:
        if ctx.me in plan.lost:
            try:
                rx = _receive(ctx, plan, got, report)
            except TrainstoreError as exc:  # raised after the retry rounds, which every node takes part in
                error = exc
        t = time.perf_counter()
        if ctx.policy.parity and plan.lost:
            report.corrupt += complete_stripes(ctx, plan, rx.stripes if rx is not None else None, refs)
        retry_s = time.perf_counter() - t
        if rx is not None and error is None:
            try:
                _decode(ctx, plan, rx, report, durable)
                t_w = time.perf_counter()
                failed = rx.writer.finish(report, durable)
                report.phases["write_wait_s"] = time.perf_counter() - t_w
            except TrainstoreError as exc:
                error = exc
        t = time.perf_counter()
        if ctx.policy.replicas and plan.lost:
            _replica_retries(ctx, plan, report, failed, rx.writer if rx is not None else None, durable)
        report.phases["retry_s"] = retry_s + time.perf_counter() - t
    finally:
        if rx is not None:
            rx.writer.close()
    if error is not None:
        raise error
    if ctx.me in plan.lost:
        wanted = plan.records[ctx.me][0]["keys"]
        report.bytes["durable"] = sum(int(n) for key, n in wanted.items() if not ctx.hot.exists(key))
    else:
        rec = ctx.pieces.record(ctx.me, plan.step)
        report.bytes["local"] = sum(rec.keys.values()) if rec is not None else 0
    return report


class _Writer:
    """Checks and writes rebuilt chunks on a few threads (hashing and fsyncs overlap)."""

    def __init__(self, ctx: PeerContext, step: int, refs: dict) -> None:
        self.ctx, self.step, self.refs = ctx, step, refs
        self.pool = ThreadPoolExecutor(max_workers=_WRITERS, thread_name_prefix="trainstore-peer-rebuild")
        self.jobs: list[tuple[str, str, int, Future]] = []
        self.queued: set[str] = set()

    def _check_and_put(self, key: str, data: Buffer) -> None:
        ref = self.refs.get(key)
        if ref is None:
            raise TrainstoreError(f"chunk {key} is not referenced by step {self.step}")
        self.ctx.chunks.check(ref, data, key=key)  # hashing and the write's fsync release the GIL
        self.ctx.hot.put(key, data)

    def keep(self, key: str, data: Buffer, source: str) -> None:
        if key in self.queued:
            return
        self.queued.add(key)
        self.jobs.append((key, source, memoryview(data).nbytes, self.pool.submit(self._check_and_put, key, data)))

    def finish(self, report: RecoveryReport, durable: set[str]) -> list[str]:
        """Wait for every write; returns the replica chunks that failed their check (another
        holder may have a good copy); a decoded chunk that failed goes to ``durable``."""
        failed = []
        for key, source, n, fut in self.jobs:
            try:
                fut.result()
            except TrainstoreError as exc:
                self.queued.discard(key)
                if source == "peer":
                    log.warning("peer recovery: %s; asking another holder", exc)
                    failed.append(key)
                else:
                    log.warning("peer recovery: %s; it will be read from the durable tier", exc)
                    report.corrupt += 1
                    durable.add(key)
                continue
            report.bytes[source] += n
        self.jobs = []
        return failed

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _replica_retries(ctx: PeerContext, plan: Plan, report: RecoveryReport, failed: list[str],
                     writer: _Writer | None, durable: set[str]) -> None:
    """Replica chunks that failed the lost node's check are asked of the next holder with a
    copy, round by round, until none failed or no holder is left (then: the durable tier).
    Every node takes part (collective); every node computes the same rounds from the gathered
    failures, and counts them as corrupt."""
    tried = {L: {key: {src} for key, src in keys.items()} for L, keys in plan.chunks.items()}
    while True:
        gathered = ctx.transport.all_gather(failed)
        report.corrupt += sum(len(gathered[L]) for L in plan.lost)
        retry: dict[int, dict[str, int]] = {}
        for L in plan.lost:
            for key in gathered[L]:
                src = next((n for n in plan.holders.get(L, []) if n not in tried[L].get(key, set())
                            and key not in plan.missing_at.get(L, {}).get(n, set())), None)
                if src is None:
                    if L == ctx.me:
                        durable.add(key)
                    continue
                tried[L].setdefault(key, set()).add(src)
                retry.setdefault(L, {})[key] = src
        if not retry:
            return
        out: dict[int, list[Piece]] = {}
        for L, keys in retry.items():
            for key, src in keys.items():
                if src == ctx.me:
                    n = int(plan.records[L][0]["keys"].get(key, 0))
                    out.setdefault(L, []).append(Piece(f"c:{key}", n, lambda key=key: ctx.pieces.chunk(key) or b""))
        got = ctx.transport.exchange(out)
        failed = []
        if writer is not None:
            for src in sorted(got):
                for name, data in got[src]:
                    if name.startswith("c:") and name[2:] in retry.get(ctx.me, {}):
                        writer.keep(name[2:], data, "peer")
            failed = writer.finish(report, durable)


@dataclass
class _Received:
    """What a lost node got in the first exchange: its records, the writer (replica chunks
    queued), the stripe blocks."""

    recs: list[Record]
    writer: _Writer
    stripes: Stripes


def _receive(ctx: PeerContext, plan: Plan, got: dict[int, list[tuple[str, Buffer]]],
             report: RecoveryReport) -> _Received:
    """Check the manifests, keep the records, queue the replica chunks, keep the stripe blocks."""
    t = time.perf_counter()
    items = [it for src in sorted(got) for it in got[src]]
    m = None
    for name, data in items:
        if name.startswith("m:"):
            s = int(name[2:])
            got_m = mf.Manifest.from_bytes(data, f"manifest of step {s} sent by a peer")  # checksum checked
            if got_m.step != s or got_m.job != ctx.job:
                raise TrainstoreError(f"peer recovery: a peer sent the manifest of {got_m.job}@{got_m.step} as step {s}")
            m = got_m if s == plan.step else m
            if not ctx.hot.exists(mf.manifest_key(ctx.job, s)):
                ctx.hot.put(mf.manifest_key(ctx.job, s), data)
    if m is None:
        raise TrainstoreError(f"peer recovery of step {plan.step}: no peer sent the manifest")
    recs = [rec_from_json(r) for r in plan.records[ctx.me]]
    for rec in recs:  # the node knows its own chunks again (its next protection sends everything)
        ctx.pieces.put_record(rec)
    writer = _Writer(ctx, plan.step, ctx.refs(m))
    report.phases["manifests_s"] = time.perf_counter() - t
    for name, data in items:
        if name.startswith("c:"):
            writer.keep(name[2:], data, "peer")
    stripes = Stripes.planned(ctx, plan)
    stripes.receive(items)
    return _Received(recs, writer, stripes)


def _decode(ctx: PeerContext, plan: Plan, rx: _Received, report: RecoveryReport, durable: set[str]) -> None:
    """Decode this node's slices from the completed stripes and queue their chunks; a bundle
    with a stripe left short is left to the durable tier."""
    if not ctx.policy.parity:
        return
    t = time.perf_counter()
    wanted = rx.recs[0].keys
    k, g = ctx.policy.data, ctx.policy.group
    _, pos = ctx.group_of(ctx.me)
    for rec in rx.recs:
        slices: list[Buffer] = []
        for t_ in range(k):
            if slice_span(rec.bundle_len, k, t_)[1] == 0:
                continue
            stripe = (pos - t_) % g
            blocks = rx.stripes.blocks(rec.step, stripe)
            if blocks is None:
                break
            slices.extend(decode_stripe(blocks, k, g, plan.slice_lens[(rec.step, stripe)], want=[t_]))
        else:
            if not rec.bundle:
                continue
            cut, at = _cutter(slices), 0
            for key, n in rec.bundle:
                if key in wanted and key not in durable and not ctx.hot.exists(key):
                    rx.writer.keep(key, cut(at, n), "parity")
                at += n
    report.phases["decode_s"] = time.perf_counter() - t


def _cutter(slices: list[Buffer]):  # noqa: ANN202 - a small closure factory
    """``cut(start, length)`` over the concatenation of ``slices``: a view when the range lies in
    one slice, a joined copy only when it straddles two."""
    views = [memoryview(x).cast("B") for x in slices]
    offsets, at = [], 0
    for v in views:
        offsets.append(at)
        at += v.nbytes

    def cut(start: int, length: int) -> Buffer:
        i = max(bisect.bisect_right(offsets, start) - 1, 0)
        lo = start - offsets[i]
        if lo + length <= views[i].nbytes:
            return views[i][lo:lo + length]
        parts, end = [], start + length
        for off, v in zip(offsets[i:], views[i:], strict=True):
            a, b = max(start, off), min(end, off + v.nbytes)
            if a < b:
                parts.append(v[a - off:b - off])
        return b"".join(parts)

    return cut


__all__ = ["RecoveryReport", "recover"]
