"""Opt-in lossy optimizer moments: which tensors, which codec, and what a checkpoint says.

``CheckpointPolicy(optimizer_moments=...)``:

* ``"lossless"`` (default): every tensor is stored bit-exact.
* ``"bf16"``: Adam/AdamW moments rounded to bfloat16 (``lossy-bf16``).
* ``"int8-blockwise"``: moments as 8-bit codes with per-block scales on a log map
  (``lossy-q8`` for ``exp_avg``, ``lossy-q8-sqrt`` for ``exp_avg_sq``; codecs_lossy.py).

A tensor is a moment by its place in the flattened state: its ``/``-joined name ends in
``state/<int>/exp_avg`` or ``state/<int>/exp_avg_sq`` (a torch optimizer's ``state_dict()``
anywhere in the state, e.g. ``optim/state/3/exp_avg``), and it is float32. Everything else
(parameters, ``step`` counters, other dtypes, other optimizers' state) stays lossless, as
does a piece that is not finite (NaN/inf) or, for ``exp_avg_sq``, has a negative value.

Lossy pieces are always stored whole (plain chunks), in incrementals too: an XOR delta
against a quantized base makes no sense, and a full checkpoint's lossy chunk is never used
as a delta base (``usable_as_base``). Identical pieces still dedup by content hash. The
chunk's hash is that of its decoded bytes, so reads, ``verify`` and repair check lossy
chunks exactly like the others. The manifest says the checkpoint is lossy twice: every
chunk records its codec, and ``metadata["lossy"]`` = ``{"optimizer_moments": mode,
"tensors": [names]}``; ``LossyReport.of(manifest)`` (on ``RestoreResult.lossy``) reads the
chunk codecs, which cannot disagree with the bytes.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ...bytebudget import ByteBudget
from ...chunks import ChunkStore, content_hash
from ...codecs import LOSSY_CODECS, decode, encode
from ...codecs_lossy import encodable
from ...errors import ConfigError
from ..format.delta import PieceResult
from ..format.manifest import ChunkEntry, Manifest, TensorEntry
from .pool import lower_thread_priority
from .staging import StagedTensor
from .writer import WriteOptions, WriteStats, default_cpu_threads

OPTIMIZER_MOMENTS = ("lossless", "bf16", "int8-blockwise")
MOMENT_NAMES = ("exp_avg", "exp_avg_sq")
_FLOAT32 = ("torch.float32", "numpy:<f4")
_CODECS = {"bf16": {"exp_avg": "lossy-bf16", "exp_avg_sq": "lossy-bf16"},
           "int8-blockwise": {"exp_avg": "lossy-q8", "exp_avg_sq": "lossy-q8-sqrt"}}


def check_mode(mode: Any) -> str:
    if mode not in OPTIMIZER_MOMENTS:
        raise ConfigError(f"optimizer_moments must be one of {OPTIMIZER_MOMENTS}, got {mode!r:.60}")
    return mode


def moment_kind(name: str) -> str | None:
    """``"exp_avg"``/``"exp_avg_sq"`` when ``name`` is an optimizer moment's place, else None."""
    parts = name.split("/")
    if len(parts) >= 3 and parts[-1] in MOMENT_NAMES and parts[-2].isdigit() and parts[-3] == "state":
        return parts[-1]
    return None


def lossy_codecs(tensors: list[tuple[str, str]], mode: str) -> dict[str, str]:
    """{name: lossy codec} for the (name, dtype) pairs that ``mode`` stores lossy."""
    table = _CODECS.get(check_mode(mode))
    if table is None:
        return {}
    out = {}
    for name, dtype in tensors:
        kind = moment_kind(name)
        if kind is not None and dtype in _FLOAT32:
            out[name] = table[kind]
    return out


def put_lossy(chunks: ChunkStore, data: memoryview, codec: str, level: int,
              cpu: AbstractContextManager[Any] | None = None) -> PieceResult | None:
    """Store one float32 piece with a lossy ``codec`` (a plain chunk named by the hash of its
    decoded bytes); None when the piece cannot be (not finite, negative ``exp_avg_sq``)."""
    with cpu or contextlib.nullcontext():
        if not encodable(data, codec):
            return None
        decoded = decode(encode(data, codec, 4, level=level), codec, data.nbytes)
        digest = content_hash(decoded)
    # encoding is deterministic: put's own encode of ``data`` gives the bytes hashed above
    res = chunks.put(data, codec, 4, digest=digest, cpu=cpu)
    return PieceResult(ChunkEntry(res.ref), res.ref.stored if res.written else 0, res.ref.stored)


