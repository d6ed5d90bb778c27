"""``Mixture``: several datasets served as one weighted source, deterministic and elastically resumable.

    mix = Mixture({"web": web_ds, "code": code_ds}, weights={"web": 0.7, "code": 0.3}, seed=0)
    loader = Loader(mix, batch_size=32)            # or PackedLoader(Loader(mix, ...), ...)

The mixture is an endless *stream* of positions; position ``p`` draws from one source by the
deterministic interleave of ``interleave`` (proportions hold in every window up to rounding,
exactly over a long one), and the ``j``-th draw of source ``s`` is row ``j % len(s)`` of that
source's own order for its epoch ``j // len(s)`` (sampling without replacement; a small source
is repeated, a large one is not exhausted; ``progress`` counts both). That order is the
sampler's for one rank (``full``, ``block`` or ``none``, from the loader's ``shuffle_mode``).

A loader epoch is ``len(mix)`` positions (``num_samples``, default the sources' total rows),
laid out step-major: at step ``t`` rank ``r`` reads positions ``t*W*B + r*B ...`` of the epoch,
so the ranks of one step read consecutive positions (a schedule sees the step it is at).
What the ranks consumed is always a prefix of the stream, so a resume on any world size
continues at that position: every rank gets an equal share of what remains, nothing doubled or
skipped in any source. An epoch's tail that does not divide evenly takes the positions it needs
from the stream after it (the next epoch starts later) instead of repeating rows.

The cursor (in the loader state) holds the stream position at the epoch start and the *eras*:
a resume with other weights starts a new era at the resume position, continuing each source's
draws (what was drawn stays drawn).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import ConfigError, SchemaError
from ...nodecache import PinnedFile
from .dataset import Dataset
from .groups import by_key
from .interleave import EraStream
from .mixsources import CacheView, serve_together
from .open_shard import column_spec
from .sampler import PlanSpec, per_rank_count, rank_streams
from .schedule import (
    CallableSchedule,
    PiecewiseLinear,
    Schedule,
    WeightCurve,
    as_schedule,
    describe,
    token_means,
)
from .source import Alloc, EpochPlan, batch_array

CURSOR_FORMAT = "trainstore.mixture/1"


class Mixture:
    """Weighted mixture of servable datasets (see the module doc)."""

    def __init__(
        self,
        sources: Mapping[str, Dataset],
        weights: Mapping[str, float] | Schedule,
        seed: int = 0,
        *,
        num_samples: int | None = None,
        columns: Sequence[str] | None = None,
        source_column: str | None = None,
    ) -> None:
        if not sources:
            raise ConfigError("a Mixture needs at least one source")
        bad = [n for n, ds in sources.items() if not isinstance(ds, Dataset)]
        if bad:
            raise ConfigError(f"mixture sources must be trainstore.data.Dataset; not: {bad}")
        self.names = tuple(str(n) for n in sources)
        self.sources = tuple(sources.values())  # as given, until the columns are picked (below)
        self.schedule = as_schedule(weights)
        self._schedule_desc = describe(self.schedule, self.names)  # checks every breakpoint
        self.seed = int(seed)
        empty = [n for n, ds in zip(self.names, self.sources) if len(ds) == 0]
        if empty:
            raise ConfigError(f"mixture sources without rows: {empty}")
        self.sizes = np.array([len(ds) for ds in self.sources], dtype=np.int64)
        self.num_samples = int(num_samples) if num_samples is not None else int(self.sizes.sum())
        if self.num_samples <= 0:
            raise ConfigError(f"num_samples must be positive, got {num_samples}")
        self._columns = self._pick_columns(columns)
        self.sources = serve_together(self.sources, self._columns)
        self._specs = {c: column_spec(self.sources[0].version, c) for c in self._columns}
        self.source_column = source_column
        if source_column is not None and source_column in self._columns:
            raise ConfigError(f"source_column {source_column!r} is also a data column; pick another name")
        self.column_names = self._columns + ((source_column,) if source_column else ())
        # the row space: every source's rows one after the other; shards likewise
        self.row_offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.shards = tuple(s for ds in self.sources for s in ds.shards)
        self._shard_source = np.concatenate([np.full(len(ds.shards), i) for i, ds in enumerate(self.sources)])
        self.offsets = np.concatenate([[0], np.cumsum([s.rows for s in self.shards])]).astype(np.int64)
        #: each mixture shard's source and index there (asked for every shard of every batch)
        self._locals = [(ds, i) for ds in self.sources for i in range(len(ds.shards))]
        self.max_shard_bytes = max(ds.max_shard_bytes for ds in self.sources)
        self.cache_limit = min(ds.cache_limit for ds in self.sources)
        self.cache_limit_reason = ("the smallest of the sources' cache limits (a default one covers all the "
                                   "sources in its cache directory)")
        self._orders: dict[tuple, np.ndarray] = {}
        self._eras: dict[str, EraStream] = {}

    def _pick_columns(self, columns: Sequence[str] | None) -> tuple[str, ...]:
        """The declared projection, or the columns every source has (same dtype and shape)."""
        first = self.sources[0]
        names = list(columns) if columns is not None else [
            c for c in first.column_names if all(c in ds.column_names for ds in self.sources)]
        if not names:
            have = {n: list(ds.column_names) for n, ds in zip(self.names, self.sources)}
            raise ConfigError(f"mixture sources have no common columns ({have}); pass columns=[...] "
                              "naming columns every source has")
        for c in names:
            specs = {}
            for n, ds in zip(self.names, self.sources):
                if c not in ds.column_names:
                    raise SchemaError(f"mixture column {c!r} is not in source {n!r} ({ds.source_id}: "
                                      f"{list(ds.column_names)})")
                specs[n] = column_spec(ds.version, c)
            if len({(str(d), s) for d, s in specs.values()}) > 1:
                raise SchemaError(f"mixture column {c!r} differs between sources (dtype, shape): {specs}")
        return tuple(names)

    # -- rows ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return f"Mixture({self.source_id}, samples/epoch={self.num_samples})"

    def take(self, indices: Any, *, gathered: Callable[[int], None] | None = None,
             alloc: Alloc | None = None) -> dict[str, np.ndarray]:
        """Rows of the row space (source ``s`` at ``row_offsets[s]...``) as batched arrays;
        ``gathered(shard)`` (a mixture shard index) as each shard's rows are copied out;
        ``alloc``: where fixed-size columns are gathered (``source.Alloc``)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        total = int(self.row_offsets[-1])
        if idx.size and (idx.min() < 0 or idx.max() >= total):
            raise IndexError(f"rows out of range for {self.source_id} ({total} rows)")
        out: dict[str, np.ndarray] = {}
        for c in self._columns:
            dtype, shape = self._specs[c]
            out[c] = batch_array(alloc, c, (len(idx), *shape), dtype)
        shard = np.searchsorted(self.offsets, idx, side="right") - 1  # mixture shards: one row space
        for g, at in by_key(shard):  # each shard's rows straight into the batch arrays
            ds, local = self._local(g)
            ds.gather_shard(local, idx[at] - self.offsets[g], out, at)
            if gathered is not None:
                gathered(g)
        if self.source_column:
            out[self.source_column] = self._shard_source[shard].astype(np.int32)
        return out

    def __getitem__(self, row: int) -> dict[str, Any]:
        """One row of the row space (what a map-style ``DataLoader`` asks for a sampler's index)."""
        return {k: v[0] for k, v in self.take([row]).items()}

    # -- shard plan (the node cache of each source) --------------------------------------------
    def _local(self, shard: int) -> tuple[Dataset, int]:
        return self._locals[shard]

    def pin_shard(self, shard: int, *, ahead: bool = False, needed: Callable[[], bool] | None = None) -> PinnedFile:
        ds, local = self._local(shard)
        return ds.pin_shard(local, ahead=ahead, needed=needed)

    def close_shard(self, shard: int, evict: bool = False) -> None:
        ds, local = self._local(shard)
        ds.close_shard(local, evict=evict)

    def want_shard(self, shard: int, rank: float, owner: int) -> None:
        ds, local = self._local(shard)
        ds.want_shard(local, rank, owner)

    def unwant_shard(self, shard: int, owner: int) -> None:
        ds, local = self._local(shard)
        ds.unwant_shard(local, owner)

    def add_pressure_hook(self, hook: Callable[[], None]) -> None:
        for ds in self.sources:
            ds.add_pressure_hook(hook)

    def remove_pressure_hook(self, hook: Callable[[], None]) -> None:
        for ds in self.sources:
            ds.remove_pressure_hook(hook)

    @property
    def cache(self) -> CacheView:
        return CacheView(self.sources)

    def decode_sources(self, batches: Sequence[np.ndarray]) -> list[tuple[Dataset, list[np.ndarray]]]:
        """Each Parquet source with its rows (its own indices) of every batch: the loader decodes
        their row groups ahead per source (``serve.decodeahead``)."""
        src = [np.searchsorted(self.row_offsets, np.asarray(b, dtype=np.int64), side="right") - 1 for b in batches]
        return [(ds, [np.asarray(b, dtype=np.int64)[k == s] - self.row_offsets[s] for b, k in zip(batches, src)])
                for s, ds in enumerate(self.sources) if ds.decoded_groups is not None]

    @property
    def source_id(self) -> str:
        return "mixture(" + ", ".join(f"{n}={ds.source_id}" for n, ds in zip(self.names, self.sources)) + ")"

    @property
    def source_bytes(self) -> int:
        return sum(ds.source_bytes for ds in self.sources)

    def close(self) -> None:
        for ds in self.sources:
            ds.close()

    # -- the stream -----------------------------------------------------------------------------
    def _identity(self) -> dict:
        return {"sources": [[n, ds.source_id, len(ds)] for n, ds in zip(self.names, self.sources)],
                "seed": self.seed, "num_samples": self.num_samples}

    def start_cursor(self, epoch: int = 0, previous: dict | None = None) -> dict:
        eras = previous["eras"] if previous else [
            {"start": 0, "counts": [0] * len(self.names), "schedule": self._schedule_desc, "recorded": {}}]
        return {"format": CURSOR_FORMAT, **self._identity(), "origin": int(epoch) * self.num_samples, "eras": eras}

    def _era(self, cursor: dict, i: int) -> EraStream:
        era = cursor["eras"][i]
        key = json.dumps([i, era["start"], era["counts"], era["schedule"]], sort_keys=True)
        got = self._eras.get(key)
        if got is None:
            sched = self._schedule_of(era)
            means = token_means(sched, self.names)  # a schedule in tokens: expected tokens at the era start
            start_tokens = float(np.asarray(era["counts"]) @ means) if means is not None else 0.0
            got = EraStream(WeightCurve(sched, self.names, era["start"], start_tokens), np.asarray(era["counts"]))
            self._eras[key] = got
        return got

    def _schedule_of(self, era: dict) -> Schedule:
        """The live schedule for its own era; an earlier era's is rebuilt from the state."""
        desc, recorded = era["schedule"], {int(m): w for m, w in era.get("recorded", {}).items()}
        if desc == self._schedule_desc:
            if isinstance(self.schedule, CallableSchedule):
                for m, w in recorded.items():
                    self.schedule.recorded.setdefault(m, w)
            return self.schedule
        if desc["kind"] == "piecewise":
            means = desc.get("tokens_per_sample")
            return PiecewiseLinear({x: dict(zip(self.names, w)) for x, w in desc["points"]},
                                   desc["unit"], desc["global_batch"],
                                   dict(zip(self.names, means)) if means is not None else None)

        def replay(x: int) -> dict[str, float]:
            raise ConfigError(f"weights of an earlier era ({desc['fn']}) at {x} were not recorded in the state")
        return CallableSchedule(replay, desc["every"], desc["unit"], desc["global_batch"], recorded=recorded)

    def _order(self, s: int, epoch: int, spec: PlanSpec) -> np.ndarray:
        """Source ``s``'s row order for its ``epoch`` (the sampler's, for one rank)."""
        key = (s, epoch, spec.seed, spec.shuffle_mode, spec.block_shards)
        got = self._orders.get(key)
        if got is None:
            seed = int(np.random.SeedSequence([spec.seed, self.seed, s]).generate_state(1)[0])
            ds = self.sources[s]
            one = PlanSpec(len(ds), tuple(x.rows for x in ds.shards), 1, seed, spec.shuffle_mode, spec.block_shards)
            got = rank_streams(one, epoch, 1)[0]
            if len(self._orders) >= 4 * len(self.sources):
                self._orders.pop(next(iter(self._orders)))
            self._orders[key] = got
        return got

    def draws(self, cursor: dict, p0: int, p1: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, draw index of that source) of stream positions ``[p0, p1)``."""
        srcs, draws = [], []
        eras = cursor["eras"]
        for i, era in enumerate(eras):
            a = max(p0, era["start"])
            b = min(p1, eras[i + 1]["start"]) if i + 1 < len(eras) else p1
            if a < b:
                s, d = self._era(cursor, i).window(a - era["start"], b - era["start"])
                srcs.append(s)
                draws.append(d)
        if not srcs:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        return np.concatenate(srcs), np.concatenate(draws)

    def _rows(self, cursor: dict, spec: PlanSpec, p0: int, p1: int) -> np.ndarray:
        src, draw = self.draws(cursor, p0, p1)
        rows = np.empty(len(src), dtype=np.int64)
        for s in np.unique(src).tolist():
            at = np.flatnonzero(src == s)
            epoch, pos = np.divmod(draw[at], self.sizes[s])
            for e in np.unique(epoch).tolist():
                sel = epoch == e
                rows[at[sel]] = self._order(s, e, spec)[pos[sel]] + self.row_offsets[s]
        return rows

    def counts(self, cursor: dict, position: int) -> np.ndarray:
        """Draws of each source before stream ``position``."""
        eras = cursor["eras"]
        i = max(k for k, era in enumerate(eras) if era["start"] <= position)
        return self._era(cursor, i).counts_at(position - eras[i]["start"])

    # -- epoch plan and state -------------------------------------------------------------------
    def _advance(self, cursor: dict, spec: PlanSpec, segments: Sequence[tuple[int, int]]) -> tuple[int, int]:
        """Stream position after ``segments`` of (world size, batches done), and the epoch's
        samples still to read."""
        pos, remaining = int(cursor["origin"]), self.num_samples
        for w, done in segments:
            n = per_rank_count(remaining, w, spec.batch_size, spec.drop_last)
            used = w * min(done * spec.batch_size, n)
            pos, remaining = pos + used, max(0, remaining - used)
        return pos, remaining

    def _snapshot(self, cursor: dict) -> dict:
        """The cursor with every output of the live callable schedule recorded so far."""
        eras = [dict(e) for e in cursor["eras"]]
        if isinstance(self.schedule, CallableSchedule):
            for e in eras:
                if e["schedule"] == self._schedule_desc:
                    for m, w in e.get("recorded", {}).items():  # a state's records win over a new call
                        self.schedule.recorded.setdefault(int(m), w)
                    e["recorded"] = {str(m): w for m, w in sorted(self.schedule.recorded.items())}
        return {**cursor, "eras": eras}

    def plan_epoch(self, spec: PlanSpec, epoch: int, cursor: dict | None,
                   segments: list[tuple[int, int]], world_size: int) -> EpochPlan:
        cursor = cursor if cursor is not None else self.start_cursor(epoch)
        B = spec.batch_size
        pos, remaining = self._advance(cursor, spec, segments)
        n = per_rank_count(remaining, world_size, B, spec.drop_last)
        rows = self._rows(cursor, spec, pos, pos + world_size * n)
        # step-major: step t of rank r holds positions t*W*B + r*b ... (b: that step's batch size)
        full, tail = divmod(n, B)
        streams = []
        for r in range(world_size):
            at = (np.arange(full)[:, None] * (world_size * B) + r * B + np.arange(B)).reshape(-1)
            last = full * world_size * B + r * tail + np.arange(tail)
            streams.append(rows[np.concatenate([at, last]).astype(np.int64)])
        cursor = self._snapshot(cursor)
        return EpochPlan(streams, cursor, {**cursor, "origin": pos + world_size * n})

    def resume_cursor(self, cursor: dict | None, spec: PlanSpec, segments: list[tuple[int, int]]) -> dict:
        """Check a saved cursor is this mixture's; with other weights, start a new era at the
        position the saved run reached (``segments`` up to it)."""
        if not isinstance(cursor, dict) or cursor.get("format") != CURSOR_FORMAT:
            raise ConfigError(f"loader state has no mixture position (is it from a single dataset?); "
                              f"this loader reads {self.source_id}")
        ours = self._identity()
        diff = {k: (cursor.get(k), v) for k, v in ours.items() if cursor.get(k) != v}
        if diff:
            raise ConfigError(f"loader state is from another mixture; differs (saved, now): {diff}")
        cursor = {**cursor, "eras": [dict(e) for e in cursor["eras"]]}
        if cursor["eras"][-1]["schedule"] != self._schedule_desc:
            at, _ = self._advance(cursor, spec, segments)
            counts = self.counts(cursor, at).tolist()
            if cursor["eras"][-1]["start"] == at:  # a change at the very same position: replace
                cursor["eras"].pop()
            cursor["eras"].append({"start": at, "counts": counts, "schedule": self._schedule_desc, "recorded": {}})
        return self._snapshot(cursor)

    def progress(self, loader_state: dict) -> dict[str, dict[str, float]]:
        """Per source, from a ``Loader.state_dict()``: samples drawn so far, and in epochs of
        that source (1.5 = once through and half again)."""
        cursor = loader_state.get("cursor")
        if not isinstance(cursor, dict) or cursor.get("format") != CURSOR_FORMAT:
            raise ConfigError("not a loader state of a mixture")
        spec = loader_state["spec"]
        plan = PlanSpec(self.num_samples, (), spec["batch_size"], drop_last=spec["drop_last"])
        segs = [(int(w), int(d)) for w, d in loader_state.get("segments", [])]
        segs.append((int(loader_state["world_size"]), int(loader_state["position"])))
        at, _ = self._advance(cursor, plan, segs)
        c = self.counts(cursor, at)
        return {n: {"samples": int(c[i]), "epochs": float(c[i] / self.sizes[i])} for i, n in enumerate(self.names)}


__all__ = ["CURSOR_FORMAT", "Mixture"]
