"""``BaseCache``: a rank's copy of its shards of the last full checkpoint, for incrementals."""

from __future__ import annotations

import numpy as np


class BaseCache:
    """This rank's copy of its shards of the last full checkpoint, so incrementals XOR against
    memory instead of reading (and decoding) the base's chunks from the store. Costs one copy
    of the rank's state; buffers are reused when the layout does not change. Pass the same
    instance to the writers of consecutive saves."""

    def __init__(self) -> None:
        self.job: str | None = None
        self.step: int | None = None
        self._bufs: dict[str, np.ndarray] = {}
        self._spare: dict[str, np.ndarray] = {}

    def start(self, job: str, step: int | None) -> None:
        """A new full checkpoint begins: forget the old base (its buffers are reused)."""
        self._spare, self._bufs = {**self._spare, **self._bufs}, {}
        self.job, self.step = job, step

    def add(self, staged: list) -> None:
        for st in staged:
            buf = self._spare.pop(st.name, None)
            if buf is None or buf.nbytes != st.data.nbytes:
                buf = np.empty(st.data.nbytes, dtype=np.uint8)
            np.copyto(buf, np.frombuffer(st.data, dtype=np.uint8))
            self._bufs[st.name] = buf

    def views(self, job: str, step: int) -> dict[str, memoryview]:
        if job != self.job or step != self.step:
            return {}
        return {n: memoryview(b) for n, b in self._bufs.items()}


__all__ = ["BaseCache"]
