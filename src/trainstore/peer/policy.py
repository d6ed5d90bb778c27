"""What the peer tier protects with (``PeerPolicy``) and which node a rank is on (``NodeIdentity``).

``PeerPolicy(replicas=1)``: every node's chunks also live, whole, on the next ``replicas``
nodes. ``PeerPolicy(data=4, parity=2)``: nodes form groups of ``data + parity``; each node's
chunks are cut into ``data`` slices and every group member holds ``parity`` stripes of
Reed-Solomon parity (zfec), so any ``parity`` lost nodes of a group are rebuilt at
``1 + parity/data`` times the bytes. Settings are checked against the node count before any
transfer (``check_nodes``): a wrong one is a ``ConfigError`` naming the numbers.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from ..errors import ConfigError

#: explicit node index of this rank (tests run several "nodes" on one machine)
NODE_ENV = "TRAINSTORE_NODE"


def _count(name: str, v: object, low: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ConfigError(f"PeerPolicy.{name} must be an int >= {low}, got {v!r}")
    return v


@dataclass(frozen=True)
class PeerPolicy:
    """How each node's chunks are protected by its peers (see the module docstring).

    ``round_bytes`` bounds what one node sends to one peer per transfer round (its memory);
    ``max_bytes_per_s`` (optional) bounds its send rate, so protection never competes hard
    with training traffic; ``keep_steps`` protected steps keep their peer pieces."""

    replicas: int = 0
    data: int = 0
    parity: int = 0
    round_bytes: int = 32 << 20
    max_bytes_per_s: float | None = None
    keep_steps: int = 2

    def __post_init__(self) -> None:
        _count("replicas", self.replicas, 0)
        _count("data", self.data, 0)
        _count("parity", self.parity, 0)
        _count("round_bytes", self.round_bytes, 1)
        _count("keep_steps", self.keep_steps, 1)
        coded = self.data or self.parity
        if bool(self.replicas) == bool(coded):
            raise ConfigError(f"PeerPolicy needs either replicas >= 1 or data >= 1 and parity >= 1, not both or "
                              f"neither (got replicas={self.replicas}, data={self.data}, parity={self.parity})")
        if coded and (self.data < 1 or self.parity < 1):
            raise ConfigError(f"PeerPolicy(data={self.data}, parity={self.parity}): erasure coding needs "
                              f"data >= 1 and parity >= 1")
        if coded and self.data + self.parity > 256:
            raise ConfigError(f"PeerPolicy(data={self.data}, parity={self.parity}): a group of more than 256 "
                              "pieces is beyond the Reed-Solomon code (zfec)")
        if self.max_bytes_per_s is not None and not self.max_bytes_per_s > 0:
            raise ConfigError(f"PeerPolicy.max_bytes_per_s must be positive, got {self.max_bytes_per_s!r}")

    @property
    def mode(self) -> str:
        return "replicas" if self.replicas else "parity"

    @property
    def group(self) -> int:
        """Nodes per protection group: ``data + parity``, or every node for replicas."""
        return self.data + self.parity

    @property
    def tolerates(self) -> int:
        """Lost nodes survived: any ``replicas`` nodes, or ``parity`` per group."""
        return self.replicas or self.parity

    @property
    def overhead(self) -> float:
        """Peer bytes stored per byte of checkpoint: ``replicas`` or ``parity / data``."""
        return float(self.replicas) if self.replicas else self.parity / self.data

    def describe(self) -> str:
        return f"replicas={self.replicas}" if self.replicas else f"data={self.data}, parity={self.parity}"

    def check_nodes(self, nodes: int) -> None:
        """``ConfigError`` naming the numbers when this policy cannot run on ``nodes`` nodes."""
        if self.replicas:
            if self.replicas >= nodes:
                raise ConfigError(f"PeerPolicy(replicas={self.replicas}) needs more than {self.replicas} nodes, "
                                  f"the job has {nodes}: each copy must live on another node (use replicas <= "
                                  f"{max(nodes - 1, 0)})")
            return
        if self.group > nodes:
            raise ConfigError(f"PeerPolicy(data={self.data}, parity={self.parity}): a group of {self.group} nodes "
                              f"is larger than the job's {nodes} nodes; pick data + parity <= {nodes}")
        if nodes % self.group:
            raise ConfigError(f"PeerPolicy(data={self.data}, parity={self.parity}): groups of {self.group} nodes "
                              f"do not divide the job's {nodes} nodes; pick data + parity dividing {nodes}")


@dataclass(frozen=True)
class NodeIdentity:
    """This rank's node (``node`` of ``nodes``) and whether it speaks for the node (``leader``:
    the lowest rank on it). ``leaders[n]`` is node n's leader rank."""

    node: int
    nodes: int
    leader: bool
    leaders: tuple[int, ...]


def node_key(rank: int, explicit: int | None = None) -> str:
    """What names this rank's node before ranks compare notes: an explicit index (argument,
    or ``TRAINSTORE_NODE``), else the node of ``LOCAL_WORLD_SIZE``, else the hostname."""
    if explicit is None and os.environ.get(NODE_ENV, "").strip():
        raw = os.environ[NODE_ENV].strip()
        if not raw.isdigit():
            raise ConfigError(f"{NODE_ENV} must be a node index (a non-negative int), got {raw!r}")
        explicit = int(raw)
    if explicit is not None:
        if not isinstance(explicit, int) or isinstance(explicit, bool) or explicit < 0:
            raise ConfigError(f"a node index must be a non-negative int, got {explicit!r}")
        return f"node:{explicit:09d}"
    lws = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if lws.isdigit() and int(lws) > 0:
        return f"node:{rank // int(lws):09d}"
    return f"host:{socket.gethostname()}"


def identity_from_keys(keys: list[str], rank: int) -> NodeIdentity:
    """The identity of ``rank`` from every rank's ``node_key`` (nodes numbered in key order)."""
    order = sorted(set(keys))
    leaders = tuple(min(r for r, k in enumerate(keys) if k == name) for name in order)
    node = order.index(keys[rank])
    return NodeIdentity(node=node, nodes=len(order), leader=leaders[node] == rank, leaders=leaders)


__all__ = ["NODE_ENV", "NodeIdentity", "PeerPolicy", "identity_from_keys", "node_key"]
