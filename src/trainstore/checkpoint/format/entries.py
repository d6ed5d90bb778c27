"""The pieces of a checkpoint manifest: a tensor's entry and its chunk entries (plain chunk,
XOR delta against the base, or a packed piece), with their JSON form and validation of
hostile input (``ManifestError``). The format is described in ``manifest.py``, which
re-exports both classes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...chunks import HASH_HEX_LEN, ChunkRef
from ...digests import is_check
from ...errors import ManifestError


@dataclass(frozen=True)
class ChunkEntry:
    """One piece of a tensor: a plain chunk, or an XOR delta against the base's chunk."""

    ref: ChunkRef  # the stored chunk (the delta, for a delta entry; the pack, for a packed one)
    base: ChunkRef | None = None  # set for XOR deltas: the base full checkpoint's chunk
    content_hash: str | None = None  # BLAKE3 of the piece (deltas, packed pieces)
    same_as_base: bool = False  # ref is the base checkpoint's identical chunk (or pack)
    span: tuple[int, int] | None = None  # packed: (offset, length) of the piece in the pack's raw bytes
    #: xxh3-128 of the piece's raw bytes: what a restore checks it against (``digests``);
    #: None in manifests written before read checks (their reads check BLAKE3)
    check: str | None = None

    @property
    def size(self) -> int:
        return self.span[1] if self.span is not None else self.ref.size

    @property
    def is_delta(self) -> bool:
        return self.base is not None

    @property
    def is_packed(self) -> bool:
        return self.span is not None

    def logical_hash(self) -> str:
        """BLAKE3 of the piece's raw bytes."""
        if self.base is not None or self.span is not None:
            return self.content_hash  # type: ignore[return-value]
        return self.ref.hash

    def refs(self) -> tuple[ChunkRef, ...]:
        return (self.ref,) if self.base is None else (self.ref, self.base)

    def to_json(self) -> dict:
        out = self._json()
        if self.check is not None:  # a key older readers ignore: no format version needed
            out["check"] = self.check
        return out

    def _json(self) -> dict[str, Any]:
        if self.span is not None:
            packed: dict[str, Any] = {"pack": self.ref.to_json(), "at": list(self.span), "hash": self.content_hash}
            if self.same_as_base:
                packed["same"] = True
            return packed
        if self.base is None:
            out: dict[str, Any] = {"ref": self.ref.to_json()}
            if self.same_as_base:
                out["same"] = True
            return out
        return {"delta": self.ref.to_json(), "base": self.base.to_json(), "hash": self.content_hash}

    @classmethod
    def from_json(cls, obj: Any) -> ChunkEntry:
        if not isinstance(obj, dict):
            raise ManifestError(f"chunk entry must be an object, got {type(obj).__name__}")
        entry = cls._from_json(obj)
        check = obj.get("check")
        if check is None:
            return entry
        if not is_check(check):
            raise ManifestError(f"chunk entry of {entry.ref.hash[:12]} has a malformed read check {check!r:.80}")
        return replace(entry, check=check)

    @classmethod
    def _from_json(cls, obj: dict) -> ChunkEntry:
        if "ref" in obj:
            return cls(ChunkRef.from_json(obj["ref"]), same_as_base=bool(obj.get("same", False)))
        if "pack" in obj:
            return cls._packed_from_json(obj)
        if "delta" in obj and "base" in obj:
            ref, base = ChunkRef.from_json(obj["delta"]), ChunkRef.from_json(obj["base"])
            h = obj.get("hash")
            if not (isinstance(h, str) and len(h) == HASH_HEX_LEN):
                raise ManifestError(f"delta chunk entry has a malformed content hash {h!r:.80}")
            if ref.size != base.size:
                raise ManifestError(f"delta chunk {ref.hash[:12]} is {ref.size} bytes, its base {base.size}")
            return cls(ref, base, h)
        raise ManifestError(f"chunk entry needs 'ref', 'pack' or 'delta'+'base', got keys {sorted(obj)[:5]}")

    @classmethod
    def _packed_from_json(cls, obj: dict) -> ChunkEntry:
        ref = ChunkRef.from_json(obj["pack"])
        at, h = obj.get("at"), obj.get("hash")
        if not (isinstance(at, list) and len(at) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in at)):
            raise ManifestError(f"packed chunk entry in {ref.hash[:12]}: 'at' must be [offset, length], got {at!r:.80}")
        offset, length = at
        if offset + length > ref.size:
            raise ManifestError(f"packed chunk entry [{offset}, {offset + length}) lies outside its "
                                f"{ref.size}-byte pack {ref.hash[:12]}")
        if not (isinstance(h, str) and len(h) == HASH_HEX_LEN):
            raise ManifestError(f"packed chunk entry in {ref.hash[:12]} has a malformed content hash {h!r:.80}")
        return cls(ref, content_hash=h, same_as_base=bool(obj.get("same", False)), span=(offset, length))


@dataclass(frozen=True)
class TensorEntry:
    """A tensor or numpy array: dtype string, shape, and its chunks in order."""

    dtype: str  # "torch.<name>" or "numpy:<dtype.str>"
    shape: tuple[int, ...]
    nbytes: int
    chunks: tuple[ChunkEntry, ...]

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape), "nbytes": self.nbytes,
                "chunks": [c.to_json() for c in self.chunks]}

    @classmethod
    def from_json(cls, name: str, obj: Any) -> TensorEntry:
        if not isinstance(obj, dict):
            raise ManifestError(f"tensor {name!r}: entry must be an object")
        dtype, shape, nbytes, chunks = obj.get("dtype"), obj.get("shape"), obj.get("nbytes"), obj.get("chunks")
        if not isinstance(dtype, str) or not (dtype.startswith("torch.") or dtype.startswith("numpy:")):
            raise ManifestError(f"tensor {name!r}: bad dtype {dtype!r:.60}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ManifestError(f"tensor {name!r}: bad shape {shape!r:.80}")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ManifestError(f"tensor {name!r}: bad nbytes {nbytes!r:.40}")
        if not isinstance(chunks, list):
            raise ManifestError(f"tensor {name!r}: chunks must be a list")
        entries = tuple(ChunkEntry.from_json(c) for c in chunks)
        if sum(c.size for c in entries) != nbytes:
            raise ManifestError(f"tensor {name!r}: chunks cover {sum(c.size for c in entries)} bytes, nbytes says {nbytes}")
        return cls(dtype, tuple(shape), nbytes, entries)


__all__ = ["ChunkEntry", "TensorEntry"]
