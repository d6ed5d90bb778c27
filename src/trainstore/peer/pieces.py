"""What one node keeps for the peer tier, in its own directory (a ``LocalStore``):

    records/<owner>/<step>.json    what ``owner`` held of ``step``: every chunk key and size,
                                   and the bundle (its new chunks, in order) for parity
    chunks/..                      whole replicas of other nodes' chunks (content-addressed,
                                   the same keys as the checkpoint store)
    parity/<step>/<stripe>.<j>     parity block ``j`` of a stripe, and ``.json`` beside it: its
                                   BLAKE3, so a corrupt block is found before it is used
    protected/<step>.json          the step landed and verified on every node of the job

Records are JSON read with checks (a malformed one is ignored as absent and logged): peers
never execute what they stored for each other.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..chunks import content_hash
from ..errors import IntegrityError, NotFoundError
from ..store.base import Store
from ..store.local import LocalStore

log = logging.getLogger("trainstore.peer")


@dataclass(frozen=True)
class Record:
    """What ``owner`` held of ``step``: ``keys`` (chunk key -> stored size) and ``bundle``
    (its new chunks in bundle order, parity only)."""

    owner: int
    step: int
    keys: dict[str, int]
    bundle: tuple[tuple[str, int], ...] = field(default=())
    slices: tuple[str, ...] = field(default=())  # BLAKE3 of each data slice of the bundle (parity; may be absent)

    @property
    def bundle_len(self) -> int:
        return sum(n for _, n in self.bundle)

    def to_bytes(self) -> bytes:
        return json.dumps({"owner": self.owner, "step": self.step, "keys": self.keys,
                           "bundle": [list(b) for b in self.bundle], "slices": list(self.slices)},
                          sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, where: str) -> Record:
        try:
            obj = json.loads(bytes(data))
            keys = {str(k): int(v) for k, v in obj["keys"].items()}
            bundle = tuple((str(k), int(n)) for k, n in obj["bundle"])
            slices = tuple(obj.get("slices", []))
            if not all(isinstance(h, str) for h in slices):
                raise TypeError("slice hashes must be strings")
            rec = cls(int(obj["owner"]), int(obj["step"]), keys, bundle, slices)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise IntegrityError(f"peer record {where} is malformed: {exc}") from exc
        if any(n < 0 for n in keys.values()) or any(n < 0 for _, n in bundle):
            raise IntegrityError(f"peer record {where} has a negative size")
        return rec


def _step_key(step: int) -> str:
    return f"{step:012d}"


class Pieces:
    """The peer tier's files on one node (see the module docstring)."""

    def __init__(self, root: str) -> None:
        self.store: Store = LocalStore(root, fsync=True)
        self.root = root

    # records
    def put_record(self, rec: Record) -> None:
        self.store.put(f"records/{rec.owner:06d}/{_step_key(rec.step)}.json", rec.to_bytes())

    def record(self, owner: int, step: int) -> Record | None:
        key = f"records/{owner:06d}/{_step_key(step)}.json"
        try:
            return Record.from_bytes(self.store.get(key), key)
        except NotFoundError:
            return None
        except IntegrityError as exc:
            log.warning("peer tier: ignoring %s", exc)
            return None

    def record_steps(self, owner: int) -> list[int]:
        out = []
        for meta in self.store.list(f"records/{owner:06d}/"):
            name = meta.key.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                out.append(int(name[:-5]))
        return sorted(out)

    def owners(self) -> list[int]:
        return sorted({int(m.key.split("/")[1]) for m in self.store.list("records/") if m.key.split("/")[1].isdigit()})

    # replicas
    def put_chunk(self, key: str, data: bytes) -> None:
        self.store.put(key, data)

    def chunk(self, key: str) -> bytes | None:
        try:
            return bytes(self.store.get(key))
        except NotFoundError:
            return None

    def chunk_keys(self) -> Iterator[str]:
        return (m.key for m in self.store.list("chunks/"))

    # parity
    def put_parity(self, step: int, stripe: int, j: int, block: bytes) -> None:
        base = f"parity/{_step_key(step)}/{stripe}.{j}"
        self.store.put(base, block)
        self.store.put(base + ".json", json.dumps({"blake3": content_hash(block), "size": len(block)}).encode())

    def parity(self, step: int, stripe: int, j: int) -> bytes | None:
        """The verified block, or None when absent or corrupt (``IntegrityError`` logged by the caller)."""
        base = f"parity/{_step_key(step)}/{stripe}.{j}"
        try:
            block = bytes(self.store.get(base))
            meta = json.loads(bytes(self.store.get(base + ".json")))
        except NotFoundError:
            return None
        except ValueError as exc:
            raise IntegrityError(f"peer parity block {base}: its hash record is malformed ({exc})") from exc
        if content_hash(block) != meta.get("blake3"):
            raise IntegrityError(f"peer parity block {base} of {self.root}: content does not match its hash")
        return block

    def parity_blocks(self, step: int) -> set[tuple[int, int]]:
        """``(stripe, j)`` of every parity block of ``step`` held here, with its hash record:
        one listing, no block read (a recovery checks a block when it sends it)."""
        names = {m.key.rsplit("/", 1)[-1] for m in self.store.list(f"parity/{_step_key(step)}/")}
        out = set()
        for name in names:
            stripe, _, j = name.partition(".")
            if stripe.isdigit() and j.isdigit() and f"{name}.json" in names:
                out.add((int(stripe), int(j)))
        return out

    def parity_steps(self) -> list[int]:
        return sorted({int(m.key.split("/")[1]) for m in self.store.list("parity/")})

    # protected markers
    def mark_protected(self, step: int, info: dict) -> None:
        self.store.put(f"protected/{_step_key(step)}.json", json.dumps(info, sort_keys=True).encode())

    def protected_steps(self) -> list[int]:
        out = []
        for meta in self.store.list("protected/"):
            name = meta.key.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                out.append(int(name[:-5]))
        return sorted(out)

    def delete_prefix(self, prefix: str) -> None:
        for meta in list(self.store.list(prefix)):
            self.store.delete(meta.key)

    def delete(self, key: str) -> None:
        self.store.delete(key)


__all__ = ["Pieces", "Record"]
