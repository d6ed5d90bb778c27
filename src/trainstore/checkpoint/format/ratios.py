"""``RatioMemo``: sampled compression ratios, reused across the saves of one job.

``PieceEncoder`` picks each piece's codec from a 256 KiB sample compressed with the candidate
codec: 0.2-0.8 ms per sample, two per changed piece of an incremental (the XOR delta and the
plain piece), ~35 per rank and save of a GPT-2 + AdamW state under DDP, all of it on the
writer's few CPU threads (``WriteOptions.cpu_threads``), which every piece's hashing waits for.
What a sample says about the same piece of the same tensor moves slowly during training
(moments, weights and their deltas compress alike from one save to the next), so a ratio is
reused the next ``every - 1`` times the same piece is judged with the same codec (the next
saves of an incremental's candidates; the next full saves for a full save's codec) and then
sampled again. A piece's first resample comes after a stable-hashed 1..``every`` uses, so
the resamples of a state spread over the saves instead of all landing in one.

A fresh process (a resumed job) starts from the ratios its restored checkpoint's pieces were
written at (``RatioMemo.seed``, ``delta.stored_ratios``): the whole piece's, not a sample's.

A stale ratio costs bytes or codec CPU, never correctness: every chunk records the codec that
wrote it, and unchanged pieces are recognised by their hash, not by a ratio.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Hashable, Iterable

from ...errors import ConfigError

#: ratios kept before the memo starts over (a state whose tensors come and go keeps it bounded)
MAX_ENTRIES = 1 << 16


class RatioMemo:
    """Sampled ratios by key (the caller's: tensor, piece, candidate, codec, size); thread-safe."""

    def __init__(self, every: int = 4) -> None:
        if every < 1:
            raise ConfigError(f"a ratio must be resampled every >= 1 saves, got {every}")
        self.every = every
        self.samples = 0  # ratios computed (not reused), for tests and benchmarks
        self._lock = threading.Lock()
        self._ratios: dict[Hashable, tuple[float, int]] = {}  # key -> (ratio, reuses left)

    def ratio(self, key: Hashable, sample: Callable[[], float]) -> float:
        """The ratio remembered for ``key`` while it has reuses left, else ``sample()``."""
        with self._lock:
            found = self._ratios.get(key)
            if found is not None and found[1] > 0:
                self._ratios[key] = (found[0], found[1] - 1)
                return found[0]
        value = sample()
        left = self.every - 1 if found is not None else _first_uses(key, self.every)
        with self._lock:
            if len(self._ratios) >= MAX_ENTRIES and key not in self._ratios:
                self._ratios.clear()
            self._ratios[key] = (value, left)
            self.samples += 1
        return value

    def seed(self, measured: Iterable[tuple[Hashable, float]]) -> None:
        """Remember ratios measured elsewhere - what each piece of a restored checkpoint came
        to when it was written (``delta.stored_ratios``) - as if sampled now, so a fresh
        process's first save does not sample them again; a key already known keeps its own.
        With ``every=1`` (sample every time) nothing is seeded."""
        if self.every == 1:
            return
        with self._lock:
            for key, value in measured:
                if key in self._ratios:
                    continue
                if len(self._ratios) >= MAX_ENTRIES:
                    break
                self._ratios[key] = (value, _first_uses(key, self.every) + 1)  # + the use a sample serves


def _first_uses(key: Hashable, every: int) -> int:
    """Reuses before a new key's first resample: stable per key, so resamples spread over saves."""
    return zlib.crc32(repr(key).encode()) % every


__all__ = ["MAX_ENTRIES", "RatioMemo"]