def write_lossy(chunks: ChunkStore, staged: list[StagedTensor], codecs: dict[str, str], opts: WriteOptions,
                cancel: threading.Event | None = None) -> tuple[dict[str, TensorEntry], WriteStats]:
    """Store the tensors named in ``codecs`` (name -> lossy codec) as plain lossy chunks cut
    like ``writer.write_tensors`` cuts them, on ``opts.workers`` threads under the same byte
    budget and core limit; a piece that cannot be lossy is stored with ``opts.codec``."""
    budget = ByteBudget(opts.max_inflight_bytes)
    cpu = threading.BoundedSemaphore(opts.cpu_threads or default_cpu_threads())
    stats = WriteStats()

    def work(data: memoryview, codec: str, itemsize: int) -> PieceResult:
        found = put_lossy(chunks, data, codec, opts.level, cpu)
        if found is not None:
            return found
        res = chunks.put(data, opts.codec, itemsize, cpu=cpu)
        return PieceResult(ChunkEntry(res.ref), res.ref.stored if res.written else 0, res.ref.stored)

    futures: dict[str, list[Future[PieceResult]]] = {}
    with ThreadPoolExecutor(max_workers=opts.workers, thread_name_prefix="trainstore-ckpt-lossy",
                            initializer=lower_thread_priority, initargs=(opts.nice,)) as pool:
        try:
            for t in staged:
                futs = futures[t.name] = []
                for start in range(0, t.data.nbytes, opts.chunk_bytes):
                    if cancel is not None and cancel.is_set():
                        raise ConfigError("checkpoint save cancelled")
                    piece = t.data[start:start + opts.chunk_bytes]
                    futs.append(budget.submit(pool, piece.nbytes, work, piece, codecs[t.name], t.itemsize))
            entries = {}
            for t in staged:
                pieces = [f.result() for f in futures[t.name]]
                stats.pieces += len(pieces)
                stats.written_bytes += sum(p.written for p in pieces)
                stats.stored_bytes += sum(p.owned for p in pieces)
                stats.logical_bytes += t.data.nbytes
                entries[t.name] = TensorEntry(t.dtype, t.shape, t.data.nbytes, tuple(p.entry for p in pieces))
        except BaseException:
            for futs in futures.values():
                for f in futs:
                    f.cancel()
            raise
    return entries, stats


def usable_as_base(entry: ChunkEntry) -> bool:
    """Whether an incremental may XOR against (or reference) this base chunk: not a lossy
    one (its bytes are not the staged tensor's)."""
    return entry.ref.codec not in LOSSY_CODECS


def is_lossy(t: TensorEntry) -> bool:
    return any(c.ref.codec in LOSSY_CODECS for c in t.chunks)


@dataclass(frozen=True)
class LossyReport:
    """Which tensors of a checkpoint were stored lossy, and with which codecs."""

    mode: str  # the policy's optimizer_moments when it was saved ("?" if not recorded)
    tensors: tuple[str, ...]
    codecs: tuple[str, ...]

    @classmethod
    def of(cls, manifest: Manifest) -> LossyReport | None:
        names = tuple(n for n, t in manifest.tensors.items() if is_lossy(t))
        if not names:
            return None
        codecs = sorted({c.ref.codec for n in names for c in manifest.tensors[n].chunks} & set(LOSSY_CODECS))
        recorded = manifest.metadata.get("lossy")
        mode = recorded.get("optimizer_moments", "?") if isinstance(recorded, dict) else "?"
        return cls(str(mode), names, tuple(codecs))

    def to_json(self) -> dict:
        return {"optimizer_moments": self.mode, "tensors": list(self.tensors)}

    def __str__(self) -> str:
        return (f"LOSSY checkpoint: {len(self.tensors)} optimizer moment tensors stored {self.mode} "
                f"({', '.join(self.codecs)}), not bit-exact")


def summary(entries: dict[str, TensorEntry], mode: str) -> dict | None:
    """``metadata["lossy"]`` for the written entries (None: nothing was stored lossy)."""
    names = [n for n, t in entries.items() if is_lossy(t)]
    return {"optimizer_moments": mode, "tensors": names} if names else None


def policy_mode(policy: Any) -> str:
    """A policy's ``optimizer_moments`` (policies without the option, e.g. ObjectivePolicy: lossless)."""
    return check_mode(getattr(policy, "optimizer_moments", "lossless"))


__all__ = ["LossyReport", "MOMENT_NAMES", "OPTIMIZER_MOMENTS", "check_mode", "is_lossy", "lossy_codecs",
           "moment_kind", "policy_mode", "put_lossy", "summary", "usable_as_base", "write_lossy"]
