"""Sequence packing: variable-length token documents into fixed-length training sequences.

``PackedLoader(loader, PackingConfig(seq_len=2048, column="tokens"))`` reads a ``Loader``'s
batches of documents (a column of token lists) and yields batches of ``batch_size`` packed
sequences. Each loader batch is one *packing window*: its documents (in the loader's
deterministic order) are packed on their own, so the output depends only on the loader's plan
(seed, epoch) and a resumed run repacks exactly what it had. The last sequence of a window is
padded; a larger loader batch means fewer padded sequences.

Modes:

* ``concat``: documents concatenated in order and cut every ``seq_len`` tokens (a document may
  continue in the next sequence). With ``split_docs=False`` a document that does not fit the
  rest of the current sequence starts a new one (the rest is padding).
* ``first-fit``: documents sorted by length (longest first, stable) and each put into the
  first sequence with room for it (greedy first-fit decreasing): less padding, order mixed.

A document longer than ``seq_len`` is cut into ``seq_len`` pieces in every mode (each piece its
own attention segment); so every token of every document appears exactly once per epoch.

Per batch: ``input_ids`` (B, L), ``position_ids`` (B, L; restarting at 0 for each document
piece), ``doc_ids`` (B, L; 1, 2, ... per piece within a sequence, 0 = padding), ``cu_seqlens``
(int32 boundaries of every piece and padding run over the flattened B*L tokens, for
flash-attention varlen kernels) and ``max_seqlen``. ``block_attention_mask(doc_ids)`` builds the
(B, L, L) causal same-document mask for kernels that take a dense mask.

``state_dict()`` = the loader's state before the oldest window not yet fully returned, plus how
many of that window's sequences were returned; ``load_state_dict`` resumes after the last batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

from ...errors import ConfigError, SchemaError
from .loader import Loader

STATE_FORMAT = "trainstore.packed-loader/1"
PACKING_MODES = ("concat", "first-fit")


@dataclass(frozen=True)
class PackingConfig:
    seq_len: int
    batch_size: int = 8  # packed sequences per batch
    column: str = "tokens"
    mode: str = "concat"
    split_docs: bool = True  # concat only: a document may continue in the next sequence
    pad_id: int = 0
    drop_last: bool = False  # drop the epoch's last batch when it has fewer than batch_size sequences

    def __post_init__(self) -> None:
        if self.seq_len <= 0 or self.batch_size <= 0:
            raise ConfigError(f"seq_len and batch_size must be positive, got {self.seq_len}, {self.batch_size}")
        if self.mode not in PACKING_MODES:
            raise ConfigError(f"packing mode must be one of {PACKING_MODES}, got {self.mode!r}")


#: one packed sequence: its pieces as (document tokens) arrays, in order
Sequence = list[np.ndarray]


def _pieces(doc: np.ndarray, seq_len: int) -> list[np.ndarray]:
    return [doc[i:i + seq_len] for i in range(0, len(doc), seq_len)] or [doc]


def pack_window(docs: list[np.ndarray], cfg: PackingConfig) -> list[Sequence]:
    """Pack one window of documents into sequences of at most ``seq_len`` tokens."""
    L = cfg.seq_len
    docs = [d for d in docs if len(d)]
    if cfg.mode == "first-fit":
        pieces = [p for d in docs for p in _pieces(d, L)]
        order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i]))  # stable: ties keep order
        bins: list[Sequence] = []
        room: list[int] = []
        for i in order:
            n = len(pieces[i])
            for b, r in enumerate(room):
                if n <= r:
                    bins[b].append(pieces[i])
                    room[b] -= n
                    break
            else:
                bins.append([pieces[i]])
                room.append(L - n)
        return bins
    seqs: list[Sequence] = []
    cur: Sequence = []
    room_left = L
    for d in docs:
        if not cfg.split_docs and len(d) > room_left and cur:
            seqs.append(cur)
            cur, room_left = [], L
        while len(d):
            take = d[:room_left]
            cur.append(take)
            room_left -= len(take)
            d = d[len(take):]
            if room_left == 0:
                seqs.append(cur)
                cur, room_left = [], L
    if cur:
        seqs.append(cur)
    return seqs


def collate_packed(seqs: list[Sequence], seq_len: int, pad_id: int, dtype: np.dtype) -> dict[str, np.ndarray]:
    """Arrays of a batch of packed sequences (see the module doc)."""
    B, L = len(seqs), seq_len
    input_ids = np.full((B, L), pad_id, dtype=dtype)
    position_ids = np.zeros((B, L), dtype=np.int64)
    doc_ids = np.zeros((B, L), dtype=np.int32)
    bounds = [0]
    for b, seq in enumerate(seqs):
        at = 0
        for k, piece in enumerate(seq, start=1):
            n = len(piece)
            input_ids[b, at:at + n] = piece
            position_ids[b, at:at + n] = np.arange(n)
            doc_ids[b, at:at + n] = k
            at += n
            bounds.append(b * L + at)
        if at < L:
            bounds.append((b + 1) * L)  # the padding run is its own segment
    cu = np.asarray(bounds, dtype=np.int32)
    return {"input_ids": input_ids, "position_ids": position_ids, "doc_ids": doc_ids, "cu_seqlens": cu,
            "max_seqlen": np.int32(np.diff(cu).max() if len(cu) > 1 else 0)}


def block_attention_mask(doc_ids: np.ndarray) -> np.ndarray:
    """(B, L, L) bool: query i may attend key j iff j <= i and both are in the same document
    piece (padding attends nothing)."""
    same = (doc_ids[:, :, None] == doc_ids[:, None, :]) & (doc_ids[:, :, None] > 0)
    return same & np.tril(np.ones(doc_ids.shape[1:] * 2, dtype=bool))


@dataclass
class _Window:
    """One loader batch's packed sequences, and how many of them were returned."""

    loader_state: dict
    seqs: list[Sequence]
    returned: int = 0


