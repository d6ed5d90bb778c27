"""Ranks of the node-loss tests (tests/reliability/test_node_loss.py): one gloo rank per "node",
each with its own hot directory and peer directory, one durable directory counted by reads."""

from __future__ import annotations

import os
import signal
import threading

import torch

from trainstore.checkpoint import CheckpointManager, CheckpointPolicy
from trainstore.checkpoint.save.writer import WriteOptions
from trainstore.peer import PeerPolicy, PeerTier
from trainstore.peer.transport import Transport
from trainstore.store import Buffer, LocalStore, Store, TieredStore
from trainstore.store.base import ForwardingStore

OPTIONS = WriteOptions(chunk_bytes=4096, workers=1, pack_below=0)


class CountingDurable(ForwardingStore):
    """The durable tier, counting the bytes its reads return (chunks apart)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.bytes_read = 0
        self.chunk_bytes_read = 0
        self.keys_read: list[str] = []
        self._lock = threading.Lock()

    def _count(self, key: str, data: Buffer) -> Buffer:
        with self._lock:
            self.bytes_read += memoryview(data).nbytes
            self.keys_read.append(key)
            if key.startswith("chunks/"):
                self.chunk_bytes_read += memoryview(data).nbytes
        return data

    def get(self, key: str) -> Buffer:
        return self._count(key, self.inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> Buffer:
        return self._count(key, self.inner.get_range(key, start, length))

    def get_ranges(self, key, ranges):  # noqa: ANN001, ANN201
        return [self._count(key, b) for b in self.inner.get_ranges(key, ranges)]


def policy_of(args: dict) -> PeerPolicy:
    return PeerPolicy(**args["policy"])


def node_state(rank: int, step: int, zero: bool = False) -> dict:
    """Rank-owned tensors (distinct names per rank: each node writes its own chunks); an
    incremental step changes one tensor only."""
    g = torch.Generator().manual_seed(1000 * rank + 7)
    a = torch.randn(4096, generator=g)  # 16 KiB: four chunks
    b = torch.randn(2048, generator=g)
    if step >= 20:
        b = b + step
    if zero:
        a, b = torch.zeros_like(a), torch.zeros_like(b)
    return {"model": {f"a{rank}": a, f"b{rank}": b}}


def _open(args: dict, rank: int) -> tuple[Store, CountingDurable]:
    durable = CountingDurable(LocalStore(os.path.join(args["root"], "durable")))
    hot = LocalStore(os.path.join(args["root"], f"hot{rank}"))
    return TieredStore(hot, durable), durable


def _peer(args: dict, rank: int, store: Store) -> PeerTier:
    return PeerTier(store, "j", policy_of(args), os.path.join(args["root"], f"peer{rank}"), node=rank)


def save(rank: int, world: int, args: dict) -> dict:
    """Save args["steps"] (first full, then incremental), each protected by the peers."""
    store, _ = _open(args, rank)
    peer = _peer(args, rank, store)
    kill = args.get("kill")  # {"rank": r, "step": s, "round": n}: SIGKILL that rank mid-transfer
    if kill and kill["rank"] == rank:
        _kill_in_round(peer, kill)
    mgr = CheckpointManager(store, "j", CheckpointPolicy(full_every=100, incremental_every=10), options=OPTIONS)
    peer.attach(mgr)
    for i, step in enumerate(args["steps"]):
        mgr.save(step, node_state(rank, step), kind="full" if i == 0 else "incremental", blocking=True)
        peer.wait()
    mgr.close()
    peer.close()
    return {"protected": peer.protected_steps(), "failures": len(peer.failures),
            "stats": [[s.step, s.protected, s.own_bytes, s.new_bytes, s.sent_bytes, s.stored_bytes]
                      for s in peer.stats],
            "list": [[s.step, s.protected] for s in peer.list()], "metrics": peer.metrics()}


def _kill_in_round(peer: PeerTier, kill: dict) -> None:
    """Make this rank die (SIGKILL) in the middle of the transfer rounds of step kill["step"]."""
    transport = peer.ctx.transport
    orig = transport._round
    state = {"step": None, "rounds": 0}
    observer = peer.observer

    def watch(event: str, fields: dict) -> None:
        if fields.get("step") == kill["step"]:
            state["step"] = kill["step"]
        observer(event, fields)

    def round_(frames, more):  # noqa: ANN001, ANN202
        if state["step"] is not None:
            state["rounds"] += 1
            if state["rounds"] >= kill["round"]:
                os.kill(os.getpid(), signal.SIGKILL)
        return orig(frames, more)

    peer.observer = watch  # type: ignore[method-assign]
    transport._round = round_  # type: ignore[method-assign]


def restore(rank: int, world: int, args: dict) -> dict:
    """A restarted job: recover from peers, restore, compare bit for bit; count durable reads."""
    store, durable = _open(args, rank)
    peer = _peer(args, rank, store)
    mgr = CheckpointManager(store, "j", CheckpointPolicy(full_every=100, incremental_every=10), options=OPTIONS)
    target = node_state(rank, 0, zero=True)
    before = durable.bytes_read
    result, report = peer.restore_into(mgr, target)
    expect = node_state(rank, result.step)
    same = all(torch.equal(target["model"][k], v) for k, v in expect["model"].items())
    mgr.close()
    peer.close()
    return {"step": result.step, "peer_step": report.step, "same": same, "bytes": report.bytes,
            "corrupt": report.corrupt, "lost": report.lost, "reason": report.reason,
            "durable_read": durable.bytes_read - before, "durable_keys": durable.keys_read[:8], "durable_chunk_read": durable.chunk_bytes_read}


__all__ = ["CountingDurable", "Transport", "node_state", "restore", "save"]
