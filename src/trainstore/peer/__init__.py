"""The peer tier: checkpoints protected by the other nodes' hot tiers (replicas or zfec parity),
rebuilt after a node loss without the durable tier. See ``tier.PeerTier`` and
``docs/checkpoints.md`` ("Peer tier")."""

from .plan import Plan
from .policy import NODE_ENV, NodeIdentity, PeerPolicy
from .protect import ProtectStats
from .recover import RecoveryReport
from .tier import COMMIT_EVENT, PeerStatus, PeerTier

__all__ = ["COMMIT_EVENT", "NODE_ENV", "NodeIdentity", "PeerPolicy", "PeerStatus", "PeerTier", "Plan",
           "ProtectStats", "RecoveryReport"]