class PackedLoader:
    """Iterate batches of packed sequences built from a ``Loader``'s documents."""

    def __init__(self, loader: Loader, config: PackingConfig) -> None:
        if config.column not in loader.dataset.column_names:
            raise SchemaError(f"dataset {loader.dataset.source_id} has no column {config.column!r} to pack "
                              f"(has {list(loader.dataset.column_names)})")
        self.loader = loader
        self.config = config
        self._skip = 0  # sequences of the first window already returned (resume)
        self._start_state: dict | None = None  # loader state before the oldest open window
        self._returned = 0  # sequences of that window returned so far

    def _docs(self, batch: dict) -> list[np.ndarray]:
        col = batch[self.config.column]
        return [np.asarray(d) for d in col]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        cfg = self.config
        queue: deque[_Window] = deque()
        skip, self._skip = self._skip, 0
        dtype = np.dtype(np.int64)
        it = iter(self.loader)
        exhausted = False
        while True:
            while not exhausted and sum(len(w.seqs) - w.returned for w in queue) < cfg.batch_size:
                state = self.loader.state_dict()
                batch = next(it, None)
                if batch is None:
                    exhausted = True
                    break
                docs = self._docs(batch)
                if docs and any(len(d) for d in docs):
                    dtype = next(d.dtype for d in docs if len(d))
                window = _Window(state, pack_window(docs, cfg))
                window.returned, skip = skip, 0  # resuming inside this window: skip what was returned
                queue.append(window)
            out: list[Sequence] = []
            while queue and len(out) < cfg.batch_size:
                head = queue[0]
                take = head.seqs[head.returned:head.returned + cfg.batch_size - len(out)]
                out.extend(take)
                head.returned += len(take)
                if head.returned >= len(head.seqs):
                    queue.popleft()
            if not out or (len(out) < cfg.batch_size and cfg.drop_last):
                self._start_state, self._returned = None, 0
                return
            # resume point: the loader state before the oldest window still queued, and how
            # many of its sequences are out (a resumed run repacks it the same way)
            if queue:
                self._start_state, self._returned = queue[0].loader_state, queue[0].returned
            else:
                self._start_state, self._returned = self.loader.state_dict(), 0
            yield collate_packed(out, cfg.seq_len, cfg.pad_id, dtype)

    def state_dict(self) -> dict:
        """JSON-able: the loader state before the oldest unfinished window + sequences of it done."""
        loader_state = self._start_state if self._start_state is not None else self.loader.state_dict()
        return {"format": STATE_FORMAT, "loader": loader_state, "skip": self._returned,
                "packing": asdict(self.config)}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ConfigError(f"not a trainstore packed-loader state: {str(state)[:80]!r}")
        if state.get("packing") != asdict(self.config):
            raise ConfigError(f"packed-loader state was saved with other packing settings: {state.get('packing')}")
        self.loader.load_state_dict(state["loader"])
        self._skip = int(state["skip"])
        # the resume point is the loaded one until the first batch moves it: a state taken
        # before that (a checkpoint at the resume step) must keep the sequences already returned
        self._start_state, self._returned = self.loader.state_dict(), self._skip


__all__ = ["PACKING_MODES", "PackedLoader", "PackingConfig", "block_attention_mask", "collate_packed",
           "pack_window"]
