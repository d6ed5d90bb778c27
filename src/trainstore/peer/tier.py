"""``PeerTier``: the hot tiers of all nodes as one resilient tier (see ``docs/checkpoints.md``).

    peer = PeerTier(store, "run-1", PeerPolicy(data=4, parity=2), root="/nvme/peer")
    mgr = CheckpointManager(store, "run-1", ...)
    peer.attach(mgr)          # every committed save is protected in the background
    ...
    # after a node was lost and the job restarted (the new node's hot dir empty):
    result, report = peer.restore_into(mgr, state)   # local, then peers, durable for the rest

Created on every rank of a ``torch.distributed`` job, before the manager's first save (it
makes process groups, collectively). The lowest rank of each node (``NodeIdentity``) speaks
for the node; the others only take part in creating the groups. Protection runs on this
tier's own thread and its own gloo group, so it never holds up a save nor interleaves with
the checkpoint's or the training's collectives; a protection that fails (a peer lost
mid-way) is logged and counted, and the step is simply not protected.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..checkpoint.manager import CheckpointManager
from ..checkpoint.types import RestoreResult
from ..chunks import ChunkStore
from ..dcp.coordination import RANK_COMMITTED, group_timeout
from ..errors import ConfigError, DistributedError, TrainstoreError
from ..gcpause import gc_paused
from ..store.base import Store
from .context import PeerContext
from .pieces import Pieces
from .policy import NodeIdentity, PeerPolicy, identity_from_keys, node_key
from .protect import ProtectStats, protect
from .recover import RecoveryReport, recover
from .transport import Transport

log = logging.getLogger("trainstore.peer")

#: the manager event (every rank, after its save committed) that starts a protection
COMMIT_EVENT = RANK_COMMITTED


def _background_priority() -> None:
    """The protection thread yields the CPU to training and saves (Linux nices threads one by
    one): protection is background work, a save's staging copy is not."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _NICE)
    except (OSError, AttributeError):  # not Linux, or not allowed: protection runs at normal priority
        pass


#: niceness of the protection thread
_NICE = 10


@dataclass(frozen=True)
class PeerStatus:
    """One step as the peer tier sees it on this node: ``protected`` (every piece landed and
    verified on every node) and what this node holds: its own chunks (hot) and peers' pieces."""

    step: int
    protected: bool
    own_chunks: int
    own_bytes: int


