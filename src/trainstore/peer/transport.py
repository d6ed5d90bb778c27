"""Bytes between nodes over ``torch.distributed``: named pieces, in bounded rounds.

``Transport.exchange(outgoing)`` is a collective of the peer group: every node passes what it
sends to whom (``Piece``: a name, a size and a reader called only when the piece is sent) and
gets back what every other node sent it. Each round moves at most ``round_bytes`` per
destination (plus one piece when a single piece is larger), with two ``all_to_all_single``
calls (sizes, then payload) - the only memory held is one round's frames - and, with
``max_bytes_per_s``, sleeps so a node's send rate stays under the bound. Works on gloo (CPU
tensors) and on NCCL where the group's backend is one.
"""

from __future__ import annotations

import json
import struct
import time
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


def frame(items: list[tuple[str, bytes | bytearray | memoryview]]) -> bytes:
    """[header length][JSON [[name, size], ..]][bytes of each item]."""
    header = json.dumps([[n, memoryview(b).nbytes] for n, b in items]).encode()
    return b"".join([_LEN.pack(len(header)), header, *(bytes(b) for _, b in items)])


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


class Transport:
    """Exchanges named pieces among the members of ``group`` (see the module docstring)."""

    def __init__(self, group: Any, me: int, size: int, round_bytes: int, max_bytes_per_s: float | None = None):
        self.group, self.me, self.size = group, me, size
        self.round_bytes, self.max_bytes_per_s = round_bytes, max_bytes_per_s
        self.bytes_sent = 0  # payload bytes this node sent (all exchanges)
        self.rounds = 0

    def exchange(self, outgoing: dict[int, list[Piece]]) -> dict[int, list[tuple[str, bytes]]]:
        """Send each destination its pieces; return ``{source: [(name, bytes), ..]}``."""
        queues = {d: deque(p) for d, p in outgoing.items() if p and d != self.me}
        received: dict[int, list[tuple[str, bytes]]] = {}
        t0, sent0 = time.monotonic(), self.bytes_sent
        while True:
            frames = [b""] * self.size
            for dst, q in queues.items():
                items, budget = [], self.round_bytes
                while q and (not items or q[0].size <= budget):
                    p = q.popleft()
                    items.append((p.name, p.read()))
                    budget -= p.size
                frames[dst] = frame(items) if items else b""
            more = any(queues.values())
            for src, data in self._round(frames, more).items():
                received.setdefault(src, []).extend((n, bytes(b)) for n, b in unframe(memoryview(data)))
            if self._anyone_more(more) == 0:
                return received
            if self.max_bytes_per_s:
                ahead = (self.bytes_sent - sent0) / self.max_bytes_per_s - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)

    def _round(self, frames: list[bytes], more: bool) -> dict[int, bytes]:
        out_sizes = torch.tensor([len(f) for f in frames], dtype=torch.int64)
        in_sizes = torch.empty(self.size, dtype=torch.int64)
        try:
            dist.all_to_all_single(in_sizes, out_sizes, group=self.group)
            send = torch.frombuffer(bytearray(b"".join(frames)) or bytearray(1), dtype=torch.uint8)
            recv = torch.empty(max(int(in_sizes.sum()), 1), dtype=torch.uint8)
            send_splits = [len(f) for f in frames]
            recv_splits = [int(x) for x in in_sizes]
            if sum(send_splits) == 0:
                send = send[:0]
            if sum(recv_splits) == 0:
                recv = recv[:0]
            dist.all_to_all_single(recv, send, output_split_sizes=recv_splits, input_split_sizes=send_splits,
                                   group=self.group)
        except Exception as exc:
            raise DistributedError(f"peer transfer round failed on node {self.me} (a peer died or stopped "
                                   f"answering): {type(exc).__name__}: {exc}") from exc
        self.rounds += 1
        self.bytes_sent += sum(len(f) for f in frames)
        buf, out, at = recv.numpy().tobytes(), {}, 0
        for src, n in enumerate(recv_splits):
            if n:
                out[src] = buf[at:at + n]
            at += n
        return out

    def _anyone_more(self, more: bool) -> int:
        flag = torch.tensor([1 if more else 0], dtype=torch.int64)
        self.all_reduce(flag, dist.ReduceOp.MAX)
        return int(flag.item())

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
