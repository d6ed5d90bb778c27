"""Synthetic raw records: short "support tickets" in four topics, dirty the way real data is.

Every record is ``{id, source, text, label}`` with ``label`` as text (as it arrives from a
form or a CSV export). The data is dirty on purpose, deterministically from a seed:

* **duplicates**: some records are delivered twice (the same id and content);
* **missing values**: some texts, labels and sources are null;
* **malformed rows**: a few labels are not numbers ("n/a", "??", ...), which cleaning
  cannot cast and puts in quarantine with the reason.

The topic of a record shows in its words, so a small byte-level model can learn it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .config import DataConfig

TOPICS = ("billing", "shipping", "account", "product")
_WORDS = {
    "billing": "invoice charge refund payment card bank overcharged receipt price discount vat billed "
               "subscription renewal credit statement".split(),
    "shipping": "parcel delivery courier tracking shipped late box address warehouse dispatch arrived "
                "lost damaged customs carrier pickup".split(),
    "account": "password login email username locked reset profile settings verify twofactor signup "
               "logout session security privacy delete".split(),
    "product": "broken battery screen size colour manual install update feature quality warranty "
               "noise charger cable defect spare".split(),
}
_COMMON = ("the my i a it is was not please help with and for on order today again thanks still "
           "need why can you".split())
SOURCES = ("web", "app", "email", "phone")
MALFORMED_LABELS = ("n/a", "??", "billing?", "1O", "-", "unknown", "TBD")

RAW_SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("source", pa.string()),
    pa.field("text", pa.string()),
    pa.field("label", pa.string()),
])


@dataclass(frozen=True)
class DirtCounts:
    """What was injected, so the demo can check cleaning found exactly that."""

    records: int
    duplicates: int
    missing_text: int
    missing_label: int
    missing_source: int
    malformed: int

    @property
    def delivered(self) -> int:
        return self.records + self.duplicates


def _sentences(rng: np.random.Generator, topics: np.ndarray) -> list[str]:
    """One sentence per topic index: 5-13 words, about 45% from the topic's own words."""
    n = len(topics)
    vocab = np.array(_COMMON + [w for t in TOPICS for w in _WORDS[t]], dtype=object)
    per_topic = len(_WORDS[TOPICS[0]])  # every topic has the same number of words
    lengths = rng.integers(5, 14, n)
    total = int(lengths.sum())
    row = np.repeat(np.arange(n), lengths)
    own = rng.random(total) < 0.45
    own_idx = len(_COMMON) + topics[row] * per_topic + rng.integers(0, per_topic, total)
    common_idx = rng.integers(0, len(_COMMON), total)
    words = vocab[np.where(own, own_idx, common_idx)]
    ends = np.cumsum(lengths)
    return [" ".join(words[e - k:e]) for e, k in zip(ends.tolist(), lengths.tolist())]


def generate(config: DataConfig) -> tuple[pa.Table, DirtCounts]:
    """The raw records as one Arrow table (duplicates interleaved) and what was injected."""
    rng = np.random.default_rng(config.seed)
    n = config.records
    labels = rng.integers(0, len(TOPICS), n)
    noisy = rng.random(n) < 0.03  # a little label noise: real labels are never perfect
    shown = np.where(noisy, rng.integers(0, len(TOPICS), n), labels)
    texts: list[str | None] = list(_sentences(rng, labels))
    label_text: list[str | None] = [str(int(x)) for x in shown]
    sources: list[str | None] = [SOURCES[int(i)] for i in rng.integers(0, len(SOURCES), n)]

    n_missing = int(round(config.missing_fraction * n))
    pick = rng.choice(n, size=3 * n_missing + config.malformed_rows, replace=False)
    miss_text, miss_label = pick[:n_missing], pick[n_missing:2 * n_missing]
    miss_source = pick[2 * n_missing:3 * n_missing]
    malformed = pick[3 * n_missing:]
    for i in miss_text:
        texts[i] = None
    for i in miss_label:
        label_text[i] = None
    for i in miss_source:
        sources[i] = None
    for j, i in enumerate(malformed):
        label_text[i] = MALFORMED_LABELS[j % len(MALFORMED_LABELS)]

    ids = np.arange(1, n + 1, dtype=np.int64)
    n_dup = int(round(config.duplicate_fraction * n))
    # a duplicate is re-delivered a little later: insert the copy after its original
    dup_of = np.sort(rng.choice(n, size=n_dup, replace=False))
    order = np.concatenate([np.arange(n), dup_of])
    position = np.concatenate([np.arange(n, dtype=np.float64),
                               dup_of + rng.uniform(0.5, 50.0, n_dup)])
    order = order[np.argsort(position, kind="stable")]
    table = pa.table({
        "id": pa.array(ids[order]),
        "source": pa.array([sources[i] for i in order], pa.string()),
        "text": pa.array([texts[i] for i in order], pa.string()),
        "label": pa.array([label_text[i] for i in order], pa.string()),
    }, schema=RAW_SCHEMA)
    counts = DirtCounts(records=n, duplicates=n_dup, missing_text=len(miss_text), missing_label=len(miss_label),
                        missing_source=len(miss_source), malformed=len(malformed))
    return table, counts


def batches(table: pa.Table, parts: int) -> Iterator[pa.Table]:
    """The raw table cut into ``parts`` deliveries, in order."""
    step = -(-table.num_rows // max(parts, 1))
    for start in range(0, table.num_rows, step):
        yield table.slice(start, step)


__all__ = ["MALFORMED_LABELS", "RAW_SCHEMA", "SOURCES", "TOPICS", "DirtCounts", "batches", "generate"]