class PeerTier:
    """The peer tier of one job on this rank (see the module docstring)."""

    def __init__(self, store: Store, job: str, policy: PeerPolicy, root: str, *, node: int | None = None) -> None:
        if not isinstance(policy, PeerPolicy):
            raise ConfigError(f"policy must be a PeerPolicy, got {type(policy).__name__}")
        tiers = store.tiers()
        if len(tiers) < 2:
            raise ConfigError(f"the peer tier needs a tiered store (a hot tier per node before the durable tier); "
                              f"{store.url} has one tier")
        if not (dist.is_available() and dist.is_initialized()):
            raise ConfigError("the peer tier needs an initialised torch.distributed job (one rank or more per node)")
        self.store, self.job, self.policy = store, job, policy
        rank, world = dist.get_rank(), dist.get_world_size()
        key = node_key(rank, node)  # a bad explicit node is refused before any collective
        # every rank: a control group for the small agreements (never the training's group)
        self._control = dist.new_group(backend="gloo", timeout=group_timeout())
        boot = Transport(self._control, rank, world, policy.round_bytes)
        self.node: NodeIdentity = identity_from_keys(boot.all_gather(key), rank)
        policy.check_nodes(self.node.nodes)
        group = dist.new_group(ranks=list(self.node.leaders), backend="gloo", timeout=group_timeout())
        self.stats: list[ProtectStats] = []
        self.failures: list[str] = []
        self.last_restore: RecoveryReport | None = None
        self._resend = True  # the first protection sends everything this node holds
        self._lock = threading.Lock()
        self._pending: list[Future] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainstore-peer",
                                            initializer=_background_priority)
        self.ctx: PeerContext | None = None
        if self.node.leader:
            transport = Transport(group, self.node.node, self.node.nodes, policy.round_bytes, policy.max_bytes_per_s)
            self.ctx = PeerContext(store, tiers[0], job, policy, Pieces(root), transport, ChunkStore(tiers[0]))

    # -- protection ---------------------------------------------------------------------------
    def attach(self, mgr: CheckpointManager) -> None:
        """Protect every save ``mgr`` commits, in the background (a manager observer)."""
        if mgr.job != self.job:
            raise ConfigError(f"the peer tier of job {self.job!r} cannot protect job {mgr.job!r}")
        mgr.observers.append(self.observer)

    def observer(self, event: str, fields: dict) -> None:
        if event == COMMIT_EVENT and fields.get("job") == self.job:
            self.protect_async(int(fields["step"]))

    def protect_async(self, step: int) -> Future:
        fut = self._executor.submit(self._protect_logged, step)
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [fut]
        return fut

    def protect(self, step: int) -> ProtectStats | None:
        """Protect ``step`` now (collective of every node's leader); None on a non-leader rank."""
        return self.protect_async(step).result()

    def _protect_logged(self, step: int) -> ProtectStats | None:
        if self.ctx is None:
            return None
        try:
            prev = None if self._resend else self._last_protected_record()
            st = protect(self.ctx, step, prev)
        except (TrainstoreError, OSError) as exc:
            msg = f"peer protection of step {step} failed on node {self.node.node}: {exc}"
            log.error("%s", msg)
            self.failures.append(msg)
            return None
        self._resend = self._resend and not st.protected
        self.stats.append(st)
        if not st.protected:
            self.failures.append(f"step {step}: a peer could not verify its pieces")
        return st

    def _last_protected_record(self):  # noqa: ANN202 - Record | None
        assert self.ctx is not None
        steps = self.ctx.pieces.protected_steps()
        return self.ctx.pieces.record(self.node.node, steps[-1]) if steps else None

    def wait(self) -> None:
        """Block until every protection started so far has finished."""
        with self._lock:
            pending = list(self._pending)
        for f in pending:
            f.result()

    # -- status -------------------------------------------------------------------------------
    def protected_steps(self) -> list[int]:
        return self.ctx.pieces.protected_steps() if self.ctx is not None else []

    def list(self) -> list[PeerStatus]:
        """Every step this node has a record of, and whether it is peer-protected."""
        if self.ctx is None:
            return []
        protected = set(self.ctx.pieces.protected_steps())
        out = []
        for s in self.ctx.pieces.record_steps(self.node.node):
            rec = self.ctx.pieces.record(self.node.node, s)
            if rec is not None:
                out.append(PeerStatus(s, s in protected, len(rec.keys), sum(rec.keys.values())))
        return out

    def metrics(self) -> dict[str, Any]:
        """Counters for dashboards: protected steps, bytes sent/stored, failures, last recovery."""
        last = self.stats[-1] if self.stats else None
        return {"node": self.node.node, "nodes": self.node.nodes, "policy": self.policy.describe(),
                "protected_steps": self.protected_steps(), "protections": len(self.stats),
                "failures": len(self.failures),
                "sent_bytes": sum(s.sent_bytes for s in self.stats),
                "stored_bytes": sum(s.stored_bytes for s in self.stats),
                "last_protect_seconds": last.seconds if last else None,
                "last_restore": dict(self.last_restore.bytes) if self.last_restore else None}

    # -- recovery -----------------------------------------------------------------------------
    def recover(self) -> RecoveryReport:
        """Rebuild this node's chunks of the newest protected step from peers (collective)."""
        self.wait()
        if self.ctx is None:
            report = RecoveryReport(None, [], reason="not the node's leader rank: its leader recovers the node")
        else:
            with gc_paused():  # the restart's owed full collection (gcpause) not inside the collective
                report = recover(self.ctx)
            self._resend = True  # lost nodes lost the pieces they held for others
        self.last_restore = report
        log.info("%s", report)
        return report

    def restore_into(self, mgr: CheckpointManager, state: Any) -> tuple[RestoreResult, RecoveryReport]:
        """``recover``, then ``mgr.restore_into(state)`` of the rebuilt step (or, when peers
        could not rebuild one, of the newest step the durable tier restores)."""
        report = self.recover()
        t = torch.tensor([report.step if report.step is not None else -1], dtype=torch.int64)
        try:  # non-leader ranks learn the step their node's leader rebuilt
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._control)
        except Exception as exc:
            raise DistributedError(f"peer recovery: the ranks could not agree on the step: {exc}") from exc
        step = int(t.item())
        return mgr.restore_into(state, step=step if step >= 0 else None), report

    def close(self) -> None:
        self.wait()
        self._executor.shutdown(wait=True)


__all__ = ["COMMIT_EVENT", "PeerStatus", "PeerTier"]
