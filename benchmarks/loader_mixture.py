"""A weighted 3-source Mixture against one Dataset of the same rows (issue 28 item 5, trainstore side).

Three arrow-ipc sources (``idx`` int64 + ``x`` float32 of ``--sample-kb`` KB; the third 10x
smaller than the others) are served as ``Mixture(weights 0.5 / 0.3 / 0.2)`` and, for the
baseline, the same rows as one dataset. Both through ``Loader`` (``--mode`` shuffle, local
store, warm node cache), no compute: samples/s over ``--epochs`` warm epochs (first batch of
each excluded; ``--repeats`` interleaved runs, medians), accelerator use at a fixed step of
``--compute-ms`` per batch, and the time to plan an epoch. Then, from the mixture's ``source`` column: the
achieved share of each source in every window of 1,000 samples (worst deviation from the
weight, in percentage points), and whether a mid-epoch resume on another world size (2 ranks
-> 3 ranks) reads exactly the rest of the uninterrupted stream.

Peers (``--peers``, installed by ``make bench``): the same three sources written as litdata
chunks and as mosaic MDS shards, mixed by litdata's ``CombinedStreamingDataset(weights=...)``
and mosaic's ``Stream(proportion=...)``, one process, no workers: samples/s of one pass of
``--samples`` samples and the same share deviation. Their mid-epoch resume on another world
size is not run here (mosaic resumes on the same world size only; litdata's weighted
combined dataset does not resume: see docs/loader.md).

Run: ``.venv/bin/python benchmarks/loader_mixture.py`` (``--samples`` total rows,
``--sample-kb``, ``--batch``, ``--epochs``, ``--mode``, ``--peers``, ``--json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
import warnings

import numpy as np

from trainstore import open_store
from trainstore.data import Dataset, Loader
from trainstore.data.serve import Mixture, write_arrow_dataset

warnings.filterwarnings("ignore")
logging.getLogger("trainstore").setLevel(logging.ERROR)
WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}


def write_sources(store, total: int, width: int, rows_per_shard: int) -> dict[str, dict[str, np.ndarray]]:
    """web and code 10 parts each, math 1 part; also all of them as one dataset ``all``."""
    sizes = dict(zip(WEIGHTS, (total * 10 // 21, total * 10 // 21, total - 2 * (total * 10 // 21))))
    rng = np.random.default_rng(0)
    parts, start = {}, 0
    for name, n in sizes.items():
        parts[name] = {"idx": np.arange(start, start + n, dtype=np.int64),
                       "x": rng.standard_normal((n, width)).astype(np.float32)}
        write_arrow_dataset(store, name, parts[name], rows_per_shard)
        start += n
    write_arrow_dataset(store, "all", {k: np.concatenate([p[k] for p in parts.values()]) for k in ("idx", "x")},
                        rows_per_shard)
    return parts


def samples_per_s(loader: Loader, epochs: int, compute_s: float = 0.0) -> tuple[float, float]:
    """Warm epochs, first batch of each excluded: (samples/s, accelerator use). ``compute_s``: a
    training step per batch (a sleep: the GIL is free, as while a GPU computes); AU = the
    steps' time / the wall time."""
    n, batches, secs = 0, 0, 0.0
    for _ in range(epochs):
        it = iter(loader)
        next(it)
        t0 = time.perf_counter()
        for b in it:
            n += len(b["idx"])
            batches += 1
            if compute_s:
                time.sleep(compute_s)
        secs += time.perf_counter() - t0
    return n / secs, batches * compute_s / secs


def plan_seconds(loader: Loader) -> float:
    t0 = time.perf_counter()
    len(loader)
    return time.perf_counter() - t0


def peer_litdata(root: str, parts: dict, batch: int, n: int) -> np.ndarray:
    """idx of ``n`` samples of litdata's weighted CombinedStreamingDataset."""
    from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset  # noqa: PLC0415
    from litdata.streaming.writer import BinaryWriter  # noqa: PLC0415

    for name, p in parts.items():
        writer = BinaryWriter(cache_dir=f"{root}/lit/{name}", chunk_bytes=1 << 24)
        for i in range(len(p["idx"])):
            writer.add_item(i, {"idx": int(p["idx"][i]), "x": p["x"][i]})
        writer.done()
        writer.merge()
    mixed = CombinedStreamingDataset([StreamingDataset(f"{root}/lit/{name}", shuffle=True, seed=0) for name in parts],
                                     weights=list(WEIGHTS.values()), seed=0, iterate_over_all=False)
    return take_n(StreamingDataLoader(mixed, batch_size=batch, num_workers=0), n)


def peer_mosaic(root: str, parts: dict, batch: int, n: int) -> np.ndarray:
    """idx of ``n`` samples of mosaic streaming's StreamingDataset over weighted Streams."""
    from loader import import_streaming  # noqa: PLC0415 - benchmarks/loader.py: streaming's core only
    from torch.utils.data import DataLoader  # noqa: PLC0415

    MDSWriter, StreamingDataset = import_streaming()
    from streaming.base import Stream  # noqa: PLC0415
    from streaming.base.util import clean_stale_shared_memory  # noqa: PLC0415

    for name, p in parts.items():
        cols = {"idx": "int64", "x": f"ndarray:float32:{p['x'].shape[1]}"}
        with MDSWriter(out=f"{root}/mds/{name}", columns=cols, size_limit=1 << 24) as out:
            for i in range(len(p["idx"])):
                out.write({"idx": int(p["idx"][i]), "x": p["x"][i]})
    clean_stale_shared_memory()
    streams = [Stream(local=f"{root}/mds/{name}", proportion=w) for name, w in WEIGHTS.items()]
    ds = StreamingDataset(streams=streams, shuffle=True, batch_size=batch, epoch_size=n)
    return take_n(DataLoader(ds, batch_size=batch, num_workers=0), n)


