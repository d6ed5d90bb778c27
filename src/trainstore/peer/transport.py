"""Bytes between nodes over ``torch.distributed``: named pieces, in bounded rounds.

``Transport.exchange(outgoing)`` is a collective of the peer group: every node passes what it
sends to whom (``Piece``: a name, a size and a reader called only when the piece is sent) and
gets back what every other node sent it. Each round moves at most ``round_bytes`` per
destination (plus one piece when a single piece is larger), with two ``all_to_all_single``
calls (sizes, then payload) - the only memory held is one round's frames - after one
``all_reduce`` on the number of rounds (every node knows its rounds before any byte moves).
Each piece is copied once, by torch (GIL released), into the round's send buffer, and what
arrives is handed back as views of the receive buffer, not copies. With
``max_bytes_per_s``, sleeps so a node's send rate stays under the bound. Works on gloo (CPU
tensors) and on NCCL where the group's backend is one.
"""

from __future__ import annotations

import json
import struct
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..errors import DistributedError

_LEN = struct.Struct("<Q")


@dataclass(frozen=True)
class Piece:
    """One named blob to send; ``read`` is called only in the round that sends it."""

    name: str
    size: int
    read: Callable[[], bytes | bytearray | memoryview]


def _header(items: list[tuple[str, Any]]) -> bytes:
    header = json.dumps([[n, memoryview(b).nbytes] for n, b in items]).encode()
    return _LEN.pack(len(header)) + header


def frame(items: list[tuple[str, bytes | bytearray | memoryview]]) -> bytes:
    """[header length][JSON [[name, size], ..]][bytes of each item]."""
    return b"".join([_header(items), *(bytes(b) for _, b in items)])


def unframe(data: memoryview) -> list[tuple[str, memoryview]]:
    """The items of one ``frame``; ``DistributedError`` if the frame is malformed."""
    if not data.nbytes:
        return []
    try:
        (n,) = _LEN.unpack_from(data, 0)
        header = json.loads(bytes(data[_LEN.size:_LEN.size + n]))
        out, at = [], _LEN.size + n
        for name, size in header:
            out.append((str(name), data[at:at + int(size)]))
            at += int(size)
    except (struct.error, ValueError, TypeError) as exc:
        raise DistributedError(f"peer transfer: a malformed frame of {data.nbytes} bytes ({exc})") from exc
    if at != data.nbytes:
        raise DistributedError(f"peer transfer: a frame of {data.nbytes} bytes names {at} bytes")
    return out


def _nbytes(b: bytes | bytearray | memoryview) -> int:
    return memoryview(b).nbytes


def _as_bytes(b: bytes | bytearray | memoryview) -> torch.Tensor:
    """A uint8 tensor over ``b``'s bytes, no copy (read-only buffers are only ever read)."""
    mv = memoryview(b).cast("B")
    if mv.readonly:
        with warnings.catch_warnings():  # torch warns about read-only buffers: this one is only copied from
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(mv, dtype=torch.uint8)
    return torch.frombuffer(mv, dtype=torch.uint8)


class Transport:
    """Exchanges named pieces among the members of ``group`` (see the module docstring)."""

    def __init__(self, group: Any, me: int, size: int, round_bytes: int, max_bytes_per_s: float | None = None):
        self.group, self.me, self.size = group, me, size
        self.round_bytes, self.max_bytes_per_s = round_bytes, max_bytes_per_s
        self.bytes_sent = 0  # payload bytes this node sent (all exchanges)
        self.rounds = 0

    def _plan_rounds(self, queues: dict[int, deque]) -> list[dict[int, list[Piece]]]:
        """The pieces of each round, per destination (known before any byte moves)."""
        rounds: list[dict[int, list[Piece]]] = []
        while any(queues.values()):
            this: dict[int, list[Piece]] = {}
            for dst, q in queues.items():
                items, budget = [], self.round_bytes
                while q and (not items or q[0].size <= budget):
                    p = q.popleft()
                    items.append(p)
                    budget -= p.size
                if items:
                    this[dst] = items
            rounds.append(this)
        return rounds

    def exchange(self, outgoing: dict[int, list[Piece]]) -> dict[int, list[tuple[str, memoryview]]]:
        """Send each destination its pieces; return ``{source: [(name, bytes), ..]}`` (views
        of the received buffers, no copies)."""
        queues = {d: deque(p) for d, p in outgoing.items() if p and d != self.me}
        plan = self._plan_rounds(queues)
        # one agreement on the number of rounds, not one per round
        n_rounds = torch.tensor([len(plan)], dtype=torch.int64)
        self.all_reduce(n_rounds, dist.ReduceOp.MAX)
        total = int(n_rounds.item())
        received: dict[int, list[tuple[str, memoryview]]] = {}
        t0, sent0 = time.monotonic(), self.bytes_sent
        for r in range(total):
            this = plan[r] if r < len(plan) else {}
            frames: list[list[tuple[str, Any]]] = [[] for _ in range(self.size)]
            for dst, pieces in this.items():
                frames[dst] = [(p.name, p.read()) for p in pieces]
            for src, data in self._round(frames, r + 1 < total).items():
                received.setdefault(src, []).extend(unframe(data))
            if self.max_bytes_per_s and r + 1 < total:
                ahead = (self.bytes_sent - sent0) / self.max_bytes_per_s - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        return received

    def _round(self, frames: list[list[tuple[str, Any]]], more: bool) -> dict[int, memoryview]:
        """One round: ``frames[dst]`` are the (name, bytes) items for ``dst``. Every item is
        copied once, straight into the send buffer (by torch, which releases the GIL), and
        what arrives is returned as views of the receive buffer."""
        headers = [_header(items) if items else b"" for items in frames]
        send_splits = [len(h) + sum(_nbytes(b) for _, b in items) if items else 0
                       for h, items in zip(headers, frames, strict=True)]
        out_sizes = torch.tensor(send_splits, dtype=torch.int64)
        in_sizes = torch.empty(self.size, dtype=torch.int64)
        send = torch.empty(sum(send_splits), dtype=torch.uint8)
        at = 0
        for h, items in zip(headers, frames, strict=True):
            for part in ([h] if h else []) + [b for _, b in items]:
                n = _nbytes(part)
                if n:
                    send[at:at + n].copy_(_as_bytes(part))
                at += n
        try:
            dist.all_to_all_single(in_sizes, out_sizes, group=self.group)
            recv_splits = [int(x) for x in in_sizes]
            recv = torch.empty(sum(recv_splits), dtype=torch.uint8)
            dist.all_to_all_single(recv, send, output_split_sizes=recv_splits, input_split_sizes=send_splits,
                                   group=self.group)
        except Exception as exc:
            raise DistributedError(f"peer transfer round failed on node {self.me} (a peer died or stopped "
                                   f"answering): {type(exc).__name__}: {exc}") from exc
        self.rounds += 1
        self.bytes_sent += sum(send_splits)
        buf, out, at = memoryview(recv.numpy()).cast("B"), {}, 0
        for src, n in enumerate(recv_splits):
            if n:
                out[src] = buf[at:at + n]
            at += n
        return out

    def all_reduce(self, t: torch.Tensor, op: Any) -> None:
        try:
            dist.all_reduce(t, op=op, group=self.group)
        except Exception as exc:
            raise DistributedError(f"peer agreement failed on node {self.me} (a peer died or stopped "
                                   f"answering): {type(exc).__name__}: {exc}") from exc

    def all_gather(self, obj: Any) -> list[Any]:
        """Every member's ``obj`` (JSON, never pickle: nothing a peer sends is executed), in
        member order."""
        data = json.dumps(obj).encode()
        try:
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
            dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=self.group)
            n = max(int(s.item()) for s in sizes)
            bufs = [torch.empty(n, dtype=torch.uint8) for _ in range(self.size)]
            mine = torch.zeros(n, dtype=torch.uint8)
            mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            dist.all_gather(bufs, mine, group=self.group)
        except Exception as exc:
            raise DistributedError(f"peer agreement failed on node {self.me} (a peer died or stopped "
                                   f"answering): {type(exc).__name__}: {exc}") from exc
        return [json.loads(b[:int(s.item())].numpy().tobytes()) for b, s in zip(bufs, sizes, strict=True)]


__all__ = ["Piece", "Transport", "frame", "unframe"]