def take_n(loader, n: int) -> tuple[np.ndarray, float]:
    got, t0 = [], time.perf_counter()
    for b in loader:
        got.append(np.asarray(b["idx"]))
        if sum(len(g) for g in got) >= n:
            break
    return np.concatenate(got)[:n], time.perf_counter() - t0


def worst_share_deviation(sources: np.ndarray, window: int = 1000) -> float:
    w = np.array(list(WEIGHTS.values()))
    window = min(window, len(sources))  # a peer that stopped early: its whole stream
    worst = 0.0
    for start in range(0, len(sources) - window + 1, window):
        share = np.bincount(sources[start:start + window], minlength=len(w)) / window
        worst = max(worst, float(np.abs(share - w).max()))
    return 100 * worst


def resume_reproduces(make, batch: int) -> bool:
    """2 ranks read 5 steps, 3 ranks resume and finish the epoch == 1 rank uninterrupted (the
    3-rank tail may take the next epoch's first positions: compared over two epochs)."""
    one = Loader(make(), batch, world_size=1, rank=0)
    straight = np.concatenate([b["idx"] for _ in range(2) for b in one])
    one.close()
    seen, states = [[], []], []
    for r in range(2):
        lo = Loader(make(), batch, world_size=2, rank=r)
        it = iter(lo)
        seen[r] = [next(it)["idx"] for _ in range(5)]
        states.append(lo.state_dict())
        it.close()
        lo.close()
    got = [x for step in zip(*seen) for x in step]
    rest = []
    for r in range(3):
        lo = Loader(make(), batch, world_size=3, rank=r)
        lo.load_state_dict(states[0])
        rest.append([b["idx"] for b in lo])
        lo.close()
    got += [x for step in zip(*rest) for x in step]
    got = np.concatenate(got)
    return bool(np.array_equal(got, straight[:len(got)])) and len(got) >= len(straight) // 2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=42_000)
    ap.add_argument("--sample-kb", type=float, default=4.0)
    ap.add_argument("--rows-per-shard", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--mode", default="block")
    ap.add_argument("--peers", action="store_true")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved runs of each loader (medians)")
    ap.add_argument("--compute-ms", type=float, default=1.0, help="training step per batch for the AU figure")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    width = max(1, int(a.sample_kb * 1024 // 4))
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        store = open_store(f"{tmp}/durable")
        parts = write_sources(store, a.samples, width, a.rows_per_shard)
        sizes = {k: len(p["idx"]) for k, p in parts.items()}
        hot = f"{tmp}/hot-mixture"  # the baseline has its own node cache
        one = Dataset(store, "all@1", cache_dir=f"{tmp}/hot-single")

        def make() -> Mixture:
            return Mixture({n: Dataset(store, f"{n}@1", cache_dir=hot) for n in WEIGHTS}, WEIGHTS, seed=0,
                           source_column="source")

        single = Loader(one, a.batch, shuffle_mode=a.mode, world_size=1, rank=0)
        mixed = Loader(make(), a.batch, shuffle_mode=a.mode, world_size=1, rank=0)
        out = {"samples": a.samples, "sizes": sizes, "sample_kb": a.sample_kb, "batch": a.batch, "mode": a.mode,
               "repeats": a.repeats, "plan_s_single": plan_seconds(single), "plan_s_mixture": plan_seconds(mixed)}
        list(single), list(mixed)  # warm node caches
        runs: dict[str, list] = {"single": [], "mixture": [], "single_au": [], "mixture_au": []}
        for rep in range(a.repeats):  # interleaved, the order alternating
            for name, lo in ((("single", single), ("mixture", mixed)) if rep % 2 == 0
                             else (("mixture", mixed), ("single", single))):
                runs[name].append(samples_per_s(lo, a.epochs)[0])
                runs[f"{name}_au"].append(samples_per_s(lo, 1, a.compute_ms / 1000)[1])
        single.close()
        mixed.close()
        for name in ("single", "mixture"):
            out[f"samples_per_s_{name}"] = float(np.median(runs[name]))
            out[f"samples_per_s_{name}_runs"] = [round(x) for x in runs[name]]
            out[f"au_{name}_at_{a.compute_ms}ms_per_batch"] = float(np.median(runs[f"{name}_au"]))
        out["mixture_vs_single"] = out["samples_per_s_mixture"] / out["samples_per_s_single"]
        lo = Loader(make(), a.batch, world_size=1, rank=0)
        src = np.concatenate([b["source"] for b in lo])
        lo.close()
        out["worst_share_deviation_pp_per_1000"] = worst_share_deviation(src)
        out["resume_2_to_3_reproduces_rest_of_epoch"] = resume_reproduces(make, a.batch)
        bounds = np.cumsum([len(p["idx"]) for p in parts.values()])[:-1]
        for name, run_peer in (("litdata", peer_litdata), ("mosaic", peer_mosaic)) if a.peers else ():
            idx, secs = run_peer(tmp, parts, a.batch, a.samples)
            out[f"{name}_samples_per_s_one_pass"] = len(idx) / secs
            out[f"{name}_samples_delivered"] = len(idx)  # litdata stops when its smallest source runs out
            out[f"{name}_worst_share_deviation_pp_per_1000"] = worst_share_deviation(np.searchsorted(bounds, idx,
                                                                                                      side="right"))
    if a.json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:42s} {v:.4g}" if isinstance(v, float) else f"{k:42s} {v}")


if __name__ == "__main__":
    main()
